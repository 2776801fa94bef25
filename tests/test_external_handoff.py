"""Handoffs to and from external agents (issue 10, AP-6) with agent-collab and the run-executor as processes on a
real nats-server; the test is the external agent, speaking the signed Agent Protocol (register, poll, act).

- An external agent's ``handoff`` action hands its task on exactly as a hosted model's ``handoff_to_agent``: a
  target that is no card comes back as the next turn's input; a real one is one ``agent.handed_off``, one child
  ``run.requested`` in the saga (derived ids), the handing run completes handed off and its task ends with it; the
  same action sent again is a duplicate and changes nothing.
- A hosted agent hands off to an external agent's card: the child is an external run, offered to that agent with
  the handoff document in its task.
- The example external agent (``examples/external-agent/agent.py --handoff-to``, the protocol's reference
  implementation) asks a person, then hands its task to a hosted card with the document it wrote.
- Without the grant or without a document, a handoff action is refused (pure checks, no stack).

The module shares one stack (its start is most of the cost); each test waits only on its own runs' events.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from e2e_support import eventually
from pydantic import ValidationError
from signed_agent_support import SignedAgent

from temporality_agent_collab.signing import public_key_text
from temporality_agent_collab.tasks import TaskRefused, acted, child_run_id
from temporality_bus import Bus, NatsSettings, Store
from temporality_embedded.natsserver import NatsServer
from temporality_embedded.processes import ServiceProcess
from temporality_protocol import (
    AgentTask,
    HumanPolicy,
    LaunchSource,
    RunRequested,
    RunState,
    TaskAction,
    make_event,
)
from temporality_protocol.agent_tasks import StoredAction, TaskRecord, external_call_id
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    BUCKET_RUNS,
)
from temporality_protocol.states import AgentTaskState
from temporality_run_executor.external import turn_of
from temporality_run_executor.machine import handoff_ids
from temporality_run_executor.records import RunRecord
from temporality_testing.events import EventLog
from temporality_testing.facts import answered_by

AGENT = "handoff-bot"
KEY = Ed25519PrivateKey.generate()
#: The example agent (its own key, written to a file for it).
EXAMPLE = "example-agent"
EXAMPLE_KEY = Ed25519PrivateKey.generate()
EXAMPLE_SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "external-agent" / "agent.py"
SESSION = "handoff-session-1"
GRANTED = ["get_input", "handoff_to_agent"]
#: A process start or a redelivery, on the shared and loaded machine.
WAIT_S = 45.0
DOCUMENT: dict[str, Any] = {
    "objective": "Finish the review of PR 42",
    "current_status": "API change read, tests not yet",
    "completed_steps": ["read the diff"],
    "remaining_steps": ["run the tests", "write the verdict"],
    "artifacts": ["notes: totals become money objects"],
    "memory_links": ["run:earlier"],
    "open_questions": ["do old clients parse money objects?"],
    "constraints": ["do not merge"],
    "acceptance_criteria": ["a verdict with reasons"],
}


def _files(root: Path) -> dict[str, str]:
    allow = root / "external-agents.yaml"
    allow.write_text(
        yaml.safe_dump(
            {
                "heartbeat_interval_s": 600,  # never offline while the module runs
                "agents": [
                    {"id": AGENT, "allowed_tools": GRANTED, "public_key": public_key_text(KEY.public_key())},
                    {
                        "id": EXAMPLE,
                        "allowed_tools": ["ask_human", "handoff_to_agent"],
                        "public_key": public_key_text(EXAMPLE_KEY.public_key()),
                    },
                ],
            }
        ),
        encoding="utf-8",
    )
    external = {"role": "External", "system_prompt": "Work.", "provider": {"kind": "external", "agent_id": AGENT}}
    scripted = {"role": "Hosted", "system_prompt": "Work.", "tools": {"allow": ["*"]}}
    finisher = [
        {"id": "input", "call": {"tool": "get_input", "args": {}}},
        {
            "id": "done",
            "answer": "finished {{ results.input.handoff.objective }} for {{ results.input.handoff.from_run_id }}",
        },
    ]
    lead = [
        {"id": "handoff", "call": {"tool": "handoff_to_agent", "args": {"agent": "ext-taker", **DOCUMENT}}},
        {"id": "done", "answer": "not reached: the run ends with its handoff"},
    ]
    cards = root / "agents.yaml"
    cards.write_text(
        yaml.safe_dump(
            {
                "agents": [
                    {"id": "ext-hander", **external, "tools": {"allow": GRANTED}},
                    {"id": "ext-taker", **external, "tools": {"allow": ["get_input"]}},
                    {
                        "id": "ext-example",
                        **external,
                        "provider": {"kind": "external", "agent_id": EXAMPLE},
                        "tools": {"allow": ["ask_human", "handoff_to_agent"]},
                    },
                    {
                        "id": "hosted-finisher",
                        **scripted,
                        "provider": {"kind": "scripted", "script": {"steps": finisher}},
                    },
                    {"id": "hosted-lead", **scripted, "provider": {"kind": "scripted", "script": {"steps": lead}}},
                ]
            }
        ),
        encoding="utf-8",
    )
    (root / "example-agent.key").write_bytes(
        EXAMPLE_KEY.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    )
    return {"TEMPORALITY_COLLAB_EXTERNAL_AGENTS_FILE": str(allow), "TEMPORALITY_EXECUTOR_AGENTS_FILE": str(cards)}


async def _prepare(url: str) -> None:
    """The streams and buckets (the journal owns them in a deployment; no journal runs here)."""
    async with Bus.connect(NatsSettings(url=url), name="test-setup") as bus:
        await bus.ensure(ALL_STREAMS, ALL_BUCKETS)


@dataclass
class HandoffStack:
    nats: NatsServer
    root: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HandoffStack]:
    root = tmp_path_factory.mktemp("external-handoff")
    nats = NatsServer(root / "nats")
    nats.start()
    env = {
        "TEMPORALITY_NATS_URL": nats.url,
        "TEMPORALITY_NATS_ACK_WAIT_S": "2",
        "TEMPORALITY_LOG_FORMAT": "console",
        **_files(root),
    }
    services: list[ServiceProcess] = []
    try:
        asyncio.run(_prepare(nats.url))
        for name in ("agent-collab", "run-executor"):  # agent-collab first: it creates the tasks' bucket
            process = ServiceProcess(name, env, root / name)
            services.append(process)
            process.start()
            process.wait_ready(WAIT_S)
        yield HandoffStack(nats, root)
    finally:
        for process in services:
            process.terminate()
        nats.stop()


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Client:
    bus: Bus
    events: EventLog
    agent: SignedAgent
    runs: Store[RunRecord]

    async def request(self, card: str, saga: str) -> str:
        run_id = f"run-ho-{uuid.uuid4().hex[:12]}"
        data = RunRequested(
            run_id=run_id,
            agent=card,
            title="Review PR 42",
            launch=LaunchSource(kind="webhook", trigger_id="t-handoff"),
            input={"pr": 42},
            human=HumanPolicy(allowed_recipients=["user:alice"]),
        )
        event = make_event(data, source="/test", id=f"evt-rr-{run_id}", run_id=run_id, correlation_id=saga)
        await self.bus.publish(event)
        return run_id

    async def parked(self, run_id: str, turn: int) -> None:
        """The run offered ``turn`` to its agent and parked on it."""
        await self.events.wait_for(
            "agent.task.offered", run_id=run_id, where=lambda e: e.data["turn"] == turn, timeout_s=WAIT_S
        )

        async def waiting() -> bool:
            found = await self.runs.get(run_id)
            return found is not None and found.value.state is RunState.WAITING_FOR_AGENT

        assert await eventually(waiting, WAIT_S, f"run {run_id} parked on turn {turn}")


@pytest.fixture
async def client(stack: HandoffStack) -> AsyncIterator[Client]:
    async with Bus.connect(NatsSettings(url=stack.nats.url), name="test") as bus:
        events = await EventLog(bus.nc, since=_now()).start()
        agent = SignedAgent(bus, AGENT, KEY, GRANTED, SESSION, WAIT_S)
        await agent.register()
        try:
            yield Client(bus, events, agent, await bus.store(BUCKET_RUNS, RunRecord))
        finally:
            await events.stop()


async def test_an_external_agent_hands_its_task_to_a_hosted_agent_once(client: Client) -> None:
    saga = f"saga-{uuid.uuid4().hex[:8]}"
    run_id = await client.request("ext-hander", saga)
    await client.parked(run_id, 1)
    task = await client.agent.take(run_id, 1)
    assert "handoff_to_agent" in task["task"]["constraints"]["tools"]

    # a handoff without its document is malformed; one to an agent that is no card is the next turn's input
    bare = await client.agent.act(run_id, 1, "handoff")
    assert (bare["accepted"], bare["refusal"]["reason"]) == (False, "malformed_request"), bare
    ghost = await client.agent.act(run_id, 1, "handoff", handoff={"agent": "ghost", "objective": "anything"})
    assert (ghost["accepted"], ghost["duplicate"], ghost["state"]) == (True, False, "acted"), ghost
    await client.parked(run_id, 2)
    (error,) = (await client.agent.take(run_id, 2))["inputs"]
    assert error["tool"] == "handoff_to_agent"
    assert "no agent 'ghost'" in error["content"]
    assert "hosted-finisher" in error["content"]

    # the handoff, and the very same action again (a retry after a lost reply): one handoff, one child
    handoff = {"agent": "hosted-finisher", **DOCUMENT}
    first = await client.agent.act(run_id, 2, "handoff", handoff=handoff)
    again = await client.agent.act(run_id, 2, "handoff", handoff=handoff)
    assert (first["accepted"], first["duplicate"]) == (True, False), first
    assert (again["accepted"], again["duplicate"]) == (True, True), again
    handoff_id, child = handoff_ids(run_id, "ext-2-0")
    # the agent is told its child in the reply (the same on the duplicate); the refused one's was never started
    assert first["child_run_id"] == again["child_run_id"] == child
    assert ghost["child_run_id"] == handoff_ids(run_id, "ext-1-0")[1] != child
    assert "child_run_id" not in bare, "no property in a reply that is not an accepted handoff's"

    (ended,) = await client.events.wait_for("run.completed", run_id=run_id, timeout_s=WAIT_S)
    assert json.loads(ended.data["result"]) == {"status": "handed_off", "child_run_id": child}
    (finished,) = await client.events.wait_for("run.completed", run_id=child, timeout_s=WAIT_S)
    assert finished.data["result"] == f"finished {DOCUMENT['objective']} for {run_id}"
    assert finished.correlationid == saga
    (task_ended,) = await client.events.wait_for("agent.task.ended", run_id=run_id, timeout_s=WAIT_S)
    assert (task_ended.data["state"], task_ended.data["cause"]) == ("completed", "run.completed")

    (handed,) = client.events.of_type("agent.handed_off", run_id=run_id)
    assert (handed.data["handoff_id"], handed.data["child_run_id"]) == (handoff_id, child)
    assert (handed.data["parent_agent"], handed.data["agent"], handed.data["turn"]) == (
        "ext-hander",
        "hosted-finisher",
        2,
    )
    assert handed.data["document"] == DOCUMENT
    assert handed.correlationid == saga
    children = [e for e in client.events.of_type("run.requested") if e.data.get("parent_run_id") == run_id]
    assert [e.runid for e in children] == [child]
    (request,) = children
    assert request.correlationid == saga
    assert request.data["input"]["handoff"] == {
        "handoff_id": handoff_id,
        "from_agent": "ext-hander",
        "from_run_id": run_id,
        **DOCUMENT,
    }
    assert request.data["launch"]["depth"] == 1
    acts = [
        (e.data["turn"], e.data["kind"], e.data["tools"])
        for e in client.events.of_type("agent.task.acted", run_id=run_id)
    ]
    assert acts == [(1, "handoff", ["handoff_to_agent"]), (2, "handoff", ["handoff_to_agent"])]
    assert len(client.events.of_type("run.completed", run_id=run_id)) == 1
    assert not client.events.of_type("run.failed", run_id=run_id)
    late = await client.agent.act(run_id, 3, "result", result="too late")
    assert (late["accepted"], late["refusal"]["reason"]) == (False, "task_ended"), late
    assert "child_run_id" not in late


async def test_a_hosted_agent_hands_off_to_an_external_agent(client: Client) -> None:
    saga = f"saga-{uuid.uuid4().hex[:8]}"
    lead = await client.request("hosted-lead", saga)
    (handed,) = await client.events.wait_for("agent.handed_off", run_id=lead, timeout_s=WAIT_S)
    handoff_id, child = handoff_ids(lead, external_call_id(handed.data["turn"], 0))  # (run, turn, call 0)
    assert (handed.data["handoff_id"], handed.data["child_run_id"], handed.data["agent"]) == (
        handoff_id,
        child,
        "ext-taker",
    )
    (ended,) = await client.events.wait_for("run.completed", run_id=lead, timeout_s=WAIT_S)
    assert json.loads(ended.data["result"]) == {"status": "handed_off", "child_run_id": child}

    # the child is an external run: its task, offered to the agent, carries the handoff document
    await client.parked(child, 1)
    task = (await client.agent.take(child, 1))["task"]
    assert task["objective"] == f"Handoff from hosted-lead: {DOCUMENT['objective']}"
    assert task["context"]["input"]["handoff"] == {
        "handoff_id": handoff_id,
        "from_agent": "hosted-lead",
        "from_run_id": lead,
        **DOCUMENT,
    }
    assert task["acceptance_criteria"] == DOCUMENT["acceptance_criteria"]
    done = await client.agent.act(child, 1, "result", result="verdict: ship it")
    assert done["accepted"], done
    (finished,) = await client.events.wait_for("run.completed", run_id=child, timeout_s=WAIT_S)
    assert finished.data["result"] == "verdict: ship it"
    assert finished.correlationid == saga
    (offered,) = client.events.of_type("agent.task.offered", run_id=child)
    assert offered.correlationid == saga
    assert len(client.events.of_type("agent.handed_off", run_id=lead)) == 1
    assert not client.events.of_type("run.failed", run_id=child)


async def test_the_example_agent_asks_a_person_then_hands_its_task_off(
    stack: HandoffStack, client: Client, tmp_path: Path
) -> None:
    """The reference agent, from the published schemas alone (every body it sends and gets is checked against
    them): the person's answer, then a ``handoff`` action to a hosted card; the child finishes with the document."""
    saga = f"saga-{uuid.uuid4().hex[:8]}"
    run_id = await client.request("ext-example", saga)
    log = (tmp_path / "agent.log").open("ab")
    command = [
        *(sys.executable, str(EXAMPLE_SCRIPT), "--nats-url", stack.nats.url, "--key-file"),
        *(str(stack.root / "example-agent.key"), "--work", "--tasks", "1", "--poll-s", "0.2", "--period-s", "0.4"),
        *("--handoff-to", "hosted-finisher"),
    ]
    agent = await asyncio.create_subprocess_exec(*command, stdout=log, stderr=log)
    log.close()
    try:
        (asked,) = await client.events.wait_for("human.requested", run_id=run_id, timeout_s=WAIT_S)
        answered = answered_by("alice", run_id, asked.data["request_id"], "yes", waited_s=0.1)
        event = make_event(answered, source="/test", id=f"evt-ha-{run_id}", run_id=run_id, correlation_id=saga)
        await client.bus.publish(event)
        (handed,) = await client.events.wait_for("agent.handed_off", run_id=run_id, timeout_s=WAIT_S)
        child = handed.data["child_run_id"]
        (ended,) = await client.events.wait_for("run.completed", run_id=run_id, timeout_s=WAIT_S)
        assert json.loads(ended.data["result"]) == {"status": "handed_off", "child_run_id": child}
        (finished,) = await client.events.wait_for("run.completed", run_id=child, timeout_s=WAIT_S)
        assert finished.data["result"] == f"finished Review PR 42 for {run_id}"
        assert finished.correlationid == saga
        assert await asyncio.wait_for(agent.wait(), WAIT_S) == 0, (tmp_path / "agent.log").read_text()
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
    # the agent was told its child in the action's reply, before the run carried the handoff out
    assert f"handed off to hosted-finisher: child run {child}" in (tmp_path / "agent.log").read_text()
    document = handed.data["document"]
    assert handed.data["agent"] == "hosted-finisher"
    assert document["objective"] == "Review PR 42"
    assert document["current_status"].startswith("a person decided: ")
    assert document["memory_links"] == [f"run:{run_id}"]
    assert document["completed_steps"] == ["asked user:alice whether to go ahead"]
    assert len(client.events.of_type("human.requested", run_id=run_id)) == 1
    assert not client.events.of_type("run.failed", run_id=run_id)


