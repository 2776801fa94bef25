"""An operator decommissions an external agent through agent-collab's HTTP API: the real service in-process on
a real port and a real nats-server; the agent signs its requests (AP-2, AP-11)."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import SecretStr

from temporality_agent_collab.__main__ import SPEC, configure
from temporality_agent_collab.settings import Settings
from temporality_agent_collab.signing import public_key_text, sign
from temporality_bus import Bus, NatsSettings
from temporality_protocol import AgentLifecycleChanged, AgentReadmitted, AgentRegistrationRefused
from temporality_protocol.catalog import (
    RPC_AGENTS_DEREGISTER,
    RPC_AGENTS_HEARTBEAT,
    RPC_AGENTS_REGISTER,
    agent_subject,
)
from temporality_service import ApiAuthSettings, ApiToken, Role, Runtime, run_until
from temporality_service.auth import dump_tokens
from temporality_testing.events import EventLog

WAIT_S = 10.0
KEY = Ed25519PrivateKey.generate()
TOKENS = [
    ApiToken(name="board", role=Role.viewer, token=SecretStr("viewer-token-" + "v" * 24)),
    ApiToken(name="on-call", role=Role.operator, token=SecretStr("operator-token-" + "o" * 24)),
]
VIEWER = {"Authorization": f"Bearer {TOKENS[0].token.get_secret_value()}"}
OPERATOR = {"Authorization": f"Bearer {TOKENS[1].token.get_secret_value()}"}
CHANGED = AgentLifecycleChanged.EVENT_TYPE


@dataclass
class Served:
    url: str


@pytest.fixture
async def collab(nats_settings: NatsSettings, tmp_path: Path) -> AsyncIterator[Served]:
    allow = tmp_path / "external-agents.yaml"
    allow.write_text(
        f"heartbeat_interval_s: 30\nagents:\n  - id: triage-bot\n    public_key: {public_key_text(KEY.public_key())}\n"
        "  - id: quiet-bot\n    allow_unsigned: true\n",
        encoding="utf-8",
    )
    tokens = tmp_path / "api-tokens.json"
    tokens.write_text(dump_tokens(TOKENS), encoding="utf-8")
    settings = Settings(nats=nats_settings, external_agents_file=allow, port=0, api=ApiAuthSettings(tokens_file=tokens))
    setup = configure(settings)
    runtimes: list[Runtime[Settings]] = []

    async def capture(rt: Runtime[Settings]) -> None:
        await setup(rt)
        runtimes.append(rt)

    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run_until(SPEC, settings, capture, stop, ready=ready))
    waiter = asyncio.ensure_future(ready.wait())
    done, _ = await asyncio.wait({waiter, task}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task in done:
        task.result()
    assert ready.is_set(), "agent-collab not ready within 30 s"
    server = runtimes[0].server
    assert server is not None
    try:
        yield Served(url=server.url)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def call(bus: Bus, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    """A request of triage-bot, signed afresh."""
    raw = json.dumps(body).encode()
    subject = agent_subject(subject, "triage-bot")  # its own subjects
    headers = sign(KEY, subject, "triage-bot", raw, timestamp=int(time.time()), nonce=secrets.token_urlsafe(16))
    reply: dict[str, Any] = json.loads((await bus.nc.request(subject, raw, timeout=10, headers=headers)).data)
    return reply


REGISTRATION = {
    "agent_id": "triage-bot",
    "protocol_version": "1.0",
    "provider": "acme",
    "model": "acme-large",
    "max_context_size": 64000,
}


def heartbeat(state: str = "idle") -> dict[str, Any]:
    return {
        "agent_id": "triage-bot",
        "timestamp": "2026-12-01T00:00:00Z",
        "current_state": state,
        "protocol_version": "1.0",
    }


async def test_an_operator_decommissions_an_agent_and_its_later_messages_are_refused(
    bus: Bus, event_log: EventLog, collab: Served
) -> None:
    assert (await call(bus, RPC_AGENTS_REGISTER, REGISTRATION))["outcome"] == "registered"
    assert (await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat("busy")))["accepted"] is True
    async with httpx.AsyncClient(base_url=collab.url, timeout=10) as http:
        listed = await http.get("/agents", headers=VIEWER)
        assert listed.status_code == 200
        assert [(c["agent_id"], c["state"]) for c in listed.json()["agents"]] == [("triage-bot", "busy")]
        assert [c["kind"] for c in listed.json()["agents"]] == ["external"]
        hosted = await http.get("/agents?kind=hosted", headers=VIEWER)
        assert hosted.json() == {"agents": []}  # no run has started here
        assert (await http.get("/agents?kind=robots", headers=VIEWER)).status_code == 422

        done = await http.post("/agents/triage-bot/decommission", headers=OPERATOR, json={"reason": "leaked key"})
        assert done.status_code == 200, done.text
        assert done.json() == {
            "agent_id": "triage-bot",
            "state": "decommissioned",
            "incarnation": 1,
            "changed": True,
            "held_by": "on-call",
        }
        # journaled as a lifecycle move, with who did it and why
        (moved,) = await event_log.wait_for(
            CHANGED, where=lambda e: e.data["to_state"] == "decommissioned", timeout_s=WAIT_S
        )
        data = moved.payload(AgentLifecycleChanged)
        assert (data.from_state, data.reason, data.requested_by, data.detail) == (
            "busy",
            "decommissioned",
            "on-call",
            "leaked key",
        )
        assert moved.actor == "token:on-call"
        again = await http.post("/agents/triage-bot/decommission", headers=OPERATOR, json={})  # idempotent
        assert (again.status_code, again.json()["changed"]) == (200, False)

        # its later messages are refused: a heartbeat, a deregistration, a registration
        late = await call(bus, RPC_AGENTS_HEARTBEAT, heartbeat())
        assert (late["accepted"], late["refusal"]["reason"]) == (False, "not_registered")
        assert "on-call" in late["refusal"]["detail"]
        leave = await call(bus, RPC_AGENTS_DEREGISTER, {"agent_id": "triage-bot", "protocol_version": "1.0"})
        assert (leave["outcome"], leave["refusal"]["reason"]) == ("refused", "not_registered")
        back = await call(bus, RPC_AGENTS_REGISTER, REGISTRATION)
        assert (back["outcome"], back["refusal"]["reason"]) == ("refused", "decommissioned")
        (refused,) = await event_log.wait_for(AgentRegistrationRefused.EVENT_TYPE, timeout_s=WAIT_S)
        assert refused.data["reason"] == "decommissioned"

        # readmitted by an operator, it registers again as a new incarnation
        readmit = await http.post("/agents/triage-bot/readmit", headers=OPERATOR, json={"reason": "new key"})
        assert readmit.status_code == 200, readmit.text
        assert (readmit.json()["changed"], readmit.json()["held_by"]) == (True, None)
        (lifted,) = await event_log.wait_for(AgentReadmitted.EVENT_TYPE, timeout_s=WAIT_S)
        assert (lifted.data["requested_by"], lifted.data["incarnation"], lifted.actor) == (
            "on-call",
            1,
            "token:on-call",
        )
        assert (await http.post("/agents/triage-bot/readmit", headers=OPERATOR, json={})).json()["changed"] is False
    returned = await call(bus, RPC_AGENTS_REGISTER, REGISTRATION)
    assert (returned["outcome"], returned["incarnation"]) == ("registered", 2)
    await event_log.caught_up()
    moves = [(e.data["incarnation"], e.data["to_state"]) for e in event_log.of_type(CHANGED)]
    assert moves == [(1, "registered"), (1, "busy"), (1, "decommissioned"), (2, "registered")]


async def test_the_operator_api_refuses_what_it_cannot_do(bus: Bus, collab: Served) -> None:
    async with httpx.AsyncClient(base_url=collab.url, timeout=10) as http:
        anonymous = await http.post("/agents/triage-bot/decommission")
        assert anonymous.status_code == 401
        viewer = await http.post("/agents/triage-bot/decommission", headers=VIEWER)
        assert viewer.status_code == 403
        unknown = await http.post("/agents/nobody/decommission", headers=OPERATOR, json={})
        assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown_agent")
        assert (await http.post("/agents/nobody/readmit", headers=OPERATOR, json={})).status_code == 404
        bad_id = await http.post("/agents/not%20an%20id/decommission", headers=OPERATOR, json={})
        assert bad_id.status_code == 422
        assert set(bad_id.json()) == {"error", "detail"}
        # an agent that deregistered itself has nothing to take out of service
        assert (await call(bus, RPC_AGENTS_REGISTER, REGISTRATION))["outcome"] == "registered"
        body = {"agent_id": "triage-bot", "protocol_version": "1.0"}
        assert (await call(bus, RPC_AGENTS_DEREGISTER, body))["outcome"] == "decommissioned"
        gone = await http.post("/agents/triage-bot/decommission", headers=OPERATOR, json={})
        assert (gone.status_code, gone.json()["error"]) == (409, "already_decommissioned")
        for bad in (
            b"{not json",
            b'{"reason": 5}',
            b'{"reason": "x", "extra": 1}',
            json.dumps({"reason": "r" * 501}).encode(),
        ):
            refused = await http.post(
                "/agents/triage-bot/decommission",
                headers={**OPERATOR, "Content-Type": "application/json"},
                content=bad,
            )
            assert 400 <= refused.status_code < 500, (bad, refused.text)
            assert set(refused.json()) == {"error", "detail"}
