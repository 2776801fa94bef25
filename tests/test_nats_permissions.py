"""SEC-1 / AP-11 on the bus: each service is its own NATS user with the permissions its catalogue entry
implies; the server refuses anything else, and the whole system still works under those permissions."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_support import ALICE, API_TOKENS, JOURNAL, eventually, example_pr, make_stack, post_hook
from nats.js.api import KeyValueConfig, StreamConfig
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue
from pydantic import SecretStr

from temporality_agent_collab.__main__ import SPEC as COLLAB
from temporality_agent_collab.__main__ import configure as configure_collab
from temporality_agent_collab.settings import Settings as CollabSettings
from temporality_agent_collab.signing import public_key_text, sign
from temporality_bus import Bus, NatsSettings, Timers, written_out
from temporality_embedded import NatsServer, Stack
from temporality_embedded.cli import nats_authorization
from temporality_embedded.dlq import OPERATOR_USER
from temporality_embedded.natsserver import password_variable
from temporality_embedded.processes import free_port
from temporality_protocol import AgentMessageRefused, TriggerReceived, encode, make_event
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    BUCKET_RUNS,
    CONSUMERS,
    DLQ_STREAM,
    EVENTS_STREAM,
    RPC_AGENTS_HEARTBEAT,
    RPC_AGENTS_REGISTER,
    RPC_GET_COLLABORATORS,
    RPCS,
    SERVICES,
    TIMER_NS_HUMAN,
    TIMERS_STREAMS,
    ServiceSpec,
    agent_subject,
    service_problems,
    subject_for,
)
from temporality_protocol.permissions import (
    SUBSCRIBER_PREFIX,
    TIMERS_MIGRATION_USER,
    external_agent_inbox,
    external_agent_permissions,
    journal_subscriber_permissions,
    permissions_for,
    service_inbox,
    subscriber_inbox,
    subscriber_user,
)
from temporality_service.runtime import Runtime, run_until
from temporality_service.settings import ServiceSettings

PASSWORDS = {name: f"{name}-password" for name in SERVICES}
AUDIT = subscriber_user("audit")
#: The streams the journal owns and creates (each service with timers creates its own timers stream).
JOURNAL_STREAMS = [
    s for s in ALL_STREAMS if s.name in SERVICES["journal"].streams
]  # the journal subscriber of these tests: user and durable sub-audit


def test_permissions_follow_the_catalogue() -> None:
    for name, spec in SERVICES.items():
        permissions = permissions_for(name)
        for event_type in spec.sends:
            assert subject_for(event_type) in permissions.publish, (name, event_type)
        others = {t for other in SERVICES.values() if other is not spec for t in other.sends} - set(spec.sends)
        assert not [t for t in others if subject_for(t) in permissions.publish], name
        assert "temporality.events.>" not in permissions.publish
        assert permissions.allow_responses == bool(spec.responders)
        assert set(spec.responders) <= set(permissions.subscribe)
        # JetStream and KV: no blanket grant; its own durables and buckets, nobody else's
        assert not {"$JS.API.>", "$KV.>", ">", "$JS.>"} & set(permissions.publish), name
        for bucket in ALL_BUCKETS:
            owns = bucket.name in spec.buckets
            assert (f"$KV.{bucket.name}.>" in permissions.publish) == owns, (name, bucket.name)
            reads = owns or bucket.name in spec.reads_buckets
            assert (f"$JS.API.STREAM.MSG.GET.KV_{bucket.name}" in permissions.publish) == reads, (name, bucket.name)
        for durable, consumer in CONSUMERS.items():
            fetch = f"$JS.API.CONSUMER.MSG.NEXT.{consumer.stream}.{durable}"
            assert (fetch in permissions.publish) == (durable in spec.consumers), (name, durable)
        assert not [p for p in permissions.publish if ".DELETE." in p and ".STREAM." in p], name
        # replies: its own inbox only, never everyone's
        assert permissions.subscribe == (f"_INBOX.{name}.>", *spec.responders), name
        # the layout: it creates and changes only what it owns, reads the info of what it uses
        for stream in ALL_STREAMS:
            owns, uses = stream.name in spec.streams, stream.name in spec.uses_streams
            for op in ("CREATE", "UPDATE"):
                assert (f"$JS.API.STREAM.{op}.{stream.name}" in permissions.publish) == owns, (name, op, stream.name)
            assert (f"$JS.API.STREAM.INFO.{stream.name}" in permissions.publish) == (owns or uses), (name, stream)
        for bucket in ALL_BUCKETS:
            owns = bucket.name in spec.buckets
            for op in ("CREATE", "UPDATE"):  # created, and brought to the configured copies, by its owner only
                assert (f"$JS.API.STREAM.{op}.KV_{bucket.name}" in permissions.publish) == owns, (name, op, bucket.name)
            info = owns or bucket.name in spec.reads_buckets
            assert (f"$JS.API.STREAM.INFO.KV_{bucket.name}" in permissions.publish) == info, (name, bucket.name)
    assert subject_for("human.answered") not in permissions_for("trigger-gateway").publish
    for name in SERVICES:  # each audits what it refuses (issue 11): its API's refusals and NATS's of its connection
        assert {subject_for("api.access_refused"), subject_for("bus.permission_refused")} <= set(
            permissions_for(name).publish
        ), name
    assert sorted(s for spec in SERVICES.values() for s in spec.streams) == sorted(s.name for s in ALL_STREAMS)
    # events, dead letters, its own timers stream (and no other service's)
    assert SERVICES["trigger-gateway"].uses_streams == (
        EVENTS_STREAM.name,
        DLQ_STREAM.name,
        TIMERS_STREAMS["trigger-gateway"].name,
    )
    assert SERVICES["journal"].uses_streams == (EVENTS_STREAM.name, DLQ_STREAM.name)  # no timers
    for bad in ("a.b", "*", ">", ""):
        with pytest.raises(ValueError, match="service name"):
            service_inbox(bad)
    assert sorted(b for spec in SERVICES.values() for b in spec.buckets) == sorted(b.name for b in ALL_BUCKETS)


def test_the_catalogue_refuses_a_bucket_nobody_owns_and_a_consumer_named_like_a_subscriber() -> None:
    """A new bucket must name its owner, or no service's NATS user could use it (check_services, make schemas)."""
    gateway = SERVICES["trigger-gateway"]
    orphaned = {**SERVICES, "trigger-gateway": dataclasses.replace(gateway, buckets=gateway.buckets[1:])}
    problems = service_problems(orphaned)
    assert any(f"bucket {gateway.buckets[0]} belongs to 0 services" in p for p in problems), problems
    twice = {**SERVICES, "journal": dataclasses.replace(SERVICES["journal"], buckets=(gateway.buckets[0],))}
    assert any(f"bucket {gateway.buckets[0]} belongs to 2 services" in p for p in service_problems(twice))
    unknown = {**SERVICES, "journal": dataclasses.replace(SERVICES["journal"], reads_buckets=("nope",))}
    assert any("names bucket 'nope'" in p for p in service_problems(unknown))
    journal = SERVICES["journal"]
    unowned = {**SERVICES, "journal": dataclasses.replace(journal, streams=journal.streams[1:])}
    assert any(f"stream {journal.streams[0]} belongs to 0 services" in p for p in service_problems(unowned))
    shared = {**SERVICES, "trigger-gateway": dataclasses.replace(gateway, streams=(journal.streams[0],))}
    assert any(f"stream {journal.streams[0]} belongs to 2 services" in p for p in service_problems(shared))
    consumers = {**CONSUMERS, "sub-x": dataclasses.replace(CONSUMERS["journal"], durable="sub-x")}
    assert any("consumer sub-x is named like a journal subscriber" in p for p in service_problems(None, consumers))


