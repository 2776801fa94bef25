"""Every service as the OS process it runs as: ready only once its consumers run, clean exit on SIGTERM.

Each service is started through its console entry (``python -m <package>``) with the shipped config on
a fresh nats-server. ``/readyz`` is polled from the moment the port accepts: whenever it says ready,
every consumer the catalogue declares for the service exists on the server, and the ready file is
there. SIGTERM then ends the process with 0 within the drain budget, the ready file is gone, and the
clean stop logged no ``nats.disconnected`` warning.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from temporality_bus import Bus
from temporality_embedded import free_port
from temporality_protocol.catalog import CONSUMERS, SERVICES
from temporality_testing import NatsServer

REPO = Path(__file__).resolve().parents[1]
CONFIG = {
    "trigger-gateway": {"TRIGGERS_FILE": "config/triggers.yaml"},
    "run-executor": {"AGENTS_FILE": "config/agents.yaml"},
    "human-interaction": {"USERS_FILE": "config/users.yaml"},
    "journal": {},
    "agent-collab": {},
}
#: The drain budget a SIGTERM gets (TEMPORALITY_DRAIN_S) and the margin for a loaded machine.
DRAIN_S = 5.0
EXIT_WITHIN_S = DRAIN_S + 20


def _log_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


async def _declared_consumers_exist(bus: Bus, name: str) -> list[str]:
    found = []
    for durable in SERVICES[name].consumers:
        info = await bus.js.consumer_info(CONSUMERS[durable].stream, durable)
        found.append(info.config.durable_name)
    return found


@pytest.mark.parametrize("name", sorted(SERVICES))
async def test_ready_only_once_consuming_and_a_clean_exit_on_sigterm(
    name: str, nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    spec = SERVICES[name]
    port = free_port()
    ready_file = tmp_path / "ready"
    log_path = tmp_path / f"{name}.log"
    env = {
        **os.environ,
        "TEMPORALITY_NATS_URL": nats_server.url,
        "TEMPORALITY_READY_FILE": str(ready_file),
        "TEMPORALITY_DRAIN_S": str(DRAIN_S),
        "TEMPORALITY_LOG_FORMAT": "json",
        "TEMPORALITY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'journal.db'}",
        f"{spec.env_prefix}PORT": str(port),  # workers serve /healthz and /readyz on it for probes
        **{f"{spec.env_prefix}{key}": str(REPO / value) for key, value in CONFIG[name].items()},
    }
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            spec.package,
            env=env,
            cwd=tmp_path,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
    try:
        seen: list[int] = []
        deadline = time.monotonic() + 60  # a process start on the shared, loaded machine
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            while True:
                assert proc.returncode is None, f"{name} exited with {proc.returncode}:\n{log_path.read_text()}"
                assert time.monotonic() < deadline, f"{name} never ready; /readyz said {seen}:\n{log_path.read_text()}"
                try:
                    response = await client.get("/readyz")
                except httpx.TransportError:  # not listening yet
                    await asyncio.sleep(0.02)
                    continue
                seen.append(response.status_code)
                if response.status_code == 200:
                    break
                assert response.status_code == 503, response.text
                assert response.json()["error"] == "not_ready"
                await asyncio.sleep(0.02)
            body = response.json()
            # Ready means: every declared consumer is bound on the server and the ready file is written.
            assert await _declared_consumers_exist(bus, name) == list(spec.consumers)
            assert body["consumers"] == dict.fromkeys(spec.consumers, "running")
            assert body["responders"] == dict.fromkeys(spec.responders, "running")
            assert body["nats"] == "connected"
            pid, url = ready_file.read_text().split()  # the pid, then the URL it serves (port 0 resolved)
            assert pid == str(proc.pid)
            assert url == str(client.base_url).rstrip("/")
            assert (await client.get("/healthz")).json()["status"] == "ok"

        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), EXIT_WITHIN_S) == 0, log_path.read_text()
        assert time.monotonic() - started < EXIT_WITHIN_S
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert not ready_file.exists()
    events = _log_events(log_path)
    names = [e.get("event") for e in events]
    assert names.index("service.ready") < names.index("service.stopping") < names.index("service.stopped")
    noisy = [e for e in events if e.get("event") == "nats.disconnected" and e.get("level") == "warning"]
    assert noisy == [], "a clean stop must not warn about its own disconnect"


def test_a_taken_port_is_exit_1_with_a_clear_log(nats_server: NatsServer, tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {
            **os.environ,
            "TEMPORALITY_NATS_URL": nats_server.url,
            "TEMPORALITY_JOURNAL_PORT": str(port),
            "TEMPORALITY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'journal.db'}",
            "TEMPORALITY_LOG_FORMAT": "json",
        }
        result = subprocess.run(
            [sys.executable, "-m", "temporality_journal"], env=env, cwd=tmp_path, capture_output=True, timeout=60
        )
    assert result.returncode == 1
    assert b"service.failed" in result.stderr
    assert b"Address already in use" in result.stderr


def test_invalid_settings_are_exit_2_before_connecting(tmp_path: Path) -> None:
    env = {**os.environ, "TEMPORALITY_HUMAN_PORT": "70000", "TEMPORALITY_NATS_URL": "nats://127.0.0.1:1"}
    result = subprocess.run(
        [sys.executable, "-m", "temporality_human_interaction"], env=env, cwd=tmp_path, capture_output=True, timeout=60
    )
    assert result.returncode == 2
    assert b"settings.invalid" in result.stderr
    assert b"port" in result.stderr
