"""One ``temporality up`` per data directory, and no service outliving it.

* :class:`DataDirLock`: an exclusive ``flock`` on ``<data-dir>/up.lock``, held for the life of ``temporality up``
  (the kernel lets go of it when the process ends, however it ends: a ``kill -9`` leaves no stale lock). The file
  names the holder's pid; a second ``up`` on the directory refuses with it (:class:`DataDirBusy`) instead of
  starting a second nats-server on the same JetStream store and a second journal on the same SQLite file.
* :func:`die_with_parent`: a ``preexec_fn`` that makes a child get SIGTERM when the ``temporality up`` that started
  it dies (Linux ``PR_SET_PDEATHSIG``); a service drains on SIGTERM, nats-server stops cleanly.
* :func:`leftovers`: the processes an earlier ``up`` of the directory left running (its ready and ports files name
  them and they still run there): orphans of a killed ``up`` from before this, or of a platform without
  ``PR_SET_PDEATHSIG``. ``up`` refuses to start beside them, ``temporality status`` names them.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from temporality_embedded.processes import SERVICES

__all__ = [
    "LOCK_FILE",
    "DataDirBusy",
    "DataDirLock",
    "alive",
    "claim",
    "die_with_parent",
    "holder",
    "leftovers",
]

#: The lock file in the data directory; it holds the pid of the ``temporality up`` that locks it.
LOCK_FILE = "up.lock"


class DataDirBusy(Exception):
    """Another process holds the data directory's lock: ``pid`` (``None`` when its file does not say)."""

    def __init__(self, path: Path, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        super().__init__(f"{path} is locked by pid {pid if pid is not None else '(unknown)'}")


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class DataDirLock:
    """The exclusive lock of one data directory (:data:`LOCK_FILE`), for as long as this object holds it.

    :meth:`acquire` tries for ``wait_s`` (a ``temporality status`` probing the lock holds it shared for a moment)
    and raises :class:`DataDirBusy` when another process keeps it. The file descriptor is not inherited by the
    children (Python's default), so the lock is this process's alone: it goes with it."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self, wait_s: float = 2.0) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise DataDirBusy(self.path, _read_pid(self.path)) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Let go (the file stays: removing it would let a later ``up`` lock a new file beside a holder of the old)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None


def holder(data_dir: Path) -> int | bool:
    """Who holds ``data_dir``'s lock now: its pid; ``True`` when it is held but the file names no pid (the holder is
    writing it); ``False`` when nobody holds it (or there is no lock file: no ``temporality up`` of this version
    ever ran there)."""
    path = data_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(path)
            return pid if pid is not None else True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (not a zombie left for its parent to reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process took the pid
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    prctl: Callable[..., int] = libc.prctl
    return prctl


def die_with_parent() -> Callable[[], None] | None:
    """A ``subprocess.Popen`` ``preexec_fn`` that has the child sent SIGTERM when this process dies (Linux
    ``PR_SET_PDEATHSIG``; kept across the ``exec``); ``None`` where there is no such thing. Call it in the thread
    that stays (the signal comes when the thread that forked the child ends): ``temporality up`` starts and
    restarts every child from its main thread. If this process died between the fork and the ``prctl``, the child
    exits at once instead of running orphaned."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()
    sigterm = int(signal.SIGTERM)

    def preexec() -> None:  # in the child, between fork and exec: no allocation beyond the call
        prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def _ours(pid: int, label: str, data_dir: Path) -> bool:
    """Whether the running ``pid`` is ``label`` of this data directory (not another program that took the pid
    since): a service runs ``python -m <its package>`` in the data directory, the nats-server has its JetStream
    store there on its command line. Where ``/proc`` says nothing, a live pid counts."""
    if not alive(pid):
        return False
    command = _cmdline(pid)
    if command is None:
        return sys.platform != "linux"
    if label == "nats-server":
        return "nats-server" in command and str(data_dir / "nats") in command
    name = label.split(".", 1)[0]
    if name not in SERVICES or SERVICES[name].package not in command:
        return False
    try:
        return Path(f"/proc/{pid}/cwd").resolve() == data_dir
    except OSError as exc:
        return exc.errno not in (errno.EACCES, errno.EPERM, errno.ENOENT)


