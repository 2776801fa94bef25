"""Parked runs: how many the run-executor parks, what they cost it in memory, how fast it resumes them.

Run: ``.venv/bin/python bench/parked_runs.py [--runs 2000] [--latency-sample 200] [--chunk 500] [--before SRC ...]``
(issue 6's figures are for ``--runs 100000``; at this machine's park rates that is an hour or more per phase).
``--before SRC ...``: a ``before`` phase whose run-executor runs the code in SRC (first on its ``PYTHONPATH``), then
the process restarted on the current code, on the same stack: ratios ``current / before`` in the same run
(``--rounds``: in ABBA order, before-current then current-before, so a drift over the run cancels out).

Starts its own embedded stack (nats-server from the wheel, SQLite, the five service processes) in a temp
dir on free loopback ports. One real webhook goes through the gateway to the scripted reviewer (which
parks on ``ask_human``); its ``run.requested`` is the template. Then:

1. **Park**: ``--runs`` copies of that ``run.requested`` (new run and event ids) are published on the bus,
   pipelined, as the gateway would; every run starts, calls ``get_input``,
   ``report_progress`` (the shipped card offers it, AP-9) and ``ask_human`` -- three turns -- and parks.
   Counted from the first publish to the last ``human.requested``. The run-executor's resident memory
   (``VmRSS``) is read before and after.
2. **Resume in bulk**: for all parked runs but the latency sample, a ``human.answered`` is published on the
   bus exactly as human-interaction publishes it (same source, id, actor), pipelined; counted from the
   first publish to the last ``run.resumed``. Publishing the answer on the bus (instead of through a
   channel) keeps the figure the run-executor's: binding answers is human-interaction's, measured by
   its own tests. The executor's CPU per resume is its user+system time over that span.
3. **Latency**: the remaining ``--latency-sample`` runs are answered one at a time; p50/p99 from the answer's
   publish to ``run.resumed`` seen on the bus.
Each phase also reads the messages the run-executor's connection sent and received (nats-server ``/connz``)
per run parked and per run resumed to its end, and agent-collab's with its CPU (no run here collaborates).

4. **Baseline** in the same run: the same number of messages of the same size published pipelined to a
   bench stream and consumed by one pull consumer (fetch batches, ack each) — the bus's own ceiling here.

``--profile DIR``: the run-executor runs under cProfile on its CPU clock (a ``sitecustomize`` the bench writes
and puts first on the ``PYTHONPATH`` of every process, which acts only in the run-executor), switched on and off
by signals around each park and each bulk resume: ``DIR/<label>-<n>-park.prof`` and ``...-resume.prof``.

Prints figures and ratios; asserts nothing. The machine's other load moves every figure: compare ratios
within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import nats
from benchrecord import (
    Durability,
    ParkedPhase,
    ParkedRunsFigures,
    Percentiles,
    Recorder,
    bench_stack,
    database_durability,
    jetstream_durability,
    merge,
    percentiles,
)
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from temporality_bus import Bus, NatsSettings
from temporality_embedded import Stack
from temporality_human_interaction.events import ACTOR, SOURCE
from temporality_protocol import derive_id, encode, make_event
from temporality_protocol.catalog import BUCKET_CHECKPOINTS, BUCKET_RUNS, EVENTS_STREAM, TIMERS_STREAMS
from temporality_protocol.events import HumanAnswered, OptionAnswer
from temporality_service import LogSettings, configure_logging

ROOT = Path(__file__).resolve().parents[1]
AUTH = "Basic " + base64.b64encode(b"azure:change-me").decode()
CLK_TCK = os.sysconf("SC_CLK_TCK")


#: Written as ``sitecustomize.py`` with ``--profile``: in the run-executor only (its ``python -m`` names its
#: package), SIGUSR1 starts cProfile on the process's CPU clock and SIGUSR2 stops it and dumps the profile to the
#: path the bench wrote in ``<dir>/next`` (the handlers run between bytecodes in the event loop's thread).
PROFILER = """
import sys
if "temporality_run_executor" in getattr(sys, "orig_argv", ()):
    import cProfile, signal, time
    from pathlib import Path
    _dir = Path(__file__).parent
    _state = {}

    def _on(signum, frame):
        profile = cProfile.Profile(time.process_time)
        _state["profile"] = profile
        profile.enable()

    def _off(signum, frame):
        profile = _state.pop("profile", None)
        if profile is not None:
            profile.disable()
            profile.dump_stats((_dir / "next").read_text().strip())

    signal.signal(signal.SIGUSR1, _on)
    signal.signal(signal.SIGUSR2, _off)
