"""Bad input on the external agents' task paths never crash-loops a consumer nor costs an agent its other tasks
(issue 10, AP-5, AP-9), against a real nats-server with agent-collab in-process.

- An ``agent.task.offered`` whose ids cannot make the task's KV keys is dead-lettered at its first delivery,
  naming the id (``bus.dead_lettered``), not retried until its deliveries run out; the next offer is recorded.
- A task record agent-collab cannot read (written by a newer version, damaged) is left out of the agent's poll
  and logged; the agent still gets its other tasks and acts on them.
- The very same streaming event sent twice is one ``agent.task.streamed`` and the second reply says
  ``duplicate: true``, like every other repeated action.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from collab_replicas import StartCollab, collab_replicas
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from temporality_agent_collab.signing import public_key_text, sign
from temporality_bus import Bus, NatsSettings
from temporality_protocol import AgentTask, AgentTaskOffered, AgentTaskStreamed, BusDeadLettered, make_event
from temporality_protocol.agent_tasks import TaskRecord, task_id_for, task_key
from temporality_protocol.catalog import (
    BUCKET_AGENT_TASKS,
    RPC_AGENTS_HEARTBEAT,
    RPC_AGENTS_REGISTER,
    RPC_AGENTS_TASKS_ACT,
    RPC_AGENTS_TASKS_POLL,
    agent_subject,
)
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays

WAIT_S = 20.0
KEY = Ed25519PrivateKey.generate()
AGENT = "bad-input-bot"


@pytest.fixture
async def collab(nats_settings: NatsSettings, tmp_path: Path) -> AsyncIterator[None]:
    path = tmp_path / "external-agents.yaml"
    path.write_text(
        f"heartbeat_interval_s: 30\nagents:\n  - id: {AGENT}\n    allowed_tools: [ask_human, notify]\n"
        f"    public_key: {public_key_text(KEY.public_key())}\n",
        encoding="utf-8",
    )
    start: StartCollab
    async with collab_replicas(nats_settings) as start:
        await start(path)
        yield


async def call(bus: Bus, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    raw = json.dumps(body).encode()
    mine = agent_subject(subject, AGENT)
    headers = sign(KEY, mine, AGENT, raw, timestamp=int(time.time()), nonce=secrets.token_urlsafe(16))
    reply: dict[str, Any] = json.loads((await bus.nc.request(mine, raw, timeout=10, headers=headers)).data)
    return reply


async def register(bus: Bus) -> None:
    body = {
        "agent_id": AGENT,
        "protocol_version": "1.0",
        "provider": "acme",
        "model": "m",
        "supported_tools": ["ask_human", "notify"],
        "max_context_size": 1000,
    }
    assert (await call(bus, RPC_AGENTS_REGISTER, body))["outcome"] == "registered"
    beat = {"agent_id": AGENT, "timestamp": "2026-12-01T00:00:00Z", "current_state": "idle", "protocol_version": "1.0"}
    assert (await call(bus, RPC_AGENTS_HEARTBEAT, beat))["accepted"]


def offered(run_id: str, *, agent_id: str = AGENT, task_id: str | None = None) -> AgentTaskOffered:
    task_id = task_id or task_id_for(run_id)
    task = AgentTask(
        run_id=run_id,
        task_id=task_id,
        objective="Triage PR #42",
        context={},
        constraints={"tools": ["ask_human"]},
        acceptance_criteria=[],
        timeout_s=600,
        priority="normal",
    )
    return AgentTaskOffered(run_id=run_id, task_id=task_id, agent_id=agent_id, turn=1, task=task)


async def poll(bus: Bus) -> dict[str, Any]:
    body = {"agent_id": AGENT, "protocol_version": "1.0", "session_id": "s1"}
    return await call(bus, RPC_AGENTS_TASKS_POLL, body)


async def polled(bus: Bus, run_id: str) -> dict[str, Any]:
    """Poll until the run's task is in the reply (agent-collab consumed its offer)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        reply = await poll(bus)
        assert reply["accepted"], reply
        found = {t["task"]["run_id"]: t for t in reply["tasks"]}
        if run_id in found:
            return found[run_id]
        assert time.monotonic() < deadline, f"{run_id} not offered within {WAIT_S}s: {reply}"
        await asyncio.sleep(0.05)  # a short poll step between requests, bounded by the deadline


