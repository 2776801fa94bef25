"""An external agent cannot fill the journal: its requests are rate-limited, its own lifecycle moves and unchanged
re-registrations coalesced, refusals journaled up to a limit per window and then as one total -- against a real
nats-server and the real agent-collab in-process (on a real port, for ``/metrics``).

And the audit trail names the agent that sent a message: on triage-bot's subject (which NATS permissions let
only triage-bot's user send on) a body claiming to be another agent is triage-bot's ``subject_mismatch``.

The agents are ``allow_unsigned`` (signatures do not change any of this: the limits apply before the gate).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from temporality_agent_collab.__main__ import SPEC, configure
from temporality_agent_collab.registry import AgentRecord, agent_key
from temporality_agent_collab.settings import Settings
from temporality_bus import Bus, NatsSettings
from temporality_protocol import (
    AgentLifecycleChanged,
    AgentMessageRefused,
    AgentRegistered,
    AgentRegistrationRefused,
    Envelope,
)
from temporality_protocol.catalog import (
    BUCKET_AGENTS,
    RPC_AGENTS_HEARTBEAT,
    RPC_AGENTS_LIST,
    RPC_AGENTS_REGISTER,
    RPCS,
    agent_subject,
)
from temporality_service import Runtime, run_until
from temporality_testing.events import EventLog
from temporality_testing.waiting import eventually

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"
WAIT_S = 10.0
CHANGED = AgentLifecycleChanged.EVENT_TYPE
REGISTERED = AgentRegistered.EVENT_TYPE
REG_REFUSED = AgentRegistrationRefused.EVENT_TYPE
MSG_REFUSED = AgentMessageRefused.EVENT_TYPE

ALLOW_LIST = """
heartbeat_interval_s: 1
agents:
  - id: triage-bot
    protocol_versions: ["1.0"]
    allowed_tools: [get_input]
    allow_unsigned: true
  - id: calm-bot
    protocol_versions: ["1.0"]
    allow_unsigned: true
"""

Start = Callable[..., Awaitable[str]]


@pytest.fixture
async def start_collab(nats_settings: NatsSettings, tmp_path: Path) -> AsyncIterator[Start]:
    """``await start(**settings)``: agent-collab with the allow-list above and those settings; returns its URL."""
    allow = tmp_path / "external-agents.yaml"
    allow.write_text(ALLOW_LIST, encoding="utf-8")
    running: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    async def start(**overrides: Any) -> str:
        settings = Settings(nats=nats_settings, external_agents_file=allow, heartbeat_grace_s=5, port=0, **overrides)
        setup = configure(settings)
        runtimes: list[Runtime[Settings]] = []

        async def capture(rt: Runtime[Settings]) -> None:
            await setup(rt)
            runtimes.append(rt)

        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(run_until(SPEC, settings, capture, stop, ready=ready))
        running.append((stop, task))
        waiter = asyncio.ensure_future(ready.wait())
        done, _ = await asyncio.wait({waiter, task}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task in done:
            task.result()
        assert ready.is_set(), "agent-collab not ready within 30 s"
        server = runtimes[0].server
        assert server is not None
        return server.url

    try:
        yield start
    finally:
        for stop, _ in running:
            stop.set()
        for _, task in running:
            await asyncio.wait_for(task, 30)


def reply_schema(name: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads((SCHEMAS / f"rpc/{name}.reply.schema.json").read_text(encoding="utf-8")))


async def call(bus: Bus, subject: str, body: dict[str, Any], *, on: str = "triage-bot") -> dict[str, Any]:
    """One request on agent ``on``'s own subject; the reply is checked against the published schema."""
    raw = json.dumps(body).encode()
    reply: dict[str, Any] = json.loads((await bus.nc.request(agent_subject(subject, on), raw, timeout=10)).data)
    reply_schema(RPCS[subject].name).validate(reply)
    return reply


def registration(agent_id: str = "triage-bot", **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent_id": agent_id,
        "protocol_version": "1.0",
        "provider": "acme",
        "model": "acme-large",
        "capabilities": ["triage"],
        "supported_tools": ["get_input"],
        "max_context_size": 64000,
    }
    return body | changes


def heartbeat(state: str, agent_id: str = "triage-bot") -> dict[str, Any]:
    return {
        "agent_id": agent_id,
        "timestamp": datetime.now(UTC).isoformat(),
        "current_state": state,
        "protocol_version": "1.0",
    }


def refusal_of(reply: dict[str, Any]) -> str | None:
    refusal = reply.get("refusal")
    return refusal["reason"] if refusal else None


async def record(bus: Bus, agent_id: str = "triage-bot") -> AgentRecord:
    found = await (await bus.store(BUCKET_AGENTS, AgentRecord)).get(agent_key(agent_id))
    assert found is not None
    return found.value


def of_agent(log: EventLog, event_type: str, agent_id: str = "triage-bot") -> list[Envelope]:
    return [e for e in log.of_type(event_type) if e.data.get("agent_id") == agent_id]


