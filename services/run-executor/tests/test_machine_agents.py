"""The run machine's side of agent collaboration and the driver lease, decided from plain data (no NATS).

``ask_agent`` / ``answer_agent`` as plans of a turn, ``waiting_for_agent`` and its results, agent messages
queued and framed at turn boundaries (COL-2..COL-5, PRO-1), relay runs (COL-6), runs from before the
protocol (COL-9), and the per-run lease (issue 6).
"""

from __future__ import annotations

import json
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from executor_support import REVIEWER, run_requested
from machine_support import T0, make_checkpoint, make_run

from temporality_protocol import (
    AgentAnswerReceived,
    AgentAsked,
    AgentAskExpired,
    AgentMessageReceived,
    AgentReplied,
    AgentReplyUndeliverable,
    LaunchSource,
    RelayRequest,
    RunInputAfterEnd,
    RunRequested,
    RunResumed,
    RunState,
    RunToolCalled,
    derive_id,
)
from temporality_run_executor.machine import (
    Agent,
    AgentNews,
    ApplyResult,
    Ask,
    Attempt,
    Boundary,
    CallProvider,
    CallTool,
    Decision,
    DeliverMail,
    DisarmWatchdog,
    Emit,
    Incoming,
    LeaseHeld,
    Note,
    Parked,
    ProviderReplied,
    Publish,
    QueueMail,
    Requested,
    Retry,
    SaveCheckpoint,
    TakeLease,
    Transition,
    agent_news,
    apply_result,
    decide,
    delivered,
    initial_checkpoint,
    leased,
    merge_mail,
    moved,
    new_record,
    queued,
    released,
    renewed,
    summary,
)
from temporality_run_executor.machine import __all__ as machine_all
from temporality_run_executor.providers import AssistantTurn
from temporality_run_executor.records import Checkpoint, Lease, RunRecord, ToolCall
from temporality_run_executor.tools import BUILTIN_TOOLS, ToolPolicy, ToolRegistry

RUN_ID = "run-col-1"
AGENT = Agent(REVIEWER.model_copy(update={"tools": ToolPolicy(allow=["*"])}), ToolRegistry(BUILTIN_TOOLS))
ME = Attempt(driver="me", lease_s=30)
ASK_ID = derive_id("req", RUN_ID, "ask_agent", "2", "0")


_run = partial(
    make_run, RUN_ID, launch=LaunchSource(kind="webhook", trigger_id="t"), correlation_id="saga-1", collab=True
)


_ckpt = partial(make_checkpoint, RUN_ID)


def _decide(run: RunRecord | None, ckpt: Checkpoint | None, incoming: Incoming, **kw: Any) -> Decision:
    kw.setdefault("now", T0)
    kw.setdefault("attempt", ME)
    return decide(run, ckpt, kw.pop("agent", AGENT), incoming, **kw)


def _kinds(decision: Decision) -> list[str]:
    return [type(e).__name__ for e in decision.effects if not isinstance(e, Note)]


def _turn(run: RunRecord, ckpt: Checkpoint, *calls: ToolCall, turn: int = 2) -> Decision:
    """The decision on a provider reply making ``calls`` (none of them invoked by the driver)."""
    decision = _decide(
        run, ckpt, ProviderReplied(turn=turn, reply=AssistantTurn(tool_calls=list(calls)), elapsed_s=0.1)
    )
    assert not isinstance(decision.then, CallTool)
    return decision


def _saved(decision: Decision) -> Checkpoint:
    (save,) = [e for e in decision.effects if isinstance(e, SaveCheckpoint)]
    return save.checkpoint


def _tool_results(decision: Decision) -> dict[str, Any]:
    called = [e.data for e in decision.effects if isinstance(e, Publish) and isinstance(e.data, RunToolCalled)]
    return {c.call_id: json.loads(c.result_preview) for c in called}