async def test_an_offer_whose_ids_cannot_be_keys_is_dead_lettered_at_once_and_the_next_is_recorded(
    bus: Bus, event_log: EventLog, collab: None
) -> None:
    await register(bus)
    for bad in (offered("run-bad-agent", agent_id="bad agent"), offered("run-bad-task", task_id="task.with.dots")):
        await bus.publish(make_event(bad, source="/test/run-executor", run_id=bad.run_id))
    dead = await event_log.wait_for(
        BusDeadLettered.EVENT_TYPE,
        count=2,
        where=lambda e: e.data["consumer"] == "agent-collab-tasks",
        timeout_s=WAIT_S,
    )
    assert [e.data["deliveries"] for e in dead] == [1, 1], "dead-lettered at the first delivery, not retried"
    assert "agent_id 'bad agent' cannot be part of a KV key" in dead[0].data["error"]
    assert "task_id 'task.with.dots' cannot be part of a KV key" in dead[1].data["error"]

    good = offered("run-good-after-bad")
    await bus.publish(make_event(good, source="/test/run-executor", run_id=good.run_id))
    assert (await polled(bus, good.run_id))["turn"] == 1


async def test_an_unreadable_task_record_costs_the_agent_none_of_its_other_tasks(
    bus: Bus, event_log: EventLog, collab: None
) -> None:
    await register(bus)
    good = offered("run-readable")
    await bus.publish(make_event(good, source="/test/run-executor", run_id=good.run_id))
    await polled(bus, good.run_id)
    kv = await bus.js.key_value(BUCKET_AGENT_TASKS.name)
    # a record this version cannot read: a state it does not know (a newer version's), and one not JSON at all
    readable = await (await bus.store(BUCKET_AGENT_TASKS, TaskRecord)).get(task_key(AGENT, good.task_id))
    assert readable is not None
    newer = {**json.loads(readable.value.model_dump_json()), "state": "delegating", "task_id": "task-newer"}
    await kv.put(task_key(AGENT, "task-newer"), json.dumps(newer).encode())
    await kv.put(task_key(AGENT, "task-damaged"), b"\x00 not json")

    reply = await poll(bus)
    assert reply["accepted"], reply
    assert [t["task"]["run_id"] for t in reply["tasks"]] == [good.run_id]
    result = {
        "agent_id": AGENT,
        "protocol_version": "1.0",
        "task_id": good.task_id,
        "turn": 1,
        "action_id": f"{good.task_id}:1:result",
        "kind": "result",
        "result": "done",
    }
    acted = await call(bus, RPC_AGENTS_TASKS_ACT, result)
    assert (acted["accepted"], acted["state"]) == (True, "completed"), acted


async def test_the_same_streaming_event_again_is_one_event_and_a_duplicate(
    bus: Bus, event_log: EventLog, collab: None
) -> None:
    await register(bus)
    good = offered("run-streaming")
    await bus.publish(make_event(good, source="/test/run-executor", run_id=good.run_id))
    await polled(bus, good.run_id)
    progress = {
        "agent_id": AGENT,
        "protocol_version": "1.0",
        "task_id": good.task_id,
        "turn": 1,
        "action_id": f"{good.task_id}:1:progress-1",
        "kind": "event",
        "event": {"kind": "progress", "message": "half way"},
    }
    first = await call(bus, RPC_AGENTS_TASKS_ACT, progress)
    again = await call(bus, RPC_AGENTS_TASKS_ACT, progress)  # signed afresh: the same action, a new message
    assert (first["accepted"], first["duplicate"]) == (True, False), first
    assert (again["accepted"], again["duplicate"]) == (True, True), again
    other = await call(bus, RPC_AGENTS_TASKS_ACT, {**progress, "action_id": f"{good.task_id}:1:progress-2"})
    assert (other["accepted"], other["duplicate"]) == (True, False), other
    await event_log.wait_for(AgentTaskStreamed.EVENT_TYPE, run_id=good.run_id, count=2, timeout_s=WAIT_S)
    await stays(
        lambda: len(event_log.of_type(AgentTaskStreamed.EVENT_TYPE, good.run_id)) == 2,
        settle_s=1.0,
        what="one agent.task.streamed per action id",
    )
