"""What ``temporality up`` says when a service does not come up right: a config error of this start first, without
the lines an earlier start left in the service's log; a service that started but is not ready (an MCP server of a
card that cannot start) named with its ``/readyz`` reason after "Temporality is up."."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from e2e_support import CONFIG
from test_embedded_up import free_ports, start_up

pytestmark = pytest.mark.e2e


def _config(tmp_path: Path, change: dict[str, object]) -> Path:
    config = tmp_path / "config"
    shutil.copytree(CONFIG, config)
    agents = yaml.safe_load((config / "agents.yaml").read_text(encoding="utf-8"))
    agents["agents"][0].update(change)
    (config / "agents.yaml").write_text(yaml.safe_dump(agents), encoding="utf-8")
    return config


def _up(data_dir: Path, config: Path) -> subprocess.Popen[str]:
    return start_up(data_dir, config, free_ports())


def test_a_config_error_is_shown_first_and_an_earlier_starts_log_is_not(tmp_path: Path) -> None:
    config = _config(tmp_path, {"limits": {"max_turn": 20}})  # a typo: max_turns
    data_dir = tmp_path / "data"
    (data_dir / "run").mkdir(parents=True, mode=0o700)
    data_dir.chmod(0o700)
    earlier = "".join(f"2026-12-06T10:00:{i:02d}Z [info     ] an earlier start, line {i}\n" for i in range(60))
    (data_dir / "run" / "run-executor.log").write_text(earlier, encoding="utf-8")
    up = _up(data_dir, config)
    out, _ = up.communicate(timeout=120)
    assert up.returncode == 1, out
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if "could not start: run-executor exited with 2:" in line)
    assert "config.invalid" in lines[at + 1], out
    assert "limits.max_turn" in lines[at + 1]
    assert "an earlier start" not in out


def test_up_warns_about_a_service_that_started_but_is_not_ready(tmp_path: Path) -> None:
    failing = {
        "name": "flaky",
        "command": sys.executable,
        "args": ["-c", "import sys; print('flaky: missing config', file=sys.stderr); sys.exit(3)"],
    }
    config = _config(tmp_path, {"mcp_servers": [failing]})
    up = _up(tmp_path / "data", config)
    assert up.stdout is not None
    lines: list[str] = []
    try:
        for line in up.stdout:  # the banner ends with the Ctrl-C hint
            lines.append(line.rstrip())
            if "Ctrl-C" in line or "error:" in line:
                break
    finally:
        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=60)
    out = "\n".join(lines)
    assert "Temporality is up." in out, out + rest
    warnings = [line for line in lines if line.startswith("warning: run-executor is not ready")]
    assert len(warnings) == 1, out
    assert "/readyz answered 503" in warnings[0]
    assert "mcp servers" in warnings[0]
    assert "run-executor.log" in warnings[0]
    assert "exit code 3" in out  # its last warning: why the server failed
    assert "flaky: missing config" in out
