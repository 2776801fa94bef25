"""``python -m temporality_journal`` as a real process: ready file, consume, serve, stop on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from journal_support import VIEWER, write_tokens

from temporality_bus import Bus, NatsSettings

MakeStory = Callable[..., Any]  # journal_support.RunStory


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _eventually(check: Callable[[], Awaitable[bool]], proc: asyncio.subprocess.Process, within_s: float) -> None:
    """Poll an outside process's observable state (it has no event we could await)."""
    async with asyncio.timeout(within_s):
        for _ in range(int(within_s / 0.05) + 1):
            assert proc.returncode is None, f"journal exited early with {proc.returncode}"
            if await check():
                return
            await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


async def test_process_records_serves_and_stops_on_sigterm(
    tmp_path: Path, bus: Bus, nats_settings: NatsSettings, story: MakeStory
) -> None:
    port = _free_port()
    ready = tmp_path / "journal.ready"
    log_path = tmp_path / "journal.log"
    env = {
        **os.environ,
        "TEMPORALITY_NATS_URL": nats_settings.url,
        "TEMPORALITY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'data' / 'journal.db'}",
        "TEMPORALITY_JOURNAL_PORT": str(port),
        "TEMPORALITY_READY_FILE": str(ready),
        "TEMPORALITY_LOG_FORMAT": "console",
        "TEMPORALITY_API_TOKENS_FILE": str(write_tokens(tmp_path / "tokens.json")),
    }
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "temporality_journal", env=env, stdout=log, stderr=log
        )
    try:

        async def _ready() -> bool:
            return await asyncio.to_thread(ready.exists)

        await _eventually(_ready, proc, 60)  # a process start on the shared, loaded machine
        pid, url = (await asyncio.to_thread(ready.read_text)).split()  # the pid, then the URL it serves
        assert pid == str(proc.pid)
        assert url.startswith("http://127.0.0.1:")

        s = story()
        await bus.publish(s.requested())
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=VIEWER) as client:
            assert (await client.get("/healthz", headers={"Authorization": ""})).json()["status"] == "ok"
            assert (await client.get("/runs", headers={"Authorization": ""})).status_code == 401
            ready = (await client.get("/readyz")).json()
            assert ready["status"] == "ready"
            assert ready["consumers"] == {"journal": "running"}
            assert ready["checks"] == {"database": "ok"}

            async def _recorded() -> bool:
                return (await client.get(f"/runs/{s.run_id}")).status_code == 200

            await _eventually(_recorded, proc, 30)
            assert (await client.get(f"/runs/{s.run_id}")).json()["state"] == "pending"

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert "service.stopped" in await asyncio.to_thread(log_path.read_text)


async def test_an_invalid_tokens_file_stops_the_journal_before_it_connects(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("- {name: x, role: boss, token: short}\n", encoding="utf-8")
    env = {
        **os.environ,
        "TEMPORALITY_NATS_URL": "nats://127.0.0.1:1",  # never reached: configure() refuses first
        "TEMPORALITY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'journal.db'}",
        "TEMPORALITY_API_TOKENS_FILE": str(tokens),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "temporality_journal",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2, out
    assert b"config.invalid" in out
    assert b"TEMPORALITY_API_TOKENS_FILE" in out
