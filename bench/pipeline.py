"""The whole pipeline under load: webhooks/s to the question, and ``run.started`` latency at a fixed rate.

Run: ``.venv/bin/python bench/pipeline.py [--runs 1000] [--connections 10 50 100] [--threads 2] [--rate 100]
[--duration 10] [--warmup 2]``. Needs ``wrk`` on the PATH (``apt-get install wrk``; ``make bench`` installs it);
without it the bench says so and exits 2, as ``bench/gateway.py`` does.

Starts its own embedded stack as ``bench/latency.py`` does (nats-server from the wheel with its monitoring port,
SQLite, the five service processes on free loopback ports, the shipped ``config/`` whose scripted demo reviewer
parks every run on ``ask_human``) and follows the runs on the bus (a core-NATS subscription to their
``run.requested``, ``run.started`` and ``human.requested``). After a few webhooks one at a time (every code path
loaded), it measures, on the same stack:

1. **``run.started`` latency at a fixed offered rate** (``--rate`` webhooks/s, default 100): open loop -- each
   webhook is sent at its scheduled time, whether or not the earlier ones were answered (an ``asyncio`` task per
   request). At 100/s a Python client is far from saturating the gateway, which is all this phase needs: it
   offers a rate, it does not look for the ceiling (wrk does that, below). The client is a lean HTTP/1.1 one
   (:class:`Webhooks`: prepared requests on keep-alive connections) on uvloop, so that it takes little of the
   cores it shares with the stack (httpx took ~6 ms of CPU per request here and slowed as the answers did).
   ``--warmup`` seconds at that rate, then ``--duration`` seconds measured: p50/p99 from each request's scheduled
   send time (not the moment the client got to it: a stall of the client counts against the figure, as it would
   for the sender it stands for -- no coordinated omission) to its run's ``run.started`` seen on the bus, split at
   ``run.requested`` (the gateway's part), and to the HTTP answer; the
   rate achieved and how late the client sent against its schedule (p99), so a client that fell behind shows; the
   CPU per run of every process until every run of the phase asked. When the stack cannot keep up with the rate,
   the runs queue and the figure is the queue's wait, growing with the phase's length. Every answer must be a 202
   and every run must start, or the bench fails saying which.
2. **Sustained runs/s to the question**: per ``--connections`` count, ``--runs`` distinct Azure DevOps PR webhooks
   (the example payload, a new top-level ``id`` each, Basic auth) driven by ``wrk`` with ``bench/wrk_webhook.lua``
   in its exact mode (each of the ``--threads`` threads sends its share and stops once every one is answered:
   exactly that many requests reach the gateway), never a Python client. Runs/s from wrk's start to the last of
   these runs' ``human.requested`` (and to the last ``run.started``), wrk's own answers/s and HTTP p50/p99, the CPU
   per run of every process over that span (the five services, nats-server, wrk, the bench itself) and what the
   rest of the machine used meanwhile. Every request must be answered 202 and every run must reach its question,
   or the bench fails with what was missing. Each count starts once the previous one's runs have all parked.

Baseline in the same run: a bare JetStream publish -> consume on the same server, one at a time (as
``bench/latency.py``), for the latency's ratio. The runs/s goal is absolute; the CPU per run says what the
machine's cores allow (cores x 1,000 / the stack's CPU ms per run). Prints figures, the load average, the
durability line; ``--json-out`` writes the record (``benchrecord.PipelineFigures``). Nothing asserts on speed.

Every run stays parked on its question (nobody answers): the later phases run with the earlier phases' runs
parked, as a stack accumulates them.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import nats
from benchrecord import (
    Durability,
    PipelineFigures,
    PipelineLoad,
    PipelineRate,
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
EXAMPLE = ROOT / "examples/azure-devops/git.pullrequest.created.json"
LUA = Path(__file__).resolve().with_name("wrk_webhook.lua")
TRIGGER = "ado-pr-review"
CREDENTIALS = "azure:change-me"  # the shipped config/triggers.yaml's demo trigger
AUTH = "Basic " + base64.b64encode(CREDENTIALS.encode()).decode()
EVENTS = "temporality.events."
KINDS = ("run.requested", "run.started", "human.requested")
WARMUP_RUNS = 3
CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchFailure(RuntimeError):
    """The load was not what it claims to be (a refused request, a run that never started or asked)."""


# --------------------------------------------------------------------------- the bus
class Seen:
    """When each run's events were first seen on the bus (core NATS), and who waits for one."""

    def __init__(self) -> None:
        self.at: dict[str, dict[str, float]] = {kind: {} for kind in KINDS}
        self._waiters: dict[tuple[str, str], asyncio.Future[float]] = {}
        self._changed = asyncio.Event()

    async def on(self, msg: Msg) -> None:
        now = time.perf_counter()
        kind, run_id = msg.subject.removeprefix(EVENTS), json.loads(msg.data).get("runid")
        if run_id is None or kind not in self.at or run_id in self.at[kind]:
            return
        self.at[kind][run_id] = now
        waiter = self._waiters.pop((kind, run_id), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(now)
        self._changed.set()

    async def time_of(self, kind: str, run_id: str, timeout_s: float) -> float:
        if run_id in self.at[kind]:
            return self.at[kind][run_id]
        waiter = self._waiters.setdefault((kind, run_id), asyncio.get_running_loop().create_future())
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            raise BenchFailure(f"run {run_id}: no {kind} on the bus within {timeout_s:g} s") from None

    async def wait(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Until ``done()`` holds (True) or ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))
            except TimeoutError:
                pass
        return True