@pytest.fixture
def secured(tmp_path: Path) -> Any:
    server = NatsServer(
        tmp_path / "nats",
        users={
            **{name: (PASSWORDS[name], permissions_for(name)) for name in SERVICES},
            "example-agent": ("agent-password", external_agent_permissions("example-agent")),
            "other-agent": ("other-agent-password", external_agent_permissions("other-agent")),
            AUDIT: ("audit-password", journal_subscriber_permissions("audit")),
            subscriber_user("other"): ("other-password", journal_subscriber_permissions("other")),
            "admin": ("admin-password", None),
        },
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_the_server_refuses_a_publish_outside_the_services_permissions(secured: NatsServer) -> None:
    admin = NatsSettings(url=secured.url, user="admin", password=SecretStr("admin-password"))
    async with Bus.connect(admin, name="admin") as bus:
        await bus.ensure([EVENTS_STREAM])
    violations: list[str] = []
    gateway = await _service(secured, "trigger-gateway", violations)
    try:
        js = gateway.jetstream()
        own = make_event(
            TriggerReceived(trigger_id="t", delivery_id="d-1", adapter="generic", body_bytes=2), source="/t"
        )
        ack = await js.publish(own.nats_subject, encode(own), timeout=5)  # its own event: stored
        assert ack.stream == EVENTS_STREAM.name
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.publish(subject_for("human.answered"), b"{}", timeout=2)  # forged: refused, never stored
        await eventually(
            lambda: asyncio.sleep(0, [v for v in violations if "human.answered" in v]),
            timeout_s=10,
            what="the server's permissions violation",
        )
        info = await js.stream_info(EVENTS_STREAM.name, subjects_filter=subject_for("human.answered"))
        assert not info.state.subjects, "the forged event reached the stream"
    finally:
        await gateway.close()
    with pytest.raises(nats.errors.Error):
        await nats.connect(secured.url, user="trigger-gateway", password="wrong", allow_reconnect=False)


async def test_a_service_may_not_touch_another_services_bucket(secured: NatsServer) -> None:
    """The gateway reads and writes its own buckets; the run-executor's ``runs`` it may not get, put or watch."""
    admin = NatsSettings(url=secured.url, user="admin", password=SecretStr("admin-password"))
    async with Bus.connect(admin, name="admin") as bus:
        await bus.ensure([EVENTS_STREAM], ALL_BUCKETS)
        await (await bus.kv(BUCKET_RUNS)).put("run-1", b'{"state": "running"}')
    owner = next(b for b in ALL_BUCKETS if b.name in SERVICES["trigger-gateway"].buckets)
    assert BUCKET_RUNS.name not in SERVICES["trigger-gateway"].buckets
    violations: list[str] = []
    gateway = await _service(secured, "trigger-gateway", violations)
    try:
        js = gateway.jetstream(timeout=2)
        own = await js.key_value(owner.name)  # its own: put, get, list
        await own.put("k", b"v")
        assert (await own.get("k")).value == b"v"
        assert await own.keys() == ["k"]
        refused = (nats.errors.TimeoutError, nats.errors.NoRespondersError)
        with pytest.raises(refused):  # not even its info (configuration, counts) is visible ...
            await js.key_value(BUCKET_RUNS.name)
        # ... nor its data, asked for without the look-up
        stream = f"KV_{BUCKET_RUNS.name}"
        runs = KeyValue(name=BUCKET_RUNS.name, stream=stream, pre=f"$KV.{BUCKET_RUNS.name}.", js=js, direct=False)
        with pytest.raises(refused):
            await runs.get("run-1")
        with pytest.raises(refused):
            await runs.put("run-1", b'{"state": "completed"}')
        with pytest.raises(refused):
            await runs.keys()
        await _violations_of(
            violations,
            f"$js.api.stream.info.kv_{BUCKET_RUNS.name}",
            f"$js.api.stream.msg.get.kv_{BUCKET_RUNS.name}",
            f"$kv.{BUCKET_RUNS.name}.run-1",
            f"$js.api.consumer.create.kv_{BUCKET_RUNS.name}",
        )
    finally:
        await gateway.close()
    async with Bus.connect(admin, name="admin") as bus:
        assert (await (await bus.kv(BUCKET_RUNS)).get("run-1")).value == b'{"state": "running"}'


async def test_the_printed_server_authorization_works_on_a_real_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``temporality nats-authorization`` (for a NATS the operator runs: Helm, compose) is what the tests use:
    the journal creates the streams it owns, the gateway finds them and publishes its own event, is refused
    another's; the subscriber reads."""
    config = tmp_path / "auth.conf"
    config.write_text(nats_authorization(["audit"], ["example-agent"]), encoding="utf-8")
    for user in [*SERVICES, AUDIT, "example-agent", TIMERS_MIGRATION_USER, OPERATOR_USER]:
        monkeypatch.setenv(password_variable(user), f"{user}-secret")  # the server reads them from its env
    server = NatsServer(tmp_path / "nats", config_file=config)
    server.start()
    try:
        journal = NatsSettings(url=server.url, user="journal", password=SecretStr("journal-secret"))
        async with Bus.connect(journal, name="journal") as bus:  # the owner of the shared streams
            await bus.ensure(JOURNAL_STREAMS)
        gateway = NatsSettings(url=server.url, user="trigger-gateway", password=SecretStr("trigger-gateway-secret"))
        async with Bus.connect(gateway, name="trigger-gateway") as bus:  # its inbox: _INBOX.trigger-gateway
            assert await bus.find_layout([EVENTS_STREAM]) == []  # the stream's info: allowed
            event = make_event(
                TriggerReceived(trigger_id="t", delivery_id="d", adapter="generic", body_bytes=2), source="/t"
            )
            assert (await bus.publish(event)).stream == EVENTS_STREAM.name
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await bus.js.publish(subject_for("human.answered"), b"{}", timeout=2)
        nc = await nats.connect(
            server.url, user=AUDIT, password=f"{AUDIT}-secret", inbox_prefix=subscriber_inbox("audit")
        )
        try:
            sub = await nc.jetstream(timeout=5).pull_subscribe(
                "temporality.events.>", durable=AUDIT, stream=EVENTS_STREAM.name
            )
            assert await _fetch_ids(sub, 1) == [event.id]
        finally:
            await nc.close()
        with pytest.raises(nats.errors.Error):  # the variable's value, not its name, is the password
            await nats.connect(server.url, user="journal", password="$JOURNAL_PASSWORD", allow_reconnect=False)
    finally:
        server.stop()


REFUSED = (nats.errors.TimeoutError, nats.errors.NoRespondersError)


async def test_a_service_cannot_read_another_services_inbox_and_responders_still_answer(secured: NatsServer) -> None:
    """Each service's replies arrive below its own ``_INBOX.<service>``: another service may not subscribe
    there (nor to ``_INBOX.>``); a responder still answers a request from another inbox (allow_responses),
    but may not write into that inbox unasked."""
    violations: list[str] = []
    collab = await _service(secured, "agent-collab", violations)
    executor = await _service(secured, "run-executor", violations)
    gateway = await _service(secured, "trigger-gateway", violations)
    admin = await nats.connect(secured.url, user="admin", password="admin-password")
    try:
        requests: list[str] = []

        async def answer(msg: Any) -> None:  # the responder's side, as agent-collab's user
            requests.append(msg.reply)
            await msg.respond(b'{"collaborators": []}')

        await collab.subscribe(RPC_GET_COLLABORATORS, queue="agent-collab", cb=answer)
        await collab.subscribe(RPC_AGENTS_REGISTER, queue="agent-collab", cb=answer)
        await written_out(collab)
        snooped: list[bytes] = []

        async def snoop(msg: Any) -> None:
            snooped.append(msg.data)

        await gateway.subscribe("_INBOX.run-executor.>", cb=snoop)  # another service's replies: refused
        await gateway.subscribe("_INBOX.>", cb=snoop)  # everyone's: refused
        await written_out(gateway)
        await _violations_of(violations, 'subscription to "_inbox.run-executor.>"', 'subscription to "_inbox.>"')
        reply = await executor.request(RPC_GET_COLLABORATORS, b"{}", timeout=5)  # the run-executor asks
        assert reply.data == b'{"collaborators": []}'
        assert requests, "the responder got no request"
        assert requests[0].startswith("_INBOX.run-executor."), requests
        external = await nats.connect(
            secured.url, user="example-agent", password="agent-password", inbox_prefix="_INBOX.example-agent"
        )
        try:  # an external agent (on its own inbox, its own subject) is answered too
            assert (await external.request(agent_subject(RPC_AGENTS_REGISTER, "example-agent"), b"{}", timeout=5)).data
        finally:
            await external.close()
        # the responder may not publish into the requester's inbox outside a reply (nor replay an old one)
        await collab.publish(requests[0] + "x", b"forged")
        await collab.flush()
        await _violations_of(violations, f'publish to "{requests[0].lower()}x"')
        await admin.publish(requests[0], b"late")  # full access: reaches only the run-executor's inbox
        await admin.flush()
        await executor.flush()
        await gateway.flush()
        assert not snooped, snooped
    finally:
        for nc in (collab, executor, gateway, admin):
            await nc.close()


async def test_a_service_cannot_create_or_change_a_stream_or_bucket_it_does_not_own(secured: NatsServer) -> None:
    """The journal owns the shared streams: the gateway may read their info, not create or reconfigure them;
    it creates its own bucket, not the run-executor's."""
    violations: list[str] = []
    gateway = await _service(secured, "trigger-gateway", violations)
    journal = await _service(secured, "journal", violations)
    try:
        gjs = gateway.jetstream(timeout=2)
        config = StreamConfig(name=EVENTS_STREAM.name, subjects=list(EVENTS_STREAM.subjects))
        with pytest.raises(REFUSED):  # before the owner: it may not create it either
            await gjs.add_stream(config)
        with pytest.raises(NotFoundError):  # but it may look: not there yet
            await gjs.stream_info(EVENTS_STREAM.name)
        await journal.jetstream(timeout=5).add_stream(config)  # the owner creates it
        assert (await gjs.stream_info(EVENTS_STREAM.name)).config.max_age in (None, 0)  # now visible
        with pytest.raises(REFUSED):  # ... and may not change it
            await gjs.update_stream(StreamConfig(name=EVENTS_STREAM.name, subjects=["x.>"], max_age=60))
        with pytest.raises(REFUSED):  # nor create another stream of the layout
            await gjs.add_stream(StreamConfig(name=DLQ_STREAM.name, subjects=list(DLQ_STREAM.subjects)))
        with pytest.raises(REFUSED):  # nor another's bucket
            await gjs.create_key_value(KeyValueConfig(bucket=BUCKET_RUNS.name))
        own = SERVICES["trigger-gateway"].buckets[0]
        await gjs.create_key_value(KeyValueConfig(bucket=own))  # its own: allowed
        await _violations_of(
            violations,
            f"$js.api.stream.create.{EVENTS_STREAM.name}",
            f"$js.api.stream.update.{EVENTS_STREAM.name}",
            f"$js.api.stream.create.{DLQ_STREAM.name}",
            f"$js.api.stream.create.kv_{BUCKET_RUNS.name}",
        )
    finally:
        await gateway.close()
        await journal.close()
    admin = await nats.connect(secured.url, user="admin", password="admin-password")
    try:
        ajs = admin.jetstream()
        info = await ajs.stream_info(EVENTS_STREAM.name)
        assert info.config.subjects == list(EVENTS_STREAM.subjects), "the gateway's update reached the stream"
        names = {stream.config.name for stream in await ajs.streams_info()}
        assert names == {EVENTS_STREAM.name, f"KV_{own}"}, names
    finally:
        await admin.close()


async def test_a_service_started_before_the_owner_waits_not_ready_then_runs(tmp_path: Path) -> None:
    """The runtime ensures only what the service owns: started before the journal has created the events
    stream, a service (its own NATS user) answers /healthz and 503 on /readyz, and runs once the stream exists."""
    probe = ServiceSpec(
        "probe",
        package="temporality_probe",
        description="a service that only sends trigger.received",
        env_prefix="TEMPORALITY_PROBE_",
        sends=("trigger.received",),
    )
    server = NatsServer(
        tmp_path / "nats",
        users={
            "probe": ("probe-password", permissions_for(probe)),
            "journal": (PASSWORDS["journal"], permissions_for("journal")),
            "admin": ("admin-password", None),
        },
    )
    server.start()
    stop, ready = asyncio.Event(), asyncio.Event()
    buses: list[Bus] = []

    async def setup(runtime: Runtime[ServiceSettings]) -> None:
        buses.append(runtime.bus)

    port = free_port()
    settings = ServiceSettings(
        nats=NatsSettings(url=server.url, user="probe", password=SecretStr("probe-password")), port=port
    )
    service = asyncio.create_task(run_until(probe, settings, setup, stop, ready=ready))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

            async def answering() -> httpx.Response | None:
                with contextlib.suppress(httpx.TransportError):
                    return await http.get("/readyz")
                return None

            waiting = await eventually(answering, timeout_s=30, what="the waiting service's /readyz")
            assert waiting.status_code == 503, waiting.text
            assert waiting.json()["checks"] == {"layout": "failing"}, waiting.json()
            assert (await http.get("/healthz")).status_code == 200  # alive: no probe restarts it
            assert not service.done()
            assert not ready.is_set()
            assert not buses, "set up before the layout existed"
            owner = NatsSettings(url=server.url, user="journal", password=SecretStr(PASSWORDS["journal"]))
            async with Bus.connect(owner, name="journal") as journal:
                await journal.ensure(JOURNAL_STREAMS)
            await asyncio.wait_for(ready.wait(), 30)
            assert (await http.get("/readyz")).status_code == 200
        event = make_event(
            TriggerReceived(trigger_id="t", delivery_id="d", adapter="generic", body_bytes=2), source="/t"
        )
        assert (await buses[0].publish(event)).stream == EVENTS_STREAM.name  # its own inbox gets the ack
    finally:
        stop.set()
        await asyncio.wait_for(service, 30)
        server.stop()


async def test_without_nats_users_a_service_creates_what_it_uses_but_never_changes_it(tmp_path: Path) -> None:
    """No NATS user, nothing enforced: a service started alone does not wait for the journal, it creates the
    missing streams it uses with the catalogue's configuration; one that exists (the owner's) it leaves as is."""
    probe = ServiceSpec(
        "probe",
        package="temporality_probe",
        description="a service that only sends trigger.received: it uses the events stream alone",
        env_prefix="TEMPORALITY_PROBE_",
        sends=("trigger.received",),
    )
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        settings = NatsSettings(url=server.url)
        owners = NatsSettings(url=server.url, events_max_age_days=3)
        async with Bus.connect(owners, name="journal") as journal:  # the owner's stream, its retention
            await journal.ensure([EVENTS_STREAM])
        stop, ready = asyncio.Event(), asyncio.Event()

        async def setup(runtime: Runtime[ServiceSettings]) -> None:
            pass

        service = asyncio.create_task(run_until(probe, ServiceSettings(nats=settings), setup, stop, ready=ready))
        try:
            await asyncio.wait_for(ready.wait(), 30)
        finally:
            stop.set()
            await asyncio.wait_for(service, 30)
        async with Bus.connect(settings, name="admin") as bus:
            info = await bus.js.stream_info(EVENTS_STREAM.name)
            assert info.config.max_age == 3 * 24 * 3600, "the owner's retention was changed"
            not_used = [DLQ_STREAM.name, *(s.name for s in TIMERS_STREAMS.values())]
            assert await bus.find_layout(ALL_STREAMS) == not_used
        async with Bus.connect(settings, name="probe") as bus:  # what the runtime does for a missing one
            assert await bus.find_layout([DLQ_STREAM], create_missing=True) == []
            assert (await bus.js.stream_info(DLQ_STREAM.name)).config.max_age == DLQ_STREAM.max_age_s
    finally:
        server.stop()


def test_an_external_agent_may_only_call_the_agent_protocol() -> None:
    permissions = external_agent_permissions("example-agent")
    external = {agent_subject(spec.subject, "example-agent") for spec in RPCS.values() if spec.external}
    assert external, "the Agent Protocol's subjects are marked external in the catalogue"
    assert set(permissions.publish) == external  # its own subjects only: temporality.rpc.agents.example-agent.*
    assert all(s.startswith("temporality.rpc.agents.example-agent.") for s in permissions.publish)
    assert not set(permissions.publish) & set(external_agent_permissions("other-agent").publish)
    assert permissions.subscribe == ("_INBOX.example-agent.>",)  # its own replies, never _INBOX.>
    assert not permissions.allow_responses
    for bad in ("a.b", "*", ">", "", "x" * 64, "trigger-gateway"):  # not one token, or a service's user
        with pytest.raises(ValueError, match="external agent user"):
            external_agent_permissions(bad)
    assert '"_INBOX.reviewer-bot.>"' in nats_authorization([], ["reviewer-bot"])


async def test_an_external_agent_reads_only_its_own_replies(secured: NatsServer) -> None:
    """An agent's replies (its task offers, policy, probes) arrive below ``_INBOX.<its user>``: another agent may
    not subscribe there nor to ``_INBOX.>``, and an agent on nats-py's default ``_INBOX`` gets no reply at all."""
    register = next(spec.subject for spec in RPCS.values() if spec.external and spec.name.endswith("register"))
    admin = await nats.connect(secured.url, user="admin", password="admin-password")
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc).lower())

    async def answer(msg: Any) -> None:  # stands in for agent-collab
        await msg.respond(b'{"policy": "for example-agent only"}')

    await admin.subscribe(register, cb=answer)
    await written_out(admin)
    mine, theirs = agent_subject(register, "example-agent"), agent_subject(register, "other-agent")
    agent = await nats.connect(
        secured.url,
        user="example-agent",
        password="agent-password",
        inbox_prefix=external_agent_inbox("example-agent"),
        error_cb=on_error,
    )
    other = await nats.connect(
        secured.url,
        user="other-agent",
        password="other-agent-password",
        inbox_prefix=external_agent_inbox("other-agent"),
        error_cb=on_error,
    )
    default_inbox = await nats.connect(secured.url, user="other-agent", password="other-agent-password")
    try:
        snooped: list[bytes] = []

        async def snoop(msg: Any) -> None:
            snooped.append(msg.data)

        await other.subscribe("_INBOX.example-agent.>", cb=snoop)
        await other.subscribe("_INBOX.>", cb=snoop)
        await written_out(other)
        await _violations_of(violations, 'subscription to "_inbox.example-agent.>"', 'subscription to "_inbox.>"')
        reply = await agent.request(mine, b"{}", timeout=5)
        assert reply.data == b'{"policy": "for example-agent only"}'
        assert (await other.request(theirs, b"{}", timeout=5)).data  # on its own inbox it is answered
        with pytest.raises(nats.errors.TimeoutError):  # the default _INBOX: the server refuses the subscription
            await default_inbox.request(theirs, b"{}", timeout=1)
        await other.flush()
        assert not snooped, snooped
    finally:
        for nc in (agent, other, default_inbox, admin):
            await nc.close()