"""


class Profiler:
    """``--profile DIR``: switches the run-executor's cProfile on and off around the measured spans, or with
    ``--profiler py-spy`` samples it from outside (``py-spy record --format raw``: folded stacks, no overhead
    in the process; py-spy is not a dependency: install it into the venv to use this)."""

    def __init__(self, out: Path | None, tool: str = "cprofile") -> None:
        self.out = out
        self.tool = tool
        self.count = 0
        self.folder: Path | None = None
        self.spy: subprocess.Popen[bytes] | None = None

    def install(self, tmp: Path) -> None:
        """Write the ``sitecustomize`` and put its folder first on this process's ``PYTHONPATH`` (the stack's
        processes inherit it, a ``--before`` phase puts its SRC before it)."""
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        if self.tool == "py-spy":
            return
        folder = tmp / "profiler"
        folder.mkdir()
        (folder / "sitecustomize.py").write_text(PROFILER)
        self.folder = folder
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *inherited])

    def start(self, pid: int, name: str) -> None:
        if self.out is None:
            return
        self.count += 1
        if self.tool == "py-spy":
            spy = Path(sys.executable).with_name("py-spy")
            out = self.out.resolve() / f"{self.count:02d}-{name}.folded"
            command = [str(spy), "record", "--pid", str(pid), "--rate", "250", "--format", "raw", "-o", str(out)]
            self.spy = subprocess.Popen([*command, "--nonblocking"], stdout=subprocess.DEVNULL)
            time.sleep(0.5)  # attached before the span starts
            return
        assert self.folder is not None
        (self.folder / "next").write_text(str(self.out.resolve() / f"{self.count:02d}-{name}.prof"))
        os.kill(pid, signal.SIGUSR1)

    def stop(self, pid: int) -> None:
        if self.out is None:
            return
        if self.spy is not None:
            self.spy.send_signal(signal.SIGINT)  # py-spy writes its samples and exits
            self.spy.wait(60)
            self.spy = None
            return
        os.kill(pid, signal.SIGUSR2)


PROFILE = Profiler(None)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


class Seen:
    """Events of some types seen on the bus (core NATS), by run id, with the time each was first seen."""

    def __init__(self) -> None:
        self.at: dict[str, dict[str, float]] = {}
        self.data: dict[str, dict[str, dict[str, Any]]] = {}
        self._changed = asyncio.Event()

    async def on(self, msg: Msg) -> None:
        event = json.loads(msg.data)
        kind, run_id = event["type"], event.get("runid")
        if run_id is None:
            return
        self.at.setdefault(kind, {}).setdefault(run_id, time.perf_counter())
        self.data.setdefault(kind, {}).setdefault(run_id, event["data"])
        self._changed.set()

    def count(self, kind: str, among: set[str] | None = None) -> int:
        runs = self.at.get(kind, {})
        return len(runs) if among is None else len(among & runs.keys())

    async def wait(self, what: Callable[[], bool], timeout_s: float, label: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not what():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out waiting for {label}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))
            except TimeoutError:
                pass


def _answer(requested: dict[str, Any], run_id: str, correlation_id: str | None) -> tuple[str, bytes, dict[str, str]]:
    """The ``human.answered`` human-interaction would publish for the request's first option."""
    request_id = requested["request_id"]
    option = requested["options"][0]["id"] if requested["options"] else None
    answer = OptionAnswer(option_id=option) if option else None
    if answer is None:
        raise RuntimeError("the scripted reviewer's question has no options")
    event = make_event(
        HumanAnswered(
            request_id=request_id,
            run_id=run_id,
            recipient=requested["recipient"],
            responder=requested["recipient"],
            answer=answer,
            channel="web",
            waited_s=1.0,
        ),
        source=SOURCE,
        id=derive_id("evt", request_id, "answered"),
        run_id=run_id,
        correlation_id=correlation_id,
        actor=requested["recipient"] or ACTOR,
    )
    return event.nats_subject, encode(event), {"Nats-Msg-Id": event.id, "Ce-Type": event.type}


