"""``examples/external-agent/agent.py`` -- an agent written from the published schemas only -- against a real
nats-server and agent-collab in-process, with the repository's own allow-list (PRO-5: behavioural interop,
not just matching schemas)."""

from __future__ import annotations

import ast
import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from collab_replicas import StartCollab, collab_replicas

from temporality_bus import NatsSettings
from temporality_protocol import AgentLifecycleChanged, AgentRegistered
from temporality_testing.events import EventLog


@pytest.fixture
async def start_agent_collab(nats_settings: NatsSettings) -> AsyncIterator[StartCollab]:
    async with collab_replicas(nats_settings) as start:
        yield start


ROOT = Path(__file__).resolve().parents[3]
AGENT = ROOT / "examples" / "external-agent" / "agent.py"
ALLOWED_IMPORTS = {"nats", "jsonschema"}


def test_the_example_imports_nothing_of_temporality() -> None:
    tree = ast.parse(AGENT.read_text(encoding="utf-8"))
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
    }
    foreign = imported - set(sys.stdlib_module_names) - ALLOWED_IMPORTS - {"__future__"}
    assert not foreign, f"the example must use only the stdlib, nats-py and jsonschema, not {foreign}"


async def test_the_example_agent_registers_heartbeats_and_deregisters(
    nats_settings: NatsSettings, event_log: EventLog, start_agent_collab: StartCollab
) -> None:
    await start_agent_collab(ROOT / "config" / "external-agents.yaml")
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        str(AGENT),
        "--nats-url",
        nats_settings.url,
        "--beats",
        "2",
        "--period-s",
        "0.2",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _out, err = await asyncio.wait_for(agent.communicate(), 20)
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
    assert agent.returncode == 0, err.decode()
    assert b"registered: version 1.0" in err
    (registered,) = await event_log.wait_for(AgentRegistered.EVENT_TYPE, timeout_s=10)
    assert registered.data["agent_id"] == "example-agent"
    assert registered.data["allowed_tools"] == ["get_input"]  # it supports shell too: not allowed
    changed = await event_log.wait_for(
        AgentLifecycleChanged.EVENT_TYPE, where=lambda e: e.data["to_state"] == "decommissioned", timeout_s=10
    )
    assert changed
    moves = [(e.data["from_state"], e.data["to_state"]) for e in event_log.of_type(AgentLifecycleChanged.EVENT_TYPE)]
    assert moves == [
        ("created", "registered"),
        ("registered", "idle"),
        ("idle", "busy"),
        ("busy", "decommissioned"),
    ]
    # registered first, then its lifecycle
    types = [e.type for e in event_log.events if e.type.startswith("agent.")]
    assert types[0] == AgentRegistered.EVENT_TYPE
