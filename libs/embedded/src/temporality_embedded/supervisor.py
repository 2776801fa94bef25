"""``temporality up`` keeps its children running: a crashed service or nats-server is restarted with backoff.

The decision is :class:`CrashTracker`'s, pure and on an injected clock (unit-tested without processes); the
effects are :class:`Supervisor`'s, which ``temporality up`` calls about twice a second (:meth:`Supervisor.check`):

- a running service that exited 0 was stopped on purpose (a SIGTERM to make it read its configuration again): it
  is started again after the first delay, and that is not a crash;
- a service that exited otherwise (nothing in ``up`` stops one but Ctrl-C) is reported with its exit code or
  signal (``exit 1``, ``SIGKILL``) and its last log lines -- after a signal from outside as killed by it, with no
  earlier logged error put first as the cause (:meth:`ServiceProcess.exit_report`) -- and its own log gets a
  ``--- exited (SIGKILL) at ...; restarted by temporality up after 1 s ---`` line; it is started again after the
  next delay of
  :attr:`RestartPolicy.delays_s` (1, 2, 5, 10, 30 s; the first again once it ran :attr:`RestartPolicy.stable_s`),
  on the HTTP port it had (a worker's or an extra replica's port the OS picked at the first start is kept too);
- the embedded nats-server likewise, on the same client port and store (the port is held by a placeholder
  socket meanwhile, so nothing else takes it); the services reconnect on their own (their ``/readyz`` says so),
  and one that did not within :attr:`RestartPolicy.reconnect_timeout_s` is restarted;
- a running service is asked for its ``/healthz`` every :attr:`RestartPolicy.service_probe_every_s`; one that
  has not answered :attr:`RestartPolicy.service_hung_after` times in a row though it has not exited (stopped with
  SIGSTOP, deadlocked, swapping) is reported once, with its pid, its log and what to do, and again when it answers;
  it is not restarted (a hung process may still hold work it finishes once it runs again: the operator decides);
- :attr:`RestartPolicy.max_crashes` crashes of one child within :attr:`RestartPolicy.window_s` are a crash loop:
  the stack stops, with a message naming the child and its log;
- with ``restart=False`` (``temporality up --no-restart``, for CI) the first exit stops the stack.

Every child is polled (``Popen.poll``), so a dead one is reaped at once: no zombies.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import socket
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path

from temporality_embedded.processes import ServiceProcess
from temporality_embedded.stack import Stack

__all__ = [
    "NATS_LABEL",
    "CrashTracker",
    "RestartPolicy",
    "Supervisor",
    "describe_exit",
    "killed_by",
    "liveness",
    "log_tail",
    "not_ready",
    "readiness",
]

#: How the embedded nats-server is named in what :class:`Supervisor` prints.
NATS_LABEL = "nats-server"

Clock = Callable[[], float]


@dataclass(frozen=True)
class RestartPolicy:
    #: The wait before the 1st, 2nd, ... restart of a child; the last one repeats.
    delays_s: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 30.0)
    #: This many crashes of one child within :attr:`window_s` are a crash loop: the stack stops.
    max_crashes: int = 5
    window_s: float = 120.0
    #: A child that ran this long since its last start has its backoff start over at the first delay.
    stable_s: float = 120.0
    #: A restarted service not ready (its ready file) within this long counts as crashed (and is killed).
    ready_timeout_s: float = 60.0
    #: After a restart of nats-server, a service whose ``/readyz`` is not 200 within this long is restarted.
    reconnect_timeout_s: float = 60.0
    #: A running nats-server is asked for its ``INFO`` greeting this often (each try waits up to
    #: :attr:`nats_probe_timeout_s`); this many failures in a row and ``up`` says it hangs (a stopped or wedged
    #: process that has not exited: SIGSTOP, a hung disk), once, and again when it answers.
    nats_probe_every_s: float = 10.0
    nats_probe_timeout_s: float = 2.0
    nats_hung_after: int = 3
    #: A running service (with an HTTP port) is asked for its ``/healthz`` this often (each try waits up to
    #: :attr:`service_probe_timeout_s`); this many failures in a row and ``up`` says it hangs, once, and again
    #: when it answers. It is not restarted: ``up`` says how to (``kill -9 <pid>``, a crash it then restarts).
    service_probe_every_s: float = 10.0
    service_probe_timeout_s: float = 2.0
    service_hung_after: int = 3

    def __post_init__(self) -> None:
        if not self.delays_s or any(d < 0 for d in self.delays_s) or self.max_crashes < 1 or self.window_s <= 0:
            raise ValueError(f"a restart policy needs delays >= 0, max_crashes >= 1 and a window > 0: {self}")


class CrashTracker:
    """One child's crashes under a :class:`RestartPolicy`, on ``clock`` (seconds; :func:`time.monotonic`)."""

    def __init__(self, policy: RestartPolicy, clock: Clock = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._crashes: deque[float] = deque()
        self._level = 0  # restarts since the child last ran stable_s
        self._started_at = clock()

    def started(self) -> None:
        """The child was (re)started now."""
        self._started_at = self._clock()

    @property
    def recent(self) -> int:
        """Crashes within the last :attr:`RestartPolicy.window_s`."""
        self._forget(self._clock())
        return len(self._crashes)

    def crashed(self) -> float | None:
        """Record a crash now: the delay before the restart, or ``None`` for a crash loop (stop)."""
        now = self._clock()
        if now - self._started_at >= self.policy.stable_s:
            self._level = 0
        self._crashes.append(now)
        self._forget(now)
        if len(self._crashes) >= self.policy.max_crashes:
            return None
        delay = self.policy.delays_s[min(self._level, len(self.policy.delays_s) - 1)]
        self._level += 1
        return delay

    def _forget(self, now: float) -> None:
        while self._crashes and self._crashes[0] <= now - self.policy.window_s:
            self._crashes.popleft()


def describe_exit(returncode: int | None) -> str:
    """``SIGKILL`` for a process a signal ended, ``exit 1`` for one that exited, ``running`` for ``None``."""
    if returncode is None:
        return "running"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit {returncode}"


def killed_by(returncode: int) -> str:
    """What ``temporality up`` says of a child a signal ended that it did not send itself."""
    number = -returncode
    text = f"killed by signal {number} ({describe_exit(returncode)}) from outside temporality up"
    if number == signal.SIGKILL:
        text += ": SIGKILL is often the kernel's OOM killer (see `dmesg` or `journalctl -k`) or an operator's kill -9"
    return text


def greeting_problem(port: int, timeout_s: float = 2.0) -> str | None:
    """``None`` when a nats-server on 127.0.0.1:``port`` greets a new connection with ``INFO`` within
    ``timeout_s``, else what went wrong (``temporality status`` and the supervisor's probe)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as conn:
            conn.settimeout(timeout_s)
            greeting = conn.recv(4096)
    except OSError as exc:
        return f"its client port does not answer: {exc or type(exc).__name__}"
    if not greeting.startswith(b"INFO "):
        return f"its client port answered {greeting[:40]!r}, not INFO"
    return None


def _mark_log(path: Path, text: str) -> None:
    """Append ``--- text ---`` to a child's own log, so that its log shows the exit and the restart (not a silent
    gap between two starts)."""
    try:
        with path.open("a", encoding="utf-8") as log:
            log.write(f"--- {text} ---\n")
    except OSError:
        pass  # (a full disk or a removed data dir: the console output above says it anyway)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(empty log)"
    except OSError:
        return "(no log)"


def _seconds(value: float) -> str:
    return f"{value:g}s"


class _State(Enum):
    running = "running"
    waiting = "waiting"  # for its restart (backoff)
    starting = "starting"  # restarted, not ready yet
    reconnecting = "reconnecting"  # nats-server only: restarted, the services not ready on it yet


@dataclass
class _Child:
    label: str
    tracker: CrashTracker
    state: _State = _State.running
    due: float = 0.0  # waiting: when to restart; starting / reconnecting: the deadline
    url: str | None = None  # a service's URL at its last ready
    pending: set[str] = field(default_factory=set)  # reconnecting: the services not ready yet
    #: its last exit: ``SIGKILL`` at ``2026-12-07T02:00:00Z``, noted in its log when it is restarted
    exited: tuple[str, str] | None = None
    delay: float = 0.0  # waiting: the delay of this restart
    #: when to probe it next (nats-server: its greeting; a service: its ``/healthz``), failed probes in a row,
    #: when the first of them failed, and whether ``up`` has said it hangs
    next_probe: float = 0.0
    failed_probes: int = 0
    failing_since: float = 0.0
    hung: bool = False
    #: the probe under way in the supervisor's probe threads (its answer, the pid asked, when it was sent)
    probe: tuple[concurrent.futures.Future[str | None], int | None, float] | None = None


class Supervisor:
    """Watch ``stack`` (started) and restart what dies; print through ``out``."""

    def __init__(
        self,
        stack: Stack,
        out: Callable[[str], None],
        *,
        restart: bool = True,
        policy: RestartPolicy | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.stack = stack
        self.out = out
        self.restart = restart
        self.policy = policy or RestartPolicy()
        self.clock = clock
        self.children = {
            label: _Child(label, CrashTracker(self.policy, clock), url=_loopback(stack.process(label).url))
            for label in self._service_labels()
        }
        self.nats: _Child | None = None
        if stack.config.nats_url is None:  # the embedded server is ours to watch
            self.nats = _Child(NATS_LABEL, CrashTracker(self.policy, clock))
        #: the probes (a service's /healthz, nats-server's greeting) run here, all at once, never in :meth:`check`:
        #: a slow answer (a loaded machine, a hung child: up to the probe's timeout) does not delay a crash's
        #: restart or another child's probe
        self._probes = concurrent.futures.ThreadPoolExecutor(
            max_workers=len(self.children) + 1, thread_name_prefix="temporality-probe"
        )

    def close(self) -> None:
        """Stop the probe threads (a probe under way ends within its timeout; its answer is dropped)."""
        self._probes.shutdown(wait=False, cancel_futures=True)

    def _probe_answer(self, child: _Child, pid: int | None) -> tuple[str | None, float] | None:
        """The answer of ``child``'s probe of its process ``pid`` and when it was sent, once it came; ``None``
        while it is under way or when there is none. A probe of another process (restarted since) is dropped."""
        if child.probe is None or not child.probe[0].done():
            return None
        future, probed, sent = child.probe
        child.probe = None
        if probed != pid or future.cancelled():
            return None
        return future.result(), sent

    def _service_labels(self) -> list[str]:
        return [p.label for ps in self.stack.replicas.values() for p in ps]

    def check(self) -> int | None:
        """Look at every child once: ``None`` to go on, else the exit code ``temporality up`` stops with."""
        if self.nats is not None:
            code = self._check_nats(self.nats)
            if code is not None:
                return code
        for child in self.children.values():
            code = self._check_service(child)
            if code is not None:
                return code
        return None

    # -- services

    def _check_service(self, child: _Child) -> int | None:
        process = self.stack.process(child.label)
        now = self.clock()
        if child.state is _State.running:
            if not process.alive():
                child.failed_probes, child.hung = 0, False
                if process.proc is not None and process.proc.returncode == 0:
                    return self._service_stopped(child, process)
                return self._service_crashed(child, process, "exited unexpectedly")
            answer = self._probe_answer(child, process.pid)
            if answer is not None:
                self._service_answered(child, process, *answer)
            if now >= child.next_probe and child.probe is None:
                self._probe_service(child, process, now)
        elif child.state is _State.waiting:
            nats_down = self.nats is not None and self.nats.state is _State.waiting
            if now >= child.due and not nats_down:  # (with nats-server down it could only fail to connect)
                self._mark_restart(child, process.log_file)
                process = self.stack.respawn(child.label, port=self._port(child.url))
                child.tracker.started()
                child.state, child.due = _State.starting, now + self.policy.ready_timeout_s
        elif child.state is _State.starting:
            if process.ready_file.exists():
                url = _loopback(process.url)
                moved = f" (its port changed: it was {child.url})" if child.url and url != child.url else ""
                child.url = url
                self.out(f"{child.label} restarted (pid {process.pid}{', ' + url if url else ''}){moved}")
                child.state = _State.running
                child.failed_probes, child.hung = 0, False
                child.next_probe = now + self.policy.service_probe_every_s
            elif not process.alive():
                return self._service_crashed(child, process, "exited during its restart")
            elif now >= child.due:
                process.kill9()
                return self._service_crashed(
                    child,
                    process,
                    f"was not ready within {_seconds(self.policy.ready_timeout_s)} (killed)",
                    killed_by_us=True,
                )
        return None

    def _probe_service(self, child: _Child, process: ServiceProcess, now: float) -> None:
        """Ask the running service for its ``/healthz``, in a probe thread (:meth:`_service_answered` takes the
        answer on a later :meth:`check`)."""
        url = _loopback(process.url) or child.url
        child.next_probe = now + self.policy.service_probe_every_s
        if url is None:  # (a worker without a port: nothing to ask)
            return
        future = self._probes.submit(liveness, url, self.policy.service_probe_timeout_s)
        child.probe = (future, process.pid, now)

    def _service_answered(self, child: _Child, process: ServiceProcess, why: str | None, sent: float) -> None:
        """The answer of a ``/healthz`` probe sent at ``sent``: say once when the service stopped answering though it
        has not exited (SIGSTOP, a deadlock, swapping: its pid is alive, so nothing else here notices), and when it is
        back. It is not restarted: the message says how to have ``up`` restart it."""
        now = self.clock()
        if why is None:
            if child.hung:
                self.out(
                    f"{child.label} answers /healthz again (pid {process.pid}) after "
                    f"{now - child.failing_since:.0f} s; it goes on where it stopped"
                )
            child.failed_probes, child.hung = 0, False
            return
        if child.failed_probes == 0:
            child.failing_since = sent
        child.failed_probes += 1
        if child.failed_probes >= self.policy.service_hung_after and not child.hung:
            child.hung = True
            self.out(
                f"warning: {child.label} (pid {process.pid}) has not answered /healthz for "
                f"{now - child.failing_since:.0f} s though it is running ({why}): stopped (SIGSTOP), deadlocked or "
                f"swapping? It is not restarted automatically. Look at its log ({process.log_file}) and `temporality "
                f"status`; if it was stopped, `kill -CONT {process.pid}`; to have temporality up restart it, "
                f"`kill -9 {process.pid}`"
            )

    def _service_crashed(
        self, child: _Child, process: ServiceProcess, what: str, *, killed_by_us: bool = False
    ) -> int | None:
        returncode = process.proc.returncode if process.proc is not None else None
        process.kill9()  # (it is gone: this only closes our end of its log)
        exited = describe_exit(returncode)
        child.exited = (exited, _now())
        if returncode is not None and returncode < 0 and not killed_by_us:
            # a signal from outside is the cause: an error the service logged earlier is not presented as one
            self.out(
                f"error: {child.label} {what} ({exited}): {killed_by(returncode)}; "
                f"its last log lines before that ({process.log_file}):"
            )
            self.out(process.exit_report(returncode))
        else:
            self.out(f"error: {child.label} {what} ({exited}); last log lines ({process.log_file}):")
            self.out(process.exit_report(returncode) if not killed_by_us else process.log_tail(20))
        return self._schedule(child, child.tracker.crashed(), process.log_file)

    def _service_stopped(self, child: _Child, process: ServiceProcess) -> int | None:
        """A running service that exited 0 was stopped on purpose (a SIGTERM to reload its configuration, say):
        started again after the first delay, and not counted as a crash (a crash loop needs crashes)."""
        process.kill9()  # (it is gone: this only closes our end of its log)
        child.exited = ("exit 0", _now())
        if not self.restart:
            return self._schedule(child, 0.0, process.log_file)
        delay = self.policy.delays_s[0]
        self.out(
            f"{child.label} stopped cleanly (exit 0, e.g. a SIGTERM to reload its configuration): starting it again "
            f"in {_seconds(delay)} (not counted as a crash)"
        )
        child.state, child.due, child.delay = _State.waiting, self.clock() + delay, delay
        return None

    def _mark_restart(self, child: _Child, log_file: Path) -> None:
        exited, at = child.exited or ("exited", _now())
        _mark_log(log_file, f"exited ({exited}) at {at}; restarted by temporality up after {child.delay:g} s")

    def _schedule(self, child: _Child, delay: float | None, log_file: Path) -> int | None:
        exited, at = child.exited or ("exited", _now())
        if not self.restart:
            _mark_log(log_file, f"exited ({exited}) at {at}; not restarted (temporality up --no-restart): stopping")
            self.out(f"{child.label} is not restarted (--no-restart): stopping")
            return 1
        if delay is None:
            _mark_log(log_file, f"exited ({exited}) at {at}; a crash loop: not restarted, temporality up stops")
            self.out(
                f"error: {child.label} crashed {self.policy.max_crashes} times within "
                f"{_seconds(self.policy.window_s)}: a crash loop, not restarted again; stopping Temporality "
                "(its log is above; fix the cause and run `temporality up` again: the state is kept)"
            )
            return 1
        recent = child.tracker.recent
        self.out(
            f"restarting {child.label} in {_seconds(delay)} (crash {recent} of {self.policy.max_crashes} allowed "
            f"within {_seconds(self.policy.window_s)})"
        )
        child.state, child.due, child.delay = _State.waiting, self.clock() + delay, delay
        return None

    @staticmethod
    def _port(url: str | None) -> int | None:
        try:
            return int(url.rsplit(":", 1)[1].split("/")[0]) if url else None
        except (IndexError, ValueError):
            return None

    # -- nats-server

    def _probe_nats(self, child: _Child, now: float) -> None:
        """Ask the running nats-server for its greeting, in a probe thread (:meth:`_nats_answered` takes the answer
        on a later :meth:`check`)."""
        nats = self.stack.nats
        child.next_probe = now + self.policy.nats_probe_every_s
        future = self._probes.submit(greeting_problem, nats.port, self.policy.nats_probe_timeout_s)
        child.probe = (future, nats.pid, now)

    def _nats_answered(self, child: _Child, why: str | None, sent: float) -> None:
        """The answer of a greeting probe sent at ``sent``: say once when nats-server stopped answering though it has
        not exited (the services then fail their requests and report not ready, but nothing exits), and when it is
        back."""
        nats = self.stack.nats
        now = self.clock()
        if why is None:
            if child.hung:
                self.out(f"{NATS_LABEL} answers again (pid {nats.pid}); the services reconnect on their own")
            child.failed_probes, child.hung = 0, False
            return
        if child.failed_probes == 0:
            child.failing_since = sent
        child.failed_probes += 1
        if child.failed_probes >= self.policy.nats_hung_after and not child.hung:
            child.hung = True
            self.out(
                f"warning: {NATS_LABEL} (pid {nats.pid}) has not answered for {now - child.failing_since:.0f} s "
                f"though it is running ({why}): stopped (SIGSTOP), overloaded or its disk hangs? Until it answers no "
                f"event is published (webhooks get 503); the services' /readyz reports it only once their own NATS "
                f"pings went unanswered (about a minute), and `temporality status` says it now; see {nats.log_file}"
            )

    def _check_nats(self, child: _Child) -> int | None:
        nats = self.stack.nats
        now = self.clock()
        if child.state in (_State.running, _State.reconnecting):
            returncode = nats.poll()
            if returncode is not None:
                child.failed_probes, child.hung = 0, False
                child.exited = (describe_exit(returncode), _now())
                self._hold_nats_port()
                why = f": {killed_by(returncode)}" if returncode < 0 else ""
                self.out(
                    f"error: {NATS_LABEL} exited unexpectedly ({describe_exit(returncode)}){why}; "
                    f"last log lines ({nats.log_file}):"
                )
                self.out(log_tail(nats.log_file))
                return self._schedule_nats(child, child.tracker.crashed())
            if child.state is _State.reconnecting:
                return self._check_reconnected(child, now)
            answer = self._probe_answer(child, self.stack.nats.pid)
            if answer is not None:
                self._nats_answered(child, *answer)
            if now >= child.next_probe and child.probe is None:
                self._probe_nats(child, now)
        elif child.state is _State.waiting and now >= child.due:
            self._mark_restart(child, nats.log_file)
            try:
                url = self.stack.restart_nats()
            except (RuntimeError, TimeoutError, OSError) as exc:
                self._hold_nats_port()
                self.out(f"error: {NATS_LABEL} did not start again: {exc}; last log lines ({nats.log_file}):")
                self.out(log_tail(nats.log_file))
                child.exited = (f"did not start again: {exc}", _now())
                return self._schedule_nats(child, child.tracker.crashed())
            child.tracker.started()
            self.out(f"{NATS_LABEL} restarted on {url} (pid {nats.pid}, same store); waiting for the services")
            child.state, child.due = _State.reconnecting, self.clock() + self.policy.reconnect_timeout_s
            child.pending = set(self.children)
        return None

    def _hold_nats_port(self) -> None:
        """Hold the port the services reconnect to, so that nothing else takes it before the restart."""
        try:
            self.stack.nats.hold_port()
        except OSError as exc:  # taken already: the restart fails on it and says so
            self.out(f"note: could not hold {NATS_LABEL}'s port {self.stack.nats.port}: {exc}")

    def _schedule_nats(self, child: _Child, delay: float | None) -> int | None:
        if delay is not None and self.restart:
            self.out(f"the services keep running and reconnect once {NATS_LABEL} is back")
        return self._schedule(child, delay, self.stack.nats.log_file)

    def _check_reconnected(self, child: _Child, now: float) -> int | None:
        for label in sorted(child.pending):
            service = self.children[label]
            if service.state is not _State.running or _ready(_loopback(self.stack.process(label).url)):
                child.pending.discard(label)  # (one being restarted anyway connects afresh)
        if not child.pending:
            self.out(f"every service reconnected to {NATS_LABEL}")
            child.state = _State.running
        elif now >= child.due:
            for label in sorted(child.pending):
                self.out(
                    f"error: {label} did not reconnect to {NATS_LABEL} within "
                    f"{_seconds(self.policy.reconnect_timeout_s)}: restarting it"
                )
                self.stack.process(label).terminate(5.0)
                self.children[label].state, self.children[label].due = _State.waiting, now
            child.pending.clear()
            child.state = _State.running
        return None


def _loopback(url: str | None) -> str | None:
    """A ready file's URL as a client on this machine reaches it."""
    return url.replace("0.0.0.0", "127.0.0.1") if url is not None else None


