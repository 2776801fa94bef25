"""A run whose turn is with its external agent parks (AP-5), decided from plain data: no NATS, no clock but the
one passed in. The executor and cross-service tests (``test_external_turns.py``, ``tests/test_external_parking.py``)
check the same over real processes; these pin each decision: the park and its timer, the wake-up guarded by the
turn's wait id, the stale and early wake-ups, the deadline, a cancel.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from typing import Any

import pytest
from machine_support import T0, make_checkpoint, make_run

from temporality_protocol import LaunchSource, RunCancelled, RunFailed, RunResumed, RunState
from temporality_protocol.agent_tasks import task_id_for, turn_wait_id
from temporality_run_executor.agents import AgentCard, Limits, ProviderConfig
from temporality_run_executor.machine import (
    Agent,
    AgentActed,
    AgentLooked,
    AgentWorking,
    ArmAgentDeadline,
    ArmWatchdog,
    Attempt,
    Boundary,
    CallProvider,
    CancelRecorded,
    Decision,
    Incoming,
    LookForAction,
    Note,
    Parked,
    ProviderFailed,
    ProviderReplied,
    Publish,
    Retry,
    RunMovedOn,
    TakeLease,
    Transition,
    WatchdogFired,
    decide,
    drives,
    moved,
)
from temporality_run_executor.providers import AssistantTurn
from temporality_run_executor.records import AgentMail, CancelRequest, Checkpoint, Lease, RunRecord
from temporality_run_executor.tools import BUILTIN_TOOLS, ToolPolicy, ToolRegistry
from temporality_run_executor.watchdog import WatchdogPayload

RUN_ID = "run-park-1"
TASK_ID = task_id_for(RUN_ID)
CARD = AgentCard(
    id="ext",
    role="External",
    system_prompt="Decide.",
    tools=ToolPolicy(allow=["ask_human"]),
    provider=ProviderConfig(kind="external", agent_id="park-bot"),
    limits=Limits(max_compute_s=100),
)
AGENT = Agent(CARD, ToolRegistry(BUILTIN_TOOLS))
WAIT_ID = turn_wait_id(TASK_ID, 2)
ATTEMPT = Attempt(stream_seq=7, delivered=1, driver="drv/h1")
REPLY = ProviderReplied(turn=2, reply=AssistantTurn(content="Done"), elapsed_s=30.0)


_run = partial(make_run, RUN_ID, agent="ext", title="Decide", launch=LaunchSource(kind="webhook", trigger_id="t"))


def _parked(**changes: Any) -> RunRecord:
    """Parked on the agent's action for turn 2 since T0."""
    return _run(RunState.WAITING_FOR_AGENT, **({"waiting_request_id": WAIT_ID, "waiting_since": T0} | changes))


_ckpt = partial(make_checkpoint, RUN_ID, compute_s=40.0)


def _decide(
    run: RunRecord | None, incoming: Incoming, *, now: datetime = T0, ckpt: Checkpoint | None = None
) -> Decision:
    return decide(run, ckpt if ckpt is not None else _ckpt(), AGENT, incoming, now=now, attempt=ATTEMPT)


def _kinds(decision: Decision) -> list[str]:
    return [type(e).__name__ for e in decision.effects if not isinstance(e, Note)]


def _failed(decision: Decision) -> list[RunFailed]:
    return [e.data for e in decision.effects if isinstance(e, Publish) and isinstance(e.data, RunFailed)]


def test_an_agent_working_on_the_turn_parks_the_run_with_its_budget_left_as_the_deadline() -> None:
    decision = _decide(_run(RunState.RUNNING), AgentWorking(turn=2, agent_id="park-bot"))
    assert _kinds(decision) == ["ArmAgentDeadline", "TakeLease", "Transition"]  # the timer first, then the park
    arm, move = decision.effects[0], decision.effects[2]
    assert decision.effects[1] == TakeLease(Lease(holder="drv/h1", expires_at=T0 + timedelta(seconds=30)), renew=True)
    assert arm == ArmAgentDeadline(
        turn=1, agent_turn=2, deadline=T0 + timedelta(seconds=60), cause=ATTEMPT.cause("park")
    )
    assert move == Transition(RunState.WAITING_FOR_AGENT, {"waiting_request_id": WAIT_ID, "waiting_since": T0})
    assert decision.then == Parked()
    parked = moved(_run(RunState.RUNNING, lease=Lease(holder="drv/h1", expires_at=T0)), move.target, move.changes, T0)
    assert parked is not None
    assert parked.lease is None  # nobody drives a parked run


def test_a_run_asked_to_stop_while_its_turn_was_offered_is_cancelled_instead_of_parked() -> None:
    asked = CancelRequest(reason="not needed", requested_by="user:op", requested_at=T0, event_id="evt-c")
    decision = _decide(_run(RunState.RUNNING, cancel=asked), AgentWorking(turn=2, agent_id="park-bot"))
    assert [type(e.data) for e in decision.effects if isinstance(e, Publish)] == [RunCancelled]
    assert not [e for e in decision.effects if isinstance(e, ArmAgentDeadline)]


