"""One ``temporality up`` per data directory, and nothing of its stack outliving it (real stacks):

* a second ``up`` on the same ``--data-dir`` (other ports) is refused at once, naming the first one's pid, and
  starts nothing: the first keeps serving, its ready files and kept NATS port untouched;
* a ``kill -9`` of ``up`` stops its nats-server and every service (``PR_SET_PDEATHSIG``), and a new ``up`` on the
  directory starts;
* processes a killed ``up`` left running (one frozen with SIGSTOP across its death, as an orphan of an older
  release or of a platform without ``PR_SET_PDEATHSIG``): ``temporality status`` says they run without their
  supervisor (exit 3, their pids), a new ``up`` refuses to start beside them and names them.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from e2e_support import CONFIG
from test_embedded_status import _status
from test_embedded_supervision import Up, park_a_run
from test_embedded_up import free_ports, start_up

from temporality_embedded.datadir import alive
from temporality_embedded.processes import SERVICES
from temporality_testing.waiting import eventually

pytestmark = pytest.mark.e2e


def _stack_pids(up: Up) -> dict[str, int]:
    return {"nats-server": up.nats_pid()} | {label: up.pid(label) for label in SERVICES}


def _all_gone(pids: dict[str, int], timeout_s: float = 90) -> None:
    async def gone() -> bool:
        return not any(alive(pid) for pid in pids.values())

    try:
        asyncio.run(eventually(gone, timeout_s=timeout_s, what="every process of the stack gone"))
    except AssertionError:
        raise AssertionError(f"still running: { {k: p for k, p in pids.items() if alive(p)} }") from None


def _refused(data_dir: Path, timeout_s: float = 60) -> tuple[int, str]:
    """Another ``temporality up`` on ``data_dir`` (its own free ports): its exit code and output."""
    second = start_up(data_dir, CONFIG, free_ports())
    try:
        out, _ = second.communicate(timeout=timeout_s)
    finally:
        if second.poll() is None:
            second.send_signal(signal.SIGINT)
            second.wait(60)
    return second.returncode, out


def _kill(pids: dict[str, int]) -> None:
    for pid in pids.values():
        if alive(pid):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(400)
def test_a_second_up_on_the_same_data_dir_is_refused_with_the_holders_pid_and_the_first_keeps_serving(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    up = Up(data_dir)
    try:
        up.ready()
        pids = _stack_pids(up)
        nats_port = (data_dir / "nats-port").read_text()

        code, out = _refused(data_dir)
        assert code == 2, out
        assert f"in use by another `temporality up` (pid {up.proc.pid}" in out, out
        assert "Starting Temporality" not in out, out
        # nothing of the first stack was touched: same processes, ready files, kept port
        assert _stack_pids(up) == pids
        assert (data_dir / "nats-port").read_text() == nats_port
        assert all((data_dir / "run" / f"{label}.ready").is_file() for label in SERVICES)
        code, status = _status(data_dir)
        assert code == 0, status
        assert f"supervisor: `temporality up` (pid {up.proc.pid})" in status, status
        asyncio.run(park_a_run(up))  # the first stack still takes a webhook to a parked run
    finally:
        assert up.interrupt() == 0, up.output
    code, status = _status(data_dir)
    assert code == 1, status
    assert "supervisor: no `temporality up`" in status, status


@pytest.mark.timeout(400)
def test_kill_9_of_up_stops_its_nats_server_and_services_and_a_new_up_starts(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    up = Up(data_dir)
    pids: dict[str, int] = {}
    try:
        up.ready()
        pids = _stack_pids(up)
        up.proc.kill()  # kill -9 of `temporality up`: no handler of its own runs
        up.proc.wait(30)
        _all_gone(pids)
    finally:
        up.interrupt()
        _kill(pids)  # were the test to fail: no orphans left behind
    code, status = _status(data_dir)
    assert code == 1, status
    assert "supervisor: no `temporality up`" in status, status

    again = Up(data_dir)
    try:
        again.ready()
        assert "earlier `temporality up`" not in again.output, again.output
    finally:
        assert again.interrupt() == 0, again.output


@pytest.mark.timeout(400)
def test_processes_a_killed_up_left_running_are_named_by_status_and_a_new_up_refuses_to_start_beside_them(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    up = Up(data_dir)
    pids: dict[str, int] = {}
    try:
        up.ready()
        pids = _stack_pids(up)
        journal = pids["journal"]
        # frozen, the journal takes its parent-death SIGTERM only when continued: an orphan meanwhile
        os.kill(journal, signal.SIGSTOP)
        up.proc.kill()
        up.proc.wait(30)
        _all_gone({label: pid for label, pid in pids.items() if label != "journal"})
        assert alive(journal)

        code, status = _status(data_dir)
        assert code == 3, status
        assert "supervisor: no `temporality up`" in status, status
        assert "run without their `temporality up`" in status, status
        assert f"kill {journal}" in status, status

        code, out = _refused(data_dir)
        assert code == 2, out
        assert f"journal (pid {journal})" in out, out
        assert "Nothing was started beside them" in out, out
        assert alive(journal)

        os.kill(journal, signal.SIGCONT)  # the pending SIGTERM: it drains and exits
        _all_gone({"journal": journal})
    finally:
        up.interrupt()
        _kill(pids)
    code, status = _status(data_dir)
    assert code == 1, status


def test_status_of_an_untouched_directory_names_no_supervisor(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    code, status = _status(tmp_path)
    assert code == 1, status
    assert "supervisor: no `temporality up`" in status, status