async def _publish_chunked(bus: Bus, messages: list[tuple[str, bytes, dict[str, str]]], chunk: int) -> None:
    for start in range(0, len(messages), chunk):
        await bus.publish_raw_many(messages[start : start + chunk], timeout_s=60)


async def _template(stack: Stack, nc: NATS) -> tuple[str, str, bytes]:
    """One real webhook through the gateway: (its run id, the subject and body of its ``run.requested``)."""
    captured: dict[str, tuple[str, bytes]] = {}
    got = asyncio.Event()

    async def on_requested(msg: Msg) -> None:
        captured[json.loads(msg.data)["runid"]] = (msg.subject, msg.data)
        got.set()

    sub = await nc.subscribe("temporality.events.run.requested", cb=on_requested)
    payload = json.loads((ROOT / "examples/azure-devops/git.pullrequest.created.json").read_text("utf-8-sig"))
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(
            f"{stack.gateway_url}/hooks/ado-pr-review",
            json=dict(payload, id=str(uuid.uuid4())),
            headers={"Authorization": AUTH},
        )
        response.raise_for_status()
        run_id = response.json()["run_id"]
    while run_id not in captured:
        got.clear()
        await asyncio.wait_for(got.wait(), 30)
    await sub.unsubscribe()
    subject, body = captured[run_id]
    return run_id, subject, body


async def _baseline(bus: Bus, nc: NATS, count: int, size: int, chunk: int) -> float:
    """Messages/s for ``count`` messages of ``size`` bytes: pipelined publish, then one pull consumer acking each."""
    js = nc.jetstream()
    await js.add_stream(name="BENCH_PARKED", subjects=["bench.parked.>"])
    body = b"x" * size
    messages = [(f"bench.parked.{i % 64}", body, {"Nats-Msg-Id": f"b-{i}"}) for i in range(count)]
    sub = await js.pull_subscribe("bench.parked.>", durable="bench-parked")
    t0 = time.perf_counter()
    await _publish_chunked(bus, messages, chunk)
    consumed = 0
    while consumed < count:
        for msg in await sub.fetch(batch=256, timeout=10):
            await msg.ack()
            consumed += 1
    elapsed = time.perf_counter() - t0
    await js.delete_stream("BENCH_PARKED")
    return count / elapsed


async def _bare_hop(nc: NATS, count: int, size: int) -> list[float]:
    """Milliseconds of one JetStream publish -> push-consumer delivery, one at a time, ``count`` times: the
    bus's floor under the answer -> ``run.resumed`` latency."""
    js = nc.jetstream()
    await js.add_stream(name="BENCH_HOP", subjects=["bench.hop"])
    got: asyncio.Queue[float] = asyncio.Queue()

    async def on(msg: Msg) -> None:
        await got.put(time.perf_counter())
        await msg.ack()

    sub = await js.subscribe("bench.hop", cb=on, durable="bench-hop", manual_ack=True)
    body, out = b"x" * size, []
    for _ in range(count):
        t0 = time.perf_counter()
        await js.publish("bench.hop", body)
        out.append((await asyncio.wait_for(got.get(), 10) - t0) * 1000)
    await sub.unsubscribe()
    await js.delete_stream("BENCH_HOP")
    return out