def _ready(url: str | None) -> bool:
    """Whether the service at ``url`` answers ``/readyz`` with 200 (NATS connected, consumers bound); a service
    without a URL counts as ready (nothing to ask)."""
    if url is None:
        return True
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def liveness(url: str, timeout_s: float = 2.0) -> str | None:
    """``None`` when the service at ``url`` answers ``/healthz`` with 200 within ``timeout_s``, else what went
    wrong (a hung process accepts the connection in the kernel but never answers: a timeout)."""
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout_s) as response:
            return None if response.status == 200 else f"/healthz answered {response.status}"
    except urllib.error.HTTPError as exc:
        return f"/healthz answered {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"/healthz did not answer within {timeout_s:g} s: {reason or type(reason).__name__}"


def readiness(url: str | None) -> str | None:
    """Why the service at ``url`` is not ready (``/readyz``'s status and ``detail``, e.g. ``503: mcp servers failing:
    <error>`` or ``503: mcp servers does not answer within 2s``), or ``None`` when it answers 200 (or has no URL)."""
    if url is None:
        return None
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2.0) as response:
            return None if response.status == 200 else f"/readyz answered {response.status}"
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read() or b"{}")
        except ValueError:
            body = {}
        failing = [name for name, state in (body.get("checks") or {}).items() if state != "ok"]
        detail = body.get("detail") or ", ".join(failing) or exc.reason
        checks = f" (checks failing: {', '.join(failing)})" if failing else ""
        return f"/readyz answered {exc.code}: {detail}{checks}"
    except (urllib.error.URLError, OSError) as exc:
        return f"/readyz did not answer: {exc}"


def not_ready(stack: Stack, wait_s: float = 5.0) -> list[str]:
    """A warning per service process that is still not ready ``wait_s`` after the stack started (its ``/readyz``
    reason and the last warning or error it logged since it started), for ``temporality up`` to print."""
    labels = [p.label for ps in stack.replicas.values() for p in ps] or list(stack.services)
    deadline = time.monotonic() + wait_s
    while True:
        problems = {label: readiness(_loopback(stack.process(label).url)) for label in labels}
        problems = {label: why for label, why in problems.items() if why is not None}
        if not problems or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    warnings = []
    for label, why in problems.items():
        process = stack.process(label)
        logged = [line for line in process.log_lines() if "[warning" in line or "[error" in line or '"warning"' in line]
        last = f"\n    its last warning: {logged[-1].strip()[:600]}" if logged else ""
        warnings.append(f"warning: {label} is not ready: {why}; see {process.log_file}{last}")
    return warnings
