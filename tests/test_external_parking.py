"""A run whose turn is with its external agent holds no run-executor slot (issue 10, AP-5): it parks
``waiting_for_agent`` at the provider call like a person's wait, ``agent.task.acted`` wakes it, a durable timer ends
it at its compute budget, a cancel ends it at once.

Real processes on a real nats-server: agent-collab and the run-executor run as ``python -m ...`` (the executor with
``TEMPORALITY_EXECUTOR_MAX_INFLIGHT=1``: one run driven at a time), and the test is the external agent, speaking the
signed Agent Protocol (register, poll its tasks, act). The tests share the stack (its start is most of their cost);
each waits only on its own runs' events, stored since it began (``EventLog(since=)``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_support import eventually
from signed_agent_support import SignedAgent

from temporality_agent_collab.signing import public_key_text
from temporality_agent_collab.tasks import acted
from temporality_bus import Bus, NatsSettings, Store
from temporality_embedded.natsserver import NatsServer
from temporality_embedded.processes import ServiceProcess
from temporality_protocol import (
    HumanPolicy,
    LaunchSource,
    RunCancelRequested,
    RunRequested,
    RunState,
    TaskAction,
    make_event,
)
from temporality_protocol.agent_tasks import TaskRecord, task_id_for, task_key
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    BUCKET_AGENT_TASKS,
    BUCKET_RUNS,
    CONSUMERS,
    TIMER_SCHEDULE_RUN_WATCHDOG,
)
from temporality_run_executor.records import RunRecord
from temporality_testing.events import EventLog
from temporality_testing.timers import armed_schedules

AGENT = "park-bot"
KEY = Ed25519PrivateKey.generate()
SESSION = "park-session-1"
#: A process start, a redelivery or a timer, on the shared and loaded machine.
WAIT_S = 45.0
#: The short card's whole compute budget: its parked run fails when it runs out.
SHORT_BUDGET_S = 2


@dataclass
class ParkingStack:
    nats: NatsServer
    root: Path
    env: dict[str, str]
    services: dict[str, ServiceProcess]
    starts: int = 0

    def start(self, name: str) -> None:
        self.starts += 1
        process = ServiceProcess(name, self.env, self.root / f"run-{self.starts}")
        process.start()
        process.wait_ready(WAIT_S)
        self.services[name] = process


def _files(root: Path) -> dict[str, str]:
    allow = root / "external-agents.yaml"
    allow.write_text(
        yaml.safe_dump(
            {
                "heartbeat_interval_s": 600,  # never offline while the module runs
                "agents": [
                    {
                        "id": AGENT,
                        "allowed_tools": ["get_input", "ask_human"],
                        "public_key": public_key_text(KEY.public_key()),
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    card = {
        "role": "Triage (external agent)",
        "system_prompt": "Decide.",
        "tools": {"allow": ["get_input", "ask_human"]},
        "provider": {"kind": "external", "agent_id": AGENT},
    }
    cards = root / "agents.yaml"
    cards.write_text(
        yaml.safe_dump(
            {
                "agents": [
                    {"id": "ext-long", **card, "limits": {"max_turns": 5, "max_compute_s": 600}},
                    {"id": "ext-short", **card, "limits": {"max_turns": 5, "max_compute_s": SHORT_BUDGET_S}},
                ]
            }
        ),
        encoding="utf-8",
    )
    return {
        "TEMPORALITY_COLLAB_EXTERNAL_AGENTS_FILE": str(allow),
        "TEMPORALITY_EXECUTOR_AGENTS_FILE": str(cards),
        "TEMPORALITY_EXECUTOR_MAX_INFLIGHT": "1",  # one run driven at a time: a parked one must not be it
    }


async def _prepare(url: str) -> None:
    """The streams and buckets (the journal owns them in a deployment; no journal runs here)."""
    async with Bus.connect(NatsSettings(url=url), name="test-setup") as bus:
        await bus.ensure(ALL_STREAMS, ALL_BUCKETS)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ParkingStack]:
    root = tmp_path_factory.mktemp("external-parking")
    nats = NatsServer(root / "nats")
    nats.start()
    env = {
        "TEMPORALITY_NATS_URL": nats.url,
        "TEMPORALITY_NATS_ACK_WAIT_S": "2",
        "TEMPORALITY_LOG_FORMAT": "console",
        **_files(root),
    }
    stack = ParkingStack(nats, root, env, {})
    try:
        asyncio.run(_prepare(nats.url))
        stack.start("agent-collab")  # first: it creates the tasks' bucket the executor reads
        stack.start("run-executor")
        yield stack
    finally:
        for process in stack.services.values():
            process.terminate()
        nats.stop()


@dataclass
class Client:
    bus: Bus
    events: EventLog
    agent: SignedAgent
    runs: Store[RunRecord]

    async def request(self, card: str) -> str:
        run_id = f"run-park-{uuid.uuid4().hex[:12]}"
        data = RunRequested(
            run_id=run_id,
            agent=card,
            title="Decide whether the change may go ahead",
            launch=LaunchSource(kind="webhook", trigger_id="t-park"),
            input={"change": "orders-api"},
            human=HumanPolicy(allowed_recipients=["user:alice"]),
        )
        await self.bus.publish(make_event(data, source="/test", id=f"evt-rr-{run_id}", run_id=run_id))
        return run_id

    async def state(self, run_id: str, state: RunState) -> RunRecord:
        """Wait (bounded) until the executor's record of the run is in ``state``."""

        async def reached() -> RunRecord | None:
            found = await self.runs.get(run_id)
            return found.value if found is not None and found.value.state is state else None

        record: RunRecord = await eventually(reached, WAIT_S, f"run {run_id} {state.value}")
        return record

    async def parked(self, run_id: str, turn: int) -> RunRecord:
        """The run offered ``turn`` to its agent and parked on it."""
        await self.events.wait_for(
            "agent.task.offered", run_id=run_id, where=lambda e: e.data["turn"] == turn, timeout_s=WAIT_S
        )
        record = await self.state(run_id, RunState.WAITING_FOR_AGENT)
        assert record.lease is None  # nobody drives it
        assert record.waiting_request_id == f"{task_id_for(run_id)}.turn-{turn}"
        return record