#: The streams the parked runs live in (records, checkpoints, events, timers): their size on the server.
STORE_STREAMS = (
    f"KV_{BUCKET_RUNS.name}",
    f"KV_{BUCKET_CHECKPOINTS.name}",
    EVENTS_STREAM.name,
    *(s.name for s in TIMERS_STREAMS.values()),
)


def _dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / (1024 * 1024)


async def _store(nc: NATS) -> dict[str, tuple[int, float]]:
    """Messages and MB of each of :data:`STORE_STREAMS` (what JetStream holds for the runs)."""
    js = nc.jetstream()
    sizes: dict[str, tuple[int, float]] = {}
    for name in STORE_STREAMS:
        info = await js.stream_info(name)
        sizes[name] = (info.state.messages, info.state.bytes / (1024 * 1024))
    return sizes


def _connz(monitoring_url: str, name: str) -> tuple[int, int]:
    """Messages the connections named ``name`` sent to the server and received from it (``/connz``): every
    request, publish, acknowledgement and pull of the process, and every reply and delivery to it."""
    with urllib.request.urlopen(f"{monitoring_url}/connz?limit=4096", timeout=10) as response:
        conns = json.loads(response.read())["connections"]
    mine = [c for c in conns if c.get("name") == name]
    return sum(c["in_msgs"] for c in mine), sum(c["out_msgs"] for c in mine)


