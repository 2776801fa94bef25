"""The run machine keeping a provider reply before the turn's first side effect, and carrying a crashed turn out
from it (issue 6, AP-8), on plain data: what is kept and when, what a second reply of the same turn changes, the
boundary that replays it instead of asking the model, and the park or end that drops it."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from functools import partial

import pytest
from executor_support import REVIEWER
from machine_support import T0, make_checkpoint, make_run

from temporality_protocol import RunState
from temporality_run_executor.agents import ProviderConfig
from temporality_run_executor.machine import (
    Agent,
    ArmWatchdog,
    Attempt,
    Boundary,
    CallProvider,
    CallTool,
    Decision,
    KeepReply,
    LeaseLost,
    ProviderReplied,
    SaveCheckpoint,
    ToolOutput,
    ToolReturned,
    Transition,
    decide,
    kept_reply,
    moved,
    with_reply,
)
from temporality_run_executor.providers import AssistantTurn
from temporality_run_executor.records import CancelRequest, Lease, PendingAsk, RunRecord, ToolCall
from temporality_run_executor.tools import BUILTIN_TOOLS, ToolPolicy, ToolRegistry

RUN_ID = "run-kept-1"
ME = Attempt(driver="me", lease_s=30.0)
AGENT = Agent(REVIEWER.model_copy(update={"tools": ToolPolicy(allow=["*"])}), ToolRegistry(BUILTIN_TOOLS))
_ckpt = partial(make_checkpoint, RUN_ID)


def _run(state: RunState = RunState.RUNNING, **changes: object) -> RunRecord:
    lease = Lease(holder="me", expires_at=T0 + timedelta(seconds=30))
    return make_run(RUN_ID, state, **({"lease": lease} | changes))


NOTIFY = ToolCall(id="c-n", name="notify", arguments={"recipient": "user:alice", "message": "deploying"})
INPUT = ToolCall(id="c-i", name="get_input")
ASK = ToolCall(id="c-a", name="ask_human", arguments={"recipient": "user:alice", "question": "ok?"})


def _reply(*calls: ToolCall, raw: bool = True, turn: int = 2) -> ProviderReplied:
    return ProviderReplied(turn=turn, reply=AssistantTurn(content="go", tool_calls=list(calls)), elapsed_s=1.5, raw=raw)


def _decide(run: RunRecord, incoming: object, **ckpt: object) -> Decision:
    return decide(run, _ckpt(**ckpt), AGENT, incoming, now=T0, attempt=ME)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("calls", "keeps"),
    [
        pytest.param((NOTIFY,), True, id="notify"),
        pytest.param((INPUT, NOTIFY), True, id="a-read-then-notify"),
        pytest.param((ToolCall(id="c-x", name="notes__write"),), True, id="an-unknown-or-mcp-tool"),
        pytest.param((ToolCall(id="c-p", name="report_progress", arguments={"kind": "log", "message": "m"}),), True),
        pytest.param((INPUT,), False, id="only-reads"),
        pytest.param((ASK, ASK), False, id="only-questions-asked-after-the-checkpoint"),
        pytest.param((), False, id="a-final-answer"),
    ],
)
def test_a_reply_is_kept_before_its_first_side_effect_and_only_then(calls: tuple[ToolCall, ...], keeps: bool) -> None:
    replied = _reply(*calls)
    decision = _decide(_run(), replied)
    assert decision.then == replace(replied, raw=False)  # then decided on the record as that write or a read left it
    kept = [e for e in decision.effects if isinstance(e, KeepReply)]
    assert decision.effects == ((KeepReply(kept_reply(replied)),) if keeps else ())
    if kept:
        assert (kept[0].reply.turn, kept[0].reply.tool_calls, kept[0].reply.elapsed_s) == (2, list(calls), 1.5)


def test_an_external_agents_action_is_not_kept() -> None:
    external = Agent(
        REVIEWER.model_copy(update={"provider": ProviderConfig(kind="external", agent_id="ext")}),
        ToolRegistry(BUILTIN_TOOLS),
    )
    decision = decide(_run(), _ckpt(), external, _reply(NOTIFY), now=T0, attempt=ME)
    assert decision.effects == ()


def test_keeping_writes_once_per_turn_and_never_for_another_driver_or_a_run_moved_on() -> None:
    reply = kept_reply(_reply(NOTIFY))
    written = with_reply(_run(), reply, "me")
    assert written is not None
    assert written.reply == reply
    assert with_reply(written, kept_reply(_reply(INPUT, NOTIFY)), "me") is None  # the first of the turn stays
    assert with_reply(_run(RunState.FAILED), reply, "me") is None
    with pytest.raises(LeaseLost):
        with_reply(_run(), reply, "someone-else")


def test_the_turn_goes_on_from_the_kept_reply_even_when_another_one_came() -> None:
    first = kept_reply(_reply(NOTIFY))
    run = _run(reply=first)
    decision = _decide(run, _reply(INPUT, NOTIFY, raw=False))  # this handler's reply lost the keeping
    assert isinstance(decision.then, CallTool)
    assert decision.then.turn.calls == [NOTIFY]  # the kept one's calls, not this reply's
    assert decision.then.index == 0


def test_a_boundary_after_a_crash_carries_the_kept_turn_out_instead_of_asking_the_model() -> None:
    run = _run(reply=kept_reply(_reply(NOTIFY)))
    decision = _decide(run, Boundary(recovery=True))
    assert isinstance(decision.then, ProviderReplied)
    assert decision.then.replayed
    assert (decision.then.turn, decision.then.reply.tool_calls, decision.then.elapsed_s) == (2, [NOTIFY], 1.5)
    assert any(isinstance(e, ArmWatchdog) for e in decision.effects)
    # carried out: the notification with the id of (run, turn 2, call 0), then the commit
    tool = _decide(run, decision.then)
    assert isinstance(tool.then, CallTool)
    assert tool.then.turn.calls == [NOTIFY]


def test_a_cancel_recorded_meanwhile_applies_after_the_replayed_turn() -> None:
    cancel = CancelRequest(reason="stop", requested_by="user:alice", requested_at=T0, event_id="evt-c")
    run = _run(reply=kept_reply(_reply(NOTIFY)), cancel=cancel)
    assert isinstance(_decide(run, Boundary(recovery=True)).then, ProviderReplied)
    committed = _decide(run.model_copy(update={"reply": None}), Boundary(), turn=2)  # the turn committed: cancelled
    assert any(isinstance(e, Transition) and e.target is RunState.CANCELLED for e in committed.effects)


def test_a_kept_reply_of_a_committed_turn_is_not_replayed() -> None:
    run = _run(reply=kept_reply(_reply(NOTIFY)))
    decision = _decide(run, Boundary(), turn=2)  # turn 2 is committed: turn 3 asks the model
    assert isinstance(decision.then, CallProvider)
    assert decision.then.turn == 3
    parked = PendingAsk(
        request_id="hr-1", call_id="c-a", turn=1, asked_at=T0, arguments={"recipient": "user:alice", "question": "ok?"}
    )
    assert not isinstance(_decide(run, Boundary(), pending=parked).then, ProviderReplied)


def test_the_kept_reply_goes_with_the_park_and_the_end() -> None:
    run = _run(reply=kept_reply(_reply(NOTIFY)))
    for target in (RunState.WAITING_FOR_HUMAN, RunState.COMPLETED, RunState.FAILED):
        after = moved(run, target, {}, T0)
        assert after is not None
        assert after.reply is None
    still = moved(run, RunState.RUNNING, {"waiting_request_id": None}, T0)  # still driven: kept
    assert still is not None
    assert still.reply is not None


def test_the_replayed_turn_commits_what_the_kept_reply_says() -> None:
    run = _run(reply=kept_reply(_reply(NOTIFY)))
    replay = _decide(run, Boundary(recovery=True)).then
    assert isinstance(replay, ProviderReplied)
    tool = _decide(run, replay).then
    assert isinstance(tool, CallTool)
    done = _decide(
        run, ToolReturned(turn=tool.turn, index=0, outcome=ToolOutput('{"status": "queued"}'), elapsed_s=2.0)
    )
    (saved,) = [e for e in done.effects if isinstance(e, SaveCheckpoint)]
    assistant = saved.checkpoint.messages[-2]
    assert (assistant.role, assistant.tool_calls) == ("assistant", [NOTIFY])
    assert saved.checkpoint.turn == 2