# --------------------------------------------------------------------------- CPU
def _cpu_s(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _machine_busy_s() -> float | None:
    """CPU seconds all cores spent busy since boot (/proc/stat: all but idle and iowait)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def _own_and_children_s() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


class CpuMeter:
    """CPU seconds of the stack's processes, the bench, the reaped wrk runs and the whole machine."""

    def __init__(self, stack: Stack) -> None:
        self.pids: dict[str, int | None] = {name: process.pid for name, process in stack.services.items()}
        self.pids["nats-server"] = stack.nats.proc.pid if stack.nats.proc is not None else None

    def read(self) -> tuple[dict[str, float | None], float | None, float]:
        own, children = _own_and_children_s()
        cpu: dict[str, float | None] = {name: _cpu_s(pid) for name, pid in self.pids.items()}
        cpu |= {"wrk": children, "bench": own}
        return cpu, _machine_busy_s(), time.perf_counter()

    @staticmethod
    def per_run(
        before: tuple[dict[str, float | None], float | None, float],
        after: tuple[dict[str, float | None], float | None, float],
        runs: int,
    ) -> tuple[dict[str, float], float | None]:
        """CPU ms per run of each process, and the rest of the machine in cores, between two readings."""
        (cpu0, busy0, t0), (cpu1, busy1, t1) = before, after
        spent = {
            name: (end - start)
            for name, start in cpu0.items()
            if start is not None and (end := cpu1.get(name)) is not None
        }
        other = None
        if busy0 is not None and busy1 is not None and t1 > t0:
            other = max(0.0, (busy1 - busy0 - sum(spent.values())) / (t1 - t0))
        return {name: s * 1000 / runs for name, s in spent.items()}, other


# --------------------------------------------------------------------------- 1. latency at a fixed rate
class Webhooks:
    """A lean HTTP/1.1 client of the gateway's webhook endpoint: each request the example payload with a new
    top-level ``id``, built from two prepared halves, written on an idle keep-alive connection (a new one when
    none is idle: the gateway keeps an idle one 75 s), its answer read by its ``Content-Length``. httpx did the
    same at ~6 ms of the bench's CPU per request on this 2-core box at load 10-12 (its pool scans its connections;
    more open ones as the answers slowed): the client must not be what the figure measures."""

    def __init__(self, url: str) -> None:
        parsed = httpx.URL(url)
        self.host, self.port = parsed.host, parsed.port or 80
        template: dict[str, Any] = json.loads(EXAMPLE.read_text("utf-8-sig"))
        before, after = json.dumps(dict(template, id="\0")).encode().split(b'"\\u0000"')
        self.body = (before + b'"', b'"' + after)
        self.head = (
            f"POST {parsed.raw_path.decode()} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Authorization: {AUTH}\r\nContent-Type: application/json\r\n"
        ).encode()
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.opened = 0

    def request(self, event_id: str) -> bytes:
        body = self.body[0] + event_id.encode() + self.body[1]
        return self.head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body

    async def post(self) -> tuple[int, bytes]:
        """One new webhook: the answer's status and body."""
        if self.idle:
            reader, writer = self.idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            self.opened += 1
        writer.write(self.request(f"bench-pipeline-{uuid.uuid4()}"))
        head = await reader.readuntil(b"\r\n\r\n")
        status, length = int(head[9:12]), None
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length is None:
            writer.close()
            raise BenchFailure(f"the gateway answered without a Content-Length: {head[:300]!r}")
        body = await reader.readexactly(length)
        self.idle.append((reader, writer))
        return status, body

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


async def _one_at_a_time(stack: Stack, seen: Seen, count: int) -> None:
    """A few webhooks, each once the previous one's run asked: every code path of every process loaded."""
    client = Webhooks(f"{stack.gateway_url}/hooks/{TRIGGER}")
    try:
        for _ in range(count):
            status, body = await client.post()
            if status != 202:
                raise BenchFailure(f"the gateway answered {status} (not 202): {body[:300]!r}")
            await seen.time_of("human.requested", json.loads(body)["run_id"], 120)
    finally:
        await client.close()


async def _at_rate(stack: Stack, seen: Seen, rate: float, warmup_s: float, duration_s: float) -> dict[str, Any]:
    """Webhooks sent open-loop at ``rate``/s for ``warmup_s`` + ``duration_s``; the measured ones' figures."""
    total = math.ceil(rate * (warmup_s + duration_s))
    first_measured = math.ceil(rate * warmup_s)
    measured: list[tuple[float, float, float, str]] = []  # scheduled, sent, answered (perf_counter), run id
    runs: list[str] = []  # every run of the phase, the warm-up's too
    refused: list[str] = []
    client = Webhooks(f"{stack.gateway_url}/hooks/{TRIGGER}")

    async def send(i: int, scheduled: float) -> None:
        sent = time.perf_counter()
        try:
            status, body = await client.post()
        except Exception as exc:  # any failure to get an answer is the bench's finding, not a crash
            refused.append(f"no answer: {exc!r}")
            return
        answered = time.perf_counter()
        if status != 202:
            refused.append(f"{status} {body[:120]!r}")
            return
        run_id = str(json.loads(body)["run_id"])
        runs.append(run_id)
        if i >= first_measured:
            measured.append((scheduled, sent, answered, run_id))

    tasks: list[asyncio.Task[None]] = []
    start = time.perf_counter() + 0.05
    try:
        for i in range(total):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(i, scheduled)))
        await asyncio.gather(*tasks)
    finally:
        await client.close()
    if refused:
        raise BenchFailure(f"{len(refused)} of {total} webhooks at {rate:g}/s were not answered 202: {refused[:3]}")
    timeout = 120 + total / 10
    started, requested = [], []
    # from the scheduled send, not the actual one: time the client lost before sending is the run's too (an
    # open-loop figure that left it out would hide a stall of the bench as fewer slow runs: coordinated omission)
    for scheduled, _, _, run_id in measured:
        started.append((await seen.time_of("run.started", run_id, timeout) - scheduled) * 1000)
        requested.append((await seen.time_of("run.requested", run_id, timeout) - scheduled) * 1000)
    sends = sorted(m[1] for m in measured)
    return {
        "achieved": (len(sends) - 1) / (sends[-1] - sends[0]) if len(sends) > 1 else 0.0,
        "lag": [(m[1] - m[0]) * 1000 for m in measured],
        "started": started,
        "requested": requested,
        "response": [(m[2] - m[0]) * 1000 for m in measured],
        "runs": runs,
        "load": os.getloadavg()[0],
        "connections": client.opened,
    }


