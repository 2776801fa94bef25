"""Capability discovery and the conformance exchange (PRO-2) against a real nats-server, agent-collab in-process.

The test plays external agents: a conforming one answers its round's probes correctly, others answer
wrongly or not at all. A declared capability is verified only by a correct answer before the deadline
(a durable timer ends an unanswered round); every ended round is journaled as
``agent.conformance_checked``. The hosted agents' cards come from ``run.started`` events published here
as the run-executor would.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from collab_replicas import StartCollab, collab_replicas
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jsonschema import Draft202012Validator

from temporality_agent_collab.registry import AgentRecord, agent_key
from temporality_agent_collab.signing import public_key_text, sign
from temporality_bus import Bus, NatsSettings
from temporality_protocol import AgentConformanceChecked, AgentMessageRefused, AgentSummary, RunStarted, make_event
from temporality_protocol.catalog import (
    BUCKET_AGENTS,
    CONSUMERS,
    RPC_AGENTS_CONFORMANCE,
    RPC_AGENTS_HEARTBEAT,
    RPC_AGENTS_LIST,
    RPC_AGENTS_REGISTER,
    RPCS,
    agent_subject,
)
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"
WAIT_S = 10.0
CHECKED = AgentConformanceChecked.EVENT_TYPE
KEY = Ed25519PrivateKey.generate()  # signed-bot's
ALLOW_LIST = f"""
heartbeat_interval_s: 30
agents:
  - id: good-bot
    allow_unsigned: true
  - id: wrong-bot
    allow_unsigned: true
  - id: silent-bot
    allow_unsigned: true
  - id: signed-bot
    public_key: {public_key_text(KEY.public_key())}
"""
AS_GOOD_BOT = {"Temporality-Key-Id": "good-bot"}


@pytest.fixture
async def start_agent_collab(nats_settings: NatsSettings) -> AsyncIterator[StartCollab]:
    async with collab_replicas(nats_settings) as start:
        yield start


@pytest.fixture
async def collab(start_agent_collab: StartCollab, tmp_path: Path) -> object:
    path = tmp_path / "external-agents.yaml"
    path.write_text(ALLOW_LIST, encoding="utf-8")
    return await start_agent_collab(path, conformance_timeout_s=1.0)


def registration(agent_id: str, capabilities: list[str]) -> dict[str, Any]:
    return {
        "agent_id": agent_id,
        "protocol_version": "1.0",
        "provider": "acme",
        "model": "acme-small",
        "capabilities": capabilities,
        "supported_tools": [],
        "max_context_size": 8000,
    }


async def call(
    bus: Bus, subject: str, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """One request as an external agent makes it; the reply is checked against the published schema."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    name = RPCS[subject].name
    sender = (headers or {}).get("Temporality-Key-Id") or json.loads(raw).get("agent_id") or "good-bot"
    mine = agent_subject(subject, sender)  # each agent sends on its own subjects
    reply: dict[str, Any] = json.loads((await bus.nc.request(mine, raw, timeout=10, headers=headers)).data)
    schema = json.loads((SCHEMAS / f"rpc/{name}.reply.schema.json").read_text(encoding="utf-8"))
    Draft202012Validator(schema).validate(reply)
    return reply


def answers(agent_id: str, round_: dict[str, Any], answer: dict[str, str]) -> dict[str, Any]:
    """The answers to a round: ``answer`` maps a capability to what is said for its probe."""
    return {
        "agent_id": agent_id,
        "protocol_version": "1.0",
        "round": round_["round"],
        "answers": [
            {"probe_id": p["probe_id"], "answer": answer[p["capability"]]}
            for p in round_["probes"]
            if p["capability"] in answer
        ],
    }


def correct(round_: dict[str, Any]) -> dict[str, str]:
    return {
        p["capability"]: p["challenge"] if p["capability"] == "echo" else p["challenge"][::-1] for p in round_["probes"]
    }


async def cards(bus: Bus, **query: Any) -> dict[str, dict[str, Any]]:
    reply = await call(bus, RPC_AGENTS_LIST, {"protocol_versions": ["1.0"], **query}, AS_GOOD_BOT)
    assert reply["error"] is None
    return {c["agent_id"]: c for c in reply["agents"]}


def capabilities(card: dict[str, Any]) -> dict[str, tuple[bool, str, str | None]]:
    return {c["name"]: (c["verified"], c["status"], c["outcome"]) for c in card["capabilities"]}


async def record(bus: Bus, agent_id: str) -> AgentRecord:
    found = await (await bus.store(BUCKET_AGENTS, AgentRecord)).get(agent_key(agent_id))
    assert found is not None
    return found.value


