"""Webhook -> run.started latency across the five real service processes (p50/p99), split at run.requested.

Run: ``.venv/bin/python bench/latency.py [--runs 200] [--settle-ms 150] [--before SRC ...] [--rounds 1]``. Starts
its own embedded stack (nats-server from the wheel, SQLite, five processes) in a temp dir on free loopback ports
and sends ``--runs`` distinct Azure DevOps PR webhooks one at a time, in two modes:

* ``back-to-back``: the next webhook as soon as the previous run's ``run.started`` is seen, while that run still
  takes its turns (the scripted reviewer parks each run on ``ask_human``) and the other services handle its
  events: the figure the bench has always reported (and ``--json-out`` records);
* ``settled``: the next webhook once the previous run has parked (its ``human.requested`` seen) and
  ``--settle-ms`` more have passed: the pipeline's own path, with nothing else in flight.

Each webhook is timed from the HTTP request start to the ``run.started`` event of its run seen on the bus, and
split at its ``run.requested`` (the gateway's part, then the run-executor's); the HTTP response time too. As a
baseline measured in the same run, it also times a bare JetStream publish -> consume round trip on the same
server. ``--before SRC ...``: a ``before`` phase whose run-executor and trigger-gateway run the code in SRC
(first on their ``PYTHONPATH``), then both restarted on the current code, on the same stack (``--rounds``
alternates them): ratios ``current / before`` in the same run. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import nats
from benchrecord import (
    Durability,
    LatencyFigures,
    Recorder,
    bench_stack,
    database_durability,
    jetstream_durability,
    merge,
    percentiles,
)
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from temporality_embedded import Stack

ROOT = Path(__file__).resolve().parents[1]
AUTH = "Basic " + base64.b64encode(b"azure:change-me").decode()
MODES = ("back-to-back", "settled")
#: The processes a ``before`` phase runs on the old code (the path of a webhook to its run.started).
SWAPPED = ("trigger-gateway", "run-executor")
WARMUP = 3
EVENTS = "temporality.events."


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Samples:
    """Per webhook (ms from the HTTP request start): run.requested seen, run.started seen, the HTTP response."""

    requested: list[float] = field(default_factory=list)
    started: list[float] = field(default_factory=list)
    response: list[float] = field(default_factory=list)

    @property
    def executor(self) -> list[float]:
        return [s - r for r, s in zip(self.requested, self.started, strict=True)]


class Seen:
    """When each run's events were seen on the bus (whoever comes first, the HTTP response or the event)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.times: dict[tuple[str, str], asyncio.Future[float]] = {}

    def future(self, kind: str, run_id: str) -> asyncio.Future[float]:
        return self.times.setdefault((kind, run_id), self.loop.create_future())

    async def on(self, msg: Msg) -> None:
        now = time.perf_counter()
        fut = self.future(msg.subject.removeprefix(EVENTS), json.loads(msg.data).get("runid"))
        if not fut.done():
            fut.set_result(now)


async def _webhooks(stack: Stack, seen: Seen, runs: int, mode: str, settle_s: float) -> Samples:
    template = json.loads((ROOT / "examples/azure-devops/git.pullrequest.created.json").read_text("utf-8-sig"))
    samples = Samples()
    async with httpx.AsyncClient(timeout=30) as http:
        for i in range(WARMUP + runs):
            payload = dict(template, id=str(uuid.uuid4()))
            t0 = time.perf_counter()
            response = await http.post(
                f"{stack.gateway_url}/hooks/ado-pr-review", json=payload, headers={"Authorization": AUTH}
            )
            t_response = time.perf_counter()
            response.raise_for_status()
            run_id = response.json()["run_id"]
            started = await asyncio.wait_for(seen.future("run.started", run_id), 30)
            requested = await asyncio.wait_for(seen.future("run.requested", run_id), 30)
            if mode == "settled":
                await asyncio.wait_for(seen.future("human.requested", run_id), 30)
                await asyncio.sleep(settle_s)
            if i >= WARMUP:
                samples.requested.append((requested - t0) * 1000)
                samples.started.append((started - t0) * 1000)
                samples.response.append((t_response - t0) * 1000)
    return samples


async def _bare(nc: NATS, runs: int) -> list[float]:
    """One JetStream publish -> push-consumer delivery on the same server, one at a time (ms)."""
    js = nc.jetstream()
    await js.add_stream(name="BENCH", subjects=["bench.>"])
    got: asyncio.Queue[float] = asyncio.Queue()

    async def on_bench(msg: Msg) -> None:
        await got.put(time.perf_counter())
        await msg.ack()

    await js.subscribe("bench.x", cb=on_bench, durable="bench", manual_ack=True)
    baseline: list[float] = []
    for i in range(runs):
        t0 = time.perf_counter()
        await js.publish("bench.x", str(i).encode())
        baseline.append(((await asyncio.wait_for(got.get(), 10)) - t0) * 1000)
    return baseline


