"""Signed Agent Protocol messages against a real nats-server, agent-collab in-process (AP-11, PRO-4).

The test plays the external agent: it signs its requests with its Ed25519 key (the headers and signing
input of ``temporality_agent_collab.signing``) and checks that agent-collab accepts exactly the messages
that prove who sent them, refuses every other one with an explicit reason in the reply, journals the
refusal as ``agent.message_refused``, and that a refused message changes nothing.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from collab_replicas import StartCollab, collab_replicas
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from temporality_agent_collab.gate import NonceSeen, nonce_key
from temporality_agent_collab.registry import AgentRecord, agent_key
from temporality_agent_collab.signing import public_key_text, sign
from temporality_bus import Bus, NatsSettings
from temporality_protocol import AgentLifecycleChanged, AgentMessageRefused, AgentRegistered, Envelope
from temporality_protocol.catalog import (
    BUCKET_AGENT_NONCES,
    BUCKET_AGENTS,
    RPC_AGENTS_DEREGISTER,
    RPC_AGENTS_HEARTBEAT,
    RPC_AGENTS_LIST,
    RPC_AGENTS_REGISTER,
    agent_subject,
)
from temporality_testing.events import EventLog

WAIT_S = 8.0
REFUSED = AgentMessageRefused.EVENT_TYPE
CHANGED = AgentLifecycleChanged.EVENT_TYPE
KEY = Ed25519PrivateKey.generate()  # triage-bot's
OTHER_KEY = Ed25519PrivateKey.generate()  # scout-bot's (listed as PEM)


@pytest.fixture
async def start_agent_collab(nats_settings: NatsSettings) -> AsyncIterator[StartCollab]:
    async with collab_replicas(nats_settings) as start:
        yield start


@pytest.fixture
def allow_file(tmp_path: Path) -> Path:
    pem = OTHER_KEY.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
    indented = "\n".join(f"      {line}" for line in pem.strip().splitlines())
    path = tmp_path / "external-agents.yaml"
    path.write_text(
        f"""
heartbeat_interval_s: 30
agents:
  - id: triage-bot
    allowed_tools: [get_input]
    public_key: {public_key_text(KEY.public_key())}
  - id: scout-bot
    public_key: |
{indented}
  - id: keyless-bot                 # no key, not allow_unsigned: nothing it sends is accepted
""",
        encoding="utf-8",
    )
    return path


@pytest.fixture
async def collab(start_agent_collab: StartCollab, allow_file: Path) -> None:
    await start_agent_collab(allow_file)


def registration(agent_id: str = "triage-bot") -> dict[str, Any]:
    return {
        "agent_id": agent_id,
        "protocol_version": "1.0",
        "provider": "acme",
        "model": "acme-large",
        "supported_tools": ["get_input"],
        "max_context_size": 64000,
    }


def heartbeat(agent_id: str = "triage-bot", state: str = "idle") -> dict[str, Any]:
    return {
        "agent_id": agent_id,
        "timestamp": "2026-12-01T00:00:00Z",
        "current_state": state,
        "protocol_version": "1.0",
    }


def signed(
    subject: str,
    body: dict[str, Any],
    *,
    key: Ed25519PrivateKey = KEY,
    key_id: str = "triage-bot",
    timestamp: int | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a signed request on the key id's own subject, a fresh nonce and the current time
    (unless given)."""
    raw = json.dumps(body).encode()
    stamp = int(time.time()) if timestamp is None else timestamp
    return raw, sign(key, own(subject, key_id), key_id, raw, timestamp=stamp, nonce=secrets.token_urlsafe(16))


def own(subject: str, agent_id: str) -> str:
    """``agent_id``'s own subject of a per-agent pattern (a concrete subject is left as it is)."""
    return agent_subject(subject, agent_id) if ".*." in subject else subject


async def send(
    bus: Bus, subject: str, raw: bytes, headers: dict[str, str] | None, *, as_agent: str | None = None
) -> dict[str, Any]:
    """A request on the subject of ``as_agent`` (default: the key id, else the body's agent id, else triage-bot)."""
    sender = as_agent or (headers or {}).get("Temporality-Key-Id") or _body_agent(raw) or "triage-bot"
    reply: dict[str, Any] = json.loads(
        (await bus.nc.request(own(subject, sender), raw, timeout=10, headers=headers)).data
    )
    return reply


def _body_agent(raw: bytes) -> str | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    agent = body.get("agent_id") if isinstance(body, dict) else None
    return agent if isinstance(agent, str) and agent else None


