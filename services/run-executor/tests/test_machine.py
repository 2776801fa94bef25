"""The run machine, decided from plain data: no NATS, no provider, no clock but the one passed in.

These pin the rules the driver relies on (turn boundaries, deterministic ids, limits that exclude
waiting, idempotent outcomes, cancels) one decision at a time; the executor tests check the same over a
real nats-server.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import pytest
from executor_support import REVIEWER, run_requested
from machine_support import T0, late_agent_answer, make_checkpoint, make_run

from temporality_bus import PermanentError
from temporality_protocol import (
    HumanAnswered,
    HumanExpired,
    HumanPolicy,
    HumanRejected,
    HumanRequested,
    OptionAnswer,
    RunCancelled,
    RunCheckpointed,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunInputAfterEnd,
    RunRequested,
    RunResumed,
    RunStarted,
    RunState,
    RunToolCalled,
    RunUsage,
    TextAnswer,
    ToolFailed,
    derive_id,
)
from temporality_protocol.agent_tasks import task_id_for
from temporality_protocol.events import Renotify, TimeoutPolicy
from temporality_run_executor.agents import Limits
from temporality_run_executor.machine import (
    AdoptCancelMarker,
    Agent,
    AgentActed,
    ApplyResult,
    ArmRetention,
    ArmWatchdog,
    Ask,
    Attempt,
    Boundary,
    CallProvider,
    CallTool,
    CancelRecorded,
    CancelRequested,
    CreateCheckpoint,
    CreateRun,
    DeadLettered,
    Decision,
    DisarmWatchdog,
    FlagCancel,
    Incoming,
    MarkCancel,
    MarkPublished,
    Note,
    Parked,
    ProviderFailed,
    ProviderReplied,
    Publish,
    Reject,
    Requested,
    Retry,
    RunMovedOn,
    SaveCheckpoint,
    TakeLease,
    ToolBroke,
    ToolOutput,
    ToolReturned,
    Transition,
    WatchdogFired,
    apply_result,
    decide,
    drives,
    ending_event,
    flagged,
    human_outcome,
    moved,
    published,
)
from temporality_run_executor.providers import AssistantTurn
from temporality_run_executor.records import (
    CancelRequest,
    Checkpoint,
    Lease,
    PendingAsk,
    RunRecord,
    ToolCall,
    Usage,
)
from temporality_run_executor.results import parse_result, tool_content
from temporality_run_executor.tools import BUILTIN_TOOLS, ToolPolicy, ToolRegistry
from temporality_run_executor.watchdog import WatchdogPayload

RUN_ID = "run-m-1"
AGENT = Agent(
    REVIEWER.model_copy(update={"tools": ToolPolicy(allow=["get_input", "ask_human"])}), ToolRegistry(BUILTIN_TOOLS)
)
ASK_ARGS: dict[str, Any] = {"recipient": "user:alice", "question": "Keep v1?"}
REQUEST_ID = derive_id("hr", RUN_ID, "2", "0")


_run = partial(make_run, RUN_ID, human=HumanPolicy(allowed_recipients=["user:alice"], default_timeout_s=600))


def _pending(turn: int = 2, request_id: str = REQUEST_ID, asked_at: datetime = T0) -> PendingAsk:
    return PendingAsk(request_id=request_id, call_id="call-ask", turn=turn, asked_at=asked_at, arguments=ASK_ARGS)


_ckpt = partial(make_checkpoint, RUN_ID)


def _decide(
    run: RunRecord | None,
    ckpt: Checkpoint | None,
    incoming: Incoming,
    *,
    now: datetime = T0,
    attempt: Attempt | None = None,
    agent: Agent | None = AGENT,
) -> Decision:
    return decide(run, ckpt, agent, incoming, now=now, attempt=attempt)


def _published(decision: Decision) -> list[Any]:
    return [e.data for e in decision.effects if isinstance(e, Publish)]


def _kinds(decision: Decision) -> list[str]:
    return [type(e).__name__ for e in decision.effects if not isinstance(e, Note)]


def _answered(request_id: str = REQUEST_ID, answer: OptionAnswer | TextAnswer | None = None) -> HumanAnswered:
    return HumanAnswered(
        request_id=request_id,
        run_id=RUN_ID,
        recipient="user:alice",
        responder="user:alice",
        answer=answer or OptionAnswer(option_id="keep-v1", label="Keep v1"),
        channel="web",
        waited_s=86400.0,
    )


# --------------------------------------------------------------------------- start
def test_a_new_run_is_created_once_running_then_started_and_driven() -> None:
    event = run_requested(RUN_ID)
    incoming = Requested(request=event.payload(RunRequested), correlation_id=RUN_ID)
    first = _decide(None, None, incoming)
    assert _kinds(first) == ["CreateRun"]
    assert first.then == incoming  # decided again once the record is there
    (create,) = first.effects
    assert isinstance(create, CreateRun)
    # one record write before run.started: created running, held by the handler creating it
    assert create.record.state is RunState.RUNNING
    assert create.record.lease == Lease(holder="driver", expires_at=T0 + timedelta(seconds=30))
    assert create.record.created_at == T0

    # not started yet (no checkpoint): first the driver looks for a cancel that came before the run (none here)
    look = _decide(create.record, None, incoming)
    assert look == Decision((AdoptCancelMarker(),), dataclasses.replace(incoming, marker_checked=True))
    incoming = dataclasses.replace(incoming, marker_checked=True)
    started = _decide(create.record, None, incoming, attempt=Attempt(stream_seq=7, delivered=1))
    # its lease is taken already: the start's facts and first checkpoint in one batch, no record write
    assert _kinds(started) == ["Publish", "ArmWatchdog", "Publish", "CreateCheckpoint"]
    created, arm, begun, _ = started.effects
    assert isinstance(created, Publish)
    assert isinstance(created.data, RunCreated)
    assert arm == ArmWatchdog(0, REVIEWER.limits.max_compute_s, ("start", "7", "1"))
    assert isinstance(begun, Publish)
    assert isinstance(begun.data, RunStarted)
    assert begun.data.agent_card is not None
    assert begun.data.agent_card.tools == ["get_input", "ask_human"]
    assert started.then == Boundary()

    # an unknown card's run is created pending (then failed: below)
    (pending,) = _decide(None, None, incoming, agent=None).effects
    assert isinstance(pending, CreateRun)
    assert pending.record.state is RunState.PENDING


def test_a_run_created_running_whose_driver_died_before_its_first_checkpoint_starts_again() -> None:
    """A redelivery of its run.requested: the creator's live lease is waited out; once it lapsed the marker is
    looked for again, and the run started the same way with the lease taken; a cancel recorded meanwhile cancels
    it, never started."""
    incoming = Requested(request=run_requested(RUN_ID).payload(RunRequested), correlation_id=RUN_ID)
    other = Lease(holder="dead-driver", expires_at=T0 + timedelta(seconds=10))
    created = _run(RunState.RUNNING, lease=other)
    held = _decide(created, None, incoming)
    assert [type(e) for e in held.effects if not isinstance(e, Note)] == [Publish, Retry]
    later = T0 + timedelta(seconds=11)
    look = _decide(created, None, incoming, now=later)
    assert look == Decision((AdoptCancelMarker(),), dataclasses.replace(incoming, marker_checked=True))
    incoming = dataclasses.replace(incoming, marker_checked=True)
    started = _decide(created, None, incoming, now=later, attempt=Attempt(stream_seq=7, delivered=2))
    assert _kinds(started) == ["TakeLease", "Publish", "ArmWatchdog", "Publish", "CreateCheckpoint"]
    assert [type(d) for d in _published(started)] == [RunCreated, RunStarted]
    cancel = CancelRequest(reason="stop", requested_by="on-call", requested_at=T0, event_id="evt-c")
    cancelled = _decide(_run(RunState.RUNNING, lease=other, cancel=cancel), None, incoming, now=later)
    assert [type(d) for d in _published(cancelled)] == [RunCreated, RunCancelled]


def test_a_run_requested_again_while_running_recovers_from_its_checkpoint() -> None:
    incoming = Requested(request=run_requested(RUN_ID).payload(RunRequested), correlation_id=RUN_ID)
    decision = _decide(_run(RunState.RUNNING), _ckpt(turn=3), incoming, attempt=Attempt(stream_seq=7, delivered=2))
    resumed = [d for d in _published(decision) if isinstance(d, RunResumed)]
    assert resumed == [RunResumed(run_id=RUN_ID, reason="recovery", from_turn=3)]
    recovery = next(e for e in decision.effects if isinstance(e, Publish) and isinstance(e.data, RunResumed))
    assert recovery.id_parts == ("recovery", "7", "2")
    # the last committed turn's run.checkpointed again: its driver may have died between commit and publish
    again = next(e for e in decision.effects if isinstance(e, Publish) and isinstance(e.data, RunCheckpointed))
    assert (again.data, again.id_parts) == (RunCheckpointed(run_id=RUN_ID, checkpoint_id="ckpt-3", turn=3), ("3",))
    assert decision.then == Boundary(recovery=True)
    # parked, resuming or finished: a duplicate request changes nothing but its run.created
    for state in (RunState.WAITING_FOR_HUMAN, RunState.RESUMING, RunState.COMPLETED):
        duplicate = _decide(_run(state), _ckpt(), incoming)
        assert [type(d) for d in _published(duplicate)] == [RunCreated]
        assert duplicate.then is None


def test_an_unknown_agent_fails_the_run() -> None:
    incoming = Requested(
        request=run_requested(RUN_ID).payload(RunRequested), correlation_id=RUN_ID, marker_checked=True
    )
    decision = _decide(_run(RunState.PENDING), None, incoming, agent=None)
    assert _kinds(decision) == ["Publish", "Transition", "Publish", "DisarmWatchdog", "ArmRetention", "MarkPublished"]
    failed = _published(decision)[1]
    assert isinstance(failed, RunFailed)
    assert failed.reason == "unknown_agent"


# --------------------------------------------------------------------------- turns
def test_a_boundary_starts_a_turn_with_the_remaining_budget() -> None:
    decision = _decide(_run(RunState.RUNNING), _ckpt(turn=2, compute_s=100.0), Boundary())
    renew = TakeLease(Lease(holder="driver", expires_at=T0 + timedelta(seconds=30)), renew=True)
    assert decision.effects == (renew, ArmWatchdog(2, 900.0, ("turn", "0", "1")))
    call = decision.then
    assert isinstance(call, CallProvider)
    assert (call.turn, call.budget_s, call.context.turn) == (3, 800.0, 3)
    assert [spec.name for spec in call.tools] == ["get_input", "ask_human"]


def test_limits_exclude_waiting_time() -> None:
    # parked for a week after 10 s of compute, against a 60 s budget: the next turn starts
    agent = Agent(AGENT.card.model_copy(update={"limits": Limits(max_compute_s=60.0)}), AGENT.tools)
    ckpt = _ckpt(turn=2, compute_s=10.0, applied_requests=[REQUEST_ID])
    resumed = _run(RunState.RUNNING, created_at=T0 - timedelta(days=7))
    decision = _decide(resumed, ckpt, Boundary(), now=T0 + timedelta(days=7), agent=agent)
    assert isinstance(decision.then, CallProvider)
    assert decision.then.budget_s == 50.0
    # and the turn's own compute is what is added to the checkpoint
    reply = AssistantTurn(tool_calls=[ToolCall(id="call-read", name="get_input")])
    asked = _decide(resumed, ckpt, ProviderReplied(turn=3, reply=reply, elapsed_s=0.5), agent=agent)
    assert isinstance(asked.then, CallTool)
    done = _decide(resumed, ckpt, ToolReturned(asked.then.turn, 0, ToolOutput("{}"), elapsed_s=1.5), agent=agent)
    (saved,) = [e for e in done.effects if isinstance(e, SaveCheckpoint)]
    assert saved.checkpoint.compute_s == 11.5
    # computing past the budget fails the run at the next boundary
    spent = _decide(resumed, ckpt.model_copy(update={"compute_s": 60.0}), Boundary(), agent=agent)
    (failed,) = [d for d in _published(spent) if isinstance(d, RunFailed)]
    assert failed.reason == "compute_timeout"


@pytest.mark.parametrize(
    ("ckpt", "limits", "reason"),
    [
        (_ckpt(turn=20), Limits(), "max_turns"),
        (_ckpt(usage=Usage(total_tokens=100)), Limits(max_tokens=100), "token_limit"),
    ],
)
def test_a_limit_reached_at_a_boundary_fails_the_run(ckpt: Checkpoint, limits: Limits, reason: str) -> None:
    agent = Agent(AGENT.card.model_copy(update={"limits": limits}), AGENT.tools)
    decision = _decide(_run(RunState.RUNNING), ckpt, Boundary(), agent=agent)
    (failed,) = _published(decision)
    assert isinstance(failed, RunFailed)
    assert failed.reason == reason
    assert decision.then is None


def test_a_final_answer_completes_the_run_with_its_usage() -> None:
    reply = AssistantTurn(content="LGTM", usage=Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5))
    ckpt = _ckpt(turn=1, usage=Usage(prompt_tokens=7, completion_tokens=3, total_tokens=10), tool_calls=2)
    decision = _decide(_run(RunState.RUNNING), ckpt, ProviderReplied(turn=2, reply=reply, elapsed_s=0.1))
    totals = RunUsage(turns=2, tool_calls=2, prompt_tokens=10, completion_tokens=5, total_tokens=15)
    metrics, *ended = _published(decision)  # AP-9: the turn's metrics first (test_machine_streaming.py)
    assert (metrics.kind, metrics.data["total_tokens"]) == ("metrics", 5)
    assert ended == [RunCompleted(run_id=RUN_ID, result="LGTM", turns=2, usage=totals)]
    (move,) = [e for e in decision.effects if isinstance(e, Transition)]
    assert move.target is RunState.COMPLETED
    assert move.changes["usage"] == totals


def test_every_ending_carries_the_run_totals() -> None:
    """Failures and cancels carry the committed turns' totals too; a turn that commits adds its calls."""
    ckpt = _ckpt(turn=3, usage=Usage(prompt_tokens=30, completion_tokens=6, total_tokens=36), tool_calls=4)
    committed = RunUsage(turns=3, tool_calls=4, prompt_tokens=30, completion_tokens=6, total_tokens=36)
    limited = Agent(AGENT.card.model_copy(update={"limits": Limits(max_turns=3)}), AGENT.tools)
    (failed,) = _published(_decide(_run(RunState.RUNNING), ckpt, Boundary(), agent=limited))
    assert isinstance(failed, RunFailed)
    assert (failed.reason, failed.usage) == ("max_turns", committed)
    request = CancelRequest(reason="stop", requested_by="on-call", requested_at=T0, event_id="evt-c")
    (cancelled,) = _published(_decide(_run(RunState.RUNNING, cancel=request), ckpt, Boundary()))
    assert isinstance(cancelled, RunCancelled)
    assert cancelled.usage == committed
    # a turn with two tool calls commits them into the checkpoint's count
    calls = [ToolCall(id=f"c{i}", name="get_input") for i in range(2)]
    reply = AssistantTurn(content=None, tool_calls=calls, usage=Usage(prompt_tokens=1, total_tokens=1))
    decision = _decide(_run(RunState.RUNNING), ckpt, ProviderReplied(turn=4, reply=reply, elapsed_s=0.1))
    assert isinstance(decision.then, CallTool)
    turn = decision.then.turn
    for index in range(2):
        returned = ToolReturned(turn=turn, index=index, outcome=ToolOutput("{}"), elapsed_s=0.2)
        decision = _decide(_run(RunState.RUNNING), ckpt, returned)
        if isinstance(decision.then, CallTool):
            turn = decision.then.turn
    (save,) = [e for e in decision.effects if isinstance(e, SaveCheckpoint)]
    assert (save.checkpoint.turn, save.checkpoint.tool_calls, save.checkpoint.usage.total_tokens) == (4, 6, 37)


