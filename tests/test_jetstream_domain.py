"""A deployment whose JetStream is in a domain (``jetstream { domain: hub }``) reached through a leaf node:
``TEMPORALITY_NATS_JETSTREAM_DOMAIN=hub`` sends every JetStream API request to ``$JS.hub.API`` and every KV write
to ``$JS.hub.API.$KV...``, and ``temporality nats-authorization --jetstream-domain hub`` gives each service the
permissions for exactly those subjects.

Two real nats-servers: the hub (JetStream domain ``hub``) and a leaf node with a JetStream of its own (domain
``leaf``) where the services connect as their own users, with the printed authorization. Without the domain a
service would talk to the leaf's JetStream; with it the streams, buckets and consumers are the hub's."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.js.kv import KeyValue
from pydantic import BaseModel, SecretStr, ValidationError

from temporality_bus import Bus, Conflict, Consumer, Delivery, NatsSettings
from temporality_embedded import NatsServer, free_port
from temporality_embedded.cli import build_parser, nats_authorization
from temporality_embedded.dlq import OPERATOR_USER
from temporality_embedded.natsserver import password_variable
from temporality_protocol import Envelope, TriggerReceived, make_event
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    BUCKET_DELIVERIES,
    CONSUMERS,
    DLQ_STREAM,
    EVENTS_STREAM,
    SERVICES,
)
from temporality_protocol.permissions import TIMERS_MIGRATION_USER, permissions_for
from temporality_testing.waiting import eventually

DOMAIN = "hub"


class Item(BaseModel):
    name: str
    n: int


def test_permissions_in_a_domain_move_only_the_jetstream_api_and_kv_writes() -> None:
    for name in SERVICES:
        plain, moved = permissions_for(name), permissions_for(name).in_domain(DOMAIN)
        assert len(moved.publish) == len(plain.publish)
        assert (moved.subscribe, moved.allow_responses) == (plain.subscribe, plain.allow_responses)
        for before, after in zip(plain.publish, moved.publish, strict=True):
            if before.startswith("$JS.API."):
                assert after == "$JS.hub.API." + before.removeprefix("$JS.API."), name
            elif before.startswith("$KV."):
                assert after == "$JS.hub.API." + before, name
            else:  # events, dead letters, timers, RPCs and the server's reply subjects ($JS.ACK, $JS.FC) stay
                assert after == before, name
    assert permissions_for("journal").in_domain(None) == permissions_for("journal")
    with pytest.raises(ValueError, match="one subject token"):
        permissions_for("journal").in_domain("a.b")
    args = build_parser().parse_args(["nats-authorization", "--jetstream-domain", DOMAIN])
    assert args.jetstream_domain == DOMAIN
    assert "$JS.hub.API.CONSUMER.MSG.NEXT.TEMPORALITY_EVENTS.journal" in nats_authorization([], [], DOMAIN)
    assert "$JS.hub.API" not in nats_authorization([], [])  # the files shipped for compose and the chart


def test_the_domain_setting() -> None:
    assert NatsSettings().js_api_prefix == "$JS.API"
    assert NatsSettings(jetstream_domain="").jetstream_domain is None  # compose's empty default
    assert NatsSettings(jetstream_domain=DOMAIN).js_api_prefix == "$JS.hub.API"
    for bad in ("a.b", "a*", ">", "a b"):
        with pytest.raises(ValidationError):
            NatsSettings(jetstream_domain=bad)


@pytest.fixture
def hub_and_leaf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[NatsServer, NatsServer]]:
    leaf_port = free_port()
    hub_conf = tmp_path / "hub.conf"
    hub_conf.write_text(
        f'jetstream: {{domain: {DOMAIN}}}\nleafnodes: {{listen: "127.0.0.1:{leaf_port}"}}\n', encoding="utf-8"
    )
    leaf_conf = tmp_path / "leaf.conf"
    leaf_conf.write_text(
        nats_authorization([], [], DOMAIN)
        + "jetstream: {domain: leaf}\n"
        + f'leafnodes: {{remotes: [{{url: "nats-leaf://127.0.0.1:{leaf_port}"}}]}}\n',
        encoding="utf-8",
    )
    for user in [*SERVICES, TIMERS_MIGRATION_USER, OPERATOR_USER]:
        monkeypatch.setenv(password_variable(user), f"{user}-secret")
    hub = NatsServer(tmp_path / "hub", config_file=hub_conf)
    leaf = NatsServer(tmp_path / "leaf", config_file=leaf_conf)
    hub.start()
    try:
        leaf.start()
        try:
            yield hub, leaf
        finally:
            leaf.stop()
    finally:
        hub.stop()


def _as(leaf: NatsServer, service: str) -> NatsSettings:
    return NatsSettings(
        url=leaf.url,
        user=service,
        password=SecretStr(f"{service}-secret"),
        jetstream_domain=DOMAIN,
        ack_wait_s=2.0,
        drain_timeout_s=2.0,
    )


async def _hub_reachable(leaf: NatsServer) -> None:
    """Until the leaf node's connection to the hub is up: the hub's JetStream answers the journal's stream info."""
    nc = await nats.connect(leaf.url, user="journal", password="journal-secret", inbox_prefix="_INBOX.journal")
    try:

        async def answered() -> bool:
            try:
                reply = await nc.request(f"$JS.{DOMAIN}.API.STREAM.INFO.{EVENTS_STREAM.name}", b"", timeout=1)
            except nats.errors.Error:
                return False
            return "error" in json.loads(reply.data) or "config" in json.loads(reply.data)

        await eventually(answered, 30, "the hub's JetStream through the leaf node")
    finally:
        await nc.close()


