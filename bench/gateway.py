"""Benchmark: webhook throughput of the trigger-gateway under wrk, against an in-run baseline and a ceiling.

    .venv/bin/python bench/gateway.py [--duration 10] [--connections 50] [--threads 2] [--warmup 2]
                                      [--rounds 1] [--servers old runtime bare] [--show-wrk] [--profile DIR]
                                      [--before SRC ...] [--requests N] [--no-freeze [KIND ...]]

Needs ``wrk`` on the PATH (Debian/Ubuntu: ``apt-get install wrk``; ``make bench`` installs it when missing and
apt-get exists); without it the bench says so and exits 2. It starts its own nats-server
(temporality_testing.NatsServer, temp dir, random port) and three servers, each in its own subprocess on a
free 127.0.0.1 port, connected to that one nats-server:

  old      the real gateway app served the way services did before temporality_service: a plain asyncio
           loop, uvicorn's default Config with the h11 parser (what ``http="auto"`` resolved to before
           httptools was a dependency) on a ``socket.socket(AF_INET, SOCK_STREAM)`` -- proto 0, so asyncio
           never sets TCP_NODELAY on accepted connections. The baseline measured in the same run.
  runtime  the same app served by ``temporality_service.HttpServer`` (IPPROTO_TCP socket -> TCP_NODELAY,
           httptools) on uvloop (``temporality_service.runtime.run``): what the service runs now.
  bare     a bare FastAPI endpoint awaiting one JetStream publish of the body, served like ``runtime``:
           the ceiling (per new event the gateway awaits 2 JetStream round trips -- the dedupe claim;
           trigger.received + trigger.accepted + run.requested -- and writes 3 more messages behind its
           answer, batched with other launches': the claim marked published, the delivery's accepted
           record and its index entry -- 7 messages, 4 awaited; the bare endpoint 1 and 1).

All three are started up front (an idle one costs nothing). Each is warmed up once with a short wrk run,
then measured for ``--duration`` seconds of keep-alive POSTs with ``bench/wrk_webhook.lua``, servers
interleaved over ``--rounds`` rounds (the best round per server is shown). Every request is a new Azure
DevOps event (the example payload with a unique top-level ``id``, Basic auth), so every gateway request
starts a new run. The table gives requests/s, p50/p99 latency, the count of 202 / other 2xx / non-2xx
responses and wrk socket errors, CPU per request of the server and of nats-server, the messages nats-server
received per request (its monitoring ``/varz`` ``in_msgs``: publishes and KV writes), wrk's own CPU and what
the rest of the machine used meanwhile (/proc/stat); then the ratios runtime/old and runtime/bare.

wrk, the servers and nats-server share this machine's cores (and so does anything else running): read
ratios within one run, not absolute capacity; CPU per request is the figure least disturbed by other
load, and a high "other cores" says to rerun. Loopback only; every wrk run is bounded by ``--duration``,
the whole bench by ``--timeout``. Nothing asserts on speed; the exit code is 1 when a server answered
anything but 202 or wrk saw socket errors (the load was not what it claims to be).

``--before SRC ...``: a fourth server, ``before``, served like ``runtime`` with these source folders first on
its PYTHONPATH (e.g. ``git archive <commit> services/trigger-gateway/src libs/protocol/src | tar -x -C /tmp/old``
then ``--before /tmp/old/services/trigger-gateway/src /tmp/old/libs/protocol/src``: every package the change
touched): the code before a change, measured interleaved with the code after it in the same run, and the
ratio ``runtime/before``.

``--requests N``: a fixed amount of work instead of ``--duration``: each wrk thread stops after its share of N
answers (wrk is interrupted as soon as all have) and the server's CPU, read after the writes behind the last
answers, is divided by the requests wrk sent -- the CPU-per-request figure to compare code before and after a
change (with ``--rounds``: each round's, their medians, and the ratio of the medians).

Every server ends its start-up with ``gc.collect(); gc.freeze()``, as every service's process does after its
setup (the runtime's ``freeze_heap``); ``--no-freeze KIND ...`` serves those without it (no name: all).

``--profile DIR``: each server runs under cProfile (on its CPU clock) for the whole run and writes ``DIR/<kind>.prof``; the
bench prints the top functions of each by own time (profiled figures are not comparable with unprofiled ones).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import os
import pstats
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from benchrecord import Durability, GatewayFigures, GatewayServer, Recorder, jetstream_durability
from fastapi import FastAPI, Request, Response

from temporality_bus import Bus, NatsSettings
from temporality_protocol import new_id
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS
from temporality_service import HttpServer, LogSettings, configure_logging, stop_on_signals
from temporality_service.runtime import run as run_on_uvloop
from temporality_testing import NatsServer
from temporality_trigger_gateway import Settings, create_app, load_triggers

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples/azure-devops/git.pullrequest.created.json"
LUA = Path(__file__).resolve().with_name("wrk_webhook.lua")
TRIGGER = "ado-pr-review"
USER, PASSWORD, PASSWORD_ENV = "azure", "bench-password", "TEMPORALITY_BENCH_WEBHOOK_PASSWORD"
TRIGGERS = f"""
triggers:
  - id: {TRIGGER}
    name: Benchmark
    type: webhook
    adapter: azure_devops.pull_request
    events: [git.pullrequest.created]
    agent: reviewer
    auth: {{type: basic, username: {USER}, password_env: {PASSWORD_ENV}}}
    human: {{allowed_recipients: ["user:alice"]}}
