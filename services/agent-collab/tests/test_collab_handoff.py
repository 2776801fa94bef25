"""The saga projection of a handoff (AP-6), pure: ``agent.handed_off`` puts the child in the handing run's
saga with relation ``handoff``, whatever order it and the child's ``run.started`` arrive in."""

from __future__ import annotations

from datetime import UTC, datetime

from temporality_agent_collab.participants import HANDLED_TYPES, apply, collaborators, new_saga, run_of
from temporality_protocol import (
    AgentHandedOff,
    Collaborator,
    Envelope,
    HandoffDocument,
    RunStarted,
    make_event,
)

SAGA = "saga-ho"
PARENT = "run-lead"
CHILD = "run-child"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _handed() -> Envelope:
    data = AgentHandedOff(
        handoff_id="ho-1",
        parent_run_id=PARENT,
        parent_agent="lead",
        child_run_id=CHILD,
        agent="finisher",
        document=HandoffDocument(objective="Finish"),
    )
    return make_event(data, source="/test", run_id=PARENT, correlation_id=SAGA, id="evt-ho", time=T0)


def _started(run_id: str, agent: str, parent: str | None = None) -> Envelope:
    data = RunStarted(run_id=run_id, agent=agent, role=agent, title=f"{agent} task", parent_run_id=parent)
    return make_event(data, source="/test", run_id=run_id, correlation_id=SAGA, id=f"evt-st-{run_id}", time=T0)


def _project(*events: Envelope) -> list[Collaborator]:
    saga = new_saga(SAGA)
    for event in events:
        saga = apply(saga, event) or saga
    return collaborators(saga)


def test_the_child_is_listed_as_a_handoff_in_either_order() -> None:
    assert "agent.handed_off" in HANDLED_TYPES
    assert run_of(_handed()) == PARENT  # the handing run's saga is the one the child joins
    events = [_started(PARENT, "lead"), _handed(), _started(CHILD, "finisher", PARENT)]
    expected = [
        Collaborator(
            id="agent:finisher",
            kind="agent",
            role="finisher",
            task="finisher task",
            status="running",
            run_id=CHILD,
            relation="handoff",
            parent_run_id=PARENT,
        ),
        Collaborator(id="agent:lead", kind="agent", role="lead", task="lead task", status="running", run_id=PARENT),
    ]
    assert _project(*events) == expected
    assert _project(events[0], events[2], events[1]) == expected


def test_before_the_child_starts_it_is_listed_pending_and_a_redelivery_changes_nothing() -> None:
    saga = apply(apply(new_saga(SAGA), _started(PARENT, "lead")) or new_saga(SAGA), _handed())
    assert saga is not None
    assert apply(saga, _handed()) is None
    (child,) = [c for c in collaborators(saga) if c.run_id == CHILD]
    assert (child.id, child.status, child.relation, child.parent_run_id) == (
        "agent:finisher",
        "pending",
        "handoff",
        PARENT,
    )
