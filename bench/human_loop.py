"""human-interaction's CPU per loop, the service alone: one question to the web inbox, one answer, the run's end.

Run: ``.venv/bin/python bench/human_loop.py [--loops 300] [--concurrency 20] [--rounds 3] [--before SRC]``

``bench/vs_temporal.py`` prints each process's CPU per loop of the whole stack; on a shared 2-core machine the
five services, nats-server and the bench compete, and one service's figure moves by a millisecond or two
from one run to the next. Here only nats-server and the human-interaction process run (started from the
checkout's venv as ``temporality up`` starts it, the shipped ``config/users.yaml``), and this process plays
the others, as vs_temporal's loop has them:

1. the trigger-gateway's ``run.requested`` (the run's policy: alice may be asked);
2. the run-executor's ``human.requested`` for alice (the shipped web-inbox profile), then waits for
   ``human.notified`` on the bus;
3. alice's answer through the inbox API (``POST /requests/{id}/answer``, her bearer token), then waits for
   ``human.answered``;
4. the run-executor's ``run.completed`` (the service cancels what is still pending of the run).

The figure is the service process's CPU (user + system, ``/proc``) over ``--loops`` loops after
``--warmup``, until its consumers have settled every message; its ``human-interaction-requests`` retries
(``handler.retry`` in its log) are counted too. ``--before SRC``: another checkout (``git worktree add
/tmp/before main`` and ``make sync`` there) measured in alternating rounds, each on a fresh nats-server;
medians over ``--rounds``; SRC may also be a copy of only some packages' sources, run with this checkout's venv
(``git archive main services/human-interaction/src libs/bus/src | tar -x -C /tmp/hbefore``, then ``--before
/tmp/hbefore``: the rest -- protocol, config/users.yaml -- is this checkout's). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from nats import connect as nats_connect
from nats.aio.msg import Msg

from temporality_bus import Bus, NatsSettings, written_out
from temporality_embedded import free_port
from temporality_embedded.natsserver import NatsServer
from temporality_protocol import (
    HumanOption,
    HumanPolicy,
    HumanRequested,
    LaunchSource,
    RunCompleted,
    RunRequested,
    make_event,
    new_id,
)
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS, CONSUMERS
from temporality_service import LogSettings, configure_logging
from temporality_testing.kv_reads import kv_read_key

ROOT = Path(__file__).resolve().parents[1]
ALICE = {"Authorization": "Bearer alice-demo-inbox-token-change-me"}
CLK_TCK = os.sysconf("SC_CLK_TCK")
OPTIONS = [HumanOption(id="keep-v1", label="Keep v1"), HumanOption(id="ship-v2", label="Ship v2")]
SETTLED = ("human-interaction-requests", "human-interaction-policies", "human-interaction-runs")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


#: The packages a source-only copy (``--before`` without a ``.venv``) may hold, put ahead of this checkout's.
_SOURCE_DIRS = ("services/human-interaction/src", "libs/bus/src", "libs/protocol/src", "libs/service/src")


def interpreter(src: Path) -> tuple[Path, dict[str, str]]:
    """The Python that runs checkout ``src`` and the environment it needs: the checkout's own ``.venv``, or, for a
    copy of only some packages' sources (``git archive main services/human-interaction/src libs/bus/src | tar -x
    -C /tmp/hbefore``), this checkout's ``.venv`` with those sources first on ``PYTHONPATH`` (ahead of the
    editable installs, which come from ``.pth`` files)."""
    if (src / ".venv" / "bin" / "python").exists():
        return src / ".venv" / "bin" / "python", {}
    dirs = [str(src / d) for d in _SOURCE_DIRS if (src / d).is_dir()]
    if not dirs:
        raise SystemExit(f"{src} has neither a .venv nor any of {', '.join(_SOURCE_DIRS)}")
    return ROOT / ".venv" / "bin" / "python", {"PYTHONPATH": os.pathsep.join(dirs)}


class Service:
    """The human-interaction process of checkout ``src`` against ``nats_url``, as ``temporality up`` runs it."""

    def __init__(self, src: Path, nats_url: str, work: Path) -> None:
        self.src = src
        self.work = work
        self.port = free_port()
        self.ready = work / "human-interaction.ready"
        self.log = work / "human-interaction.log"
        python, extra = interpreter(src)
        users = src / "config" / "users.yaml"
        env = {
            "PATH": os.environ.get("PATH", ""),
            **extra,
            "TEMPORALITY_NATS_URL": nats_url,
            "TEMPORALITY_HUMAN_HOST": "127.0.0.1",
            "TEMPORALITY_HUMAN_PORT": str(self.port),
            "TEMPORALITY_HUMAN_USERS_FILE": str(users if users.exists() else ROOT / "config" / "users.yaml"),
            "TEMPORALITY_API_TOKENS_FILE": str(work / "api-tokens.json"),
            "TEMPORALITY_LOG_LEVEL": "warning",
            "TEMPORALITY_LOG_FORMAT": "json",
            "TEMPORALITY_READY_FILE": str(self.ready),
        }
        (work / "api-tokens.json").write_text("[]", encoding="utf-8")
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(python), "-m", "temporality_human_interaction"],
                env=env,
                cwd=work,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"human-interaction did not start:\n{self.log.read_text()[-3000:]}")
            await asyncio.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def retries(self) -> int:
        return sum(1 for line in self.log.read_text(errors="replace").splitlines() if '"handler.retry"' in line)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


#: The bench's own publishes (the events it plays the other services with): not the service's requests.
_OWN_EVENTS = frozenset(f"temporality.events.{kind}" for kind in ("run.requested", "human.requested", "run.completed"))


def wire_class(msg: Msg) -> str | None:
    """What a message seen by a ``>`` subscriber is, as the service's requests go: ``kv read <bucket> <key kind>``,
    ``kv write ...`` (a put, create or compare-and-set; ``kv purge`` a delete), ``event <type>``, ``timer``,
    ``stream info``, ``consumer api`` ...; None for what is no request of the service (replies, deliveries to
    its consumers and KV watches -- their reply is ``$JS.ACK...`` --, acks, pull requests, the bench's own
    publishes and its settle polls)."""
    subject, reply = msg.subject, msg.reply or ""
    if not reply or reply.startswith("$JS.ACK.") or subject.startswith("_INBOX."):
        return None  # acks, replies, and deliveries (a JetStream delivery carries the stored subject)
    if subject.startswith("$KV."):
        _, bucket, key = subject.split(".", 2)
        op = "purge" if msg.headers and msg.headers.get("KV-Operation") in ("PURGE", "DEL") else "write"
        return f"kv {op} {bucket} {_key_kind(bucket, key)}"
    if subject.startswith(("$JS.API.STREAM.MSG.GET.KV_", "$JS.API.DIRECT.GET.KV_")):
        # a direct get names the bucket and the key in its subject (one-copy buckets: ``Store``); a message get in a
        # ``last_by_subj`` body
        if subject.startswith("$JS.API.DIRECT.GET.KV_"):
            bucket = subject.removeprefix("$JS.API.DIRECT.GET.KV_").split(".", 1)[0]
        else:
            bucket = subject.rsplit(".", 1)[1].removeprefix("KV_")
        key = kv_read_key(subject, msg.data, bucket) or "?"
        return f"kv read {bucket} {_key_kind(bucket, key)}"
    if subject.startswith("$JS.API.STREAM.INFO."):
        return "stream info"
    if subject.startswith("$JS.API.CONSUMER.MSG.NEXT.") or subject.startswith("$JS.API.CONSUMER.INFO."):
        return None  # pull requests (time-driven) and consumer info (the bench's settle polls)
    if subject.startswith("$JS.API."):
        return "jetstream api " + subject.removeprefix("$JS.API.").split(".", 2)[0].lower()
    if subject.startswith("temporality.events."):
        return None if subject in _OWN_EVENTS else "event " + subject.removeprefix("temporality.events.")
    if subject.startswith("temporality.timers."):
        return "timer"
    return "other " + subject.split(".", 1)[0]


def _key_kind(bucket: str, key: str) -> str:
    return key.split(".", 1)[0] if bucket == "human-channels" else "record"


class Wire:
    """The service's requests through nats-server while ``counting``, by :func:`wire_class` (a ``>`` subscriber
    on its own connection)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.counting = False

    async def on(self, msg: Msg) -> None:
        if self.counting and (kind := wire_class(msg)) is not None:
            self.counts[kind] += 1