def _now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture
async def client(stack: ParkingStack) -> AsyncIterator[Client]:
    async with Bus.connect(NatsSettings(url=stack.nats.url), name="test") as bus:
        events = await EventLog(bus.nc, since=_now()).start()
        agent = SignedAgent(bus, AGENT, KEY, ["get_input", "ask_human"], SESSION, WAIT_S)
        await agent.register()
        try:
            yield Client(bus, events, agent, await bus.store(BUCKET_RUNS, RunRecord))
        finally:
            await events.stop()


async def _nothing_in_flight(bus: Bus, durable: str) -> bool:
    info = await bus.js.consumer_info(CONSUMERS[durable].stream, durable)
    return info.num_ack_pending == 0


async def test_two_external_runs_at_concurrency_one_both_progress(client: Client) -> None:
    """The executor drives one run at a time. Both runs are offered and park (no message held while their agent
    works); the second finishes while the first is still parked, then the first takes two turns (tool calls,
    parked again, a result). One offer per turn, one completion each."""
    first = await client.request("ext-long")
    second = await client.request("ext-long")
    await client.parked(first, 1)
    await client.parked(second, 1)  # not blocked behind the first's external turn
    assert await eventually(lambda: _nothing_in_flight(client.bus, "run-executor-requests"), WAIT_S, "no slot held")

    await client.agent.take(second, 1)
    done = await client.agent.act(second, 1, "result", result="second: go ahead")
    assert done["accepted"], done
    (completed,) = await client.events.wait_for("run.completed", run_id=second, timeout_s=WAIT_S)
    assert completed.data["result"] == "second: go ahead"
    assert (await client.state(first, RunState.WAITING_FOR_AGENT)).state is RunState.WAITING_FOR_AGENT

    await client.agent.take(first, 1)
    calls = [{"name": "get_input", "arguments": {}}]
    assert (await client.agent.act(first, 1, "tool_calls", calls=calls))["accepted"]
    await client.parked(first, 2)  # its tool ran, the turn committed, turn 2 offered: parked again
    task = await client.agent.take(first, 2)  # agent-collab records the offer after the event: wait for it
    assert [i["tool"] for i in task["inputs"]] == ["get_input"]
    assert "orders-api" in task["inputs"][0]["content"]
    assert (await client.agent.act(first, 2, "result", result="first: go ahead"))["accepted"]
    (completed,) = await client.events.wait_for("run.completed", run_id=first, timeout_s=WAIT_S)
    assert completed.data["result"] == "first: go ahead"

    for run_id, turns in ((first, [1, 2]), (second, [1])):
        offers = [e.data["turn"] for e in client.events.of_type("agent.task.offered", run_id=run_id)]
        assert offers == turns, (run_id, offers)
        assert len(client.events.of_type("run.completed", run_id=run_id)) == 1
        assert not client.events.of_type("run.failed", run_id=run_id)
        # every wake-up by the agent's action is in the run's timeline, once: run.resumed (agent_action)
        resumed = client.events.of_type("run.resumed", run_id=run_id)
        assert [(e.data["reason"], e.data["request_id"]) for e in resumed] == [
            ("agent_action", f"{task_id_for(run_id)}.turn-{turn}") for turn in turns
        ], run_id
        assert all(e.data["waited_s"] >= 0 for e in resumed)