# --------------------------------------------------------------------------- 2. runs/s under wrk
def _every_thread_done(marks: Path, threads: int) -> bool:
    """Whether every wrk thread has made its mark (``<marks><thread number>``): all its webhooks answered."""
    return all(Path(f"{marks}{n}").exists() for n in range(1, threads + 1))


async def _wrk(
    wrk: str, url: str, connections: int, threads: int, per_thread: int, bound_s: float
) -> tuple[dict[str, Any], float]:
    """wrk in its exact mode: each thread sends ``per_thread`` webhooks and stops once all are answered; it is
    interrupted (SIGINT: it still reports) as soon as every thread has. The parsed ``webhook-bench`` line, and
    the time wrk was started (``time.perf_counter``)."""
    with tempfile.TemporaryDirectory(prefix="temporality-wrk-") as tmp:
        marks = Path(tmp) / "done-"
        command = [
            wrk,
            f"-t{threads}",
            f"-c{connections}",
            f"-d{max(1, round(bound_s))}s",
            "--timeout",
            "30s",
            "--latency",
            "-s",
            str(LUA),
            url,
            "--",
            str(EXAMPLE),
            CREDENTIALS,
            f"pipe-{uuid.uuid4().hex[:12]}",  # ids unique across runs of the bench
            str(per_thread),
            str(marks),
            "exact",
        ]
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT
        )
        deadline = time.monotonic() + bound_s + 30
        while proc.returncode is None and time.monotonic() < deadline:
            if _every_thread_done(marks, threads):
                proc.send_signal(signal.SIGINT)
                break
            await asyncio.sleep(0.005)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
    for line in out.decode().splitlines():
        if line.startswith("webhook-bench "):
            return dict(json.loads(line.removeprefix("webhook-bench "))), started
    raise BenchFailure(f"wrk exited with {proc.returncode} without a result line:\n{out.decode()}{err.decode()}")


