"""The pure aggregations behind /triggers and /analytics/human: percentiles, buckets, first outcome wins, cursors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from temporality_journal.insights import (
    EventRow,
    RunRow,
    decode_cursor,
    deliveries_of,
    encode_cursor,
    human_analytics,
    triggers_of,
)
from temporality_service import Unprocessable

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def _run(run_id: str, agent: str | None = "reviewer", trigger_id: str | None = "t") -> RunRow:
    return RunRow(run_id=run_id, state="completed", agent=agent, trigger_id=trigger_id, created_at=T0)


def _ask(run_id: str, request_id: str, at: datetime = T0, question: str = "Q?") -> EventRow:
    return EventRow("human.requested", at, run_id, {"request_id": request_id, "question": question})


def _answer(run_id: str, request_id: str, waited: object, at: datetime = T0) -> EventRow:
    return EventRow("human.answered", at, run_id, {"request_id": request_id, "waited_s": waited})


def test_percentiles_and_buckets_are_nearest_rank_with_exclusive_bounds() -> None:
    waits = [59.9, 60, 299, 300, 900, 3600, 86_400, 100_000, 1, 2]
    runs = [_run(f"r{i}") for i in range(len(waits))]
    events = [e for i, w in enumerate(waits) for e in (_ask(f"r{i}", f"q{i}"), _answer(f"r{i}", f"q{i}", w))]
    wait = human_analytics(runs, events, since=None, until=None, top=3).wait
    assert wait.count == 10
    assert (wait.p50_s, wait.p90_s, wait.p99_s, wait.max_s) == (299, 86_400, 100_000, 100_000)
    assert [b.count for b in wait.histogram] == [3, 2, 1, 1, 1, 0, 2]


def test_first_outcome_wins_and_missing_waited_s_falls_back_to_the_clock() -> None:
    events = [
        _ask("r1", "q1"),
        EventRow("human.expired", T0 + timedelta(seconds=90), "r1", {"request_id": "q1", "waited_s": 90}),
        _answer("r1", "q1", 5, at=T0 + timedelta(seconds=95)),  # too late: the request had expired
        _ask("r2", "q2"),
        _answer("r2", "q2", "not a number", at=T0 + timedelta(seconds=42)),
        _ask("r2", "q2"),  # redelivered request: counted once
        _answer("r9", "q9", 1),  # an answer to no known request
    ]
    body = human_analytics([_run("r1"), _run("r2")], events, since=None, until=None, top=10)
    assert (body.requests_total, body.answered, body.expired, body.pending) == (2, 1, 1, 0)
    assert body.wait.max_s == 42
    assert body.top_questions[0].count == 2


def test_questions_are_clipped_and_ranked() -> None:
    long = "x" * 500
    events = [_ask("r1", "a", question=long), _ask("r1", "b", question=long), _ask("r1", "c", question="short")]
    body = human_analytics([_run("r1", agent=None, trigger_id=None)], events, since=None, until=None, top=1)
    assert [(q.question, q.count) for q in body.top_questions] == [("x" * 200, 2)]
    assert [b.key for b in body.by_agent] == [None]


def test_a_delivery_counts_once_per_trigger_and_accepted_beats_rejected() -> None:
    events = [
        EventRow("trigger.received", T0, None, {"trigger_id": "t", "delivery_id": "d1"}),
        EventRow("trigger.received", T0, None, {"trigger_id": "t", "delivery_id": "d1"}),
        EventRow("trigger.accepted", T0, "r1", {"trigger_id": "t", "delivery_id": "d1", "run_id": "r1"}),
        EventRow("trigger.rejected", T0, None, {"trigger_id": "t", "delivery_id": "d1", "reason": "duplicate"}),
        EventRow("trigger.received", T0, None, {"delivery_id": "no-trigger"}),
    ]
    (view,) = triggers_of(events, [], set())
    assert (view.deliveries_received, view.deliveries_accepted, view.last_run) == (1, 1, None)
    (delivery,) = deliveries_of(events[:4])
    assert (delivery.outcome, delivery.reason, delivery.run_id) == ("accepted", None, "r1")


def test_ui_2_columns_come_from_deliveries_and_the_last_trigger_change() -> None:
    received = {
        "trigger_id": "t",
        "adapter": "azure_devops.pull_request",
        "source_event_type": "git.pullrequest.created",
    }
    events = [
        EventRow(
            "trigger.created",
            T0,
            None,
            {"trigger_id": "t", "trigger_type": "webhook", "agent": "reviewer", "enabled": True},
        ),
        EventRow("trigger.received", T0, None, {**received, "delivery_id": "d1"}),
        EventRow("trigger.accepted", T0, "r1", {"trigger_id": "t", "delivery_id": "d1", "agent": "old-agent"}),
        EventRow("trigger.received", T0, None, {**received, "delivery_id": "d2", "source_event_type": "git.push"}),
        EventRow("trigger.disabled", T0, None, {"trigger_id": "t", "revision": 2}),
        EventRow("trigger.accepted", T0, "r2", {"trigger_id": "u", "delivery_id": "d3", "agent": "triager"}),
    ]
    t, u = triggers_of(events, [], set())
    assert (t.source, t.event_types, t.trigger_type, t.agent) == (
        "azure_devops.pull_request",
        ["git.pullrequest.created", "git.push"],
        "webhook",
        "reviewer",  # the change event's agent wins over the deliveries'
    )
    assert (t.enabled, t.deleted) == (False, False)
    assert (u.agent, u.enabled, u.source) == ("triager", None, None)  # no change seen: unknown
    deleted = EventRow("trigger.deleted", T0, None, {"trigger_id": "t", "revision": 3})
    assert triggers_of([*events, deleted], [], set())[0].deleted


def test_cursors_round_trip_and_refuse_forgeries() -> None:
    cursor = decode_cursor(encode_cursor(T0, "run-1|x"))
    assert (cursor.time, cursor.key) == (T0, "run-1|x")
    for token in ("", "!!!", "bm9waXBl", encode_cursor(T0, "")):
        with pytest.raises(Unprocessable):
            decode_cursor(token)


def test_an_open_question_of_an_ended_run_is_withdrawn_not_pending() -> None:
    runs = [
        RunRow(run_id=run_id, state=state, agent="reviewer", trigger_id="t", created_at=T0)
        for run_id, state in [
            ("waits", "waiting_for_human"),
            ("cancelled", "cancelled"),
            ("failed", "failed"),
            ("completed", "completed"),
            ("resuming", "resuming"),
        ]
    ]
    events = [_ask(r.run_id, f"q-{r.run_id}") for r in runs]
    events.append(_answer("completed", "q-completed-2", 5))  # an answer to no known request changes nothing
    events.append(_ask("completed", "q-completed-3"))
    events.append(_answer("completed", "q-completed-3", 7))  # answered, then the run completed: answered
    body = human_analytics(runs, events, since=None, until=None, top=10)
    # cancelled, failed and completed with "q-<run>" open: withdrawn; the waiting and resuming runs' open
    assert (body.requests_total, body.answered, body.withdrawn, body.pending) == (6, 1, 3, 2)
    assert body.wait.count == 1
    (row,) = body.by_agent
    assert (row.withdrawn, row.pending) == (3, 2)


def test_reminders_and_escalations_are_counted_beside_the_outcome_never_as_one() -> None:
    """OBS-1 "timeouts and escalations": a question re-asked twice and escalated, then answered, is answered (its
    wait to the answer), with 2 reminders and 1 escalation; steps of an unknown request count nowhere."""
    step = {"recipient": "user:alice", "attempt": 1, "of": 2}
    events = [
        EventRow("human.escalated", T0 + timedelta(seconds=30), "r1", {"request_id": "q1", "to": "group:leads"}),
        _ask("r1", "q1"),  # (the order the rows come in does not matter)
        EventRow("human.reasked", T0 + timedelta(seconds=10), "r1", {"request_id": "q1", **step}),
        EventRow("human.reasked", T0 + timedelta(seconds=20), "r1", {"request_id": "q1", **step, "attempt": 2}),
        _answer("r1", "q1", 40, at=T0 + timedelta(seconds=40)),
        _ask("r2", "q2"),
        EventRow("human.expired", T0 + timedelta(seconds=60), "r2", {"request_id": "q2", "waited_s": 60}),
        EventRow("human.reasked", T0, "r9", {"request_id": "q9", **step}),
    ]
    body = human_analytics([_run("r1"), _run("r2", agent="tester")], events, since=None, until=None, top=10)
    assert (body.requests_total, body.answered, body.expired, body.pending) == (2, 1, 1, 0)
    assert (body.escalated, body.reminders) == (1, 2)
    assert body.wait.max_s == 40
    rows = {row.key: (row.escalated, row.reminders) for row in body.by_agent}
    assert rows == {"reviewer": (1, 2), "tester": (0, 0)}


def test_stages_are_the_turns_asked_in_and_a_request_without_one_comes_last() -> None:
    runs = [_run("r1"), _run("r2"), _run("r3")]
    events = [
        EventRow("human.requested", T0, "r1", {"request_id": "q1", "question": "A?", "turn": 2}),
        EventRow("human.requested", T0, "r2", {"request_id": "q2", "question": "B?", "turn": True}),  # not a turn
        EventRow("human.requested", T0, "r3", {"request_id": "q3", "question": "C?", "turn": 2}),
        _answer("r1", "q1", 30),
        _answer("r3", "q3", 90),
        EventRow("human.requested", T0, "r9", {"request_id": "q9", "question": "D?", "turn": 1}),  # no such run
    ]
    stages = human_analytics(runs, events, since=None, until=None, top=3).by_stage
    assert [(s.turn, s.runs_asked, s.requests_total, s.answered, s.wait_p50_s) for s in stages] == [
        (2, 2, 2, 2, 30),
        (None, 1, 1, 0, None),
    ]
    assert stages[0].asked_share == round(2 / 3, 4)
    # no terminal event: a run counts as far as the latest turn it asked in (r2's "turn" is none), and the
    # unknown-turn row has no such count
    assert [(s.runs_reached, s.reached_share) for s in stages] == [(2, 1.0), (None, None)]
