"""``GET /adapters`` (viewer): the webhook sources a trigger's ``adapter`` may name -- each with a one-line
description, its auth types (the recommended first) and its event types -- from the gateway's own registry
(``adapters.ADAPTERS``), over real HTTP (the app served on a port, a real nats-server behind it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from gateway_support import ADMIN_TOKEN, VIEWER_TOKEN, tokens_file

from temporality_bus import Bus
from temporality_service import ApiAuth, ApiAuthSettings
from temporality_service.server import HttpServer
from temporality_trigger_gateway import Settings, TriggerConfig, create_app
from temporality_trigger_gateway.adapters import ADAPTERS


@asynccontextmanager
async def _served(
    tmp_path: Path, settings: Settings, bus: Bus, triggers: list[TriggerConfig]
) -> AsyncIterator[httpx.AsyncClient]:
    auth = ApiAuth.from_settings(ApiAuthSettings(tokens_file=tokens_file(tmp_path)))
    app = create_app(settings, bus, triggers, auth=auth)
    server = HttpServer(app, host="127.0.0.1", port=0)
    serving = asyncio.create_task(server.run_until_exit())
    try:
        await asyncio.wait_for(server.listening.wait(), 30)
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            yield client
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)


async def test_the_adapters_are_listed_for_a_viewer_as_the_gateway_serves_them(
    tmp_path: Path, settings: Settings, bus: Bus, triggers: list[TriggerConfig]
) -> None:
    async with _served(tmp_path, settings, bus, triggers) as client:
        assert (await client.get("/adapters")).status_code == 401
        refused = await client.get("/adapters", headers={"Authorization": "Bearer not-a-token"})
        assert refused.status_code == 401
        response = await client.get("/adapters", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})
        assert response.status_code == 200, response.text
        listed = response.json()["adapters"]
        as_admin = await client.get("/adapters", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert as_admin.json()["adapters"] == listed
        document = (await client.get("/openapi.json", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"})).json()

    # every adapter of the registry, in its order, with what it accepts
    assert [a["name"] for a in listed] == list(ADAPTERS)
    by_name = {a["name"]: a for a in listed}
    for name, adapter in ADAPTERS.items():
        view = by_name[name]
        assert set(view["auth_types"]) == set(adapter.auth_types)
        assert len(view["auth_types"]) == len(adapter.auth_types)
        expected = None if adapter.event_types is None else sorted(adapter.event_types)
        assert view["event_types"] == expected
        assert view["description"]
        assert "\n" not in view["description"]
        assert "``" not in view["description"]
    assert by_name["generic"]["event_types"] is None  # any type the sender names
    assert by_name["generic"]["auth_types"][0] == "standard_webhooks"  # the recommended first
    assert by_name["azure_devops.pull_request"]["auth_types"] == ["basic", "bearer", "header"]
    assert by_name["github"]["description"].startswith("GitHub repository webhooks")
    assert "git.pullrequest.created" in by_name["azure_devops.pull_request"]["event_types"]

    operation = document["paths"]["/adapters"]["get"]
    assert "Viewer role" in operation["description"]
    assert "401" in operation["responses"]
    schema = document["components"]["schemas"]["AdapterView"]
    assert {"name", "description", "auth_types", "event_types"} <= schema["properties"].keys()