def test_a_reply_for_a_run_that_moved_on_meanwhile_is_dropped() -> None:
    reply = AssistantTurn(content="late")
    decision = _decide(_run(RunState.FAILED), _ckpt(), ProviderReplied(turn=2, reply=reply, elapsed_s=900))
    assert _kinds(decision) == []
    assert decision.then is None


def test_tool_calls_run_in_order_refusals_answered_at_once_asks_park_together() -> None:
    calls = [
        ToolCall(id="call-read", name="get_input"),
        ToolCall(id="call-rm", name="delete_repository", arguments={"name": "x"}),
        ToolCall(id="call-ask", name="ask_human", arguments=ASK_ARGS),
        ToolCall(id="call-ask2", name="ask_human", arguments=ASK_ARGS),
    ]
    reply = AssistantTurn(content="Reading.", tool_calls=calls)
    run, ckpt = _run(RunState.RUNNING), _ckpt(turn=1)
    first = _decide(run, ckpt, ProviderReplied(turn=2, reply=reply, elapsed_s=0.2))
    assert first.effects == ()  # nothing before the first call (the turn's metrics come after its commit)
    call = first.then
    assert isinstance(call, CallTool)
    assert call.index == 0
    assert isinstance(call.turn.plans[2], Ask)
    assert call.turn.plans[2].pending.request_id == derive_id("hr", RUN_ID, "2", "2")
    assert isinstance(call.turn.plans[3], Ask)  # HUM-7: both asked (test_parallel_asks.py)

    done = _decide(run, ckpt, ToolReturned(call.turn, 0, ToolOutput('{"pr": 42}'), elapsed_s=0.3))
    called = [d for d in _published(done) if isinstance(d, RunToolCalled)]
    assert [(c.call_id, c.turn) for c in called] == [("call-read", 2), ("call-rm", 2)]
    assert json.loads(called[1].result_preview)["error"].startswith("no tool named 'delete_repository'")
    ids = [e.id_parts for e in done.effects if isinstance(e, Publish) and isinstance(e.data, RunToolCalled)]
    assert ids == [("2", "0"), ("2", "1")]  # (turn, call index): a replay republishes them
    saves = [e for e in done.effects if isinstance(e, SaveCheckpoint)]
    assert len(saves) == 1
    saved = saves[0].checkpoint
    assert saved.turn == 2
    assert saved.checkpoint_id == derive_id("ckpt", RUN_ID, "2")
    assert saved.pending is not None
    assert saved.pending.call_id == "call-ask"
    assert [p.call_id for p in saved.more_pending] == ["call-ask2"]
    assert saved.malformed_tool_calls == 1
    assert [(m.role, m.tool_call_id) for m in saved.messages[2:]] == [
        ("assistant", None),
        ("tool", "call-read"),
        ("tool", "call-rm"),
    ]
    checkpointed, metrics = _published(done)[-2:]  # the turn's metrics right after its commit (AP-9)
    assert checkpointed == RunCheckpointed(run_id=RUN_ID, checkpoint_id=saved.checkpoint_id, turn=2)
    assert (metrics.kind, metrics.turn) == ("metrics", 2)
    assert done.then == Boundary()  # where it parks