async def totals(log: EventLog, event_type: str, reason: str, agent_id: str, expected: int) -> list[Envelope]:
    """The events of ``agent_id``'s ``reason`` refusals once their ``count`` s add up to ``expected`` (the window's
    total comes when it ends)."""

    async def probe() -> list[Envelope] | None:
        events = [e for e in of_agent(log, event_type, agent_id) if e.data["reason"] == reason]
        return events if sum(e.data.get("count", 1) for e in events) >= expected else None

    events = await eventually(probe, timeout_s=WAIT_S, what=f"{expected} {reason} refusals of {agent_id} journaled")
    assert sum(e.data["count"] for e in events) == expected  # every refusal counted once, none twice
    return events


async def metric(url: str, name: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


# --------------------------------------------------------------------------- requests over the rate limit
async def test_a_heartbeat_flood_is_rate_limited_and_the_journal_stays_bounded(
    bus: Bus, event_log: EventLog, start_collab: Start
) -> None:
    url = await start_collab(agent_rate_per_s=20, agent_rate_burst=30, audit_window_s=2, lifecycle_coalesce_s=60)
    assert (await call(bus, RPC_AGENTS_REGISTER, registration()))["outcome"] == "registered"
    await call(bus, RPC_AGENTS_REGISTER, registration("calm-bot"), on="calm-bot")

    began = time.monotonic()
    replies = [await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat("idle" if i % 2 else "busy")) for i in range(400)]
    took = time.monotonic() - began
    accepted = [r for r in replies if r["accepted"]]
    limited = [r for r in replies if refusal_of(r) == "rate_limited"]
    assert len(accepted) + len(limited) == 400
    assert 30 <= len(accepted) <= 30 + 20 * took + 1, took  # the burst, then 20 a second
    assert limited, took
    assert all(0 < r["refusal"]["retry_after_s"] <= 0.05 for r in limited)  # one token: 1/20 s at most
    assert all("rate limit" in r["refusal"]["detail"] for r in limited)
    # another agent is not held back by triage-bot's flood
    calm = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat("idle", "calm-bot"), on="calm-bot")
    assert calm["accepted"], calm

    # the registry is exact: every accepted heartbeat counted, the state the last one reported
    last = max(i for i, r in enumerate(replies) if r["accepted"])
    stored = await record(bus)
    assert stored.beat == 1 + len(accepted)
    assert stored.state.value == ("idle" if last % 2 else "busy")

    # the journal: its registration and first move; every other flip coalesced (one per 60 s window)
    await event_log.wait_for(CHANGED, where=lambda e: e.data["agent_id"] == "calm-bot", timeout_s=WAIT_S)
    await event_log.caught_up()
    assert [(e.data["from_state"], e.data["reason"]) for e in of_agent(event_log, CHANGED)] == [
        ("created", "registered"),
        ("registered", "heartbeat"),
    ]
    # the refused requests: one event at once, one total at the end of each 2 s window -- all counted, not each
    events = await totals(event_log, MSG_REFUSED, "rate_limited", "triage-bot", len(limited))
    assert len(events) <= 2 * (math.ceil(took / 2) + 1), took  # the first and a total per 2 s window it spanned
    assert all(e.actor == "agent:triage-bot" for e in events)
    assert await metric(url, "temporality_collab_agent_requests_limited_total") == len(limited)

    # once a token is back, the agent is served as before
    async def served() -> dict[str, Any] | None:
        ack = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat("busy"))
        return ack if ack["accepted"] else None

    ack = await eventually(served, timeout_s=WAIT_S, what="a heartbeat accepted after the flood")
    assert ack["state"] == "busy"