async def test_the_server_lets_an_external_agent_register_and_nothing_else(secured: NatsServer) -> None:
    register = next(spec.subject for spec in RPCS.values() if spec.external and spec.name.endswith("register"))
    admin = await nats.connect(secured.url, user="admin", password="admin-password")
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc))

    async def answer(msg: Any) -> None:  # stands in for agent-collab: the request got through
        await msg.respond(b'{"accepted": true}')

    await admin.subscribe(register, cb=answer)
    await written_out(admin)
    agent = await nats.connect(
        secured.url,
        user="example-agent",
        password="agent-password",
        inbox_prefix="_INBOX.example-agent",
        error_cb=on_error,
    )
    try:
        reply = await agent.request(agent_subject(register, "example-agent"), b"{}", timeout=5)
        assert reply.data == b'{"accepted": true}'
        await agent.publish(subject_for("agent.registered"), b"{}")  # forging an event: refused
        await agent.publish("$JS.API.STREAM.NAMES", b"")  # the JetStream API: refused
        await agent.publish(agent_subject(register, "other-agent"), b"{}")  # another agent's subject: refused
        await agent.flush()
        await eventually(
            lambda: asyncio.sleep(
                0, violations if len([v for v in violations if "permissions violation" in v]) >= 3 else None
            ),
            timeout_s=10,
            what="the server refusing the three publishes",
        )
        assert any("agent.registered" in v for v in violations), violations
        assert any("$js.api" in v.lower() for v in violations), violations
        assert any("temporality.rpc.agents.other-agent.register" in v.lower() for v in violations), violations
    finally:
        await agent.close()
        await admin.close()


