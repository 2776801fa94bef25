"""The example external agent (``examples/external-agent/agent.py``) does not send a refused action again at every
poll when no resend can ever be accepted (issue 10, AP-5, AP-11): it fails the task, saying why, so the run ends
now instead of at its compute budget. A real nats-server, agent-collab in-process, the test in the run-executor's
place (it offers the task); the agent is not granted ``ask_human``, the tool its task needs."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from collab_replicas import StartCollab, collab_replicas

from temporality_bus import Bus, NatsSettings
from temporality_protocol import AgentTask, AgentTaskActed, AgentTaskOffered, AgentTaskRefused, make_event
from temporality_protocol.agent_tasks import TaskRecord, task_id_for, task_key
from temporality_protocol.catalog import BUCKET_AGENT_TASKS
from temporality_testing.events import EventLog

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "external-agent" / "agent.py"
AGENT = "example-agent"
#: The agent's whole run on the loaded machine (a process start, its registration, a few polls).
RUN_S = 90.0


@pytest.fixture
async def collab(nats_settings: NatsSettings, tmp_path: Path) -> AsyncIterator[None]:
    path = tmp_path / "external-agents.yaml"
    path.write_text(
        f"heartbeat_interval_s: 30\nagents:\n  - id: {AGENT}\n    allowed_tools: [get_input]\n"
        "    allow_unsigned: true\n",
        encoding="utf-8",
    )
    start: StartCollab
    async with collab_replicas(nats_settings) as start:
        await start(path)
        yield


async def test_the_example_agent_fails_a_task_whose_action_can_never_be_accepted(
    bus: Bus, event_log: EventLog, collab: None, nats_settings: NatsSettings
) -> None:
    run_id = "run-example-not-granted"
    task = AgentTask(
        run_id=run_id,
        task_id=task_id_for(run_id),
        objective="Decide whether the change may go ahead",
        context={"people": ["user:alice"]},
        constraints={"tools": ["ask_human"]},
        acceptance_criteria=[],
        timeout_s=600,
        priority="normal",
    )
    offer = AgentTaskOffered(run_id=run_id, task_id=task.task_id, agent_id=AGENT, turn=1, task=task)
    await bus.publish(make_event(offer, source="/test/run-executor", run_id=run_id))

    agent = await asyncio.create_subprocess_exec(
        *(sys.executable, str(EXAMPLE), "--nats-url", nats_settings.url, "--work", "--tasks", "1"),
        *("--poll-s", "0.2", "--period-s", "1"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _out, err = await asyncio.wait_for(agent.communicate(), RUN_S)
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
    assert agent.returncode == 0, err.decode(errors="replace")[-3000:]

    (refused,) = await event_log.wait_for(AgentTaskRefused.EVENT_TYPE, timeout_s=RUN_S)
    assert (refused.data["reason"], refused.data["kind"]) == ("tool_not_allowed", "tool_calls")
    (acted,) = await event_log.wait_for(AgentTaskActed.EVENT_TYPE, run_id=run_id, timeout_s=RUN_S)
    assert acted.data["kind"] == "failure"
    assert "tool_not_allowed" in acted.data["detail"]
    assert "ask_human" in acted.data["detail"]
    stored = await (await bus.store(BUCKET_AGENT_TASKS, TaskRecord)).get(task_key(AGENT, task.task_id))
    assert stored is not None
    assert (stored.value.state.value, [a.kind for a in stored.value.actions]) == ("failed", ["failure"])
    assert b"failed: tool_calls refused (tool_not_allowed)" in err
