"""Long-lived MCP sessions (:class:`McpPool`) with the real local MCP server (``mcp_notes_server.py``): one
server process serves many calls and runs, a dead server is replaced, idle sessions and shutdown stop
their servers, calls on one session are concurrent up to a bound, the listing follows
``tools/list_changed``, and elicitation fails the call instead of hanging."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from executor_support import REVIEWER, RunExecutor, executor_main, run_requested

from temporality_bus import Bus, NatsSettings
from temporality_protocol import ToolFailed
from temporality_run_executor.agents import AgentCard, McpServer, ProviderConfig, Sandbox
from temporality_run_executor.mcp_servers import (
    McpClient,
    McpPool,
    McpToolFailed,
    list_card_tools,
)
from temporality_run_executor.providers.script import Script
from temporality_run_executor.records import ElicitAnswer
from temporality_run_executor.settings import Settings
from temporality_run_executor.tools import ElicitationNeeded, ToolPolicy
from temporality_testing.events import EventLog
from temporality_testing.inprocess import serving

SERVER = McpServer(
    name="notes",
    command=sys.executable,
    args=[str(Path(__file__).with_name("mcp_notes_server.py")), "--session-tools"],
)


@pytest.fixture
async def pool() -> AsyncIterator[McpPool]:
    pool = McpPool()
    try:
        yield pool
    finally:
        await pool.aclose()


async def until(check: Callable[[], bool | Awaitable[bool]], what: str, timeout_s: float = 30.0) -> None:
    """Wait until ``check`` holds (polled), failing after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        held = check()
        if not isinstance(held, bool):
            held = await held
        if held:
            return
        if loop.time() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s")
        await asyncio.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def stats(client: McpClient) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(await client.call("stats", {}))
    return result


async def test_calls_reuse_one_server_process(pool: McpPool) -> None:
    client = McpClient(SERVER, Sandbox(), pool)
    first, second = await stats(client), await stats(client)
    assert second["pid"] == first["pid"]
    assert (first["calls"], second["calls"]) == (0, 1)  # the same process counted both
    assert pool.live(SERVER, Sandbox())
    assert pool.running == 1
    other = await stats(McpClient(SERVER, Sandbox(network=False), pool))  # another sandbox: its own process
    assert other["pid"] != first["pid"]
    assert pool.running == 2


async def test_a_killed_server_is_replaced_on_the_next_call(pool: McpPool) -> None:
    client = McpClient(SERVER, Sandbox(), pool)
    before = await stats(client)
    os.kill(before["pid"], signal.SIGKILL)
    await until(lambda: not pool.live(SERVER, Sandbox()), "the dead session retired")
    after = await stats(client)
    assert after["pid"] != before["pid"]
    assert after["calls"] == 0  # a fresh process
    await until(lambda: not alive(before["pid"]), "the killed server reaped")


async def test_a_call_in_flight_when_the_server_dies_fails_and_the_next_one_works(pool: McpPool) -> None:
    client = McpClient(SERVER, Sandbox(), pool)
    before = await stats(client)
    with pytest.raises(McpToolFailed, match=r"notes: could not run die: MCPError: .*the server exited"):
        await client.call("die", {})
    after = await stats(client)
    assert after["pid"] != before["pid"]


async def test_an_idle_session_is_closed_and_started_again_on_the_next_call() -> None:
    pool = McpPool(idle_s=0.3)
    try:
        client = McpClient(SERVER, Sandbox(), pool)
        first = await stats(client)
        await until(lambda: pool.running == 0, "the idle session closed")
        assert not alive(first["pid"])  # its task ends only once the server is stopped and reaped
        again = await stats(client)
        assert again["pid"] != first["pid"]
        assert again["calls"] == 0
    finally:
        await pool.aclose()


async def test_closing_the_pool_stops_every_server_and_refuses_calls() -> None:
    pool = McpPool()
    online, offline = McpClient(SERVER, Sandbox(), pool), McpClient(SERVER, Sandbox(network=False), pool)
    pids = [(await stats(online))["pid"], (await stats(offline))["pid"]]
    assert all(alive(pid) for pid in pids)
    await pool.aclose()
    assert pool.running == 0
    assert [alive(pid) for pid in pids] == [False, False]  # stopped and reaped before aclose returned
    with pytest.raises(McpToolFailed, match="shutting down"):
        await online.call("stats", {})


