"""MCP elicitation as a parked human request (issue 6), end to end: a real MCP server (``mcp_notes_server.py
--elicit-tools``) over stdio asks for the user's input mid-call (``elicitation/create``); the run publishes an
ordinary ``human.requested`` (the form as options or free text), parks, and the answer (``human.answered`` on
the bus, as human-interaction publishes it) resumes it: the call is made again and the elicitation answered
from the record. Also across a ``kill -9`` of the executor process while the question waits."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from executor_processes import Crash, Process, start_process
from executor_support import REVIEWER, RunExecutor, run_record, run_requested, settled

from temporality_bus import Bus, NatsSettings
from temporality_protocol import (
    HumanAnswer,
    HumanAnswered,
    HumanExpired,
    HumanRequested,
    OptionAnswer,
    RunState,
    TextAnswer,
    make_event,
)
from temporality_run_executor.agents import AgentCard, McpServer, ProviderConfig, Sandbox
from temporality_run_executor.mcp_servers import McpPool, list_card_tools
from temporality_run_executor.providers.script import Script
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog

SERVER_FILE = Path(__file__).with_name("mcp_notes_server.py")
SERVER = McpServer(name="notes", command=sys.executable, args=[str(SERVER_FILE), "--elicit-tools"])
DELETE = {
    "steps": [
        {"id": "del", "call": {"tool": "notes__delete_note", "args": {"name": "note.txt"}}},
        {"id": "done", "answer": "{{ results.del.result }}"},
    ]
}
BOOK = {
    "steps": [
        {"id": "book", "call": {"tool": "notes__book", "args": {"room": "atrium"}}},
        {"id": "done", "answer": "{{ results.book.result }}"},
    ]
}


@pytest.fixture
async def pool() -> AsyncIterator[McpPool]:
    pool = McpPool()
    try:
        yield pool
    finally:
        await pool.aclose()


PURGE = {
    "steps": [
        {"id": "purge", "call": {"tool": "notes__purge", "args": {"name": "note.txt"}}},
        {"id": "done", "answer": "{{ results.purge.result }}"},
    ]
}


def _card(script: dict[str, Any], sandbox: Sandbox, server: McpServer = SERVER) -> AgentCard:
    return REVIEWER.model_copy(
        update={
            "provider": ProviderConfig(kind="scripted", script=Script.model_validate(script)),
            "tools": ToolPolicy(
                allow=["notes__delete_note", "notes__book", "notes__purge", "notes__connect", "notes__sync"]
            ),
            "mcp_servers": [server],
            "sandbox": sandbox,
        }
    )


async def _start(
    executor: RunExecutor, pool: McpPool, script: dict[str, Any], work: Path, server: McpServer = SERVER
) -> None:
    card = _card(script, Sandbox(working_dir=work), server)
    await executor(cards=[card], card_tools={card.id: await list_card_tools(card, pool)})


async def _answer(bus: Bus, requested: HumanRequested, answer: HumanAnswer, n: int = 1) -> None:
    answered = HumanAnswered(
        request_id=requested.request_id,
        run_id=requested.run_id,
        recipient=requested.recipient,
        responder=requested.recipient,
        answer=answer,
        channel="web",
        waited_s=1.0,
    )
    await bus.publish(make_event(answered, source="/test", id=f"evt-ans-{requested.request_id}-{n}"))


async def _requests(event_log: EventLog, run_id: str, n: int) -> list[HumanRequested]:
    found = await event_log.wait_for("human.requested", run_id=run_id, count=n, timeout_s=120)
    return [e.payload(HumanRequested) for e in found]


async def test_a_confirmation_is_asked_as_options_and_the_answer_completes_the_call(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, tmp_path: Path
) -> None:
    (tmp_path / "note.txt").write_text("old", encoding="utf-8")
    await _start(executor, pool, DELETE, tmp_path)
    event = run_requested()
    await bus.publish(event)
    (requested,) = await _requests(event_log, event.runid, 1)
    assert requested.question == "Delete the note note.txt?"
    assert requested.recipient == "user:alice"  # the run's person
    assert [o.id for o in requested.options] == ["yes", "no", "decline"]
    assert not requested.allow_free_text
    assert "notes__delete_note" in requested.context
    await run_record(bus, event.runid, RunState.WAITING_FOR_HUMAN)
    assert (tmp_path / "note.txt").exists()  # nothing deleted while the question waits
    await _answer(bus, requested, OptionAnswer(option_id="yes"))
    await _answer(bus, requested, OptionAnswer(option_id="yes"), 2)  # a second copy changes nothing
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
    assert completed.data["result"] == "deleted note.txt"
    assert not (tmp_path / "note.txt").exists()
    await event_log.caught_up()
    assert len(event_log.of_type("human.requested", event.runid)) == 1
    (called,) = event_log.of_type("run.tool_called", event.runid)
    assert called.data["tool"] == "notes__delete_note"


async def test_an_input_required_question_of_an_mcp_2026_server_parks_the_run_the_same_way(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, tmp_path: Path
) -> None:
    modern = SERVER.model_copy(update={"protocol": "auto"})  # MCP 2026-07-28: input_required, no back-channel
    await _start(executor, pool, PURGE, tmp_path, modern)
    event = run_requested()
    await bus.publish(event)
    (requested,) = await _requests(event_log, event.runid, 1)
    assert requested.question == "Purge the note note.txt?"
    assert [o.id for o in requested.options] == ["yes", "no", "decline"]
    await _answer(bus, requested, OptionAnswer(option_id="no"))
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
    assert completed.data["result"] == "kept"
    await event_log.caught_up()
    assert len(event_log.of_type("human.requested", event.runid)) == 1


CONNECT = {
    "steps": [
        {"id": "con", "call": {"tool": "notes__connect", "args": {"service": "calendar"}}},
        {"id": "done", "answer": "{{ results.con.result }}"},
    ]
}


@pytest.mark.parametrize(("option", "result"), [("done", "connected calendar"), ("decline", "not connected: decline")])
async def test_a_url_mode_elicitation_asks_the_person_to_open_the_link(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, tmp_path: Path, option: str, result: str
) -> None:
    await _start(executor, pool, CONNECT, tmp_path)
    event = run_requested()
    await bus.publish(event)
    (requested,) = await _requests(event_log, event.runid, 1)
    assert requested.question.startswith("Sign in to calendar to connect it.")
    assert "Open this link: https://auth.example.test/calendar/login?state=s1" in requested.question
    assert [o.id for o in requested.options] == ["done", "decline"]
    assert not requested.allow_free_text
    assert requested.answer_schema is None
    await run_record(bus, event.runid, RunState.WAITING_FOR_HUMAN)
    await _answer(bus, requested, OptionAnswer(option_id=option))
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
    assert completed.data["result"] == result
    await event_log.caught_up()
    assert len(event_log.of_type("human.requested", event.runid)) == 1


SYNC = {
    "steps": [
        {"id": "sync", "call": {"tool": "notes__sync", "args": {"service": "calendar"}}},
        {"id": "done", "answer": "{{ results.sync.result || results.sync.error }}"},
    ]
}


def _attempts(work: Path) -> int:
    marker = work / "sync-attempts-calendar"
    return int(marker.read_text(encoding="utf-8")) if marker.exists() else 0


async def _attempted(work: Path, n: int, timeout_s: float = 60.0) -> None:
    """Wait until the server has had ``n`` calls of ``sync`` (it counts them in its working directory)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout_s
    while _attempts(work) < n:
        assert loop.time() < until, f"sync was called {_attempts(work)} times, not {n}, within {timeout_s}s"
        await asyncio.sleep(0.05)