async def call(bus: Bus, subject: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return await send(bus, subject, *signed(subject, body, **kw))


def refusal_reason(reply: dict[str, Any]) -> str:
    refusal = reply["refusal"]
    assert refusal is not None, reply
    reason: str = refusal["reason"]
    return reason


async def refused_event(log: EventLog, reason: str, count: int = 1) -> list[Envelope]:
    return await log.wait_for(REFUSED, where=lambda e: e.data["reason"] == reason, count=count, timeout_s=WAIT_S)


async def stored(bus: Bus, agent_id: str = "triage-bot") -> AgentRecord | None:
    found = await (await bus.store(BUCKET_AGENTS, AgentRecord)).get(agent_key(agent_id))
    return found.value if found is not None else None


# --------------------------------------------------------------------------- accepted
async def test_a_signed_agent_registers_heartbeats_lists_and_deregisters(
    bus: Bus, event_log: EventLog, collab: None
) -> None:
    reply = await call(bus, RPC_AGENTS_REGISTER, registration())
    assert (reply["outcome"], reply["policy"]["allowed_tools"]) == ("registered", ["get_input"])
    ack = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat(state="busy"))
    assert (ack["accepted"], ack["state"]) == (True, "busy")
    listing = await call(bus, RPC_AGENTS_LIST, {"protocol_versions": ["1.0"]})  # named by its key id
    assert [a["agent_id"] for a in listing["agents"]] == ["triage-bot"]
    assert "refusal" not in listing  # added to 1.0 after its first schema: left out when there is none
    # an agent whose key is listed as PEM
    scout = await call(bus, RPC_AGENTS_REGISTER, registration("scout-bot"), key=OTHER_KEY, key_id="scout-bot")
    assert scout["outcome"] == "registered"
    done = await call(bus, RPC_AGENTS_DEREGISTER, {"agent_id": "triage-bot", "protocol_version": "1.0"})
    assert (done["outcome"], done["state"]) == ("decommissioned", "decommissioned")

    await event_log.wait_for(CHANGED, where=lambda e: e.data["to_state"] == "decommissioned", timeout_s=WAIT_S)
    await event_log.wait_for(AgentRegistered.EVENT_TYPE, count=2, timeout_s=WAIT_S)
    await event_log.caught_up()
    assert event_log.of_type(REFUSED) == []
    moves = [
        (e.data["from_state"], e.data["to_state"]) for e in event_log.of_type(CHANGED) if e.subject == "triage-bot"
    ]
    assert moves == [("created", "registered"), ("registered", "busy"), ("busy", "decommissioned")]
    # every accepted message's nonce is remembered (shared by the replicas, expires with the bucket)
    nonces = await bus.store(BUCKET_AGENT_NONCES, NonceSeen)
    assert len([k for k in await nonces.keys() if k.startswith("nonce.triage-bot.")]) == 4


# --------------------------------------------------------------------------- refused, journaled, changes nothing
async def test_an_unsigned_message_is_refused_and_journaled(bus: Bus, event_log: EventLog, collab: None) -> None:
    reply = await send(bus, RPC_AGENTS_REGISTER, json.dumps(registration()).encode(), None)
    assert (reply["outcome"], refusal_reason(reply)) == ("refused", "unsigned")
    assert reply["agent_id"] == "triage-bot"
    assert "Temporality-Signature" in reply["refusal"]["detail"]
    (event,) = await refused_event(event_log, "unsigned")
    data = event.payload(AgentMessageRefused)
    assert (data.agent_id, data.subject, data.key_id, data.nonce) == (
        "triage-bot",
        own(RPC_AGENTS_REGISTER, "triage-bot"),
        None,
        None,
    )
    assert event.actor == "agent:triage-bot"
    assert await stored(bus) is None
    # an agent listed without a key and not allow_unsigned: refused just the same
    keyless = await send(bus, RPC_AGENTS_HEARTBEAT, json.dumps(heartbeat("keyless-bot")).encode(), None)
    assert (keyless["accepted"], refusal_reason(keyless)) == (False, "unsigned")
    # a listing names nobody unsigned
    listing = await send(bus, RPC_AGENTS_LIST, b"{}", None)
    assert (listing["agents"], refusal_reason(listing)) == ([], "unsigned")
    await refused_event(event_log, "unsigned", count=3)