@pytest.mark.timeout(120)
async def test_store_round_trip_and_a_consumer_in_a_jetstream_domain_through_a_leaf_node(
    hub_and_leaf: tuple[NatsServer, NatsServer],
) -> None:
    hub, leaf = hub_and_leaf
    await _hub_reachable(leaf)
    journal_spec, gateway_spec = SERVICES["journal"], SERVICES["trigger-gateway"]
    async with (
        Bus.connect(_as(leaf, "journal"), name="journal", inbox_prefix="_INBOX.journal") as journal,
        Bus.connect(_as(leaf, "trigger-gateway"), name="trigger-gateway", inbox_prefix="_INBOX.trigger-gateway") as gw,
    ):
        await journal.ensure([s for s in ALL_STREAMS if s.name in journal_spec.streams])
        await gw.ensure([], [b for b in ALL_BUCKETS if b.name in gateway_spec.buckets])

        # the Store: create, get, compare-and-set (pipelined), a stale one refused, a watch sees the writes
        store = await gw.store(BUCKET_DELIVERIES, Item)
        kv: KeyValue = await gw.kv(BUCKET_DELIVERIES)
        watcher = await kv.watch(">")
        first = await store.create("domain-1", Item(name="a", n=1))
        got = await store.get("domain-1")
        assert got is not None
        assert (got.value, got.revision) == (Item(name="a", n=1), first)
        second = await store.update("domain-1", Item(name="a", n=2), revision=first)
        with pytest.raises(Conflict):
            await store.update("domain-1", Item(name="a", n=3), revision=first)
        assert await store.put("domain-2", Item(name="b", n=1)) > second
        latest = await store.get("domain-1")
        assert latest is not None
        assert (latest.value.n, latest.revision) == (2, second)
        seen: list[tuple[str, int]] = []

        async def watched() -> bool:
            try:
                update = await watcher.updates(timeout=1)
            except nats.errors.TimeoutError:
                return False  # nothing new within the second: look again
            if update is not None:
                seen.append((update.key, update.revision or 0))
            return {"domain-1", "domain-2"} <= {key for key, _ in seen}

        await eventually(watched, 20, "the watch to see both keys")
        assert ("domain-1", second) in seen
        await watcher.stop()

        # the API of the service's own server's domain is not the deployment's: its user may not even ask it
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await gw.nc.request(f"$JS.API.STREAM.INFO.KV_{BUCKET_DELIVERIES.name}", b"", timeout=1)

        # a durable consumer (the journal's) handles the event the gateway publishes
        handled: list[Envelope] = []

        async def handle(event: Envelope, delivery: Delivery) -> None:
            handled.append(event)

        stop = asyncio.Event()
        consumer = Consumer(journal, CONSUMERS["journal"], handler=handle)
        running = asyncio.create_task(consumer.run(stop))
        try:
            event = make_event(
                TriggerReceived(trigger_id="t", delivery_id="d-domain", adapter="generic", body_bytes=2),
                source="/temporality/trigger-gateway",
            )
            ack = await gw.publish(event)
            assert ack.stream == EVENTS_STREAM.name

            async def arrived() -> bool:
                return any(e.id == event.id for e in handled)

            await eventually(arrived, 30, "the journal consumer to handle the gateway's event")
        finally:
            stop.set()
            await asyncio.wait_for(running, 30)

    # everything lives in the hub's JetStream, nothing in the leaf's own (domain leaf)
    hub_nc = await nats.connect(hub.url)
    try:
        hub_js = hub_nc.jetstream()
        assert (await hub_js.stream_info(EVENTS_STREAM.name)).state.messages >= 1
        entry = await (await hub_js.key_value(BUCKET_DELIVERIES.name)).get("domain-1")
        assert Item.model_validate_json(entry.value or b"") == Item(name="a", n=2)
    finally:
        await hub_nc.close()
    for stream in (EVENTS_STREAM.name, f"KV_{BUCKET_DELIVERIES.name}"):
        assert list((hub.store_dir / "jetstream").rglob(stream)), stream  # where each stream keeps its files
        assert not list((leaf.store_dir / "jetstream").rglob(stream)), stream