#: The wait for the completion notification far beyond what the test needs (a loaded machine stalls).
PATIENT = SERVER.model_copy(update={"timeout_s": 240.0, "completion_wait_s": 120.0})


async def _url_required_question(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, work: Path
) -> tuple[str, HumanRequested]:
    await _start(executor, pool, SYNC, work, PATIENT)
    event = run_requested()
    await bus.publish(event)
    (requested,) = await _requests(event_log, event.runid, 1)
    assert requested.question.startswith("Sign in to calendar to sync it.")
    assert "Open this link: https://auth.example.test/calendar/login?state=s2" in requested.question
    assert [o.id for o in requested.options] == ["done", "decline"]
    await run_record(bus, event.runid, RunState.WAITING_FOR_HUMAN)
    assert _attempts(work) == 1
    return event.runid, requested


async def test_a_call_refused_with_url_elicitation_required_asks_the_person_then_is_made_again(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, tmp_path: Path
) -> None:
    """A ``tools/call`` refused with ``URLElicitationRequiredError`` (-32042) parks the run on the link, like a
    URL-mode ``elicitation/create``; after the person signed in and answered ``done``, the call is made again."""
    run_id, requested = await _url_required_question(bus, event_log, executor, pool, tmp_path)
    (tmp_path / "signed-in-calendar").touch()  # the person signs in at the link
    await _answer(bus, requested, OptionAnswer(option_id="done"))
    (completed,) = await event_log.wait_for("run.completed", run_id=run_id, timeout_s=120)
    assert completed.data["result"] == "synced calendar"
    assert _attempts(tmp_path) == 2
    await event_log.caught_up()
    assert len(event_log.of_type("human.requested", run_id)) == 1
    assert not event_log.of_type("tool.failed", run_id)