async def test_two_external_agents_each_speak_only_for_themselves(secured: NatsServer, tmp_path: Path) -> None:
    """AP-11 on a real server with agent-collab on its own NATS user: example-agent may not publish on
    other-agent's subjects nor read its requests or replies; with other-agent's key in hand it still cannot
    speak for it on its own subject -- agent-collab refuses the forged id (``subject_mismatch``) and journals it."""
    keys = {name: Ed25519PrivateKey.generate() for name in ("example-agent", "other-agent")}
    allow = tmp_path / "external-agents.yaml"
    allow.write_text(
        "agents:\n"
        + "".join(f"  - id: {name}\n    public_key: {public_key_text(k.public_key())}\n" for name, k in keys.items()),
        encoding="utf-8",
    )
    owner = NatsSettings(url=secured.url, user="journal", password=SecretStr(PASSWORDS["journal"]))
    async with Bus.connect(owner, name="journal") as journal:
        await journal.ensure(JOURNAL_STREAMS)  # the journal's layout; agent-collab its own buckets and timers
    settings = CollabSettings(
        nats=NatsSettings(url=secured.url, user="agent-collab", password=SecretStr(PASSWORDS["agent-collab"])),
        external_agents_file=allow,
    )
    stop, ready = asyncio.Event(), asyncio.Event()
    collab = asyncio.create_task(run_until(COLLAB, settings, configure_collab(settings), stop, ready=ready))
    admin = await nats.connect(secured.url, user="admin", password="admin-password")
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc).lower())

    journaled: list[dict[str, Any]] = []

    async def refused(msg: Any) -> None:
        journaled.append(json.loads(msg.data)["data"])

    await admin.subscribe(subject_for(AgentMessageRefused.EVENT_TYPE), cb=refused)
    await written_out(admin)
    agents = {
        name: await nats.connect(
            secured.url,
            user=name,
            password="agent-password" if name == "example-agent" else "other-agent-password",
            inbox_prefix=external_agent_inbox(name),
            error_cb=on_error,
        )
        for name in keys
    }
    mallory, other = agents["example-agent"], agents["other-agent"]

    async def request(nc: Any, pattern: str, agent: str, body: dict[str, Any], signer: str) -> dict[str, Any]:
        subject, raw = agent_subject(pattern, agent), json.dumps(body).encode()
        headers = sign(keys[signer], subject, signer, raw, timestamp=int(time.time()), nonce=secrets.token_urlsafe(16))
        reply: dict[str, Any] = json.loads((await nc.request(subject, raw, timeout=10, headers=headers)).data)
        return reply

    def registration(agent: str) -> dict[str, Any]:
        return {"agent_id": agent, "protocol_version": "1.0", "provider": "p", "model": "m", "max_context_size": 1}

    def beat(agent: str) -> dict[str, Any]:
        return {
            "agent_id": agent,
            "timestamp": "2026-12-01T00:00:00Z",
            "current_state": "busy",
            "protocol_version": "1.0",
        }

    try:
        await asyncio.wait_for(ready.wait(), 60)
        for name, nc in agents.items():  # each registers on its own subject
            assert (await request(nc, RPC_AGENTS_REGISTER, name, registration(name), name))["outcome"] == "registered"
        snooped: list[bytes] = []

        async def snoop(msg: Any) -> None:
            snooped.append(msg.data)

        # example-agent may neither read other-agent's requests nor its replies ...
        await mallory.subscribe("temporality.rpc.agents.other-agent.>", cb=snoop)
        await mallory.subscribe(f"{external_agent_inbox('other-agent')}.>", cb=snoop)
        # ... nor publish on its subjects: the server drops the request, agent-collab never sees it
        with pytest.raises(nats.errors.TimeoutError):
            await request(mallory, RPC_AGENTS_HEARTBEAT, "other-agent", beat("other-agent"), "other-agent")
        await _violations_of(
            violations,
            'subscription to "temporality.rpc.agents.other-agent.>"',
            f'subscription to "{external_agent_inbox("other-agent").lower()}.>"',
            'publish to "temporality.rpc.agents.other-agent.heartbeat"',
        )
        # with other-agent's key, on its own subject: the id in the subject is not the signer's -> refused, journaled
        forged = await request(mallory, RPC_AGENTS_HEARTBEAT, "example-agent", beat("other-agent"), "other-agent")
        assert (forged["accepted"], forged["refusal"]["reason"]) == (False, "subject_mismatch"), forged
        entry = await eventually(
            lambda: asyncio.sleep(0, next((e for e in journaled if e["reason"] == "subject_mismatch"), None)),
            timeout_s=10,
            what="agent.message_refused (subject_mismatch) in the journal's stream",
        )
        # journaled as example-agent's (its NATS user sent it), the id it claimed kept apart
        assert (entry["agent_id"], entry["claimed_agent_id"], entry["subject"]) == (
            "example-agent",
            "other-agent",
            "temporality.rpc.agents.example-agent.heartbeat",
        )
        # other-agent itself is unaffected, and nothing of its traffic reached example-agent
        ack = await request(other, RPC_AGENTS_HEARTBEAT, "other-agent", beat("other-agent"), "other-agent")
        assert (ack["accepted"], ack["state"]) == (True, "busy"), ack
        await mallory.flush()
        assert not snooped, snooped
    finally:
        for nc in (*agents.values(), admin):
            await nc.close()
        stop.set()
        await asyncio.wait_for(collab, 30)


