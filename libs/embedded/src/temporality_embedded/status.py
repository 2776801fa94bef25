"""``temporality status [--data-dir DIR]``: the whole of a ``temporality up``'s stack at a glance, for on-call.

It reads what ``up`` leaves in its data directory -- each service process's ready file
(``run/<label>.ready``: its pid, then its URL; written once it is connected and consuming, removed when it stops)
and the embedded nats-server's ports file (``nats/ports/nats-server_<pid>.ports``) -- and asks each what it says
now: the service's ``GET /readyz`` (ready, not ready with its reason, or no answer), the nats-server's client port
(its ``INFO`` greeting) -- and whether the ``temporality up`` supervising them runs: the process holding the data
directory's lock (``up.lock``, :mod:`temporality_embedded.datadir`). Exit 0 only when every service and the
nats-server are ready under a running ``temporality up``, 1 otherwise (a script or a health check can use it), 3 when
processes of the stack run without their ``temporality up`` (it was killed: nothing restarts them, nothing stops
them, a new ``up`` refuses to start beside them), 2 when the directory holds no ``temporality up`` at all.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from temporality_embedded.datadir import LOCK_FILE, alive, holder, leftovers, parent_up
from temporality_embedded.processes import SERVICES
from temporality_embedded.supervisor import greeting_problem, readiness

__all__ = ["Row", "add_parser", "rows", "run"]


@dataclass(frozen=True)
class Row:
    label: str
    pid: int | None
    port: int | None
    ready: bool
    state: str


_alive = alive


def _port(url: str | None) -> int | None:
    try:
        return int(url.rsplit(":", 1)[1].split("/")[0]) if url else None
    except (IndexError, ValueError):
        return None


def _service(run_dir: Path, label: str) -> Row:
    try:
        words = (run_dir / f"{label}.ready").read_text(encoding="utf-8").split()
    except OSError:
        return Row(label, None, None, False, "not running (no ready file: stopped, not started yet, or starting)")
    pid = int(words[0]) if words and words[0].isdigit() else None
    url = words[1].replace("0.0.0.0", "127.0.0.1") if len(words) > 1 else None
    if pid is None or not _alive(pid):
        return Row(label, pid, _port(url), False, "not running (its ready file is left: it died)")
    why = readiness(url)
    return Row(label, pid, _port(url), why is None, "ready" if why is None else f"not ready: {why}")


def _nats(data_dir: Path) -> Row:
    files = sorted((data_dir / "nats" / "ports").glob("*.ports"), key=lambda p: p.stat().st_mtime)
    if not files:
        return Row("nats-server", None, None, False, "not running (no ports file)")
    file = files[-1]
    digits = file.stem.rsplit("_", 1)[-1]
    pid = int(digits) if digits.isdigit() else None
    try:
        ports: Any = json.loads(file.read_text(encoding="utf-8"))
        url = str(ports["nats"][0])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return Row("nats-server", pid, None, False, f"unreadable ports file {file}")
    port = _port(url)
    if pid is None or not _alive(pid) or port is None:
        return Row("nats-server", pid, port, False, "not running")
    why = greeting_problem(port)
    if why is not None:
        return Row("nats-server", pid, port, False, why)
    return Row("nats-server", pid, port, True, "ready (answers on its client port)")


def rows(data_dir: Path) -> list[Row]:
    """The nats-server, then every service process (``run-executor``, and ``run-executor.2``... when there are
    more replicas), as they are now."""
    run_dir = data_dir / "run"
    labels = list(SERVICES)
    extra = sorted(p.stem for p in run_dir.glob("*.*.ready") if p.stem.split(".", 1)[0] in SERVICES)
    return [_nats(data_dir)] + [_service(run_dir, label) for label in [*labels, *extra]]


def add_parser(commands: Any) -> None:
    p_status = commands.add_parser(
        "status",
        help="every service and the nats-server of a running `temporality up`: pid, port, ready or why not "
        "(exit 0 only when all are ready)",
    )
    p_status.add_argument(
        "--data-dir",
        default=".temporality",
        type=Path,
        help="the `temporality up`'s data directory (default: .temporality)",
    )


def run(args: argparse.Namespace, out: TextIO) -> int:
    data_dir: Path = args.data_dir
    if not (data_dir / "run").is_dir() and not (data_dir / "nats").is_dir():
        out.write(f"error: {data_dir}: no `temporality up` data directory (use --data-dir)\n")
        return 2
    found = rows(data_dir)
    width = max(len(row.label) for row in found)
    out.write(f"{'PROCESS':<{width}}  {'PID':>7}  {'PORT':>5}  STATE\n")
    for row in found:
        pid = str(row.pid) if row.pid is not None else "-"
        port = str(row.port) if row.port is not None else "-"
        out.write(f"{row.label:<{width}}  {pid:>7}  {port:>5}  {row.state}\n")
    supervisor = holder(data_dir)
    if supervisor is False:
        orphans = leftovers(data_dir)
        older = {parent_up(pid) for _, pid in orphans}
        if orphans and len(older) == 1 and None not in older:  # a live `up` from before the lock file: fine
            (up_pid,) = older
            out.write(
                f"supervisor: `temporality up` (pid {up_pid}) of an older version, which takes no "
                f"{LOCK_FILE}: its next start with this version takes it\n"
            )
            orphans = []
        else:
            out.write(f"supervisor: no `temporality up` holds {data_dir / LOCK_FILE}\n")
        if orphans:
            pids = " ".join(str(pid) for _, pid in orphans)
            out.write(
                f"error: {len(orphans)} process{'es' if len(orphans) != 1 else ''} of the stack run without their "
                "`temporality up` (it was killed: "
                f"nothing restarts or stops them, and a new one refuses to start beside them): {pids}; stop them with "
                f"`kill {pids}` (they drain on SIGTERM), then start `temporality up` again\n"
            )
            return 3
    else:
        pid = f"pid {supervisor}" if supervisor is not True else "its pid not written yet"
        out.write(f"supervisor: `temporality up` ({pid}) holds {data_dir / LOCK_FILE}\n")
    not_ready = [row.label for row in found if not row.ready]
    if not_ready:
        out.write(f"not ready: {', '.join(not_ready)} (logs in {data_dir / 'run'})\n")
        return 1
    out.write(f"all {len(found)} ready\n")
    return 0
