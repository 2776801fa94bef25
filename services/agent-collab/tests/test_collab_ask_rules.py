"""The ask's state machine and the pure routing rules: addressing inside the saga, relay names, event ids."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from temporality_agent_collab.asks import (
    Live,
    Relay,
    Undeliverable,
    ask_key,
    message_received_event,
    new_record,
    relay_requested_event,
    relay_run_id,
    resolve,
)
from temporality_agent_collab.participants import InvalidKey, RunEntry, SagaParticipants
from temporality_protocol import AgentAsked, IllegalTransition, RunState, make_event
from temporality_protocol.states import AGENT_ASK, AgentAskState

A = AgentAskState
ALLOWED = {
    (A.ASKED, A.DELIVERED), (A.ASKED, A.UNDELIVERABLE),
    (A.DELIVERED, A.EXPIRED), (A.DELIVERED, A.ANSWERED), (A.DELIVERED, A.REFUSED),
    (A.DELIVERED, A.REPLY_UNDELIVERABLE), (A.DELIVERED, A.UNDELIVERABLE),
    (A.EXPIRED, A.ANSWERED), (A.EXPIRED, A.REFUSED), (A.EXPIRED, A.REPLY_UNDELIVERABLE), (A.EXPIRED, A.UNDELIVERABLE),
}  # fmt: skip
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("current", "target"), sorted(itertools.product(A, A)))
def test_ask_transitions(current: AgentAskState, target: AgentAskState) -> None:
    assert AGENT_ASK.allowed(current, target) == ((current, target) in ALLOWED)
    if (current, target) not in ALLOWED:
        with pytest.raises(IllegalTransition):
            AGENT_ASK.transition(current, target)


def test_ask_terminal_states() -> None:
    assert AGENT_ASK.initial is A.ASKED
    # expired is not terminal: the request stays with its recipient and a late reply still goes back (COL-2)
    assert AGENT_ASK.terminal == {A.ANSWERED, A.REFUSED, A.REPLY_UNDELIVERABLE, A.UNDELIVERABLE}


def _saga() -> SagaParticipants:
    return SagaParticipants(
        saga_id="run-lead",
        runs={
            "run-lead": RunEntry(agent="planner", status=RunState.RUNNING, started_at=T0),
            "run-a": RunEntry(agent="reviewer", status=RunState.COMPLETED, started_at=T0 + timedelta(seconds=1)),
            "run-b": RunEntry(
                agent="reviewer", status=RunState.WAITING_FOR_HUMAN, started_at=T0 + timedelta(seconds=2)
            ),
            "run-b/ask/01": RunEntry(agent="reviewer", status=RunState.RUNNING, started_at=T0 + timedelta(seconds=9)),
            "run-old": RunEntry(agent="archivist", status=RunState.FAILED, started_at=T0),
            "run-anon": RunEntry(status=RunState.CANCELLED),
        },
    )


def _asked(to: str, asker: str = "run-lead") -> AgentAsked:
    return AgentAsked(request_id="req-1", asker_run_id=asker, asker_agent="planner", to=to, message="q")


@pytest.mark.parametrize(
    ("to", "expected"),
    [
        ("agent:reviewer", Live("run-b", "reviewer")),  # latest-started, waiting counts as live; relays skipped
        ("run:run-a", Relay("run-a", "reviewer")),
        ("run-a", Relay("run-a", "reviewer")),
        (" agent:archivist ", Relay("run-old", "archivist")),  # a failed run is finished too
        ("run:run-b/ask/01", Live("run-b/ask/01", "reviewer")),
    ],
)
def test_resolution(to: str, expected: Live | Relay) -> None:
    assert resolve(_asked(to), _saga()) == expected


@pytest.mark.parametrize(
    ("to", "reason"),
    [
        ("agent:auditor", "unknown_addressee"),
        ("run:run-elsewhere", "unknown_addressee"),
        ("reviewer", "unknown_addressee"),
        ("human:alice", "invalid_address"),
        ("mailto:x", "invalid_address"),
        ("run:", "invalid_address"),
        ("agent:planner", "self_addressed"),
        ("run-anon", "relay_failed"),  # finished and its agent unknown: nobody to relay to
    ],
)
def test_refusals(to: str, reason: str) -> None:
    result = resolve(_asked(to), _saga())
    assert isinstance(result, Undeliverable)
    assert result.reason == reason


def test_a_bare_agent_id_gets_a_hint() -> None:
    result = resolve(_asked("reviewer"), _saga())
    assert isinstance(result, Undeliverable)
    assert "agent:reviewer" in result.detail


def test_an_asker_outside_the_projection_is_refused() -> None:
    assert resolve(_asked("agent:reviewer"), None) == Undeliverable(
        "asker_unknown", "run run-lead is not known to agent-collab"
    )
    result = resolve(_asked("agent:reviewer", asker="run-x"), _saga())
    assert isinstance(result, Undeliverable)
    assert result.reason == "asker_unknown"


def test_relay_names_and_keys() -> None:
    assert relay_run_id("run-a", 1) == "run-a/ask/01"
    assert relay_run_id("run-a", 12) == "run-a/ask/12"
    assert ask_key("req-abc") == "ask.req-abc"
    with pytest.raises(InvalidKey):
        ask_key("req.a")


def test_events_have_deterministic_ids_and_carry_the_relay() -> None:
    asked = _asked("agent:reviewer").model_copy(update={"mode": "wait", "timeout_s": 60})
    envelope = make_event(asked, source="/t", run_id="run-lead", time=T0)
    record = new_record(asked, envelope, "run-lead", Relay("run-a", "reviewer"), 3)
    assert record.state is A.DELIVERED
    assert record.expires_at == T0 + timedelta(seconds=60)
    assert record.recipient_run_id == "run-a/ask/03"
    first, again = message_received_event(record), message_received_event(record)
    assert first.id == again.id
    assert first.runid == "run-a/ask/03"
    assert relay_requested_event(record).id == relay_requested_event(record).id
    assert relay_requested_event(record).data["parent_run_id"] == "run-a"