def _asked_message(mode: str = "async", request_id: str = "req-in-1") -> AgentNews:
    data = AgentMessageReceived(
        request_id=request_id,
        asker_run_id="run-asker",
        asker_agent="architect",
        to="agent:reviewer",
        resolved_run_id=RUN_ID,
        resolved_agent="reviewer",
        recipient_run_id=RUN_ID,
        mode=mode,
        timeout_s=300,
        expires_at=T0 + timedelta(seconds=300) if mode == "wait" else None,
        message="Is v1 still used?",
    )
    return agent_news(data.EVENT_TYPE, f"evt-msg-{request_id}", data)


def _answer(request_id: str = ASK_ID, *, late: bool = False, event_id: str = "evt-ans-1") -> AgentNews:
    data = AgentAnswerReceived(
        request_id=request_id,
        asker_run_id=RUN_ID,
        replier_run_id="run-arch",
        replier_agent="architect",
        outcome="answer",
        answer="Yes, keep v1.",
        mode="wait",
        late=late,
        waited_s=3.0,
    )
    return agent_news(data.EVENT_TYPE, event_id, data)


# --------------------------------------------------------------------------- ask_agent
def test_an_async_ask_publishes_agent_asked_with_a_request_id_stable_per_call() -> None:
    call = ToolCall(
        id="c1", name="ask_agent", arguments={"to": "agent:architect", "message": "x" * 5000, "timeout": 99999}
    )
    decision = _turn(_run(RunState.RUNNING), _ckpt(), call)
    (asked,) = [e for e in decision.effects if isinstance(e, Publish) and isinstance(e.data, AgentAsked)]
    data = asked.data
    assert isinstance(data, AgentAsked)
    again = [e.data for e in _turn(_run(RunState.RUNNING), _ckpt(), call).effects if isinstance(e, Publish)]
    assert data.request_id == ASK_ID == next(d.request_id for d in again if isinstance(d, AgentAsked))
    assert ASK_ID.startswith("req-")
    assert (data.mode, data.timeout_s, len(data.message), data.truncated) == ("async", 3600, 4096, True)
    assert (data.asker_run_id, data.asker_agent, data.to, data.turn) == (RUN_ID, "reviewer", "agent:architect", 2)
    assert asked.id_parts == (ASK_ID,)
    result = _tool_results(decision)["c1"]
    assert result["status"] == "sent"
    assert result["request_id"] == ASK_ID
    # another call (another index, another turn) is another request
    other = ToolCall(id="c2", name="ask_agent", arguments={"to": "agent:architect", "message": "y"})
    two = _turn(_run(RunState.RUNNING), _ckpt(), other, call)
    ids = [e.data.request_id for e in two.effects if isinstance(e, Publish) and isinstance(e.data, AgentAsked)]
    assert ids == [ASK_ID, derive_id("req", RUN_ID, "ask_agent", "2", "1")]
    assert decision.then == Boundary()


def test_a_wait_ask_parks_the_run_in_waiting_for_agent_at_zero_cost() -> None:
    call = ToolCall(
        id="c1", name="ask_agent", arguments={"to": "agent:architect", "message": "Keep v1?", "mode": "wait"}
    )
    committed = _turn(_run(RunState.RUNNING), _ckpt(), call)
    assert not [e for e in committed.effects if isinstance(e, Publish) and isinstance(e.data, AgentAsked)]
    ckpt = _saved(committed)
    assert ckpt.pending is not None
    assert (ckpt.pending.kind, ckpt.pending.request_id) == ("agent", ASK_ID)
    park = _decide(_run(RunState.RUNNING), ckpt, Boundary())
    # the park renews the handler's lease in its compare-and-set, as an external agent's park does
    assert _kinds(park) == ["Publish", "DisarmWatchdog", "TakeLease", "Transition"]
    asked, guard, move = park.effects[0], park.effects[2], park.effects[3]
    assert guard == TakeLease(Lease(holder=ME.driver, expires_at=T0 + timedelta(seconds=ME.lease_s)), renew=True)
    assert isinstance(asked, Publish)
    assert isinstance(asked.data, AgentAsked)
    assert asked.data.mode == "wait"
    assert asked.id_parts == (ASK_ID,)
    assert move == Transition(RunState.WAITING_FOR_AGENT, {"waiting_request_id": ASK_ID, "waiting_since": T0})
    assert park.then == Parked()
    # one waiting call per turn
    two = _turn(
        _run(RunState.RUNNING),
        _ckpt(),
        call,
        ToolCall(id="c2", name="ask_human", arguments={"recipient": "user:alice", "question": "q"}),
    )
    assert "per turn" in _tool_results(two)["c2"]["error"]


