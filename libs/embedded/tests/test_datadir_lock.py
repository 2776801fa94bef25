"""One ``temporality up`` per data directory (:mod:`temporality_embedded.datadir`), over real processes: the lock is
refused to a second holder with the first's pid and let go by the kernel when its holder is killed; a child started
with :func:`die_with_parent` goes with a ``kill -9``'d parent; :func:`leftovers` names the processes a killed ``up``
left in the directory (and no stranger that took a pid); ``temporality --version`` says what runs."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from temporality_embedded import cli
from temporality_embedded.datadir import (
    LOCK_FILE,
    DataDirBusy,
    DataDirLock,
    alive,
    claim,
    die_with_parent,
    holder,
    leftovers,
)
from temporality_testing.waiting import eventually

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc: Linux")


def _python(code: str, *args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def children() -> Iterator[list[int]]:
    """Pids the test started (directly or not), killed at its end if still there."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _gone(pid: int, timeout_s: float = 20) -> None:
    async def exited() -> bool:
        return not alive(pid)

    asyncio.run(eventually(exited, timeout_s=timeout_s, what=f"pid {pid} gone"))


_HOLD = """
    import sys, time
    from pathlib import Path
    from temporality_embedded.datadir import DataDirLock
    DataDirLock(Path(sys.argv[1])).acquire()
    print("locked", flush=True)
    time.sleep(600)
"""


def test_a_second_holder_is_refused_with_the_first_ones_pid_until_the_kernel_lets_go(
    tmp_path: Path, children: list[int]
) -> None:
    first = _python(_HOLD, str(tmp_path))
    children.append(first.pid)
    assert first.stdout is not None
    assert first.stdout.readline().strip() == "locked"
    assert holder(tmp_path) == first.pid

    with pytest.raises(DataDirBusy) as busy:
        DataDirLock(tmp_path).acquire(wait_s=0.3)
    assert busy.value.pid == first.pid
    said: list[str] = []
    assert claim(tmp_path, said.append) is None
    assert f"pid {first.pid}" in said[0], said
    assert "another `temporality up`" in said[0], said

    first.kill()  # kill -9: no cleanup of its own, the kernel drops the flock
    first.wait(10)
    assert holder(tmp_path) is False
    lock = DataDirLock(tmp_path)
    lock.acquire(wait_s=0)
    try:
        assert holder(tmp_path) == os.getpid()
        assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())
    finally:
        lock.release()
    assert holder(tmp_path) is False


def test_no_lock_file_means_no_holder(tmp_path: Path) -> None:
    assert holder(tmp_path) is False


_PARENT = """
    import subprocess, sys, time
    from temporality_embedded.datadir import die_with_parent
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], preexec_fn=die_with_parent(), start_new_session=True
    )
    print(child.pid, flush=True)
    time.sleep(600)
"""


@linux_only
def test_a_child_started_with_die_with_parent_goes_with_a_kill_9_of_its_parent(children: list[int]) -> None:
    assert die_with_parent() is not None
    parent = _python(_PARENT)
    children.append(parent.pid)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    children.append(child)
    assert alive(child)
    parent.kill()
    parent.wait(10)
    _gone(child)


@linux_only
def test_a_child_without_it_outlives_its_parent(children: list[int]) -> None:
    """The other half: without :func:`die_with_parent` the same child is an orphan (so the test above can fail)."""
    parent = _python(_PARENT.replace("preexec_fn=die_with_parent()", "preexec_fn=None"))
    children.append(parent.pid)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    children.append(child)
    parent.kill()
    parent.wait(10)
    with pytest.raises(AssertionError):
        _gone(child, timeout_s=2)


@linux_only
def test_leftovers_names_the_processes_of_this_data_dir_only(tmp_path: Path, children: list[int]) -> None:
    data_dir = tmp_path / "data"
    (data_dir / "run").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    sleep = "import time; time.sleep(600)"
    # a journal as `temporality up` starts it: `python -m temporality_journal` in the data dir (here a sleeper
    # whose command line names the package)
    journal = _python(sleep, "temporality_journal", cwd=data_dir)
    children.append(journal.pid)
    (data_dir / "run" / "journal.ready").write_text(f"{journal.pid} http://0.0.0.0:1\n")
    # the same in another directory, and a pid of a stranger: not this data dir's
    other = _python(sleep, "temporality_run_executor", cwd=elsewhere)
    children.append(other.pid)
    (data_dir / "run" / "run-executor.ready").write_text(f"{other.pid}\n")
    (data_dir / "run" / "agent-collab.ready").write_text(f"{os.getpid()}\n")

    assert leftovers(data_dir) == [("journal", journal.pid)]
    said: list[str] = []
    assert claim(data_dir, said.append, wait_s=0.5) is None
    assert f"journal (pid {journal.pid})" in said[-1], said
    assert f"kill {journal.pid}" in said[-1], said
    assert holder(data_dir) is False  # refused: the lock is not kept

    journal.kill()
    journal.wait(10)
    assert leftovers(data_dir) == []
    lock = claim(data_dir, said.append)
    assert lock is not None
    lock.release()


def test_version_names_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("temporality 0."), out
    assert out == cli.version_text()
    root = Path(cli.__file__).resolve().parents[4]
    if (root / ".git").exists():
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert f"git {commit}" in out, out