async def test_calls_on_one_session_run_concurrently_up_to_the_bound() -> None:
    for max_calls, met in ((2, True), (1, False)):
        pool = McpPool(max_calls=max_calls)
        try:
            client = McpClient(SERVER, Sandbox(), pool)
            meet = [client.call("rendezvous", {"n": 2, "wait_s": 1.5 if not met else 30}) for _ in range(2)]
            results = [json.loads(r) for r in await asyncio.gather(*meet)]
            assert [r["met"] for r in results] == [met, met], max_calls
            assert len({r["pid"] for r in results}) == 1
            assert (await stats(client))["max_in_flight"] == max_calls
        finally:
            await pool.aclose()


async def test_the_listing_is_cached_and_follows_tools_list_changed(pool: McpPool) -> None:
    client = McpClient(SERVER, Sandbox(), pool)

    async def names() -> set[str]:
        return {t.name for t in await client.list_tools()}

    assert "extra" not in await names()
    assert json.loads(await client.call("add_extra", {})) == {"result": "added"}
    await until(lambda: _has(names(), "extra"), "the new tool listed after tools/list_changed")
    assert await client.call("extra", {}) == "extra"


async def _has(names: Awaitable[set[str]], name: str) -> bool:
    return name in await names


async def test_an_elicitation_is_told_cancel_and_the_call_asks_for_the_answer(pool: McpPool) -> None:
    client = McpClient(SERVER, Sandbox(), pool)
    with pytest.raises(ElicitationNeeded) as needed:
        await client.call("ask", {})
    assert (needed.value.message, needed.value.position) == ("Keep the note?", 0)
    schema = needed.value.requested_schema
    assert schema["properties"]["keep"]["type"] == "boolean"
    assert (await stats(client))["calls"] == 0  # the session is still good
    accepted = ElicitAnswer(message="Keep the note?", requested_schema=schema, action="accept", content={"keep": True})
    assert json.loads(await client.call("ask", {}, (accepted,))) == {"result": "answered: accept"}
    declined = accepted.model_copy(update={"action": "decline", "content": None})
    assert json.loads(await client.call("ask", {}, (declined,))) == {"result": "answered: decline"}
    other = accepted.model_copy(update={"message": "Keep another note?"})
    with pytest.raises(ElicitationNeeded):  # a recorded answer to another question does not answer this one
        await client.call("ask", {}, (other,))


@pytest.mark.parametrize("protocol", ["handshake", "auto"])
async def test_a_resolver_s_question_is_answered_from_the_record_on_either_protocol(protocol: str) -> None:
    """``auto`` opens an MCP 2026-07-28 session: the server asks in an ``input_required`` result (no back-channel:
    its ``ctx.elicit`` cannot even send ``elicitation/create``); ``handshake``: with ``elicitation/create``."""
    pool = McpPool()
    try:
        server = SERVER.model_copy(update={"args": [*SERVER.args, "--elicit-tools"], "protocol": protocol})
        client = McpClient(server, Sandbox(), pool)
        with pytest.raises(ElicitationNeeded) as needed:
            await client.call("purge", {"name": "a.txt"})
        assert (needed.value.message, needed.value.position) == ("Purge the note a.txt?", 0)
        schema = needed.value.requested_schema
        yes = ElicitAnswer(
            message="Purge the note a.txt?", requested_schema=schema, action="accept", content={"confirm": True}
        )
        assert json.loads(await client.call("purge", {"name": "a.txt"}, (yes,))) == {"result": "purged a.txt"}
        no = yes.model_copy(update={"action": "decline", "content": None})
        assert json.loads(await client.call("purge", {"name": "a.txt"}, (no,))) == {"result": "not purged: decline"}
        if protocol == "auto":
            with pytest.raises(McpToolFailed, match="no back-channel for server-initiated requests"):
                await client.call("ask", {})
    finally:
        await pool.aclose()