def test_a_journal_subscriber_gets_exactly_its_own_durables() -> None:
    assert not [d for d in CONSUMERS if d.startswith(SUBSCRIBER_PREFIX)], "sub- is reserved for subscribers"
    permissions = journal_subscriber_permissions("audit", ["sub-audit", "sub-audit-replay"])
    stream = EVENTS_STREAM.name
    assert f"$JS.API.CONSUMER.MSG.NEXT.{stream}.sub-audit-replay" in permissions.publish
    assert f"$JS.ACK.{stream}.sub-audit.>" in permissions.publish
    assert not [p for p in permissions.publish if not p.startswith(("$JS.API.", "$JS.ACK."))], "no event, no KV"
    assert not [p for p in permissions.publish if "*" in p or p.endswith(f"{stream}.>")], "no wildcard names"
    assert permissions.subscribe == ("_INBOX.sub-audit.>",)
    assert not permissions.allow_responses
    for name, durables in (("audit", ["sub-other"]), ("audit", ["journal"]), ("a.b", []), ("*", []), ("", [])):
        with pytest.raises(ValueError, match=r"subscriber|durable"):
            journal_subscriber_permissions(name, durables)


async def test_a_service_cancels_its_own_timers_and_cannot_cancel_another_s(secured: NatsServer) -> None:
    """A cancel is a publish to the timer's own subject: human-interaction arms and cancels its own; the
    gateway can neither cancel human-interaction's timer that way nor purge its timers stream (stopping,
    arming and purging another's timer in every other way: tests/test_timer_isolation.py)."""
    timers_stream = TIMERS_STREAMS["human-interaction"]
    admin = NatsSettings(url=secured.url, user="admin", password=SecretStr("admin-password"))
    async with Bus.connect(admin, name="admin") as bus:
        await bus.ensure(TIMERS_STREAMS.values())

    def as_service(name: str) -> contextlib.AbstractAsyncContextManager[Bus]:
        settings = NatsSettings(url=secured.url, user=name, password=SecretStr(PASSWORDS[name]))
        return Bus.connect(settings, name=name, inbox_prefix=service_inbox(name))

    later = datetime.now(UTC) + timedelta(hours=1)
    async with as_service("human-interaction") as human:
        timers = Timers(human, TIMER_NS_HUMAN)
        await timers.arm("mine", later, b"cancelled by its owner")
        await timers.cancel("mine")
        await timers.arm("kept", later, b"never cancelled by another service")
    violations: list[str] = []
    gateway = await _service(secured, "trigger-gateway", violations)
    try:
        cancel = {"Nats-Rollup": "sub", "Nats-TTL": "60s"}  # what Timers.cancel publishes, on another's subject
        with pytest.raises(REFUSED):
            await gateway.request("temporality.timers.schedule.human.kept", b"", timeout=2, headers=cancel)
        purge = json.dumps({"filter": "temporality.timers.schedule.human.kept"}).encode()
        with pytest.raises(REFUSED):
            await gateway.request(f"$JS.API.STREAM.PURGE.{timers_stream.name}", purge, timeout=2)
        await _violations_of(
            violations, "temporality.timers.schedule.human.kept", f"$js.api.stream.purge.{timers_stream.name}"
        )
    finally:
        await gateway.close()
    async with Bus.connect(admin, name="admin") as bus:
        kept = await bus.js.get_last_msg(timers_stream.name, "temporality.timers.schedule.human.kept")
        assert kept.headers is not None
        assert "Nats-Schedule" in kept.headers, "the other service's cancel reached the stream"
        mine = await bus.js.get_last_msg(timers_stream.name, "temporality.timers.schedule.human.mine")
        assert mine.headers is not None
        assert "Nats-Schedule" not in mine.headers, "the owner's cancel replaced its schedule"


