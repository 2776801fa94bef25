"""HUM-7: several ``ask_human`` calls in one turn, decided by the pure run machine.

One reply asks two people at once: two requests (ids from run, turn and call index), one park. Each
outcome is recorded in the checkpoint (a redelivered one changes nothing); the run resumes when its
continuation policy says so -- every question has an outcome (``wait_for: all``, the default) or one
is answered (``wait_for: first``) -- and every call gets its own tool result, in call order. The
cross-process proof is ``tests/test_parallel_questions.py``.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from executor_support import REVIEWER, RunExecutor, handled, run_record, run_requested
from machine_support import T0, make_checkpoint, make_run
from pydantic import ValidationError

from temporality_bus import Bus, PermanentError, evolve
from temporality_protocol import (
    HumanAnswered,
    HumanCancelRequested,
    HumanExpired,
    HumanPolicy,
    HumanRejected,
    HumanRequested,
    OptionAnswer,
    RunFailed,
    RunResumed,
    RunState,
    TimeoutPolicy,
    derive_id,
    make_event,
)
from temporality_protocol.catalog import BUCKET_CHECKPOINTS
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.machine import (
    Agent,
    ApplyParked,
    ApplyResult,
    CallProvider,
    CallTool,
    CancelRecorded,
    FlagCancel,
    HumanOutcome,
    Incoming,
    Note,
    ProviderReplied,
    Publish,
    RecordOutcome,
    Retry,
    SaveCheckpoint,
    TakeLease,
    Transition,
    apply_parked,
    apply_result,
    decide,
    drives,
    flagged,
    human_outcome,
    moved,
    recorded,
)
from temporality_run_executor.providers import AssistantTurn, ToolSpec, TurnContext
from temporality_run_executor.providers.script import Script
from temporality_run_executor.providers.scripted import ScriptedProvider
from temporality_run_executor.records import (
    CancelRequest,
    Checkpoint,
    Message,
    ParkedOutcome,
    PendingAsk,
    RunRecord,
    ToolCall,
)
from temporality_run_executor.results import parse_result
from temporality_run_executor.tools import BUILTIN_TOOLS, ToolPolicy, ToolRegistry
from temporality_testing.events import EventLog

RUN_ID = "run-par-1"
AGENT = Agent(
    REVIEWER.model_copy(update={"tools": ToolPolicy(allow=["get_input", "ask_human", "ask_agent"])}),
    ToolRegistry(BUILTIN_TOOLS),
)
#: The two questions of turn 2, in call order: their request ids come from (run, turn, call index).
REQ_A = derive_id("hr", RUN_ID, "2", "0")
REQ_B = derive_id("hr", RUN_ID, "2", "1")


def _run(state: RunState = RunState.RUNNING, action: str = "default", **changes: Any) -> RunRecord:
    timeout = TimeoutPolicy(action=action, default_option="keep" if action == "default" else None)
    human = HumanPolicy(allowed_recipients=["user:alice", "user:bob"], default_timeout_s=600, on_timeout=timeout)
    return make_run(RUN_ID, state, **({"human": human, "collab": True} | changes))


_ckpt = partial(make_checkpoint, RUN_ID)


def _ask(call_id: str, recipient: str, question: str, **more: Any) -> ToolCall:
    return ToolCall(id=call_id, name="ask_human", arguments={"recipient": recipient, "question": question, **more})


def _reply(*calls: ToolCall) -> ProviderReplied:
    return ProviderReplied(turn=2, reply=AssistantTurn(content="Two questions.", tool_calls=list(calls)), elapsed_s=0.1)


def _answered(request_id: str, who: str, option: str) -> HumanOutcome:
    data = HumanAnswered(
        request_id=request_id,
        run_id=RUN_ID,
        recipient=who,
        responder=who,
        answer=OptionAnswer(option_id=option, label=option.title()),
        channel="web",
        waited_s=30.0,
    )
    return human_outcome("human.answered", f"evt-ans-{request_id}", data)


def _expired(request_id: str, action: str, default: str | None = None) -> HumanOutcome:
    data = HumanExpired(
        request_id=request_id,
        run_id=RUN_ID,
        recipient="user:bob",
        action=action,
        default_answer=OptionAnswer(option_id=default) if default else None,
        waited_s=600.0,
    )
    return human_outcome("human.expired", f"evt-exp-{request_id}", data)


@dataclasses.dataclass
class _World:
    """The run record and checkpoint as the store would hold them: each decision's effects applied purely,
    as the driver applies them (:mod:`.engine`), its follow-up decided again until the handler is done."""

    run: RunRecord
    ckpt: Checkpoint
    effects: list[Any] = dataclasses.field(default_factory=list)

    def handle(self, incoming: Incoming) -> list[Any]:
        done: list[Any] = []
        step: Incoming | None = incoming
        while step is not None:
            decision = decide(self.run, self.ckpt, AGENT, step, now=T0 + timedelta(minutes=5))
            for effect in decision.effects:
                self._apply(effect)
            done += decision.effects
            then = decision.then
            if isinstance(then, CallProvider | CallTool):  # the next turn (its provider call) is not played here
                done.append(then)
                break
            step = then
        self.effects += done
        return done

    def _apply(self, effect: Any) -> None:
        now = T0 + timedelta(minutes=5)
        if isinstance(effect, Transition):
            self.run = moved(self.run, effect.target, effect.changes, now) or self.run
        elif isinstance(effect, TakeLease):
            self.run = evolve(self.run, lease=effect.lease)
        elif isinstance(effect, SaveCheckpoint):
            self.ckpt = effect.checkpoint
        elif isinstance(effect, RecordOutcome):
            self.ckpt = recorded(self.ckpt, effect.outcome) or self.ckpt
        elif isinstance(effect, ApplyResult):
            self.ckpt = apply_result(self.ckpt, effect.request_id, effect.content, now) or self.ckpt
        elif isinstance(effect, ApplyParked):
            self.ckpt = apply_parked(self.ckpt, effect.request_id, now) or self.ckpt
        elif isinstance(effect, FlagCancel):
            self.run = flagged(self.run, effect.request, now) or self.run


def _state(world: _World) -> RunState:
    return world.run.state


def _published(effects: list[Any], kind: type) -> list[Any]:
    return [e.data for e in effects if isinstance(e, Publish) and isinstance(e.data, kind)]


def _parked_world(*calls: ToolCall, action: str = "default") -> _World:
    """Turn 2 asked ``calls`` and the run is parked on them."""
    world = _World(_run(action=action), _ckpt())
    world.handle(_reply(*calls))
    assert _state(world) is RunState.WAITING_FOR_HUMAN
    return world


def _two(**more: Any) -> tuple[ToolCall, ToolCall]:
    return (
        _ask("call-a", "user:alice", "Ship v2?", **more),
        _ask("call-b", "user:bob", "Keep v1?"),
    )


def _results(ckpt: Checkpoint) -> list[tuple[str | None, dict[str, Any]]]:
    return [(m.tool_call_id, json.loads(m.content or "{}")) for m in ckpt.messages if m.role == "tool"]


# --------------------------------------------------------------------------- asking
def test_two_asks_in_one_reply_are_two_requests_and_one_park() -> None:
    world = _World(_run(), _ckpt())
    effects = world.handle(_reply(*_two()))
    saved = world.ckpt
    assert saved.turn == 2
    assert saved.pending is not None
    assert [p.request_id for p in saved.parked] == [REQ_A, REQ_B]
    assert [p.call_id for p in saved.parked] == ["call-a", "call-b"]
    assert all(p.arguments["wait_for"] == "all" for p in saved.parked)  # the default, stated in the checkpoint
    # one human.requested each (ids per request: a replay republishes the same), one move to waiting
    requested = [(e.data, e.id_parts) for e in effects if isinstance(e, Publish) and isinstance(e.data, HumanRequested)]
    assert [(data.request_id, data.recipient, ids) for data, ids in requested] == [
        (REQ_A, "user:alice", (REQ_A,)),
        (REQ_B, "user:bob", (REQ_B,)),
    ]
    moves = [e for e in effects if isinstance(e, Transition)]
    assert moves[-1] == Transition(
        RunState.WAITING_FOR_HUMAN, {"waiting_request_id": REQ_A, "waiting_since": T0 + timedelta(minutes=5)}
    )
    assert world.run.waiting_request_id == REQ_A
    # no tool message yet for either call: their results are the people's outcomes
    assert _results(saved) == []


def test_an_old_checkpoint_with_one_pending_ask_still_loads_and_resumes() -> None:
    old = {
        "checkpoint_id": "ckpt-2",
        "run_id": RUN_ID,
        "turn": 2,
        "saved_at": T0.isoformat(),
        "messages": [{"role": "system", "content": "s"}],
        "pending": {
            "request_id": REQ_A,
            "call_id": "call-a",
            "turn": 2,
            "asked_at": T0.isoformat(),
            "arguments": {"recipient": "user:alice", "question": "Ship v2?"},
        },
    }
    ckpt = Checkpoint.model_validate_json(json.dumps(old))
    assert (ckpt.more_pending, ckpt.outcomes, ckpt.dismissed_requests) == ([], [], [])
    assert [p.request_id for p in ckpt.parked] == [REQ_A]
    world = _World(_run(RunState.WAITING_FOR_HUMAN, waiting_request_id=REQ_A, waiting_since=T0), ckpt)
    effects = world.handle(_answered(REQ_A, "user:alice", "ship"))
    assert any(isinstance(e, ApplyResult) for e in effects)  # the single-ask path, as before
    assert not any(isinstance(e, RecordOutcome | ApplyParked) for e in effects)
    assert _state(world) is RunState.RUNNING
    assert [call_id for call_id, _ in _results(world.ckpt)] == ["call-a"]


# --------------------------------------------------------------------------- wait for all
def test_answers_in_reverse_order_resume_once_with_both_results_in_call_order() -> None:
    world = _parked_world(*_two())
    # bob answers first: recorded, the run stays parked (nothing published, no watchdog, no move)
    first = world.handle(_answered(REQ_B, "user:bob", "keep"))
    assert [type(e).__name__ for e in first if not isinstance(e, Note)] == ["RecordOutcome"]
    assert _state(world) is RunState.WAITING_FOR_HUMAN
    assert [o.request_id for o in world.ckpt.outcomes] == [REQ_B]
    # the same event again changes nothing
    before = world.ckpt
    again = world.handle(_answered(REQ_B, "user:bob", "keep"))
    assert [type(e) for e in again] == [Note]
    assert world.ckpt == before
    assert recorded(world.ckpt, world.ckpt.outcomes[0]) is None
    # alice answers: the wait is over -- one run.resumed, the results applied, the run drives on
    last = world.handle(_answered(REQ_A, "user:alice", "ship"))
    (resumed,) = _published(last, RunResumed)
    assert resumed == RunResumed(run_id=RUN_ID, reason="answer", from_turn=2, request_id=REQ_A, waited_s=30.0)
    assert [e.id_parts for e in last if isinstance(e, Publish)] == [(REQ_A,)]  # one per wait, whoever ended it
    assert _state(world) is RunState.RUNNING
    assert world.run.waiting_request_id is None
    assert isinstance(last[-1], CallProvider)  # the next turn sees both results
    results = _results(world.ckpt)
    assert [call_id for call_id, _ in results] == ["call-a", "call-b"]
    assert [(r["request_id"], r["status"], r["answer"]["option_id"]) for _, r in results] == [
        (REQ_A, "answered", "ship"),
        (REQ_B, "answered", "keep"),
    ]
    assert world.ckpt.parked == []
    assert world.ckpt.outcomes == []
    assert world.ckpt.applied_requests == [REQ_B, REQ_A]  # the one that resumed it last (see drives)
    # a redelivered answer after the resume is the existing no-op / recovery path
    assert apply_parked(world.ckpt, REQ_A, T0) is None


def test_two_outcomes_decided_at_once_resume_the_run_exactly_once() -> None:
    world = _parked_world(*_two())
    a, b = _answered(REQ_A, "user:alice", "ship"), _answered(REQ_B, "user:bob", "keep")
    # both handlers read the same checkpoint (nothing recorded) and record their own outcome
    da = decide(world.run, world.ckpt, AGENT, a, now=T0)
    db = decide(world.run, world.ckpt, AGENT, b, now=T0)
    assert [type(e) for e in da.effects] == [type(e) for e in db.effects] == [RecordOutcome]
    (rec_a,), (rec_b,) = da.effects, db.effects
    assert isinstance(rec_a, RecordOutcome)
    assert isinstance(rec_b, RecordOutcome)
    only_a = recorded(world.ckpt, rec_a.outcome)  # the first compare-and-set
    assert only_a is not None
    both = recorded(only_a, rec_b.outcome)  # the second, on what the first wrote
    assert both is not None
    # each decides again on what its own write returned: only the second sees the wait over
    assert not _published(list(decide(world.run, only_a, AGENT, a, now=T0).effects), RunResumed)
    assert len(_published(list(decide(world.run, both, AGENT, b, now=T0).effects), RunResumed)) == 1


def test_an_outcome_before_the_run_has_parked_is_retried_and_outcomes_drive_the_waiting_run() -> None:
    world = _World(_run(), _ckpt())
    world.handle(_reply(*_two()))
    committed = world.ckpt
    running = _run()  # the turn is committed, the move to waiting_for_human is not
    early = decide(running, committed, AGENT, _answered(REQ_B, "user:bob", "keep"), now=T0)
    assert early.effects == (Retry("the run has not finished parking on this request yet"),)
    waiting = world.run
    assert drives(waiting, committed, "human.answered", REQ_B)  # losing it would strand the run
    assert drives(waiting, committed, "human.answered", REQ_A)
    assert not drives(waiting, committed, "human.answered", "hr-other")


def test_an_expiry_with_a_default_and_a_rejection_are_outcomes_too() -> None:
    world = _parked_world(*_two())
    world.handle(_expired(REQ_B, "default", default="keep"))
    assert _state(world) is RunState.WAITING_FOR_HUMAN
    rejected = HumanRejected(
        request_id=REQ_A, run_id=RUN_ID, recipient="user:alice", reason="no_channel", detail="alice has no channel"
    )
    world.handle(human_outcome("human.rejected", "evt-rej", rejected))
    assert _state(world) is RunState.RUNNING
    results = dict(_results(world.ckpt))
    assert results["call-a"]["status"] == "rejected"
    assert (results["call-b"]["status"], results["call-b"]["answer"]["option_id"]) == ("expired", "keep")


def test_a_fail_policy_expiry_fails_the_run_while_another_question_is_open() -> None:
    world = _parked_world(*_two(), action="fail")
    world.handle(_answered(REQ_A, "user:alice", "ship"))
    effects = world.handle(_expired(REQ_B, "fail"))
    assert [f.reason for f in _published(effects, RunFailed)] == ["human_request_expired"]
    assert _state(world) is RunState.FAILED  # human-interaction cancels the rest on run.failed


def test_a_cancel_policy_expiry_leaves_the_cancelling_to_its_cancel_request() -> None:
    world = _parked_world(*_two(), action="cancel")
    effects = world.handle(_expired(REQ_B, "cancel"))
    assert [type(e) for e in effects] == [Note]
    assert _state(world) is RunState.WAITING_FOR_HUMAN
    # its run.cancel_requested (published first) cancels the parked run at once
    request = CancelRequest(reason="human_timeout", requested_by="human-interaction", requested_at=T0, event_id="c1")
    world.run = flagged(world.run, request, T0) or world.run
    world.handle(CancelRecorded("human-interaction"))
    assert _state(world) is RunState.CANCELLED


# --------------------------------------------------------------------------- wait for the first answer
def test_first_answer_resumes_and_the_other_question_is_not_needed() -> None:
    world = _parked_world(*_two(wait_for="first"))
    assert all(p.arguments["wait_for"] == "first" for p in world.ckpt.parked)  # one call said it: the turn's
    effects = world.handle(_answered(REQ_B, "user:bob", "keep"))
    assert len(_published(effects, RunResumed)) == 1
    # the question not needed is withdrawn at once (human-interaction cancels it), not left answerable
    (withdrawn,) = _published(effects, HumanCancelRequested)
    assert withdrawn == HumanCancelRequested(run_id=RUN_ID, request_ids=[REQ_A], answered=REQ_B)
    assert _state(world) is RunState.RUNNING
    results = _results(world.ckpt)
    assert [call_id for call_id, _ in results] == ["call-a", "call-b"]
    not_needed, answered = results[0][1], results[1][1]
    assert not_needed == parse_result(json.dumps(not_needed)).model_dump(mode="json")
    assert (not_needed["status"], not_needed["answered"], not_needed["request_id"]) == ("not_needed", REQ_B, REQ_A)
    assert answered["status"] == "answered"
    assert world.ckpt.dismissed_requests == [REQ_A]
    # alice answers later (or her question expires, even under fail): noted, never applied, never driving
    for late in (_answered(REQ_A, "user:alice", "ship"), _expired(REQ_A, "fail")):
        for state in (RunState.RUNNING, RunState.WAITING_FOR_HUMAN, RunState.RESUMING):
            decision = decide(world.run.model_copy(update={"state": state}), world.ckpt, AGENT, late, now=T0)
            assert [type(e) for e in decision.effects] == [Note], (late.event_type, state)
            assert decision.then is None


def test_first_waits_past_expiries_and_rejections_for_an_answer() -> None:
    world = _parked_world(*_two(wait_for="first"))
    world.handle(_expired(REQ_A, "default", default="keep"))
    assert _state(world) is RunState.WAITING_FOR_HUMAN  # an expiry is no answer: bob may still answer
    effects = world.handle(_answered(REQ_B, "user:bob", "ship"))
    assert _published(effects, HumanCancelRequested) == []  # nothing left open to withdraw
    assert _state(world) is RunState.RUNNING
    results = dict(_results(world.ckpt))
    assert (results["call-a"]["status"], results["call-b"]["status"]) == ("expired", "answered")
    assert world.ckpt.dismissed_requests == []


def test_first_with_every_question_ending_unanswered_resumes_with_them_all() -> None:
    world = _parked_world(*_two(wait_for="first"))
    world.handle(_expired(REQ_A, "default", default="keep"))
    world.handle(_expired(REQ_B, "default", default="keep"))
    assert _state(world) is RunState.RUNNING
    assert [r["status"] for _, r in _results(world.ckpt)] == ["expired", "expired"]


# --------------------------------------------------------------------------- refused turns
def _plans(world: _World, *calls: ToolCall) -> list[PendingAsk]:
    """The calls the turn parks on (nothing to invoke: the turn is committed at once, refusals included)."""
    decision = decide(world.run, world.ckpt, AGENT, _reply(*calls), now=T0)
    (save,) = [e for e in decision.effects if isinstance(e, SaveCheckpoint)]
    world.ckpt = save.checkpoint
    return save.checkpoint.parked


def _refusals(ckpt: Checkpoint) -> dict[str | None, str]:
    return {call_id: r["error"] for call_id, r in _results(ckpt) if "error" in r}


def test_asks_that_disagree_on_wait_for_are_all_refused_with_a_tool_error() -> None:
    world = _World(_run(), _ckpt())
    parked = _plans(
        world, _ask("call-a", "user:alice", "A?", wait_for="first"), _ask("call-b", "user:bob", "B?", wait_for="all")
    )
    assert parked == []
    refusals = _refusals(world.ckpt)
    assert set(refusals) == {"call-a", "call-b"}
    assert all("must agree on wait_for" in text for text in refusals.values())


def test_first_is_refused_to_a_run_whose_timeout_policy_cancels_it() -> None:
    world = _World(_run(action="cancel"), _ckpt())
    assert _plans(world, *_two(wait_for="first")) == []
    assert all("wait_for='first' is not available" in t for t in _refusals(world.ckpt).values())
    # one question alone with first is fine (nothing else to dismiss); all is fine
    single = _World(_run(action="cancel"), _ckpt())
    assert len(_plans(single, _ask("call-a", "user:alice", "A?", wait_for="first"))) == 1
    both = _World(_run(action="cancel"), _ckpt())
    assert len(_plans(both, *_two())) == 2


def test_ask_human_and_a_waiting_ask_agent_never_share_a_turn() -> None:
    world = _World(_run(), _ckpt())
    wait = ToolCall(id="call-w", name="ask_agent", arguments={"to": "agent:other", "message": "m", "mode": "wait"})
    parked = _plans(world, _ask("call-a", "user:alice", "A?"), wait, _ask("call-b", "user:bob", "B?"))
    assert [p.call_id for p in parked] == ["call-a", "call-b"]
    assert "per turn" in _refusals(world.ckpt)["call-w"]
    other = _World(_run(), _ckpt())
    parked = _plans(other, wait, _ask("call-a", "user:alice", "A?"))
    assert [(p.kind, p.call_id) for p in parked] == [("agent", "call-w")]
    assert "per turn" in _refusals(other.ckpt)["call-a"]


def test_applying_before_the_wait_is_over_is_refused_for_good() -> None:
    world = _parked_world(*_two())
    outcome = ParkedOutcome(request_id=REQ_B, content="{}", reason="answer", event_id="e")
    half = recorded(world.ckpt, outcome)
    assert half is not None
    with pytest.raises(PermanentError, match="still waits on"):
        apply_parked(half, REQ_B, T0)


# --------------------------------------------------------------------------- the scripted agent's parallel mode
PARALLEL_SCRIPT: dict[str, Any] = {
    "steps": [
        {
            "id": "ask",
            "say": "Two questions at once.",
            "calls": [
                {"tool": "ask_human", "args": {"recipient": "{{ run.people[0] }}", "question": "Ship?"}},
                {"tool": "ask_human", "args": {"recipient": "{{ run.people[1] }}", "question": "Keep?"}},
            ],
        },
        {"id": "done", "answer": "{{ results.ask[0].status }}/{{ results.ask[1].answer.option_id }}"},
    ]
}


async def test_a_scripted_step_with_several_calls_is_one_reply_and_reads_their_results_by_position() -> None:
    provider = ScriptedProvider(Script.model_validate(PARALLEL_SCRIPT))
    context = TurnContext(run_id=RUN_ID, agent="a", title="t", people=["user:alice", "user:bob"], turn=1)
    tools = [ToolSpec(name="ask_human", description="", parameters={"type": "object"})]
    start = [Message(role="system", content="s"), Message(role="user", content="go")]
    first = await provider.complete(start, tools, context=context)
    assert first.content == "Two questions at once."
    assert [(c.id, c.arguments["recipient"]) for c in first.tool_calls] == [
        ("call-ask.0", "user:alice"),
        ("call-ask.1", "user:bob"),
    ]
    assistant = Message(role="assistant", tool_calls=first.tool_calls)
    results = [
        Message(role="tool", tool_call_id="call-ask.1", name="ask_human", content='{"answer": {"option_id": "keep"}}'),
        Message(role="tool", tool_call_id="call-ask.0", name="ask_human", content='{"status": "not_needed"}'),
    ]
    final = await provider.complete([*start, assistant, *results], tools, context=context)
    assert (final.content, final.tool_calls) == ("not_needed/keep", [])


def test_a_scripted_step_is_one_of_call_calls_or_answer() -> None:
    both = {"id": "x", "call": {"tool": "get_input"}, "calls": [{"tool": "get_input"}]}
    with pytest.raises(ValidationError, match="exactly one of call or answer"):
        Script.model_validate({"steps": [both, {"id": "done", "answer": "ok"}]})


# --------------------------------------------------------------------------- over a real nats-server
POLLSTER = AgentCard(
    id="pollster",
    role="Asks two people at once",
    system_prompt="Ask alice and bob together.",
    tools=ToolPolicy(allow=["ask_human"]),
    provider=ProviderConfig(kind="scripted", script=Script.model_validate(PARALLEL_SCRIPT)),
)


async def _answer_event(bus: Bus, request: HumanRequested, option: str, msg_id: str) -> int:
    data = HumanAnswered(
        request_id=request.request_id,
        run_id=request.run_id,
        recipient=request.recipient,
        responder=request.recipient,
        answer=OptionAnswer(option_id=option),
        channel="web",
        waited_s=1.0,
    )
    return (await bus.publish(make_event(data, source="/test", id=msg_id, run_id=request.run_id))).seq


async def test_the_engine_records_each_answer_once_and_resumes_when_both_are_in(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    await executor(cards=[POLLSTER])
    event = run_requested(agent="pollster", allowed=["user:alice", "user:bob"])
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    envs = await event_log.wait_for("human.requested", run_id=run_id, count=2)
    alice, bob = sorted((e.payload(HumanRequested) for e in envs), key=lambda r: r.recipient)
    await run_record(bus, run_id, RunState.WAITING_FOR_HUMAN)
    checkpoints = await bus.store(BUCKET_CHECKPOINTS, Checkpoint)

    # bob's answer, then the same answer again (a redelivery past JetStream's dedupe: another message id)
    for msg_id in ("evt-bob-1", "evt-bob-2"):
        await handled(bus, "run-executor-human", await _answer_event(bus, bob, "keep", msg_id))
    stored = await checkpoints.get(run_id)
    assert stored is not None
    assert [(o.request_id, o.event_id) for o in stored.value.outcomes] == [(bob.request_id, "evt-bob-1")]
    assert (await run_record(bus, run_id)).state is RunState.WAITING_FOR_HUMAN

    await _answer_event(bus, alice, "ship", "evt-alice-1")
    (completed,) = await event_log.wait_for("run.completed", run_id=run_id)
    assert completed.data["result"] == "answered/keep"
    await event_log.caught_up()
    assert len(event_log.of_type("run.resumed", run_id)) == 1
    final = await checkpoints.get(run_id)
    assert final is not None
    results = [(m.tool_call_id, json.loads(m.content or "{}")) for m in final.value.messages if m.role == "tool"]
    assert [(call_id, r["request_id"], r["answer"]["option_id"]) for call_id, r in results] == [
        ("call-ask.0", alice.request_id, "ship"),
        ("call-ask.1", bob.request_id, "keep"),
    ]
    assert not event_log.of_type("bus.dead_lettered")
