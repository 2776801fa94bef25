"""``handoff_to_agent`` (AP-6) as the run machine decides it, from plain data (no NATS): who may be handed
to, which tools a run is offered, one handoff per turn, the deterministic ids, and the end of the parent."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from executor_support import REVIEWER
from machine_support import T0, make_checkpoint, make_run

from temporality_protocol import AgentHandedOff, HumanPolicy, LaunchSource, RelayRequest, RunRequested, RunState
from temporality_protocol.agent_tasks import external_call_id
from temporality_run_executor.machine import (
    MAX_HANDOFF_DEPTH,
    Agent,
    Attempt,
    Boundary,
    Decision,
    ProviderReplied,
    Publish,
    SaveCheckpoint,
    Transition,
    decide,
    handed_off_to,
    handoff_ids,
    offered_tools,
)
from temporality_run_executor.providers import AssistantTurn
from temporality_run_executor.records import RunRecord, ToolCall
from temporality_run_executor.tools import BUILTIN_TOOLS, HANDOFF_TO_AGENT, ToolPolicy, ToolRegistry

RUN_ID = "run-ho-1"
HOSTED = frozenset({"reviewer", "finisher"})
AGENT = Agent(REVIEWER.model_copy(update={"tools": ToolPolicy(allow=["*"])}), ToolRegistry(BUILTIN_TOOLS), HOSTED)
ME = Attempt(driver="me", lease_s=30)
POLICY = HumanPolicy(allowed_recipients=["user:alice"])


_run = partial(
    make_run,
    RUN_ID,
    launch=LaunchSource(kind="webhook", trigger_id="t"),
    human=POLICY,
    correlation_id="saga-1",
    collab=True,
)


_ckpt = partial(make_checkpoint, RUN_ID)


def _handoff(call_id: str = "c1", **args: Any) -> ToolCall:
    return ToolCall(id=call_id, name=HANDOFF_TO_AGENT, arguments={"agent": "finisher", "objective": "Finish"} | args)


def _turn(run: RunRecord, *calls: ToolCall) -> Decision:
    replied = ProviderReplied(turn=2, reply=AssistantTurn(tool_calls=list(calls)), elapsed_s=0.1)
    return decide(run, _ckpt(), AGENT, replied, now=T0, attempt=ME)


def _results(decision: Decision) -> list[dict[str, Any]]:
    (saved,) = [e for e in decision.effects if isinstance(e, SaveCheckpoint)]
    return [json.loads(m.content or "null") for m in saved.checkpoint.messages if m.role == "tool"]


def test_the_tool_is_offered_like_the_other_collaboration_tools() -> None:
    assert HANDOFF_TO_AGENT not in [t.name for t in ToolRegistry(BUILTIN_TOOLS).offered(ToolPolicy())]  # default
    assert HANDOFF_TO_AGENT in [t.name for t in offered_tools(_run(), AGENT)]
    relay = RelayRequest(request_id="req-1", asker_run_id="run-a", asker_agent="lead", target_run_id="run-t")
    assert HANDOFF_TO_AGENT not in [t.name for t in offered_tools(_run(relay=relay), AGENT)]  # cannot delegate
    assert HANDOFF_TO_AGENT not in [t.name for t in offered_tools(_run(collab=False), AGENT)]  # COL-9


def test_a_handoff_publishes_the_decision_and_the_child_then_ends_the_run() -> None:
    decision = _turn(_run(), _handoff(constraints=["do not merge"]))
    handoff_id, child = handoff_ids(RUN_ID, external_call_id(2, 0))  # from (run, turn 2, call 0)
    publishes = [e for e in decision.effects if isinstance(e, Publish)]
    (handed,) = [p for p in publishes if isinstance(p.data, AgentHandedOff)]
    (requested,) = [p for p in publishes if isinstance(p.data, RunRequested)]
    assert isinstance(handed.data, AgentHandedOff)
    assert isinstance(requested.data, RunRequested)
    assert (handed.data.handoff_id, handed.data.child_run_id, handed.data.agent) == (handoff_id, child, "finisher")
    assert handed.data.document.constraints == ["do not merge"]
    assert (requested.data.run_id, requested.data.parent_run_id, requested.data.human) == (child, RUN_ID, POLICY)
    assert requested.run_id == child  # the child's trajectory, not the parent's
    assert publishes.index(handed) < publishes.index(requested)  # the decision first
    assert _results(decision) == [
        {
            "agent": "finisher",
            "child_run_id": child,
            "handoff_id": handoff_id,
            "note": "the task is now with that agent's run; this run ends after this turn",
            "status": "handed_off",
        }
    ]
    assert decision.then is None  # no further turn
    (ended,) = [e for e in decision.effects if isinstance(e, Transition)]
    assert ended.target is RunState.COMPLETED
    # the same call again (a replay) is the same handoff and the same child -- whatever id the model gave the call
    # this time; another place (turn, index) is another
    assert _turn(_run(), _handoff()).effects[:2] == _turn(_run(), _handoff()).effects[:2]
    assert _handed(_turn(_run(), _handoff("another-id"))) == (handoff_id, child)
    assert handoff_ids(RUN_ID, external_call_id(2, 1)) != (handoff_id, child)


def _handed(decision: Decision) -> tuple[str, str]:
    (handed,) = [e.data for e in decision.effects if isinstance(e, Publish) and isinstance(e.data, AgentHandedOff)]
    return handed.handoff_id, handed.child_run_id


def test_what_is_refused_is_a_tool_error_and_the_run_goes_on() -> None:
    unknown = _results(_turn(_run(), _handoff(agent="ghost")))
    assert unknown[0]["error"] == "no agent 'ghost' to hand off to; the agents you may hand off to: finisher, reviewer"
    deep = _results(_turn(_run(launch=LaunchSource(kind="event", depth=MAX_HANDOFF_DEPTH)), _handoff()))
    assert "handed on 8 times" in deep[0]["error"]
    twice = _turn(_run(), _handoff("c1"), _handoff("c2"))
    results = _results(twice)
    assert results[0]["status"] == "handed_off"
    assert results[1]["error"].startswith("one handoff per turn")
    asked = ToolCall(id="c0", name="ask_human", arguments={"recipient": "user:alice", "question": "ok?"})
    with_ask = _results(_turn(_run(), _handoff("c1"), asked))
    assert with_ask[1]["error"].startswith("this run has handed its task off")
    refused = _turn(_run(), _handoff(agent="ghost"))
    assert refused.then == Boundary()
    assert not [e for e in refused.effects if isinstance(e, Publish) and isinstance(e.data, AgentHandedOff)]


def test_a_committed_handoff_is_found_again_after_a_crash() -> None:
    decision = _turn(_run(), _handoff())
    (saved,) = [e for e in decision.effects if isinstance(e, SaveCheckpoint)]
    assert handed_off_to(saved.checkpoint) == handoff_ids(RUN_ID, external_call_id(2, 0))[1]
    assert handed_off_to(_ckpt()) is None
    # the boundary after such a checkpoint (the parent crashed before completing) completes the run
    after = decide(_run(), saved.checkpoint, AGENT, Boundary(), now=T0, attempt=ME)
    (ended,) = [e for e in after.effects if isinstance(e, Transition)]
    assert ended.target is RunState.COMPLETED
