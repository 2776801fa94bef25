"""Handoff between agents (AP-6) on a real nats-server: the run-executor and agent-collab in-process.

``lead`` first tries to hand off to an agent that does not exist (a tool error it sees), then hands its task
to ``finisher`` with a full handoff document: one ``agent.handed_off`` decides it, one ``run.requested``
starts the child in the same saga (parent = lead, the document as its input, lead's human policy), and
lead completes, handed off. The child reads its input and asks ``get_collaborators``, which lists the
parent; agent-collab lists the child (relation ``handoff``) to the parent's saga as well.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from executor_support import executor_main

from temporality_agent_collab.__main__ import SPEC as COLLAB_SPEC
from temporality_agent_collab.__main__ import configure as configure_collab
from temporality_agent_collab.settings import Settings as CollabSettings
from temporality_bus import Bus, NatsSettings
from temporality_protocol import (
    AgentHandedOff,
    CollaboratorsQuery,
    CollaboratorsReply,
    HumanAnswered,
    HumanPolicy,
    HumanRequested,
    LaunchSource,
    OptionAnswer,
    RunCompleted,
    RunRequested,
    RunToolCalled,
    make_event,
)
from temporality_protocol.agent_tasks import external_call_id
from temporality_protocol.catalog import RPC_GET_COLLABORATORS
from temporality_run_executor.machine import handoff_ids
from temporality_run_executor.settings import Settings as ExecutorSettings
from temporality_service import run_until
from temporality_testing.events import EventLog
from temporality_testing.inprocess import serving

SAGA = "saga-handoff-1"
DOCUMENT: dict[str, Any] = {
    "objective": "Finish the review of PR 42",
    "current_status": "API change read, tests not yet",
    "completed_steps": ["read the diff"],
    "remaining_steps": ["run the tests", "write the verdict"],
    "artifacts": ["notes: totals become money objects"],
    "memory_links": ["run:run-lead-1"],
    "open_questions": ["do old clients parse money objects?"],
    "constraints": ["do not merge"],
    "acceptance_criteria": ["a verdict with reasons"],
}
LEAD: list[dict[str, Any]] = [
    {"id": "bad", "call": {"tool": "handoff_to_agent", "args": {"agent": "ghost", "objective": "anything"}}},
    {
        "id": "handoff",
        "when": "results.bad.error != null",
        "call": {"tool": "handoff_to_agent", "args": {"agent": "finisher", **DOCUMENT}},
    },
    {"id": "done", "answer": "not reached: the run ends with its handoff"},
]
FINISHER: list[dict[str, Any]] = [
    {"id": "input", "call": {"tool": "get_input", "args": {}}},
    # parks on a person until the test has seen agent-collab project the handoff (then asks it)
    {"id": "hold", "call": {"tool": "ask_human", "args": {"recipient": "user:alice", "question": "go?"}}},
    {"id": "collab", "call": {"tool": "get_collaborators", "args": {}}},
    {
        "id": "done",
        "answer": "did {{ results.input.handoff.objective }} for {{ results.input.handoff.from_run_id }}; "
        "saw {{ join(',', sort(results.collab.collaborators[?kind=='agent'].run_id)) }}",
    },
]


def _card(agent: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": agent,
        "role": agent,
        "system_prompt": "You work together.",
        "tools": {"allow": ["*"]},
        "provider": {"kind": "scripted", "script": {"steps": steps}},
    }


@pytest.fixture
async def services(nats_settings: NatsSettings, tmp_path: Path) -> AsyncIterator[None]:
    """The run-executor and agent-collab, in-process, ready."""
    agents = tmp_path / "agents.yaml"
    agents.write_text(yaml.safe_dump({"agents": [_card("lead", LEAD), _card("finisher", FINISHER)]}), encoding="utf-8")
    executor = ExecutorSettings(nats=nats_settings, agents_file=agents)
    collab = CollabSettings(nats=nats_settings)
    async with serving(
        ("run-executor", executor_main(executor)),
        (
            "agent-collab",
            lambda stop, ready: run_until(COLLAB_SPEC, collab, configure_collab(collab), stop, ready=ready),
        ),
        ready_within_s=15,
        stop_within_s=20,
    ):
        yield


async def _collaborators(bus: Bus, run_id: str, want: str, timeout_s: float = 10) -> CollaboratorsReply:
    """agent-collab's ``get_collaborators`` for ``run_id``, once it lists run ``want`` (bounded wait)."""
    reply = None
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                raw = await bus.nc.request(
                    RPC_GET_COLLABORATORS, CollaboratorsQuery(run_id=run_id).model_dump_json().encode(), timeout=5
                )
                reply = CollaboratorsReply.model_validate_json(raw.data)
                if any(c.run_id == want for c in reply.collaborators):
                    return reply
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"get_collaborators({run_id}) never listed {want}: {reply}") from None