class Phase:
    """One measured series on the running stack: a fresh set of runs parked, resumed in bulk, then a latency
    sample answered one at a time, by the run-executor process running at the time (``label``)."""

    def __init__(self, stack: Stack, nc: NATS, bus: Bus, seen: Seen, template: tuple[str, str, bytes]) -> None:
        self.stack, self.nc, self.bus, self.seen = stack, nc, bus, seen
        self.template_run, self.subject, body = template
        self.text = body.decode()
        self.template_event = json.loads(self.text)["id"]
        self.label = "current"

    def _requested(self, run_id: str) -> tuple[str, bytes, dict[str, str]]:
        body = self.text.replace(self.template_run, run_id).replace(self.template_event, f"evt-{run_id}")
        return self.subject, body.encode(), {"Nats-Msg-Id": f"evt-{run_id}", "Ce-Type": "run.requested"}

    async def warm_up(self) -> None:
        """One run parked and answered, so every code path of the executor process is loaded before measuring."""
        seen, run_id = self.seen, f"run-bench-warm-{uuid.uuid4().hex[:16]}"
        await self.bus.publish_raw_many([self._requested(run_id)])
        await seen.wait(lambda: seen.count("human.requested", {run_id}) == 1, 120, "the warm-up run's question")
        await self.bus.publish_raw_many([_answer(seen.data["human.requested"][run_id], run_id, None)])
        await seen.wait(lambda: seen.count("run.completed", {run_id}) == 1, 120, "the warm-up run to finish")

    async def run(self, runs: int, sample: int, chunk: int) -> dict[str, Any]:
        stack, nc, bus, seen = self.stack, self.nc, self.bus, self.seen
        executor = stack.services["run-executor"].pid
        assert executor is not None
        assert stack.nats.proc is not None
        nats_pid = stack.nats.proc.pid
        store_dir = stack.nats.store_dir
        monitoring = stack.nats.monitoring_url
        figures: dict[str, Any] = {"runs": runs, "sample": sample}
        await self.warm_up()
        await asyncio.sleep(1.0)  # the warm-up's acks and timers out of the way

        # 1. park
        rss_before = _rss_mb(executor)
        figures |= {"nats_rss_before_mb": _rss_mb(nats_pid), "store_before_mb": _dir_mb(store_dir)}
        figures["streams_before"] = await _store(nc)
        ids = [f"run-bench-{uuid.uuid4().hex[:20]}" for _ in range(runs)]
        messages = [self._requested(run_id) for run_id in ids]
        wanted = set(ids)
        msgs0 = _connz(monitoring, "run-executor")
        collab0 = _connz(monitoring, "agent-collab")
        collab_pid = stack.services["agent-collab"].pid
        assert collab_pid is not None
        collab_cpu0 = _cpu_s(collab_pid)
        PROFILE.start(executor, f"{self.label}-park")
        park_cpu0 = _cpu_s(executor)
        t0 = time.perf_counter()
        await _publish_chunked(bus, messages, chunk)
        await seen.wait(lambda: seen.count("human.requested", wanted) == runs, 60 + runs, "every run to park")
        PROFILE.stop(executor)
        figures["executor_cpu_ms_per_park"] = (_cpu_s(executor) - park_cpu0) * 1000 / runs
        parked_at = max(seen.at["human.requested"][r] for r in ids)
        figures["park_per_s"] = runs / (parked_at - t0)
        await asyncio.sleep(1.0)  # let the executor settle (acks, timers) before reading its memory
        msgs1 = _connz(monitoring, "run-executor")
        collab1 = _connz(monitoring, "agent-collab")
        collab_cpu1 = _cpu_s(collab_pid)
        figures["collab_cpu_ms_per_park"] = (collab_cpu1 - collab_cpu0) * 1000 / runs
        figures["park_msgs_per_run"] = ((msgs1[0] - msgs0[0]) / runs, (msgs1[1] - msgs0[1]) / runs)
        figures["collab_park_msgs_per_run"] = ((collab1[0] - collab0[0]) / runs, (collab1[1] - collab0[1]) / runs)
        rss_parked = _rss_mb(executor)
        figures |= {"rss_before_mb": rss_before, "rss_parked_mb": rss_parked}
        figures |= {"nats_rss_parked_mb": _rss_mb(nats_pid), "store_parked_mb": _dir_mb(store_dir)}
        figures["streams_parked"] = await _store(nc)

        # 2. resume in bulk
        bulk, latency_runs = ids[: max(runs - sample, 0)], ids[max(runs - sample, 0) :]
        answers = [_answer(seen.data["human.requested"][r], r, None) for r in bulk]
        bulk_set = set(bulk)
        PROFILE.start(executor, f"{self.label}-resume")
        cpu0 = _cpu_s(executor)
        t0 = time.perf_counter()
        await _publish_chunked(bus, answers, chunk)
        await seen.wait(lambda: seen.count("run.resumed", bulk_set) == len(bulk), 60 + runs, "every bulk resume")
        PROFILE.stop(executor)
        resumed_at = max((seen.at["run.resumed"][r] for r in bulk), default=t0)
        cpu1 = _cpu_s(executor)
        if bulk:
            figures["resume_per_s"] = len(bulk) / (resumed_at - t0)
            figures["executor_cpu_ms_per_resume"] = (cpu1 - cpu0) * 1000 / len(bulk)
        await seen.wait(
            lambda: seen.count("run.completed", bulk_set) + seen.count("run.failed", bulk_set) == len(bulk),
            60 + runs,
            "every bulk run to finish",
        )
        if bulk:
            figures["lifecycle_end_per_s"] = len(bulk) / (max(seen.at["run.completed"].get(r, t0) for r in bulk) - t0)
            figures["executor_cpu_ms_per_end"] = (_cpu_s(executor) - cpu0) * 1000 / len(bulk)
            await asyncio.sleep(1.0)  # the last acks and timers
            msgs2 = _connz(monitoring, "run-executor")
            collab2 = _connz(monitoring, "agent-collab")
            figures["collab_cpu_ms_per_end"] = (_cpu_s(collab_pid) - collab_cpu1) * 1000 / len(bulk)
            figures["resume_msgs_per_run"] = ((msgs2[0] - msgs1[0]) / len(bulk), (msgs2[1] - msgs1[1]) / len(bulk))
            figures["collab_resume_msgs_per_run"] = (
                (collab2[0] - collab1[0]) / len(bulk),
                (collab2[1] - collab1[1]) / len(bulk),
            )
        figures["failed"] = seen.count("run.failed", wanted)

        # 3. latency, one answer at a time
        latencies: list[float] = []
        for run_id in latency_runs:
            start = time.perf_counter()
            await bus.publish_raw_many([_answer(seen.data["human.requested"][run_id], run_id, None)])
            await seen.wait(lambda r=run_id: seen.count("run.resumed", {r}) == 1, 60, f"{run_id} to resume")  # type: ignore[misc]
            latencies.append((seen.at["run.resumed"][run_id] - start) * 1000)
        if latencies:
            figures |= {"latency_p50_ms": statistics.median(latencies), "latency_p99_ms": _pct(latencies, 0.99)}
        figures["rss_after_mb"] = _rss_mb(executor)
        figures["load"] = os.getloadavg()
        return figures