def test_the_action_for_the_parked_turn_reads_the_action() -> None:
    decision = _decide(_parked(), AgentActed(RUN_ID, TASK_ID, 2, "evt-a"))
    assert decision.effects == ()
    assert decision.then == LookForAction(2, cause="evt-a")


@pytest.mark.parametrize(
    ("run", "turn"),
    [
        pytest.param(_parked(), 1, id="an-earlier-turn"),
        pytest.param(_run(RunState.WAITING_FOR_HUMAN, waiting_request_id="hr-1"), 2, id="parked-on-a-person"),
        pytest.param(_run(RunState.RUNNING), 2, id="running-after-the-turn-committed"),
    ],
)
def test_an_action_for_another_wait_changes_nothing(run: RunRecord, turn: int) -> None:
    decision = _decide(run, AgentActed(RUN_ID, TASK_ID, turn, "evt-a"), ckpt=_ckpt(turn=2))
    assert decision.effects == (
        Note("agent.task.stale", fields={"turn": turn, "deadline": False, "state": run.state.value}),
    )
    assert decision.then is None


def test_an_action_before_the_park_is_committed_waits_for_the_live_driver_else_drives_the_run_on() -> None:
    """Turn 2 is not committed and the run is running: its driver (parking, or woken) has the action. Alive,
    the message is given back (the handler watches the lease); dead, this delivery drives from the checkpoint."""
    live = Lease(holder="drv/other", expires_at=T0 + timedelta(seconds=30))
    held = _decide(_run(RunState.RUNNING, lease=live), AgentActed(RUN_ID, TASK_ID, 2, "evt-a"))
    assert [type(e) for e in held.effects] == [Retry]
    assert isinstance(held.effects[0], Retry)
    assert held.effects[0].lost_race
    dead = Lease(holder="drv/other", expires_at=T0 - timedelta(seconds=1))
    recovered = _decide(_run(RunState.RUNNING, lease=dead), AgentActed(RUN_ID, TASK_ID, 2, "evt-a"))
    assert _kinds(recovered) == ["TakeLease", "Publish"]  # and the last turn's run.checkpointed again
    assert recovered.then == Boundary(recovery=True)


def test_the_action_wakes_the_run_once_guarded_by_the_wait_and_is_the_turn_s_reply() -> None:
    parked = _parked(waiting_since=T0 - timedelta(seconds=12))
    decision = _decide(parked, AgentLooked(turn=2, outcome=REPLY, cause="evt-acted"))
    assert _kinds(decision) == ["Transition", "TakeLease", "Transition", "ArmWatchdog", "Publish"]
    resuming, _, running, watchdog, resumed = decision.effects[:5]
    assert resuming == Transition(RunState.RESUMING, waiting_on=WAIT_ID)
    assert running == Transition(RunState.RUNNING, {"waiting_request_id": None, "waiting_since": None})
    assert watchdog == ArmWatchdog(1, 100, ATTEMPT.cause("agent-acted"))  # after the move: only the winner arms
    # ... and says the run resumed, after the move too: one run.resumed per wait, with the wait's id
    assert isinstance(resumed, Publish)
    assert resumed.id_parts == ("agent_action", WAIT_ID)
    assert resumed.causation == "evt-acted"
    assert resumed.data == RunResumed(
        run_id=RUN_ID, reason="agent_action", from_turn=1, request_id=WAIT_ID, waited_s=12.0
    )
    assert decision.then == REPLY
    # a second wake-up's compare-and-set finds the wait over (woken, and even parked again on a later turn)
    for later in (_run(RunState.RUNNING), _parked(waiting_request_id=turn_wait_id(TASK_ID, 3))):
        with pytest.raises(RunMovedOn):
            moved(later, RunState.RESUMING, {}, T0, waiting_on=WAIT_ID)


def test_no_action_at_the_deadline_fails_the_run_compute_timeout() -> None:
    decision = _decide(_parked(), AgentLooked(turn=2, outcome=None, deadline=True))
    (failed,) = _failed(decision)
    assert failed.reason == "compute_timeout"
    assert failed.error == (
        "external agent park-bot did not act on turn 2 within the run's compute budget (60s of 100s left when the "
        "turn was offered)"
    )


def test_an_action_after_the_budget_fails_the_run_even_if_it_wakes_it_first() -> None:
    late = ProviderReplied(turn=2, reply=AssistantTurn(content="Done"), elapsed_s=61.0)
    (failed,) = _failed(_decide(_parked(), AgentLooked(turn=2, outcome=late)))
    assert failed.reason == "compute_timeout"