def test_the_same_reply_decided_twice_gives_the_same_ids() -> None:
    reply = AssistantTurn(tool_calls=[ToolCall(id="call-ask", name="ask_human", arguments=ASK_ARGS)])
    run, ckpt = _run(RunState.RUNNING), _ckpt(turn=1)
    once = _decide(run, ckpt, ProviderReplied(turn=2, reply=reply, elapsed_s=0.1))
    again = _decide(run, ckpt, ProviderReplied(turn=2, reply=reply, elapsed_s=0.4), now=T0 + timedelta(minutes=5))
    (first,) = [e for e in once.effects if isinstance(e, SaveCheckpoint)]
    (second,) = [e for e in again.effects if isinstance(e, SaveCheckpoint)]
    assert first.checkpoint.pending is not None
    assert second.checkpoint.pending is not None
    assert first.checkpoint.pending.request_id == second.checkpoint.pending.request_id == REQUEST_ID
    assert first.checkpoint.checkpoint_id == second.checkpoint.checkpoint_id


def test_a_tool_that_broke_is_a_tool_failed_and_an_error_for_the_model() -> None:
    reply = AssistantTurn(tool_calls=[ToolCall(id="call-read", name="get_input")])
    run, ckpt = _run(RunState.RUNNING), _ckpt(turn=1)
    call = _decide(run, ckpt, ProviderReplied(turn=2, reply=reply, elapsed_s=0.1)).then
    assert isinstance(call, CallTool)
    done = _decide(run, ckpt, ToolReturned(call.turn, 0, ToolBroke("RuntimeError: disk gone"), elapsed_s=0.2))
    failed, called, _, _ = _published(done)  # ..., run.checkpointed, the turn's metrics (AP-9)
    assert failed == ToolFailed(
        run_id=RUN_ID, turn=2, call_id="call-read", tool="get_input", error="RuntimeError: disk gone"
    )
    assert isinstance(called, RunToolCalled)
    assert json.loads(called.result_preview) == {"error": "the tool 'get_input' failed: RuntimeError: disk gone"}
    assert not [d for d in _published(done) if isinstance(d, RunFailed)]