async def test_the_same_refused_bytes_again_are_one_journaled_refusal(
    bus: Bus, event_log: EventLog, collab: None
) -> None:
    raw = json.dumps(heartbeat()).encode()
    for _ in range(3):
        reply = await send(bus, RPC_AGENTS_HEARTBEAT, raw, None)
        assert refusal_reason(reply) == "unsigned"  # every copy is refused ...
    changed = json.dumps(heartbeat(state="busy")).encode()
    assert refusal_reason(await send(bus, RPC_AGENTS_HEARTBEAT, changed, None)) == "unsigned"
    await refused_event(event_log, "unsigned", count=2)
    await event_log.caught_up()
    assert len(event_log.of_type(REFUSED)) == 2  # ... but journaled once per distinct message, not per copy


async def test_a_message_signed_with_the_wrong_key_is_refused_and_journaled(
    bus: Bus, event_log: EventLog, collab: None
) -> None:
    reply = await call(bus, RPC_AGENTS_REGISTER, registration(), key=Ed25519PrivateKey.generate())
    assert (reply["outcome"], refusal_reason(reply)) == ("refused", "bad_signature")
    (event,) = await refused_event(event_log, "bad_signature")
    data = event.payload(AgentMessageRefused)
    assert (data.agent_id, data.key_id) == ("triage-bot", "triage-bot")
    assert data.nonce is not None
    assert data.signed_at is not None
    assert await stored(bus) is None
    # another agent's valid key for triage-bot's body: a key mismatch, not a registration
    other = await call(bus, RPC_AGENTS_REGISTER, registration(), key=OTHER_KEY, key_id="scout-bot")
    assert refusal_reason(other) == "key_mismatch"
    await refused_event(event_log, "key_mismatch")
    assert await stored(bus) is None


async def test_a_message_on_another_agents_subject_is_refused_and_journaled(
    bus: Bus, event_log: EventLog, collab: None
) -> None:
    """AP-11: the agent id in the subject (whose NATS user may publish there) must be the signer's. scout-bot
    signing its own, valid heartbeat for triage-bot's subject is refused; so is triage-bot's signed message
    moved onto scout-bot's subject (the signature covers the subject)."""
    await call(bus, RPC_AGENTS_REGISTER, registration())
    await call(bus, RPC_AGENTS_REGISTER, registration("scout-bot"), key=OTHER_KEY, key_id="scout-bot")
    theirs = own(RPC_AGENTS_HEARTBEAT, "triage-bot")
    raw = json.dumps(heartbeat("scout-bot", state="busy")).encode()
    headers = sign(OTHER_KEY, theirs, "scout-bot", raw, timestamp=int(time.time()), nonce=secrets.token_urlsafe(16))
    reply = await send(bus, RPC_AGENTS_HEARTBEAT, raw, headers, as_agent="triage-bot")
    assert (reply["accepted"], refusal_reason(reply)) == (False, "subject_mismatch")
    (event,) = await refused_event(event_log, "subject_mismatch")
    data = event.payload(AgentMessageRefused)
    # journaled as triage-bot's subject's sender (NATS permissions), the id it claimed kept apart
    assert (data.agent_id, data.claimed_agent_id, data.key_id, data.subject) == (
        "triage-bot",
        "scout-bot",
        "scout-bot",
        theirs,
    )
    assert event.actor == "agent:triage-bot"
    record = await stored(bus)
    assert record is not None
    assert (record.state.value, record.beat) == ("registered", 1)  # triage-bot's record untouched
    # a body without agent_id (discovery) is named by its subject too
    listing = json.dumps({"protocol_versions": ["1.0"]}).encode()
    headers = sign(
        OTHER_KEY,
        theirs.replace("heartbeat", "list"),
        "scout-bot",
        listing,
        timestamp=int(time.time()),
        nonce=secrets.token_urlsafe(16),
    )
    assert (
        refusal_reason(await send(bus, RPC_AGENTS_LIST, listing, headers, as_agent="triage-bot")) == "subject_mismatch"
    )
    # triage-bot's own signed heartbeat, replayed onto scout-bot's subject: scout-bot's subject_mismatch
    raw, headers = signed(RPC_AGENTS_HEARTBEAT, heartbeat(state="busy"))
    moved = await send(bus, RPC_AGENTS_HEARTBEAT, raw, headers, as_agent="scout-bot")
    assert refusal_reason(moved) == "subject_mismatch"
    events = await refused_event(event_log, "subject_mismatch", count=3)
    assert sorted((e.data["agent_id"], e.data["claimed_agent_id"]) for e in events) == [
        ("scout-bot", "triage-bot"),
        ("triage-bot", "scout-bot"),
        ("triage-bot", "scout-bot"),
    ]
    # and on its own subject the same message is taken
    ok = await send(bus, RPC_AGENTS_HEARTBEAT, raw, headers)
    assert (ok["accepted"], ok["state"]) == (True, "busy")