# --------------------------------------------------------------------------- a conforming agent
async def test_a_conforming_agent_is_verified_and_the_round_journaled(
    bus: Bus, event_log: EventLog, collab: object
) -> None:
    reply = await call(bus, RPC_AGENTS_REGISTER, registration("good-bot", ["echo", "reverse", "triage"]))
    assert reply["outcome"] == "registered"
    round_ = reply["conformance"]
    assert round_["round"] == 1
    # one probe per capability the protocol can check; triage has none
    assert sorted(p["capability"] for p in round_["probes"]) == ["echo", "reverse"]
    assert all(p["challenge"] and p["expects"] for p in round_["probes"])
    before = await cards(bus)
    assert capabilities(before["good-bot"]) == {
        "echo": (False, "pending", None),
        "reverse": (False, "pending", None),
        "triage": (False, "no_probe", None),
    }
    # the heartbeat ack repeats the open round (a lost registration reply is no loss)
    ack = await call(
        bus,
        RPC_AGENTS_HEARTBEAT,
        {
            "agent_id": "good-bot",
            "timestamp": datetime.now(UTC).isoformat(),
            "current_state": "idle",
            "protocol_version": "1.0",
        },
    )
    assert ack["conformance"] == round_

    verdict = await call(bus, RPC_AGENTS_CONFORMANCE, answers("good-bot", round_, correct(round_)))
    assert (verdict["accepted"], verdict["round"]) == (True, 1)
    assert sorted((r["capability"], r["outcome"]) for r in verdict["results"]) == [
        ("echo", "verified"),
        ("reverse", "verified"),
    ]
    (event,) = await event_log.wait_for(CHECKED, timeout_s=WAIT_S)
    data = event.payload(AgentConformanceChecked)
    assert (data.agent_id, data.incarnation, data.round, data.passed) == ("good-bot", 1, 1, True)
    assert data.answered_at is not None
    card = (await cards(bus))["good-bot"]
    assert card["kind"] == "external"
    assert capabilities(card) == {
        "echo": (True, "verified", "verified"),
        "reverse": (True, "verified", "verified"),
        "triage": (False, "no_probe", None),  # declared is not proven: the protocol cannot check it
    }
    echo = next(c for c in card["capabilities"] if c["name"] == "echo")
    assert (echo["probe"], echo["round"]) == ("echo", 1)
    assert echo["checked_at"] is not None

    # the same answers again (a retry): the same verdict, the fact journaled once
    again = await call(bus, RPC_AGENTS_CONFORMANCE, answers("good-bot", round_, correct(round_)))
    assert again == verdict
    await event_log.caught_up()
    assert len(event_log.of_type(CHECKED)) == 1
    # the round is over: no ack carries it any more; the deadline's timer finds it answered and does nothing
    ack = await call(
        bus,
        RPC_AGENTS_HEARTBEAT,
        {
            "agent_id": "good-bot",
            "timestamp": datetime.now(UTC).isoformat(),
            "current_state": "idle",
            "protocol_version": "1.0",
        },
    )
    assert "conformance" not in ack  # added to 1.0 after its first schema: left out when there is none

    async def still_one_verdict() -> bool:
        assert len(event_log.of_type(CHECKED)) == 1
        assert (await record(bus, "good-bot")).conformance is not None
        assert capabilities((await cards(bus))["good-bot"])["echo"] == (True, "verified", "verified")
        return True

    await stays(still_one_verdict, settle_s=2.5)  # past the 1 s deadline and its whole-second timer


async def test_changed_capabilities_open_a_new_round_unchanged_ones_keep_the_verdict(
    bus: Bus, event_log: EventLog, collab: object
) -> None:
    first = (await call(bus, RPC_AGENTS_REGISTER, registration("good-bot", ["echo"])))["conformance"]
    await call(bus, RPC_AGENTS_CONFORMANCE, answers("good-bot", first, correct(first)))
    await event_log.wait_for(CHECKED, timeout_s=WAIT_S)
    # the same declaration again: nothing new to check
    same = await call(bus, RPC_AGENTS_REGISTER, registration("good-bot", ["echo"]))
    assert "conformance" not in same
    assert capabilities((await cards(bus))["good-bot"]) == {"echo": (True, "verified", "verified")}
    # a changed one: a new round, and until it is passed nothing is verified
    changed = await call(bus, RPC_AGENTS_REGISTER, registration("good-bot", ["echo", "reverse"]))
    second = changed["conformance"]
    assert second["round"] == 2
    assert {p["challenge"] for p in second["probes"]}.isdisjoint({p["challenge"] for p in first["probes"]})
    assert capabilities((await cards(bus))["good-bot"]) == {
        "echo": (False, "pending", None),
        "reverse": (False, "pending", None),
    }
    # the first round's answers are no good for the second one
    stale = await call(bus, RPC_AGENTS_CONFORMANCE, answers("good-bot", first, correct(first)))
    assert (stale["accepted"], stale["refusal"]["reason"]) == (False, "no_round_open")
    await call(bus, RPC_AGENTS_CONFORMANCE, answers("good-bot", second, correct(second)))
    checked = await event_log.wait_for(CHECKED, count=2, timeout_s=WAIT_S)
    assert [(e.data["round"], e.data["passed"]) for e in checked] == [(1, True), (2, True)]
    assert capabilities((await cards(bus))["good-bot"]) == {
        "echo": (True, "verified", "verified"),
        "reverse": (True, "verified", "verified"),
    }


