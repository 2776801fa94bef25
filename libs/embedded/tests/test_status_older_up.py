"""``temporality status`` on a stack a ``temporality up`` from before ``up.lock`` supervises (a checkout updated while
its stack runs): the services' parent is that live ``up``, so status names it instead of calling its children
leftovers to kill; a leftover whose parent is not an ``up`` is still reported (exit 3). And ``status | head`` ends
quietly (no BrokenPipeError traceback)."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from temporality_embedded import datadir, status
from temporality_embedded.status import Row


@pytest.fixture
def older_up(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A process run as ``<dir>/temporality up`` (as the console script is) with one child: (its pid, the child's)."""
    script = tmp_path / "bin" / "temporality"
    script.parent.mkdir()
    child_file = tmp_path / "child.pid"
    script.write_text(
        f"#!{sys.executable}\n"
        "import subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '120'])\n"
        f"open({str(child_file)!r}, 'w').write(str(child.pid))\n"
        "child.wait()\n",
        encoding="utf-8",
    )
    script.chmod(0o755)
    up = subprocess.Popen([str(script), "up", "--data-dir", str(tmp_path / "data")])
    try:
        deadline = time.monotonic() + 30
        while not child_file.exists() or not child_file.read_text():
            assert time.monotonic() < deadline, "the fake up's child did not start"
            time.sleep(0.05)
        yield up.pid, int(child_file.read_text())
    finally:
        subprocess.run(["pkill", "-P", str(up.pid)], check=False)
        up.kill()
        up.wait(10)


def _status(data_dir: Path, monkeypatch: pytest.MonkeyPatch, leftover_pid: int) -> tuple[int, str]:
    (data_dir / "run").mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(status, "holder", lambda _: False)  # no up.lock: an older `up`, or none
    monkeypatch.setattr(status, "leftovers", lambda _: [("journal", leftover_pid)])
    monkeypatch.setattr(status, "rows", lambda _: [Row("journal", leftover_pid, 8082, True, "ready")])
    out = io.StringIO()
    code = status.run(argparse.Namespace(data_dir=data_dir), out)
    return code, out.getvalue()


def test_a_stack_under_an_older_up_is_supervised_not_leftovers(
    tmp_path: Path, older_up: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    up_pid, child = older_up
    assert status.parent_up(child) == up_pid
    code, out = _status(tmp_path / "data", monkeypatch, child)
    assert code == 0, out
    assert f"`temporality up` (pid {up_pid}) of an older version" in out
    assert "kill" not in out


def test_a_leftover_whose_parent_is_no_up_is_still_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    orphan = subprocess.Popen(["sleep", "120"])  # its parent is this test process, not a `temporality up`
    try:
        assert status.parent_up(orphan.pid) is None
        code, out = _status(tmp_path / "data", monkeypatch, orphan.pid)
    finally:
        orphan.kill()
        orphan.wait(10)
    assert code == 3, out
    assert f"kill {orphan.pid}" in out


def test_status_piped_into_head_ends_without_a_traceback(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    (data_dir / "run").mkdir(parents=True)
    cli = Path(sys.executable).with_name("temporality")
    done = subprocess.run(
        f"'{cli}' status --data-dir '{data_dir}' | head -c 1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert "BrokenPipeError" not in done.stderr, done.stderr


def test_up_beside_an_older_up_names_it_instead_of_calling_its_stack_leftovers(
    tmp_path: Path, older_up: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    up_pid, child = older_up
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    monkeypatch.setattr(datadir, "leftovers", lambda _: [("journal", child)])
    said: list[str] = []
    started = time.monotonic()
    assert datadir.claim(data_dir, said.append) is None  # refused, and at once: nothing of it is draining
    assert time.monotonic() - started < 5
    (message,) = said
    assert f"a `temporality up` of an older version (pid {up_pid})" in message
    assert f"kill {up_pid}" in message
    assert "it was killed" not in message
    assert datadir.holder(data_dir) is False  # the lock was let go
