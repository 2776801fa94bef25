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
  as the run-executor's), each message decoded, handled and acked on its own;
* ``publish serial``: a quarter of ``--events`` events, one write at a time, each awaited before the next (a
  lightly loaded service: every write its own flush, ack and wake-up);
* ``kv get``: ``Store.get`` of each key ``publish kv`` wrote (a direct get: the bucket has one replica),
  ``--inflight`` at once;
* ``timer arm``: ``--events`` timers armed an hour ahead (``Timers.arm_write``, the run-executor's watchdog
  namespace) through ``Bus.pipeline.send`` as the event writes are.

Each figure is the worker's own CPU (``time.process_time``: user + system of the process, not nats-server's)
per message over the phase, in µs; a warm-up of ``--warmup`` events is published and consumed first, unmeasured.
The workers run on uvloop, as the services do (``--loop asyncio``: the standard loop). The workers alternate (before, current, current, before, ...: the order swapped every round), and the medians per
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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict

from temporality_bus import Bus, Consumer, Delivery, NatsSettings
from temporality_bus.pipeline import event_write, kv_write
from temporality_bus.timers import Timers
from temporality_embedded.natsserver import NatsServer
from temporality_protocol import Envelope, RunCompleted, RunStarted, derive_id, make_event
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    BUCKET_RUNS,
    CONSUMERS,
    EVENTS_STREAM,
    TIMER_NS_RUN_WATCHDOG,
    TIMERS_STREAMS,
    service_source,
)

PHASES = ("publish event", "publish kv", "consume batch", "consume one", "publish serial", "kv get", "timer arm")


class _Value(BaseModel):
    """The KV value the bench writes and reads back (``kv get``)."""

    model_config = ConfigDict(extra="allow")

    run_id: str
    state: str
    revision: int


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


async def publish_serial(bus: Bus, writes: list[Any]) -> None:
    for write in writes:
        (outcome,) = await bus.pipeline.send([write])
        if isinstance(outcome, Exception):
            raise outcome


async def get_all(bus: Bus, keys: list[str], inflight: int) -> None:
    store = await bus.store(BUCKET_RUNS, _Value)
    sem = asyncio.Semaphore(inflight)

    async def one(key: str) -> None:
        async with sem:
            if await store.get(key) is None:
                raise RuntimeError(f"{key} not found")

    await asyncio.gather(*(one(k) for k in keys))


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


class Meter:
    """The worker's own CPU per message of each phase (``time.process_time``); under callgrind (``--callgrind``)
    ``os.getppid()`` at each phase's start and end, where callgrind dumps (``--dump-before=getppid``): the dumps
    ``2i+2`` hold the phases, in order."""

    def __init__(self, callgrind: bool) -> None:
        self.callgrind = callgrind
        self.cpu: dict[str, float] = {}
        self.count: dict[str, int] = {}
        self._c0 = 0.0

    def start(self) -> None:
        if self.callgrind:
            os.getppid()
        self._c0 = time.process_time()

    def stop(self, phase: str, count: int) -> None:
        self.cpu[phase] = (time.process_time() - self._c0) / count
        self.count[phase] = count
        if self.callgrind:
            os.getppid()