# --------------------------------------------------------------------------- non-conforming agents
async def test_wrong_answers_leave_the_capabilities_unverified(bus: Bus, event_log: EventLog, collab: object) -> None:
    round_ = (await call(bus, RPC_AGENTS_REGISTER, registration("wrong-bot", ["echo", "reverse"])))["conformance"]
    right = correct(round_)
    # echo is answered with reverse's answer, reverse not at all
    verdict = await call(bus, RPC_AGENTS_CONFORMANCE, answers("wrong-bot", round_, {"echo": right["reverse"]}))
    assert verdict["accepted"] is True
    assert sorted((r["capability"], r["verified"], r["outcome"]) for r in verdict["results"]) == [
        ("echo", False, "wrong_answer"),
        ("reverse", False, "unanswered"),
    ]
    (event,) = await event_log.wait_for(CHECKED, timeout_s=WAIT_S)
    assert (event.data["agent_id"], event.data["passed"]) == ("wrong-bot", False)
    assert capabilities((await cards(bus))["wrong-bot"]) == {
        "echo": (False, "failed", "wrong_answer"),
        "reverse": (False, "failed", "unanswered"),
    }
    # answering right after the verdict changes nothing: the round is over
    again = await call(bus, RPC_AGENTS_CONFORMANCE, answers("wrong-bot", round_, right))
    assert [r["outcome"] for r in again["results"]] == [r["outcome"] for r in verdict["results"]]
    assert capabilities((await cards(bus))["wrong-bot"])["echo"] == (False, "failed", "wrong_answer")


async def test_an_agent_that_never_answers_fails_at_the_deadline(bus: Bus, event_log: EventLog, collab: object) -> None:
    reply = await call(bus, RPC_AGENTS_REGISTER, registration("silent-bot", ["echo"]))
    round_ = reply["conformance"]
    deadline = datetime.fromisoformat(round_["deadline"])
    assert timedelta(0) < deadline - datetime.now(UTC) <= timedelta(seconds=1)
    # the durable timer ends the round; nobody sleeps on it
    (event,) = await event_log.wait_for(CHECKED, timeout_s=WAIT_S)
    data = event.payload(AgentConformanceChecked)
    assert (data.agent_id, data.passed, data.answered_at) == ("silent-bot", False, None)
    assert [(r.capability, r.outcome) for r in data.results] == [("echo", "timeout")]
    assert capabilities((await cards(bus))["silent-bot"]) == {"echo": (False, "failed", "timeout")}
    # answering now is too late: refused, still unverified
    late = await call(bus, RPC_AGENTS_CONFORMANCE, answers("silent-bot", round_, correct(round_)))
    assert (late["accepted"], late["refusal"]["reason"]) == (False, "no_round_open")
    assert "deadline" in late["refusal"]["detail"]
    assert capabilities((await cards(bus))["silent-bot"]) == {"echo": (False, "failed", "timeout")}
    await event_log.caught_up()
    assert len(event_log.of_type(CHECKED)) == 1


async def test_answers_from_an_unregistered_agent_or_in_another_version_are_refused(bus: Bus, collab: object) -> None:
    body = {"agent_id": "good-bot", "protocol_version": "1.0", "round": 1, "answers": []}
    refused = await call(bus, RPC_AGENTS_CONFORMANCE, body)
    assert (refused["accepted"], refused["refusal"]["reason"]) == (False, "not_registered")
    await call(bus, RPC_AGENTS_REGISTER, registration("good-bot", ["echo"]))
    other = await call(bus, RPC_AGENTS_CONFORMANCE, {**body, "protocol_version": "1.1"})
    assert other["refusal"]["reason"] == "version_mismatch"
    malformed = await call(bus, RPC_AGENTS_CONFORMANCE, {**body, "round": 0})
    assert malformed["refusal"]["reason"] == "malformed_request"
    assert "round" in malformed["refusal"]["detail"]


