"""The Agent Protocol for external agents against a real nats-server, agent-collab in-process (AP-2..AP-4,
PRO-2, PRO-3).

The test plays the external agent: it sends the JSON bodies the published schemas describe on the
``temporality.rpc.agents.*`` subjects and waits on what agent-collab journals. The agents here are
``allow_unsigned`` (signatures: ``test_collab_signed_messages.py``). Heartbeat interval 1 s,
grace 0, so an agent goes offline within about two seconds of its last heartbeat (timers have whole
seconds).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from collab_replicas import StartCollab, collab_replicas
from jsonschema import Draft202012Validator

from temporality_agent_collab.registry import AgentRecord, agent_key
from temporality_bus import Bus, NatsSettings
from temporality_protocol import AgentLifecycleChanged, AgentRegistered, AgentRegistrationRefused, Envelope
from temporality_protocol.catalog import (
    BUCKET_AGENTS,
    CONSUMERS,
    RPC_AGENTS_DEREGISTER,
    RPC_AGENTS_HEARTBEAT,
    RPC_AGENTS_LIST,
    RPC_AGENTS_REGISTER,
    RPCS,
    TIMER_FIRED_PREFIX,
    TIMER_NS_AGENT_HEARTBEAT,
    agent_subject,
)
from temporality_protocol.states import AgentLifecycleState
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays


@pytest.fixture
async def start_agent_collab(nats_settings: NatsSettings) -> AsyncIterator[StartCollab]:
    async with collab_replicas(nats_settings) as start:
        yield start


SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"
WAIT_S = 8.0
REGISTERED = AgentRegistered.EVENT_TYPE
REFUSED = AgentRegistrationRefused.EVENT_TYPE
CHANGED = AgentLifecycleChanged.EVENT_TYPE

ALLOW_LIST = """
heartbeat_interval_s: 1
agents:
  - id: triage-bot
    protocol_versions: ["1.0"]
    allowed_tools: [get_input, notify]
    limits: {max_context_size: 32000, max_concurrent_tasks: 2}
    allow_unsigned: true
  - id: old-bot
    protocol_versions: ["1.0"]
    allow_unsigned: true
"""
#: An unsigned request names its sender in this header when its body has no ``agent_id`` (the listing).
AS_TRIAGE_BOT = {"Temporality-Key-Id": "triage-bot"}


def registration(agent_id: str = "triage-bot", **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent_id": agent_id,
        "protocol_version": "1.0",
        "protocol_versions": ["2.3", "banana"],  # a newer one we do not speak, one we cannot even read
        "provider": "acme",
        "model": "acme-large",
        "capabilities": ["triage", "summarise"],
        "supported_tools": ["get_input", "shell"],
        "max_context_size": 128000,
    }
    body.update(changes)
    return body


def heartbeat(agent_id: str = "triage-bot", state: str = "idle", **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent_id": agent_id,
        "timestamp": datetime.now(UTC).isoformat(),
        "current_state": state,
        "active_run_id": None,
        "resource_usage": {"cpu": 0.25},
        "protocol_version": "1.0",
    }
    body.update(changes)
    return body


def _body_agent(raw: bytes) -> str | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    agent = body.get("agent_id") if isinstance(body, dict) else None
    return agent if isinstance(agent, str) and agent else None


def reply_schema(name: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads((SCHEMAS / f"rpc/{name}.reply.schema.json").read_text(encoding="utf-8")))


async def call(
    bus: Bus, subject: str, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """One request as an external agent makes it; the reply is checked against the published schema."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    sender = (headers or {}).get("Temporality-Key-Id") or _body_agent(raw) or "triage-bot"
    mine = agent_subject(subject, sender)  # each agent sends on its own subjects
    reply: dict[str, Any] = json.loads((await bus.nc.request(mine, raw, timeout=10, headers=headers)).data)
    reply_schema(RPCS[subject].name).validate(reply)
    return reply


def moves(log: EventLog, agent_id: str = "triage-bot") -> list[tuple[str, str, str]]:
    return [
        (e.data["from_state"], e.data["to_state"], e.data["reason"])
        for e in sorted(log.of_type(CHANGED), key=lambda e: (e.data["incarnation"], e.data["seq"]))
        if e.data["agent_id"] == agent_id
    ]


async def wait_move(log: EventLog, to_state: str, *, count: int = 1, agent_id: str = "triage-bot") -> list[Envelope]:
    return await log.wait_for(
        CHANGED,
        where=lambda e: e.data["agent_id"] == agent_id and e.data["to_state"] == to_state,
        count=count,
        timeout_s=WAIT_S,
    )


