"""The README's first command: ``temporality up`` starts everything, prints the URLs, Ctrl-C stops it all,
and what it stored survives the next start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from e2e_support import CONFIG, EXAMPLE_PR, HOOK_AUTH

from temporality_embedded import SERVICES, free_port

pytestmark = pytest.mark.e2e
SCRIPT = Path(sys.executable).parent / "temporality"


class Up:
    def __init__(self, data_dir: Path, ports: dict[str, int] | None = None) -> None:
        self.ports = ports or {"gateway": free_port(), "human": free_port(), "journal": free_port()}
        self.proc = subprocess.Popen(
            [
                str(SCRIPT), "up",
                "--data-dir", str(data_dir),
                "--config-dir", str(CONFIG),
                "--gateway-port", str(self.ports["gateway"]),
                "--human-port", str(self.ports["human"]),
                "--journal-port", str(self.ports["journal"]),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        self.lines: list[str] = []

    def read_until(self, marker: str, timeout_s: float = 90) -> list[str]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip())
            if marker in line:
                return self.lines
        raise AssertionError(f"no {marker!r} in the output: {self.lines}")

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        self.read_until("Stopped.")
        return self.proc.wait(60)


def _admin_token(out: str) -> str:
    """The admin token ``temporality up`` printed (the line names the file it lives in)."""
    for line in out.splitlines():
        if "Admin API token" in line:
            return line.split()[3]
    raise AssertionError(f"no admin token printed: {out}")


def _pids(run_dir: Path) -> list[int]:
    return [int(p.read_text().split()[0]) for p in run_dir.glob("*.ready")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_up_prints_the_urls_serves_the_webhook_stops_on_ctrl_c_and_keeps_its_state(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    up = Up(data_dir)
    # a keep-alive connection still open at Ctrl-C: the server closes it, so the gateway's end of it
    # lingers in TIME_WAIT on the gateway port after the stop
    keep_alive = httpx.Client(timeout=10)
    try:
        out = "\n".join(up.read_until("Press Ctrl-C to stop."))
        hook = f"http://127.0.0.1:{up.ports['gateway']}/hooks/ado-pr-review"
        assert f"POST {hook}" in out
        assert f"http://127.0.0.1:{up.ports['human']}/inbox" in out
        assert f"http://127.0.0.1:{up.ports['journal']}/runs" in out
        assert f"http://127.0.0.1:{up.ports['journal']}/console/" in out
        assert f"http://127.0.0.1:{up.ports['gateway']}/triggers" in out
        assert "nats://127.0.0.1:" in out
        token = _admin_token(out)
        tokens_file = data_dir / "api-tokens.json"
        assert token in tokens_file.read_text(encoding="utf-8")
        assert tokens_file.stat().st_mode & 0o077 == 0, "the tokens file is readable by others"
        body = EXAMPLE_PR.read_bytes()
        headers = {"Authorization": HOOK_AUTH, "Content-Type": "application/json"}
        accepted = keep_alive.post(hook, content=body, headers=headers)
        assert accepted.status_code == 202, accepted.text
        run_id = accepted.json()["run_id"]
        console = keep_alive.get(f"http://127.0.0.1:{up.ports['journal']}/console/")
        assert console.status_code == 200, "the printed console URL serves the console"
        assert "text/html" in console.headers["content-type"]
        pids = _pids(data_dir / "run")
        assert len(pids) == len(SERVICES)
    finally:
        code = up.interrupt()
        keep_alive.close()
    assert code == 0, up.lines
    assert not [pid for pid in pids if _alive(pid)], "services left running after Ctrl-C"

    # the next start, right away on the same ports (TIME_WAIT is not "in use"), finds the same run and
    # still recognises the delivery (JetStream file store + SQLite)
    again = Up(data_dir, up.ports)
    try:
        out_again = "\n".join(again.read_until("Press Ctrl-C to stop."))
        assert _admin_token(out_again) == token, "the admin token must survive a restart"
        hook = f"http://127.0.0.1:{again.ports['gateway']}/hooks/ado-pr-review"
        duplicate = httpx.post(hook, content=body, headers=headers, timeout=10)
        assert duplicate.status_code == 200, duplicate.text
        assert duplicate.json()["run_id"] == run_id
        run = httpx.get(
            f"http://127.0.0.1:{again.ports['journal']}/runs/{run_id}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert run.status_code == 200
        assert run.json()["agent"] == "reviewer"
    finally:
        assert again.interrupt() == 0


def test_up_refuses_a_missing_config_dir(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(SCRIPT), "up", "--data-dir", str(tmp_path / "d"), "--config-dir", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "triggers.yaml not found" in result.stdout


def test_up_refuses_an_invalid_tokens_file(tmp_path: Path) -> None:
    bad = tmp_path / "tokens.yaml"
    bad.write_text("- {name: x, role: root, token: short}\n", encoding="utf-8")
    result = subprocess.run(
        [
            str(SCRIPT),
            "up",
            "--data-dir",
            str(tmp_path / "d"),
            "--config-dir",
            str(CONFIG),
            "--gateway-port",
            str(free_port()),
            "--human-port",
            str(free_port()),
            "--journal-port",
            str(free_port()),
            "--api-tokens-file",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2, result.stdout
    assert f"error: {bad}: entry 0.role" in result.stdout


def test_up_names_a_port_that_is_taken(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                str(SCRIPT),
                "up",
                "--data-dir",
                str(tmp_path / "d"),
                "--config-dir",
                str(CONFIG),
                "--gateway-port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert result.returncode == 2
    assert f"127.0.0.1:{port} is already in use; pick another with --gateway-port" in result.stdout
