"""The pure projection: how each event changes SagaParticipants and what get_collaborators lists."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from temporality_agent_collab.participants import (
    APPLIED_EVENT_IDS_MAX,
    TASK_MAX,
    InvalidKey,
    SagaParticipants,
    apply,
    collaborators,
    new_saga,
    run_key,
    saga_id_of,
    saga_key,
)
from temporality_protocol import (
    Collaborator,
    Envelope,
    EventData,
    HumanAnswered,
    InvalidEnvelope,
    LaunchSource,
    OptionAnswer,
    RunCompleted,
    RunFailed,
    RunRequested,
    RunStarted,
    RunState,
    derive_id,
    make_event,
)

PARENT = derive_id("run", "parent")
CHILD = derive_id("run", "child")
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _ev(data: EventData, run_id: str, *, correlation: str | None = None, id: str | None = None) -> Envelope:
    return make_event(data, source="/test", run_id=run_id, correlation_id=correlation, id=id, time=T0)


def _started(run_id: str, agent: str, *, parent: str | None = None, title: str = "task") -> Envelope:
    data = RunStarted(run_id=run_id, agent=agent, role=f"{agent}-role", title=title, parent_run_id=parent)
    return _ev(data, run_id, correlation=parent)


def _answered(run_id: str, responder: str, *, correlation: str, id: str | None = None) -> Envelope:
    data = HumanAnswered(
        request_id=derive_id("req", run_id, responder),
        run_id=run_id,
        recipient=responder,
        responder=responder,
        answer=OptionAnswer(option_id="yes"),
        channel="web",
        waited_s=3.0,
    )
    return _ev(data, run_id, correlation=correlation, id=id)


def _fold(events: list[Envelope], saga: SagaParticipants | None = None) -> SagaParticipants:
    saga = saga or new_saga(PARENT)
    for event in events:
        saga = apply(saga, event) or saga
    return saga


def test_a_saga_of_two_runs_and_a_human() -> None:
    saga = _fold(
        [
            _started(PARENT, "planner", title="Plan the release"),
            _started(CHILD, "reviewer", parent=PARENT, title="Review PR 42"),
            _answered(CHILD, "user:alice", correlation=PARENT),
            _ev(RunCompleted(run_id=CHILD, result="ok", turns=3), CHILD, correlation=PARENT),
        ]
    )
    assert saga.runs[CHILD].parent_run_id == PARENT
    assert saga.humans["alice"].run_ids == [CHILD]
    assert collaborators(saga) == [
        Collaborator(id="agent:planner", kind="agent", role="planner-role", task="Plan the release",
                     status="running", run_id=PARENT),
        Collaborator(id="agent:reviewer", kind="agent", role="reviewer-role", task="Review PR 42",
                     status="completed", run_id=CHILD),
        Collaborator(id="human:alice", kind="human", status="answered", run_id=CHILD),
    ]  # fmt: skip


def test_saga_id_is_the_correlation_id_falling_back_to_the_run() -> None:
    assert saga_id_of(_started(CHILD, "a", parent=PARENT)) == PARENT
    assert saga_id_of(_started(PARENT, "a")) == PARENT
    bare = Envelope.model_validate({**_started(CHILD, "a").model_dump(), "runid": None, "correlationid": None})
    assert saga_id_of(bare) == CHILD


def test_an_applied_event_changes_nothing() -> None:
    event = _started(PARENT, "planner")
    saga = _fold([event])
    assert apply(saga, event) is None


def test_the_same_fact_under_a_new_event_id_does_not_double_anything() -> None:
    first = _answered(CHILD, "user:alice", correlation=PARENT, id="evt-a")
    again = _answered(CHILD, "user:alice", correlation=PARENT, id="evt-b")
    saga = _fold([_started(CHILD, "reviewer", parent=PARENT), first, again])
    assert saga.humans["alice"].run_ids == [CHILD]
    assert [c.id for c in collaborators(saga)] == ["agent:reviewer", "human:alice"]


def test_terminal_events_before_run_started_create_the_entry_and_stay_final() -> None:
    failed = _ev(RunFailed(run_id=CHILD, reason="tool", error="boom"), CHILD, correlation=PARENT)
    saga = _fold([failed])
    assert saga.runs[CHILD].status is RunState.FAILED
    assert collaborators(saga) == [Collaborator(id=f"run:{CHILD}", kind="run", status="failed", run_id=CHILD)]
    # run.started arriving late fills in who the run is but does not bring it back to life
    saga = _fold([_started(CHILD, "reviewer", parent=PARENT)], saga)
    assert saga.runs[CHILD].status is RunState.FAILED
    assert saga.runs[CHILD].agent == "reviewer"
    # a second, different terminal event does not overwrite the first
    saga = _fold([_ev(RunCompleted(run_id=CHILD, result="x", turns=1), CHILD, correlation=PARENT)], saga)
    assert saga.runs[CHILD].status is RunState.FAILED


def test_an_answer_for_an_unseen_run_creates_it_resuming() -> None:
    saga = _fold([_answered(CHILD, "user:bob", correlation=PARENT)])
    assert saga.runs[CHILD].status is RunState.RESUMING
    assert [c.id for c in collaborators(saga)] == [f"run:{CHILD}", "human:bob"]


def test_humans_are_users_only_and_keep_the_latest_answer_time() -> None:
    later = _answered(PARENT, "user:alice", correlation=PARENT).model_copy(update={"time": T0 + timedelta(hours=1)})
    saga = _fold(
        [
            _answered(PARENT, "user:alice", correlation=PARENT),
            later,
            _answered(CHILD, "alice", correlation=PARENT),  # a bare id is a user id
            _answered(PARENT, "service:human-interaction", correlation=PARENT),  # not a person
        ]
    )
    assert set(saga.humans) == {"alice"}
    assert saga.humans["alice"].run_ids == sorted([PARENT, CHILD])
    assert saga.humans["alice"].last_answered_at == T0 + timedelta(hours=1)
    humans = [c for c in collaborators(saga) if c.kind == "human"]
    assert [(c.id, c.run_id) for c in humans] == sorted([("human:alice", PARENT), ("human:alice", CHILD)])


def test_task_is_the_title_cut_to_200_chars() -> None:
    saga = _fold([_started(PARENT, "planner", title="x" * 500)])
    (item,) = collaborators(saga)
    assert item.task == "x" * TASK_MAX


def test_runs_without_an_agent_id_are_listed_as_runs() -> None:
    saga = _fold([_started(PARENT, "")])
    assert [c.id for c in collaborators(saga)] == [f"run:{PARENT}"]


def test_order_is_deterministic_whatever_the_event_order() -> None:
    events = [
        _started(PARENT, "zed"),
        _started(CHILD, "amy", parent=PARENT),
        _answered(CHILD, "user:carol", correlation=PARENT),
        _answered(PARENT, "user:bob", correlation=PARENT),
    ]
    forward = collaborators(_fold(events))
    backward = collaborators(_fold(list(reversed(events))))
    assert forward == backward
    assert [c.id for c in forward] == ["agent:amy", "agent:zed", "human:bob", "human:carol"]


def test_applied_event_ids_are_bounded() -> None:
    saga = new_saga(PARENT)
    for n in range(APPLIED_EVENT_IDS_MAX + 10):
        saga = apply(saga, _answered(PARENT, "user:alice", correlation=PARENT, id=f"evt-{n}")) or saga
    assert len(saga.applied_event_ids) == APPLIED_EVENT_IDS_MAX
    assert saga.applied_event_ids[-1] == f"evt-{APPLIED_EVENT_IDS_MAX + 9}"
    assert saga.humans["alice"].run_ids == [PARENT]


def test_other_event_types_are_not_ours() -> None:
    requested = make_event(
        RunRequested(run_id=PARENT, agent="a", title="t", launch=LaunchSource(kind="api")),
        source="/test",
        run_id=PARENT,
    )
    assert apply(new_saga(PARENT), requested) is None


def test_invalid_data_is_refused() -> None:
    bad = _started(PARENT, "planner").model_copy(update={"data": {"run_id": PARENT}})
    with pytest.raises(InvalidEnvelope):
        apply(new_saga(PARENT), bad)


def test_keys_accept_run_ids_and_refuse_what_kv_cannot_hold() -> None:
    assert run_key(PARENT) == f"run.{PARENT}"
    assert saga_key(PARENT) == f"saga.{PARENT}"
    for bad in ("", "has space", "star*", "gt>", ".lead", "trail."):
        with pytest.raises(InvalidKey):
            run_key(bad)
