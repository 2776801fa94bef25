"""The trigger-store watch survives a nats-server restart: a trigger created after it is still picked up
by a replica that was running all along (the server is this test's own, stopped and started on its port)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_support import AGENTS, AS_ADMIN, eventually, tokens_file, webhook_spec

from temporality_bus import Bus, NatsSettings
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS
from temporality_service import ApiAuth, ApiAuthSettings
from temporality_testing import NatsServer
from temporality_trigger_gateway import Settings, create_app
from temporality_trigger_gateway.store import TriggerRegistry, TriggerStore


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_the_watch_follows_changes_made_after_a_server_restart(own_server: NatsServer, tmp_path: Path) -> None:
    settings = NatsSettings(url=own_server.url, reconnect_wait_s=0.2)
    restarted: NatsServer | None = None
    try:
        async with Bus.connect(settings, name="replica") as bus:
            await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
            store = await TriggerStore.open(bus)
            registry = TriggerRegistry(environ={}, agents=AGENTS)
            auth = ApiAuth.from_settings(ApiAuthSettings(tokens_file=tokens_file(tmp_path)))
            async with registry.watching(store):
                port = own_server.port
                await asyncio.to_thread(own_server.stop)
                restarted = NatsServer(tmp_path / "nats", port=port)
                await asyncio.to_thread(restarted.start)

                async def reconnected() -> bool:
                    return bus.nc.is_connected

                await eventually(reconnected, timeout_s=30, what="the replica reconnected")
                async with Bus.connect(NatsSettings(url=restarted.url), name="admin") as other:
                    admin_store = await TriggerStore.open(other)
                    registry_b = TriggerRegistry(environ={}, agents=AGENTS)
                    async with registry_b.watching(admin_store):
                        app = create_app(Settings(), other, registry_b, store=admin_store, auth=auth)
                        transport = httpx.ASGITransport(app=app)
                        async with httpx.AsyncClient(transport=transport, base_url="http://b") as client:
                            created = await client.post("/triggers", json=webhook_spec(), headers=AS_ADMIN)
                            assert created.status_code == 201, created.text

                async def picked_up() -> bool:
                    return registry.webhook("api-pr") is not None

                await eventually(picked_up, timeout_s=60, what="the running replica serving the new trigger")

                async def ready() -> bool:
                    try:
                        await registry.check()
                    except RuntimeError:
                        return False
                    return True

                await eventually(ready, timeout_s=30, what="the replica's store watch healthy")
    finally:
        # stopped only once the replica's connection is closed: closing a nats-py client that is reconnecting to
        # a server gone for good can leave its reconnect task waiting on the dead transport
        # (nats-io/nats.py#671), which hung this test's event loop teardown at load 12
        if restarted is not None:
            await asyncio.to_thread(restarted.stop)
