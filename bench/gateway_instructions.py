"""Benchmark: instructions per accepted webhook of the trigger-gateway's app, counted by callgrind.

    .venv/bin/python bench/gateway_instructions.py [--requests 1000] [--concurrency 10] [--warmup 200]
                                                   [--before SRC ...] [--before-no-freeze] [--bare]
                                                   [--repeat 1] [--keep DIR]

Wall-clock throughput and even CPU time per request move with whatever else runs on the machine; the number
of instructions the gateway's process executes for a fixed amount of work barely does. This runs the real app
(``create_app`` over a real ``Bus`` to a nats-server it starts, the bench's Basic-auth Azure DevOps trigger)
under ``valgrind --tool=callgrind`` and drives it **in-process through ASGI** (no HTTP server, no socket on
the request's side: what it counts is the app's own work per request -- authentication, parsing, the
adapter's normalization, the dedupe claim, the three events, the writes behind the answer, the answer --
plus the bus client's socket I/O and the event loop), ``--concurrency`` requests in flight at a time, each a
new event (202 expected). nats-server runs natively, outside the count. Phases are told apart by callgrind
dumps before ``getppid`` (``--dump-before=getppid``, called only there): the start-up with the warm-up, then
the measured ``--requests``; only the latter is reported, divided by the requests.

``--before SRC ...``: the same count for the code in these source folders (first on ``PYTHONPATH``, as
``bench/gateway.py --before``), run right after; prints both and the ratio. ``--before-no-freeze``: that one
without ``gc.freeze()`` after its start (``--before`` this very code then counts what the freeze saves). ``--bare``:
the same count for ``bench/gateway.py``'s bare endpoint (FastAPI awaiting one JetStream publish of the body), the
ceiling the gateway is compared with, driven the same way; prints the ratio. ``--repeat N`` runs each N times
(the counts vary by well under 1 % between runs: the event loop's interleaving of the replies differs).
Needs valgrind (Debian: ``apt-get install valgrind``); slow (~50x): 1,000 requests take a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from gateway import EXAMPLE, PASSWORD, PASSWORD_ENV, TRIGGER, TRIGGERS, USER, _bare_app

REPO = Path(__file__).resolve().parents[1]
_NO_FREEZE_ENV = "TEMPORALITY_BENCH_NO_FREEZE"
_BARE_ENV = "TEMPORALITY_BENCH_BARE"


# --------------------------------------------------------------------------- child: the app under callgrind
async def _drive(nats_url: str, triggers_file: Path, warmup: int, requests: int, concurrency: int) -> int:
    import base64
    import json

    from temporality_bus import Bus, NatsSettings
    from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS
    from temporality_service import LogSettings, configure_logging
    from temporality_trigger_gateway import Settings, create_app, load_triggers

    configure_logging(LogSettings(level="warning", format="console"), service="bench-instructions")
    _patient_bus()
    text = EXAMPLE.read_bytes().decode("utf-8-sig")
    head, tail = re.split(r'"id"\s*:\s*"[^"]*"', text, maxsplit=1)
    assert json.loads(text)["id"], "the example has a top-level id"
    auth = b"Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode())
    prefix = os.urandom(6).hex()
    nats = NatsSettings(url=nats_url)
    async with Bus.connect(nats, name="bench-instructions") as bus:
        await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
        if os.environ.get(_BARE_ENV) == "1":
            app = _bare_app(bus)
        else:
            app = create_app(Settings(nats=nats), bus, load_triggers(triggers_file))
        if os.environ.get(_NO_FREEZE_ENV) != "1":
            gc.collect()
            gc.freeze()  # as the service's setup ends (and bench/gateway.py's servers)
        counter = 0
        statuses: dict[int, int] = {}

        async def one() -> None:
            nonlocal counter
            counter += 1
            body = f'{head}"id":"{prefix}-{counter}"{tail}'.encode()
            scope = {
                "type": "http",
                "asgi": {"version": "3.0", "spec_version": "2.3"},
                "http_version": "1.1",
                "method": "POST",
                "scheme": "http",
                "path": f"/hooks/{TRIGGER}",
                "raw_path": f"/hooks/{TRIGGER}".encode(),
                "root_path": "",
                "query_string": b"",
                "headers": [
                    (b"host", b"127.0.0.1"),
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"authorization", auth),
                ],
                "client": ("127.0.0.1", 50000),
                "server": ("127.0.0.1", 8080),
                "state": {},
            }
            sent = False

            async def receive() -> dict[str, object]:
                nonlocal sent
                if sent:
                    await asyncio.Event().wait()  # a disconnect never comes
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            async def send(message: MutableMapping[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    statuses[status] = statuses.get(status, 0) + 1

            await app(scope, receive, send)

        async def run(n: int) -> None:
            left = n

            async def worker() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await one()

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            await asyncio.sleep(0.2)  # the writes behind the last answers

        await run(warmup)
        os.getppid()  # callgrind dumps here: warm-up done
        statuses.clear()
        await run(requests)
        os.getppid()  # callgrind dumps here: the measured requests done
        sys.stderr.write(f"statuses {statuses}\n")
        if statuses != {202: requests}:
            raise SystemExit(f"not every request was accepted: {statuses}")
    return 0


def _patient_bus() -> None:
    """Acknowledgement deadlines of minutes instead of 10 s: under valgrind (~50x slower) on a loaded machine a
    round's acks can take longer than that, and a 503 is not the path to count. Only the deadline's length
    changes (each round still arms its one timer)."""
    import temporality_bus.connection as connection
    from temporality_bus.pipeline import Pipeline

    vars(connection)["JS_TIMEOUT_S"] = 600.0  # read at each call by Bus.publish_many
    for function in (Pipeline.send, connection.Bus.publish_raw_many):
        if function.__kwdefaults__ and "timeout_s" in function.__kwdefaults__:
            function.__kwdefaults__["timeout_s"] = 600.0


# --------------------------------------------------------------------------- parent
def _count(
    args: argparse.Namespace,
    nats_url: str,
    triggers_file: Path,
    src: list[Path] | None,
    out: Path,
    freeze: bool,
    bare: bool = False,
) -> int:
    env = {
        **os.environ,
        PASSWORD_ENV: PASSWORD,
        "PYTHONHASHSEED": "0",
        _NO_FREEZE_ENV: "0" if freeze else "1",
        _BARE_ENV: "1" if bare else "0",
    }
    if src:
        env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in src), *filter(None, [env.get("PYTHONPATH")])])
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("callgrind.out*"):
        old.unlink()
    cmd = [
        args.valgrind,
        "--tool=callgrind",
        "--dump-before=getppid",
        "--dump-instr=no",
        "--collect-jumps=no",
        f"--callgrind-out-file={out}/callgrind.out",
        sys.executable,
        __file__,
        "--child",
        "--nats",
        nats_url,
        "--triggers",
        str(triggers_file),
        "--requests",
        str(args.requests),
        "--warmup",
        str(args.warmup),
        "--concurrency",
        str(args.concurrency),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"the counted run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    dumps = sorted(out.glob("callgrind.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
    # a dump holds what ran since the one before: .1 (at the first getppid) the start-up and the warm-up, .2 (at
    # the second) the measured requests; the exit goes to the final callgrind.out
    if len(dumps) != 2:
        raise RuntimeError(f"expected 2 callgrind dumps in {out}, got {[p.name for p in dumps]}")
    return _totals(dumps[1])


def _totals(path: Path) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=1000, help="measured requests (default 1000)")
    parser.add_argument("--warmup", type=int, default=200, help="requests before the count (default 200)")
    parser.add_argument("--concurrency", type=int, default=10, help="requests in flight (default 10)")
    parser.add_argument("--before", type=Path, nargs="+", help="also count the code in these source folders")
    parser.add_argument(
        "--before-no-freeze",
        action="store_true",
        help="count the --before code without gc.freeze() after its start (with --before <this code>: the freeze)",
    )
    parser.add_argument(
        "--bare", action="store_true", help="also count bench/gateway.py's bare endpoint (one awaited publish)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="count each version this often (default 1)")
    parser.add_argument("--keep", type=Path, help="keep the callgrind files in this folder")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nats", help=argparse.SUPPRESS)
    parser.add_argument("--triggers", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        from temporality_service.runtime import run as run_on_uvloop

        sys.exit(run_on_uvloop(_drive(args.nats, args.triggers, args.warmup, args.requests, args.concurrency)))
    args.valgrind = shutil.which("valgrind")
    if args.valgrind is None:
        sys.stderr.write("bench/gateway_instructions.py needs valgrind: apt-get install valgrind (Debian/Ubuntu)\n")
        sys.exit(2)
    from temporality_testing import NatsServer

    versions: list[tuple[str, list[Path] | None]] = [("current", None)]
    if args.before:
        versions.append(("before", [p.resolve() for p in args.before]))
    if args.bare:
        versions.append(("bare", None))
    counts: dict[str, list[float]] = {name: [] for name, _ in versions}
    with tempfile.TemporaryDirectory(prefix="temporality-instructions-") as tmp:
        workdir = Path(tmp)
        triggers_file = workdir / "triggers.yaml"
        triggers_file.write_text(TRIGGERS)
        nats = NatsServer(workdir / "nats")
        nats.start()
        try:
            for round_ in range(args.repeat):
                for name, src in versions:
                    out = (args.keep or workdir) / f"{name}-{round_}"
                    started = time.monotonic()
                    freeze = not (name == "before" and args.before_no_freeze)
                    total = _count(args, nats.url, triggers_file, src, out, freeze, bare=name == "bare")
                    per = total / args.requests
                    counts[name].append(per)
                    sys.stdout.write(
                        f"{name:<8} round {round_ + 1}: {per:,.0f} instructions per request"
                        f" ({total:,} for {args.requests}; {time.monotonic() - started:.0f} s)\n"
                    )
        finally:
            nats.stop()
    for name, values in counts.items():
        sys.stdout.write(f"{name:<8} {min(values):,.0f} - {max(values):,.0f} instructions per request\n")
    if "before" in counts:
        ratio = min(counts["current"]) / min(counts["before"])
        sys.stdout.write(f"ratio current/before {ratio:.3f}x (lowest counts)\n")
    if "bare" in counts:
        ratio = min(counts["current"]) / min(counts["bare"])
        sys.stdout.write(f"ratio current/bare {ratio:.2f}x (lowest counts)\n")


if __name__ == "__main__":
    main()
