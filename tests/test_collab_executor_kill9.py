"""kill -9 of the run-executor in the middle of an ``ask_agent`` (issue 10's kill -9 scenarios, COL-2, COL-4, COL-5).

Real processes on a real nats-server: agent-collab and the run-executor run as ``python -m ...``; two scripted
hosted agents in one saga. ``expert`` parks on a person (so an ask to it waits in its inbox until that person
answers: COL-4, the message is kept, never dropped); ``lead`` asks it in ``wait`` mode and parks
``waiting_for_agent``. The run-executor is killed with SIGKILL twice:

1. right after ``agent.asked``, sent while agent-collab was down (killed too, so nothing routed it yet): agent-collab
   comes back and routes the ask while no executor runs, so ``agent.message.received`` waits in the stream for the
   next executor (between the ask and its delivery, for certain);
2. once the restarted executor has queued the ask in ``expert``'s checkpoint, with ``lead`` still waiting.

After the second restart the person lets ``expert`` go: it gets the ask at its turn boundary, answers, and
``lead`` resumes with the answer. Nothing is lost, nothing is delivered or applied twice, and the request id is
the one derived from ``lead``'s call (turn 1, call 0) throughout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from collab_support import let_go, request_run
from e2e_support import eventually

from temporality_bus import Bus, NatsSettings
from temporality_embedded.natsserver import NatsServer
from temporality_embedded.processes import ServiceProcess
from temporality_protocol import (
    HumanRequested,
    RunState,
)
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS, BUCKET_CHECKPOINTS, BUCKET_RUNS
from temporality_run_executor.machine import ask_request_id
from temporality_run_executor.records import Checkpoint, RunRecord
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays

SAGA = "saga-kill9"
#: A process start, a redelivery, on the shared and loaded machine.
WAIT_S = 60.0

EXPERT: list[dict[str, Any]] = [
    {"id": "hold", "call": {"tool": "ask_human", "args": {"recipient": "user:alice", "question": "hold"}}},
    {
        "id": "reply",
        "when": "length(run.asks) > `0`",
        "call": {"tool": "answer_agent", "args": {"request_id": "{{ run.asks[0] }}", "answer": "Keep v1"}},
    },
    {"id": "done", "answer": "asks={{ length(run.mail[?kind=='ask']) }}"},
]
LEAD: list[dict[str, Any]] = [
    {
        "id": "ask",
        "call": {
            "tool": "ask_agent",
            "args": {"to": "agent:expert", "message": "Keep v1?", "mode": "wait", "timeout": 600},
        },
    },
    {"id": "done", "answer": "got={{ results.ask.answer }}"},
]


def _card(agent: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": agent,
        "role": agent,
        "system_prompt": "You collaborate.",
        "tools": {"allow": ["*"]},
        "provider": {"kind": "scripted", "script": {"steps": steps}},
    }


class Stack:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.nats = NatsServer(root / "nats")
        cards = root / "agents.yaml"
        cards.write_text(yaml.safe_dump({"agents": [_card("lead", LEAD), _card("expert", EXPERT)]}), encoding="utf-8")
        self.env = {
            "TEMPORALITY_EXECUTOR_AGENTS_FILE": str(cards),
            "TEMPORALITY_NATS_ACK_WAIT_S": "2",
            "TEMPORALITY_LOG_FORMAT": "console",
        }
        self.services: dict[str, ServiceProcess] = {}
        self.starts = 0

    def start(self, name: str) -> None:
        self.starts += 1
        process = ServiceProcess(
            name, {**self.env, "TEMPORALITY_NATS_URL": self.nats.url}, self.root / f"{self.starts}"
        )
        process.start()
        process.wait_ready(WAIT_S)
        self.services[name] = process

    def stop(self) -> None:
        for process in self.services.values():
            process.terminate()
        self.nats.stop()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(tmp_path)
    stack.nats.start()
    try:
        asyncio.run(_prepare(stack.nats.url))
        stack.start("agent-collab")
        stack.start("run-executor")
        yield stack
    finally:
        stack.stop()


async def _prepare(url: str) -> None:
    """The streams and buckets (the journal owns them in a deployment; no journal runs here)."""
    async with Bus.connect(NatsSettings(url=url), name="test-setup") as bus:
        await bus.ensure(ALL_STREAMS, ALL_BUCKETS)


async def _request(bus: Bus, agent: str) -> str:
    return await request_run(bus, f"run-{agent}-kill9", agent, SAGA)


async def _state(bus: Bus, run_id: str, state: RunState) -> RunRecord:
    runs = await bus.store(BUCKET_RUNS, RunRecord)

    async def reached() -> RunRecord | None:
        found = await runs.get(run_id)
        return found.value if found is not None and found.value.state is state else None

    record: RunRecord = await eventually(reached, WAIT_S, f"run {run_id} {state.value}")
    return record


async def _checkpoint(bus: Bus, run_id: str, what: str, check: Any) -> Checkpoint:
    checkpoints = await bus.store(BUCKET_CHECKPOINTS, Checkpoint)

    async def holds() -> Checkpoint | None:
        found = await checkpoints.get(run_id)
        return found.value if found is not None and check(found.value) else None

    ckpt: Checkpoint = await eventually(holds, WAIT_S, f"{run_id}'s checkpoint: {what}")
    return ckpt


async def test_kill9_of_the_executor_between_the_ask_and_its_delivery_and_while_the_asker_waits(
    stack: Stack,
) -> None:
    async with Bus.connect(NatsSettings(url=stack.nats.url), name="test") as bus:
        log = await EventLog(bus.nc, since=datetime.now(UTC)).start()
        try:
            await _run(stack, bus, log)
        finally:
            await log.stop()


async def _run(stack: Stack, bus: Bus, log: EventLog) -> None:
    expert = await _request(bus, "expert")
    (held,) = await log.wait_for("human.requested", run_id=expert, timeout_s=WAIT_S)
    await _state(bus, expert, RunState.WAITING_FOR_HUMAN)
    # 1. the ask goes out while agent-collab is down (so nothing routes it yet), the asker parks, kill -9 of the
    #    executor; then agent-collab comes back and delivers while no executor runs
    stack.services["agent-collab"].kill9()
    lead = await _request(bus, "lead")
    request_id = ask_request_id(lead, 1, 0)
    await log.wait_for("agent.asked", run_id=lead, timeout_s=WAIT_S)
    await _state(bus, lead, RunState.WAITING_FOR_AGENT)
    stack.services["run-executor"].kill9()
    assert not log.of_type("agent.message.received")  # nothing routed it before the executor died
    await asyncio.to_thread(stack.start, "agent-collab")
    (received,) = await log.wait_for("agent.message.received", run_id=expert, timeout_s=WAIT_S)
    assert received.data["request_id"] == request_id
    await asyncio.to_thread(stack.start, "run-executor")

    # 2. the new executor queued the ask for expert (parked on its person: kept for its next boundary);
    #    kill -9 again while lead still waits
    queued = await _checkpoint(
        bus, expert, "the ask queued", lambda c: [m.request_id for m in c.inbox if m.kind == "ask"] == [request_id]
    )
    assert not queued.mail
    await _state(bus, lead, RunState.WAITING_FOR_AGENT)
    stack.services["run-executor"].kill9()
    await asyncio.to_thread(stack.start, "run-executor")

    # the person lets expert go: the ask is framed at its boundary, answered, and lead resumes with the answer
    await let_go(bus, held.payload(HumanRequested), expert)
    (lead_done,) = await log.wait_for("run.completed", run_id=lead, timeout_s=WAIT_S)
    assert lead_done.data["result"] == "got=Keep v1"
    (expert_done,) = await log.wait_for("run.completed", run_id=expert, timeout_s=WAIT_S)
    assert expert_done.data["result"] == "asks=1"  # the ask delivered into its conversation once

    chain = ("agent.asked", "agent.message.received", "agent.replied", "agent.answer.received")

    def once_each() -> bool:
        mine = [e for e in log.events if e.type in chain]
        return sorted(e.type for e in mine) == sorted(chain) and {e.data["request_id"] for e in mine} == {request_id}

    await stays(once_each, settle_s=2.0, what=f"each step of {request_id} journaled once")
    for run_id in (lead, expert):
        ended = [e.type for e in log.events if e.runid == run_id and e.type in ("run.completed", "run.failed")]
        assert ended == ["run.completed"]
    assert not log.of_type("agent.ask_expired")
    assert not log.of_type("bus.dead_lettered")
    done = await _checkpoint(bus, expert, "done", lambda c: True)
    assert [m.request_id for m in done.mail if m.kind == "ask"] == [request_id]
    assert [(r.request_id, r.answered) for r in done.received] == [(request_id, True)]
    lead_ckpt = await _checkpoint(bus, lead, "done", lambda c: True)
    assert lead_ckpt.pending is None
