"""``kill -9`` of the agent-collab process with asks in flight (COL-4, COL-5): after the restart no ask is lost
and none is delivered twice.

agent-collab runs as its own process (``python -m temporality_agent_collab``) on a real nats-server; the
test plays the run-executor: a saga with a live reviewer and a finished archivist, then asks -- async and
wait to the reviewer, to the archivist (each one a relay run) -- published while agent-collab routes
them. It is killed with SIGKILL as soon as it has routed a few: no drain, no ack, no nak, whatever it
held in flight is redelivered (ack wait 2 s) to the process started after it. More asks are published
while it is down. Then every ask has exactly one outcome event, each relay ask exactly one relay run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from temporality_bus import Bus, NatsSettings
from temporality_protocol import (
    AgentAsked,
    AgentMessageReceived,
    Envelope,
    EventData,
    RunCompleted,
    RunRequested,
    RunStarted,
    derive_id,
    make_event,
)
from temporality_protocol.catalog import CONSUMERS
from temporality_testing.events import EventLog

SAGA = derive_id("run", "kill9-lead")
LEAD = SAGA
REVIEWER = derive_id("run", "kill9-reviewer")
ARCHIVIST = derive_id("run", "kill9-archivist")
RECEIVED = AgentMessageReceived.EVENT_TYPE
BEFORE, WHILE_DOWN = 60, 20
WAIT_S = 60.0  # a process start and redelivery after an ack wait, on the shared, loaded machine


def _ev(data: EventData, run_id: str, *, id: str) -> Envelope:
    return make_event(data, source="/temporality/run-executor", run_id=run_id, correlation_id=SAGA, id=id)


def _saga() -> list[Envelope]:
    return [
        _ev(RunStarted(run_id=LEAD, agent="planner", role="planner", title="t"), LEAD, id=derive_id("evt", "s", LEAD)),
        _ev(
            RunStarted(run_id=REVIEWER, agent="reviewer", role="reviewer", title="t", parent_run_id=LEAD),
            REVIEWER,
            id=derive_id("evt", "s", REVIEWER),
        ),
        _ev(
            RunStarted(run_id=ARCHIVIST, agent="archivist", role="archivist", title="t", parent_run_id=LEAD),
            ARCHIVIST,
            id=derive_id("evt", "s", ARCHIVIST),
        ),
        _ev(RunCompleted(run_id=ARCHIVIST, result="done", turns=1), ARCHIVIST, id=derive_id("evt", "c", ARCHIVIST)),
    ]


def _ask(n: int) -> tuple[str, Envelope]:
    """Every 5th ask goes to the finished archivist (a relay run), every 3rd waits, the rest are async."""
    request = f"req-kill9-{n:03d}"
    to = "agent:archivist" if n % 5 == 0 else "agent:reviewer"
    data = AgentAsked.model_validate(
        {
            "request_id": request,
            "asker_run_id": LEAD,
            "asker_agent": "planner",
            "to": to,
            "mode": "wait" if n % 3 == 0 else "async",
            "timeout_s": 3600,
            "message": f"Question {n}",
            "turn": n + 1,
        }
    )
    return request, _ev(data, LEAD, id=derive_id("evt", "agent.asked", request))


class Collab:
    """The agent-collab process; ``kill9`` ends it like a crash."""

    def __init__(self, nats_settings: NatsSettings, tmp: Path) -> None:
        self._url = nats_settings.url
        self._tmp = tmp
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0

    async def start(self) -> None:
        self.starts += 1
        ready = self._tmp / f"ready-{self.starts}"
        allow = self._tmp / "external-agents.yaml"
        allow.write_text("agents: []\n", encoding="utf-8")
        env = {
            **os.environ,
            "TEMPORALITY_NATS_URL": self._url,
            "TEMPORALITY_NATS_ACK_WAIT_S": "2",
            "TEMPORALITY_READY_FILE": str(ready),
            "TEMPORALITY_LOG_FORMAT": "console",
            "TEMPORALITY_COLLAB_EXTERNAL_AGENTS_FILE": str(allow),
        }
        log = (self._tmp / f"agent-collab-{self.starts}.log").open("wb")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "temporality_agent_collab", env=env, stdout=log, stderr=log
        )
        log.close()
        deadline = time.monotonic() + WAIT_S
        while not ready.exists():  # the ready file is the readiness signal
            assert self.proc.returncode is None, self.log(self.starts)
            assert time.monotonic() < deadline, f"not ready: {self.log(self.starts)}"
            await asyncio.sleep(0.05)

    def log(self, n: int) -> str:
        return (self._tmp / f"agent-collab-{n}.log").read_text(encoding="utf-8", errors="replace")

    async def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(self.proc.wait(), 15) == -signal.SIGKILL

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def _settled(bus: Bus, durable: str) -> None:
    """The consumer has handled everything on its stream (nothing pending, nothing in flight)."""
    spec = CONSUMERS[durable]
    async with asyncio.timeout(WAIT_S):
        while True:
            info = await bus.js.consumer_info(spec.stream, durable)
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return
            await asyncio.sleep(0.05)


async def test_kill_9_with_asks_in_flight_loses_none_and_delivers_none_twice(
    bus: Bus, event_log: EventLog, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    collab = Collab(nats_settings, tmp_path)
    await collab.start()
    try:
        for event in _saga():
            await bus.publish(event)
        asks = [_ask(n) for n in range(BEFORE + WHILE_DOWN)]

        async def publish(batch: list[tuple[str, Envelope]]) -> None:
            for _, event in batch:
                await bus.publish(event)

        publishing = asyncio.create_task(publish(asks[:BEFORE]))
        await event_log.wait_for(RECEIVED, count=3, timeout_s=WAIT_S)  # it is routing: kill it mid-way
        await collab.kill9()
        routed_at_kill = len(event_log.of_type(RECEIVED))
        await publishing  # the publisher never waited for agent-collab: the rest queue up on the stream
        await publish(asks[BEFORE:])  # and more while it is down
        await collab.start()

        requests = [request for request, _ in asks]
        await event_log.wait_for(RECEIVED, count=len(requests), timeout_s=WAIT_S)
        await _settled(bus, "agent-collab-asks")
        await _settled(bus, "agent-collab-runs")
        await event_log.caught_up()
    finally:
        await collab.stop()

    delivered = Counter(e.data["request_id"] for e in event_log.of_type(RECEIVED))
    assert delivered == dict.fromkeys(requests, 1), f"routed before the kill: {routed_at_kill}"
    # each delivered once, to the right run: the reviewer, or one relay run of the archivist per relay ask
    relays = [r for r, e in asks if e.data["to"] == "agent:archivist"]
    by_request = {e.data["request_id"]: e for e in event_log.of_type(RECEIVED)}
    assert {r for r in requests if by_request[r].data["relay"]} == set(relays)
    assert all(by_request[r].runid == REVIEWER for r in requests if r not in relays)
    relay_runs = Counter(e.runid for e in event_log.of_type(RunRequested.EVENT_TYPE))
    assert sorted(relay_runs) == sorted(by_request[r].data["relay_run"] for r in relays)
    assert set(relay_runs.values()) == {1}
    assert len(set(relay_runs)) == len(relays)  # distinct numbers: no ask got two relay runs