# --------------------------------------------------------------------------- the protocol's rules, pure
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _working() -> TaskRecord:
    task = AgentTask(
        run_id="r",
        task_id="task-r",
        objective="o",
        context={},
        constraints={},
        acceptance_criteria=[],
        timeout_s=60,
        priority="normal",
    )
    return TaskRecord(
        agent_id=AGENT,
        task_id="task-r",
        run_id="r",
        correlation_id="r",
        task=task,
        state=AgentTaskState.WORKING,
        take=1,
        session_id="s",
        created_at=T0,
        updated_at=T0,
    )


def _handoff_action(**handoff: Any) -> TaskAction:
    return TaskAction.model_validate(
        {
            "agent_id": AGENT,
            "protocol_version": "1.0",
            "task_id": "task-r",
            "turn": 1,
            "action_id": "task-r:1:handoff",
            "kind": "handoff",
            "handoff": {"agent": "finisher", **DOCUMENT, **handoff},
            "some_future_field": "ignored",  # PRO-3
        }
    )


def test_a_handoff_action_needs_the_grant_and_a_document() -> None:
    with pytest.raises(ValidationError, match="a handoff action needs handoff"):
        TaskAction.model_validate(
            {
                "agent_id": AGENT,
                "protocol_version": "1.0",
                "task_id": "t",
                "turn": 1,
                "action_id": "a",
                "kind": "handoff",
            }
        )
    with pytest.raises(ValidationError):
        _handoff_action(objective="")
    with pytest.raises(TaskRefused) as refused:
        acted(_working(), _handoff_action(), ["get_input"], T0)
    assert refused.value.reason == "tool_not_allowed"
    record = acted(_working(), _handoff_action(), GRANTED, T0)
    assert record is not None
    assert record.state is AgentTaskState.ACTED
    (stored,) = record.actions
    assert stored.handoff is not None
    assert stored.handoff.agent == "finisher"
    assert acted(record, _handoff_action(), GRANTED, T0) is None  # the same action again: a duplicate


def test_a_stored_handoff_is_one_handoff_to_agent_call_with_a_stable_id() -> None:
    record = acted(_working(), _handoff_action(), GRANTED, T0)
    assert record is not None
    stored = StoredAction.model_validate_json(record.actions[0].model_dump_json())  # as read back from KV
    for _ in range(2):  # a replay of the turn reads the same action: the same call, the same child
        reply = turn_of(stored)
        assert not isinstance(reply, str)
        (call,) = reply.tool_calls
        assert (call.id, call.name) == ("ext-1-0", "handoff_to_agent")
        assert call.arguments == {"agent": "finisher", **DOCUMENT}
        # what agent-collab tells the agent is the child the executor derives from that call
        assert child_run_id(record, stored) == handoff_ids("r", call.id)[1]
