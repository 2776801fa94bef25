"""Webhook -> run.started latency across the five real service processes (p50/p99).

Run: ``.venv/bin/python bench/latency.py [--runs 200]``. Starts its own embedded stack (nats-server from
the wheel, SQLite, five processes) in a temp dir on free loopback ports, sends ``--runs`` distinct Azure
DevOps PR webhooks one after another, and measures from the HTTP request start to the moment the
``run.started`` event of that run is seen on the bus. As a baseline measured in the same run, it also
times a bare JetStream publish -> consume round trip on the same server. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import nats
from benchrecord import (
    Durability,
    LatencyFigures,
    Recorder,
    database_durability,
    jetstream_durability,
    merge,
    percentiles,
)
from nats.aio.msg import Msg

from temporality_embedded import Stack, StackConfig, free_port

ROOT = Path(__file__).resolve().parents[1]
AUTH = "Basic " + base64.b64encode(b"azure:change-me").decode()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(stack: Stack, runs: int) -> tuple[list[float], list[float]]:
    template = json.loads((ROOT / "examples/azure-devops/git.pullrequest.created.json").read_text("utf-8-sig"))
    nc = await nats.connect(stack.nats.url)
    started: dict[str, asyncio.Future[float]] = {}

    loop = asyncio.get_running_loop()

    async def on_started(msg: Msg) -> None:
        # run.started may arrive before the HTTP response: whoever comes first creates the future
        fut = started.setdefault(json.loads(msg.data).get("runid"), loop.create_future())
        if not fut.done():
            fut.set_result(time.perf_counter())

    await nc.subscribe("temporality.events.run.started", cb=on_started)
    latencies: list[float] = []
    async with httpx.AsyncClient(timeout=30) as http:
        for _ in range(runs):
            payload = dict(template, id=str(uuid.uuid4()))
            t0 = time.perf_counter()
            response = await http.post(
                f"{stack.gateway_url}/hooks/ado-pr-review",
                json=payload,
                headers={"Authorization": AUTH},
            )
            response.raise_for_status()
            run_id = response.json()["run_id"]
            fut = started.setdefault(run_id, loop.create_future())
            latencies.append((await asyncio.wait_for(fut, 30)) - t0)

    # baseline: one JetStream publish -> push-consumer delivery on the same server
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
        baseline.append((await asyncio.wait_for(got.get(), 10)) - t0)
    await nc.drain()
    return latencies, baseline


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument(
        "--json-out", type=Path, help="also write the figures as a JSON record here (bench/benchrecord.py)"
    )
    args = parser.parse_args()
    recorder = Recorder("latency", {"runs": args.runs})
    with tempfile.TemporaryDirectory(prefix="temporality-bench-") as tmp:
        stack = Stack(
            StackConfig(
                data_dir=Path(tmp),
                config_dir=ROOT / "config",
                gateway_port=free_port(),
                human_port=free_port(),
                journal_port=free_port(),
                log_format="json",
                extra_env={"TEMPORALITY_LOG_LEVEL": "warning"},
            )
        )
        stack.nats.monitoring = True  # /varz: the JetStream sync settings it runs with
        stack.start()
        try:
            latencies, baseline = asyncio.run(_measure(stack, args.runs))
            durability = merge(
                Durability(jetstream=jetstream_durability(stack.nats.monitoring_url)),
                asyncio.run(database_durability(stack.database_url)),
            )
        finally:
            stack.stop()
    ms = [x * 1000 for x in latencies]
    base = [x * 1000 for x in baseline]
    out = sys.stdout.write
    out(f"webhook -> run.started over {len(ms)} runs (5 processes, one nats-server, loopback)\n")
    out(f"  p50 {statistics.median(ms):8.2f} ms   p99 {_pct(ms, 0.99):8.2f} ms   max {max(ms):8.2f} ms\n")
    out("baseline: bare JetStream publish -> consume, same server\n")
    out(f"  p50 {statistics.median(base):8.2f} ms   p99 {_pct(base, 0.99):8.2f} ms\n")
    out(f"ratio p50 (webhook->run.started / bare hop): {statistics.median(ms) / statistics.median(base):.1f}x\n")
    figures = LatencyFigures(webhook_to_run_started=percentiles(ms), bare_jetstream=percentiles(base))
    recorder.finish(figures, durability, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