async def record(bus: Bus, agent_id: str = "triage-bot") -> AgentRecord:
    found = await (await bus.store(BUCKET_AGENTS, AgentRecord)).get(agent_key(agent_id))
    assert found is not None
    return found.value


async def settled(bus: Bus, durable: str) -> None:
    """The consumer has handled everything on its stream (nothing pending, nothing in flight)."""
    spec = CONSUMERS[durable]
    async with asyncio.timeout(WAIT_S):
        while True:
            info = await bus.js.consumer_info(spec.stream, durable)
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return
            await asyncio.sleep(0.05)


@pytest.fixture
def allow_file(tmp_path: Path) -> Path:
    path = tmp_path / "external-agents.yaml"
    path.write_text(ALLOW_LIST, encoding="utf-8")
    return path


@pytest.fixture
async def collab(start_agent_collab: StartCollab, allow_file: Path) -> Callable[[], Awaitable[None]]:
    """One agent-collab with the allow-list above."""
    return await start_agent_collab(allow_file)


# --------------------------------------------------------------------------- registration (AP-3, PRO-3)
async def test_register_negotiates_the_version_and_returns_the_policy(
    bus: Bus, event_log: EventLog, collab: object
) -> None:
    body = registration(a_field_from_version_2={"nested": True}, another=1)  # unknown fields: ignored (PRO-3)
    reply = await call(bus, RPC_AGENTS_REGISTER, body)
    assert reply["outcome"] == "registered"
    assert reply["refusal"] is None
    assert reply["protocol_version"] == "1.0"  # the highest common one: 2.3 is not allowed, banana unreadable
    assert (reply["state"], reply["incarnation"]) == ("registered", 1)
    assert (reply["heartbeat_interval_s"], reply["offline_after_s"]) == (1.0, 1.0)
    # of the tools it supports, those the allow-list grants; the smaller context
    assert reply["policy"] == {
        "allowed_tools": ["get_input"],
        "limits": {"max_context_size": 32000, "max_concurrent_tasks": 2},
    }
    # journaled (before the reply): the registration and its lifecycle move
    (event,) = await event_log.wait_for(REGISTERED, timeout_s=WAIT_S)
    data = event.payload(AgentRegistered)
    assert (data.agent_id, data.protocol_version, data.allowed_tools, data.capabilities) == (
        "triage-bot",
        "1.0",
        ["get_input"],
        ["triage", "summarise"],
    )
    assert event.source == "/temporality/agent-collab"
    await wait_move(event_log, "registered")
    assert moves(event_log) == [("created", "registered", "registered")]
    assert (await record(bus)).state is AgentLifecycleState.REGISTERED

    # the same registration again (a retry): the same answer, no new fact
    again = await call(bus, RPC_AGENTS_REGISTER, body)
    assert again == reply
    await event_log.caught_up()
    assert len(event_log.of_type(REGISTERED)) == 1
    assert moves(event_log) == [("created", "registered", "registered")]


async def test_an_unknown_agent_is_refused_and_the_refusal_journaled(
    bus: Bus, event_log: EventLog, collab: object
) -> None:
    reply = await call(bus, RPC_AGENTS_REGISTER, registration("mallory-bot"))
    assert (reply["outcome"], reply["refusal"]["reason"]) == ("refused", "unknown_agent")
    assert reply["policy"] is None
    assert reply["supported_versions"] == []  # nothing about the allow-list leaks
    (event,) = await event_log.wait_for(REFUSED, timeout_s=WAIT_S)
    data = event.payload(AgentRegistrationRefused)
    assert (data.agent_id, data.reason, data.provider) == ("mallory-bot", "unknown_agent", "acme")
    await event_log.caught_up()
    assert event_log.of_type(REGISTERED) == []
    assert event_log.of_type(CHANGED) == []
    assert await (await bus.store(BUCKET_AGENTS, AgentRecord)).get(agent_key("mallory-bot")) is None


async def test_no_common_version_is_refused_explicitly_and_journaled(
    bus: Bus, event_log: EventLog, collab: object
) -> None:
    reply = await call(
        bus, RPC_AGENTS_REGISTER, registration("old-bot", protocol_version="9.0", protocol_versions=["0.1", "x"])
    )
    assert (reply["outcome"], reply["refusal"]["reason"]) == ("refused", "no_common_version")
    assert reply["supported_versions"] == ["1.0"]
    assert "1.0" in reply["refusal"]["detail"]
    (event,) = await event_log.wait_for(REFUSED, timeout_s=WAIT_S)
    data = event.payload(AgentRegistrationRefused)
    assert (data.reason, data.declared_versions, data.supported_versions) == (
        "no_common_version",
        ["9.0", "0.1", "x"],
        ["1.0"],
    )
    await event_log.caught_up()
    assert event_log.of_type(REGISTERED) == []