def test_too_many_malformed_calls_fail_the_run_instead_of_committing() -> None:
    agent = Agent(AGENT.card.model_copy(update={"limits": Limits(max_malformed_tool_calls=1)}), AGENT.tools)
    reply = AssistantTurn(tool_calls=[ToolCall(id="c", name="get_input", invalid_arguments="nope")])
    ckpt = _ckpt(turn=1, malformed_tool_calls=1)
    decision = _decide(_run(RunState.RUNNING), ckpt, ProviderReplied(turn=2, reply=reply, elapsed_s=0.1), agent=agent)
    assert not [e for e in decision.effects if isinstance(e, SaveCheckpoint)]
    assert [d.reason for d in _published(decision) if isinstance(d, RunFailed)] == ["malformed_tool_calls"]


@pytest.mark.parametrize(("permanent", "attempt", "fails"), [(False, 1, False), (False, 8, True), (True, 1, True)])
def test_a_provider_failure_is_retried_until_it_is_permanent_or_the_last_delivery(
    permanent: bool, attempt: int, fails: bool
) -> None:
    failure = ProviderFailed(turn=2, error="503: overloaded", permanent=permanent)
    decision = _decide(_run(RunState.RUNNING), _ckpt(), failure, attempt=Attempt(delivered=attempt, max_deliver=8))
    if fails:
        assert [d.reason for d in _published(decision) if isinstance(d, RunFailed)] == ["provider_error"]
    else:
        assert decision.effects == (Retry("503: overloaded"),)


def test_a_provider_call_that_ends_on_a_cancel_cancels_the_run_instead_of_failing_it() -> None:
    """An external agent's wait ends as soon as the run is asked to stop (ProviderFailed): the record, read
    afresh, holds the cancel, and the run is cancelled as asked -- not failed with provider_error."""
    request = CancelRequest(reason="not needed", requested_by="on-call", requested_at=T0, event_id="evt-c")
    failure = ProviderFailed(
        turn=2, error="the run was cancelled while external agent x worked on turn 2", permanent=True
    )
    decision = _decide(_run(RunState.RUNNING, cancel=request), _ckpt(), failure)
    (cancelled,) = [d for d in _published(decision) if isinstance(d, RunCancelled)]
    assert cancelled.reason == "not needed (requested by on-call)"
    assert not [d for d in _published(decision) if isinstance(d, RunFailed)]


# --------------------------------------------------------------------------- parking and outcomes
def test_a_pending_ask_parks_the_run_without_a_watchdog() -> None:
    decision = _decide(_run(RunState.RUNNING), _ckpt(turn=2, pending=_pending()), Boundary())
    # the move renews the parking handler's lease in the same compare-and-set: a driver that lost it parks nothing
    assert _kinds(decision) == ["Publish", "DisarmWatchdog", "TakeLease", "Transition"]
    (guard,) = [e for e in decision.effects if isinstance(e, TakeLease)]
    assert guard.renew
    (requested,) = _published(decision)
    assert isinstance(requested, HumanRequested)
    assert (requested.request_id, requested.timeout_s) == (REQUEST_ID, 600)
    assert requested.expires_at == T0 + timedelta(seconds=600)  # from the ask's time, not the clock
    (move,) = [e for e in decision.effects if isinstance(e, Transition)]
    assert move == Transition(RunState.WAITING_FOR_HUMAN, {"waiting_request_id": REQUEST_ID, "waiting_since": T0})
    assert decision.then == Parked()
    assert _decide(_run(RunState.WAITING_FOR_HUMAN), None, Parked()).effects == ()


def test_a_timeout_default_the_question_does_not_offer_fails_that_question_at_its_deadline() -> None:
    """The trigger's ``on_timeout: {action: default, default_option: keep-v1}`` was written for one question; another
    question (options yes/no, or free text) is asked all the same, and fails the run at its deadline instead of
    being refused (the reminders stay)."""
    on_timeout = TimeoutPolicy(action="default", default_option="keep-v1", renotify=Renotify(every_s=60, max=1))
    policy = HumanPolicy(allowed_recipients=["user:alice"], default_timeout_s=600, on_timeout=on_timeout)
    offered = [{"id": "keep-v1", "label": "Keep v1"}, {"id": "drop-v1", "label": "Drop v1"}]
    other = [{"id": "yes", "label": "Yes"}, {"id": "no", "label": "No"}]
    for options, action, default in [(offered, "default", "keep-v1"), (other, "fail", None), ([], "fail", None)]:
        ask = PendingAsk(
            request_id=REQUEST_ID,
            call_id="call-ask",
            turn=2,
            asked_at=T0,
            arguments={**ASK_ARGS, "options": options},
        )
        run = make_run(RUN_ID, RunState.RUNNING, human=policy)
        (requested,) = _published(_decide(run, _ckpt(turn=2, pending=ask), Boundary()))
        assert isinstance(requested, HumanRequested)
        assert (requested.policy.on_timeout.action, requested.policy.on_timeout.default_option) == (action, default)
        assert requested.policy.on_timeout.renotify == on_timeout.renotify
        assert requested.policy.allowed_recipients == ["user:alice"]