async def test_kill9_of_the_executor_while_parked_and_a_new_one_resumes_the_run_when_its_agent_acts(
    stack: ParkingStack, client: Client
) -> None:
    run_id = await client.request("ext-long")
    await client.parked(run_id, 1)
    await client.agent.take(run_id, 1)

    stack.services["run-executor"].kill9()  # nothing of the run is in it: parked, no lease, no message held
    assert (await client.agent.act(run_id, 1, "result", result="decided while the executor was down"))["accepted"]
    await client.events.wait_for("agent.task.acted", run_id=run_id, timeout_s=WAIT_S)
    assert (await client.state(run_id, RunState.WAITING_FOR_AGENT)).state is RunState.WAITING_FOR_AGENT

    await asyncio.to_thread(stack.start, "run-executor")  # its consumer gets the action the dead one never did
    (completed,) = await client.events.wait_for("run.completed", run_id=run_id, timeout_s=WAIT_S)
    assert completed.data["result"] == "decided while the executor was down"
    await client.state(run_id, RunState.COMPLETED)
    assert [e.data["turn"] for e in client.events.of_type("agent.task.offered", run_id=run_id)] == [1]
    assert len(client.events.of_type("run.completed", run_id=run_id)) == 1
    assert not client.events.of_type("run.failed", run_id=run_id)
    (resumed,) = client.events.of_type("run.resumed", run_id=run_id)  # woken by the new executor, once
    assert resumed.data["reason"] == "agent_action"


async def test_the_compute_budget_ends_a_parked_run_whose_agent_never_acts(client: Client) -> None:
    """The card's whole budget is 2 s: the durable timer armed at the park fails the run ``compute_timeout``, the
    task ends with it, and an action after that is refused."""
    run_id = await client.request("ext-short")
    await client.parked(run_id, 1)
    await client.agent.take(run_id, 1)
    (failed,) = await client.events.wait_for("run.failed", run_id=run_id, timeout_s=WAIT_S)
    assert failed.data["reason"] == "compute_timeout"
    assert failed.data["error"] == (
        f"external agent {AGENT} did not act on turn 1 within the run's compute budget "
        f"({SHORT_BUDGET_S}s of {SHORT_BUDGET_S}s left when the turn was offered)"
    )
    record = await client.state(run_id, RunState.FAILED)
    assert record.error is not None
    assert record.error.startswith("compute_timeout: ")
    (ended,) = await client.events.wait_for("agent.task.ended", run_id=run_id, timeout_s=WAIT_S)
    assert (ended.data["state"], ended.data["cause"]) == ("failed", "run.failed")
    late = await client.agent.act(run_id, 1, "result", result="too late")
    assert (late["accepted"], late["refusal"]["reason"]) == (False, "task_ended")
    assert not client.events.of_type("run.completed", run_id=run_id)


