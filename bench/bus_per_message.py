"""CPU the bus library spends per message: pipelined publishes, and the pull consumer's two paths.

Run: ``.venv/bin/python bench/bus_per_message.py [--events 4000] [--rounds 5] [--before SRC ...]``. Starts a
nats-server (from the wheel) in a temp dir, then, for each round, one worker process per code (``before`` first
when ``--before`` names source folders put first on its ``PYTHONPATH``, e.g. ``/tmp/bus-before/libs/bus/src``;
then this checkout's), each on a freshly purged events stream:

* ``publish event``: ``--events`` CloudEvents (built beforehand) written through ``Bus.pipeline.send`` as
  ``event_write``\\s, ``--batch`` writes per round trip, ``--inflight`` rounds at once;
* ``publish kv``: as many KV puts (``kv_write``) the same way;
* ``consume batch``: a fresh durable on the events stream drained by the ``Consumer``'s batch path (the
  journal's: a batch handler, batches of 500, one ack write per batch);
* ``consume one``: another fresh durable drained by the per-message path (``handler``, ``max_inflight`` 16,
  as the run-executor's), each message decoded, handled and acked on its own.

Each figure is the worker's own CPU (``time.process_time``: user + system of the process, not nats-server's)
per message over the phase, in µs; a warm-up of ``--warmup`` events is published and consumed first, unmeasured.
The workers alternate (before, current, current, before, ...: the order swapped every round), and the medians per
code and their ratio are printed, with the load average at the start and the end. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

from temporality_bus import Bus, Consumer, Delivery, NatsSettings
from temporality_bus.pipeline import event_write, kv_write
from temporality_embedded.natsserver import NatsServer
from temporality_protocol import Envelope, RunCompleted, RunStarted, derive_id, make_event
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS, BUCKET_RUNS, CONSUMERS, EVENTS_STREAM, service_source

PHASES = ("publish event", "publish kv", "consume batch", "consume one")


def say(line: str = "") -> None:
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


def events_of(count: int, tag: str) -> list[Envelope]:
    """``count`` run events (started / completed, as the run-executor sends them), ids unique to ``tag``."""
    out: list[Envelope] = []
    for i in range(count):
        run_id = f"run-{tag}-{i // 2:06d}"
        data: RunStarted | RunCompleted = (
            RunStarted(run_id=run_id, agent="reviewer", role="reviewer", title=f"Review PR {i}: tighten the contract")
            if i % 2 == 0
            else RunCompleted(run_id=run_id, result="Keep v1; the field stays.", turns=2)
        )
        out.append(
            make_event(
                data,
                source=service_source("run-executor"),
                id=derive_id("evt", tag, str(i)),
                run_id=run_id,
                actor="service:run-executor",
            )
        )
    return out


async def publish(bus: Bus, writes: list[Any], batch: int, inflight: int) -> None:
    chunks = [writes[i : i + batch] for i in range(0, len(writes), batch)]
    sem = asyncio.Semaphore(inflight)

    async def one(chunk: list[Any]) -> None:
        async with sem:
            for outcome in await bus.pipeline.send(chunk):
                if isinstance(outcome, Exception):
                    raise outcome

    await asyncio.gather(*(one(c) for c in chunks))


async def consume(bus: Bus, durable: str, total: int, *, batched: bool) -> None:
    spec = dataclasses.replace(CONSUMERS["journal"], durable=durable)
    seen, done = 0, asyncio.Event()

    async def batch_handler(items: list[tuple[Envelope, Delivery]]) -> None:
        nonlocal seen
        seen += len(items)
        if seen >= total:
            done.set()

    async def handler(event: Envelope, delivery: Delivery) -> None:
        nonlocal seen
        seen += 1
        if seen >= total:
            done.set()

    consumer = (
        Consumer(bus, spec, handler=handler, batch_handler=batch_handler, batch_size=500)
        if batched
        else Consumer(bus, spec, handler=handler, max_inflight=16)
    )
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    await asyncio.wait_for(done.wait(), 600)
    stop.set()
    await task


async def worker(args: argparse.Namespace) -> dict[str, float]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    tag = args.tag
    warm = events_of(args.warmup, f"{tag}-warm")
    events = events_of(args.events, tag)
    value = json.dumps({"run_id": "run-x", "state": "running", "agent": "reviewer", "revision": 3}).encode()
    warm_kv = [kv_write(BUCKET_RUNS.name, f"bench-{tag}-warm-{i}", value) for i in range(args.warmup)]
    out: dict[str, float] = {}
    async with Bus.connect(NatsSettings(url=args.url), name="bench") as bus:
        await publish(bus, [event_write(e) for e in warm], args.batch, args.inflight)
        await publish(bus, warm_kv, args.batch, args.inflight)
        c0 = time.process_time()
        await publish(bus, [event_write(e) for e in events], args.batch, args.inflight)
        out["publish event"] = (time.process_time() - c0) / len(events)
        c0 = time.process_time()
        keys = [f"bench-{tag}-{i}" for i in range(args.events)]
        await publish(bus, [kv_write(BUCKET_RUNS.name, k, value) for k in keys], args.batch, args.inflight)
        out["publish kv"] = (time.process_time() - c0) / len(events)
        total = len(warm) + len(events)
        for phase, batched in (("consume batch", True), ("consume one", False)):
            # the warm-up's messages come first on the stream: measured from the moment they are in
            durable = f"bench-{tag}-{phase.replace(' ', '-')}"
            await consume(bus, durable + "-w", len(warm), batched=batched)  # warms the path (same messages)
            await bus.js.delete_consumer(EVENTS_STREAM.name, durable + "-w")
            c0 = time.process_time()
            await consume(bus, durable, total, batched=batched)
            out[phase] = (time.process_time() - c0) / total
            await bus.js.delete_consumer(EVENTS_STREAM.name, durable)
    return out


async def prepare(url: str) -> None:
    async with Bus.connect(NatsSettings(url=url), name="bench") as bus:
        await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
        await bus.js.purge_stream(EVENTS_STREAM.name)
        await bus.js.purge_stream(f"KV_{BUCKET_RUNS.name}")


def run_worker(args: argparse.Namespace, url: str, code: str, first: list[str], tag: str) -> dict[str, float]:
    env = dict(os.environ)
    if first:
        env["PYTHONPATH"] = os.pathsep.join([*first, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, __file__, "--worker", "--url", url, "--tag", tag]
    cmd += ["--events", str(args.events), "--warmup", str(args.warmup)]
    cmd += ["--batch", str(args.batch), "--inflight", str(args.inflight)]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--batch", type=int, default=8, help="writes per pipelined round trip")
    parser.add_argument("--inflight", type=int, default=16, help="round trips at once")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", nargs="+", default=[], metavar="SRC", help="source folders of the old code")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="t", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        sys.stdout.write(json.dumps(asyncio.run(worker(args))) + "\n")
        return
    before = [str(Path(p).resolve()) for p in args.before]
    codes = [("before", before), ("current", [])] if before else [("current", [])]
    results: dict[str, list[dict[str, float]]] = {code: [] for code, _ in codes}
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bus-bench-") as tmp:
        server = NatsServer(Path(tmp) / "nats")
        server.start()
        try:
            for number in range(args.rounds):
                # the order swapped every round: neither code always runs first (a warmer machine, a cooler one)
                for code, first in codes if number % 2 == 0 else codes[::-1]:
                    asyncio.run(prepare(server.url))
                    r = run_worker(args, server.url, code, first, f"{number}{code[0]}{time.time_ns() % 10**9}")
                    results[code].append(r)
                    figures = ", ".join(f"{p} {r[p] * 1e6:.1f}" for p in PHASES)
                    say(f"round {number + 1} {code:8} µs CPU/msg: {figures}  (load {os.getloadavg()[0]:.1f})")
        finally:
            server.stop()
    load1 = os.getloadavg()
    say()
    say(
        f"medians over {args.rounds} rounds, µs of the bus process's CPU per message ({args.events} events, "
        f"batch {args.batch}, {args.inflight} in flight; load average {load0[0]:.1f} -> {load1[0]:.1f})"
    )
    say(f"{'phase':16}" + "".join(f"{code:>10}" for code, _ in codes) + ("     ratio" if before else ""))
    for phase in PHASES:
        meds = [statistics.median(r[phase] for r in results[code]) * 1e6 for code, _ in codes]
        row = f"{phase:16}" + "".join(f"{m:10.2f}" for m in meds)
        if before:
            row += f"{meds[1] / meds[0]:10.3f}"
        say(row)


if __name__ == "__main__":
    main()