def test_the_answer_resumes_a_waiting_run_and_becomes_the_tool_result() -> None:
    ckpt = _ckpt(turn=2, pending=None)
    waiting = _run(RunState.WAITING_FOR_AGENT, waiting_request_id=ASK_ID, waiting_since=T0)
    news = _answer()
    resume = _decide(waiting, ckpt, news)
    assert _kinds(resume) == ["Publish", "ArmWatchdog", "Transition"]
    resumed = resume.effects[0]
    assert isinstance(resumed, Publish)
    assert resumed.data == RunResumed(run_id=RUN_ID, reason="answer", from_turn=2, request_id=ASK_ID, waited_s=3.0)
    assert resume.then == news
    apply = _decide(_run(RunState.RESUMING, waiting_request_id=ASK_ID), ckpt, news)
    assert _kinds(apply) == ["TakeLease", "ApplyResult", "Transition"]
    (result,) = [e for e in apply.effects if isinstance(e, ApplyResult)]
    assert result.key == "evt-ans-1"
    content = json.loads(result.content)
    assert content == {
        "request_id": ASK_ID,
        "status": "answered",
        "outcome": "answer",
        "replier": "agent:architect",
        "replier_run_id": "run-arch",
        "answer": "Yes, keep v1.",
        "truncated": False,
    }
    # a timeout resumes it too, saying so; the request stays open (COL-2)
    expired = AgentAskExpired(
        request_id=ASK_ID, asker_run_id=RUN_ID, recipient_run_id="run-arch", timeout_s=5, waited_s=5.0
    )
    timed_out = agent_news(expired.EVENT_TYPE, "evt-exp", expired)
    assert timed_out.reason == "expiry"
    assert json.loads(timed_out.result or "{}")["status"] == "timed_out"
    # the answer arriving before the run has parked is retried, never queued as a message
    parking = _ckpt(
        turn=2,
        pending=_saved(
            _turn(
                _run(RunState.RUNNING),
                _ckpt(),
                ToolCall(id="c1", name="ask_agent", arguments={"to": "agent:a", "message": "m", "mode": "wait"}),
            )
        ).pending,
    )
    early = _decide(_run(RunState.RUNNING), parking, news)
    assert early.effects == (Retry("the run has not finished parking on this request yet"),)


def test_a_late_answer_after_the_timeout_arrives_as_a_message() -> None:
    wait = ToolCall(id="c1", name="ask_agent", arguments={"to": "agent:a", "message": "m", "mode": "wait"})
    parked = _saved(_turn(_run(RunState.RUNNING), _ckpt(), wait))
    resumed = apply_result(parked, ASK_ID, "{}", T0, key="evt-exp")
    assert resumed is not None
    assert resumed.resumed_by == "evt-exp"
    late = _answer(late=True, event_id="evt-late")
    decision = _decide(_run(RunState.RUNNING), resumed, late)
    assert _kinds(decision) == ["QueueMail"]
    # the expiry redelivered is a duplicate, but it drives a run whose resumer died (recovery)
    again = AgentNews("agent.ask_expired", "evt-exp", RUN_ID, late.mail.model_copy(update={"key": "evt-exp"}), "{}")
    # ... and the last committed turn's run.checkpointed and metrics again (deduplicated repeats, or lost ones)
    assert _kinds(_decide(_run(RunState.RUNNING), resumed, again)) == ["TakeLease", "Publish", "Publish"]
    assert _kinds(_decide(_run(RunState.WAITING_FOR_HUMAN), resumed, again)) == []
    # applied, but its resumer died before the run was running again: the redelivery finishes the resume
    resuming = _run(RunState.RESUMING, waiting_request_id=ASK_ID)
    finish = _decide(resuming, resumed, again)
    assert _kinds(finish) == ["TakeLease", "ApplyResult", "Transition"]
    assert apply_result(resumed, ASK_ID, "{}", T0, key="evt-exp") is None  # the ApplyResult changes nothing
    assert finish.then == Boundary()