class Futures:
    """(event type, request id) -> a future the bus completes."""

    def __init__(self) -> None:
        self._futures: dict[tuple[str, str], asyncio.Future[None]] = {}

    def get(self, kind: str, request_id: str) -> asyncio.Future[None]:
        key = (kind, request_id)
        if key not in self._futures:
            self._futures[key] = asyncio.get_running_loop().create_future()
        return self._futures[key]

    async def on(self, msg: Msg) -> None:
        event = json.loads(msg.data)
        request_id = event.get("data", {}).get("request_id")
        if isinstance(request_id, str):
            fut = self.get(event["type"], request_id)
            if not fut.done():
                fut.set_result(None)


async def _settled(bus: Bus) -> None:
    """Until the service's consumers have nothing pending nor unacknowledged (the run ends are handled too)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        behind = 0
        for durable in SETTLED:
            spec = CONSUMERS[durable]
            info = await bus.js.consumer_info(spec.stream, spec.durable)
            behind += int(info.num_pending or 0) + int(info.num_ack_pending or 0)
        if not behind:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("the service's consumers did not settle")


async def _round(
    src: Path, work: Path, loops: int, concurrency: int, warmup: int, wire: Wire | None = None
) -> dict[str, float]:
    nats = NatsServer(work / "nats")
    nats.start()
    service: Service | None = None
    try:
        settings = NatsSettings(url=nats.url)
        async with Bus.connect(settings, name="bench-human-loop") as bus:
            await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
            service = Service(src, nats.url, work)
            await service.wait_ready()
            futures = Futures()
            for kind in ("human.notified", "human.answered"):
                await bus.nc.subscribe(f"temporality.events.{kind}", cb=futures.on)
            limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
            async with httpx.AsyncClient(base_url=service.url, timeout=60, limits=limits) as http:

                async def loop() -> None:
                    run_id, request_id = new_id("run"), new_id("hreq")
                    policy = HumanPolicy(allowed_recipients=["user:alice"])
                    launch = LaunchSource(kind="webhook", trigger_id="bench-hitl-loop")
                    run = RunRequested(run_id=run_id, agent="bench", title="PR 42", launch=launch, human=policy)
                    await bus.publish(make_event(run, source="/temporality/trigger-gateway", run_id=run_id))
                    asked = HumanRequested(
                        request_id=request_id,
                        run_id=run_id,
                        agent="bench",
                        title="PR 42: remove the v1 API",
                        recipient="user:alice",
                        question="Keep the v1 contract of PR 42: remove the v1 API?",
                        context="",
                        options=OPTIONS,
                        timeout_s=3600,
                        expires_at=datetime.now(UTC) + timedelta(hours=1),
                        policy=policy,
                        turn=1,
                    )
                    await bus.publish(make_event(asked, source="/temporality/run-executor", run_id=run_id))
                    await asyncio.wait_for(futures.get("human.notified", request_id), 60)
                    answer = await http.post(
                        f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE
                    )
                    answer.raise_for_status()
                    await asyncio.wait_for(futures.get("human.answered", request_id), 60)
                    done = RunCompleted(run_id=run_id, result="Decided: keep-v1", turns=2)
                    await bus.publish(make_event(done, source="/temporality/run-executor", run_id=run_id))

                async def batch(n: int) -> float:
                    gate = asyncio.Semaphore(concurrency)

                    async def guarded() -> None:
                        async with gate:
                            await loop()

                    started = time.perf_counter()
                    await asyncio.gather(*(guarded() for _ in range(n)))
                    await _settled(bus)
                    return time.perf_counter() - started

                await batch(warmup)
                spy = await nats_connect(nats.url) if wire is not None else None
                try:
                    if spy is not None and wire is not None:
                        await spy.subscribe(">", cb=wire.on)
                        await written_out(spy)
                        wire.counting = True
                    before_cpu, retries = _cpu_s(service.proc.pid), service.retries()
                    seconds = await batch(loops)
                    cpu_ms = (_cpu_s(service.proc.pid) - before_cpu) * 1000 / loops
                    if spy is not None and wire is not None:
                        await spy.flush()
                        wire.counting = False
                finally:
                    if spy is not None:
                        await spy.close()
                got = {"cpu_ms": cpu_ms, "loops_s": loops / seconds, "retries": service.retries() - retries}
                if wire is not None:
                    got["kv_reads"] = sum(n for k, n in wire.counts.items() if k.startswith("kv read")) / loops
                    kv = sum(n for k, n in wire.counts.items() if k.startswith("kv "))
                    got["kv_writes"] = kv / loops - got["kv_reads"]
                    got["requests"] = sum(wire.counts.values()) / loops
                return got
    finally:
        if service is not None:
            service.stop()
        nats.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=300, help="loops measured per round")
    parser.add_argument("--concurrency", type=int, default=20, help="loops in flight at once")
    parser.add_argument("--warmup", type=int, default=40, help="loops run first in each round and not counted")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per checkout (alternating with --before)")
    parser.add_argument(
        "--before",
        type=Path,
        help="another checkout (with its .venv), or a copy of some packages' sources (git archive main "
        "services/human-interaction/src libs/bus/src | tar -x -C DIR; run with this checkout's venv), "
        "measured in alternate rounds",
    )
    parser.add_argument(
        "--wire", action="store_true", help="count the service's bus requests per loop (a '>' subscriber) and list them"
    )
    args = parser.parse_args()
    configure_logging(LogSettings(level="warning", format="console"), service="bench")
    sides: dict[str, Path] = {"this checkout": ROOT}
    if args.before is not None:
        sides = {"before": args.before.resolve(), "after": ROOT}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    wires: dict[str, list[Counter[str]]] = {name: [] for name in sides}
    out = sys.stdout.write
    for i in range(args.rounds):
        for name, src in sides.items():
            with tempfile.TemporaryDirectory(prefix="temporality-human-loop-") as tmp:
                load = os.getloadavg()[0]
                wire = Wire() if args.wire else None
                got = asyncio.run(_round(src, Path(tmp), args.loops, args.concurrency, args.warmup, wire))
            results[name].append(got)
            if wire is not None:
                wires[name].append(wire.counts)
            requests = (
                f"   KV reads {got['kv_reads']:.2f} writes {got['kv_writes']:.2f}, requests {got['requests']:.2f}/loop"
                if wire is not None
                else ""
            )
            out(
                f"  round {i + 1} {name:<13} CPU {got['cpu_ms']:5.2f} ms/loop   {got['loops_s']:6.1f} loops/s   "
                f"retries {got['retries']:.0f}{requests}   (load {load:.1f})\n"
            )
    out(f"human-interaction alone, {args.loops} loops x {args.rounds} rounds, {args.concurrency} at once:\n")
    for name, rounds in results.items():
        cpu = statistics.median(r["cpu_ms"] for r in rounds)
        per_s = statistics.median(r["loops_s"] for r in rounds)
        retries = statistics.median(r["retries"] for r in rounds)
        out(f"  {name:<13} CPU per loop median {cpu:5.2f} ms   {per_s:6.1f} loops/s   retries {retries:.0f}\n")
    for name, counted in wires.items():
        if not counted:
            continue
        total: Counter[str] = sum(counted, Counter())
        per_loop = args.loops * len(counted)
        out(f"  {name}: the service's bus requests per loop (all rounds)\n")
        for kind, n in sorted(total.items()):
            out(f"    {n / per_loop:6.2f}  {kind}\n")
    out(f"load average now: {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
