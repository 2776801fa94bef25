"""``temporality status --data-dir DIR`` on a real ``temporality up``: every service and the nats-server with pid,
port and readiness, exit 0 when all are ready; a service that does not answer its ``/readyz`` (stopped with SIGSTOP)
is named with the reason and the exit is 1; once the stack is stopped, nothing is ready (exit 1); a directory
without a stack exits 2."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import pytest
from test_embedded_supervision import Up
from test_embedded_up import SCRIPT

from temporality_embedded.processes import SERVICES
from temporality_testing.waiting import eventually

pytestmark = pytest.mark.e2e


def _status(data_dir: Path) -> tuple[int, str]:
    proc = subprocess.run(
        [str(SCRIPT), "status", "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=60, check=False
    )
    return proc.returncode, proc.stdout + proc.stderr


def _all_ready(data_dir: Path) -> bool:
    return _status(data_dir)[0] == 0


@pytest.mark.timeout(300)
def test_status_says_what_is_ready_and_exits_0_only_when_all_are(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    up = Up(data_dir)
    stopped: int | None = None
    try:
        up.ready()

        async def ready() -> bool:
            return await asyncio.to_thread(_all_ready, data_dir)

        asyncio.run(eventually(ready, timeout_s=60, what="temporality status exits 0"))
        code, out = _status(data_dir)
        assert code == 0, out
        rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.split()[0] in {*SERVICES, "nats-server"}}
        assert set(rows) == {*SERVICES, "nats-server"}, out
        assert str(up.pid("journal")) in rows["journal"]
        assert str(up.ports["journal"]) in rows["journal"]
        assert str(up.nats_pid()) in rows["nats-server"]
        assert all("ready" in line and "not ready" not in line for line in rows.values()), out

        stopped = up.pid("journal")
        os.kill(stopped, signal.SIGSTOP)  # alive, but answers nothing
        code, out = _status(data_dir)
        assert code == 1, out
        (journal,) = [line for line in out.splitlines() if line.startswith("journal ")]
        assert "not ready: /readyz did not answer" in journal, out
        assert "not ready: journal" in out
        os.kill(stopped, signal.SIGCONT)
        stopped = None
        asyncio.run(eventually(ready, timeout_s=60, what="temporality status exits 0 again"))
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        assert up.interrupt() == 0, up.output
    code, out = _status(data_dir)
    assert code == 1, out
    assert out.count("not running") == len(SERVICES) + 1, out

    assert _status(tmp_path / "nothing")[0] == 2
