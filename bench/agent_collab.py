"""ask_agent round trip between two hosted agents (p50/p99), against a bare NATS request/reply in the same run.

Run: ``.venv/bin/python bench/agent_collab.py [--asks 100] [--per-saga 20]``. Starts its own nats-server in
a temp dir and the run-executor and agent-collab in this process (as the cross-service tests do), with
two scripted agents per saga:

* ``expert`` is **busy**: it calls ``get_input`` turn after turn while it has no ask to answer, so an
  ask reaches it at its next turn boundary (never mid-turn, COL-4), and answers it with ``answer_agent``
  in the turn after;
* ``lead`` calls ``ask_agent(to="agent:expert", mode="wait")`` ``--per-saga`` times in a row, parking
  durably on each until the answer comes.

The sagas run one after the other (a latency bench: one ask in flight at a time).

One round trip is ``agent.asked`` (lead's turn) -> ``agent.message.received`` (agent-collab routed it) ->
the ask framed at expert's next boundary -> ``agent.replied`` -> ``agent.answer.received`` (agent-collab
routed the reply back to lead), timed from when this process sees ``agent.asked`` on the bus to when it
sees ``agent.answer.received``; the three legs are shown too. The baseline is a bare core-NATS
request/reply on the same server, as many times. Prints figures and the ratio; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml
from benchrecord import AgentCollabFigures, Durability, JetStreamDurability, Recorder, jetstream_durability, percentiles
from nats.aio.msg import Msg

from temporality_agent_collab.__main__ import SPEC as COLLAB_SPEC
from temporality_agent_collab.__main__ import configure as configure_collab
from temporality_agent_collab.settings import Settings as CollabSettings
from temporality_bus import Bus, NatsSettings
from temporality_embedded.natsserver import NatsServer
from temporality_protocol import HumanPolicy, LaunchSource, RunRequested, make_event
from temporality_protocol.catalog import service_source
from temporality_run_executor.__main__ import SPEC as EXECUTOR_SPEC
from temporality_run_executor.__main__ import configure as configure_executor
from temporality_run_executor.settings import Settings as ExecutorSettings
from temporality_service import LogSettings, configure_logging, run_until

#: The executor's turn budget per run (its maximum): expert's busy turns and answers share it.
MAX_TURNS = 500
#: Busy turns expert may spend waiting for one ask (steps it skips once the ask is there cost nothing).
SPINS_PER_ASK = 20
LEGS = ("agent.asked", "agent.message.received", "agent.replied", "agent.answer.received")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _card(agent: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": agent,
        "role": agent,
        "system_prompt": "You collaborate.",
        "tools": {"allow": ["*"]},
        "provider": {"kind": "scripted", "script": {"steps": steps}},
        "limits": {"max_turns": MAX_TURNS},
    }


def _scripts(per_saga: int) -> list[dict[str, Any]]:
    lead = [
        {
            "id": f"ask_{i}",
            "call": {
                "tool": "ask_agent",
                "args": {"to": "agent:expert", "message": f"Question {i}?", "mode": "wait", "timeout": 60},
            },
        }
        for i in range(per_saga)
    ]
    lead.append({"id": "done", "answer": "asked {{ length(keys(results)) }} questions"})
    expert: list[dict[str, Any]] = []
    for i in range(per_saga):
        expert += [
            {"id": f"busy_{i}_{j}", "when": "length(run.asks) == `0`", "call": {"tool": "get_input"}}
            for j in range(SPINS_PER_ASK)
        ]
        expert.append(
            {
                "id": f"reply_{i}",
                "when": "length(run.asks) > `0`",
                "call": {"tool": "answer_agent", "args": {"request_id": "{{ run.asks[0] }}", "answer": f"Answer {i}"}},
            }
        )
    expert.append({"id": "done", "answer": "answered"})
    return [_card("lead", lead), _card("expert", expert)]


async def _start(bus: Bus, agent: str, saga: str) -> str:
    run_id = f"run-{agent}-{saga}"
    data = RunRequested(
        run_id=run_id,
        agent=agent,
        title=f"{agent} in {saga}",
        launch=LaunchSource(kind="webhook", trigger_id="bench"),
        human=HumanPolicy(allowed_recipients=[]),
    )
    # sent as the gateway sends a run.requested: the consumers refuse an event from no service's source (SEC-1)
    event = make_event(
        data,
        source=service_source("trigger-gateway"),
        id=f"evt-rr-{run_id}",
        run_id=run_id,
        correlation_id=saga,
        actor="service:trigger-gateway",
    )
    await bus.publish(event)
    return run_id


async def _services(nats_settings: NatsSettings, agents_file: Path, stop: asyncio.Event) -> list[asyncio.Task[None]]:
    quiet = LogSettings(level="warning", format="console")
    executor = ExecutorSettings(nats=nats_settings, agents_file=agents_file, log=quiet)
    no_external = agents_file.with_name("external-agents.yaml")
    no_external.write_text("agents: []\n", encoding="utf-8")
    collab = CollabSettings(nats=nats_settings, log=quiet, external_agents_file=no_external)
    tasks: list[asyncio.Task[None]] = []
    starts: list[tuple[Any, Any, Callable[..., Awaitable[None]]]] = [
        (EXECUTOR_SPEC, executor, configure_executor(executor)),
        (COLLAB_SPEC, collab, configure_collab(collab)),
    ]
    for spec, settings, setup in starts:
        ready = asyncio.Event()
        task = asyncio.create_task(run_until(spec, settings, setup, stop, ready=ready))
        tasks.append(task)
        waiting = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait([task, waiting], timeout=30, return_when="FIRST_COMPLETED")
        waiting.cancel()
        if task in done:
            task.result()
        if not ready.is_set():
            raise RuntimeError(f"{spec.name} not ready within 30 s")
    return tasks


async def _round_trips(bus: Bus, asks: int, per_saga: int) -> tuple[list[dict[str, float]], int]:
    """Every round trip's times per leg; and how many asks were answered by anyone but expert's own run."""
    seen: dict[str, dict[str, float]] = {}
    experts: set[str] = set()
    strays = 0
    answered = 0
    progress = asyncio.Condition()

    async def on_event(msg: Msg) -> None:
        nonlocal strays, answered
        at = time.perf_counter()
        event = json.loads(msg.data)
        data = event.get("data") or {}
        request_id = data.get("request_id")
        if event["type"] not in LEGS or request_id is None:
            return
        legs = seen.setdefault(request_id, {})
        if event["type"] in legs:
            return  # a redelivery: the first sighting counts
        legs[event["type"]] = at
        if event["type"] == "agent.answer.received":
            strays += data.get("replier_run_id") not in experts
            async with progress:
                answered += 1
                progress.notify_all()

    def reached(target: int) -> Callable[[], bool]:
        return lambda: answered >= target

    sub = await bus.nc.subscribe("temporality.events.agent.>", cb=on_event)
    try:
        for n in range(-(-asks // per_saga)):  # one saga after the other: latency, not throughput
            saga = f"saga-{n}"
            experts.add(await _start(bus, "expert", saga))
            await _start(bus, "lead", saga)
            async with asyncio.timeout(30 + per_saga * 5), progress:
                await progress.wait_for(reached(min(asks, (n + 1) * per_saga)))
    finally:
        await sub.unsubscribe()
    done = [legs for legs in seen.values() if all(leg in legs for leg in LEGS)]
    return done, strays


async def _baseline(bus: Bus, count: int) -> list[float]:
    """A bare core-NATS request/reply on the same server: the floor of one round trip."""

    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    sub = await bus.nc.subscribe("bench.echo", cb=echo)
    out = []
    payload = json.dumps({"message": "Question?"}).encode()
    for _ in range(count):
        t0 = time.perf_counter()
        await bus.nc.request("bench.echo", payload, timeout=10)
        out.append(time.perf_counter() - t0)
    await sub.unsubscribe()
    return out


async def _measure(
    asks: int, per_saga: int, tmp: Path
) -> tuple[list[dict[str, float]], int, list[float], JetStreamDurability]:
    server = NatsServer(tmp / "nats", monitoring=True)  # /varz: the JetStream sync settings it runs with
    server.start()
    try:
        durability = jetstream_durability(server.monitoring_url)
        agents_file = tmp / "agents.yaml"
        agents_file.write_text(yaml.safe_dump({"agents": _scripts(per_saga)}), encoding="utf-8")
        settings = NatsSettings(url=server.url)
        stop = asyncio.Event()
        tasks = await _services(settings, agents_file, stop)
        try:
            async with Bus.connect(settings, name="bench") as bus:
                trips, strays = await _round_trips(bus, asks, per_saga)
                baseline = await _baseline(bus, max(len(trips), 1) * 10)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    finally:
        server.stop()
    return trips, strays, baseline, durability


def _line(name: str, values_s: list[float]) -> str:
    ms = [v * 1000 for v in values_s]
    return f"  {name:<40} p50 {statistics.median(ms):8.2f} ms   p99 {_pct(ms, 0.99):8.2f} ms   max {max(ms):8.2f} ms\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--asks", type=int, default=100, help="round trips to measure")
    parser.add_argument("--per-saga", type=int, default=20, help="asks per (lead, expert) pair, at most 20")
    parser.add_argument(
        "--json-out", type=Path, help="also write the figures as a JSON record here (bench/benchrecord.py)"
    )
    args = parser.parse_args()
    recorder = Recorder("agent_collab", {"asks": args.asks, "per_saga": args.per_saga})
    per_saga = max(1, min(args.per_saga, 20, args.asks))  # expert's turns: 20 x (20 busy + 1) < MAX_TURNS
    configure_logging(LogSettings(level="warning", format="console"), service="bench")
    with tempfile.TemporaryDirectory(prefix="temporality-bench-") as tmp:
        trips, strays, baseline, jetstream = asyncio.run(_measure(args.asks, per_saga, Path(tmp)))
    out = sys.stdout.write
    if not trips:
        out("no complete round trip was seen\n")
        return 1
    total = [t["agent.answer.received"] - t["agent.asked"] for t in trips]
    out(f"ask_agent round trip (wait mode) over {len(trips)} asks, {per_saga} per saga, busy recipient\n")
    out("  (run-executor + agent-collab in one process, one nats-server, loopback)\n")
    out(_line("agent.asked -> agent.answer.received", total))
    out(_line("  asked -> message.received (routing)", [t["agent.message.received"] - t["agent.asked"] for t in trips]))
    out(
        _line(
            "  message.received -> replied (boundary)",
            [t["agent.replied"] - t["agent.message.received"] for t in trips],
        )
    )
    out(
        _line(
            "  replied -> answer.received (routing)", [t["agent.answer.received"] - t["agent.replied"] for t in trips]
        )
    )
    if strays:
        out(f"  note: {strays} asks were answered by a relay run, not by expert's live run (it ran out of turns)\n")
    out(f"baseline: bare core-NATS request/reply, same server, {len(baseline)} requests\n")
    out(_line("request -> reply", baseline))
    ratio = statistics.median(total) / statistics.median(baseline)
    out(f"ratio p50 (ask_agent round trip / bare request-reply): {ratio:.1f}x\n")
    legs = {
        "routing": ("agent.asked", "agent.message.received"),
        "boundary": ("agent.message.received", "agent.replied"),
        "routing back": ("agent.replied", "agent.answer.received"),
    }
    figures = AgentCollabFigures(
        round_trip=percentiles([v * 1000 for v in total]),
        legs={name: percentiles([(t[b] - t[a]) * 1000 for t in trips]) for name, (a, b) in legs.items()},
        bare_request_reply=percentiles([v * 1000 for v in baseline]),
        strays=strays,
    )
    # no database here: the run-executor and agent-collab keep their state in JetStream KV
    recorder.finish(figures, Durability(jetstream=jetstream), args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