@pytest.mark.timeout(120)
async def test_temporality_dlq_as_dlq_operator_in_a_jetstream_domain_through_a_leaf_node(
    hub_and_leaf: tuple[NatsServer, NatsServer],
) -> None:
    """``temporality dlq`` with ``TEMPORALITY_NATS_JETSTREAM_DOMAIN=hub``, logged in to the leaf as ``dlq-operator``
    with the printed domain permissions: it reads the hub's dead letters, re-drives one into the hub's events stream
    and purges another."""
    hub, leaf = hub_and_leaf
    await _hub_reachable(leaf)
    async with Bus.connect(_as(leaf, "journal"), name="journal", inbox_prefix="_INBOX.journal") as journal:
        await journal.ensure([s for s in ALL_STREAMS if s.name in SERVICES["journal"].streams])
        original = {"Temporality-Original-Subject": "temporality.events.trigger.received"}
        for n in (1, 2):
            await journal.publish_raw(
                "temporality.dlq.journal", b'{"n": %d}' % n, {**original, "Temporality-Error": f"PermanentError: {n}"}
            )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TEMPORALITY_")},
        "TEMPORALITY_NATS_URL": leaf.url,
        "TEMPORALITY_NATS_USER": OPERATOR_USER,
        "TEMPORALITY_NATS_PASSWORD": f"{OPERATOR_USER}-secret",
        "TEMPORALITY_NATS_JETSTREAM_DOMAIN": DOMAIN,
    }

    async def dlq(*argv: str) -> str:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "temporality_embedded.cli",
            "dlq",
            *argv,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode == 0, err.decode()
        return out.decode()

    assert "2 dead letter(s)" in await dlq("list")
    # the letters are no CloudEvents (this test is about the domain's wiring): --force re-drives one anyway
    assert "redriven 1 -> TEMPORALITY_EVENTS" in await dlq("redrive", "1", "--yes", "--force")
    assert "purged 2" in await dlq("purge", "2", "--yes")
    assert "no dead letters in TEMPORALITY_DLQ" in await dlq("list")
    hub_nc = await nats.connect(hub.url)
    try:
        hub_js = hub_nc.jetstream()
        assert (await hub_js.stream_info(EVENTS_STREAM.name)).state.messages == 1, "the re-drive landed in the hub"
        assert (await hub_js.stream_info(DLQ_STREAM.name)).state.messages == 0
    finally:
        await hub_nc.close()
