"""MCP tool names the model may not be offered as they are (OpenAI: ``^[a-zA-Z0-9_-]{1,64}$``) are mapped to valid
ones, deterministically, and mapped back for the call. A real MCP server (``mcp_odd_names_server.py``) over stdio,
the model behind the OpenAI emulator over real HTTP (which refuses an invalid name with a 400 as the real API does),
the executor as ``__main__`` runs it with its agent API, a real nats-server."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from executor_support import executor_main, run_requested

from temporality_bus import Bus, NatsSettings
from temporality_run_executor.agents import AgentCard, McpServer
from temporality_run_executor.mcp_servers import McpPool, McpToolFailed, list_server_tools, tool_name
from temporality_run_executor.settings import Settings
from temporality_service.auth import ApiToken, Role, dump_tokens
from temporality_testing.events import EventLog
from temporality_testing.inprocess import serving
from temporality_testing.openai_emulator import OpenAIEmulator, assistant_text, assistant_tool_call

ODD = str(Path(__file__).with_name("mcp_odd_names_server.py"))
LONG = "summarize_the_whole_repository_history_" + "x" * 33
VIEWER = ApiToken(name="dashboard", role=Role.viewer, token="viewer-token-0123456789abcdef")
VALID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def test_names_are_mapped_deterministically_to_valid_ones() -> None:
    assert tool_name("notes", "read_note") == "notes__read_note"  # valid already: unchanged
    dotted = tool_name("odd", "read.file")
    assert re.fullmatch(r"odd__read_file_[0-9a-f]{8}", dotted)
    assert tool_name("odd", "read.file") == dotted  # the same on every start
    assert tool_name("odd", "read:file") != dotted  # different originals, different names
    long = tool_name("odd", LONG)
    assert len(f"odd__{LONG}") == 77
    assert len(long) == 64
    assert long.startswith("odd__summarize_the_whole")
    for name in (dotted, long, tool_name("odd", "ünïcode tool"), tool_name("a" * 41, "b" * 200)):
        assert VALID.fullmatch(name), name


def _agents(tmp_path: Path, emulator: OpenAIEmulator, allow: list[str]) -> Path:
    cards = {
        "agents": [
            {
                "id": "odd-agent",
                "role": "Reader",
                "system_prompt": "Read files.",
                "tools": {"allow": allow},
                "provider": {"kind": "openai", "base_url": emulator.base_url, "model": "m", "max_retries": 0},
                "mcp_servers": [{"name": "odd", "command": sys.executable, "args": [ODD]}],
            }
        ]
    }
    agents = tmp_path / "agents.yaml"
    agents.write_text(json.dumps(cards), encoding="utf-8")
    return agents


async def test_a_dotted_and_a_long_tool_name_are_offered_valid_and_called_by_their_own_names(
    bus: Bus, event_log: EventLog, nats_settings: NatsSettings, emulator: OpenAIEmulator, tmp_path: Path
) -> None:
    dotted, long = tool_name("odd", "read.file"), tool_name("odd", LONG)
    emulator.replies += [
        assistant_tool_call("call_read", dotted, {"path": "README.md"}),
        assistant_tool_call("call_long", long, {}),
        assistant_text("done"),
    ]
    tokens = tmp_path / "api-tokens.json"
    tokens.write_text(dump_tokens([VIEWER]), encoding="utf-8")
    ready_file = tmp_path / "ready"
    settings = Settings.model_validate(
        {
            "nats": nats_settings,
            # a card may name a tool by its server's name (odd__read.file) or by the one the model sees
            "agents_file": _agents(tmp_path, emulator, ["get_input", "odd__read.file", long]),
            "port": 0,
            "api": {"tokens_file": tokens},
            "process": {"ready_file": ready_file},
        }
    )
    async with serving(("run-executor", executor_main(settings))):
        url = ready_file.read_text(encoding="utf-8").splitlines()[1].replace("0.0.0.0", "127.0.0.1")
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            viewer = {"Authorization": f"Bearer {VIEWER.token.get_secret_value()}"}
            view = (await http.get("/agents/odd-agent", headers=viewer)).json()
        assert view["tools"] == ["get_input", dotted, long]
        assert view["renamed_tools"] == [
            {"name": dotted, "server": "odd", "tool": "read.file"},
            {"name": long, "server": "odd", "tool": LONG},
        ]

        event = run_requested(agent="odd-agent")
        await bus.publish(event)
        (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
    assert completed.data["result"] == "done"
    offered = [t["function"]["name"] for t in emulator.requests[0]["tools"]]
    assert offered == ["get_input", dotted, long]
    results: dict[str, Any] = {
        m["tool_call_id"]: m["content"] for m in emulator.requests[2]["messages"] if m["role"] == "tool"
    }
    assert results == {
        "call_read": json.dumps({"result": "contents of README.md"}),
        "call_long": json.dumps({"result": "a long story"}),
    }
    await event_log.caught_up()
    called = [e.data["tool"] for e in event_log.of_type("run.tool_called", event.runid)]
    assert called == [dotted, long]


async def test_two_tools_mapped_to_one_name_are_refused_naming_both(tmp_path: Path) -> None:
    dotted = tool_name("odd", "read.file")
    clash = dotted.removeprefix("odd__")  # a tool whose own valid name is what read.file is offered as
    server = McpServer(name="odd", command=sys.executable, args=[ODD], env={"ODD_EXTRA_TOOL": clash})
    card = AgentCard.model_validate(
        {"id": "odd-agent", "role": "r", "system_prompt": "p", "provider": {"kind": "scripted", "script": "reviewer"}}
    ).model_copy(update={"mcp_servers": [server]})
    pool = McpPool()
    try:
        with pytest.raises(McpToolFailed) as failed:
            await list_server_tools(card, server, pool)
    finally:
        await pool.aclose()
    assert str(failed.value) == (
        f"agent odd-agent: mcp_servers odd: its tools 'read.file' and {clash!r} would both be offered as {dotted!r} "
        "(a tool name may hold only A-Z a-z 0-9 _ -, at most 64 characters); rename one in the server"
    )