# --------------------------------------------------------------------------- delivery at turn boundaries
@pytest.mark.parametrize(
    ("state", "extra"),
    [
        (RunState.RUNNING, {}),
        (RunState.RESUMING, {}),
        (RunState.WAITING_FOR_HUMAN, {"waiting_request_id": "hr-1"}),
        # waiting for another request: kept, never dropped
        (RunState.WAITING_FOR_AGENT, {"waiting_request_id": "req-other"}),
    ],
)
def test_a_message_is_queued_whatever_the_live_run_is_doing(state: RunState, extra: dict[str, Any]) -> None:
    for news in (_asked_message(), _answer("req-async-1")):
        decision = _decide(_run(state, **extra), _ckpt(), news)
        assert _kinds(decision) == ["QueueMail"]
        assert decision.then is None


def test_queued_messages_are_framed_at_the_next_boundary_once() -> None:
    news = _asked_message("wait")
    ckpt = queued(_ckpt(), news.mail)
    assert ckpt is not None
    assert queued(ckpt, news.mail) is None  # redelivered: applied once
    # a boundary delivers them before the next provider call
    boundary = _decide(_run(RunState.RUNNING), ckpt, Boundary())
    assert boundary.effects == (DeliverMail(),)
    assert boundary.then == Boundary()
    done = delivered(ckpt, T0)
    assert done is not None
    assert not done.inbox
    framed = done.messages[-1]
    assert framed.role == "user"
    assert framed.content is not None
    head = framed.content.splitlines()[0]
    assert (
        head == "[agent message] type: ask | request_id: req-in-1 | from: agent:architect (run run-asker) | mode: wait"
    )
    assert "answer it in your next tool batch with answer_agent" in framed.content
    assert framed.content.endswith("---\nIs v1 still used?")
    assert [r.request_id for r in done.received] == ["req-in-1"]
    assert queued(done, news.mail) is None  # delivered: never again
    # and the next provider call sees it (the scripted provider through the context)
    call = _decide(_run(RunState.RUNNING), done, Boundary()).then
    assert isinstance(call, CallProvider)
    assert call.context.asks == ["req-in-1"]
    assert call.context.mail[0]["text"] == "Is v1 still used?"


def test_a_run_about_to_park_keeps_its_messages_queued() -> None:
    news = _asked_message()
    pending = _saved(
        _turn(
            _run(RunState.RUNNING),
            _ckpt(),
            ToolCall(id="c1", name="ask_human", arguments={"recipient": "user:alice", "question": "q"}),
        )
    ).pending
    ckpt = queued(_ckpt(turn=2, pending=pending), news.mail)
    assert ckpt is not None
    park = _decide(_run(RunState.RUNNING), ckpt, Boundary())
    assert DeliverMail() not in park.effects
    assert any(isinstance(e, DisarmWatchdog) for e in park.effects)


def test_mail_queued_mid_turn_survives_the_turns_commit() -> None:
    base = _ckpt()
    saved = base.model_copy(update={"turn": 2, "checkpoint_id": "ckpt-2"})
    fresh = queued(base, _asked_message().mail)
    assert fresh is not None
    merged = merge_mail(saved, base, fresh)
    assert merged is not None
    assert (merged.turn, [m.request_id for m in merged.inbox]) == (2, ["req-in-1"])
    more = queued(fresh, _asked_message(request_id="req-in-2").mail)
    assert more is not None
    again = merge_mail(merged, base, more)
    assert again is not None
    assert [m.request_id for m in again.inbox] == ["req-in-1", "req-in-2"]
    # another driver committed the turn: nothing to merge
    assert merge_mail(saved, base, saved) is None


