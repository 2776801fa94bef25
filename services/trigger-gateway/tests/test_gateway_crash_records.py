"""A real gateway process killed with SIGKILL right after its answers: every delivery it answered 202 is listed
after a restart (its record went out with its events, before the answer), with its run, once; one run per event.

Webhooks are sent by many clients at once and the process is killed the moment the ``KILL_AFTER``-th 202 arrives,
with other deliveries still in flight, so writes queued behind the answers (the claims' ``published`` marks) are
lost with it. A second process on the same NATS then serves the listing.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
from asyncio.subprocess import Process
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from gateway_support import AS_VIEWER, PASSWORD, agents_file, eventually, fixture_json, journal, tokens_file

from temporality_bus import Bus
from temporality_protocol import RunRequested, TriggerAccepted
from temporality_testing import NatsServer

TRIGGER = "crash-pr"
TRIGGERS = f"""
triggers:
  - id: {TRIGGER}
    name: Killed mid-load
    type: webhook
    adapter: azure_devops.pull_request
    events: [git.pullrequest.created]
    agent: reviewer
    auth: {{type: basic, username: azure, password_env: TEST_CRASH_PASSWORD}}
"""
CLIENTS = 50
KILL_AFTER = 300


def _environ(tmp_path: Path, nats_server: NatsServer) -> dict[str, str]:
    triggers = tmp_path / "triggers.yaml"
    triggers.write_text(TRIGGERS, encoding="utf-8")
    agents_file(tmp_path)
    return {
        **os.environ,
        "TEMPORALITY_NATS_URL": nats_server.url,
        "TEMPORALITY_GATEWAY_PORT": "0",
        "TEMPORALITY_GATEWAY_TRIGGERS_FILE": str(triggers),
        "TEMPORALITY_LOG_FORMAT": "json",
        "TEMPORALITY_API_TOKENS_FILE": str(tokens_file(tmp_path)),
        "TEST_CRASH_PASSWORD": PASSWORD,
    }


async def _start(environ: dict[str, str], tmp_path: Path, name: str) -> tuple[Process, str]:
    """A gateway process, once ready (its ready file), and its URL (its ``service.ready`` log line)."""
    ready, log = tmp_path / f"{name}.ready", tmp_path / f"{name}.log"
    with log.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "temporality_trigger_gateway",
            env={**environ, "TEMPORALITY_READY_FILE": str(ready)},
            stderr=stderr,
            stdout=asyncio.subprocess.DEVNULL,
            stdin=asyncio.subprocess.DEVNULL,
        )

    async def started() -> str | None:
        assert proc.returncode is None, f"gateway exited with {proc.returncode}: {log.read_text()[-2000:]}"
        if not ready.exists():
            return None
        for line in log.read_text().splitlines():
            if line.startswith("{") and json.loads(line).get("event") == "service.ready":
                return str(json.loads(line)["url"])
        return None

    try:
        return proc, await eventually(started, timeout_s=60, what=f"gateway {name} ready", interval_s=0.05)
    except BaseException:
        await _stopped(proc)
        raise


async def _stopped(proc: Process) -> None:
    """``proc`` killed unless it ended already."""
    if proc.returncode is None:
        proc.kill()
    await proc.wait()


_HEAD = (
    f"POST /hooks/{TRIGGER} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    f"Authorization: Basic {base64.b64encode(f'azure:{PASSWORD}'.encode()).decode()}\r\n"
)


async def _post(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    """One webhook on a keep-alive connection: its status and JSON answer."""
    content = json.dumps(body).encode()
    writer.write(f"{_HEAD}Content-Length: {len(content)}\r\n\r\n".encode() + content)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    answer: dict[str, Any] = json.loads(await reader.readexactly(length))
    return int(lines[0].split()[1]), answer


async def _listed(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    """Every delivery of the trigger, newest first, all pages."""
    found: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {"limit": "100", **({"cursor": cursor} if cursor else {})}
        page = await http.get(f"/triggers/{TRIGGER}/deliveries", params=params, headers=AS_VIEWER)
        assert page.status_code == 200, page.text
        found += page.json()["deliveries"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return found


async def test_every_delivery_answered_202_before_a_sigkill_is_listed_after_the_restart_with_one_run_each(
    tmp_path: Path, nats_server: NatsServer, bus: Bus
) -> None:
    environ = _environ(tmp_path, nats_server)
    body = fixture_json("pr-created.json")
    proc, url = await _start(environ, tmp_path, "first")
    answered: dict[str, tuple[str, str]] = {}  # event id -> (delivery id, run id) of its 202
    unanswered: list[str] = []
    try:
        events = iter(f"crash-evt-{i:05d}" for i in range(100_000))
        killed = asyncio.Event()
        port = int(url.rsplit(":", 1)[1])

        async def client() -> None:
            # a bare HTTP/1.1 keep-alive client: httpx alone cannot keep the gateway busy, and with the gateway idle
            # its writes behind an answer are on the wire long before any kill could land
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                while not killed.is_set():
                    event_id = next(events)
                    try:
                        status, answer = await _post(reader, writer, {**body, "id": event_id})
                    except (OSError, asyncio.IncompleteReadError):
                        unanswered.append(event_id)  # in flight when the process died
                        return
                    # (an answer read after the kill was decided was sent before the process died: counted)
                    assert status == 202, answer
                    answered[event_id] = (answer["delivery_id"], answer["run_id"])
                    if len(answered) == KILL_AFTER and not killed.is_set():
                        os.kill(proc.pid, signal.SIGKILL)  # at once, other deliveries in flight
                        killed.set()
            finally:
                writer.close()

        await asyncio.wait_for(asyncio.gather(*(client() for _ in range(CLIENTS))), 120)
        assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGKILL
    finally:
        await _stopped(proc)
    assert len(answered) >= KILL_AFTER

    proc, url = await _start(environ, tmp_path, "second")
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            expected = {delivery_id: run_id for delivery_id, run_id in answered.values()}

            missing: list[str] = []

            async def all_listed() -> list[dict[str, Any]] | None:
                listed = await _listed(http)
                seen = {d["delivery_id"] for d in listed}
                missing[:] = [d for d in expected if d not in seen]
                return None if missing else listed

            try:
                listed = await eventually(all_listed, timeout_s=30, what="every delivery answered 202 listed")
            except AssertionError as exc:
                raise AssertionError(f"{len(missing)} of {len(expected)} deliveries answered 202 not listed") from exc
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        await _stopped(proc)

    # listed once each, in the state the answer reported, with its run and its event (it can be rerun)
    assert [d for d, n in Counter(d["delivery_id"] for d in listed).items() if n > 1] == []
    by_delivery = {d["delivery_id"]: d for d in listed}
    for event_id, (delivery_id, run_id) in answered.items():
        record = by_delivery[delivery_id]
        assert (record["state"], record["run_id"], record["source_event_id"]) == ("accepted", run_id, event_id)
        assert record["has_event"] is True
    # every event answered 202 is accepted once in the listing (no second record of it)
    accepted = Counter(d["source_event_id"] for d in listed if d["state"] == "accepted")
    assert all(accepted[event_id] == 1 for event_id in answered)

    # exactly one run per event in the journal (the events are stored before the answer: read once they are all in)
    async def journaled() -> list[Any] | None:
        stored = await journal(bus)
        runs = {e.payload(RunRequested).run_id for e in stored if e.type == "run.requested"}
        return stored if all(run_id in runs for _, run_id in answered.values()) else None

    stored = await eventually(journaled, timeout_s=30, what="every answered run.requested in the journal")
    requested = Counter(e.payload(RunRequested).run_id for e in stored if e.type == "run.requested")
    accepted_events = Counter(
        e.payload(TriggerAccepted).source_event_id for e in stored if e.type == "trigger.accepted"
    )
    assert [r for r, n in requested.items() if n != 1] == []
    assert [e for e, n in accepted_events.items() if n != 1] == []
    assert all(requested[run_id] == 1 for _, run_id in answered.values())