async def _service(server: NatsServer, name: str, violations: list[str] | None = None) -> nats.NATS:
    """A plain nats-py connection as the service ``name``'s user, with its inbox prefix (as the runtime connects)."""

    async def on_error(exc: Exception) -> None:
        if violations is not None:
            violations.append(str(exc))

    return await nats.connect(
        server.url,
        user=name,
        password=PASSWORDS[name],
        inbox_prefix=service_inbox(name),
        error_cb=on_error,
        allow_reconnect=False,
    )


async def _violations_of(violations: list[str], *needles: str) -> list[str]:
    """Wait until the server has reported a permissions violation naming each of ``needles``."""

    async def reported() -> list[str] | None:
        found = [v for v in violations if "permissions violation" in v.lower()]
        return found if all(any(n.lower() in v.lower() for v in found) for n in needles) else None

    return await eventually(reported, timeout_s=10, what=f"the server refusing {needles}")


async def _journal_layout(server: NatsServer) -> list[str]:
    """As the admin: the layout, the journal's durable, and three events for the subscriber to read (their ids)."""
    admin = NatsSettings(url=server.url, user="admin", password=SecretStr("admin-password"))
    events = [
        make_event(TriggerReceived(trigger_id="t", delivery_id=f"d-{n}", adapter="generic", body_bytes=2), source="/t")
        for n in range(3)
    ]
    async with Bus.connect(admin, name="admin") as bus:
        await bus.ensure([EVENTS_STREAM, DLQ_STREAM], [BUCKET_RUNS])
        await bus.ensure_consumer(CONSUMERS["journal"])
        for event in events:
            await bus.publish(event)
    return [event.id for event in events]