def test_an_outcome_arriving_before_its_run_has_parked_is_applied_once_parked() -> None:
    outcome = human_outcome("human.answered", "evt-ans", _answered())
    ckpt = _ckpt(turn=2, pending=_pending())
    # the turn that asked is committed, the move to waiting_for_human is not: never mid-turn, retried
    early = _decide(_run(RunState.RUNNING), ckpt, outcome)
    assert early.effects == (Retry("the run has not finished parking on this request yet"),)
    # parked: it resumes (run.resumed, the watchdog back), applies the answer to the checkpoint, then moves
    # through resuming to running with the handler's lease in one compare-and-set, then drives
    waiting = _run(RunState.WAITING_FOR_HUMAN, waiting_request_id=REQUEST_ID, waiting_since=T0)
    resume = _decide(waiting, ckpt, outcome)
    assert _kinds(resume) == ["Publish", "ArmWatchdog", "ApplyResult", "Transition", "TakeLease", "Transition"]
    (resumed,) = _published(resume)
    assert resumed == RunResumed(run_id=RUN_ID, reason="answer", from_turn=2, request_id=REQUEST_ID, waited_s=86400.0)
    assert resume.effects[2] == ApplyResult(REQUEST_ID, tool_content(outcome.result))
    assert [e.target for e in resume.effects if isinstance(e, Transition)] == [RunState.RESUMING, RunState.RUNNING]
    assert resume.effects[-1] == Transition(RunState.RUNNING, {"waiting_request_id": None, "waiting_since": None})
    assert resume.then == Boundary()
    # a driver that died between the checkpoint and the record: the redelivery resumes the same way (the
    # apply then a no-op, :func:`apply_result`)
    again = _decide(waiting, _ckpt(turn=2, applied_requests=[REQUEST_ID]), outcome)
    assert _kinds(again) == _kinds(resume)
    # a record left in resuming (by a driver from before, or an elicitation's or an agent's resume): the
    # handler takes the lease, applies the outcome and drives
    apply = _decide(_run(RunState.RESUMING, waiting_request_id=REQUEST_ID), ckpt, outcome)
    assert isinstance(apply.effects[0], TakeLease)  # the handler that resumes it drives it
    assert apply.effects[1] == ApplyResult(REQUEST_ID, tool_content(outcome.result))
    assert apply.effects[2] == Transition(RunState.RUNNING, {"waiting_request_id": None, "waiting_since": None})
    assert apply.then == Boundary()
    # the handler that moved it to resuming a moment ago holds a fresh lease: it is not written again
    (lease,) = (e for e in resume.effects if isinstance(e, TakeLease))
    held = _run(RunState.RESUMING, waiting_request_id=REQUEST_ID, lease=lease.lease)
    assert _kinds(_decide(held, ckpt, outcome)) == ["ApplyResult", "Transition"]
    applied = apply_result(ckpt, REQUEST_ID, tool_content(outcome.result), T0)
    assert applied is not None
    assert applied.pending is None
    assert applied.applied_requests == [REQUEST_ID]
    last = applied.messages[-1]
    assert (last.role, last.name, last.tool_call_id) == ("tool", "ask_human", "call-ask")
    assert parse_result(last.content or "") == outcome.result


def test_a_repeated_outcome_for_an_applied_request_is_a_no_op() -> None:
    outcome = human_outcome("human.answered", "evt-dup", _answered())
    ckpt = _ckpt(turn=2, applied_requests=[REQUEST_ID])
    assert apply_result(ckpt, REQUEST_ID, tool_content(outcome.result), T0) is None
    # while the run waits on its next request: nothing but a log line
    later = _decide(_run(RunState.WAITING_FOR_HUMAN, waiting_request_id="hr-next"), ckpt, outcome)
    assert (_kinds(later), later.then) == ([], None)
    # after it finished (any ending): it was applied before the end, so this is its redelivery (its handler died
    # before the ack): no run.input_after_end
    for state in (RunState.COMPLETED, RunState.CANCELLED, RunState.FAILED):
        again = _decide(_run(state), ckpt, outcome)
        assert [type(e) for e in again.effects] == [ArmRetention, Note]
    # one it never applied: journaled as run.input_after_end, never applied
    for state in (RunState.COMPLETED, RunState.CANCELLED, RunState.FAILED):
        decision = _decide(_run(state), _ckpt(turn=2), outcome)
        assert decision.then is None
        after, retain = decision.effects  # its checkpoint still there: retention armed (again)
        assert retain == ArmRetention()
        assert isinstance(after, Publish)
        assert (after.id_parts, after.causation) == (("evt-dup",), "evt-dup")
        assert after.data == RunInputAfterEnd(
            run_id=RUN_ID,
            state=state.value,
            input_type="human.answered",
            input_id="evt-dup",
            request_id=REQUEST_ID,
            sender="user:alice",
            detail=f"run {RUN_ID} is {state.value}: the answer to {REQUEST_ID} was not applied",
        )
    # ... also when its card is gone meanwhile (never a run.failed for a finished run)
    assert _kinds(_decide(_run(RunState.COMPLETED), _ckpt(turn=2), outcome, agent=None)) == ["Publish", "ArmRetention"]
    # running on the strength of it (its resumer died): this delivery drives the run on
    assert _decide(_run(RunState.RUNNING), ckpt, outcome).then == Boundary(recovery=True)
    # applying an outcome the run is not waiting for is refused for good
    with pytest.raises(PermanentError, match="is not waiting on hr-other"):
        apply_result(_ckpt(pending=_pending()), "hr-other", "{}", T0)


def test_an_expiry_under_a_fail_policy_fails_the_run() -> None:
    expired = HumanExpired(request_id=REQUEST_ID, run_id=RUN_ID, recipient="user:alice", action="fail", waited_s=600)
    waiting = _run(RunState.WAITING_FOR_HUMAN, waiting_request_id=REQUEST_ID)
    decision = _decide(waiting, _ckpt(pending=_pending()), human_outcome("human.expired", "evt-x", expired))
    assert [d.reason for d in _published(decision) if isinstance(d, RunFailed)] == ["human_request_expired"]


