"""MCP tools end to end: a real MCP server (the SDK's MCPServer, ``mcp_notes_server.py``) over stdio, its
tools listed into the registry with their schemas, filtered by the card's policy, called by a scripted
run (deterministic) in the card's sandbox (working directory, environment pass-through, network off)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from executor_support import REVIEWER, RunExecutor, executor_main, run_requested
from structlog.testing import capture_logs

from temporality_bus import Bus, NatsSettings
from temporality_embedded.processes import free_port
from temporality_protocol import ToolFailed
from temporality_run_executor import mcp_servers
from temporality_run_executor.__main__ import SPEC, configure
from temporality_run_executor.agents import AgentCard, McpServer, ProviderConfig, Sandbox
from temporality_run_executor.mcp_servers import McpClient, McpPool, McpToolFailed, list_card_tools
from temporality_run_executor.providers.script import Script
from temporality_run_executor.settings import Settings
from temporality_run_executor.tools import ToolPolicy
from temporality_service import ConfigError, run_until
from temporality_testing.events import EventLog
from temporality_testing.inprocess import serving

SERVER = McpServer(name="notes", command=sys.executable, args=[str(Path(__file__).with_name("mcp_notes_server.py"))])
SCRIPT = Script.model_validate(
    {
        "steps": [
            {"id": "who", "call": {"tool": "notes__whoami"}},
            {"id": "read", "call": {"tool": "notes__read_note", "args": {"name": "note.txt"}}},
            {"id": "boom", "call": {"tool": "notes__boom"}},
            {
                "id": "done",
                "answer": "note={{ results.read.result }} cwd={{ results.who.cwd }} secret={{ results.who.secret }} "
                "other={{ results.who.other }} boom={{ results.boom.error }}",
            },
        ]
    }
)


@pytest.fixture
async def pool() -> AsyncIterator[McpPool]:
    pool = McpPool()
    try:
        yield pool
    finally:
        await pool.aclose()


def _card(sandbox: Sandbox) -> AgentCard:
    return REVIEWER.model_copy(
        update={
            "provider": ProviderConfig(kind="scripted", script=SCRIPT),
            "tools": ToolPolicy(allow=["get_input", "notes__*"], deny=["notes__can_connect"]),
            "mcp_servers": [SERVER],
            "sandbox": sandbox,
        }
    )


async def test_a_scripted_run_calls_mcp_tools_in_the_card_s_sandbox(
    bus: Bus,
    event_log: EventLog,
    executor: RunExecutor,
    pool: McpPool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "note.txt").write_text("ship on Friday", encoding="utf-8")
    monkeypatch.setenv("NOTES_SECRET", "passed-through")
    monkeypatch.setenv("NOTES_OTHER", "not-passed")
    card = _card(Sandbox(working_dir=tmp_path, env=["NOTES_SECRET"]))
    listed = await list_card_tools(card, pool)
    assert sorted(t.name for t in listed) == ["notes__boom", "notes__can_connect", "notes__read_note", "notes__whoami"]
    engine = await executor(cards=[card], card_tools={card.id: listed})
    offered = {t.name: t for t in engine.registry(card).offered(card.tools)}
    assert sorted(offered) == ["get_input", "notes__boom", "notes__read_note", "notes__whoami"]  # deny applied
    read_note = offered["notes__read_note"]
    assert read_note.parameters["required"] == ["name"]  # the server's own schema
    assert read_note.argument_problem({}) is not None  # ... which is enforced before the server is called

    event = run_requested()
    await bus.publish(event)
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
    result = completed.data["result"]
    assert "note=ship on Friday" in result
    assert f"cwd={tmp_path}" in result
    assert "secret=passed-through" in result
    assert "other= " in result  # not in the pass-through list: not in the server's environment
    assert "boom=the tool 'notes__boom' failed: McpToolFailed: notes: boom:" in result
    (failed,) = await event_log.wait_for("tool.failed", run_id=event.runid)
    data = failed.payload(ToolFailed)
    assert (data.tool, data.turn, data.call_id) == ("notes__boom", 3, "call-boom")
    assert "the notes disk is gone" in data.error or "Error executing tool boom" in data.error
    await event_log.caught_up()
    tools_called = [e.data["tool"] for e in event_log.of_type("run.tool_called", event.runid)]
    assert tools_called == ["notes__whoami", "notes__read_note", "notes__boom"]


@pytest.fixture
async def listener() -> AsyncIterator[int]:
    """A TCP listener on 127.0.0.1 (its port)."""

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_network_off_means_the_server_cannot_connect(listener: int, pool: McpPool) -> None:
    online = json.loads(await McpClient(SERVER, Sandbox(), pool).call("can_connect", {"port": listener}))
    assert online == {"ok": True}
    offline = json.loads(await McpClient(SERVER, Sandbox(network=False), pool).call("can_connect", {"port": listener}))
    assert offline["ok"] is False
    assert "unreachable" in offline["error"].lower()


async def test_a_server_that_cannot_start_fails_listing_naming_the_agent_and_server(pool: McpPool) -> None:
    broken = SERVER.model_copy(update={"args": ["-c", "import sys; sys.exit(3)"]})
    card = _card(Sandbox()).model_copy(update={"mcp_servers": [broken], "id": "lost"})
    with pytest.raises(McpToolFailed, match=r"agent lost: mcp_servers notes: could not list its tools"):
        await list_card_tools(card, pool)


async def test_a_server_that_exits_at_start_is_reported_with_its_exit_code_and_last_stderr_lines(pool: McpPool) -> None:
    script = "import sys; print('loading config', file=sys.stderr); print('flaky: missing config', file=sys.stderr); sys.exit(3)"
    broken = SERVER.model_copy(update={"args": ["-c", script], "name": "flaky"})
    card = _card(Sandbox()).model_copy(update={"mcp_servers": [broken], "id": "lost"})
    with capture_logs() as logs, pytest.raises(McpToolFailed) as failed:
        await list_card_tools(card, pool)
    assert str(failed.value) == (
        "agent lost: mcp_servers flaky: could not list its tools: exited before it answered initialize; exit code 3; "
        "its last stderr lines: loading config | flaky: missing config"
    )
    stderr = [(e["server"], e["line"]) for e in logs if e["event"] == "mcp.server_stderr"]
    assert stderr == [("flaky", "loading config"), ("flaky", "flaky: missing config")]  # each with the server's name
    (failure,) = [e for e in logs if e["event"] == "mcp.server_failed"]
    assert (failure["server"], failure["exit_code"], failure["log_level"]) == ("flaky", 3, "warning")


async def test_a_server_that_never_answers_initialize_is_reported_in_plain_words(pool: McpPool) -> None:
    script = "import sys, time; print('waiting for a lock', file=sys.stderr, flush=True); time.sleep(600)"
    stuck = SERVER.model_copy(update={"args": ["-c", script], "name": "stuck", "timeout_s": 1.0})
    card = _card(Sandbox()).model_copy(update={"mcp_servers": [stuck], "id": "lost"})
    with capture_logs() as logs:
        with pytest.raises(McpToolFailed) as failed:
            await list_card_tools(card, pool)
        assert str(failed.value).startswith(
            "agent lost: mcp_servers stuck: could not list its tools: did not answer initialize within 1 s"
        )
        assert "its last stderr lines: waiting for a lock" in str(failed.value)
        async with asyncio.timeout(30):  # the session gives up on its own too (the SDK's read timeout), saying why
            while not any(e["event"] == "mcp.session_stopped" for e in logs):  # noqa: ASYNC110 - polling the log
                await asyncio.sleep(0.05)
    (stopped,) = [e for e in logs if e["event"] == "mcp.session_stopped"]
    assert stopped["reason"].startswith("did not answer initialize within 1 s")
    assert "ExceptionGroup" not in stopped["reason"]


def _agents_file(tmp_path: Path, args: list[str]) -> Path:
    (tmp_path / "work").mkdir(exist_ok=True)
    (tmp_path / "work" / "note.txt").write_text("from the service", encoding="utf-8")
    cards = {
        "agents": [
            {
                "id": "reviewer",
                "role": "Note reader",
                "system_prompt": "Read the note.",
                "tools": {"allow": ["notes__read_note"]},
                "mcp_servers": [{"name": "notes", "command": sys.executable, "args": args}],
                "sandbox": {"working_dir": "work"},
                "provider": {
                    "kind": "scripted",
                    "script": {
                        "steps": [
                            {"id": "read", "call": {"tool": "notes__read_note", "args": {"name": "note.txt"}}},
                            {"id": "done", "answer": "{{ results.read.result }}"},
                        ]
                    },
                },
            }
        ]
    }
    path = tmp_path / "agents.yaml"
    path.write_text(json.dumps(cards), encoding="utf-8")  # JSON is YAML
    return path


async def test_the_service_lists_its_cards_mcp_tools_at_start_and_runs_them(
    bus: Bus, event_log: EventLog, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    settings = Settings(nats=nats_settings, agents_file=_agents_file(tmp_path, SERVER.args))
    async with serving(("run-executor", executor_main(settings))):
        event = run_requested()
        await bus.publish(event)
        (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
        assert completed.data["result"] == "from the service"


async def test_a_server_not_listed_at_start_fails_its_calls_until_it_is_listed_again(
    bus: Bus, event_log: EventLog, nats_settings: NatsSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One flaky server does not stop the executor (it used to exit 2, crash-looping every agent): its run's call
    fails as a tool failure naming why, ``/readyz`` says not ready, and once the server can start it is listed again
    (with a backoff) and its tools work."""
    monkeypatch.setattr(mcp_servers, "RELIST_FIRST_S", 0.2)
    monkeypatch.setattr(mcp_servers, "RELIST_MAX_S", 0.4)
    up = tmp_path / "server-can-start"
    server = str(Path(__file__).with_name("mcp_notes_server.py"))
    gate = (
        f"import os, runpy, sys; os.path.exists({str(up)!r}) or sys.exit(3); "
        f"sys.argv = [{server!r}]; runpy.run_path({server!r}, run_name='__main__')"
    )
    port = free_port()
    settings = Settings(nats=nats_settings, agents_file=_agents_file(tmp_path, ["-c", gate]), port=port)
    async with (
        serving(("run-executor", executor_main(settings))),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
        ready = await http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"] == {"mcp servers": "failing"}
        # which agent, which server, and why (bounded, redacted: temporality_service.health)
        detail = ready.json()["detail"]
        assert (
            "mcp servers failing: not listed yet (listed again with a backoff): agent reviewer: mcp server notes: "
            in (detail)
        )
        assert "exit code 3" in detail
        first = run_requested()
        await bus.publish(first)
        (failed,) = await event_log.wait_for("tool.failed", run_id=first.runid, timeout_s=60)
        error = failed.payload(ToolFailed).error
        assert "notes: notes__read_note is not available: agent reviewer: mcp_servers notes: could not list" in error
        await event_log.wait_for("run.completed", run_id=first.runid, timeout_s=60)

        up.write_text("", encoding="utf-8")
        async with asyncio.timeout(60):  # listed again: ready, and the tool is the server's
            while (await http.get("/readyz")).status_code != 200:  # noqa: ASYNC110 - polling the service
                await asyncio.sleep(0.1)
        second = run_requested()
        await bus.publish(second)
        (completed,) = await event_log.wait_for("run.completed", run_id=second.runid, timeout_s=60)
        assert completed.data["result"] == "from the service"
        assert not event_log.of_type("tool.failed", second.runid)


async def test_a_deny_of_a_tool_the_server_does_not_list_is_only_logged(
    bus: Bus, event_log: EventLog, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    """``deny: [notes__delete_note]`` on a server that has no such tool denies nothing: the executor starts (it used to
    exit 2, crash-looping) and says so in a warning naming the file, the agent and the tool."""
    path = _agents_file(tmp_path, SERVER.args)
    path.write_text(
        path.read_text(encoding="utf-8").replace(
            '"allow": ["notes__read_note"]', '"allow": ["notes__read_note"], "deny": ["notes__delete_note"]'
        ),
        "utf-8",
    )
    settings = Settings(nats=nats_settings, agents_file=path)
    with capture_logs() as logs:
        async with serving(("run-executor", executor_main(settings))):
            event = run_requested()
            await bus.publish(event)
            (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
    assert completed.data["result"] == "from the service"
    (warned,) = [entry for entry in logs if entry["event"] == "agents.denied_tool_not_listed"]
    assert warned["file"] == str(path)
    assert warned["agent"] == "reviewer"
    assert warned["tool"] == "notes__delete_note"


@pytest.mark.parametrize(
    ("deny", "meant"),
    [
        ("delete_note", "notes__delete_note"),  # the code review's: the `notes__` prefix forgotten
        ("note__delete_note", "notes__delete_note"),  # a server the card does not have
        ("delete_*", "notes__delete_*"),  # a pattern under no server's prefix
    ],
)
def test_a_deny_entry_under_no_server_s_prefix_stops_the_start_saying_what_it_meant(
    tmp_path: Path, deny: str, meant: str
) -> None:
    """``allow: [notes__*], deny: [delete_note]``: the deny names no tool and never could (the server's tools are all
    ``notes__...``), so ``notes__delete_note`` would be allowed. The start stops, naming the file, the agent, the entry
    and what it could have meant (a ``deny`` under the server's prefix that it does not list is only logged:
    :func:`test_a_deny_of_a_tool_the_server_does_not_list_is_only_logged`)."""
    path = _agents_file(tmp_path, SERVER.args)
    path.write_text(
        path.read_text(encoding="utf-8").replace(
            '"allow": ["notes__read_note"]', f'"allow": ["notes__*"], "deny": ["{deny}"]'
        ),
        "utf-8",
    )
    with pytest.raises(ConfigError) as info:
        configure(Settings(agents_file=path))
    message = str(info.value)
    assert message.startswith(f"{path}: agent reviewer: tools ")
    assert message.endswith(
        f"; {deny!r} in tools.deny denies nothing, so the tool it was meant to deny would be allowed: "
        f"did you mean {meant}?"
    )


def test_an_unknown_built_in_name_stops_the_start_with_the_closest_one(tmp_path: Path) -> None:
    path = _agents_file(tmp_path, SERVER.args)
    path.write_text(
        path.read_text(encoding="utf-8").replace(
            '"allow": ["notes__read_note"]', '"allow": ["notes__*"], "deny": ["ask_humn"]'
        ),
        "utf-8",
    )
    with pytest.raises(ConfigError, match=r"agent reviewer: tools names unknown tools \['ask_humn'\]") as info:
        configure(Settings(agents_file=path))
    assert str(info.value).endswith("did you mean ask_human or notes__ask_humn?")


async def test_the_service_still_refuses_a_tool_name_a_listed_server_does_not_have(
    nats_settings: NatsSettings, tmp_path: Path
) -> None:
    path = _agents_file(tmp_path, SERVER.args)
    path.write_text(path.read_text(encoding="utf-8").replace("notes__read_note", "notes__no_such_tool"), "utf-8")
    settings = Settings(nats=nats_settings, agents_file=path)
    with pytest.raises(ConfigError) as info:
        await asyncio.wait_for(run_until(SPEC, settings, configure(settings), asyncio.Event()), 60)
    assert str(info.value).startswith(
        f"{path}: agent reviewer: tools.allow names notes__no_such_tool, which its MCP servers do not list "
        "(their tools: notes__"
    )