@pytest.mark.usefixtures("services")
async def test_a_handoff_starts_one_child_in_the_saga_and_ends_the_parent(bus: Bus, event_log: EventLog) -> None:
    lead = "run-lead-1"
    policy = HumanPolicy(allowed_recipients=["user:alice"], default_timeout_s=900)
    requested = RunRequested(
        run_id=lead,
        agent="lead",
        title="Review PR 42",
        launch=LaunchSource(kind="webhook", trigger_id="t"),
        human=policy,
    )
    await bus.publish(make_event(requested, source="/test", id=f"evt-rr-{lead}", run_id=lead, correlation_id=SAGA))
    handoff_id, child = handoff_ids(lead, external_call_id(2, 0))  # turn 2, call 0

    # the unknown agent: a tool error the model sees, and no handoff
    (bad,) = await event_log.wait_for(
        "run.tool_called", run_id=lead, where=lambda e: e.payload(RunToolCalled).call_id == "call-bad"
    )
    error = json.loads(bad.payload(RunToolCalled).result_preview)["error"]
    assert "no agent 'ghost'" in error
    assert "finisher" in error
    assert "lead" in error

    # the parent completes, handed off; the child completes with the document it was given
    (ended,) = await event_log.wait_for("run.completed", run_id=lead)
    assert json.loads(ended.payload(RunCompleted).result) == {"status": "handed_off", "child_run_id": child}
    (asked,) = await event_log.wait_for("human.requested", run_id=child, timeout_s=20)
    await _collaborators(bus, child, lead)  # agent-collab has the child in the parent's saga: let it ask
    request = asked.payload(HumanRequested)
    answered = HumanAnswered(
        request_id=request.request_id,
        run_id=child,
        recipient=request.recipient,
        responder=request.recipient,
        answer=OptionAnswer(option_id="go"),
        channel="web",
        waited_s=0.1,
    )
    await bus.publish(make_event(answered, source="/test", id=f"evt-ans-{request.request_id}", run_id=child))
    (finished,) = await event_log.wait_for("run.completed", run_id=child, timeout_s=20)
    assert finished.correlationid == SAGA
    assert finished.payload(RunCompleted).result == (
        f"did {DOCUMENT['objective']} for {lead}; saw {','.join(sorted([lead, child]))}"
    )

    # exactly one decision, exactly one child, both with deterministic ids
    (handed,) = event_log.of_type("agent.handed_off")
    data = handed.payload(AgentHandedOff)
    assert (data.handoff_id, data.child_run_id, data.parent_run_id, data.agent) == (handoff_id, child, lead, "finisher")
    assert data.document.model_dump() == DOCUMENT
    assert handed.runid == lead
    assert handed.correlationid == SAGA
    children = [e for e in event_log.of_type("run.requested") if e.payload(RunRequested).parent_run_id == lead]
    assert [e.runid for e in children] == [child]
    (child_req,) = children
    req = child_req.payload(RunRequested)
    assert child_req.correlationid == SAGA
    assert (req.run_id, req.agent, req.human) == (child, "finisher", policy)  # never wider than the parent's
    assert req.input["handoff"] == {"handoff_id": handoff_id, "from_agent": "lead", "from_run_id": lead, **DOCUMENT}
    assert req.launch.depth == 1
    assert len(event_log.of_type("run.created", run_id=child)) == 1
    assert not event_log.of_type("run.failed")
    assert not event_log.of_type("bus.dead_lettered")

    # get_collaborators: from the parent's saga the child is listed as a handoff, and the child sees the parent
    for asker in (lead, child):
        reply = await _collaborators(bus, asker, child)
        assert reply.saga_id == SAGA
        by_run = {c.run_id: c for c in reply.collaborators if c.kind == "agent"}
        assert set(by_run) == {lead, child}
        assert (by_run[child].id, by_run[child].relation, by_run[child].parent_run_id) == (
            "agent:finisher",
            "handoff",
            lead,
        )
        assert (by_run[lead].id, by_run[lead].relation) == ("agent:lead", None)