async def test_the_answers_are_signed_like_every_other_request(bus: Bus, event_log: EventLog, collab: object) -> None:
    """AP-11 holds for the conformance subject too: unsigned or replayed answers are refused and journaled."""

    def signed(subject: str, body: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        raw = json.dumps(body).encode()
        return raw, sign(
            KEY,
            agent_subject(subject, "signed-bot"),
            "signed-bot",
            raw,
            timestamp=int(time.time()),
            nonce=secrets.token_urlsafe(16),
        )

    reply = await call(bus, RPC_AGENTS_REGISTER, *signed(RPC_AGENTS_REGISTER, registration("signed-bot", ["echo"])))
    round_ = reply["conformance"]
    body = answers("signed-bot", round_, correct(round_))
    unsigned = await call(bus, RPC_AGENTS_CONFORMANCE, body)
    assert (unsigned["accepted"], unsigned["refusal"]["reason"]) == (False, "unsigned")
    raw, headers = signed(RPC_AGENTS_CONFORMANCE, body)
    verdict = await call(bus, RPC_AGENTS_CONFORMANCE, raw, headers)
    assert (verdict["accepted"], [r["outcome"] for r in verdict["results"]]) == (True, ["verified"])
    replayed = await call(bus, RPC_AGENTS_CONFORMANCE, raw, headers)  # the same signed bytes again
    assert (replayed["accepted"], replayed["refusal"]["reason"]) == (False, "replayed_nonce")
    refused = await event_log.wait_for(
        AgentMessageRefused.EVENT_TYPE,
        where=lambda e: e.data["subject"] == agent_subject(RPC_AGENTS_CONFORMANCE, "signed-bot"),
        count=2,
        timeout_s=WAIT_S,
    )
    assert sorted(e.data["reason"] for e in refused) == ["replayed_nonce", "unsigned"]
    (checked,) = await event_log.wait_for(CHECKED, timeout_s=WAIT_S)
    assert (checked.data["agent_id"], checked.data["passed"]) == ("signed-bot", True)


# --------------------------------------------------------------------------- hosted agents' cards
def started(run_id: str, agent: str, at: datetime, *, tools: list[str], model: str | None = None) -> Any:
    summary = AgentSummary(
        provider="scripted", model=model, skills=["api-contracts"], tools=tools, max_turns=20, max_compute_s=900
    )
    data = RunStarted(run_id=run_id, agent=agent, role="Code reviewer", title="Review", agent_card=summary)
    return make_event(data, source="/temporality/run-executor", id=f"evt-{run_id}", run_id=run_id, time=at)


async def settled(bus: Bus, durable: str) -> None:
    """The consumer has handled everything on its stream (nothing pending, nothing in flight)."""
    spec = CONSUMERS[durable]
    async with asyncio.timeout(WAIT_S):
        while True:
            info = await bus.js.consumer_info(spec.stream, durable)
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return
            await asyncio.sleep(0.05)


async def test_hosted_agents_are_listed_from_their_latest_run_started(bus: Bus, collab: object) -> None:
    t0 = datetime.now(UTC).replace(microsecond=0)
    await bus.publish(started("run-2", "reviewer", t0 + timedelta(seconds=5), tools=["get_input", "ask_human"]))
    await bus.publish(started("run-3", "summarizer", t0, tools=["notify"], model="m-1"))
    await call(bus, RPC_AGENTS_REGISTER, registration("good-bot", ["echo"]))
    await settled(bus, "agent-collab-runs")
    hosted = await cards(bus, kind="hosted")
    assert sorted(hosted) == ["reviewer", "summarizer"]
    reviewer = hosted["reviewer"]
    assert (reviewer["kind"], reviewer["provider"], reviewer["role"], reviewer["skills"], reviewer["last_run_id"]) == (
        "hosted",
        "scripted",
        "Code reviewer",
        ["api-contracts"],
        "run-2",
    )
    assert reviewer["allowed_tools"] == ["get_input", "ask_human"]  # what its runs are offered
    assert datetime.fromisoformat(reviewer["last_started_at"]) == t0 + timedelta(seconds=5)
    assert (reviewer["state"], reviewer["capabilities"]) == (None, [])  # no lifecycle, nothing to verify
    assert hosted["summarizer"]["model"] == "m-1"

    # an older run of the reviewer arriving later (a redelivery, another replica) never replaces the newer card
    await bus.publish(started("run-1", "reviewer", t0, tools=["get_input"]))
    await settled(bus, "agent-collab-runs")
    assert (await cards(bus, kind="hosted"))["reviewer"]["last_run_id"] == "run-2"
    # a newer one does
    await bus.publish(started("run-4", "reviewer", t0 + timedelta(seconds=9), tools=["get_input"]))
    await settled(bus, "agent-collab-runs")
    assert (await cards(bus, kind="hosted"))["reviewer"]["allowed_tools"] == ["get_input"]

    everything = await cards(bus)
    assert [(c["agent_id"], c["kind"]) for c in everything.values()] == [
        ("reviewer", "hosted"),
        ("summarizer", "hosted"),
        ("good-bot", "external"),
    ]
    assert list(await cards(bus, kind="external")) == ["good-bot"]