"""
KINDS = ("old", "runtime", "bare", "before")
#: How long a server may take to start (importing the app is slow on a loaded machine: 30 s was not enough at load 10).
_START_S = 120.0


# --------------------------------------------------------------------------- child: one server
def _bare_app(bus: Bus) -> FastAPI:
    app = FastAPI()

    @app.post("/hooks/{trigger_id}")
    async def bare(trigger_id: str, request: Request) -> Response:
        body = await request.body()
        await bus.publish_raw("temporality.events.bench.bare", body, {"Nats-Msg-Id": new_id("bench")})
        return Response(b'{"status":"accepted"}', status_code=202, media_type="application/json")

    return app


def _announce(port_file: Path, port: int) -> None:
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(port))
    tmp.replace(port_file)


async def _serve_runtime(app: FastAPI, port_file: Path) -> None:
    """What ``run_service`` does with a service's app: HttpServer, stopped by SIGTERM via ``should_exit``."""
    stop = stop_on_signals()
    server = HttpServer(app, host="127.0.0.1", port=0)
    serving = asyncio.create_task(server.run_until_exit())
    listening = asyncio.create_task(server.listening.wait())
    await asyncio.wait({serving, listening}, return_when=asyncio.FIRST_COMPLETED)
    listening.cancel()
    if serving.done():
        await serving  # raises: the server could not start
    _announce(port_file, server.port)
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    server.should_exit = True
    await serving


