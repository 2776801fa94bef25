"""``examples/journal-subscriber/subscriber.py`` (DC-6) as a subprocess against a real nats-server: its own
durable consumer on the events stream, the event-type filter, ack after handling, resuming after a restart,
a poison message terminated -- and, when the read-only subscriber user exists in ``temporality_protocol
.permissions``, all of it as that user under the server's permissions."""

from __future__ import annotations

import ast
import asyncio
import json
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from pydantic import SecretStr

from temporality_bus import Bus, NatsSettings
from temporality_embedded.natsserver import NatsServer
from temporality_protocol import Envelope, RunCompleted, RunFailed, RunStarted, make_event, permissions
from temporality_protocol.catalog import ALL_STREAMS, EVENTS_STREAM
from temporality_testing.waiting import eventually

ROOT = Path(__file__).resolve().parents[3]
SUBSCRIBER = ROOT / "examples" / "journal-subscriber" / "subscriber.py"
WITHIN_S = 30


class Subscriber:
    """The example running as a subprocess; reads its stdout lines (one per handled event)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[dict[str, Any]] = []

    async def read(self, count: int) -> list[dict[str, Any]]:
        """Wait (bounded) until it printed ``count`` handled events in all; return them."""
        assert self.process.stdout is not None
        async with asyncio.timeout(WITHIN_S):
            while len(self.lines) < count:
                line = await self.process.stdout.readline()
                if not line:
                    raise AssertionError(f"the subscriber exited ({await self.stderr()})")
                self.lines.append(json.loads(line))
        return self.lines

    async def stop(self) -> str:
        """SIGTERM, and wait (bounded) for a clean exit; its stderr."""
        self.process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(WITHIN_S):
            code = await self.process.wait()
        err = await self.stderr()
        assert code == 0, err
        return err

    async def stderr(self) -> str:
        assert self.process.stderr is not None
        return (await self.process.stderr.read()).decode()


async def start(nats_url: str, *args: str) -> Subscriber:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SUBSCRIBER),
        "--nats-url",
        nats_url,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return Subscriber(process)


@pytest.fixture
async def running() -> AsyncIterator[list[Subscriber]]:
    """Subscribers the test started; any still running at the end is killed."""
    started: list[Subscriber] = []
    yield started
    for s in started:
        if s.process.returncode is None:
            s.process.kill()
            await s.process.wait()


def _run_events(run_id: str) -> list[Envelope]:
    return [
        make_event(RunStarted(run_id=run_id, agent="reviewer", role="r", title="t"), source="/t", run_id=run_id),
        make_event(RunCompleted(run_id=run_id, result="ok", turns=1), source="/t", run_id=run_id),
    ]


async def _consumer(nats_url: str, durable: str) -> Any:
    nc = await nats.connect(nats_url)
    try:
        return await nc.jetstream().consumer_info(EVENTS_STREAM.name, durable)
    finally:
        await nc.drain()


def test_the_example_imports_nothing_of_temporality() -> None:
    tree = ast.parse(SUBSCRIBER.read_text(encoding="utf-8"))
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
    }
    foreign = imported - set(sys.stdlib_module_names) - {"nats", "__future__"}
    assert not foreign, f"the example must use only the stdlib and nats-py, not {foreign}"


async def test_filters_acks_after_handling_and_resumes_after_a_restart(
    nats_settings: NatsSettings, bus: Bus, tmp_path: Path, running: list[Subscriber]
) -> None:
    out = tmp_path / "handled.jsonl"
    first, second = f"run-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
    before = _run_events(first)
    for event in before:
        await bus.publish(event)
    args = ("--name", "audit", "--type", "run.completed", "--type", "run.failed", "--out", str(out))
    sub = await start(nats_settings.url, *args)
    running.append(sub)
    # the durable starts at the stream's first event: run.started is filtered out, run.completed handled
    (line,) = await sub.read(1)
    assert (line["id"], line["type"], line["run_id"]) == (before[1].id, "run.completed", first)

    failed = make_event(RunFailed(run_id=second, reason="tool_error", error="boom"), source="/t", run_id=second)
    await bus.publish(failed)
    lines = await sub.read(2)
    assert lines[1]["id"] == failed.id
    err = await sub.stop()
    assert "subscribed: durable sub-audit on TEMPORALITY_EVENTS" in err
    info = await _consumer(nats_settings.url, "sub-audit")
    assert (info.num_ack_pending, info.num_pending) == (0, 0)  # acked, nothing left
    assert sorted(info.config.filter_subjects) == ["temporality.events.run.completed", "temporality.events.run.failed"]

    # while it is down: two more events (one filtered out) and a poison message on a filtered subject
    later = _run_events(f"run-{uuid.uuid4().hex[:8]}")
    for event in later:
        await bus.publish(event)
    nc = await nats.connect(nats_settings.url)
    try:
        await nc.jetstream().publish("temporality.events.run.failed", b"not json", timeout=5)
    finally:
        await nc.drain()
    restarted = await start(nats_settings.url, *args)
    running.append(restarted)
    (resumed,) = await restarted.read(1)
    assert resumed["id"] == later[1].id  # only what came after its last ack, not the earlier events again

    # the poison message after it is terminated (settled, never redelivered) before the stop: a stop mid-batch hands
    # what it did not reach back to the server
    async def settled() -> bool:
        info = await _consumer(nats_settings.url, "sub-audit")
        return (info.num_ack_pending, info.num_pending) == (0, 0)

    await eventually(settled, WITHIN_S, "the poison message terminated")
    err = await restarted.stop()
    assert "is not a CloudEvent" in err
    info = await _consumer(nats_settings.url, "sub-audit")
    assert (info.num_ack_pending, info.num_pending, info.num_redelivered) == (0, 0, 0)
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == [before[1].id, failed.id, later[1].id]


async def test_a_redelivered_event_is_handled_once(
    nats_settings: NatsSettings, bus: Bus, tmp_path: Path, running: list[Subscriber]
) -> None:
    """An event handled but whose ack was lost comes again: the --out file already has it, so it is only acked."""
    out = tmp_path / "handled.jsonl"
    events = _run_events(f"run-{uuid.uuid4().hex[:8]}")
    for event in events:
        await bus.publish(event)
    already = {"seq": 2, "id": events[1].id, "type": "run.completed", "time": None, "run_id": None, "subject": None}
    out.write_text(json.dumps(already) + "\n")  # "handled by an earlier run that crashed before its ack"
    sub = await start(nats_settings.url, "--name", "redo", "--type", "run.*", "--out", str(out), "--max-events", "2")
    running.append(sub)
    (line,) = await sub.read(1)  # run.started; run.completed is skipped as already handled, then acked
    assert line["id"] == events[0].id
    async with asyncio.timeout(WITHIN_S):
        assert await sub.process.wait() == 0  # --max-events 2: both acked
    err = await sub.stderr()
    assert f"({events[1].id}) was handled before: acked again" in err
    assert len(out.read_text().splitlines()) == 2
    info = await _consumer(nats_settings.url, "sub-redo")
    assert (info.num_ack_pending, info.num_pending) == (0, 0)


async def test_bad_arguments_exit_2(running: list[Subscriber]) -> None:
    for args in (("--name", "-x"), ("--type", "run completed"), ("--batch", "0")):
        sub = await start("nats://127.0.0.1:1", *args)
        running.append(sub)
        async with asyncio.timeout(WITHIN_S):
            assert await sub.process.wait() == 2, args


async def test_as_the_read_only_subscriber_user(tmp_path: Path, running: list[Subscriber]) -> None:
    """With the NATS user ``sub-<name>`` and exactly its permissions: the example needs nothing more."""
    grant = permissions.journal_subscriber_permissions
    server = NatsServer(
        tmp_path / "nats",
        users={
            "sub-audit": ("audit-password", grant("audit")),
            "admin": ("admin-password", None),
        },
    )
    server.start()
    try:
        admin = NatsSettings(url=server.url, user="admin", password=SecretStr("admin-password"))
        async with Bus.connect(admin, name="admin") as bus:
            await bus.ensure(ALL_STREAMS)
            events = _run_events(f"run-{uuid.uuid4().hex[:8]}")
            for event in events:
                await bus.publish(event)
            sub = await start(server.url, "--name", "audit", "--user", "sub-audit", "--password", "audit-password")
            running.append(sub)
            (line,) = await sub.read(1)
            assert line["id"] == events[1].id
            await sub.stop()
            # another durable name is not this user's: refused by the server, exit 3
            other = await start(
                server.url,
                "--name",
                "audit",
                "--durable",
                "journal",
                "--user",
                "sub-audit",
                "--password",
                "audit-password",
            )
            running.append(other)
            async with asyncio.timeout(WITHIN_S):
                assert await other.process.wait() == 3
            said = await other.stderr()
            assert "cannot open the durable consumer journal" in said
            assert "this user may not use durable journal" in said  # the server's reason, not only a timeout
            assert "Traceback" not in said
            # a wrong password: refused at once with what to do, not retried, no traceback, no password echoed
            wrong = await start(server.url.replace("nats://", "nats://sub-audit:not-the-password@"), "--name", "audit")
            running.append(wrong)
            async with asyncio.timeout(WITHIN_S):
                assert await wrong.process.wait() == 3
            said = await wrong.stderr()
            assert "the server refused the credentials" in said
            assert "--nats-subscriber" in said
            assert "not-the-password" not in said
            assert "Traceback" not in said
    finally:
        server.stop()


async def test_an_existing_durable_is_brought_to_the_types_asked(tmp_path: Path, running: list[Subscriber]) -> None:
    """Restarted with other ``--type``s, the example updates its durable's filter (as the read-only user, which may)
    instead of binding to the old one and silently receiving nothing of what it asked for."""
    grant = permissions.journal_subscriber_permissions
    server = NatsServer(
        tmp_path / "nats",
        users={"sub-audit": ("audit-password", grant("audit")), "admin": ("admin-password", None)},
    )
    server.start()
    try:
        admin = NatsSettings(url=server.url, user="admin", password=SecretStr("admin-password"))
        user = ("--name", "audit", "--user", "sub-audit", "--password", "audit-password")
        async with Bus.connect(admin, name="admin") as bus:
            await bus.ensure(ALL_STREAMS)
            first = _run_events(f"run-{uuid.uuid4().hex[:8]}")
            for event in first:
                await bus.publish(event)
            sub = await start(server.url, *user, "--type", "run.completed")
            running.append(sub)
            (line,) = await sub.read(1)
            assert line["id"] == first[1].id
            await sub.stop()

            changed = await start(server.url, *user, "--type", "run.started", "--ack-wait-s", "45")
            running.append(changed)
            later = _run_events(f"run-{uuid.uuid4().hex[:8]}")
            for event in later:
                await bus.publish(event)
            (started,) = await changed.read(1)
            assert (started["id"], started["type"]) == (later[0].id, "run.started")
            err = await changed.stop()
            assert "durable sub-audit exists with other settings" in err
            assert "filter temporality.events.run.completed, asked temporality.events.run.started" in err
            assert "ack wait 30 s, asked 45 s" in err
            info = await bus.js.consumer_info(EVENTS_STREAM.name, "sub-audit")
            assert info.config.filter_subject == "temporality.events.run.started"
            assert info.config.ack_wait == 45
            # the banner shows the durable as the server holds it after the update, not as it was
            assert "subscribed: durable sub-audit on TEMPORALITY_EVENTS, filter temporality.events.run.started," in err

            # from one subject to two families, as the reviewer's subscriber did the other way round
            families = await start(server.url, *user, "--type", "run.>", "--type", "human.>", "--ack-wait-s", "45")
            running.append(families)
            third = _run_events(f"run-{uuid.uuid4().hex[:8]}")
            for event in third:
                await bus.publish(event)
            lines = await families.read(2)
            assert [line["id"] for line in lines] == [e.id for e in third]
            err = await families.stop()
            assert "filter temporality.events.run.started, asked temporality.events.human.>, " in err
            info = await bus.js.consumer_info(EVENTS_STREAM.name, "sub-audit")
            held = sorted(info.config.filter_subjects or [])
            assert held == ["temporality.events.human.>", "temporality.events.run.>"]
            banner = next(line for line in err.splitlines() if "subscribed: durable sub-audit" in line)
            assert "temporality.events.run.>" in banner, banner
            assert "temporality.events.human.>" in banner, banner
            assert "still differs" not in err
    finally:
        server.stop()


async def test_max_events_hands_the_rest_of_its_batch_back_at_once(
    nats_settings: NatsSettings, bus: Bus, tmp_path: Path, running: list[Subscriber]
) -> None:
    """``--max-events`` reached mid-batch naks what it fetched but did not handle: the next run gets them at once,
    not after the ack wait (60 s here, longer than the test waits)."""
    events = [e for _ in range(3) for e in _run_events(f"run-{uuid.uuid4().hex[:8]}")]
    for event in events:
        await bus.publish(event)
    args = ("--name", "batchy", "--type", "run.*", "--batch", "6", "--ack-wait-s", "60")
    first = await start(nats_settings.url, *args, "--max-events", "2")
    running.append(first)
    assert [x["id"] for x in await first.read(2)] == [e.id for e in events[:2]]
    async with asyncio.timeout(WITHIN_S):
        assert await first.process.wait() == 0
    second = await start(nats_settings.url, *args, "--max-events", "4")
    running.append(second)
    assert [x["id"] for x in await second.read(4)] == [e.id for e in events[2:]]
    async with asyncio.timeout(WITHIN_S):
        assert await second.process.wait() == 0
    info = await _consumer(nats_settings.url, "sub-batchy")
    assert (info.num_ack_pending, info.num_pending) == (0, 0)