async def worker(args: argparse.Namespace) -> dict[str, Any]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    tag = args.tag
    warm = events_of(args.warmup, f"{tag}-warm")
    events = events_of(args.events, tag)
    value = json.dumps({"run_id": "run-x", "state": "running", "agent": "reviewer", "revision": 3}).encode()
    warm_kv = [kv_write(BUCKET_RUNS.name, f"bench-{tag}-warm-{i}", value) for i in range(args.warmup)]
    meter = Meter(args.callgrind)
    async with Bus.connect(NatsSettings(url=args.url), name="bench") as bus:
        await publish(bus, [event_write(e) for e in warm], args.batch, args.inflight)
        await publish(bus, warm_kv, args.batch, args.inflight)
        meter.start()
        await publish(bus, [event_write(e) for e in events], args.batch, args.inflight)
        meter.stop("publish event", len(events))
        meter.start()
        keys = [f"bench-{tag}-{i}" for i in range(args.events)]
        await publish(bus, [kv_write(BUCKET_RUNS.name, k, value) for k in keys], args.batch, args.inflight)
        meter.stop("publish kv", len(events))
        total = len(warm) + len(events)
        for phase, batched in (("consume batch", True), ("consume one", False)):
            # the warm-up's messages come first on the stream: measured from the moment they are in
            durable = f"bench-{tag}-{phase.replace(' ', '-')}"
            await consume(bus, durable + "-w", len(warm), batched=batched)  # warms the path (same messages)
            await bus.js.delete_consumer(EVENTS_STREAM.name, durable + "-w")
            meter.start()
            await consume(bus, durable, total, batched=batched)
            meter.stop(phase, total)
            await bus.js.delete_consumer(EVENTS_STREAM.name, durable)
        serial = events_of(max(args.events // 4, 1), f"{tag}-serial")
        await publish_serial(bus, [event_write(e) for e in warm[: len(warm) // 4]])  # (duplicates: the same path)
        meter.start()
        await publish_serial(bus, [event_write(e) for e in serial])
        meter.stop("publish serial", len(serial))
        await get_all(bus, [f"bench-{tag}-warm-{i}" for i in range(args.warmup)], args.inflight)
        meter.start()
        await get_all(bus, keys, args.inflight)
        meter.stop("kv get", len(keys))
        timers = Timers(bus, TIMER_NS_RUN_WATCHDOG)
        at = datetime.now(UTC) + timedelta(hours=1)
        arms = [
            timers.arm_write(f"bench-{tag}-w{i}", at, b"{}", msg_id=f"bench-{tag}-w{i}") for i in range(args.warmup)
        ]
        await publish(bus, arms, args.batch, args.inflight)
        meter.start()
        arms = [
            timers.arm_write(f"bench-{tag}-{i}", at + timedelta(seconds=i % 60), b"{}", msg_id=f"bench-{tag}-{i}")
            for i in range(args.events)
        ]
        await publish(bus, arms, args.batch, args.inflight)
        meter.stop("timer arm", len(arms))
    return {"cpu": meter.cpu, "count": meter.count}


async def prepare(url: str) -> None:
    async with Bus.connect(NatsSettings(url=url), name="bench") as bus:
        await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
        await bus.js.purge_stream(EVENTS_STREAM.name)
        await bus.js.purge_stream(f"KV_{BUCKET_RUNS.name}")
        await bus.js.purge_stream(TIMERS_STREAMS["run-executor"].name)


def run_worker(
    args: argparse.Namespace, url: str, code: str, first: list[str], tag: str, tmp: Path
) -> dict[str, float]:
    """One worker's figures per phase: µs of its CPU per message, or with ``--callgrind`` thousands of instructions
    per message (callgrind's count of the phase, between its two ``getppid`` dumps: :class:`Meter`)."""
    env = dict(os.environ)
    if first:
        env["PYTHONPATH"] = os.pathsep.join([*first, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, __file__, "--worker", "--url", url, "--tag", tag]
    cmd += ["--events", str(args.events), "--warmup", str(args.warmup)]
    cmd += ["--batch", str(args.batch), "--inflight", str(args.inflight), "--loop", args.loop]
    out = tmp / f"callgrind-{tag}"
    if args.callgrind:
        env["PYTHONHASHSEED"] = "0"
        out.mkdir()
        grind = ["valgrind", "--tool=callgrind", "--dump-before=getppid", "--dump-instr=no", "--collect-jumps=no"]
        cmd = [*grind, f"--callgrind-out-file={out}/callgrind.out", *cmd, "--callgrind"]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not args.callgrind:
        return {phase: cpu * 1e6 for phase, cpu in result["cpu"].items()}
    dumps = sorted(out.glob("callgrind.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
    if len(dumps) != 2 * len(PHASES):
        raise RuntimeError(f"expected {2 * len(PHASES)} callgrind dumps in {out}, got {len(dumps)}")
    return {phase: _totals(dumps[2 * i + 1]) / result["count"][phase] / 1e3 for i, phase in enumerate(PHASES)}


def _totals(path: Path) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--batch", type=int, default=8, help="writes per pipelined round trip")
    parser.add_argument("--inflight", type=int, default=16, help="round trips at once")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="the workers' event loop")
    parser.add_argument("--before", nargs="+", default=[], metavar="SRC", help="source folders of the old code")
    parser.add_argument(
        "--callgrind", action="store_true", help="count each worker's instructions per message under valgrind instead"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="t", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if args.loop == "uvloop":
            import uvloop

            result: dict[str, Any] = uvloop.run(worker(args))
        else:
            result = asyncio.run(worker(args))
        sys.stdout.write(json.dumps(result) + "\n")
        return
    before = [str(Path(p).resolve()) for p in args.before]
    codes = [("before", before), ("current", [])] if before else [("current", [])]
    results: dict[str, list[dict[str, float]]] = {code: [] for code, _ in codes}
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    unit = "k instructions/msg" if args.callgrind else "µs CPU/msg"
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bus-bench-") as tmp:
        server = NatsServer(Path(tmp) / "nats")
        server.start()
        try:
            for number in range(args.rounds):
                # the order swapped every round: neither code always runs first (a warmer machine, a cooler one)
                for code, first in codes if number % 2 == 0 else codes[::-1]:
                    asyncio.run(prepare(server.url))
                    tag = f"{number}{code[0]}{time.time_ns() % 10**9}"
                    r = run_worker(args, server.url, code, first, tag, Path(tmp))
                    results[code].append(r)
                    figures = ", ".join(f"{p} {r[p]:.1f}" for p in PHASES)
                    say(f"round {number + 1} {code:8} {unit}: {figures}  (load {os.getloadavg()[0]:.1f})")
        finally:
            server.stop()
    load1 = os.getloadavg()
    say()
    say(
        f"medians over {args.rounds} rounds, {unit} of the bus process ({args.events} events, "
        f"batch {args.batch}, {args.inflight} in flight, {args.loop}; load average {load0[0]:.1f} -> {load1[0]:.1f})"
    )
    say(f"{'phase':16}" + "".join(f"{code:>10}" for code, _ in codes) + ("     ratio" if before else ""))
    for phase in PHASES:
        meds = [statistics.median(r[phase] for r in results[code]) for code, _ in codes]
        row = f"{phase:16}" + "".join(f"{m:10.2f}" for m in meds)
        if before:
            row += f"{meds[1] / meds[0]:10.3f}"
        say(row)


if __name__ == "__main__":
    main()
