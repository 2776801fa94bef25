"""Benchmark: the real trigger-gateway against a bare FastAPI endpoint doing one JetStream publish.

    .venv/bin/python bench/gateway.py [--requests 2000] [--concurrency 32]

Starts its own nats-server (temporality_testing.NatsServer, temp dir, random port) and serves

  (a) the real gateway app (auth, JSON, normalization, received/accepted/run.requested, dedupe KV),
  (b) a bare FastAPI endpoint that awaits one JetStream publish of the body,

each with uvicorn in its own subprocess on a free 127.0.0.1 port. It then fires the same number of
webhook POSTs (unique Azure DevOps event ids, so every gateway request starts a new run) at a bounded
concurrency with httpx, prints requests/s for both and their ratio, and stops everything. Loopback
only; bounded by ``--timeout``. The load generator is Python too: read the numbers as a ratio on one
machine, not as absolute capacity. Nothing asserts on speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response

from temporality_bus import Bus, LogSettings, NatsSettings, configure_logging
from temporality_protocol import new_id
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS
from temporality_testing import NatsServer
from temporality_trigger_gateway import Settings, create_app, load_triggers

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples/azure-devops/git.pullrequest.created.json"
USER, PASSWORD = "azure", "bench-password"
TRIGGERS = f"""
triggers:
  - id: ado-pr-review
    name: Benchmark
    type: webhook
    adapter: azure_devops.pull_request
    events: [git.pullrequest.created]
    agent: reviewer
    auth: {{type: basic, username: {USER}, password: {PASSWORD}}}
    human: {{allowed_recipients: ["user:alice"]}}
"""


# --------------------------------------------------------------------------- child: one server
async def _serve(kind: str, nats_url: str, triggers_file: Path, port_file: Path) -> None:
    configure_logging(LogSettings(level="warning", format="console"), service=f"bench-{kind}")
    nats = NatsSettings(url=nats_url)
    async with Bus.connect(nats, name=f"bench-{kind}") as bus:
        await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
        if kind == "gateway":
            app = create_app(Settings(nats=nats), bus, load_triggers(triggers_file))
        else:
            app = FastAPI()

            @app.post("/hooks/{trigger_id}")
            async def bare(trigger_id: str, request: Request) -> Response:
                body = await request.body()
                await bus.publish_raw("temporality.events.bench.bare", body, {"Nats-Msg-Id": new_id("bench")})
                return Response(b'{"status":"accepted"}', status_code=202, media_type="application/json")

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(sock.getsockname()[1]))
        tmp.replace(port_file)
        server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off"))
        await server.serve(sockets=[sock])  # uvicorn stops on SIGTERM


# --------------------------------------------------------------------------- parent: load
def _start(kind: str, nats_url: str, triggers_file: Path, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port_file = workdir / f"{kind}.port"
    cmd = [sys.executable, __file__, "--serve", kind, "--nats", nats_url, "--triggers", str(triggers_file)]
    proc = subprocess.Popen([*cmd, "--port-file", str(port_file)], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {proc.returncode}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"{kind} server did not start within 30 s")
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


async def _fire(port: int, requests: int, concurrency: int, template: dict[str, Any]) -> tuple[float, dict[int, int]]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    statuses: dict[int, int] = {}
    queue: asyncio.Queue[None] = asyncio.Queue()
    for _ in range(requests):
        queue.put_nowait(None)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=30, auth=(USER, PASSWORD)
    ) as client:

        async def worker() -> None:
            while True:
                try:
                    queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                body = json.dumps({**template, "id": str(uuid.uuid4())}).encode()
                response = await client.post(
                    "/hooks/ado-pr-review", content=body, headers={"Content-Type": "application/json"}
                )
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started, statuses


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux /proc); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(
    name: str, proc: subprocess.Popen[bytes], port: int, args: argparse.Namespace, template: dict[str, Any]
) -> tuple[float, float | None]:
    await _fire(port, min(200, args.requests), args.concurrency, template)  # warm-up: connections, caches
    cpu_before = _cpu_s(proc.pid)
    elapsed, statuses = await _fire(port, args.requests, args.concurrency, template)
    cpu_after = _cpu_s(proc.pid)
    rate = args.requests / elapsed
    cpu_ms = None if cpu_before is None or cpu_after is None else (cpu_after - cpu_before) * 1000 / args.requests
    cpu = "" if cpu_ms is None else f"  server CPU {cpu_ms:5.2f} ms/request"
    sys.stdout.write(f"{name:<8} {args.requests} requests in {elapsed:6.2f} s = {rate:8.1f} req/s{cpu}  {statuses}\n")
    ok = statuses.get(202, 0)
    if ok != args.requests:
        raise RuntimeError(f"{name}: {args.requests - ok} request(s) were not accepted: {statuses}")
    return rate, cpu_ms


async def _bench(args: argparse.Namespace) -> None:
    template = json.loads(EXAMPLE.read_bytes().decode("utf-8-sig"))
    with tempfile.TemporaryDirectory(prefix="temporality-bench-") as tmp:
        workdir = Path(tmp)
        triggers_file = workdir / "triggers.yaml"
        triggers_file.write_text(TRIGGERS)
        nats = NatsServer(workdir / "nats")
        nats.start()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            gateway, gateway_port = _start("gateway", nats.url, triggers_file, workdir)
            procs.append(gateway)
            bare, bare_port = _start("bare", nats.url, triggers_file, workdir)
            procs.append(bare)
            sys.stdout.write(
                f"nats {nats.url}; {args.requests} POSTs each at concurrency {args.concurrency}, after a warm-up\n"
            )
            gateway_rate, gateway_cpu = await _measure("gateway", gateway, gateway_port, args, template)
            bare_rate, bare_cpu = await _measure("bare", bare, bare_port, args, template)
            sys.stdout.write(f"ratio    gateway/bare throughput = {gateway_rate / bare_rate:.2f}")
            if gateway_cpu and bare_cpu:
                sys.stdout.write(f", server CPU per request = {gateway_cpu / bare_cpu:.2f}x")
            sys.stdout.write(
                "\n(per new event the gateway awaits 4 JetStream round trips -- trigger.received together with the"
                " dedupe read, trigger.accepted, run.requested, the dedupe write -- the bare endpoint 1;"
                " when both rates are close, the Python load generator is the bottleneck)\n"
            )
        finally:
            for proc in procs:
                _stop(proc)
            nats.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000, help="POSTs per server (default 2000)")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight (default 32)")
    parser.add_argument("--timeout", type=float, default=600, help="give up after this many seconds (default 600)")
    parser.add_argument("--serve", choices=["gateway", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--nats", help=argparse.SUPPRESS)
    parser.add_argument("--triggers", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve, args.nats, args.triggers, args.port_file))
        return
    if args.requests < 1 or args.concurrency < 1:
        parser.error("--requests and --concurrency must be positive")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")

    async def bounded() -> None:
        await asyncio.wait_for(_bench(args), args.timeout)

    asyncio.run(bounded())


if __name__ == "__main__":
    main()