async def test_flips_and_model_only_re_registrations_are_coalesced_then_the_latest_is_journaled(
    bus: Bus, event_log: EventLog, start_collab: Start
) -> None:
    await start_collab(agent_rate_per_s=0, lifecycle_coalesce_s=2)  # no request limit: coalescing alone
    await call(bus, RPC_AGENTS_REGISTER, registration())
    began = time.monotonic()
    for i in range(100):
        assert (await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat("busy" if i % 2 else "idle")))["accepted"]
    for i in range(60):  # the same agent, another model each time (from a working state: a move each, too)
        reply = await call(bus, RPC_AGENTS_REGISTER, registration(model=f"acme-{i}"))
        assert reply["outcome"] == "registered"
        assert (await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat("busy")))["accepted"]
    windows = math.ceil((time.monotonic() - began) / 2)  # the flood's 2 s windows: at most one event each
    stored = await record(bus)
    assert (stored.registration, stored.declaration.model, stored.state.value) == (61, "acme-59", "busy")
    listed = await call(bus, RPC_AGENTS_LIST, {})  # the live card is exact
    (card,) = [a for a in listed["agents"] if a["agent_id"] == "triage-bot"]
    assert (card["model"], card["state"]) == ("acme-59", "busy")

    # heartbeating on (the agent's own period): once the 2 s window passed, the latest is journaled, once
    async def journaled() -> bool | None:
        await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat("busy"))
        models = [e.data["model"] for e in of_agent(event_log, REGISTERED)]
        return True if "acme-59" in models else None

    await eventually(journaled, timeout_s=WAIT_S, interval_s=0.3, what="the standing registration journaled")
    await event_log.caught_up()
    registered = of_agent(event_log, REGISTERED)
    # the first, at most one per 2 s the flood spanned (+1), the standing one after it: not 61
    assert len(registered) <= 3 + windows, windows
    assert registered[0].data["model"] == "acme-large"
    moves = of_agent(event_log, CHANGED)
    # registered, at most one of its own moves per 2 s (+1), the latest after it: not 220
    assert len(moves) <= 3 + windows, [(m.data["from_state"], m.data["to_state"], m.data["detail"]) for m in moves]
    assert moves[-1].data["to_state"] in ("busy", "registered")
    seqs = [m.data["seq"] for m in moves]
    assert seqs == sorted(seqs)  # in order, with gaps where moves were coalesced

    # a re-registration that changes what it declares is journaled at once, whatever the window
    changed = await call(bus, RPC_AGENTS_REGISTER, registration(model="acme-59", capabilities=["triage", "echo"]))
    assert changed["outcome"] == "registered"
    await event_log.wait_for(REGISTERED, where=lambda e: e.data["capabilities"] == ["triage", "echo"], timeout_s=WAIT_S)


# --------------------------------------------------------------------------- refusals: journaled up to a limit
async def test_refused_registrations_and_messages_are_journaled_up_to_a_limit_then_as_a_total(
    bus: Bus, event_log: EventLog, start_collab: Start
) -> None:
    await start_collab(agent_rate_per_s=0, audit_window_s=2, refusals_journaled=3)
    began = time.monotonic()
    # an agent not on the allow-list, on its own subject: unknown_agent every time
    for i in range(50):
        reply = await call(bus, RPC_AGENTS_REGISTER, registration("mallory-bot", model=f"m-{i}"), on="mallory-bot")
        assert refusal_of(reply) == "unknown_agent"
    # triage-bot's subject, bodies claiming to be 50 other agents: triage-bot's subject_mismatch every time
    for i in range(50):
        reply = await call(bus, RPC_AGENTS_REGISTER, registration(f"claimed-{i}"))
        assert refusal_of(reply) == "subject_mismatch"

    windows = math.ceil((time.monotonic() - began) / 2) + 1  # the 2 s windows the floods spanned
    unknown = await totals(event_log, REG_REFUSED, "unknown_agent", "mallory-bot", 50)
    assert [e.data["count"] for e in unknown[:3]] == [1, 1, 1]  # the first three one by one, as before
    assert len(unknown) <= 4 * windows, windows  # then a total per window: bounded whatever the flood
    assert any(e.data["count"] > 1 and e.data["window_s"] == 2 for e in unknown)
    mismatched = await totals(event_log, MSG_REFUSED, "subject_mismatch", "triage-bot", 50)
    assert len(mismatched) <= 4 * windows, windows
    assert [e.data["claimed_agent_id"] for e in mismatched[:3]] == ["claimed-0", "claimed-1", "claimed-2"]
    assert all(e.actor == "agent:triage-bot" for e in mismatched)
    # nothing was journaled in the names the bodies claimed
    await event_log.caught_up()
    assert not [e for e in event_log.events if str(e.actor).startswith("agent:claimed-")]


# --------------------------------------------------------------------------- the audit trail names the sender
async def test_a_body_claiming_another_agent_on_an_agents_subject_is_that_agents_subject_mismatch(
    bus: Bus, event_log: EventLog, start_collab: Start
) -> None:
    await start_collab()
    reply = await call(bus, RPC_AGENTS_REGISTER, registration("reviewer"))  # on triage-bot's subject
    assert (reply["outcome"], refusal_of(reply), reply["agent_id"]) == ("refused", "subject_mismatch", "triage-bot")
    assert "retry_after_s" not in reply["refusal"]  # added to 1.0 for rate_limited: left out of other refusals
    (event,) = await event_log.wait_for(MSG_REFUSED, timeout_s=WAIT_S)
    data = event.payload(AgentMessageRefused)
    assert (data.agent_id, data.claimed_agent_id, data.reason, data.subject) == (
        "triage-bot",
        "reviewer",
        "subject_mismatch",
        agent_subject(RPC_AGENTS_REGISTER, "triage-bot"),
    )
    assert event.actor == "agent:triage-bot"
    assert "'reviewer'" in data.detail
    await event_log.caught_up()
    assert event_log.of_type(REG_REFUSED) == []  # not "reviewer's unknown_agent registration"
    assert not [e for e in event_log.events if e.actor == "agent:reviewer"]
    # triage-bot itself, as itself, is served as before
    assert (await call(bus, RPC_AGENTS_REGISTER, registration()))["outcome"] == "registered"