async def test_done_before_the_server_knows_waits_for_its_completion_notification(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, tmp_path: Path
) -> None:
    """The person answers ``done`` before the server learned of the sign-in: the retried call is refused again,
    waits for the server's ``notifications/elicitation/complete`` of that elicitation, and is made once more."""
    run_id, requested = await _url_required_question(bus, event_log, executor, pool, tmp_path)
    await _answer(bus, requested, OptionAnswer(option_id="done"))
    await _attempted(tmp_path, 2)  # refused again: the call now waits for the notification
    (tmp_path / "signed-in-calendar").touch()  # the server's backend learns of the sign-in and notifies
    (completed,) = await event_log.wait_for("run.completed", run_id=run_id, timeout_s=120)
    assert completed.data["result"] == "synced calendar"
    assert _attempts(tmp_path) == 3
    await event_log.caught_up()
    assert len(event_log.of_type("human.requested", run_id)) == 1


async def test_declining_a_url_elicitation_required_tells_the_agent_what_the_person_must_do(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, tmp_path: Path
) -> None:
    run_id, requested = await _url_required_question(bus, event_log, executor, pool, tmp_path)
    await _answer(bus, requested, OptionAnswer(option_id="decline"))
    (completed,) = await event_log.wait_for("run.completed", run_id=run_id, timeout_s=120)
    assert completed.data["result"] == (
        "sync cannot run until the person completes an interaction at a link the server gave ('Sign in to calendar "
        "to sync it.'); they were asked and declined. Do not call it again unless they agree."
    )
    assert _attempts(tmp_path) == 2  # made again once (the server decides), refused again: the decline is read
    await event_log.caught_up()
    assert not event_log.of_type("tool.failed", run_id)  # the person's choice, not the tool breaking


async def test_declining_tells_the_tool_decline(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, tmp_path: Path
) -> None:
    (tmp_path / "note.txt").write_text("old", encoding="utf-8")
    await _start(executor, pool, DELETE, tmp_path)
    event = run_requested()
    await bus.publish(event)
    (requested,) = await _requests(event_log, event.runid, 1)
    await _answer(bus, requested, OptionAnswer(option_id="decline"))
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
    assert completed.data["result"] == "not deleted: decline"
    assert (tmp_path / "note.txt").exists()


async def test_an_expired_question_tells_the_tool_cancel(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, tmp_path: Path
) -> None:
    (tmp_path / "note.txt").write_text("old", encoding="utf-8")
    await _start(executor, pool, DELETE, tmp_path)
    event = run_requested()
    await bus.publish(event)
    (requested,) = await _requests(event_log, event.runid, 1)
    expired = HumanExpired(
        request_id=requested.request_id, run_id=event.runid, recipient="user:alice", action="default", waited_s=600.0
    )
    await bus.publish(make_event(expired, source="/test", id=f"evt-exp-{requested.request_id}"))
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
    assert completed.data["result"] == "not deleted: cancel"


async def test_a_form_answer_that_does_not_fit_is_refused_and_asked_again(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, tmp_path: Path
) -> None:
    await _start(executor, pool, BOOK, tmp_path)
    event = run_requested()
    await bus.publish(event)
    (first,) = await _requests(event_log, event.runid, 1)
    assert first.allow_free_text
    assert [o.id for o in first.options] == ["decline"]
    assert "- hours (integer, required): How long" in first.context
    await _answer(bus, first, TextAnswer(value="day: monday\nhours: 12"))
    second = (await _requests(event_log, event.runid, 2))[1]
    assert second.request_id != first.request_id
    assert "Your last answer was refused: field 'hours': 12 is greater than the maximum of 8" in second.context
    await run_record(bus, event.runid, RunState.WAITING_FOR_HUMAN)
    await _answer(bus, second, TextAnswer(value="day: tuesday\nhours: 3"))
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
    assert completed.data["result"] == "booked atrium on tuesday for 3h"


