"""The console entry as a real process: env settings → triggers → NATS → serve → ready file → SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from gateway_support import AS_VIEWER, REPO, tokens_file

from temporality_testing import NatsServer


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Wait for the ready file (bounded generously: a process start on the shared, loaded machine)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"gateway exited with {proc.returncode}"
        assert time.monotonic() < deadline, "gateway did not become ready"
        time.sleep(0.02)


def _serving_url(log: Path) -> str:
    for line in log.read_text().splitlines():
        if line.startswith("{") and json.loads(line).get("event") == "service.ready":
            return str(json.loads(line)["url"])
    raise AssertionError(f"no service.ready line in {log.read_text()}")


def test_process_serves_the_shipped_config_and_stops_on_sigterm(tmp_path: Path, nats_server: NatsServer) -> None:
    ready, log = tmp_path / "ready", tmp_path / "gateway.log"
    env = {
        **os.environ,
        "TEMPORALITY_NATS_URL": nats_server.url,
        "TEMPORALITY_GATEWAY_PORT": "0",
        "TEMPORALITY_GATEWAY_TRIGGERS_FILE": str(REPO / "config/triggers.yaml"),
        "TEMPORALITY_READY_FILE": str(ready),
        "TEMPORALITY_LOG_FORMAT": "json",
        "TEMPORALITY_LOG_LEVEL": "debug",
        "TEMPORALITY_API_TOKENS_FILE": str(tokens_file(tmp_path)),
    }
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "temporality_trigger_gateway"], env=env, stderr=stderr, stdin=subprocess.DEVNULL
        )
    try:
        _wait_for(ready, proc)
        url = _serving_url(log)
        assert url.startswith("http://127.0.0.1:")
        example = (REPO / "examples/azure-devops/git.pullrequest.created.json").read_bytes()
        with httpx.Client(base_url=url, timeout=10) as http:
            assert http.get("/healthz").json()["nats"] == "connected"
            assert http.get("/readyz").json()["status"] == "ready"
            response = http.post("/hooks/ado-pr-review", content=example, auth=("azure", "change-me"))
            assert response.status_code == 202, response.text
            assert http.post("/hooks/ado-pr-review", content=example, auth=("azure", "nope")).status_code == 401
            # the file seeded the trigger store; the admin API serves it (without the password)
            listed = http.get("/triggers", headers=AS_VIEWER)
            assert listed.status_code == 200, listed.text
            assert [t["trigger"]["id"] for t in listed.json()["triggers"]] == ["ado-pr-review"]
            assert "change-me" not in listed.text
            assert http.get("/triggers").status_code == 401
            assert http.get("/openapi.json").status_code == 401  # nothing anonymous but health and metrics
            assert "/triggers/{trigger_id}" in http.get("/openapi.json", headers=AS_VIEWER).json()["paths"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "change-me" not in text  # never log the password
    assert "service.stopped" in text
    assert '"trigger.literal_secret"' in text


def test_process_refuses_an_invalid_triggers_file(tmp_path: Path) -> None:
    bad = tmp_path / "triggers.yaml"
    bad.write_text("triggers:\n  - {id: x, name: x, type: webhook, agent: a, adapter: nope, events: [e]}\n")
    env = {**os.environ, "TEMPORALITY_GATEWAY_TRIGGERS_FILE": str(bad), "TEMPORALITY_NATS_URL": "nats://127.0.0.1:1"}
    result = subprocess.run(
        [sys.executable, "-m", "temporality_trigger_gateway"], env=env, capture_output=True, timeout=90, check=False
    )
    assert result.returncode == 2
    assert b"unknown adapter 'nope'" in result.stderr


def test_process_refuses_a_trigger_naming_an_unknown_agent(tmp_path: Path) -> None:
    (tmp_path / "agents.yaml").write_text("agents:\n  - {id: reviewer}\n")
    bad = tmp_path / "triggers.yaml"
    bad.write_text(
        "triggers:\n  - {id: x, name: x, type: webhook, agent: ghost, adapter: generic, events: [e], auth: {type: none}}\n"
    )
    env = {**os.environ, "TEMPORALITY_GATEWAY_TRIGGERS_FILE": str(bad), "TEMPORALITY_NATS_URL": "nats://127.0.0.1:1"}
    result = subprocess.run(
        [sys.executable, "-m", "temporality_trigger_gateway"], env=env, capture_output=True, timeout=90, check=False
    )
    assert result.returncode == 2
    assert b"unknown agent 'ghost'" in result.stderr
