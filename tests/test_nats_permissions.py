"""SEC-1 / AP-11 on the bus: each service is its own NATS user with the permissions its catalogue entry
implies; the server refuses anything else, and the whole system still works under those permissions."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import pytest
from e2e_support import ALICE, API_TOKENS, JOURNAL, eventually, example_pr, make_stack, post_hook
from pydantic import SecretStr

from temporality_bus import Bus, NatsSettings
from temporality_embedded import NatsServer, Stack
from temporality_protocol import TriggerReceived, encode, make_event
from temporality_protocol.catalog import EVENTS_STREAM, RPCS, SERVICES, subject_for
from temporality_protocol.permissions import external_agent_permissions, permissions_for

PASSWORDS = {name: f"{name}-password" for name in SERVICES}


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
    assert subject_for("human.answered") not in permissions_for("trigger-gateway").publish


@pytest.fixture
def secured(tmp_path: Path) -> Any:
    server = NatsServer(
        tmp_path / "nats",
        users={
            **{name: (PASSWORDS[name], permissions_for(name)) for name in SERVICES},
            "example-agent": ("agent-password", external_agent_permissions()),
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

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc))

    gateway = await nats.connect(
        secured.url, user="trigger-gateway", password=PASSWORDS["trigger-gateway"], error_cb=on_error
    )
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


def test_an_external_agent_may_only_call_the_agent_protocol() -> None:
    permissions = external_agent_permissions()
    external = {spec.subject for spec in RPCS.values() if spec.external}
    assert external, "the Agent Protocol's subjects are marked external in the catalogue"
    assert set(permissions.publish) == external
    assert permissions.subscribe == ("_INBOX.>",)
    assert not permissions.allow_responses


async def test_the_server_lets_an_external_agent_register_and_nothing_else(secured: NatsServer) -> None:
    register = next(spec.subject for spec in RPCS.values() if spec.external and spec.name.endswith("register"))
    admin = await nats.connect(secured.url, user="admin", password="admin-password")
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc))

    async def answer(msg: Any) -> None:  # stands in for agent-collab: the request got through
        await msg.respond(b'{"accepted": true}')

    await admin.subscribe(register, cb=answer)
    await admin.flush()
    agent = await nats.connect(secured.url, user="example-agent", password="agent-password", error_cb=on_error)
    try:
        reply = await agent.request(register, b"{}", timeout=5)
        assert reply.data == b'{"accepted": true}'
        await agent.publish(subject_for("agent.registered"), b"{}")  # forging an event: refused
        await agent.publish("$JS.API.STREAM.NAMES", b"")  # the JetStream API: refused
        await agent.flush()
        await eventually(
            lambda: asyncio.sleep(
                0, violations if len([v for v in violations if "permissions violation" in v]) >= 2 else None
            ),
            timeout_s=10,
            what="the server refusing both publishes",
        )
        assert any("agent.registered" in v for v in violations), violations
        assert any("$js.api" in v.lower() for v in violations), violations
    finally:
        await agent.close()
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
        assert not stack.dead()
        events = await _every_event(stack)
        assert run_id.encode() in events  # the dump really holds this run's events
    finally:
        await asyncio.to_thread(stack.stop)
    logs = b"".join(p.read_bytes() for p in (tmp_path / "stack" / "run").glob("*.log"))
    assert b"run.completed" in events
    assert logs
    secrets = {
        "the webhook password": b"change-me",
        "alice's inbox token": ALICE["Authorization"].split()[1].encode(),
        **{f"API token {t.name}": t.token.get_secret_value().encode() for t in API_TOKENS},
        **{f"NATS password of {name}": stack.env_for(name)["TEMPORALITY_NATS_PASSWORD"].encode() for name in SERVICES},
    }
    leaked = {what for what, secret in secrets.items() if secret in events or secret in logs}
    assert not leaked, f"secrets in the journal or the logs: {sorted(leaked)}"
