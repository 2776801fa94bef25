"""An external agent collaborates through the Agent Protocol like a hosted one (issue 10, AP-5, COL-1..COL-4):
its ``tool_calls`` actions call ``get_collaborators``, ``notify`` and ``ask_agent``, and a ``wait`` ask parks its
run ``waiting_for_agent`` on the request until the hosted addressee answers at its next turn boundary. Agent
messages -- the answer to its ``async`` ask, an ask addressed to it -- reach it with the turn at whose boundary
they were delivered (``messages``, framed as a model reads them), and it answers an ask with ``answer_agent``.

The run-executor and agent-collab in-process on one real nats-server; the test is the external agent (signed
requests on its own subjects) and the person the hosted ``expert`` parks on.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from collab_support import let_go, request_run
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_support import eventually
from signed_agent_support import SignedAgent

from temporality_agent_collab.__main__ import SPEC as COLLAB_SPEC
from temporality_agent_collab.__main__ import configure as configure_collab
from temporality_agent_collab.settings import Settings as CollabSettings
from temporality_agent_collab.signing import public_key_text
from temporality_bus import Bus, NatsSettings
from temporality_protocol import (
    HumanRequested,
    RunState,
)
from temporality_protocol.catalog import BUCKET_CHECKPOINTS, BUCKET_RUNS
from temporality_run_executor.__main__ import SPEC as EXECUTOR_SPEC
from temporality_run_executor.__main__ import configure as configure_executor
from temporality_run_executor.machine import ask_request_id
from temporality_run_executor.records import Checkpoint, RunRecord
from temporality_run_executor.settings import Settings as ExecutorSettings
from temporality_service import run_until
from temporality_testing.events import EventLog
from temporality_testing.inprocess import serving

AGENT = "collab-bot"
KEY = Ed25519PrivateKey.generate()
TOOLS = ["get_collaborators", "ask_agent", "answer_agent", "notify"]
SAGA = "saga-external-asks"
WAIT_S = 30.0

EXPERT = [
    {"id": "hold", "call": {"tool": "ask_human", "args": {"recipient": "user:alice", "question": "hold"}}},
    {
        "id": "reply",
        "when": "length(run.asks) > `0`",
        "call": {"tool": "answer_agent", "args": {"request_id": "{{ run.asks[0] }}", "answer": "Keep v1"}},
    },
    {"id": "done", "answer": "answered"},
]
#: Asks the external agent's run and waits for its answer.
QUESTIONER = [
    {
        "id": "ask",
        "call": {
            "tool": "ask_agent",
            "args": {"to": "agent:ext-lead", "message": "Is v2 ready?", "mode": "wait", "timeout": 300},
        },
    },
    {"id": "done", "answer": "got={{ results.ask.answer }}"},
]


@pytest.fixture
async def services(nats_settings: NatsSettings, tmp_path: Path) -> AsyncIterator[None]:
    allow = tmp_path / "external-agents.yaml"
    entry = {"id": AGENT, "allowed_tools": TOOLS, "public_key": public_key_text(KEY.public_key())}
    allow.write_text(yaml.safe_dump({"heartbeat_interval_s": 600, "agents": [entry]}), encoding="utf-8")
    cards = [
        {
            "id": "expert",
            "role": "expert",
            "system_prompt": "You answer.",
            "tools": {"allow": ["*"]},
            "provider": {"kind": "scripted", "script": {"steps": EXPERT}},
        },
        {
            "id": "questioner",
            "role": "questioner",
            "system_prompt": "You ask.",
            "tools": {"allow": ["ask_agent"]},
            "provider": {"kind": "scripted", "script": {"steps": QUESTIONER}},
        },
        {
            "id": "ext-lead",
            "role": "lead (external agent)",
            "system_prompt": "Ask the expert.",
            "tools": {"allow": TOOLS},
            "provider": {"kind": "external", "agent_id": AGENT},
        },
    ]
    agents = tmp_path / "agents.yaml"
    agents.write_text(yaml.safe_dump({"agents": cards}), encoding="utf-8")
    executor = ExecutorSettings(nats=nats_settings, agents_file=agents)
    collab = CollabSettings(nats=nats_settings, external_agents_file=allow)
    async with serving(
        ("agent-collab", lambda s, r: run_until(COLLAB_SPEC, collab, configure_collab(collab), s, ready=r)),
        ("run-executor", lambda s, r: run_until(EXECUTOR_SPEC, executor, configure_executor(executor), s, ready=r)),
        ready_within_s=15,
        stop_within_s=20,
    ):
        yield


async def _request(bus: Bus, agent: str) -> str:
    return await request_run(bus, f"run-{agent}-1", agent, SAGA)


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


async def _queued(bus: Bus, run_id: str, kind: str) -> None:
    """The run has an agent message of ``kind`` queued for its next boundary."""
    checkpoints = await bus.store(BUCKET_CHECKPOINTS, Checkpoint)

    async def there() -> bool | None:
        found = await checkpoints.get(run_id)
        return True if found is not None and any(m.kind == kind for m in found.value.inbox) else None

    await eventually(there, WAIT_S, f"a {kind} queued for {run_id}")


def _content(assignment: dict[str, Any], tool: str) -> Any:
    (found,) = [i for i in assignment["inputs"] if i["tool"] == tool]
    return json.loads(found["content"])


@pytest.mark.usefixtures("services")
async def test_an_external_agent_lists_collaborators_notifies_and_waits_on_an_ask_agent(
    bus: Bus, event_log: EventLog
) -> None:
    agent = SignedAgent(bus, AGENT, KEY, TOOLS, "session-1", WAIT_S)
    await agent.register()
    expert = await _request(bus, "expert")
    (held,) = await event_log.wait_for("human.requested", run_id=expert)
    lead = await _request(bus, "ext-lead")

    # turn 1: who is in the saga, and a notification (neither parks the run)
    await agent.take(lead, 1)
    calls = [_call("get_collaborators"), _call("notify", recipient="user:alice", message="asking the expert")]
    assert (await agent.act(lead, 1, "tool_calls", calls=calls))["accepted"]
    turn2 = await agent.take(lead, 2)
    collaborators = _content(turn2, "get_collaborators")
    assert "agent:expert" in json.dumps(collaborators)
    (notified,) = await event_log.wait_for("human.notify_requested", run_id=lead)
    assert notified.data["message"] == "asking the expert"

    # turn 2: a wait ask parks the run on the request -- no turn is offered to the agent meanwhile
    ask = _call("ask_agent", to="agent:expert", message="Keep v1?", mode="wait", timeout=120)
    assert (await agent.act(lead, 2, "tool_calls", calls=[ask]))["accepted"]
    request_id = ask_request_id(lead, 2, 0)
    (asked,) = await event_log.wait_for("agent.asked", run_id=lead)
    assert asked.data["request_id"] == request_id
    assert asked.data["asker_agent"] == "ext-lead"
    runs = await bus.store(BUCKET_RUNS, RunRecord)

    async def parked_on_the_ask() -> RunRecord | None:
        found = await runs.get(lead)
        ok = found is not None and found.value.state is RunState.WAITING_FOR_AGENT
        return found.value if ok and found is not None and found.value.waiting_request_id == request_id else None

    await eventually(parked_on_the_ask, WAIT_S, f"{lead} parked on {request_id}")
    await event_log.wait_for("agent.message.received", run_id=expert)

    # the person lets expert go: it answers at its boundary; the answer is turn 3's input
    await let_go(bus, held.payload(HumanRequested), expert)
    turn3 = await agent.take(lead, 3)
    answer = _content(turn3, "ask_agent")
    assert (answer["request_id"], answer["answer"], answer["replier"]) == (request_id, "Keep v1", "agent:expert")
    assert (await agent.act(lead, 3, "result", result="the expert says: Keep v1"))["accepted"]
    (done,) = await event_log.wait_for("run.completed", run_id=lead, timeout_s=WAIT_S)
    assert done.data["result"] == "the expert says: Keep v1"
    await event_log.wait_for("run.completed", run_id=expert)
    await event_log.caught_up()
    assert len(event_log.of_type("agent.answer.received", lead)) == 1
    assert len(event_log.of_type("agent.replied", expert)) == 1
    assert not event_log.of_type("agent.task.refused")
    assert not event_log.of_type("bus.dead_lettered")


@pytest.mark.usefixtures("services")
async def test_agent_messages_reach_the_external_agent_with_its_next_turn_and_it_answers_an_ask(
    bus: Bus, event_log: EventLog
) -> None:
    agent = SignedAgent(bus, AGENT, KEY, TOOLS, "session-2", WAIT_S)
    await agent.register()
    expert = await _request(bus, "expert")
    (held,) = await event_log.wait_for("human.requested", run_id=expert)
    lead = await _request(bus, "ext-lead")

    # turn 1: an async ask -- the tool result says "sent"; the answer comes later as a message
    await agent.take(lead, 1)
    ask = _call("ask_agent", to="agent:expert", message="Keep v1?")
    assert (await agent.act(lead, 1, "tool_calls", calls=[ask]))["accepted"]
    turn2 = await agent.take(lead, 2)
    assert _content(turn2, "ask_agent")["status"] == "sent"
    assert "messages" not in turn2  # none yet: the property is left out
    await let_go(bus, held.payload(HumanRequested), expert)
    await _queued(bus, lead, "answer")  # the run is parked on its agent: the answer waits for its next boundary

    # a hosted agent asks the external agent's run (wait mode)
    questioner = await _request(bus, "questioner")
    asked_id = ask_request_id(questioner, 1, 0)
    await _queued(bus, lead, "ask")

    # turn 2's action reaches the boundary: turn 3 carries both messages, framed as a model reads them
    assert (await agent.act(lead, 2, "tool_calls", calls=[_call("get_collaborators")]))["accepted"]
    turn3 = await agent.take(lead, 3)
    answer, incoming = turn3["messages"]
    assert "type: answer" in answer
    assert "from: agent:expert" in answer
    assert answer.endswith("Keep v1")
    assert f"type: ask | request_id: {asked_id} | from: agent:questioner" in incoming
    assert "answer_agent" in incoming
    assert incoming.endswith("Is v2 ready?")

    # it answers the ask like a model would: the questioner resumes with the answer
    reply = _call("answer_agent", request_id=asked_id, answer="Not yet")
    assert (await agent.act(lead, 3, "tool_calls", calls=[reply]))["accepted"]
    (asked_done,) = await event_log.wait_for("run.completed", run_id=questioner, timeout_s=WAIT_S)
    assert asked_done.data["result"] == "got=Not yet"
    turn4 = await agent.take(lead, 4)
    assert _content(turn4, "answer_agent")["status"] == "sent"
    assert "messages" not in turn4
    assert (await agent.act(lead, 4, "result", result="done"))["accepted"]
    await event_log.wait_for("run.completed", run_id=lead, timeout_s=WAIT_S)
    await event_log.caught_up()
    (replied,) = event_log.of_type("agent.replied", lead)
    assert replied.data["request_id"] == asked_id
    assert not event_log.of_type("agent.reply_undeliverable")
    assert not event_log.of_type("agent.task.refused")
    assert not event_log.of_type("bus.dead_lettered")