def test_an_expiry_of_a_question_that_did_not_offer_the_trigger_s_default_says_why_it_failed() -> None:
    expired = HumanExpired(request_id=REQUEST_ID, run_id=RUN_ID, recipient="user:alice", action="fail", waited_s=600)
    policy = HumanPolicy(
        allowed_recipients=["user:alice"], on_timeout=TimeoutPolicy(action="default", default_option="keep-v1")
    )
    waiting = _run(RunState.WAITING_FOR_HUMAN, waiting_request_id=REQUEST_ID, human=policy)
    decision = _decide(waiting, _ckpt(pending=_pending()), human_outcome("human.expired", "evt-x", expired))
    (failed,) = [d for d in _published(decision) if isinstance(d, RunFailed)]
    assert failed.reason == "human_request_expired"
    assert "timeout default 'keep-v1' is not among this question's options" in failed.error
    plain = _decide(
        _run(RunState.WAITING_FOR_HUMAN, waiting_request_id=REQUEST_ID),
        _ckpt(pending=_pending()),
        human_outcome("human.expired", "evt-x", expired),
    )
    assert [d.error for d in _published(plain) if isinstance(d, RunFailed)] == [f"no answer to {REQUEST_ID} in time"]


def test_an_expiry_under_a_cancel_policy_leaves_the_cancelling_to_its_cancel_request() -> None:
    expired = HumanExpired(request_id=REQUEST_ID, run_id=RUN_ID, recipient="user:alice", action="cancel", waited_s=60)
    waiting = _run(RunState.WAITING_FOR_HUMAN, waiting_request_id=REQUEST_ID)
    decision = _decide(waiting, _ckpt(pending=_pending()), human_outcome("human.expired", "evt-x", expired))
    assert not _published(decision), "neither resumed without an answer nor failed"
    assert not any(isinstance(e, Transition) for e in decision.effects)
    assert decision.then is None


def test_an_outcome_for_an_unknown_run_is_rejected() -> None:
    outcome = human_outcome("human.answered", "evt-ans", _answered())
    assert _decide(None, None, outcome).effects == (Reject(f"human.answered for unknown run {RUN_ID}"),)


def test_human_outcomes_are_the_tool_results_older_executors_wrote() -> None:
    # the exact JSON the engine wrote as untyped dicts: checkpoints saved by it read the same
    answer = OptionAnswer(option_id="keep-v1", label="Keep v1")
    legacy_answered = {
        "request_id": REQUEST_ID,
        "status": "answered",
        "responder": "user:alice",
        "channel": "web",
        "answer": answer.model_dump(mode="json"),
    }
    assert tool_content(human_outcome("human.answered", "e", _answered(answer=answer)).result) == json.dumps(
        legacy_answered, sort_keys=True
    )
    expired = HumanExpired(request_id=REQUEST_ID, run_id=RUN_ID, recipient="user:alice", action="default", waited_s=1)
    legacy_expired = {
        "request_id": REQUEST_ID,
        "status": "expired",
        "note": "nobody answered in time; the timeout policy's default applies",
        "answer": None,
    }
    assert tool_content(human_outcome("human.expired", "e", expired).result) == json.dumps(
        legacy_expired, sort_keys=True
    )
    rejected = HumanRejected(
        request_id=REQUEST_ID, run_id=RUN_ID, recipient="user:bob", reason="recipient_not_allowed", detail="no"
    )
    legacy_rejected = {"request_id": REQUEST_ID, "status": "rejected", "error": "recipient_not_allowed: no"}
    assert tool_content(human_outcome("human.rejected", "e", rejected).result) == json.dumps(
        legacy_rejected, sort_keys=True
    )
    assert parse_result(json.dumps(legacy_rejected)).status == "rejected"


def test_a_checkpoint_written_before_pending_asks_had_a_kind_still_resumes() -> None:
    old = {
        "checkpoint_id": "ckpt-2",
        "run_id": RUN_ID,
        "turn": 2,
        "saved_at": T0.isoformat(),
        "messages": [{"role": "system", "content": "s"}],
        "pending": {
            "request_id": REQUEST_ID,
            "call_id": "call-ask",
            "turn": 2,
            "asked_at": T0.isoformat(),
            "arguments": ASK_ARGS,
        },
        "compute_s": 1.5,
        "applied_requests": [],
    }
    ckpt = Checkpoint.model_validate_json(json.dumps(old))
    assert ckpt.pending is not None
    assert ckpt.pending.kind == "human"
    assert (ckpt.usage, ckpt.malformed_tool_calls) == (Usage(), 0)
    outcome = human_outcome("human.answered", "evt-ans", _answered())
    applied = apply_result(ckpt, REQUEST_ID, tool_content(outcome.result), T0)
    assert applied is not None
    assert applied.messages[-1].tool_call_id == "call-ask"


# --------------------------------------------------------------------------- cancel
def test_cancel_while_waiting_cancels_at_once_and_a_driven_run_at_its_next_boundary() -> None:
    incoming = CancelRequested(run_id=RUN_ID, reason="wrong PR", requested_by="on-call", event_id="evt-c1")
    waiting = _run(RunState.WAITING_FOR_HUMAN, waiting_request_id=REQUEST_ID)
    flag = _decide(waiting, _ckpt(), incoming)
    request = CancelRequest(reason="wrong PR", requested_by="on-call", requested_at=T0, event_id="evt-c1")
    assert flag.effects == (FlagCancel(request),)
    assert flag.then == CancelRecorded("on-call")
    flagged_run = flagged(waiting, request, T0)
    assert flagged_run is not None
    assert flagged(flagged_run, request.model_copy(update={"event_id": "evt-c2"}), T0) is None  # the first wins
    cancel = _decide(flagged_run, _ckpt(), CancelRecorded("on-call"))
    assert _kinds(cancel) == ["Transition", "Publish", "DisarmWatchdog", "ArmRetention", "MarkPublished"]
    (cancelled,) = [e for e in cancel.effects if isinstance(e, Publish)]
    totals = RunUsage(turns=1)  # _ckpt(): one committed turn, no tool calls, no tokens
    assert cancelled.data == RunCancelled(run_id=RUN_ID, reason="wrong PR (requested by on-call)", usage=totals)
    assert cancelled.causation == "evt-c1"
    # a driven run: nothing now; its driver cancels at the boundary instead of starting a turn
    running = _run(RunState.RUNNING, cancel=request)
    assert _kinds(_decide(running, _ckpt(), CancelRecorded("on-call"))) == []
    at_boundary = _decide(running, _ckpt(pending=_pending()), Boundary())
    assert [type(d) for d in _published(at_boundary)] == [RunCancelled]
    assert at_boundary.then is None
    # asked to stop while it parked: cancelled right after the park
    assert [type(d) for d in _published(_decide(flagged_run, None, Parked()))] == [RunCancelled]
    # finished: ignored
    assert _kinds(_decide(_run(RunState.COMPLETED), None, CancelRecorded("on-call"))) == []