async def _fetch_ids(sub: Any, count: int) -> list[str]:
    """Fetch until ``count`` messages came (a fetch may return fewer), acking each; their event ids."""
    ids: list[str] = []
    async with asyncio.timeout(15):
        while len(ids) < count:
            for msg in await sub.fetch(count - len(ids), timeout=5):
                ids.append(msg.headers["Nats-Msg-Id"] if msg.headers else "")
                await msg.ack_sync(timeout=5)  # the server confirms each ack
    return ids


async def _subscriber(server: NatsServer, violations: list[str] | None = None) -> nats.NATS:
    async def on_error(exc: Exception) -> None:
        if violations is not None:
            violations.append(str(exc))

    return await nats.connect(
        server.url, user=AUDIT, password="audit-password", inbox_prefix=subscriber_inbox("audit"), error_cb=on_error
    )


async def test_a_journal_subscriber_reads_acks_and_resumes_with_a_plain_pull_consumer(secured: NatsServer) -> None:
    """DC-6: a plain nats-py pull consumer (explicit stream, a sub- durable) works under the subscriber user."""
    ids = await _journal_layout(secured)
    nc = await _subscriber(secured)
    try:
        js = nc.jetstream(timeout=5)
        info = await js.stream_info(EVENTS_STREAM.name)
        assert info.state.messages == 3
        sub = await js.pull_subscribe("temporality.events.>", durable=AUDIT, stream=EVENTS_STREAM.name)
        assert await _fetch_ids(sub, 2) == ids[:2]
    finally:
        await nc.close()
    admin = await nats.connect(secured.url, user="admin", password="admin-password")
    try:  # more events while the subscriber is away
        await admin.jetstream().publish(subject_for("trigger.received"), b"{}", headers={"Nats-Msg-Id": "later"})
    finally:
        await admin.close()
    again = await _subscriber(secured)
    try:  # a new connection resumes the durable where it acknowledged: the rest, nothing twice
        sub = await again.jetstream(timeout=5).pull_subscribe(
            "temporality.events.>", durable=AUDIT, stream=EVENTS_STREAM.name
        )
        assert await _fetch_ids(sub, 2) == [ids[2], "later"]
        info = await sub.consumer_info()
        assert info.num_ack_pending == 0
        assert info.num_pending == 0
    finally:
        await again.close()