async def test_a_tampered_body_is_refused_and_journaled(bus: Bus, event_log: EventLog, collab: None) -> None:
    await call(bus, RPC_AGENTS_REGISTER, registration())
    raw, headers = signed(RPC_AGENTS_HEARTBEAT, heartbeat(state="idle"))
    tampered = raw.replace(b'"idle"', b'"paused"')
    assert tampered != raw
    reply = await send(bus, RPC_AGENTS_HEARTBEAT, tampered, headers)
    assert (reply["accepted"], refusal_reason(reply)) == (False, "bad_signature")
    (event,) = await refused_event(event_log, "bad_signature")
    assert event.data["nonce"] == headers["Temporality-Nonce"]
    record = await stored(bus)
    assert record is not None
    assert (record.state.value, record.beat) == ("registered", 1)  # nothing of it was taken
    # the untampered original still goes through: a refused message does not use up its nonce
    ok = await send(bus, RPC_AGENTS_HEARTBEAT, raw, headers)
    assert (ok["accepted"], ok["state"]) == (True, "idle")


async def test_a_replayed_message_is_refused_and_journaled(
    bus: Bus, event_log: EventLog, start_agent_collab: StartCollab, allow_file: Path
) -> None:
    await start_agent_collab(allow_file)
    await start_agent_collab(allow_file)  # two replicas: the nonce is refused by whichever gets the replay
    await call(bus, RPC_AGENTS_REGISTER, registration())
    raw, headers = signed(RPC_AGENTS_HEARTBEAT, heartbeat(state="busy"))
    first = await send(bus, RPC_AGENTS_HEARTBEAT, raw, headers)
    assert first["accepted"] is True
    beat = (await stored(bus) or pytest.fail("not registered")).beat
    for _ in range(4):  # the queue group spreads these over both replicas
        replay = await send(bus, RPC_AGENTS_HEARTBEAT, raw, headers)
        assert (replay["accepted"], refusal_reason(replay)) == (False, "replayed_nonce")
    (event,) = await refused_event(event_log, "replayed_nonce")
    assert (event.data["agent_id"], event.data["nonce"]) == ("triage-bot", headers["Temporality-Nonce"])
    assert (await stored(bus) or pytest.fail("gone")).beat == beat  # counted once
    # the same body signed afresh (a new nonce) is a new message: accepted
    again = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat(state="busy"))
    assert again["accepted"] is True
    nonces = await bus.store(BUCKET_AGENT_NONCES, NonceSeen)
    seen = await nonces.get(nonce_key("triage-bot", headers["Temporality-Nonce"]))
    assert seen is not None
    assert seen.value.subject == own(RPC_AGENTS_HEARTBEAT, "triage-bot")


async def test_a_stale_timestamp_is_refused_and_journaled(bus: Bus, event_log: EventLog, collab: None) -> None:
    await call(bus, RPC_AGENTS_REGISTER, registration())
    now = int(time.time())
    old = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat(), timestamp=now - 600)
    ahead = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat(), timestamp=now + 600)
    assert (refusal_reason(old), refusal_reason(ahead)) == ("stale_timestamp", "stale_timestamp")
    assert "120 s" in old["refusal"]["detail"]
    events = await refused_event(event_log, "stale_timestamp", count=2)
    signed_at = sorted(datetime.fromisoformat(e.data["signed_at"]).timestamp() for e in events)
    assert signed_at == [now - 600, now + 600]
    record = await stored(bus)
    assert record is not None
    assert record.beat == 1


async def test_an_unknown_key_is_refused_and_journaled(bus: Bus, event_log: EventLog, collab: None) -> None:
    stranger = Ed25519PrivateKey.generate()
    reply = await call(bus, RPC_AGENTS_REGISTER, registration("mallory-bot"), key=stranger, key_id="mallory-bot")
    assert refusal_reason(reply) == "unknown_key"
    keyless = await call(bus, RPC_AGENTS_REGISTER, registration("keyless-bot"), key=stranger, key_id="keyless-bot")
    assert refusal_reason(keyless) == "unknown_key"
    events = await refused_event(event_log, "unknown_key", count=2)
    assert sorted(e.data["key_id"] for e in events) == ["keyless-bot", "mallory-bot"]
    assert await stored(bus, "mallory-bot") is None
    assert await stored(bus, "keyless-bot") is None