def test_a_cancel_before_its_run_leaves_a_marker_the_run_adopts_at_once() -> None:
    incoming = CancelRequested(run_id=RUN_ID, reason="superseded", requested_by="trigger:t1", event_id="evt-c1")
    request = CancelRequest(reason="superseded", requested_by="trigger:t1", requested_at=T0, event_id="evt-c1")
    # unknown run: a marker, then decided again on the record read after it
    mark = _decide(None, None, incoming)
    assert mark == Decision((MarkCancel(request),), dataclasses.replace(incoming, marked=True))
    marked = dataclasses.replace(incoming, marked=True)
    assert _kinds(_decide(None, None, marked)) == []  # still unknown: the marker waits for it
    # the run.requested created it meanwhile: recorded on it as usual
    assert _decide(_run(RunState.PENDING), None, marked).effects == (FlagCancel(request),)
    # the run.requested that comes later: pending and flagged (the driver adopted the marker) -> cancelled
    # at once, no checkpoint, no lease, no provider call
    requested = Requested(request=run_requested(RUN_ID).payload(RunRequested), correlation_id=RUN_ID)
    adopted = _decide(_run(RunState.PENDING, cancel=request), None, requested)
    assert _kinds(adopted) == ["Publish", "Transition", "Publish", "DisarmWatchdog", "ArmRetention", "MarkPublished"]
    assert [type(d) for d in _published(adopted)] == [RunCreated, RunCancelled]
    assert adopted.then is None
    cancelled = adopted.effects[2]
    assert isinstance(cancelled, Publish)
    assert cancelled.causation == "evt-c1"
    assert cancelled.data == RunCancelled(
        run_id=RUN_ID, reason="superseded (requested by trigger:t1)", usage=RunUsage()
    )  # no turn, nothing used
    # no marker found: started as usual
    checked = dataclasses.replace(requested, marker_checked=True)
    assert "CreateCheckpoint" in _kinds(_decide(_run(RunState.PENDING), None, checked))


def test_moves_go_through_the_state_machine() -> None:
    waiting = _run(RunState.WAITING_FOR_HUMAN)
    assert moved(waiting, RunState.WAITING_FOR_HUMAN, {}, T0) is None  # a repeat is a no-op
    with pytest.raises(RunMovedOn):
        moved(waiting, RunState.RUNNING, {}, T0)  # never back to running without resuming
    done = _run(RunState.COMPLETED, result="ok")
    for end in (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED):  # a run ends once: a second end is stale
        with pytest.raises(RunMovedOn):
            moved(done, end, {"result": "other"}, T0)
    resuming = moved(waiting, RunState.RESUMING, {}, T0 + timedelta(seconds=1))
    assert resuming is not None
    assert (resuming.state, resuming.updated_at) == (RunState.RESUMING, T0 + timedelta(seconds=1))


def _ended_by(decision: Decision, run: RunRecord) -> tuple[RunRecord, Publish]:
    """The record ``decision``'s end commits, and its terminal event (published after the commit)."""
    (move,) = [e for e in decision.effects if isinstance(e, Transition)]
    kinds = [type(e) for e in decision.effects]
    assert kinds.index(Transition) < max(i for i, k in enumerate(kinds) if k is Publish)  # the record first
    ended = moved(run, move.target, move.changes, T0)
    assert ended is not None
    return ended, decision.effects[kinds.index(Transition) + 1]  # type: ignore[return-value]


def test_an_end_is_committed_first_and_its_event_is_the_records() -> None:
    """The record is the terminal event's outbox: the event a decision publishes after its end's compare-and-set
    is the one :func:`ending_event` builds from the committed record -- what a recovery publishes again."""
    flagged_run = _run(
        RunState.WAITING_FOR_HUMAN,
        cancel=CancelRequest(reason="wrong PR", requested_by="on-call", requested_at=T0, event_id="evt-c1"),
    )
    reply = ProviderReplied(turn=2, reply=AssistantTurn(content="LGTM " * 5000), elapsed_s=0.1)
    expired = DeadLettered("run.requested", "evt-1", None, 3, "RuntimeError: " + "boom " * 2000)
    endings = [
        (_run(RunState.RUNNING), _decide(_run(RunState.RUNNING), _ckpt(), reply), RunCompleted),
        (flagged_run, _decide(flagged_run, _ckpt(), CancelRecorded("on-call")), RunCancelled),
        (_run(RunState.PENDING), _decide(_run(RunState.PENDING), None, expired), RunFailed),
    ]
    requested = Requested(request=run_requested(RUN_ID).payload(RunRequested), correlation_id=RUN_ID)
    for before, decision, kind in endings:
        ended, announced = _ended_by(decision, before)
        assert isinstance(announced, Publish)
        assert isinstance(announced.data, kind)
        assert ending_event(ended) == announced  # the same data, causation and id, built from the record alone
        # a finished run: its event again only when its ender may have died before publishing it
        first = _decide(ended, _ckpt(), requested)
        assert [type(d) for d in _published(first)] == [RunCreated]  # a duplicate run.requested: nothing more
        again = _decide(ended, _ckpt(), requested, attempt=Attempt(delivered=2))  # its redelivery
        assert [e for e in again.effects if isinstance(e, Publish)][1:] == [announced]
        fired = _decide(ended, _ckpt(), _fired(turn=1))  # the watchdog it did not disarm
        assert [e for e in fired.effects if isinstance(e, Publish)] == [announced]
        # a record that ended before records held their ending published its event first: nothing again
        assert ending_event(ended.model_copy(update={"ending": None})) is None
    # a run ends once: a second end (a racing watchdog, cancel or driver) is refused, so it publishes nothing
    done, _ = _ended_by(endings[0][1], _run(RunState.RUNNING))
    with pytest.raises(RunMovedOn):
        moved(done, RunState.FAILED, {"error": "stalled: late"}, T0)