async def test_a_journal_subscriber_may_do_nothing_else(secured: NatsServer) -> None:
    await _journal_layout(secured)
    violations: list[str] = []
    nc = await _subscriber(secured, violations)
    stream = EVENTS_STREAM.name
    try:
        js = nc.jetstream(timeout=2)
        refused = (nats.errors.TimeoutError, nats.errors.NoRespondersError)
        with pytest.raises(refused):  # publishing an event
            await js.publish(subject_for("run.completed"), b"{}")
        with pytest.raises(refused):  # deleting the journal's durable
            await js.delete_consumer(stream, "journal")
        with pytest.raises(refused):  # a consumer named like a service's
            await js.pull_subscribe("temporality.events.>", durable="run-executor-requests", stream=stream)
        with pytest.raises(refused):  # another subscriber's durable
            await js.add_consumer(stream, durable_name=subscriber_user("other"))
        with pytest.raises(refused):  # a KV bucket
            await js.key_value(BUCKET_RUNS.name)
        with pytest.raises(refused):  # ... even by a direct get
            await nc.request(f"$JS.API.DIRECT.GET.KV_{BUCKET_RUNS.name}.$KV.{BUCKET_RUNS.name}.run-1", b"", timeout=2)
        with pytest.raises(refused):  # another stream
            await js.stream_info(DLQ_STREAM.name)
        await nc.subscribe("_INBOX.>")  # everyone's replies: refused (reported asynchronously)
        await nc.subscribe(subject_for("run.completed"))  # the events outside a consumer
        await written_out(nc)
        await _violations_of(
            violations,
            "temporality.events.run.completed",
            f"$js.api.consumer.delete.{stream}.journal",
            f"$js.api.consumer.info.{stream}.run-executor-requests",
            f"$js.api.consumer.durable.create.{stream}.sub-other",
            f"kv_{BUCKET_RUNS.name}",
            f"$js.api.direct.get.kv_{BUCKET_RUNS.name}",
            f"$js.api.stream.info.{DLQ_STREAM.name}",
            'subscription to "_inbox.>"',
            'subscription to "temporality.events.run.completed"',
        )
        # its own durable's name in the subject does not let it write another's config: the server checks
        body = {
            "stream_name": stream,
            "config": {"durable_name": "journal", "name": "journal", "ack_policy": "explicit"},
        }
        reply = await nc.request(f"$JS.API.CONSUMER.CREATE.{stream}.{AUDIT}", json.dumps(body).encode(), timeout=5)
        assert json.loads(reply.data)["error"]["err_code"] == 10017, reply.data  # name does not match the subject
    finally:
        await nc.close()
    admin = await nats.connect(secured.url, user="admin", password="admin-password")
    try:
        ajs = admin.jetstream()
        names = [c.name for c in await ajs.consumers_info(stream)]
        assert sorted(names) == ["journal"], names  # nothing created, nothing deleted
        info = await ajs.stream_info(stream, subjects_filter=subject_for("run.completed"))
        assert not info.state.subjects, "the forged event reached the stream"
    finally:
        await admin.close()


async def _every_event(stack: Stack) -> bytes:
    """Every message of the events stream, headers and data, read as the stack's NATS admin."""
    assert stack.nats_admin is not None
    user, password = stack.nats_admin
    nc = await nats.connect(stack.nats.url, user=user, password=password)
    try:
        js = nc.jetstream()
        info = await js.stream_info(EVENTS_STREAM.name)
        dump = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(EVENTS_STREAM.name, seq)
            dump.append(repr(msg.headers).encode() + b"\n" + (msg.data or b""))
        return b"\n".join(dump)
    finally:
        await nc.close()


@pytest.mark.e2e
@pytest.mark.timeout(240)
async def test_the_whole_system_runs_with_per_service_nats_users(tmp_path: Path) -> None:
    """Webhook -> question in the inbox -> answer -> run completed, every service on its own NATS user;
    afterwards no configured secret appears in any event of the run nor in any service's log."""
    stack = make_stack(tmp_path, nats_auth=True)  # debug logs: the most a log could leak
    await asyncio.to_thread(stack.start, 120)
    try:
        assert stack.nats_admin is not None
        conf = (tmp_path / "stack" / "nats" / "nats.conf").stat()
        assert conf.st_mode & 0o077 == 0, "the server's user list is readable by others"
        async with httpx.AsyncClient(timeout=15) as http:
            accepted = await post_hook(http, stack, example_pr())
            assert accepted.status_code == 202, accepted.text
            run_id = accepted.json()["run_id"]

            async def question() -> dict[str, Any] | None:
                inbox = (await http.get(f"{stack.human_url}/inbox", headers=ALICE)).json()
                return next((i for i in inbox["requests"] if i["run_id"] == run_id), None)

            asked = await eventually(question, timeout_s=90, what="the question in alice's inbox")
            answer = await http.post(
                f"{stack.human_url}/requests/{asked['id']}/answer",
                json={"option_id": asked["options"][0]["id"]},
                headers=ALICE,
            )
            assert answer.status_code in (200, 202), answer.text

            async def completed() -> dict[str, Any] | None:
                run = await http.get(f"{stack.journal_url}/runs/{run_id}", headers=JOURNAL)
                body: dict[str, Any] = run.json()
                return body if run.status_code == 200 and body.get("state") == "completed" else None

            await eventually(completed, timeout_s=90, what="the run completed in the journal")
        # the stack's journal subscriber reads the same run, through its own durable, beside the journal's
        subscriber = stack.subscriber("example")
        assert subscriber is not None
        user, password, inbox = subscriber
        nc = await nats.connect(stack.nats.url, user=user, password=password, inbox_prefix=inbox)
        try:
            sub = await nc.jetstream(timeout=5).pull_subscribe(
                "temporality.events.>", durable=user, stream=EVENTS_STREAM.name
            )
            seen: list[str] = []

            async def run_completed() -> bool:
                try:
                    batch = await sub.fetch(50, timeout=1)
                except nats.errors.TimeoutError:
                    return False
                for msg in batch:
                    seen.append(msg.subject)
                    await msg.ack()
                return subject_for("run.completed") in seen

            await eventually(run_completed, timeout_s=60, what="the subscriber reading run.completed")
        finally:
            await nc.close()
        assert not stack.dead()
        events = await _every_event(stack)
        assert run_id.encode() in events  # the dump really holds this run's events
    finally:
        await asyncio.to_thread(stack.stop)
    logs = b"".join(p.read_bytes() for p in (tmp_path / "stack" / "run").glob("*.log"))
    assert b"run.completed" in events
    # every service stayed inside its permissions the whole time (own inbox, own layout): the server logs each
    # refusal ("Publish Violation", "Subscription Violation")
    server_log = (tmp_path / "stack" / "nats" / "nats-server.log").read_text(encoding="utf-8", errors="replace")
    assert "Violation" not in server_log, [line for line in server_log.splitlines() if "Violation" in line][:10]
    assert logs
    secrets = {
        "the webhook password": b"change-me",
        "alice's inbox token": ALICE["Authorization"].split()[1].encode(),
        **{f"API token {t.name}": t.token.get_secret_value().encode() for t in API_TOKENS},
        **{f"NATS password of {name}": stack.env_for(name)["TEMPORALITY_NATS_PASSWORD"].encode() for name in SERVICES},
    }
    leaked = {what for what, secret in secrets.items() if secret in events or secret in logs}
    assert not leaked, f"secrets in the journal or the logs: {sorted(leaked)}"
