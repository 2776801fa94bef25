"""Conformance rounds, pure (no NATS): when a round opens, how answers are judged, when the deadline ends it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from temporality_agent_collab.conformance import capability_views, challenge, correct_answer
from temporality_agent_collab.external import AllowList
from temporality_agent_collab.registry import (
    AgentRecord,
    Refused,
    conformance_answered,
    conformance_timed_out,
    decommissioned,
    fresh_record,
    registered,
)
from temporality_protocol import AgentRegistration, ConformanceAnswers, Deregistration

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
ALLOW = AllowList.model_validate({"agents": [{"id": "bot", "allow_unsigned": True}]})
BOT = ALLOW.agents[0]


def request(capabilities: list[str], **changes: object) -> AgentRegistration:
    body: dict[str, object] = {
        "agent_id": "bot",
        "protocol_version": "1.0",
        "provider": "p",
        "model": "m",
        "capabilities": capabilities,
        "max_context_size": 100,
    }
    body.update(changes)
    return AgentRegistration.model_validate(body)


def fresh(capabilities: list[str]) -> AgentRecord:
    return fresh_record(request(capabilities), BOT, ALLOW, version="1.0", grace_s=0, now=T0, conformance_timeout_s=10)


def reply(record: AgentRecord, given: dict[str, str], *, round_no: int | None = None) -> ConformanceAnswers:
    rnd = record.conformance
    assert rnd is not None
    return ConformanceAnswers(
        agent_id="bot",
        protocol_version="1.0",
        round=round_no or rnd.round,
        answers=[{"probe_id": p.probe_id, "answer": given[p.capability]} for p in rnd.probes if p.capability in given],
    )


def right(record: AgentRecord) -> dict[str, str]:
    rnd = record.conformance
    assert rnd is not None
    return {p.capability: correct_answer(p.capability, p.challenge) for p in rnd.probes}


def outcomes(record: AgentRecord) -> dict[str, str]:
    rnd = record.conformance
    assert rnd is not None
    assert rnd.results is not None
    return {r.capability: r.outcome for r in rnd.results}


def test_a_round_probes_only_what_the_protocol_can_check() -> None:
    record = fresh(["echo", "reverse", "triage", "echo"])
    rnd = record.conformance
    assert rnd is not None
    assert (rnd.round, record.rounds, rnd.deadline) == (1, 1, T0 + timedelta(seconds=10))
    assert [p.capability for p in rnd.probes] == ["echo", "reverse"]
    assert len({p.challenge for p in rnd.probes}) == 2  # random, one each
    assert fresh(["triage"]).conformance is None
    assert fresh(["triage"]).rounds == 0
    sent = challenge(rnd, T0)
    assert sent is not None
    assert [p.expects for p in sent.probes] == [
        "the challenge, verbatim",
        "the challenge's characters in reverse order",
    ]
    assert challenge(rnd, T0 + timedelta(seconds=10)) is None  # past the deadline: no longer offered
    with pytest.raises(ValueError, match="no probe"):
        correct_answer("triage", "x")


def test_answers_are_judged_per_probe_and_only_in_time() -> None:
    record = fresh(["echo", "reverse"])
    good = right(record)
    passed = conformance_answered(record, reply(record, good), T0 + timedelta(seconds=1))
    assert passed is not None
    assert outcomes(passed) == {"echo": "verified", "reverse": "verified"}
    assert passed.conformance is not None
    assert passed.conformance.passed
    # echo answered as reverse would be: wrong; reverse missing: unanswered
    mixed = conformance_answered(record, reply(record, {"echo": good["reverse"]}), T0 + timedelta(seconds=1))
    assert mixed is not None
    assert outcomes(mixed) == {"echo": "wrong_answer", "reverse": "unanswered"}
    # right, but after the deadline (before its timer fired): late, not verified
    late = conformance_answered(record, reply(record, good), T0 + timedelta(seconds=10, milliseconds=1))
    assert late is not None
    assert outcomes(late) == {"echo": "late", "reverse": "late"}
    views = {c.name: (c.verified, c.status) for c in capability_views(["echo", "reverse", "x"], late.conformance)}
    assert views == {"echo": (False, "failed"), "reverse": (False, "failed"), "x": (False, "no_probe")}
    # the first answer to a probe counts, a second one to the same probe cannot fix it
    rnd = record.conformance
    assert rnd is not None
    echo = next(p for p in rnd.probes if p.capability == "echo")
    body = ConformanceAnswers(
        agent_id="bot",
        protocol_version="1.0",
        round=1,
        answers=[{"probe_id": echo.probe_id, "answer": "nope"}, {"probe_id": echo.probe_id, "answer": good["echo"]}],
    )
    first = conformance_answered(record, body, T0)
    assert first is not None
    assert outcomes(first)["echo"] == "wrong_answer"


def test_an_ended_round_is_not_reopened_and_other_rounds_are_refused() -> None:
    record = fresh(["echo"])
    passed = conformance_answered(record, reply(record, right(record)), T0)
    assert passed is not None
    assert conformance_answered(passed, reply(record, {"echo": "wrong"}), T0) is None  # the verdict stands
    with pytest.raises(Refused) as refused:
        conformance_answered(passed, reply(record, right(record), round_no=2), T0)
    assert refused.value.reason == "no_round_open"
    with pytest.raises(Refused) as none_open:
        conformance_answered(fresh(["triage"]), reply(record, {}, round_no=1), T0)
    assert none_open.value.reason == "no_round_open"
    with pytest.raises(Refused) as other_version:
        conformance_answered(record, reply(record, {}).model_copy(update={"protocol_version": "1.1"}), T0)
    assert other_version.value.reason == "version_mismatch"


def test_the_deadline_timer_ends_only_its_own_open_round_and_never_early() -> None:
    record = fresh(["echo"])
    assert conformance_timed_out(record, 1, 1, T0 + timedelta(seconds=9)) is None  # early
    assert conformance_timed_out(record, 2, 1, T0 + timedelta(seconds=11)) is None  # another incarnation
    assert conformance_timed_out(record, 1, 2, T0 + timedelta(seconds=11)) is None  # another round
    ended = conformance_timed_out(record, 1, 1, T0 + timedelta(seconds=10))
    assert ended is not None
    assert outcomes(ended) == {"echo": "timeout"}
    assert ended.conformance is not None
    assert ended.conformance.answered_at is None
    assert conformance_timed_out(ended, 1, 1, T0 + timedelta(seconds=12)) is None  # redelivered: already ended
    with pytest.raises(Refused, match="deadline"):
        conformance_answered(ended, reply(record, right(record)), T0 + timedelta(seconds=12))
    answered = conformance_answered(record, reply(record, right(record)), T0)
    assert answered is not None
    assert conformance_timed_out(answered, 1, 1, T0 + timedelta(seconds=11)) is None


def test_a_new_round_for_changed_capabilities_and_for_a_new_incarnation() -> None:
    record = fresh(["echo"])
    passed = conformance_answered(record, reply(record, right(record)), T0)
    assert passed is not None
    params: dict[str, object] = {"version": "1.0", "grace_s": 0, "now": T0, "conformance_timeout_s": 10}
    # another model, the same capabilities: a re-registration (straight from `registered`), the verdict kept
    other_model = registered(passed, request(["echo"], model="m2"), BOT, ALLOW, **params)  # type: ignore[arg-type]
    assert other_model is not None
    assert (other_model.registration, other_model.recent) == (2, [])
    assert other_model.conformance == passed.conformance
    changed = registered(passed, request(["echo", "reverse"]), BOT, ALLOW, **params)  # type: ignore[arg-type]
    assert changed is not None
    assert changed.conformance is not None
    assert (changed.conformance.round, changed.rounds, changed.conformance.open) == (2, 2, True)
    # capabilities without probes: no round, nothing verified any more
    unprobed = registered(passed, request(["triage"]), BOT, ALLOW, **params)  # type: ignore[arg-type]
    assert unprobed is not None
    assert (unprobed.conformance, unprobed.rounds) == (None, 1)
    # a new incarnation starts over: round 1 again, with new challenges
    gone = decommissioned(passed, Deregistration(agent_id="bot", protocol_version="1.0"), T0)
    assert gone is not None
    again = registered(gone, request(["echo"]), BOT, ALLOW, **params)  # type: ignore[arg-type]
    assert again is not None
    assert again.conformance is not None
    assert passed.conformance is not None
    assert (again.incarnation, again.conformance.round, again.conformance.open) == (2, 1, True)
    assert again.conformance.probes[0].challenge != passed.conformance.probes[0].challenge