async def test_elicitations_of_calls_in_flight_together_cannot_be_told_apart_and_fail(pool: McpPool) -> None:
    client = McpClient(SERVER, Sandbox(), pool)
    results = await asyncio.gather(client.call("ask", {}), client.call("ask", {}), return_exceptions=True)
    for result in results:
        assert isinstance(result, McpToolFailed), result
        assert "calls were in flight on its session, which cannot be answered; call it again" in str(result)
    with pytest.raises(ElicitationNeeded):  # alone, it is tied to its call again
        await client.call("ask", {})


def _card(script: dict[str, Any], card_id: str = "reviewer") -> AgentCard:
    return REVIEWER.model_copy(
        update={
            "id": card_id,
            "provider": ProviderConfig(kind="scripted", script=Script.model_validate(script)),
            "tools": ToolPolicy(allow=["notes__*"]),
            "mcp_servers": [SERVER],
        }
    )


async def test_a_run_survives_its_server_dying_mid_call(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool
) -> None:
    card = _card(
        {
            "steps": [
                {"id": "first", "call": {"tool": "notes__stats"}},
                {"id": "die", "call": {"tool": "notes__die"}},
                {"id": "second", "call": {"tool": "notes__stats"}},
                {
                    "id": "done",
                    "answer": "{{ results.first.pid }} {{ results.second.pid }} {{ results.second.calls }}",
                },
            ]
        }
    )
    await executor(cards=[card], card_tools={card.id: await list_card_tools(card, pool)})
    event = run_requested()
    await bus.publish(event)
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
    first, second, calls = completed.data["result"].split()
    assert first != second
    assert calls == "0"
    (failed,) = await event_log.wait_for("tool.failed", run_id=event.runid)
    data = failed.payload(ToolFailed)
    assert data.tool == "notes__die"
    assert "the server exited" in data.error


async def test_two_runs_call_one_session_concurrently(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool
) -> None:
    card = _card(
        {
            "steps": [
                {"id": "meet", "call": {"tool": "notes__rendezvous", "args": {"n": 2, "wait_s": 45}}},
                {"id": "done", "answer": "{{ results.meet.met }} {{ results.meet.pid }}"},
            ]
        }
    )
    listed = await list_card_tools(card, pool)
    await executor(cards=[card], card_tools={card.id: listed})
    events = [run_requested(), run_requested()]
    for event in events:
        await bus.publish(event)
    results = []
    for event in events:
        (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
        results.append(completed.data["result"].split())
    assert [met for met, _ in results] == ["true", "true"]  # both calls were in the server at once
    assert len({pid for _, pid in results}) == 1  # ... the one process listing started
    assert pool.running == 1


async def test_the_service_stops_its_mcp_servers_at_shutdown(
    bus: Bus, event_log: EventLog, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    cards = {
        "agents": [
            {
                "id": "reviewer",
                "role": "Stats reader",
                "system_prompt": "Read the stats.",
                "tools": {"allow": ["notes__stats"]},
                "mcp_servers": [{"name": "notes", "command": sys.executable, "args": SERVER.args}],
                "provider": {
                    "kind": "scripted",
                    "script": {
                        "steps": [
                            {"id": "stats", "call": {"tool": "notes__stats"}},
                            {"id": "done", "answer": "{{ results.stats.pid }} {{ results.stats.calls }}"},
                        ]
                    },
                },
            }
        ]
    }
    agents_file = tmp_path / "agents.yaml"
    agents_file.write_text(json.dumps(cards), encoding="utf-8")  # JSON is YAML
    settings = Settings(nats=nats_settings, agents_file=agents_file)
    async with serving(("run-executor", executor_main(settings))):
        event = run_requested()
        await bus.publish(event)
        (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
        pid, calls = (int(part) for part in completed.data["result"].split())
        assert calls == 0
        assert alive(pid)
    assert not alive(pid)  # the executor stopped it on its way out


async def test_closing_the_pool_while_a_server_is_still_starting_stops_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = "import os, pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); time.sleep(600)"
    mute = SERVER.model_copy(update={"args": ["-c", code, str(pid_file)], "timeout_s": 600})  # never initializes
    pool = McpPool()
    call = asyncio.create_task(McpClient(mute, Sandbox(), pool).call("stats", {}))
    await until(lambda: pid_file.exists() and pid_file.read_text() != "", "the server started")
    pid = int(pid_file.read_text())
    await pool.aclose()
    assert not alive(pid)
    with pytest.raises(McpToolFailed, match="before it was ready"):
        await call