async def _measure(
    stack: Stack, runs: int, sample: int, chunk: int, before: list[str], rounds: int
) -> tuple[list[tuple[str, dict[str, Any]]], float, list[float]]:
    """Each phase's figures, in the order measured (with ``before``: that code's executor, then this one's,
    ``rounds`` times), the bare baseline's messages/s and its one-at-a-time hop latencies (ms)."""
    nc = await nats.connect(stack.nats_url)
    seen = Seen()
    for kind in ("human.requested", "run.resumed", "run.completed", "run.failed"):
        await nc.subscribe(f"temporality.events.{kind}", cb=seen.on)
    results: list[tuple[str, dict[str, Any]]] = []
    async with Bus.connect(NatsSettings(url=stack.nats_url), name="bench-parked-runs") as bus:
        template = await _template(stack, nc)
        phase = Phase(stack, nc, bus, seen, template)
        # ABBA order (before, current, current, before, ...): a drift over the run (the stack's growing streams, the
        # machine's load) weighs on both codes alike instead of always on the one measured second
        pairs = [["before", "current"] if i % 2 == 0 else ["current", "before"] for i in range(rounds)]
        labels = [label for pair in pairs for label in pair] if before else ["current"] * rounds
        running = "current"
        for label in labels:
            if label != running:  # the run-executor process swapped for the other code (same stack, same store)
                inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
                env = {"PYTHONPATH": os.pathsep.join([*before, *inherited] if label == "before" else inherited)}
                await asyncio.to_thread(stack.restart, "run-executor", 120.0, **env)
                running = label
            phase.label = label
            results.append((label, await phase.run(runs, sample, chunk)))
        bare = await _baseline(bus, nc, max(runs, 1000), len(template[2]), chunk)
        hop = await _bare_hop(nc, max(sample, 20), len(template[2]))
    await nc.drain()
    return results, bare, hop