async def _under_wrk(
    stack: Stack, seen: Seen, meter: CpuMeter, wrk: str, connections: int, threads: int, runs: int
) -> PipelineLoad:
    """``runs`` webhooks through wrk at ``connections``; every one answered 202 and its run at its question."""
    before = {kind: len(seen.at[kind]) for kind in KINDS}  # the earlier phases' runs have all asked by now
    url = f"{stack.gateway_url}/hooks/{TRIGGER}"
    cpu0 = meter.read()
    out, t0 = await _wrk(wrk, url, connections, threads, runs // threads, bound_s=120 + runs / 5)
    statuses = {int(s): int(n) for s, n in out["statuses"].items()}
    accepted, answered, sent = statuses.get(202, 0), int(out["requests"]), int(out["sent"])
    errors = {k: int(v) for k, v in out["errors"].items() if k != "status" and int(v)}
    if sent != runs or accepted != runs or errors:
        raise BenchFailure(
            f"wrk at {connections} connections: {sent} of {runs} webhooks sent, {answered} answered, {accepted} "
            f"with 202 (statuses {statuses}, socket errors {errors or 'none'}): every one must be a new run"
        )

    def new(kind: str) -> int:
        return len(seen.at[kind]) - before[kind]

    timeout = 120 + runs / 5
    if not await seen.wait(lambda: new("human.requested") >= runs, timeout):
        raise BenchFailure(
            f"at {connections} connections: {new('human.requested')} of {runs} runs reached their question "
            f"(human.requested), {new('run.started')} started, within {timeout:g} s of the last answer"
        )
    cpu1 = meter.read()
    asked = list(seen.at["human.requested"].values())[before["human.requested"] :]
    started = list(seen.at["run.started"].values())[before["run.started"] :]
    if new("human.requested") != runs or new("run.started") != runs:
        raise BenchFailure(
            f"at {connections} connections: {new('run.started')} runs started and {new('human.requested')} asked "
            f"for {runs} webhooks (a run of an earlier phase was late, or a webhook started two)"
        )
    per_run, other = CpuMeter.per_run(cpu0, cpu1, runs)
    return PipelineLoad(
        connections=connections,
        runs=runs,
        accepted=accepted,
        runs_s=runs / (max(asked) - t0),
        started_s=runs / (max(started) - t0),
        requests_s=answered / (int(out["duration_us"]) / 1e6),
        http_p50_ms=out["latency_us"]["p50"] / 1000,
        http_p99_ms=out["latency_us"]["p99"] / 1000,
        cpu_ms_per_run=per_run,
        other_cores=other,
        load=os.getloadavg()[0],
    )


# --------------------------------------------------------------------------- baseline
async def _bare(nc: NATS, count: int) -> list[float]:
    """One JetStream publish -> push-consumer delivery on the same server, one at a time (ms)."""
    js = nc.jetstream()
    await js.add_stream(name="BENCH_PIPELINE", subjects=["bench.pipeline"])
    got: asyncio.Queue[float] = asyncio.Queue()

    async def on_bench(msg: Msg) -> None:
        await got.put(time.perf_counter())
        await msg.ack()

    sub = await js.subscribe("bench.pipeline", cb=on_bench, durable="bench-pipeline", manual_ack=True)
    hops: list[float] = []
    for i in range(count):
        t0 = time.perf_counter()
        await js.publish("bench.pipeline", str(i).encode())
        hops.append(((await asyncio.wait_for(got.get(), 10)) - t0) * 1000)
    await sub.unsubscribe()
    await js.delete_stream("BENCH_PIPELINE")
    return hops


# --------------------------------------------------------------------------- the bench
def _on_uvloop(coro: Coroutine[Any, Any, PipelineFigures]) -> PipelineFigures:
    """The bench's loop on uvloop, as the services run theirs: the client and the subscriber take less of the cores."""
    try:
        import uvloop
    except ImportError:  # a dependency of temporality_service; plain asyncio still works
        return asyncio.run(coro)
    figures: PipelineFigures = uvloop.run(coro)
    return figures


def _load() -> str:
    return " / ".join(f"{v:.1f}" for v in os.getloadavg())


async def _measure(stack: Stack, args: argparse.Namespace) -> PipelineFigures:
    out = sys.stdout.write
    nc = await nats.connect(stack.nats_url)
    seen = Seen()
    for kind in KINDS:
        await nc.subscribe(f"{EVENTS}{kind}", cb=seen.on)
    meter = CpuMeter(stack)
    await _one_at_a_time(stack, seen, WARMUP_RUNS)

    out(
        f"[rate] {args.rate:g} webhooks/s open loop, {args.warmup:g} s warm-up + {args.duration:g} s (load {_load()})\n"
    )
    cpu0 = meter.read()
    r = await _at_rate(stack, seen, args.rate, args.warmup, args.duration)
    # every run of the phase at its question before the first wrk phase (whose counts start from here)
    for run_id in r["runs"]:
        await seen.time_of("human.requested", run_id, 120 + len(r["runs"]) / 10)
    per_run, other = CpuMeter.per_run(cpu0, meter.read(), len(r["runs"]))
    rate = PipelineRate(
        offered_per_s=args.rate,
        achieved_per_s=r["achieved"],
        seconds=args.duration,
        send_lag_p99_ms=percentiles(r["lag"]).p99_ms,
        run_started=percentiles(r["started"]),
        run_requested=percentiles(r["requested"]),
        response=percentiles(r["response"]),
        load=r["load"],
        cpu_ms_per_run=per_run,
        other_cores=other,
    )
    out(_rate_lines(rate))
    out(f"  ({r['connections']} connections opened by the client)\n")
    await asyncio.sleep(1.0)  # what trails the questions (notifications, the journal) before the first count

    loads: list[PipelineLoad] = []
    for connections in args.connections:
        out(f"[wrk] {args.runs} webhooks, -t{args.threads} -c{connections} (load {_load()})\n")
        load = await _under_wrk(stack, seen, meter, args.wrk, connections, args.threads, args.runs)
        loads.append(load)
        out(_load_line(load))
        await asyncio.sleep(1.0)  # what trails the questions (notifications, the journal) before the next count

    hops = await _bare(nc, 200)
    await nc.drain()
    return PipelineFigures(loads=loads, rate=rate, bare_jetstream=percentiles(hops))


def _rate_lines(rate: PipelineRate) -> str:
    s, q, h = rate.run_started, rate.run_requested, rate.response
    return (
        f"  offered {rate.offered_per_s:g}/s, achieved {rate.achieved_per_s:.1f}/s over {s.n} measured webhooks "
        f"(sends late against the schedule: p99 {rate.send_lag_p99_ms:.1f} ms)\n"
        f"  webhook -> run.started   p50 {s.p50_ms:8.2f}  p99 {s.p99_ms:8.2f}  max {s.max_ms or 0:8.2f} ms\n"
        f"  webhook -> run.requested p50 {q.p50_ms:8.2f}  p99 {q.p99_ms:8.2f} ms (the gateway's part)\n"
        f"  HTTP answer              p50 {h.p50_ms:8.2f}  p99 {h.p99_ms:8.2f} ms   | load {rate.load:.1f}\n"
        f"  {_cpu_line(rate.cpu_ms_per_run, rate.other_cores)}\n"
    )


def _cpu_line(cpu: dict[str, float], other_cores: float | None) -> str:
    stack = sum(v for k, v in cpu.items() if k not in ("wrk", "bench"))
    parts = ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
    other = "-" if other_cores is None else f"{other_cores:.2f}"
    allow = f" (the cores allow ~{(os.cpu_count() or 1) * 1000 / stack:.0f} runs/s at that)" if stack else ""
    return f"CPU ms per run: {parts}; the stack {stack:.2f}{allow}; other work {other} cores"


def _load_line(load: PipelineLoad) -> str:
    return (
        f"  -c{load.connections:<4d} {load.runs_s:7.1f} runs/s to the question ({load.started_s:.1f}/s to run.started)"
        f" | wrk {load.requests_s:.1f} answers/s, HTTP p50 {load.http_p50_ms:.1f} p99 {load.http_p99_ms:.1f} ms"
        f" | {load.accepted}/{load.runs} 202 | load {load.load:.1f}\n"
        f"         {_cpu_line(load.cpu_ms_per_run, load.other_cores)}\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=1000, help="webhooks per connection count (default 1000)")
    parser.add_argument(
        "--connections", type=int, nargs="+", default=[10, 50, 100], help="wrk connection counts (default 10 50 100)"
    )
    parser.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    parser.add_argument(
        "--rate", type=float, default=100.0, help="offered webhooks/s of the latency phase (default 100)"
    )
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds at --rate (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds at --rate before measuring (default 2)")
    parser.add_argument(
        "--json-out", type=Path, help="also write the figures as a JSON record here (bench/benchrecord.py)"
    )
    args = parser.parse_args()
    if args.threads < 1 or min(args.connections) < args.threads or args.runs < args.threads:
        parser.error("--threads >= 1, every --connections >= --threads and --runs >= --threads")
    if args.rate <= 0 or args.duration <= 0 or args.warmup < 0:
        parser.error("--rate > 0, --duration > 0, --warmup >= 0")
    if args.runs % args.threads:
        args.runs += args.threads - args.runs % args.threads
        sys.stdout.write(f"--runs rounded up to {args.runs}: each wrk thread sends the same share\n")
    args.wrk = shutil.which("wrk")
    if args.wrk is None:
        sys.stderr.write("bench/pipeline.py needs wrk, an HTTP load generator: apt-get install wrk (Debian/Ubuntu)\n")
        return 2
    settings = {k: getattr(args, k) for k in ("runs", "connections", "threads", "rate", "duration", "warmup")}
    recorder = Recorder("pipeline", settings)
    sys.stdout.write(
        f"the pipeline, webhook -> question: five processes, one nats-server, SQLite, loopback; "
        f"{os.cpu_count()} cores shared with the load generators and any other work (load average {_load()})\n"
    )
    with tempfile.TemporaryDirectory(prefix="temporality-bench-") as tmp:
        stack = bench_stack(Path(tmp))
        stack.start()
        try:
            figures = _on_uvloop(_measure(stack, args))
            durability = merge(
                Durability(jetstream=jetstream_durability(stack.nats.monitoring_url)),
                asyncio.run(database_durability(stack.database_url)),
            )
        except BenchFailure as exc:
            sys.stderr.write(f"bench/pipeline.py: {exc}\n")
            return 1
        finally:
            stack.stop()
    out = sys.stdout.write
    bare = figures.bare_jetstream
    out(f"baseline: bare JetStream publish -> consume, same server, {bare.n} one at a time\n")
    out(f"  p50 {bare.p50_ms:8.2f} ms   p99 {bare.p99_ms:8.2f} ms\n")
    ratio = figures.rate.run_started.p50_ms / bare.p50_ms if bare.p50_ms else float("nan")
    out(f"ratio p50 webhook -> run.started at {args.rate:g}/s / bare hop: {ratio:.1f}x\n")
    best = figures.best
    out(
        f"best: {best.runs_s:.1f} runs/s to the question at {best.connections} connections (goal >= 250); "
        f"run.started p50 {figures.rate.run_started.p50_ms:.1f} ms at {figures.rate.achieved_per_s:.1f} webhooks/s "
        f"(goal <= 10 ms at 100/s)\n"
    )
    out(f"load average at the end {_load()}\n")
    recorder.finish(figures, durability, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