@pytest.mark.parametrize(
    "point",
    [
        "effect:Transition:waiting_for_human",  # the question published and the run parked: the ack lost
        "tool_retried",  # the call made again with the answer (its side effect done), the turn not committed
        "effect:SaveCheckpoint",  # (nth 2) the retried call's result committed, the next turn not begun
    ],
)
async def test_a_crash_at_the_park_or_the_retry_asks_once_and_applies_the_answer_once(
    bus: Bus,
    event_log: EventLog,
    nats_settings: NatsSettings,
    processes: list[Process],
    pool: McpPool,
    tmp_path: Path,
    point: str,
) -> None:
    """The driver dies (its connection closed at once, as kill -9 would) at a boundary of the elicitation's
    path; the next process takes over: one human request, one resume, one result for the call."""
    (tmp_path / "note.txt").write_text("old", encoding="utf-8")
    card = _card(DELETE, Sandbox(working_dir=tmp_path))
    tools = {card.id: await list_card_tools(card, pool)}
    crash = Crash(point, nth=2 if point == "effect:SaveCheckpoint" else 1)
    first = await start_process(nats_settings, "executor-1", [card], crash, tools)
    processes.append(first)
    event = run_requested()
    await bus.publish(event)
    (requested,) = await _requests(event_log, event.runid, 1)
    await run_record(bus, event.runid, RunState.WAITING_FOR_HUMAN)
    await _answer(bus, requested, OptionAnswer(option_id="yes"))
    await asyncio.wait_for(crash.crashed.wait(), 60)
    await first.end()
    second = await start_process(nats_settings, "executor-2", [card], card_tools=tools)
    processes.append(second)
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
    assert completed.data["result"] == "deleted note.txt"
    await settled(bus)
    await event_log.caught_up()
    assert [e.data["request_id"] for e in event_log.of_type("human.requested", event.runid)] == [requested.request_id]
    assert len(event_log.of_type("run.resumed", event.runid)) == 1
    assert len(event_log.of_type("run.tool_called", event.runid)) == 1
    assert len(event_log.of_type("run.completed", event.runid)) == 1


# --------------------------------------------------------------------------- kill -9 while the question waits
class _Executor:
    """``python -m temporality_run_executor`` as its own process, killed with SIGKILL."""

    def __init__(self, nats: NatsSettings, agents: Path, logs: Path) -> None:
        self.nats, self.agents, self.logs = nats, agents, logs
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, n: int) -> None:
        ready = self.logs / f"ready-{n}"
        env = {
            **os.environ,
            "TEMPORALITY_NATS_URL": self.nats.url,
            "TEMPORALITY_READY_FILE": str(ready),
            "TEMPORALITY_LOG_FORMAT": "console",
            "TEMPORALITY_EXECUTOR_AGENTS_FILE": str(self.agents),
        }
        log = (self.logs / f"executor-{n}.log").open("wb")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "temporality_run_executor", env=env, stdout=log, stderr=log
        )
        async with asyncio.timeout(120):  # a process start on the shared, loaded machine
            while not ready.exists():
                assert self.proc.returncode is None, f"the executor exited: see {self.logs}"
                await asyncio.sleep(0.1)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await asyncio.wait_for(self.proc.wait(), 60)


async def test_the_question_survives_a_kill_9_of_the_executor(
    bus: Bus, event_log: EventLog, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "note.txt").write_text("old", encoding="utf-8")
    card = {
        "id": "reviewer",
        "role": "Note keeper",
        "system_prompt": "Delete the note.",
        "tools": {"allow": ["notes__delete_note"]},
        "mcp_servers": [{"name": "notes", "command": sys.executable, "args": SERVER.args}],
        "sandbox": {"working_dir": str(work)},
        "provider": {"kind": "scripted", "script": DELETE},
    }
    agents = tmp_path / "agents.yaml"
    agents.write_text(json.dumps({"agents": [card]}), encoding="utf-8")  # JSON is YAML
    executor = _Executor(nats_settings, agents, tmp_path)
    try:
        await executor.start(1)
        event = run_requested()
        await bus.publish(event)
        (requested,) = await _requests(event_log, event.runid, 1)
        await run_record(bus, event.runid, RunState.WAITING_FOR_HUMAN)
        executor.kill()  # kill -9 while the question waits: nothing of the run is in its memory
        assert executor.proc is not None
        await asyncio.wait_for(executor.proc.wait(), 60)
        await executor.start(2)
        await _answer(bus, requested, OptionAnswer(option_id="yes"))
        (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
        assert completed.data["result"] == "deleted note.txt"
        assert not (work / "note.txt").exists()
        await event_log.caught_up()
        assert [e.data["request_id"] for e in event_log.of_type("human.requested", event.runid)] == [
            requested.request_id
        ]
        assert len(event_log.of_type("run.resumed", event.runid)) == 1  # the answer applied once
        assert len(event_log.of_type("run.tool_called", event.runid)) == 1
    finally:
        await executor.stop()