async def test_a_cancel_while_parked_ends_the_run_at_once_and_the_agent_is_told(client: Client) -> None:
    """The budget is 600 s and the agent never acts: what ends the run is the cancel. Its task ends with it, the
    agent's next poll says so, its timer is gone."""
    run_id = await client.request("ext-long")
    await client.parked(run_id, 1)
    await client.agent.take(run_id, 1)
    cancel = RunCancelRequested(run_id=run_id, reason="not needed", requested_by="user:operator")
    await client.bus.publish(make_event(cancel, source="/test", id=f"evt-cr-{run_id}", run_id=run_id))
    (cancelled,) = await client.events.wait_for("run.cancelled", run_id=run_id, timeout_s=WAIT_S)
    assert "not needed" in cancelled.data["reason"]
    await client.state(run_id, RunState.CANCELLED)
    (ended,) = await client.events.wait_for("agent.task.ended", run_id=run_id, timeout_s=WAIT_S)
    assert (ended.data["state"], ended.data["cause"], ended.data["taken"]) == ("cancelled", "run.cancelled", True)

    async def told() -> bool:
        task = (await client.agent.tasks()).get(run_id)
        return task is not None and task["state"] == "cancelled"

    assert await eventually(told, WAIT_S, "the agent told its task was cancelled")
    refused = await client.agent.act(run_id, 1, "result", result="done anyway")
    assert (refused["accepted"], refused["refusal"]["reason"]) == (False, "task_ended")

    async def disarmed() -> bool:
        return await armed_schedules(client.bus, f"{TIMER_SCHEDULE_RUN_WATCHDOG}.{run_id}") == 0

    assert await eventually(disarmed, WAIT_S, "the run's timer disarmed")
    assert not client.events.of_type("run.failed", run_id=run_id)
    assert not client.events.of_type("run.completed", run_id=run_id)


async def test_an_action_a_killed_agent_collab_stored_but_never_announced_wakes_the_run_at_its_restart(
    stack: ParkingStack, client: Client
) -> None:
    """agent-collab is killed after committing the agent's action and before publishing ``agent.task.acted``: the
    test is that dead agent-collab's commit (the action stored in the task's record, as ``act`` stores it, with no
    event). The budget is 600 s: the run completes within seconds of agent-collab's restart, woken by the
    announcement (one ``agent.task.acted``, one ``run.resumed``), not by its timer."""
    run_id = await client.request("ext-long")
    await client.parked(run_id, 1)
    await client.agent.take(run_id, 1)

    stack.services["agent-collab"].kill9()
    task_id = task_id_for(run_id)
    body = TaskAction(
        agent_id=AGENT,
        protocol_version="1.0",
        task_id=task_id,
        turn=1,
        action_id=f"{task_id}:1:result",
        kind="result",
        result="decided before agent-collab died",
    )
    tasks = await client.bus.store(BUCKET_AGENT_TASKS, TaskRecord)
    stored = await tasks.modify(
        task_key(AGENT, task_id), lambda cur: acted(cur, body, ["get_input", "ask_human"], _now())
    )
    assert stored.changed
    assert not client.events.of_type("agent.task.acted", run_id=run_id)
    assert (await client.state(run_id, RunState.WAITING_FOR_AGENT)).state is RunState.WAITING_FOR_AGENT

    await asyncio.to_thread(stack.start, "agent-collab")
    (completed,) = await client.events.wait_for("run.completed", run_id=run_id, timeout_s=WAIT_S)
    assert completed.data["result"] == "decided before agent-collab died"
    assert len(client.events.of_type("agent.task.acted", run_id=run_id)) == 1
    assert [e.data["reason"] for e in client.events.of_type("run.resumed", run_id=run_id)] == ["agent_action"]
    assert not client.events.of_type("run.failed", run_id=run_id)