def _report(label: str, f: dict[str, Any]) -> None:
    out = sys.stdout.write
    load = " ".join(f"{x:.1f}" for x in f["load"])
    out(f"[{label}] {f['runs']} runs, load average at the end {load}\n")
    out(
        f"  park       {f['park_per_s']:9.1f} runs/s   (run.requested published -> human.requested), "
        f"executor CPU {f['executor_cpu_ms_per_park']:.2f} ms/park\n"
    )
    growth = f["rss_parked_mb"] - f["rss_before_mb"]
    out(
        f"  executor   RSS {f['rss_before_mb']:.1f} MB -> {f['rss_parked_mb']:.1f} MB parked (+{growth:.1f} MB, "
        f"{growth * 1024 * 1024 / max(f['runs'], 1):.0f} B per parked run) -> {f['rss_after_mb']:.1f} MB after resuming\n"
    )
    nats_growth = f["nats_rss_parked_mb"] - f["nats_rss_before_mb"]
    out(
        f"  nats       RSS {f['nats_rss_before_mb']:.1f} MB -> {f['nats_rss_parked_mb']:.1f} MB parked "
        f"(+{nats_growth:.1f} MB); store on disk {f['store_before_mb']:.1f} MB -> {f['store_parked_mb']:.1f} MB\n"
    )
    for name in STORE_STREAMS:
        (m0, b0), (m1, b1) = f["streams_before"][name], f["streams_parked"][name]
        per_run = (b1 - b0) * 1024 * 1024 / max(f["runs"], 1)
        out(f"    {name:20s} {m0:8d} -> {m1:8d} msgs, {b0:8.1f} -> {b1:8.1f} MB ({per_run:.0f} B/run)\n")
    sent, got = f["park_msgs_per_run"]
    out(f"  bus msgs   park: executor sent {sent:.1f}, received {got:.1f} per run")
    if "resume_msgs_per_run" in f:
        sent, got = f["resume_msgs_per_run"]
        out(f"; resume to the end: sent {sent:.1f}, received {got:.1f} per run")
    out("  (nats-server /connz)\n")
    sent, got = f["collab_park_msgs_per_run"]
    out(
        f"             agent-collab (no run here collaborates): park sent {sent:.1f}, received {got:.1f}, "
        f"CPU {f['collab_cpu_ms_per_park']:.2f} ms per run"
    )
    if "collab_resume_msgs_per_run" in f:
        sent, got = f["collab_resume_msgs_per_run"]
        out(
            f"; resume to the end: sent {sent:.1f}, received {got:.1f}, CPU {f['collab_cpu_ms_per_end']:.2f} ms per run"
        )
    out("\n")
    if "resume_per_s" in f:
        out(
            f"  resume     {f['resume_per_s']:9.1f} runs/s   (human.answered published -> run.resumed), "
            f"executor CPU {f['executor_cpu_ms_per_resume']:.2f} ms/resume\n"
        )
        out(
            f"  to the end {f['lifecycle_end_per_s']:9.1f} runs/s   (human.answered published -> run.completed), "
            f"executor CPU {f['executor_cpu_ms_per_end']:.2f} ms/run\n"
        )
    if "latency_p50_ms" in f:
        out(
            f"  latency    answer -> run.resumed over {f['sample']} one at a time: p50 {f['latency_p50_ms']:.1f} ms, "
            f"p99 {f['latency_p99_ms']:.1f} ms\n"
        )
    out(f"  failed     {f['failed']} runs\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs to park per phase (the issue's figure: 100000)")
    parser.add_argument("--latency-sample", type=int, default=200, help="runs answered one at a time")
    parser.add_argument("--chunk", type=int, default=500, help="messages per pipelined publish")
    parser.add_argument(
        "--executor-inflight",
        type=int,
        default=None,
        help="the run-executor's TEMPORALITY_EXECUTOR_MAX_INFLIGHT (unset: the service's default)",
    )
    parser.add_argument(
        "--before",
        nargs="+",
        default=[],
        metavar="SRC",
        help="source folders put first on the run-executor's PYTHONPATH for a 'before' phase, measured in the "
        "same run (same stack) before the current code's: ratios current/before",
    )
    parser.add_argument("--rounds", type=int, default=1, help="phases of each code, alternated in ABBA order")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run the run-executor under cProfile (its CPU clock) during each park and bulk resume: "
        "DIR/<n>-<label>-park.prof, DIR/<n>-<label>-resume.prof",
    )
    parser.add_argument(
        "--profiler",
        choices=("cprofile", "py-spy"),
        default="cprofile",
        help="with --profile: cProfile in the process (exact counts, inflated small calls) or py-spy sampling "
        "it from outside (DIR/<n>-<label>-park.folded, ...: folded stacks)",
    )
    parser.add_argument(
        "--json-out", type=Path, help="also write the figures as a JSON record here (bench/benchrecord.py)"
    )
    args = parser.parse_args()
    recorder = Recorder(
        "parked_runs", {k: v for k, v in vars(args).items() if k not in ("json_out", "profile", "profiler")}
    )
    extra_env: dict[str, str] = {}
    if args.executor_inflight is not None:
        extra_env["TEMPORALITY_EXECUTOR_MAX_INFLIGHT"] = str(args.executor_inflight)
    sample = min(args.latency_sample, args.runs)
    configure_logging(LogSettings(level="warning", format="console"), service="bench")
    with tempfile.TemporaryDirectory(prefix="temporality-bench-") as tmp:
        PROFILE.out, PROFILE.tool = args.profile, args.profiler
        PROFILE.install(Path(tmp))
        stack = bench_stack(Path(tmp), env=extra_env)  # its /connz: the messages the run-executor sends and receives
        stack.start()
        try:
            results, bare, hop = asyncio.run(
                _measure(
                    stack, args.runs, sample, args.chunk, [str(Path(p).resolve()) for p in args.before], args.rounds
                )
            )
            durability = merge(
                Durability(jetstream=jetstream_durability(stack.nats.monitoring_url)),
                asyncio.run(database_durability(stack.database_url)),
            )
        finally:
            stack.stop()
    out = sys.stdout.write
    inflight = args.executor_inflight if args.executor_inflight is not None else "default"
    out(
        f"parked runs: {args.runs} per phase through the five processes (one nats-server, SQLite, loopback), "
        f"executor max_inflight {inflight}\n"
    )
    for label, figures in results:
        _report(label, figures)
    out(f"baseline: bare JetStream publish -> pull consume + ack, same sizes: {bare:.0f} msgs/s\n")
    bare_hop = percentiles(hop)
    out(
        f"baseline latency: bare JetStream publish -> consume, one at a time, {bare_hop.n}: "
        f"p50 {bare_hop.p50_ms:.2f} ms, p99 {bare_hop.p99_ms:.2f} ms\n"
    )
    for label, f in results:
        if "resume_per_s" in f:
            out(f"ratio resume / bare [{label}]: {f['resume_per_s'] / bare:.3f}   (goal: resume >= 1000 runs/s)\n")
    befores = [f for label, f in results if label == "before"]
    currents = [f for label, f in results if label == "current"]
    if befores and currents:

        def median(key: str, of: list[dict[str, Any]]) -> float:
            return float(statistics.median(f[key] for f in of))

        out("current / before (medians of the phases):\n")
        for key, what in (
            ("park_per_s", "park runs/s"),
            ("executor_cpu_ms_per_park", "executor CPU per park"),
            ("resume_per_s", "resume runs/s"),
            ("executor_cpu_ms_per_resume", "executor CPU per resume"),
            ("lifecycle_end_per_s", "answer -> completed runs/s"),
            ("executor_cpu_ms_per_end", "executor CPU per resumed run to its end"),
            ("latency_p50_ms", "latency p50"),
            ("latency_p99_ms", "latency p99"),
        ):
            if all(key in f for f in befores + currents):
                b, c = median(key, befores), median(key, currents)
                out(f"  {what:42s} {b:9.2f} -> {c:9.2f}   x{c / b:.2f}\n")
        for key, what in (("park_msgs_per_run", "executor msgs sent per park"), ("resume_msgs_per_run", "per resume")):
            if all(key in f for f in befores + currents):
                b = statistics.median(f[key][0] for f in befores)
                c = statistics.median(f[key][0] for f in currents)
                out(f"  {what:42s} {b:9.1f} -> {c:9.1f}   x{c / b:.2f}\n")
    phases = [
        ParkedPhase(
            label=label,
            runs=f["runs"],
            park_per_s=f["park_per_s"],
            resume_per_s=f.get("resume_per_s"),
            lifecycle_end_per_s=f.get("lifecycle_end_per_s"),
            latency=(
                Percentiles(n=f["sample"], p50_ms=f["latency_p50_ms"], p99_ms=f["latency_p99_ms"])
                if "latency_p50_ms" in f
                else None
            ),
            executor_cpu_ms_per_resume=f.get("executor_cpu_ms_per_resume"),
            rss_before_mb=f["rss_before_mb"],
            rss_parked_mb=f["rss_parked_mb"],
            rss_after_mb=f["rss_after_mb"],
            failed=f["failed"],
        )
        for label, f in results
    ]
    recorder.finish(ParkedRunsFigures(phases=phases, bare_msgs_s=bare, bare_hop=bare_hop), durability, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