def test_a_wake_up_without_an_action_before_the_deadline_leaves_the_run_parked() -> None:
    decision = _decide(_parked(), AgentLooked(turn=2, outcome=None))
    assert _kinds(decision) == []
    assert decision.then is None


def test_the_agent_s_failure_wakes_the_run_to_fail_as_a_provider_error() -> None:
    failure = ProviderFailed(turn=2, error="the external agent failed the task: no access", permanent=True)
    decision = _decide(_parked(), AgentLooked(turn=2, outcome=failure))
    assert decision.then == failure
    after = _decide(_run(RunState.RUNNING), failure)
    assert [f.reason for f in _failed(after)] == ["provider_error"]


def _fired(agent_turn: int | None) -> WatchdogFired:
    payload = WatchdogPayload(run_id=RUN_ID, turn=1, armed_at=T0, deadline=T0, agent_turn=agent_turn)
    return WatchdogFired(payload=payload, grace_s=300)


def test_the_deadline_firing_on_the_parked_turn_reads_the_action_one_last_time() -> None:
    decision = _decide(_parked(), _fired(2))
    assert decision.then == LookForAction(2, deadline=True)


def test_the_deadline_firing_on_a_driven_run_is_a_watchdog_from_now_on() -> None:
    """Woken meanwhile (its arm lost), or its parking driver died before it parked: never failed by the
    deadline while it is being driven; an ordinary watchdog is armed instead."""
    decision = _decide(_run(RunState.RUNNING), _fired(2))
    assert _kinds(decision) == ["ArmWatchdog"]
    assert not _failed(decision)


def test_the_deadline_of_an_older_turn_and_a_person_s_wait_ignore_it() -> None:
    assert not _failed(_decide(_parked(waiting_request_id=turn_wait_id(TASK_ID, 3)), _fired(2)))
    assert not _failed(_decide(_run(RunState.WAITING_FOR_HUMAN, waiting_request_id="hr-1"), _fired(2)))


def test_a_cancel_ends_a_parked_run_at_once() -> None:
    asked = CancelRequest(reason="not needed", requested_by="user:op", requested_at=T0, event_id="evt-c")
    decision = _decide(_parked(cancel=asked), CancelRecorded("user:op"))
    assert [type(e.data) for e in decision.effects if isinstance(e, Publish)] == [RunCancelled]
    assert any(isinstance(e, Transition) and e.target is RunState.CANCELLED for e in decision.effects)


def test_a_dead_lettered_action_drives_only_the_run_parked_on_it() -> None:
    assert drives(_parked(), _ckpt(), "agent.task.acted", WAIT_ID)
    assert not drives(_parked(), _ckpt(), "agent.task.acted", turn_wait_id(TASK_ID, 1))
    assert not drives(_run(RunState.RUNNING), _ckpt(), "agent.task.acted", WAIT_ID)


def test_a_run_asked_to_stop_while_its_action_was_read_is_cancelled_not_woken_nor_failed() -> None:
    asked = CancelRequest(reason="not needed", requested_by="user:op", requested_at=T0, event_id="evt-c")
    for looked in (AgentLooked(turn=2, outcome=REPLY), AgentLooked(turn=2, outcome=None, deadline=True)):
        decision = _decide(_parked(cancel=asked), looked)
        assert [type(e.data) for e in decision.effects if isinstance(e, Publish)] == [RunCancelled]
        assert decision.then is None


def test_a_recovery_of_an_external_agent_s_run_keeps_its_agent_messages_for_the_next_boundary() -> None:
    """An agent message queued while the dead driver's turn was with the agent: the turn called again may have
    been offered (same id: an offer with the message would be dropped) or acted on (the message would land before
    the action, outside every offer). So the recovering boundary calls the turn without it; the boundary after
    that turn's commit frames it (the next offer carries it). A hosted agent's recovery frames it at once."""
    mail = AgentMail(key="evt-ask", kind="ask", request_id="req-1", sender="agent:lead", mode="async", text="Q?")
    queued = _ckpt(turn=1, inbox=[mail])
    running = _run(RunState.RUNNING, lease=Lease(holder="drv/h1", expires_at=T0 + timedelta(seconds=30)))
    recovering = _decide(running, Boundary(recovery=True), ckpt=queued)
    assert _kinds(recovering) == ["ArmWatchdog"]
    assert isinstance(recovering.then, CallProvider)
    assert recovering.then.turn == 2
    assert recovering.then.messages == queued.messages  # the message stays queued, not in the turn's conversation
    after_commit = _decide(running, Boundary(), ckpt=queued)
    assert _kinds(after_commit) == ["DeliverMail"]
    hosted = Agent(
        CARD.model_copy(update={"provider": ProviderConfig(kind="scripted", script="reviewer")}), AGENT.tools
    )
    framed = decide(running, queued, hosted, Boundary(recovery=True), now=T0, attempt=ATTEMPT)
    assert _kinds(framed) == ["DeliverMail"]
