"""Replies to external agents keep the shape of protocol 1.0's first schemas (AP-10, PRO-3), against a real
nats-server with agent-collab in-process.

Every reply is a closed object (``additionalProperties: false``). A property added to 1.0 later -- the register
and heartbeat replies' ``conformance``, the list reply's ``refusal``, the act reply's ``child_run_id``, a polled
task's ``messages`` -- is left
out when it has nothing to say, never ``null``: a reply that does not concern it validates against the schema the
version had before the property (the published schema without it), and against the current one.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from collab_replicas import StartCollab, collab_replicas
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from temporality_agent_collab.agents import ADDED_IN_1_0
from temporality_agent_collab.gate import omit_null
from temporality_agent_collab.signing import public_key_text, sign
from temporality_bus import Bus, NatsSettings
from temporality_protocol import AgentTask, TaskAssignment, TaskPollReply
from temporality_protocol.catalog import (
    RPC_AGENTS_HEARTBEAT,
    RPC_AGENTS_LIST,
    RPC_AGENTS_REGISTER,
    agent_subject,
)

KEY = Ed25519PrivateKey.generate()
AGENT = "shape-bot"
SCHEMAS = Path(__file__).resolve().parents[3] / "schemas" / "rpc"


@pytest.fixture
async def collab(nats_settings: NatsSettings, tmp_path: Path) -> AsyncIterator[None]:
    path = tmp_path / "external-agents.yaml"
    path.write_text(
        f"heartbeat_interval_s: 30\nagents:\n  - id: {AGENT}\n    allowed_tools: [ask_human]\n"
        f"    public_key: {public_key_text(KEY.public_key())}\n",
        encoding="utf-8",
    )
    start: StartCollab
    async with collab_replicas(nats_settings) as start:
        await start(path)
        yield


async def call(bus: Bus, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    raw = json.dumps(body).encode()
    mine = agent_subject(subject, AGENT)
    headers = sign(KEY, mine, AGENT, raw, timestamp=int(time.time()), nonce=secrets.token_urlsafe(16))
    reply: dict[str, Any] = json.loads((await bus.nc.request(mine, raw, timeout=10, headers=headers)).data)
    return reply


def schemas(operation: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The current reply schema of ``operation`` and the one 1.0 had before its later properties."""
    current: dict[str, Any] = json.loads((SCHEMAS / f"agents.{operation}.reply.schema.json").read_text("utf-8"))
    assert current["additionalProperties"] is False, "a reply is a closed object"
    later = ADDED_IN_1_0.get(operation, frozenset()) | ({"child_run_id"} if operation == "act" else set())
    assert later <= set(current["properties"]), later
    earlier = {**current, "properties": {k: v for k, v in current["properties"].items() if k not in later}}
    return current, earlier


def valid_for_both(operation: str, reply: dict[str, Any]) -> None:
    for schema in schemas(operation):
        jsonschema.validate(reply, schema)


async def test_replies_without_the_later_properties_validate_against_the_earlier_1_0_schemas(
    bus: Bus, collab: None
) -> None:
    registration = {
        "agent_id": AGENT,
        "protocol_version": "1.0",
        "provider": "acme",
        "model": "m",
        "supported_tools": ["ask_human"],
        "max_context_size": 1000,
    }  # no capabilities: no conformance round
    registered = await call(bus, RPC_AGENTS_REGISTER, registration)
    assert registered["outcome"] == "registered", registered
    assert "conformance" not in registered
    assert registered["refusal"] is None, "a property of the first 1.0 schema: present, null"
    valid_for_both("register", registered)

    beat = {
        "agent_id": AGENT,
        "timestamp": datetime.now(UTC).isoformat(),
        "current_state": "idle",
        "protocol_version": "1.0",
    }
    ack = await call(bus, RPC_AGENTS_HEARTBEAT, beat)
    assert ack["accepted"], ack
    assert "conformance" not in ack
    valid_for_both("heartbeat", ack)

    listing = await call(bus, RPC_AGENTS_LIST, {"protocol_versions": ["1.0"]})
    assert [a["agent_id"] for a in listing["agents"]] == [AGENT]
    assert "refusal" not in listing
    valid_for_both("list", listing)

    # with something to say, the later property is there, and the reply is valid for the current schema
    with_round = await call(bus, RPC_AGENTS_REGISTER, {**registration, "capabilities": ["echo"]})
    assert with_round["conformance"]["probes"], with_round
    jsonschema.validate(with_round, schemas("register")[0])


def test_only_null_later_properties_are_left_out() -> None:
    reply = json.dumps({"agent_id": "a", "conformance": None, "refusal": None, "note": "é"}).encode()
    assert json.loads(omit_null(reply, frozenset({"conformance"}))) == {"agent_id": "a", "refusal": None, "note": "é"}
    kept = json.dumps({"conformance": {"round": 1}}).encode()
    assert omit_null(kept, frozenset({"conformance"})) == kept, "a value is never dropped"
    assert omit_null(b"not json", frozenset({"conformance"})) == b"not json"


def test_a_polled_task_without_agent_messages_keeps_its_earlier_1_0_shape() -> None:
    """``TaskAssignment.messages`` (agent messages for an external run, added to 1.0 later) is nested in the poll
    reply: left out of an assignment without messages, so the reply validates against the schema before it."""
    current: dict[str, Any] = json.loads((SCHEMAS / "agents.tasks.reply.schema.json").read_text("utf-8"))
    assignment_schema = current["$defs"]["TaskAssignment"]
    assert assignment_schema["additionalProperties"] is False
    earlier_assignment = {
        **assignment_schema,
        "properties": {k: v for k, v in assignment_schema["properties"].items() if k != "messages"},
    }
    earlier = {**current, "$defs": {**current["$defs"], "TaskAssignment": earlier_assignment}}
    task = AgentTask(
        run_id="run-1",
        task_id="task-1",
        objective="o",
        context={},
        constraints={},
        acceptance_criteria=[],
        timeout_s=60,
        priority="normal",
    )

    def poll_reply(messages: list[str] | None) -> dict[str, Any]:
        assignment = TaskAssignment(task=task, state="working", turn=2, inputs=[], acted=False, messages=messages)
        reply = TaskPollReply(agent_id=AGENT, accepted=True, tasks=[assignment])
        decoded: dict[str, Any] = json.loads(reply.model_dump_json())
        return decoded

    without = poll_reply(None)
    assert "messages" not in without["tasks"][0]
    for schema in (current, earlier):
        jsonschema.validate(without, schema)
    with_messages = poll_reply(["[agent message] type: answer | request_id: req-1 | from: agent:x\n---\nyes"])
    assert with_messages["tasks"][0]["messages"]
    jsonschema.validate(with_messages, current)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(with_messages, earlier)