def test_messages_for_finished_unknown_and_relay_runs() -> None:
    finished = _decide(_run(RunState.COMPLETED), _ckpt(), _asked_message())
    (after,) = [e.data for e in finished.effects if isinstance(e, Publish)]  # journaled, never applied
    assert isinstance(after, RunInputAfterEnd)
    assert (after.state, after.input_type, after.sender) == ("completed", "agent.message.received", "agent:architect")
    assert after.detail == f"run {RUN_ID} is completed: the message was not applied"
    assert _kinds(_decide(None, None, _asked_message())) == ["Reject"]
    relayed = AgentNews("agent.message.received", "e", "t/ask/01", _asked_message().mail, relay=True)
    assert _kinds(_decide(None, None, relayed)) == []  # the request is in the relay run's input
    undeliverable = AgentReplyUndeliverable(
        request_id="req-in-1", replier_run_id=RUN_ID, reason="asker_finished", detail="the asker has finished"
    )
    news = agent_news(undeliverable.EVENT_TYPE, "evt-ru", undeliverable)
    assert news.run_id == RUN_ID
    assert news.result is None
    assert _kinds(_decide(_run(RunState.RUNNING), _ckpt(), news)) == ["QueueMail"]


# --------------------------------------------------------------------------- answer_agent
def test_answer_agent_answers_only_a_received_request_and_only_once() -> None:
    ckpt = delivered(queued(_ckpt(), _asked_message().mail) or _ckpt(), T0)
    assert ckpt is not None
    run = _run(RunState.RUNNING)
    answer = ToolCall(id="c1", name="answer_agent", arguments={"request_id": "req-in-1", "answer": "No."})
    twice = ToolCall(id="c2", name="answer_agent", arguments={"request_id": "req-in-1", "answer": "Still no."})
    stranger = ToolCall(id="c3", name="answer_agent", arguments={"request_id": "req-other", "answer": "?"})
    decision = _turn(run, ckpt, answer, twice, stranger)
    (replied,) = [e for e in decision.effects if isinstance(e, Publish) and isinstance(e.data, AgentReplied)]
    assert replied.data == AgentReplied(
        request_id="req-in-1", replier_run_id=RUN_ID, replier_agent="reviewer", outcome="answer", answer="No.", turn=2
    )
    assert replied.id_parts == ("2", "0")
    results = _tool_results(decision)
    assert results["c1"]["status"] == "sent"
    assert "already answered" in results["c2"]["error"]
    assert "received no request 'req-other'" in results["c3"]["error"]
    saved = _saved(decision)
    assert [r.answered for r in saved.received] == [True]
    # a later turn: refused locally too
    later = _turn(run, saved, twice, turn=3)
    assert "already answered" in _tool_results(later)["c2"]["error"]
    assert not [e for e in later.effects if isinstance(e, Publish) and isinstance(e.data, AgentReplied)]


def test_a_refusal_is_an_outcome() -> None:
    ckpt = delivered(queued(_ckpt(), _asked_message().mail) or _ckpt(), T0)
    assert ckpt is not None
    refuse = ToolCall(
        id="c1", name="answer_agent", arguments={"request_id": "req-in-1", "answer": "Not mine.", "refuse": True}
    )
    decision = _turn(_run(RunState.RUNNING), ckpt, refuse)
    (replied,) = [e.data for e in decision.effects if isinstance(e, Publish) and isinstance(e.data, AgentReplied)]
    assert isinstance(replied, AgentReplied)
    assert replied.outcome == "refusal"