async def _measure(
    stack: Stack, runs: int, settle_s: float, before: list[str], rounds: int
) -> tuple[list[tuple[str, str, Samples, tuple[float, float, float]]], list[float]]:
    """Each (phase, mode)'s samples and the load average after it, in the order measured; the bare hop (ms)."""
    nc = await nats.connect(stack.nats.url)
    seen = Seen()
    for kind in ("run.requested", "run.started", "human.requested"):
        await nc.subscribe(f"{EVENTS}{kind}", cb=seen.on)
    results: list[tuple[str, str, Samples, tuple[float, float, float]]] = []
    labels = ["before", "current"] * rounds if before else ["current"] * rounds
    running = "current"
    for label in labels:
        if label != running:  # the swapped processes restarted on the other code (same stack, same store)
            inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            env = {"PYTHONPATH": os.pathsep.join([*before, *inherited] if label == "before" else inherited)}
            for name in SWAPPED:
                await asyncio.to_thread(stack.restart, name, 120.0, **env)
            running = label
        for mode in MODES:
            samples = await _webhooks(stack, seen, runs, mode, settle_s)
            results.append((label, mode, samples, os.getloadavg()))
    baseline = await _bare(nc, runs)
    await nc.drain()
    return results, baseline


def _line(label: str, mode: str, s: Samples, load: tuple[float, float, float]) -> str:
    med = statistics.median
    return (
        f"  {label:8s} {mode:13s} p50 {med(s.started):7.2f}  p99 {_pct(s.started, 0.99):7.2f} ms | gateway (-> run.requested) "
        f"{med(s.requested):6.2f} | executor (-> run.started) {med(s.executor):6.2f} | HTTP response {med(s.response):6.2f}"
        f" | load {load[0]:.1f}\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="webhooks per phase and mode")
    parser.add_argument("--settle-ms", type=float, default=150.0, help="settled mode: the pause after each run parked")
    parser.add_argument(
        "--before",
        nargs="+",
        default=[],
        metavar="SRC",
        help="source folders put first on the run-executor's and trigger-gateway's PYTHONPATH for a 'before' "
        "phase, measured in the same run (same stack) before the current code's: ratios current/before",
    )
    parser.add_argument("--rounds", type=int, default=1, help="how many times the phases are measured (alternating)")
    parser.add_argument(
        "--json-out", type=Path, help="also write the figures as a JSON record here (bench/benchrecord.py)"
    )
    args = parser.parse_args()
    recorder = Recorder(
        "latency", {"runs": args.runs, "settle_ms": args.settle_ms, "before": bool(args.before), "rounds": args.rounds}
    )
    before = [str(Path(p).resolve()) for p in args.before]
    with tempfile.TemporaryDirectory(prefix="temporality-bench-") as tmp:
        stack = bench_stack(Path(tmp))
        stack.start()
        try:
            results, base = asyncio.run(_measure(stack, args.runs, args.settle_ms / 1000, before, args.rounds))
            durability = merge(
                Durability(jetstream=jetstream_durability(stack.nats.monitoring_url)),
                asyncio.run(database_durability(stack.database_url)),
            )
        finally:
            stack.stop()
    out = sys.stdout.write
    out(f"webhook -> run.started, {args.runs} runs per phase and mode (5 processes, one nats-server, loopback)\n")
    for label, mode, samples, load in results:
        out(_line(label, mode, samples, load))
    out("baseline: bare JetStream publish -> consume, same server\n")
    out(f"  p50 {statistics.median(base):8.2f} ms   p99 {_pct(base, 0.99):8.2f} ms\n")
    current = [(m, s) for label, m, s, _ in results if label == "current"]
    for mode in MODES:
        started = [x for m, s in current if m == mode for x in s.started]
        out(
            f"ratio p50 {mode} (webhook->run.started / bare hop): {statistics.median(started) / statistics.median(base):.1f}x\n"
        )
    if before:
        out("current / before (p50 over the phases' webhooks):\n")
        for mode in MODES:
            for part in ("started", "requested", "executor", "response"):
                b = [x for label, m, s, _ in results if label == "before" and m == mode for x in getattr(s, part)]
                c = [x for label, m, s, _ in results if label == "current" and m == mode for x in getattr(s, part)]
                out(
                    f"  {mode:13s} {part:10s} {statistics.median(b):7.2f} -> {statistics.median(c):7.2f} ms "
                    f"({statistics.median(c) / statistics.median(b):.2f}x)\n"
                )
    back = [x for m, s in current if m == "back-to-back" for x in s.started]
    settled = [x for m, s in current if m == "settled" for x in s.started]
    figures = LatencyFigures(
        webhook_to_run_started=percentiles(back), bare_jetstream=percentiles(base), settled=percentiles(settled)
    )
    recorder.finish(figures, durability, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