async def test_a_malformed_request_gets_a_refusal_naming_the_field(
    bus: Bus, event_log: EventLog, collab: object
) -> None:
    body = registration()
    del body["max_context_size"]
    reply = await call(bus, RPC_AGENTS_REGISTER, body)
    assert (reply["agent_id"], reply["outcome"], reply["refusal"]["reason"]) == (
        "triage-bot",
        "refused",
        "malformed_request",
    )
    assert "max_context_size" in reply["refusal"]["detail"]
    not_json = await call(bus, RPC_AGENTS_HEARTBEAT, b"{not json", AS_TRIAGE_BOT)
    assert (not_json["accepted"], not_json["refusal"]["reason"]) == (False, "malformed_request")
    bad_state = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat(state="dancing"))
    assert "current_state" in bad_state["refusal"]["detail"]
    listing = await call(bus, RPC_AGENTS_LIST, {"protocol_versions": ["7.0"]}, AS_TRIAGE_BOT)
    assert listing["agents"] == []
    assert "no common protocol version" in listing["error"]


# --------------------------------------------------------------------------- heartbeat and lifecycle (AP-2, AP-4)
async def test_heartbeats_keep_it_online(bus: Bus, event_log: EventLog, collab: object) -> None:
    await call(bus, RPC_AGENTS_REGISTER, registration())
    ack = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat(state="busy", active_run_id="run-7"))
    assert (ack["accepted"], ack["state"], ack["protocol_version"]) == (True, "busy", "1.0")
    await wait_move(event_log, "busy")

    async def beat() -> None:
        while True:
            await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat(state="busy", active_run_id="run-7"))
            await asyncio.sleep(0.3)  # the agent's own heartbeat period, not a wait for a condition

    beating = asyncio.create_task(beat())
    try:
        await stays(
            lambda: not [e for e in event_log.of_type(CHANGED) if e.data["to_state"] == "offline"],
            settle_s=2.5,
            what="no offline move while heartbeats come",
        )
    finally:
        beating.cancel()
    assert moves(event_log) == [("created", "registered", "registered"), ("registered", "busy", "heartbeat")]
    stored = await record(bus)
    assert (stored.state, stored.active_run_id, stored.resource_usage) == (
        AgentLifecycleState.BUSY,
        "run-7",
        {"cpu": 0.25},
    )


async def test_no_heartbeat_within_the_interval_is_offline_and_a_heartbeat_brings_it_back(
    bus: Bus, event_log: EventLog, collab: object
) -> None:
    await call(bus, RPC_AGENTS_REGISTER, registration())
    await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat(state="idle"))
    (offline,) = await wait_move(event_log, "offline")  # a durable timer, not a sleeping task
    assert offline.data["reason"] == "heartbeat_missed"
    assert (await record(bus)).state is AgentLifecycleState.OFFLINE

    ack = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat(state="idle"))
    assert (ack["accepted"], ack["state"]) == (True, "idle")
    await wait_move(event_log, "idle", count=2)
    assert moves(event_log) == [
        ("created", "registered", "registered"),
        ("registered", "idle", "heartbeat"),
        ("idle", "offline", "heartbeat_missed"),
        ("offline", "resuming", "came_back"),
        ("resuming", "idle", "heartbeat"),
    ]
    seqs = [e.data["seq"] for e in event_log.of_type(CHANGED)]
    assert sorted(seqs) == [1, 2, 3, 4, 5]


async def test_a_repeated_or_stale_timer_firing_changes_nothing(bus: Bus, event_log: EventLog, collab: object) -> None:
    await call(bus, RPC_AGENTS_REGISTER, registration())
    await wait_move(event_log, "offline")  # registered, never heartbeated
    stored = await record(bus)
    fired = f"{TIMER_FIRED_PREFIX}.{TIMER_NS_AGENT_HEARTBEAT}.triage-bot"
    firing = {"agent_id": "triage-bot", "incarnation": stored.incarnation, "beat": stored.beat}
    # the very firing again (a redelivery) and a stale one (an older heartbeat's): journaled once
    await bus.publish_raw(fired, json.dumps(firing).encode(), {})
    await bus.publish_raw(fired, json.dumps({**firing, "beat": stored.beat - 1}).encode(), {})
    ack = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat(state="busy"))
    assert ack["state"] == "busy"
    # the old firing again, now that the agent is back: still nothing
    await bus.publish_raw(fired, json.dumps(firing).encode(), {})

    await settled(bus, "agent-collab-heartbeats")
    await event_log.caught_up()
    assert moves(event_log) == [
        ("created", "registered", "registered"),
        ("registered", "offline", "heartbeat_missed"),
        ("offline", "resuming", "came_back"),
        ("resuming", "busy", "heartbeat"),
    ]
    assert (await record(bus)).state is AgentLifecycleState.BUSY