# --------------------------------------------------------------------------- relay runs, older runs
def test_a_relay_run_answers_from_its_first_turn_with_a_short_budget_and_no_delegation() -> None:
    relay = RelayRequest(request_id="req-r-1", asker_run_id="run-asker", asker_agent="architect", target_run_id=RUN_ID)
    base = run_requested(f"{RUN_ID}/ask/01").payload(RunRequested)
    data = RunRequested.model_validate(
        base.model_dump()
        | {
            "relay": relay.model_dump(),
            "parent_run_id": RUN_ID,
            "input": {
                "instructions": "answer it",
                "incoming_asks": [{"request_id": "req-r-1", "type": "ask", "mode": "wait", "message": "Keep v1?"}],
            },
        }
    )
    record = new_record(Requested(request=data, correlation_id="saga-1"), T0)
    assert record.relay == relay
    assert record.collab
    ckpt = initial_checkpoint(record, AGENT, T0)
    assert [r.request_id for r in ckpt.received] == ["req-r-1"]
    assert "request_id: req-r-1" in (ckpt.messages[-1].content or "")
    assert queued(ckpt, _asked_message(request_id="req-r-1").mail) is None  # not delivered twice
    card = summary(AGENT, record)
    assert "ask_agent" not in card.tools
    assert "answer_agent" in card.tools
    assert card.max_turns == 6
    call = _decide(record.model_copy(update={"state": RunState.RUNNING}), ckpt, Boundary()).then
    assert isinstance(call, CallProvider)
    assert call.context.relay
    assert call.context.asks == ["req-r-1"]
    assert "ask_agent" not in [t.name for t in call.tools]
    # asking anyway is refused as a tool it does not have; answering is fine
    ask = ToolCall(id="c1", name="ask_agent", arguments={"to": "agent:x", "message": "m"})
    decision = _turn(record.model_copy(update={"state": RunState.RUNNING}), ckpt, ask, turn=1)
    assert "not allowed" in _tool_results(decision)["c1"]["error"]
    at_limit = ckpt.model_copy(update={"turn": 6})
    failed = _decide(record.model_copy(update={"state": RunState.RUNNING}), at_limit, Boundary())
    assert "Transition" in _kinds(failed)


def test_the_first_message_says_who_launched_the_run() -> None:
    """A trigger by id; a handoff child and a relay run by who started them (not ``event trigger -``); a relay's
    waiting ask with its deadline when agent-collab gives one."""
    base = run_requested(f"{RUN_ID}/x").payload(RunRequested)

    def first_message(**changes: Any) -> str:
        data = RunRequested.model_validate(base.model_dump() | changes)
        record = new_record(Requested(request=data, correlation_id="saga-1"), T0)
        ckpt = initial_checkpoint(record, AGENT, T0)
        return "\n".join(m.content or "" for m in ckpt.messages[1:])

    assert "Launched by: webhook trigger ado-pr-review\n" in first_message()
    handoff = {"handoff": {"handoff_id": "ho-1", "from_agent": "architect", "from_run_id": "run-p"}}
    child = first_message(launch={"kind": "event", "depth": 1}, parent_run_id="run-p", input=handoff)
    assert "Launched by: a handoff from agent architect (run run-p)\n" in child
    relay = RelayRequest(request_id="req-r-1", asker_run_id="run-asker", asker_agent="architect", target_run_id=RUN_ID)
    ask = {"request_id": "req-r-1", "type": "ask", "mode": "wait", "message": "Keep v1?"}
    relayed = first_message(
        launch={"kind": "event"},
        relay=relay.model_dump(),
        parent_run_id=RUN_ID,
        input={"incoming_asks": [{**ask, "expires_at": "2026-12-07T10:00:00+00:00"}]},
    )
    assert (
        f"Launched by: agent-collab, to answer agent:architect's question req-r-1 (run run-asker) for your earlier "
        f"run {RUN_ID}\n"
    ) in relayed
    assert "The asker is waiting for your answer (until 2026-12-07T10:00:00+00:00)" in relayed
    assert "trigger -" not in child + relayed


def test_a_run_from_before_the_protocol_is_offered_none_of_its_tools() -> None:
    old = _run(RunState.RUNNING, collab=False)
    call = _decide(old, _ckpt(), Boundary()).then
    assert isinstance(call, CallProvider)
    assert {t.name for t in call.tools} & {"ask_agent", "answer_agent", "get_collaborators"} == set()
    assert RunRecord.model_validate(old.model_dump(exclude={"collab"})).collab is False


def test_the_tools_follow_the_cards_allow_and_deny_list() -> None:
    denied = Agent(REVIEWER.model_copy(update={"tools": ToolPolicy(allow=["*"], deny=["ask_agent"])}), AGENT.tools)
    call = _decide(_run(RunState.RUNNING), _ckpt(), Boundary(), agent=denied).then
    assert isinstance(call, CallProvider)
    assert "ask_agent" not in [t.name for t in call.tools]
    assert "answer_agent" in [t.name for t in call.tools]


