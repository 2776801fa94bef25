"""The test as an external agent: signed Agent Protocol requests on its own subjects (register, heartbeat, poll,
take, act), for the tests that drive agent-collab and the run-executor as real processes without the example
agent in between."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_support import eventually

from temporality_agent_collab.signing import sign
from temporality_bus import Bus
from temporality_protocol.agent_tasks import task_id_for
from temporality_protocol.catalog import (
    RPC_AGENTS_HEARTBEAT,
    RPC_AGENTS_REGISTER,
    RPC_AGENTS_TASKS_ACT,
    RPC_AGENTS_TASKS_POLL,
    agent_subject,
)


@dataclass
class SignedAgent:
    """Agent ``agent_id`` holding ``key`` (its allow-listed public key's private half), granted ``tools``."""

    bus: Bus
    agent_id: str
    key: Ed25519PrivateKey
    tools: list[str]
    session_id: str
    wait_s: float = 45.0

    async def call(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        raw = json.dumps(body).encode()
        mine = agent_subject(subject, self.agent_id)
        headers = sign(self.key, mine, self.agent_id, raw, timestamp=int(time.time()), nonce=secrets.token_urlsafe(16))
        reply: dict[str, Any] = json.loads((await self.bus.nc.request(mine, raw, timeout=10, headers=headers)).data)
        return reply

    async def register(self) -> None:
        """Registered and one heartbeat (idle): agent-collab offers it tasks from here."""
        body = {
            "agent_id": self.agent_id,
            "protocol_version": "1.0",
            "provider": "test",
            "model": "m",
            "supported_tools": self.tools,
            "max_context_size": 1000,
        }
        registered = await self.call(RPC_AGENTS_REGISTER, body)
        assert registered["outcome"] == "registered", registered
        beat = {
            "agent_id": self.agent_id,
            "timestamp": datetime.now(UTC).isoformat(),
            "current_state": "idle",
            "protocol_version": "1.0",
        }
        assert (await self.call(RPC_AGENTS_HEARTBEAT, beat))["accepted"]

    async def tasks(self) -> dict[str, dict[str, Any]]:
        """Poll (takes every offered task): the assignments by run id."""
        poll = {"agent_id": self.agent_id, "protocol_version": "1.0", "session_id": self.session_id}
        reply = await self.call(RPC_AGENTS_TASKS_POLL, poll)
        assert reply["accepted"], reply
        return {t["task"]["run_id"]: t for t in reply["tasks"]}

    async def take(self, run_id: str, turn: int) -> dict[str, Any]:
        """Poll (bounded by ``wait_s``) until the run's task is offered at ``turn``, and so taken."""

        async def offered() -> dict[str, Any] | None:
            task = (await self.tasks()).get(run_id)
            return task if task is not None and task["turn"] == turn and task["state"] == "working" else None

        found: dict[str, Any] = await eventually(offered, self.wait_s, f"turn {turn} of {run_id} offered")
        return found

    async def act(self, run_id: str, turn: int, kind: str, **fields: Any) -> dict[str, Any]:
        """The action ``kind`` for the run's ``turn`` (its id derived from both: a resend is the same action)."""
        task_id = task_id_for(run_id)
        body = {
            "agent_id": self.agent_id,
            "protocol_version": "1.0",
            "task_id": task_id,
            "turn": turn,
            "action_id": f"{task_id}:{turn}:{kind}",
            "kind": kind,
            **fields,
        }
        return await self.call(RPC_AGENTS_TASKS_ACT, body)
