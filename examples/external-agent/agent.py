"""An external agent for Temporality, written from the published protocol alone.

It uses nothing of Temporality's code: only the subjects and JSON Schemas in ``schemas/`` (see
``schemas/asyncapi.yaml``, channels ``agentsRegister``, ``agentsHeartbeat``, ``agentsDeregister``),
nats-py for the transport and jsonschema to check every body it sends and receives. It

1. registers on ``temporality.rpc.agents.register`` (AP-3) and reads its policy and the negotiated
   protocol version from the reply -- or stops, saying why it was refused;
2. heartbeats on ``temporality.rpc.agents.heartbeat`` (AP-4) ``--beats`` times, every ``--period-s``
   seconds (default: half the interval the reply asks for), alternating ``idle`` and ``busy``;
3. deregisters on ``temporality.rpc.agents.deregister`` (``decommissioned``), also when interrupted.

    python examples/external-agent/agent.py --nats-url nats://127.0.0.1:4222 --beats 3

The agent id must be on agent-collab's allow-list (``config/external-agents.yaml`` lists
``example-agent``). Exit codes: 0 done, 3 registration refused, 4 a heartbeat refused, 5 a reply
that does not match its schema, 6 no reply in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import nats.errors
from jsonschema import Draft202012Validator, ValidationError

log = logging.getLogger("external-agent")

#: The protocol versions this agent speaks, newest first (PRO-3: agent-collab picks the highest common one).
VERSIONS = ["1.0"]
REGISTER = "temporality.rpc.agents.register"
HEARTBEAT = "temporality.rpc.agents.heartbeat"
DEREGISTER = "temporality.rpc.agents.deregister"
_DEFAULT_SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


class ProtocolFailure(Exception):
    """The exchange cannot go on; ``code`` is the process's exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Client:
    """Request/reply on the Agent Protocol's subjects, every body checked against its published schema."""

    def __init__(self, nc: Any, schemas: Path, timeout_s: float) -> None:
        self._nc = nc
        self._timeout_s = timeout_s
        self._validators: dict[str, Draft202012Validator] = {}
        for subject in (REGISTER, HEARTBEAT, DEREGISTER):
            name = subject.removeprefix("temporality.rpc.")
            for kind in ("request", "reply"):
                schema = json.loads((schemas / "rpc" / f"{name}.{kind}.schema.json").read_text(encoding="utf-8"))
                Draft202012Validator.check_schema(schema)
                if schema.get("x-nats-subject") != subject:
                    raise ValueError(f"{name}.{kind}.schema.json is not the schema of {subject}")
                self._validators[f"{subject} {kind}"] = Draft202012Validator(schema)

    async def call(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        self._validators[f"{subject} request"].validate(body)  # our own bug if this fails
        try:
            msg = await self._nc.request(subject, json.dumps(body).encode(), timeout=self._timeout_s)
        except nats.errors.TimeoutError:
            raise ProtocolFailure(6, f"no reply on {subject} within {self._timeout_s}s") from None
        reply: dict[str, Any] = json.loads(msg.data)
        try:
            self._validators[f"{subject} reply"].validate(reply)
        except ValidationError as exc:
            raise ProtocolFailure(5, f"the reply on {subject} does not match its schema: {exc.message}") from None
        return reply


def _now() -> str:
    return datetime.now(UTC).isoformat()


async def run(args: argparse.Namespace) -> int:
    nc = await nats.connect(args.nats_url, name=f"external-agent-{args.agent_id}", connect_timeout=5)
    client = Client(nc, args.schemas, args.timeout_s)
    version: str | None = None
    try:
        reply = await client.call(
            REGISTER,
            {
                "agent_id": args.agent_id,
                "protocol_version": VERSIONS[0],
                "protocol_versions": VERSIONS[1:],
                "provider": "example",
                "model": "rule-based-0",
                "capabilities": ["echo"],
                "supported_tools": ["get_input", "shell"],
                "max_context_size": 16000,
            },
        )
        if reply["outcome"] != "registered":
            refusal = reply["refusal"]
            raise ProtocolFailure(3, f"registration refused ({refusal['reason']}): {refusal['detail']}")
        version = reply["protocol_version"]
        period = args.period_s if args.period_s is not None else reply["heartbeat_interval_s"] / 2
        log.info(
            "registered: version %s, allowed tools %s, heartbeat every %.1fs",
            version,
            reply["policy"]["allowed_tools"],
            period,
        )
        for beat in range(args.beats):
            if beat:
                await asyncio.sleep(period)  # the heartbeat period itself
            state = "busy" if beat % 2 else "idle"
            ack = await client.call(
                HEARTBEAT,
                {
                    "agent_id": args.agent_id,
                    "timestamp": _now(),
                    "current_state": state,
                    "active_run_id": None,
                    "resource_usage": {"beats": float(beat + 1)},
                    "protocol_version": version,
                },
            )
            if not ack["accepted"]:
                refusal = ack["refusal"]
                raise ProtocolFailure(4, f"heartbeat refused ({refusal['reason']}): {refusal['detail']}")
            log.info("heartbeat %d: %s, offline at %s unless another comes", beat + 1, ack["state"], ack["offline_at"])
    except ProtocolFailure as failure:
        log.error("%s", failure)
        return failure.code
    finally:
        if version is not None:
            try:
                done = await client.call(
                    DEREGISTER, {"agent_id": args.agent_id, "protocol_version": version, "reason": "example done"}
                )
                log.info("deregistered: %s", done["state"] or done["refusal"])
            except ProtocolFailure as failure:
                log.error("deregistration failed: %s", failure)
        await nc.drain()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="An external agent speaking Temporality's Agent Protocol.")
    parser.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    parser.add_argument("--agent-id", default="example-agent")
    parser.add_argument("--schemas", type=Path, default=_DEFAULT_SCHEMAS, help="the published schemas/ folder")
    parser.add_argument("--beats", type=int, default=3, help="heartbeats to send before deregistering")
    parser.add_argument("--period-s", type=float, default=None, help="seconds between heartbeats")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="how long to wait for each reply")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