# --------------------------------------------------------------------------- the lease
def test_a_redelivery_finding_a_live_lease_retries_and_an_expired_one_is_taken_over() -> None:
    incoming = Requested(request=run_requested(RUN_ID).payload(RunRequested), correlation_id=RUN_ID)
    held = _run(RunState.RUNNING, lease=Lease(holder="other", expires_at=T0 + timedelta(seconds=10)))
    busy = _decide(held, _ckpt(turn=3), incoming)
    (retry,) = [e for e in busy.effects if isinstance(e, Retry)]
    assert retry.lost_race
    assert busy.then is None
    # the driver died: its lease ran out, the redelivery recovers
    later = _decide(held, _ckpt(turn=3), incoming, now=T0 + timedelta(seconds=11))
    assert isinstance(later.effects[1], TakeLease)
    assert any(isinstance(e, Publish) and isinstance(e.data, RunResumed) for e in later.effects)
    assert later.then == Boundary(recovery=True)
    # its own lease does not stop a handler
    mine = _run(RunState.RUNNING, lease=Lease(holder="me", expires_at=T0 + timedelta(seconds=10)))
    assert isinstance(_decide(mine, _ckpt(), Boundary()).then, CallProvider)
    # and a boundary whose lease another handler took over stops driving
    assert _decide(held, _ckpt(), Boundary()).then is None


def test_the_lease_is_a_compare_and_set_and_goes_when_the_run_parks_or_ends() -> None:
    run = _run(RunState.RUNNING, lease=Lease(holder="other", expires_at=T0 + timedelta(seconds=10)))
    with pytest.raises(LeaseHeld):
        leased(run, Lease(holder="me", expires_at=T0 + timedelta(seconds=30)), T0)
    taken = leased(run, Lease(holder="me", expires_at=T0 + timedelta(seconds=40)), T0 + timedelta(seconds=11))
    assert taken is not None
    assert taken.lease is not None
    assert taken.lease.holder == "me"
    assert released(taken, "other") is None
    let_go = released(taken, "me")
    assert let_go is not None
    assert let_go.lease is None
    parked = moved(taken, RunState.WAITING_FOR_AGENT, {}, T0)
    assert parked is not None
    assert parked.lease is None
    assert leased(_run(RunState.WAITING_FOR_HUMAN), Lease(holder="me", expires_at=T0), T0) is None


def test_a_plan_is_an_emit_for_the_collaboration_calls() -> None:
    call = ToolCall(id="c1", name="ask_agent", arguments={"to": "agent:a", "message": "m", "mode": "wait"})
    decision = _decide(
        _run(RunState.RUNNING), _ckpt(), ProviderReplied(turn=2, reply=AssistantTurn(tool_calls=[call]), elapsed_s=0)
    )
    assert decision.then == Boundary()
    asynchronous = ToolCall(id="c1", name="ask_agent", arguments={"to": "agent:a", "message": "m"})
    replied = _decide(
        _run(RunState.RUNNING),
        _ckpt(),
        ProviderReplied(
            turn=2, reply=AssistantTurn(tool_calls=[asynchronous, ToolCall(id="c2", name="get_input")]), elapsed_s=0
        ),
    )
    assert isinstance(replied.then, CallTool)
    assert isinstance(replied.then.turn.plans[0], Emit)
    assert not isinstance(replied.then.turn.plans[0], Ask)
    assert QueueMail.__name__ in machine_all  # exported


def test_a_lease_is_renewed_only_by_its_holder_while_the_run_is_driven() -> None:
    mine = _run(RunState.RUNNING, lease=Lease(holder="me", expires_at=T0))
    later = T0 + timedelta(seconds=30)
    kept = renewed(mine, "me", later)
    assert kept is not None
    assert kept.lease == Lease(holder="me", expires_at=later)
    assert renewed(mine, "other", later) is None
    assert renewed(mine.model_copy(update={"state": RunState.COMPLETED}), "me", later) is None
