"""``temporality up`` keeps the stack running: a service or the nats-server killed with ``kill -9`` is reported
(with the signal), reaped and started again on the same ports, and the stack serves webhooks again; a crash loop
stops the stack with a message; ``--no-restart`` stops it at the first exit."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from e2e_support import CONFIG, EXAMPLE_PR, HOOK_AUTH
from test_embedded_up import free_ports, start_up

from temporality_testing.waiting import eventually

pytestmark = pytest.mark.e2e


class Up:
    """``temporality up`` as a child process, its output read by a thread (so a test can wait for a line while
    the stack runs)."""

    def __init__(self, data_dir: Path, config_dir: Path = CONFIG, *extra: str) -> None:
        self.data_dir = data_dir
        self.ports = free_ports()
        self.proc = start_up(data_dir, config_dir, self.ports, *extra)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip())
                self._changed.notify_all()
        with self._changed:
            self.lines.append("<eof>")
            self._changed.notify_all()

    def wait_for(self, marker: str, timeout_s: float = 120, after: int = 0) -> int:
        """The index of the first line at or after ``after`` containing ``marker``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for index in range(after, len(self.lines)):
                    if marker in self.lines[index]:
                        return index
                left = deadline - time.monotonic()
                if left <= 0 or (self.lines and self.lines[-1] == "<eof>"):
                    raise AssertionError(f"no {marker!r} in the output: {self.output}")
                self._changed.wait(left)

    @property
    def output(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def ready(self) -> str:
        self.wait_for("Press Ctrl-C to stop.", 150)
        return self.output

    def pid(self, label: str) -> int:
        return int((self.data_dir / "run" / f"{label}.ready").read_text().split()[0])

    def nats_pid(self) -> int:
        """The nats-server child of ``temporality up``."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        (pid,) = [int(c) for c in children if "nats-server" in _cmdline(int(c))]
        return pid

    def token(self) -> str:
        (line,) = [line for line in self.output.splitlines() if "Admin API token" in line]
        return line.split()[3]

    def interrupt(self, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        code = self.proc.wait(timeout_s)
        self._reader.join(10)
        return code


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _gone(pid: int) -> bool:
    """Neither running nor a zombie: its parent reaped it (no /proc entry left)."""
    return not Path(f"/proc/{pid}").exists()


def _webhook_reaches_a_question(up: Up) -> None:
    """A webhook is accepted (202) and its run waits for a human: every service and NATS work."""
    asyncio.run(park_a_run(up))


async def park_a_run(up: Up) -> str:
    """The example Azure DevOps webhook into ``up``'s gateway (202), and its run waiting for a human in the journal;
    its run id (the tests of ``temporality up`` that need a parked run share it)."""
    headers = {"Authorization": HOOK_AUTH, "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=10) as http:
        accepted = await http.post(
            f"http://127.0.0.1:{up.ports['gateway']}/hooks/ado-pr-review",
            content=EXAMPLE_PR.read_bytes(),
            headers=headers,
        )
        assert accepted.status_code == 202, accepted.text
        run_id: str = accepted.json()["run_id"]
    await run_reaches(up, run_id, "waiting_for_human")
    return run_id


async def run_reaches(up: Up, run_id: str, state: str) -> None:
    """Wait (bounded) until ``up``'s journal shows ``run_id`` in ``state``."""
    auth = {"Authorization": f"Bearer {up.token()}"}
    async with httpx.AsyncClient(timeout=10) as http:

        async def reached() -> bool:
            response = await http.get(f"http://127.0.0.1:{up.ports['journal']}/runs/{run_id}", headers=auth)
            return response.status_code == 200 and response.json()["state"] == state

        await eventually(reached, timeout_s=90, what=f"run {run_id} {state} in the journal")


@pytest.mark.timeout(300)
def test_a_killed_service_is_restarted_on_its_port_and_the_stack_serves_webhooks(tmp_path: Path) -> None:
    up = Up(tmp_path / "data")
    try:
        out = up.ready()
        executor_url = next(
            w for line in out.splitlines() if "Agent cards" in line for w in line.split() if "http" in w
        )
        old = up.pid("run-executor")
        mark = len(up.lines)
        os.kill(old, signal.SIGKILL)
        crashed = up.wait_for("run-executor exited unexpectedly (SIGKILL)", 30, mark)
        up.wait_for("restarting run-executor in 1s", 10, crashed)
        restarted = up.lines[up.wait_for("run-executor restarted (pid", 120, crashed)]
        assert _gone(old), "the killed run-executor is left a zombie"
        assert up.pid("run-executor") != old
        # the worker's agent-card API is back on the port it had (scrape configs and bookmarks stay true)
        assert executor_url.removesuffix("/agents") in restarted, (executor_url, restarted)
        assert "its port changed" not in restarted
        _webhook_reaches_a_question(up)
    finally:
        code = up.interrupt()
    assert code == 0, up.output


@pytest.mark.timeout(300)
def test_a_killed_nats_server_is_restarted_the_services_reconnect_and_ctrl_c_stays_fast(tmp_path: Path) -> None:
    up = Up(tmp_path / "data")
    try:
        out = up.ready()
        (nats_url,) = [w for line in out.splitlines() if "NATS (JetStream)" in line for w in line.split() if "://" in w]
        pids = {label: up.pid(label) for label in ("trigger-gateway", "run-executor", "journal")}
        old = up.nats_pid()
        mark = len(up.lines)
        os.kill(old, signal.SIGKILL)
        crashed = up.wait_for("nats-server exited unexpectedly (SIGKILL)", 30, mark)
        restarted = up.lines[up.wait_for("nats-server restarted on", 60, crashed)]
        assert nats_url in restarted, "nats-server came back on another port: the printed URLs are wrong now"
        assert _gone(old), "the killed nats-server is left a zombie"
        up.wait_for("every service reconnected to nats-server", 120, crashed)
        assert {label: up.pid(label) for label in pids} == pids, "a service was restarted instead of reconnecting"
        _webhook_reaches_a_question(up)
        # Ctrl-C with nats-server dead: nothing can drain, the stack stops at once instead of waiting out every
        # service's NATS drain timeout tier by tier (~22 s)
        os.kill(up.nats_pid(), signal.SIGKILL)
        started = time.monotonic()
        code = up.interrupt()
        took = time.monotonic() - started
    finally:
        code = up.interrupt()
    assert code == 0, up.output
    assert took < 15, f"Ctrl-C with nats-server dead took {took:.1f}s"
    assert "Stopped." in up.output


async def _card_served(cards: str, auth: dict[str, str], agent_id: str) -> None:
    async with httpx.AsyncClient(timeout=10) as http:

        async def listed() -> bool:
            response = await http.get(cards, headers=auth)
            return response.status_code == 200 and agent_id in [a["id"] for a in response.json()["agents"]]

        await eventually(listed, timeout_s=60, what=f"{agent_id} served by the run-executor")


@pytest.mark.timeout(300)
def test_a_service_stopped_with_sigterm_reads_its_config_again_and_is_not_counted_as_a_crash(tmp_path: Path) -> None:
    """SIGTERM is how an operator makes the run-executor read its agents file again under ``temporality up``: the
    clean exit (0) is restarted and never adds up to a crash loop; a real crash after it is the first one counted."""
    config = tmp_path / "config"
    shutil.copytree(CONFIG, config)
    up = Up(tmp_path / "data", config)
    try:
        out = up.ready()
        (cards,) = [w for line in out.splitlines() if "Agent cards" in line for w in line.split() if "http" in w]
        auth = {"Authorization": f"Bearer {up.token()}"}
        agents = config / "agents.yaml"
        text = agents.read_text(encoding="utf-8")
        for n in range(1, 3):
            # a second card, renamed each time: only a restart reads the file again
            copy = text.split("agents:\n", 1)[1].replace("- id: reviewer", f"- id: reviewer-{n}", 1)
            agents.write_text(text + copy, encoding="utf-8")
            mark = len(up.lines)
            os.kill(up.pid("run-executor"), signal.SIGTERM)
            stopped = up.wait_for("run-executor stopped cleanly (exit 0", 60, mark)
            assert "(not counted as a crash)" in up.lines[stopped]
            up.wait_for("run-executor restarted (pid", 120, stopped)

            asyncio.run(_card_served(cards, auth, f"reviewer-{n}"))
        assert "crash" not in "\n".join(up.lines[mark:]).replace("not counted as a crash", "")
        mark = len(up.lines)
        os.kill(up.pid("run-executor"), signal.SIGKILL)
        up.wait_for("restarting run-executor in 1s (crash 1 of 5 allowed", 30, mark)
        up.wait_for("run-executor restarted (pid", 120, mark)
        _webhook_reaches_a_question(up)
    finally:
        code = up.interrupt()
    assert code == 0, up.output


@pytest.mark.timeout(300)
def test_a_crash_loop_stops_the_stack_with_a_message(tmp_path: Path) -> None:
    config = tmp_path / "config"
    shutil.copytree(CONFIG, config)
    up = Up(tmp_path / "data", config)
    try:
        up.ready()
        # the agents file broken while the stack runs: every restart of the run-executor exits at once
        (config / "agents.yaml").write_text("agents: [\n", encoding="utf-8")
        os.kill(up.pid("run-executor"), signal.SIGKILL)
        up.wait_for("run-executor exited unexpectedly (SIGKILL)", 30)
        up.wait_for("run-executor exited during its restart (exit 2)", 120)
        up.wait_for("agents.yaml", 120)
        up.wait_for("run-executor crashed 5 times within 120s: a crash loop", 180)
        up.wait_for("Stopped.", 60)
        code = up.proc.wait(30)
    finally:
        up.interrupt()
    assert code == 1, up.output
    assert up.output.count("run-executor exited during its restart (exit 2)") == 4, up.output
    for delay in ("1s", "2s", "5s", "10s"):
        assert f"restarting run-executor in {delay}" in up.output


@pytest.mark.timeout(300)
def test_no_restart_stops_the_stack_at_the_first_exit(tmp_path: Path) -> None:
    up = Up(tmp_path / "data", CONFIG, "--no-restart")
    try:
        out = up.ready()
        assert "Restarts" not in out
        os.kill(up.pid("journal"), signal.SIGKILL)
        up.wait_for("journal exited unexpectedly (SIGKILL)", 30)
        up.wait_for("journal is not restarted (--no-restart): stopping", 10)
        up.wait_for("Stopped.", 60)
        code = up.proc.wait(30)
    finally:
        up.interrupt()
    assert code == 1, up.output
    assert "restarting" not in up.output