def _agent_deadline() -> WatchdogFired:
    payload = WatchdogPayload(run_id=RUN_ID, turn=1, agent_turn=2, armed_at=T0, deadline=T0 + timedelta(seconds=1))
    return WatchdogFired(payload=payload, grace_s=300.0)


#: What meets a finished run and publishes its terminal event again when its ender may have died before that event
#: was acknowledged: (the incoming, its delivery). The messages only on a redelivery (a first delivery is not the
#: message whose handler ended the run); the timers and the dead-letter hook at once.
AGAIN = [
    pytest.param(lambda: human_outcome("human.answered", "evt-late", _answered()), 2, id="human-outcome"),
    pytest.param(partial(late_agent_answer, RUN_ID), 2, id="agent-news"),
    pytest.param(lambda: CancelRecorded("on-call"), 2, id="cancel-recorded"),
    pytest.param(lambda: AgentActed(RUN_ID, task_id_for(RUN_ID), 2, "evt-acted"), 2, id="agent-acted"),
    pytest.param(lambda: DeadLettered("human.answered", "evt-dl", REQUEST_ID, 8, "boom"), 1, id="dead-lettered"),
    pytest.param(lambda: _fired(turn=1), 1, id="watchdog"),
    pytest.param(_agent_deadline, 1, id="agent-deadline-first-firing"),
]


@pytest.mark.parametrize(("incoming", "delivered"), AGAIN)
def test_a_finished_run_publishes_its_event_again_until_the_record_says_it_went_out(
    incoming: Callable[[], Incoming], delivered: int
) -> None:
    """The record is the terminal event's outbox (:class:`~.records.Ending`): until it is marked published (after
    the event's acknowledgement), a redelivery, a timer or the dead-letter hook meeting the finished run publishes
    the event again, the same one, with the watchdog off (left armed, it would fire past the events stream's
    duplicate window and store a second copy) and the mark once acknowledged; once marked, nothing again."""
    reply = ProviderReplied(turn=2, reply=AssistantTurn(content="LGTM"), elapsed_s=0.1)
    ending = _decide(_run(RunState.RUNNING), _ckpt(), reply)
    ended, announced = _ended_by(ending, _run(RunState.RUNNING))
    assert [type(e) for e in ending.effects if not isinstance(e, Note)][-4:] == [
        Publish,
        DisarmWatchdog,
        ArmRetention,
        MarkPublished,
    ]
    again = _decide(ended, _ckpt(), incoming(), attempt=Attempt(delivered=delivered))
    acts = [e for e in again.effects if not isinstance(e, Note)]
    assert announced in acts
    assert acts[acts.index(announced) :] == [announced, DisarmWatchdog(), ArmRetention(), MarkPublished()]
    assert again.then is None
    # the mark (its compare-and-set after the event's acknowledgement): nothing published again, nothing disarmed
    marked = published(ended)
    assert marked is not None
    assert marked.ending is not None
    assert (marked.ending.published, marked.updated_at) == (True, ended.updated_at)  # the retention's deadline kept
    assert published(marked) is None
    after = _decide(marked, _ckpt(), incoming(), attempt=Attempt(delivered=delivered))
    assert announced not in after.effects
    assert not any(isinstance(e, DisarmWatchdog | MarkPublished) for e in after.effects)
    assert ArmRetention() in after.effects  # its checkpoint still there: the retention armed again, as ever
    if delivered > 1:  # a first delivery of a message is not its ender's: nothing again either
        first = _decide(ended, _ckpt(), incoming(), attempt=Attempt(delivered=1))
        assert announced not in first.effects
        assert not any(isinstance(e, DisarmWatchdog | MarkPublished) for e in first.effects)


# --------------------------------------------------------------------------- watchdog and dead letters
def _fired(turn: int, armed_at: datetime = T0) -> WatchdogFired:
    payload = WatchdogPayload(run_id=RUN_ID, turn=turn, armed_at=armed_at, deadline=armed_at + timedelta(seconds=1))
    return WatchdogFired(payload=payload, grace_s=300.0)


def test_the_watchdog_fails_a_run_without_progress_and_watches_on_after_progress() -> None:
    running = _run(RunState.RUNNING)
    later = T0 + timedelta(seconds=1500)
    ckpt = _ckpt(turn=3)
    progressed = _decide(running, ckpt, _fired(turn=2), now=later, attempt=Attempt(stream_seq=9))
    # watched on from the progress (turn 3's checkpoint), not from the firing
    rearm = ArmWatchdog(3, 900.0, ("progress", "9", "1"), since=ckpt.saved_at)
    assert [e for e in progressed.effects if not isinstance(e, Note)] == [rearm]
    stalled = _decide(running, _ckpt(turn=3), _fired(turn=3), now=later)
    (failed,) = _published(stalled)
    assert isinstance(failed, RunFailed)
    assert failed.reason == "stalled"
    assert failed.error.startswith("no progress in running at turn 3 for 1500s")
    for state in (RunState.WAITING_FOR_HUMAN, RunState.COMPLETED):
        retain = ["ArmRetention"] if state is RunState.COMPLETED else []  # a finished run's checkpoint: armed again
        assert _kinds(_decide(_run(state), _ckpt(turn=3), _fired(turn=3), now=later)) == retain


def test_a_dead_letter_fails_only_the_run_its_message_drives() -> None:
    applied = _ckpt(applied_requests=["hr-0", "hr-1"])
    assert drives(_run(RunState.RUNNING), applied, "human.answered", "hr-1")
    assert not drives(_run(RunState.RUNNING), applied, "human.answered", "hr-0")
    assert not drives(_run(RunState.RUNNING), applied, "run.requested", None)
    assert drives(_run(RunState.PENDING), None, "run.requested", None)
    assert not drives(_run(RunState.RUNNING), _ckpt(), "run.cancel_requested", None)
    lost = DeadLettered("run.requested", "evt-1", None, 3, "Conflict: raced", lost_race=True)
    assert _decide(_run(RunState.PENDING), None, lost).effects == ()
    given_up = DeadLettered("run.requested", "evt-1", None, 3, "RuntimeError: boom")
    (failed,) = _published(_decide(_run(RunState.PENDING), None, given_up))
    assert isinstance(failed, RunFailed)
    assert failed.error == "run.requested evt-1 dead-lettered after 3 deliveries: RuntimeError: boom"
    decision = _decide(_run(RunState.PENDING), None, given_up)
    assert [e.causation for e in decision.effects if isinstance(e, Publish)] == ["evt-1"]
    assert DisarmWatchdog() in decision.effects
    assert not [e for e in decision.effects if isinstance(e, CreateCheckpoint)]