async def test_heartbeats_that_cannot_be_taken_are_refused(bus: Bus, collab: object) -> None:
    unknown = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat("nobody"))  # not on the allow-list
    assert (unknown["accepted"], unknown["refusal"]["reason"]) == (False, "unknown_agent")
    unregistered = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat("old-bot"))
    assert (unregistered["accepted"], unregistered["refusal"]["reason"]) == (False, "not_registered")
    await call(bus, RPC_AGENTS_REGISTER, registration())
    other = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat(protocol_version="2.3"))
    assert (other["accepted"], other["refusal"]["reason"]) == (False, "version_mismatch")
    assert (await record(bus)).state is AgentLifecycleState.REGISTERED


async def test_deregister_decommissions_and_a_new_registration_is_a_new_incarnation(
    bus: Bus, event_log: EventLog, collab: object
) -> None:
    await call(bus, RPC_AGENTS_REGISTER, registration())
    await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat(state="idle"))
    reply = await call(bus, RPC_AGENTS_DEREGISTER, {"agent_id": "triage-bot", "protocol_version": "1.0", "x": 1})
    assert (reply["outcome"], reply["state"]) == ("decommissioned", "decommissioned")
    again = await call(bus, RPC_AGENTS_DEREGISTER, {"agent_id": "triage-bot", "protocol_version": "1.0"})
    assert again == reply  # idempotent
    late = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat())
    assert late["refusal"]["reason"] == "not_registered"
    listed = await call(bus, RPC_AGENTS_LIST, {}, AS_TRIAGE_BOT)
    assert listed["agents"] == []
    # back with a new incarnation
    back = await call(bus, RPC_AGENTS_REGISTER, registration())
    assert (back["outcome"], back["incarnation"]) == ("registered", 2)
    await event_log.wait_for(REGISTERED, count=2, timeout_s=WAIT_S)
    await event_log.caught_up()
    assert [e.data["to_state"] for e in event_log.of_type(CHANGED) if e.data["incarnation"] == 1] == [
        "registered",
        "idle",
        "decommissioned",
    ]


# --------------------------------------------------------------------------- discovery (PRO-2)
async def test_list_shows_the_cards_with_unverified_capabilities(bus: Bus, collab: object) -> None:
    await call(bus, RPC_AGENTS_REGISTER, registration())
    await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat(state="busy", active_run_id="run-1"))
    reply = await call(bus, RPC_AGENTS_LIST, {"protocol_versions": ["1.0"], "unknown": "ignored"}, AS_TRIAGE_BOT)
    assert reply["protocol_version"] == "1.0"
    (agent,) = reply["agents"]
    assert (agent["agent_id"], agent["kind"], agent["state"], agent["active_run_id"]) == (
        "triage-bot",
        "external",
        "busy",
        "run-1",
    )
    # neither capability has a probe the protocol could run: declared, never verified (PRO-2)
    assert [(c["name"], c["verified"], c["status"], c["round"]) for c in agent["capabilities"]] == [
        ("triage", False, "no_probe", None),
        ("summarise", False, "no_probe", None),
    ]
    assert (agent["allowed_tools"], agent["max_context_size"]) == (["get_input"], 32000)


# --------------------------------------------------------------------------- replicas
async def test_two_replicas_share_the_requests_and_the_timers(
    bus: Bus, event_log: EventLog, start_agent_collab: StartCollab, allow_file: Path
) -> None:
    await start_agent_collab(allow_file)
    stop_second = await start_agent_collab(allow_file)
    await call(bus, RPC_AGENTS_REGISTER, registration())
    # concurrent heartbeats land on both replicas: every one counted once (compare-and-set)
    acks = await asyncio.gather(*(call(bus, RPC_AGENTS_HEARTBEAT, heartbeat(state="busy")) for _ in range(12)))
    assert all(a["accepted"] for a in acks)
    stored = await record(bus)
    assert stored.beat == 13  # the registration and twelve heartbeats
    await stop_second()
    # the firing is handled by the replica left, once
    await wait_move(event_log, "offline")
    await event_log.caught_up()
    assert moves(event_log) == [
        ("created", "registered", "registered"),
        ("registered", "busy", "heartbeat"),
        ("busy", "offline", "heartbeat_missed"),
    ]
