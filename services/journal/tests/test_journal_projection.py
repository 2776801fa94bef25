"""The projection is pure: events in, run rows out, no database."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from journal_support import replay

from temporality_journal import RunSnapshot, project, run_id_of
from temporality_journal.models import updated
from temporality_protocol import (
    RUN,
    Envelope,
    InvalidEnvelope,
    RunState,
    RunToolCalled,
    TriggerReceived,
    make_event,
)

MakeStory = Callable[..., Any]  # journal_support.RunStory


def _assert_waiting_invariant(run: RunSnapshot) -> None:
    waiting = [run.waiting_request_id, run.waiting_recipient, run.waiting_since, run.waiting_question]
    if run.state == RunState.WAITING_FOR_HUMAN:
        assert all(v is not None for v in waiting)
    else:
        assert all(v is None for v in waiting)
        assert run.waiting_channel is None


def test_full_trajectory_moves_the_run_through_each_state(story: MakeStory) -> None:
    s = story()
    steps = [
        (s.requested(), RunState.PENDING),
        (s.created(), RunState.PENDING),
        (s.started(), RunState.RUNNING),
        (s.human_requested(), RunState.WAITING_FOR_HUMAN),
        (s.notified("matrix"), RunState.WAITING_FOR_HUMAN),
        (s.answered(), RunState.RESUMING),
        (s.resumed(), RunState.RUNNING),
        (s.completed("merged"), RunState.COMPLETED),
    ]
    run: RunSnapshot | None = None
    for seq, (event, expected) in enumerate(steps, start=1):
        before = run.state if run else None
        run = project(run, event, seq) or run
        assert run is not None
        assert run.state == expected, event.type
        assert run.last_event_seq == seq
        if before is not None and before != run.state:
            assert RUN.allowed(before, run.state), (before, run.state)  # the journal agrees with the run machine
        _assert_waiting_invariant(run)

    assert run is not None
    assert (run.agent, run.title, run.trigger_id, run.launch_kind) == ("reviewer", "Review PR 42", "ado-pr", "webhook")
    assert run.created_at == steps[0][0].time
    assert run.started_at == steps[2][0].time
    assert run.finished_at == steps[-1][0].time
    assert run.updated_at == steps[-1][0].time
    assert run.result == "merged"
    assert run.error is None


def test_human_request_records_whom_what_and_since(story: MakeStory) -> None:
    s = story()
    asked_at = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    run = replay([s.requested(), s.started(), s.human_requested(recipient="user:bob", question="Ship?", time=asked_at)])
    assert run is not None
    assert run.state == RunState.WAITING_FOR_HUMAN
    assert run.waiting_request_id == s.request_id
    assert run.waiting_recipient == "user:bob"
    assert run.waiting_question == "Ship?"
    assert run.waiting_since == asked_at
    assert run.waiting_channel is None

    notified = project(run, s.notified("telegram"), 10)
    assert notified is not None
    assert notified.waiting_channel == "telegram"
    fallback = project(notified, s.notified("web"), 11)
    assert fallback is not None
    assert fallback.waiting_channel == "web"


def test_notification_or_answer_for_another_request_changes_nothing(story: MakeStory) -> None:
    s = story()
    run = replay([s.requested(), s.started(), s.human_requested()])
    assert project(run, s.notified("matrix", request_id="hreq-other"), 10) is None
    other = story(run_id=s.run_id, request_id="hreq-other")
    assert project(run, other.answered(), 11) is None


def test_resume_clears_the_waiting_fields(story: MakeStory) -> None:
    s = story()
    run = replay([s.requested(), s.started(), s.human_requested(), s.notified(), s.resumed()])
    assert run is not None
    assert run.state == RunState.RUNNING
    _assert_waiting_invariant(run)


@pytest.mark.parametrize(
    ("end", "state", "result", "error"),
    [
        ("completed", RunState.COMPLETED, "merged", None),
        ("failed", RunState.FAILED, None, "tool_error: boom"),
        ("cancelled", RunState.CANCELLED, None, "by user:bob"),
    ],
)
def test_terminal_events_finish_the_run(
    story: MakeStory, end: str, state: RunState, result: str | None, error: str | None
) -> None:
    s = story()
    final = getattr(s, end)()
    run = replay([s.requested(), s.started(), s.human_requested(), final])
    assert run is not None
    assert (run.state, run.result, run.error, run.finished_at) == (state, result, error, final.time)
    _assert_waiting_invariant(run)  # a run that ends while waiting no longer waits


def test_terminal_state_is_sticky(story: MakeStory) -> None:
    s = story()
    run = replay([s.requested(), s.started(), s.completed()])
    assert run is not None
    assert run.state == RunState.COMPLETED
    for seq, late in enumerate(
        [s.started("started-again"), s.human_requested(), s.resumed(), s.failed(), s.cancelled()]
    ):
        assert project(run, late, 100 + seq) is None, late.type


def test_an_older_event_never_moves_the_state_but_fills_blanks(story: MakeStory) -> None:
    s = story()
    requested, started, asked = s.requested(), s.started(), s.human_requested()
    # run.started (seq 2) failed transiently and comes back after human.requested (seq 3)
    created = replay([requested])
    run = project(created, asked, 3)
    assert run is not None
    assert run.state == RunState.WAITING_FOR_HUMAN
    late = project(run, started, 2)
    assert late is not None
    assert late.state == RunState.WAITING_FOR_HUMAN
    assert late.started_at == started.time
    assert late.last_event_seq == 3


def test_a_run_seen_first_through_a_later_event_is_created_and_completed_by_the_launch(story: MakeStory) -> None:
    s = story()
    requested, started = s.requested(), s.started()
    run = project(None, started, 2)
    assert run is not None
    assert run.state == RunState.RUNNING
    assert run.trigger_id is None
    filled = project(run, requested, 1)
    assert filled is not None
    assert filled.state == RunState.RUNNING
    assert (filled.trigger_id, filled.launch_kind) == ("ado-pr", "webhook")
    assert filled.created_at == requested.time


def test_run_created_without_run_requested_makes_a_pending_run(story: MakeStory) -> None:
    s = story()
    run = project(None, s.created(), 1)
    assert run is not None
    assert run.state == RunState.PENDING
    assert run.agent == "reviewer"


def test_projecting_the_same_event_twice_changes_nothing(story: MakeStory) -> None:
    s = story()
    run = replay([s.requested(), s.started()])
    asked = s.human_requested()
    once = project(run, asked, 3)
    assert once is not None
    assert project(once, asked, 3) is None


def test_events_without_a_run_or_of_other_types_project_nothing(story: MakeStory) -> None:
    received = make_event(
        TriggerReceived(trigger_id="t", delivery_id="d", adapter="generic", body_bytes=2), source="/test"
    )
    assert run_id_of(received) is None
    assert project(None, received, 1) is None

    s = story()
    tool = make_event(RunToolCalled(run_id=s.run_id, turn=1, call_id="c", tool="read"), source="/t", run_id=s.run_id)
    assert project(None, tool, 1) is None

    future = Envelope(
        id="evt-future", source="/future", type="run.teleported", time=datetime.now(UTC), data={}, runid=s.run_id
    )
    assert project(None, future, 1) is None


def test_run_id_falls_back_to_the_data(story: MakeStory) -> None:
    s = story()
    event = s.requested().model_copy(update={"runid": None})
    assert run_id_of(event) == s.run_id
    run = project(None, event, 1)
    assert run is not None
    assert run.run_id == s.run_id


def test_invalid_data_of_a_projected_type_raises(story: MakeStory) -> None:
    s = story()
    broken = s.started().model_copy(update={"data": {"run_id": s.run_id}})
    with pytest.raises(InvalidEnvelope):
        project(None, broken, 1)


def test_an_event_of_another_run_is_refused(story: MakeStory) -> None:
    run = replay([story().requested()])
    with pytest.raises(ValueError, match="belongs to run"):
        project(run, story().started(), 2)


def test_naive_event_times_are_read_as_utc(story: MakeStory) -> None:
    s = story()
    naive = datetime(2025, 5, 6, 7, 8, 9)  # noqa: DTZ001 - the point of the test
    event = s.requested().model_copy(update={"time": naive})
    run = project(None, event, 1)
    assert run is not None
    assert run.created_at == naive.replace(tzinfo=UTC)
    assert run.created_at.utcoffset() == timedelta(0)


def test_every_projected_row_is_what_its_model_validates(story: MakeStory) -> None:
    """The projection copies rows without validating them again: each row it returns must be one the
    model accepts unchanged (right types: enum state, aware datetimes, ints), through every move."""
    s = story()
    events = [
        s.started(),  # first seen through a later event
        s.requested(),
        s.created(),
        s.human_requested(),
        s.notified("matrix"),
        s.answered(),
        s.resumed(),
        s.notified("web", request_id="hreq-nobody-waits-on"),  # changes nothing
        s.completed(),
        s.requested(),  # late, after the end: fills blanks only
    ]
    run: RunSnapshot | None = None
    moves = 0
    for seq, event in enumerate(events, start=1):
        after = project(run, event, seq)
        if after is None:
            continue
        moves += 1
        assert RunSnapshot.model_validate(after.model_dump()) == after
        assert type(after.state) is RunState
        assert all(
            value.tzinfo is not None
            for value in (after.created_at, after.updated_at, after.started_at, after.waiting_since)
            if value is not None
        )
        _assert_waiting_invariant(after)
        run = after
    assert run is not None
    assert run.state == RunState.COMPLETED
    assert moves >= 7


def test_updating_a_snapshot_refuses_a_name_that_is_no_field(story: MakeStory) -> None:
    run = project(None, story().requested(), 1)
    assert run is not None
    with pytest.raises(ValueError, match="no field"):
        updated(run, {"stat": RunState.RUNNING})
    assert updated(run, {"title": "new"}).title == "new"
    assert run.title != "new"