def parent_up(pid: int) -> int | None:
    """The pid of ``pid``'s parent when that is a running ``temporality up`` (a version from before ``up.lock``
    supervises its children all the same), else ``None``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        argv = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        return None
    words = [a.decode(errors="replace") for a in argv if a]
    is_up = any(Path(w).name == "temporality" for w in words[:3]) and "up" in words[1:4]
    return ppid if is_up else None


def leftovers(data_dir: Path) -> list[tuple[str, int]]:
    """(label, pid) of each process that ``data_dir``'s ready files (``run/<label>.ready``) and the nats-server's
    ports files (``nats/ports/nats-server_<pid>.ports``) name and that still runs there."""
    data_dir = data_dir.resolve()
    found: list[tuple[str, int]] = []
    for ports in sorted((data_dir / "nats" / "ports").glob("*.ports")):
        digits = ports.stem.rsplit("_", 1)[-1]
        if digits.isdigit() and _ours(int(digits), "nats-server", data_dir):
            found.append(("nats-server", int(digits)))
    for ready in sorted((data_dir / "run").glob("*.ready")):
        try:
            words = ready.read_text(encoding="utf-8").split()
        except OSError:
            continue
        if words and words[0].isdigit() and _ours(int(words[0]), ready.stem, data_dir):
            found.append((ready.stem, int(words[0])))
    return found


def claim(data_dir: Path, out: Callable[[str], None], wait_s: float = 10.0) -> DataDirLock | None:
    """Lock ``data_dir`` for a ``temporality up`` (it must exist), or say why not (through ``out``) and return
    ``None``: another ``up`` holds it (its pid), or processes an earlier ``up`` left there still run
    (:func:`leftovers`; those of one killed a moment ago may still be draining: they get ``wait_s`` to exit)."""
    lock = DataDirLock(data_dir)
    try:
        lock.acquire()
    except DataDirBusy as busy:
        pid = f"pid {busy.pid}" if busy.pid is not None else "its pid not written yet"
        out(
            f"error: {data_dir} is in use by another `temporality up` ({pid}; it holds {busy.path}): two on one data "
            "directory would run two nats-servers on one JetStream store and two journals on one SQLite file. "
            f"Stop that one first (Ctrl-C in its terminal, or `kill {busy.pid or '<pid>'}`: it stops its services "
            "in order), or give this one its own --data-dir"
        )
        return None
    left = leftovers(data_dir)
    older = {parent_up(pid) for _, pid in left}
    if left and len(older) == 1 and None not in older:  # a live `up` of a version from before the lock file
        lock.release()
        (up_pid,) = older
        out(
            f"error: {data_dir} is in use by a `temporality up` of an older version (pid {up_pid}), which takes no "
            f"{LOCK_FILE}. Stop that one first (Ctrl-C in its terminal, or `kill {up_pid}`: it stops its services "
            "in order), or give this one its own --data-dir"
        )
        return None
    if left:
        out(f"note: waiting up to {wait_s:g} s for the processes an earlier `temporality up` left to exit ...")
        deadline = time.monotonic() + wait_s
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = leftovers(data_dir)
    if left:
        lock.release()
        pids = " ".join(str(pid) for _, pid in left)
        out(
            f"error: processes of an earlier `temporality up` on {data_dir} still run without it (it was killed): "
            + ", ".join(f"{label} (pid {pid})" for label, pid in left)
            + f". Nothing was started beside them. Stop them first: `kill {pids}` (they drain on SIGTERM; "
            f"`temporality status --data-dir {data_dir}` says when they are gone), then start again"
        )
        return None
    return lock