async def _serve_old(app: FastAPI, port_file: Path) -> None:
    """The pre-runtime way: proto-0 socket (no TCP_NODELAY), h11, uvicorn's own SIGTERM handling."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    _announce(port_file, sock.getsockname()[1])  # listening: connections queue until uvicorn accepts
    server = uvicorn.Server(uvicorn.Config(app, http="h11", log_config=None, access_log=False, lifespan="off"))
    await server.serve(sockets=[sock])


async def _serve(
    kind: str, nats_url: str, triggers_file: Path, port_file: Path, profile: Path | None, freeze: bool = True
) -> int:
    configure_logging(LogSettings(level="warning", format="console"), service=f"bench-{kind}")
    nats = NatsSettings(url=nats_url)
    async with Bus.connect(nats, name=f"bench-{kind}") as bus:
        await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
        if kind == "bare":
            app = _bare_app(bus)
        else:
            app = create_app(Settings(nats=nats), bus, load_triggers(triggers_file))
        if freeze:  # what a service's setup ends with (the gateway's, the journal's): its start out of the GC's way
            gc.collect()
            gc.freeze()
        # CPU time, not wall time: on a loaded machine a function preempted by another process is not billed
        profiler = cProfile.Profile(time.process_time) if profile is not None else None
        if profiler is not None:
            profiler.enable()  # the whole serving time: warm-up and every round (deterministic: ~2x slower)
        try:
            if kind == "old":
                await _serve_old(app, port_file)
            else:
                await _serve_runtime(app, port_file)
        finally:
            if profiler is not None and profile is not None:
                profiler.disable()
                profiler.dump_stats(profile)
    return 0


# --------------------------------------------------------------------------- parent: servers
def _start(
    kind: str,
    nats_url: str,
    triggers_file: Path,
    workdir: Path,
    profile: Path | None = None,
    before: list[Path] | None = None,
    freeze: bool = True,
) -> tuple[subprocess.Popen[bytes], int]:
    port_file = workdir / f"{kind}.port"
    cmd = [sys.executable, __file__, "--serve", kind, "--nats", nats_url, "--triggers", str(triggers_file)]
    if not freeze:
        cmd.append("--no-freeze")
    if profile is not None:
        cmd += ["--profile", str(profile)]
    env = {**os.environ, PASSWORD_ENV: PASSWORD}
    if kind == "before" and before is not None:  # another version of the code, found first on the path
        env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in before), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen([*cmd, "--port-file", str(port_file)], stdin=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + _START_S
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"the {kind} server exited with {proc.returncode}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise TimeoutError(f"the {kind} server did not start within {_START_S:g} s")
        time.sleep(0.02)
    return proc, int(port_file.read_text())


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux /proc); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float | None:
    """CPU seconds all cores spent busy since boot (Linux /proc/stat: all but idle and iowait)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    """CPU seconds of the reaped children: the finished wrk runs (servers are reaped only at the end)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


# --------------------------------------------------------------------------- parent: load
@dataclass
class Result:
    name: str
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    statuses: dict[int, int]
    socket_errors: int
    server_cpu_ms: float | None  # per completed request
    nats_cpu_ms: float | None  # per completed request
    wrk_cores: float  # wrk's CPU seconds per second of load
    other_cores: float | None  # everything else busy on the machine meanwhile, in cores
    publishes: float | None = None  # messages nats-server received per completed request (its /varz in_msgs)

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def accepted(self) -> int:
        return self.statuses.get(202, 0)

    @property
    def other_2xx(self) -> int:
        return sum(n for s, n in self.statuses.items() if 200 <= s < 300 and s != 202)

    @property
    def non_2xx(self) -> int:
        return sum(n for s, n in self.statuses.items() if not 200 <= s < 300)


def _wrk(port: int, seconds: float, args: argparse.Namespace, requests: int | None = None) -> dict[str, Any]:
    """One bounded wrk run; the parsed ``webhook-bench`` line printed by the Lua script's done().

    ``requests``: each wrk thread stops after its share of them (answered), and wrk is interrupted once every
    thread has (``seconds`` is then only the bound)."""
    duration = max(1, round(seconds))
    cmd = [
        args.wrk,
        f"-t{args.threads}",
        f"-c{args.connections}",
        f"-d{duration}s",
        "--timeout",
        "5s",
        "--latency",
        "-s",
        str(LUA),
        f"http://127.0.0.1:{port}/hooks/{TRIGGER}",
        "--",
        str(EXAMPLE),
        f"{USER}:{PASSWORD}",
        uuid.uuid4().hex[:12],  # a prefix per run: ids stay unique across runs and servers
    ]
    if requests is None:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 30, cwd=REPO, check=False)
    else:
        done = _wrk_counted(cmd, -(-requests // args.threads), args.threads, duration + 30)
    if args.show_wrk:
        sys.stdout.write(done.stdout)
    for line in done.stdout.splitlines():
        if line.startswith("webhook-bench "):
            return dict(json.loads(line.removeprefix("webhook-bench ")))
    raise RuntimeError(f"wrk exited with {done.returncode} without a result line:\n{done.stdout}{done.stderr}")


def _wrk_counted(cmd: list[str], per_thread: int, threads: int, timeout: float) -> subprocess.CompletedProcess[str]:
    """wrk with each thread stopping after ``per_thread`` responses, interrupted (SIGINT: it still reports)
    as soon as every thread has stopped."""
    with tempfile.TemporaryDirectory(prefix="temporality-wrk-") as tmp:
        marks = Path(tmp) / "done-"
        proc = subprocess.Popen(
            [*cmd, str(per_thread), str(marks)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if all(Path(f"{marks}{n}").exists() for n in range(1, threads + 1)):
                proc.send_signal(signal.SIGINT)
                break
            time.sleep(0.005)
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _in_msgs(monitoring_url: str) -> int | None:
    """How many messages nats-server has received from clients (``/varz`` ``in_msgs``): every publish, KV
    write and JetStream API request; the acknowledgements it sends are not counted."""
    if not monitoring_url:
        return None
    try:
        with urllib.request.urlopen(f"{monitoring_url}/varz", timeout=5) as response:
            return int(json.loads(response.read())["in_msgs"])
    except (OSError, ValueError, KeyError):
        return None


def _measure(
    name: str, server_pid: int, port: int, nats_pid: int, args: argparse.Namespace, monitoring_url: str = ""
) -> Result:
    msgs_0 = _in_msgs(monitoring_url)
    server_0, nats_0, wrk_0, busy_0, wall_0 = (
        _cpu_s(server_pid),
        _cpu_s(nats_pid),
        _children_cpu_s(),
        _machine_busy_s(),
        time.monotonic(),
    )
    counted = args.requests is not None
    out = _wrk(port, args.duration if not counted else max(args.duration, 300), args, args.requests)
    server_1, nats_1, wrk_1, busy_1, wall_1 = (
        _cpu_s(server_pid),
        _cpu_s(nats_pid),
        _children_cpu_s(),
        _machine_busy_s(),
        time.monotonic(),
    )
    requests, wall, wrk_s = int(out["requests"]), wall_1 - wall_0, wrk_1 - wrk_0
    time.sleep(0.5)  # the writes a server makes behind its answers (the gateway's write-behind round) land
    msgs_1 = _in_msgs(monitoring_url)
    if counted:  # the CPU of a fixed amount of work: every request sent (the abandoned ones served too) and
        # what follows their answers, so the count divided by does not depend on the server's speed
        server_1, nats_1 = _cpu_s(server_pid), _cpu_s(nats_pid)
    work = int(out.get("sent", requests)) if counted else requests  # what the CPU figures are divided by
    published = _delta(msgs_0, msgs_1)
    server_s, nats_s, busy_s = _delta(server_0, server_1), _delta(nats_0, nats_1), _delta(busy_0, busy_1)
    other_cores = None
    if server_s is not None and nats_s is not None and busy_s is not None:
        other_cores = max(0.0, (busy_s - server_s - nats_s - wrk_s) / wall)
    errors = out["errors"]
    return Result(
        name=name,
        requests=requests,
        seconds=out["duration_us"] / 1e6,
        p50_ms=out["latency_us"]["p50"] / 1000,
        p99_ms=out["latency_us"]["p99"] / 1000,
        statuses={int(s): int(n) for s, n in out["statuses"].items()},
        socket_errors=sum(int(errors[k]) for k in ("connect", "read", "write", "timeout")),
        server_cpu_ms=None if server_s is None or not work else server_s * 1000 / work,
        nats_cpu_ms=None if nats_s is None or not work else nats_s * 1000 / work,
        wrk_cores=wrk_s / wall,
        other_cores=other_cores,
        publishes=None if published is None or not work else published / work,
    )


def _fmt(value: float | None, width: int) -> str:
    return f"{'-' if value is None else f'{value:.2f}':>{width}}"


def _report(best: dict[str, Result], runs: dict[str, list[Result]]) -> None:
    head = (
        f"{'server':<8} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'202':>7} {'2xx!202':>7} {'non-2xx':>7}"
        f" {'sockerr':>7} {'srv ms/req':>10} {'nats ms/req':>11} {'msgs/req':>8} {'wrk cores':>9} {'other cores':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in best.values():
        lines.append(
            f"{r.name:<8} {r.rate:8.1f} {r.p50_ms:7.2f} {r.p99_ms:7.2f} {r.accepted:7d} {r.other_2xx:7d}"
            f" {r.non_2xx:7d} {r.socket_errors:7d} {_fmt(r.server_cpu_ms, 10)} {_fmt(r.nats_cpu_ms, 11)}"
            f" {_fmt(r.publishes, 8)} {_fmt(r.wrk_cores, 9)} {_fmt(r.other_cores, 11)}"
        )
    if any(len(rs) > 1 for rs in runs.values()):
        each = "; ".join(f"{name} " + " / ".join(f"{r.rate:.0f}" for r in rs) for name, rs in runs.items())
        lines.append(f"(best of {max(len(rs) for rs in runs.values())} rounds shown; req/s of each round: {each})")
        cpu = "; ".join(
            f"{name} " + " / ".join("-" if r.server_cpu_ms is None else f"{r.server_cpu_ms:.2f}" for r in rs)
            for name, rs in runs.items()
        )
        lines.append(f"(server CPU ms per request of each round: {cpu})")
        medians = {
            name: statistics.median(c for r in rs if (c := r.server_cpu_ms) is not None)
            for name, rs in runs.items()
            if any(r.server_cpu_ms is not None for r in rs)
        }
        lines.append(
            "(median server CPU ms per request: " + "; ".join(f"{n} {m:.3f}" for n, m in medians.items()) + ")"
        )
        if "runtime" in medians:
            for other in ("old", "before", "bare"):
                if medians.get(other):
                    lines.append(
                        f"ratio runtime/{other:<6} median server CPU per request {medians['runtime'] / medians[other]:.3f}x"
                    )
    runtime = best.get("runtime")
    for other in ("old", "before", "bare"):
        base = best.get(other)
        if runtime and base and base.rate:
            cpu = ""
            if runtime.server_cpu_ms and base.server_cpu_ms:
                cpu = f", server CPU per request {runtime.server_cpu_ms / base.server_cpu_ms:.2f}x"
            lines.append(f"ratio runtime/{other:<6} throughput {runtime.rate / base.rate:.2f}x{cpu}")
    lines.append(
        "(202 = a new run accepted; 2xx!202 would be duplicates; sockerr = wrk connect/read/write/timeout errors;"
        " srv/nats ms/req = CPU of the server process / nats-server per completed request; msgs/req = messages"
        " nats-server received per request (publishes, KV writes; acks not counted); wrk cores = the load"
        " generator's own CPU; other cores = the rest of the machine meanwhile: when it is high, rerun)"
    )
    sys.stdout.write("\n".join(lines) + "\n")


def _profile_report(folder: Path, kinds: list[str], top: int = 25) -> None:
    """The functions that took the most time of their own in each profiled server (the .prof files stay)."""
    for kind in kinds:
        path = folder / f"{kind}.prof"
        if not path.exists():
            continue
        out = io.StringIO()
        stats = pstats.Stats(str(path), stream=out)
        stats.sort_stats("tottime").print_stats(top)
        sys.stdout.write(f"\n--- profile of {kind} ({path}; sorted by own time; cProfile slows it ~2x) ---\n")
        sys.stdout.write(out.getvalue().split("\n\n", 1)[-1])


def _bench(args: argparse.Namespace) -> int:
    recorder = Recorder("gateway", _settings(args))
    cores = os.cpu_count() or 1
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    sys.stdout.write(
        f"wrk -t{args.threads} -c{args.connections}, {args.duration:g} s per server and round"
        f" ({args.rounds} round(s), servers interleaved, {args.warmup:g} s warm-up each first);"
        " every request a new Azure DevOps event\n"
        f"note: wrk, the server and nats-server share this machine's {cores} core(s) (load average {load}):"
        " read the ratios, not the absolute figures\n"
    )
    with tempfile.TemporaryDirectory(prefix="temporality-bench-") as tmp:
        workdir = Path(tmp)
        triggers_file = workdir / "triggers.yaml"
        triggers_file.write_text(TRIGGERS)
        nats = NatsServer(workdir / "nats", monitoring=True)  # /varz: the messages per request
        nats.start()
        assert nats.proc is not None
        nats_pid = nats.proc.pid
        servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        runs: dict[str, list[Result]] = {kind: [] for kind in args.servers}
        durability = Durability(jetstream=jetstream_durability(nats.monitoring_url))
        try:
            for kind in args.servers:  # idle while another is measured: an idle server costs nothing
                profile = args.profile / f"{kind}.prof" if args.profile is not None else None
                freeze = args.no_freeze is None or (bool(args.no_freeze) and kind not in args.no_freeze)
                servers[kind] = _start(kind, nats.url, triggers_file, workdir, profile, args.before, freeze)
            for round_ in range(args.rounds):
                for kind, (proc, port) in servers.items():
                    if round_ == 0 and args.warmup > 0:
                        _wrk(port, args.warmup, args)  # connections, caches, the first run of every code path
                    runs[kind].append(_measure(kind, proc.pid, port, nats_pid, args, nats.monitoring_url))
        finally:
            for proc, _ in servers.values():
                _stop(proc)
            nats.stop()
    best = {kind: max(rs, key=lambda r: r.rate) for kind, rs in runs.items()}
    _report(best, runs)
    figures = GatewayFigures(
        connections=args.connections,
        duration_s=args.duration,
        rounds=args.rounds,
        servers=[
            GatewayServer(
                name=r.name,
                req_s=r.rate,
                p50_ms=r.p50_ms,
                p99_ms=r.p99_ms,
                requests=r.requests,
                accepted=r.accepted,
                non_2xx=r.non_2xx,
                socket_errors=r.socket_errors,
                server_cpu_ms=r.server_cpu_ms,
                nats_cpu_ms=r.nats_cpu_ms,
                msgs_per_req=r.publishes,
                other_cores=r.other_cores,
            )
            for r in best.values()
        ],
    )
    recorder.finish(figures, durability, args.json_out)
    if args.profile is not None:
        _profile_report(args.profile, args.servers)
    refused = {
        r.name: {**r.statuses, "socket errors": r.socket_errors}
        for rs in runs.values()
        for r in rs
        if r.accepted != r.requests or r.socket_errors
    }
    if refused:
        sys.stderr.write(f"not every request was accepted with 202: {refused}\n")
        return 1
    return 0


def _settings(args: argparse.Namespace) -> dict[str, object]:
    keys = (
        "duration",
        "requests",
        "no_freeze",
        "warmup",
        "connections",
        "threads",
        "rounds",
        "servers",
        "before",
        "profile",
    )
    return {key: getattr(args, key) for key in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=10, help="seconds of load per server (default 10)")
    parser.add_argument("--warmup", type=float, default=2, help="seconds of warm-up per server, 0 for none (default 2)")
    parser.add_argument(
        "--connections", type=int, default=50, help="wrk keep-alive connections (default 50, as the intake goal states)"
    )
    parser.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    parser.add_argument(
        "--requests",
        type=int,
        help="instead of --duration, send this many requests per server and round (split over the wrk threads)"
        " and divide the server's CPU over the run and the settling after it by them: a fixed amount of work,"
        " the CPU-per-request figure to compare code before and after a change (with --rounds, medians)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="measure each server this often, best shown (default 1)")
    parser.add_argument(
        "--servers",
        nargs="+",
        choices=KINDS,
        default=["old", "runtime", "bare"],
        help="which servers, in order (default: old runtime bare; 'before' with --before)",
    )
    parser.add_argument("--show-wrk", action="store_true", help="print wrk's own output too")
    parser.add_argument(
        "--profile",
        type=Path,
        help="run each server under cProfile, write <kind>.prof to this folder and print the top functions"
        " (the figures are then not comparable with unprofiled runs)",
    )
    parser.add_argument(
        "--before",
        type=Path,
        nargs="+",
        help="serve a 'before' server too (as runtime is served) with these source folders first on its"
        " PYTHONPATH, e.g. an older services/trigger-gateway/src exported with git archive: old and new code"
        " measured interleaved in one run",
    )
    parser.add_argument(
        "--json-out", type=Path, help="also write the figures as a JSON record here (bench/benchrecord.py)"
    )
    parser.add_argument("--timeout", type=float, default=600, help="give up after this many seconds (default 600)")
    parser.add_argument(
        "--no-freeze",
        nargs="*",
        choices=KINDS,
        help="serve these (no name: all) without gc.freeze() after their setup (every server is frozen by default,"
        " as the gateway service's setup ends; e.g. --before <this code> --no-freeze before measures the freeze)",
    )
    parser.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--nats", help=argparse.SUPPRESS)
    parser.add_argument("--triggers", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        freeze = args.no_freeze is None
        serving = _serve(args.serve, args.nats, args.triggers, args.port_file, args.profile, freeze)
        sys.exit(asyncio.run(serving) if args.serve == "old" else run_on_uvloop(serving))
    if args.profile is not None:
        args.profile = args.profile.resolve()
        args.profile.mkdir(parents=True, exist_ok=True)
    if args.duration < 1 or args.warmup < 0 or args.rounds < 1 or not 1 <= args.threads <= args.connections:
        parser.error("--duration >= 1, --warmup >= 0, --rounds >= 1 and 1 <= --threads <= --connections")
    if args.requests is not None and args.requests < args.connections:
        parser.error("--requests must be at least --connections")
    args.servers = list(dict.fromkeys(args.servers))
    if args.before is not None:
        args.before = [p.resolve() for p in args.before]
        if "before" not in args.servers:
            args.servers.insert(args.servers.index("runtime") if "runtime" in args.servers else 0, "before")
    elif "before" in args.servers:
        parser.error("the 'before' server needs --before SRC")
    args.wrk = shutil.which("wrk")
    if args.wrk is None:
        sys.stderr.write("bench/gateway.py needs wrk, an HTTP load generator: apt-get install wrk (Debian/Ubuntu)\n")
        sys.exit(2)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"the bench did not finish within --timeout {args.timeout:g} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, args.timeout)
    try:
        code = _bench(args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    sys.exit(code)


if __name__ == "__main__":
    main()
