"""``temporality up`` says when a service hangs without exiting (an on-call review SIGSTOPped the journal: ``up``
printed nothing for minutes, only ``temporality status`` showed it), and says when it answers again; it does not
restart it.

The supervisor asks each running service for its ``/healthz`` (RestartPolicy.service_probe_*; a short interval
here so the test is fast). Real parts: a real nats-server, the real journal service as its own process, stopped
with SIGSTOP and continued with SIGCONT, and the supervisor's own loop (``Supervisor.check``) in a thread."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from temporality_bus import Bus, NatsSettings
from temporality_embedded.processes import ServiceProcess, free_port
from temporality_embedded.stack import Stack, StackConfig
from temporality_embedded.supervisor import RestartPolicy, Supervisor

CONFIG = Path(__file__).resolve().parents[3] / "config"


class Printed:
    """What the supervisor prints, for a test to wait on (a condition, with a timeout)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()

    def __call__(self, text: str) -> None:
        with self._changed:
            self.lines.append(text)
            self._changed.notify_all()

    def wait_for(self, marker: str, timeout_s: float, after: int = 0) -> int:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for index in range(after, len(self.lines)):
                    if marker in self.lines[index]:
                        return index
                left = deadline - time.monotonic()
                assert left > 0, f"no {marker!r} within {timeout_s} s in: {self.lines}"
                self._changed.wait(left)


@pytest.mark.timeout(120)
async def test_a_stopped_service_is_reported_once_with_what_to_do_and_its_return_too(
    tmp_path: Path, bus: Bus, nats_settings: NatsSettings
) -> None:
    stack = Stack(
        StackConfig(data_dir=tmp_path / "data", config_dir=CONFIG, nats_url=nats_settings.url, journal_port=free_port())
    )
    stack._prepare()
    journal = ServiceProcess("journal", stack.env_for("journal"), stack.data_dir / "run", cwd=stack.data_dir)
    stack.replicas["journal"] = [journal]
    stack.services["journal"] = journal
    journal.start()
    stopped = False
    done = threading.Event()
    printed = Printed()
    try:
        await asyncio.to_thread(journal.wait_ready, 60)
        policy = RestartPolicy(service_probe_every_s=0.2, service_probe_timeout_s=0.5, service_hung_after=3)
        supervisor = Supervisor(stack, printed, policy=policy)
        assert supervisor.nats is None  # (the caller's nats-server: only the service is watched)

        def loop() -> None:
            while not done.is_set():
                assert supervisor.check() is None
                time.sleep(0.05)

        looping = asyncio.create_task(asyncio.to_thread(loop))
        pid = journal.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        stopped = True
        warned = await asyncio.to_thread(printed.wait_for, f"journal (pid {pid}) has not answered /healthz", 30)
        warning = printed.lines[warned]
        assert "though it is running" in warning
        assert "not restarted automatically" in warning
        assert str(journal.log_file) in warning
        assert f"kill -CONT {pid}" in warning
        assert f"kill -9 {pid}" in warning
        # it stays hung a while longer: still one warning, and nothing restarted or killed
        await asyncio.sleep(1.5)
        os.kill(pid, signal.SIGCONT)
        stopped = False
        back = await asyncio.to_thread(printed.wait_for, f"journal answers /healthz again (pid {pid})", 30, warned)
        assert sum("has not answered /healthz" in line for line in printed.lines[: back + 1]) == 1
        assert not any(line.startswith(("error:", "restarting")) or " restarted (pid" in line for line in printed.lines)
        assert journal.alive()
        assert journal.pid == pid
        done.set()
        await looping
    finally:
        done.set()
        if stopped:
            os.kill(journal.pid or 0, signal.SIGCONT)
        journal.terminate(10)


@pytest.mark.timeout(120)
async def test_a_probe_that_waits_for_its_timeout_does_not_hold_up_the_supervisor_s_loop(
    tmp_path: Path, bus: Bus, nats_settings: NatsSettings
) -> None:
    """The probes run in the supervisor's probe threads: while a stopped service's ``/healthz`` takes its whole
    (long) timeout, every ``check`` (the loop that restarts what crashed) still returns at once."""
    stack = Stack(
        StackConfig(data_dir=tmp_path / "data", config_dir=CONFIG, nats_url=nats_settings.url, journal_port=free_port())
    )
    stack._prepare()
    journal = ServiceProcess("journal", stack.env_for("journal"), stack.data_dir / "run", cwd=stack.data_dir)
    stack.replicas["journal"] = [journal]
    stack.services["journal"] = journal
    journal.start()
    stopped = False
    printed = Printed()
    policy = RestartPolicy(service_probe_every_s=0.2, service_probe_timeout_s=3.0, service_hung_after=1)
    supervisor: Supervisor | None = None
    try:
        await asyncio.to_thread(journal.wait_ready, 60)
        supervisor = Supervisor(stack, printed, policy=policy)
        pid = journal.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        stopped = True

        def loop() -> list[float]:
            assert supervisor is not None
            took: list[float] = []
            deadline = time.monotonic() + 30
            while not any("has not answered /healthz" in line for line in printed.lines):
                assert time.monotonic() < deadline, printed.lines
                started = time.monotonic()
                assert supervisor.check() is None
                took.append(time.monotonic() - started)
                time.sleep(0.05)
            return took

        took = await asyncio.to_thread(loop)
        assert len(took) > 20  # the probe's 3 s timeout passed while the loop went round
        assert max(took) < 1.0, max(took)  # (in the loop before: 3 s, the probe's timeout)
    finally:
        if supervisor is not None:
            supervisor.close()
        if stopped:
            os.kill(journal.pid or 0, signal.SIGCONT)
        journal.terminate(10)
