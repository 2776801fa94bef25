"""Service processes: start one of the services as its own OS process, wait for it, stop or kill it.

Used by ``temporality up`` and by the cross-service tests (which kill -9 and restart services).
The services are those of :data:`temporality_protocol.catalog.SERVICES`; each runs as
``python -m <package>``. Readiness is the file a service writes once it is connected and consuming
(``TEMPORALITY_READY_FILE``).
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from temporality_protocol.catalog import SERVICES

__all__ = ["RECENT_ERROR_S", "SERVICES", "ServiceProcess", "first_error", "free_port", "logged_at", "port_free"]


#: Where :func:`free_port` looks first: below the kernel's ephemeral range (Linux's default starts at 32768).
_FREE_PORTS_FROM = 20000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a server that binds it a moment later (so a small race remains).

    Taken at random *below* the kernel's ephemeral range where that range leaves room (Linux: 20000 up to
    its start, 32768 by default), not the port ``bind(0)`` hands out: that one comes from the ephemeral
    range, where every outgoing connection also takes its local port, so a client connecting anywhere in
    the meantime (a test's HTTP client, another test's services) could be given it and the server's bind
    then fails with "Address already in use" (seen in CI). Only another caller picking the same random port
    in that moment can still take it. Where the range cannot be read or leaves no room: ``bind(0)``."""
    try:
        ephemeral_from = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_from = 0
    if ephemeral_from - _FREE_PORTS_FROM >= 1000:
        for _ in range(100):
            port = random.randrange(_FREE_PORTS_FROM, ephemeral_from)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))  # no SO_REUSEADDR: a listener or a TIME_WAIT also says taken
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        bound: int = sock.getsockname()[1]
        return bound


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``host:port`` now.

    With ``SO_REUSEADDR``, as uvicorn's (asyncio's) and nats-server's own binds do: connections of a
    just-stopped server lingering in TIME_WAIT do not make the port look taken, a listening socket does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class ServiceProcess:
    def __init__(
        self,
        name: str,
        env: Mapping[str, str],
        run_dir: Path,
        *,
        cwd: Path | None = None,
        replica: int = 0,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        if name not in SERVICES:
            raise ValueError(f"unknown service {name!r}; known: {sorted(SERVICES)}")
        self.name = name
        self.replica = replica
        #: ``run-executor`` for the first replica, ``run-executor.2`` for the second, ...
        self.label = name if replica == 0 else f"{name}.{replica + 1}"
        self.run_dir = run_dir
        self.ready_file = run_dir / f"{self.label}.ready"
        self.log_file = run_dir / f"{self.label}.log"
        self.env = {**os.environ, **env, "TEMPORALITY_READY_FILE": str(self.ready_file)}
        self.cwd = cwd
        #: Run in the child before the service's exec: ``temporality up``'s
        #: :func:`temporality_embedded.datadir.die_with_parent`.
        self.preexec = preexec
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        #: Where this start's lines begin in :attr:`log_file` (it is appended to across starts and restarts).
        self.log_offset = 0

    @property
    def command(self) -> list[str]:
        """``python -m <package>`` with this interpreter (the catalogue names the package)."""
        return [sys.executable, "-m", SERVICES[self.name].package]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ready_file.unlink(missing_ok=True)
        self._log = self.log_file.open("ab")
        self.log_offset = self.log_file.stat().st_size
        self.proc = subprocess.Popen(
            self.command,
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal reaches the launcher, which stops us in order
            preexec_fn=self.preexec,
        )

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_file.exists():
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited with {self.proc.returncode}:\n{self.log_tail()}")
            time.sleep(0.05)
        raise TimeoutError(f"{self.label} not ready after {timeout}s:\n{self.log_tail()}")

    def terminate(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait for the graceful drain, SIGKILL if it overruns."""
        self.request_stop()
        return self.wait_stopped(timeout)

    def request_stop(self) -> None:
        """SIGTERM, without waiting (:meth:`wait_stopped` waits): several processes drain at once."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float = 15.0) -> int | None:
        """Wait for the process to exit after :meth:`request_stop`, SIGKILL if it overruns ``timeout``."""
        if self.proc is None:
            return None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._close_log()
        return self.proc.returncode

    def kill9(self) -> None:
        """kill -9: no drain, no acks, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self._close_log()

    @property
    def url(self) -> str | None:
        """The HTTP server's URL from the ready file (it says which port a ``PORT=0`` replica got)."""
        try:
            lines = self.ready_file.read_text(encoding="utf-8").split()
        except OSError:
            return None
        return lines[1] if len(lines) > 1 else None

    def log_lines(self) -> list[str]:
        """What this start wrote to its log (not the earlier starts' lines the file holds)."""
        try:
            with self.log_file.open("rb") as log:
                log.seek(self.log_offset)
                return log.read().decode(errors="replace").splitlines()
        except OSError:
            return []

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` of what this start logged; its first error line (``config.invalid``, any
        ``error``-level line, a traceback's last line) first, as the likely cause, when the tail holds one."""
        written = self.log_lines()
        if not written:
            return "(nothing logged)"
        cause = first_error(written)
        tail = "\n".join(written[-lines:])
        return f"{cause}\n--- the last lines of {self.log_file}:\n{tail}" if cause else tail

    def exit_report(self, returncode: int | None, lines: int = 20, now: datetime | None = None) -> str:
        """What to show under "<label> exited (...)": the last ``lines`` this start logged. For a non-zero exit
        code, its first error line too: first, as the likely cause, when it was logged within
        :data:`RECENT_ERROR_S` of the exit (``now``) or has no timestamp (a traceback's last line); an older one
        labelled as an earlier error with its time, so that it is not read as the cause. For an exit by a signal
        (``returncode`` < 0) none: a signal from outside (the OOM killer, an operator's kill) is the cause, not
        what the service logged before it."""
        written = self.log_lines()
        if not written:
            return "(nothing logged)"
        tail = "\n".join(written[-lines:])
        cause = first_error(written) if returncode is not None and returncode > 0 else None
        if cause is None:
            return tail
        heading = f"--- the last lines of {self.log_file}:"
        at = logged_at(cause)
        now = now or datetime.now(UTC)
        if at is not None and (now - at).total_seconds() > RECENT_ERROR_S:
            age = int((now - at).total_seconds())
            return (
                f"an earlier error logged since this start, at {at:%Y-%m-%d %H:%M:%S} UTC ({age} s before the exit; "
                f"not necessarily the cause):\n{cause}\n{heading}\n{tail}"
            )
        return f"{cause}\n{heading}\n{tail}"

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


#: What marks a log line as the error that stopped a service (console and JSON log formats).
_ERROR_MARKS = ("config.invalid", "[error", "[critical", '"level": "error"', '"level": "critical"')


#: An error line logged at most this long before a service exited (non-zero) is shown as its likely cause
#: (:meth:`ServiceProcess.exit_report`); an older one is labelled as an earlier error.
RECENT_ERROR_S = 10.0

#: The ISO timestamp (UTC) the services' log lines carry (console: at the start; JSON: ``"timestamp"``).
_TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)(?:Z|\+00:00)")


def logged_at(line: str) -> datetime | None:
    """When the log ``line`` was logged (its first UTC ISO timestamp), or ``None`` when it carries none."""
    found = _TIMESTAMP.search(line)
    if found is None:
        return None
    try:
        return datetime.fromisoformat(found.group(1)).replace(tzinfo=UTC)
    except ValueError:
        return None


def first_error(lines: list[str]) -> str | None:
    """The first error line of ``lines`` (``config.invalid`` before any other), or a traceback's last line."""
    for marks in (_ERROR_MARKS[:1], _ERROR_MARKS[1:]):
        found = next((line for line in lines if any(mark in line for mark in marks)), None)
        if found is not None:
            return found
    if any(line.startswith("Traceback (most recent call last)") for line in lines):
        return next((line for line in reversed(lines) if line and not line.startswith(" ")), None)
    return None
