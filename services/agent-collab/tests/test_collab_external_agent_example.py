"""``examples/external-agent/agent.py`` -- an agent written from the published schemas only -- against a real
nats-server and agent-collab in-process, with the repository's own allow-list (PRO-5: behavioural interop,
not just matching schemas)."""

from __future__ import annotations

import ast
import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from collab_replicas import StartCollab, collab_replicas

from temporality_bus import Bus, NatsSettings
from temporality_embedded import NatsServer
from temporality_protocol import AgentConformanceChecked, AgentLifecycleChanged, AgentMessageRefused, AgentRegistered
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS
from temporality_testing.events import EventLog
from temporality_testing.tls import TestCA


@pytest.fixture
async def start_agent_collab(nats_settings: NatsSettings) -> AsyncIterator[StartCollab]:
    async with collab_replicas(nats_settings) as start:
        yield start


ROOT = Path(__file__).resolve().parents[3]
AGENT = ROOT / "examples" / "external-agent" / "agent.py"
ALLOWED_IMPORTS = {"nats", "jsonschema", "cryptography"}


def test_the_example_imports_nothing_of_temporality() -> None:
    tree = ast.parse(AGENT.read_text(encoding="utf-8"))
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
    }
    foreign = imported - set(sys.stdlib_module_names) - ALLOWED_IMPORTS - {"__future__"}
    assert not foreign, f"the example must use only the stdlib, nats-py, jsonschema and cryptography, not {foreign}"


async def run_agent(*args: str) -> tuple[int, bytes, bytes]:
    """The example as a subprocess: its exit code, stdout and stderr."""
    agent = await asyncio.create_subprocess_exec(
        sys.executable, str(AGENT), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(agent.communicate(), 20)
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
    assert agent.returncode is not None
    return agent.returncode, out, err


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


async def keygen(path: Path) -> str:
    """``agent.py keygen``: the private key written to ``path``, the allow-list line printed."""
    code, out, err = await run_agent("keygen", "--out", str(path))
    assert code == 0, err.decode()
    assert _mode(path) == 0o600
    line = out.decode().strip()
    assert line.startswith("public_key: ")
    return line.removeprefix("public_key: ")


def signed_allow_list(tmp_path: Path, public_key: str) -> Path:
    path = tmp_path / "external-agents.yaml"
    path.write_text(
        f"agents:\n  - id: example-agent\n    allowed_tools: [get_input]\n    public_key: {public_key}\n",
        encoding="utf-8",
    )
    return path


def development_allow_list(tmp_path: Path) -> Path:
    """The repository's allow-list with ``example-agent`` marked ``allow_unsigned`` (development only: the shipped
    file lists it without a key, and ``temporality up`` gives it one)."""
    allow = yaml.safe_load((ROOT / "config" / "external-agents.yaml").read_text(encoding="utf-8"))
    (example,) = [a for a in allow["agents"] if a["id"] == "example-agent"]
    example["allow_unsigned"] = True
    path = tmp_path / "development-external-agents.yaml"
    path.write_text(yaml.safe_dump(allow), encoding="utf-8")
    return path


async def test_the_repository_s_allow_list_refuses_the_example_agent_unsigned(
    nats_settings: NatsSettings, event_log: EventLog, start_agent_collab: StartCollab
) -> None:
    """AP-11 by default: the shipped file lists ``example-agent`` without a key and nobody as ``allow_unsigned``."""
    await start_agent_collab(ROOT / "config" / "external-agents.yaml")
    code, _out, err = await run_agent("--nats-url", nats_settings.url, "--beats", "1")
    assert code == 3, err.decode()
    assert b"registration refused (unsigned)" in err
    (refused,) = await event_log.wait_for(AgentMessageRefused.EVENT_TYPE, timeout_s=10)
    assert (refused.data["agent_id"], refused.data["reason"]) == ("example-agent", "unsigned")
    await event_log.caught_up()
    assert event_log.of_type(AgentRegistered.EVENT_TYPE) == []


async def test_the_example_agent_registers_heartbeats_and_deregisters(
    nats_settings: NatsSettings, event_log: EventLog, start_agent_collab: StartCollab, tmp_path: Path
) -> None:
    """With the repository's allow-list, ``example-agent`` marked ``allow_unsigned`` (development)."""
    await start_agent_collab(development_allow_list(tmp_path))
    code, _out, err = await run_agent("--nats-url", nats_settings.url, "--beats", "2", "--period-s", "0.2")
    assert code == 0, err.decode()
    assert b"sending unsigned requests" in err
    assert b"registered: version 1.0" in err
    (registered,) = await event_log.wait_for(AgentRegistered.EVENT_TYPE, timeout_s=10)
    assert registered.data["agent_id"] == "example-agent"
    assert registered.data["allowed_tools"] == ["get_input"]  # it supports shell too: not allowed
    changed = await event_log.wait_for(
        AgentLifecycleChanged.EVENT_TYPE, where=lambda e: e.data["to_state"] == "decommissioned", timeout_s=10
    )
    assert changed
    moves = [
        (e.data["seq"], e.data["from_state"], e.data["to_state"])
        for e in event_log.of_type(AgentLifecycleChanged.EVENT_TYPE)
    ]
    # its second heartbeat (busy, 0.2 s after idle) moved the record but is coalesced in the journal (at most one
    # move of the agent's own per TEMPORALITY_COLLAB_LIFECYCLE_COALESCE_S): the journal goes on from idle, seq 3 left out
    assert moves == [
        (1, "created", "registered"),
        (2, "registered", "idle"),
        (4, "idle", "decommissioned"),
    ]
    # agent-collab's first start put the allow-list's grant on record (AP-11), then it registered, then its lifecycle
    types = [e.type for e in event_log.events if e.type.startswith("agent.")]
    assert types[:2] == ["agent.policy_changed", AgentRegistered.EVENT_TYPE]
    # it answered the conformance round its registration reply carried (PRO-2): echo and reverse verified
    (checked,) = await event_log.wait_for(AgentConformanceChecked.EVENT_TYPE, timeout_s=10)
    data = checked.payload(AgentConformanceChecked)
    assert (data.agent_id, data.round, data.passed) == ("example-agent", 1, True)
    assert sorted((r.capability, r.outcome) for r in data.results) == [("echo", "verified"), ("reverse", "verified")]
    assert b"conformance round 1: echo=verified, reverse=verified, triage=no_probe" in err


async def test_the_example_agent_answering_wrongly_is_not_verified(
    nats_settings: NatsSettings, event_log: EventLog, start_agent_collab: StartCollab, tmp_path: Path
) -> None:
    await start_agent_collab(development_allow_list(tmp_path))
    code, _out, err = await run_agent(
        "--nats-url", nats_settings.url, "--beats", "1", "--period-s", "0.2", "--conformance", "wrong"
    )
    assert code == 0, err.decode()
    (checked,) = await event_log.wait_for(AgentConformanceChecked.EVENT_TYPE, timeout_s=10)
    data = checked.payload(AgentConformanceChecked)
    assert (data.agent_id, data.passed) == ("example-agent", False)
    assert sorted((r.capability, r.verified, r.outcome) for r in data.results) == [
        ("echo", False, "wrong_answer"),
        ("reverse", False, "wrong_answer"),
    ]
    assert b"echo=failed, reverse=failed, triage=no_probe" in err


async def test_the_example_agent_signs_with_a_key_from_keygen(
    nats_settings: NatsSettings, event_log: EventLog, start_agent_collab: StartCollab, tmp_path: Path
) -> None:
    """Its own implementation of the signing input, verified by agent-collab (cross-implementation, AP-11)."""
    public_key = await keygen(tmp_path / "agent.key")
    await start_agent_collab(signed_allow_list(tmp_path, public_key))
    code, _out, err = await run_agent(
        "--nats-url", nats_settings.url, "--key-file", str(tmp_path / "agent.key"), "--beats", "2", "--period-s", "0.2"
    )
    assert code == 0, err.decode()
    assert b"unsigned" not in err
    await event_log.wait_for(
        AgentLifecycleChanged.EVENT_TYPE, where=lambda e: e.data["to_state"] == "decommissioned", timeout_s=10
    )
    (checked,) = await event_log.wait_for(AgentConformanceChecked.EVENT_TYPE, timeout_s=10)
    assert checked.data["passed"] is True  # its conformance answers were signed and verified too
    await event_log.caught_up()
    assert event_log.of_type(AgentMessageRefused.EVENT_TYPE) == []
    assert len(event_log.of_type(AgentLifecycleChanged.EVENT_TYPE)) == 3  # the idle -> busy flip coalesced


async def test_the_example_agent_with_another_key_is_refused(
    nats_settings: NatsSettings, event_log: EventLog, start_agent_collab: StartCollab, tmp_path: Path
) -> None:
    listed = await keygen(tmp_path / "listed.key")
    await keygen(tmp_path / "other.key")
    await start_agent_collab(signed_allow_list(tmp_path, listed))
    code, _out, err = await run_agent("--nats-url", nats_settings.url, "--key-file", str(tmp_path / "other.key"))
    assert code == 3, err.decode()
    assert b"registration refused (bad_signature)" in err
    (refused,) = await event_log.wait_for(AgentMessageRefused.EVENT_TYPE, timeout_s=10)
    assert (refused.data["agent_id"], refused.data["reason"]) == ("example-agent", "bad_signature")
    # unsigned, against an allow-list that lists its key: refused too
    code, _out, err = await run_agent("--nats-url", nats_settings.url)
    assert code == 3, err.decode()
    assert b"registration refused (unsigned)" in err
    await event_log.caught_up()
    assert event_log.of_type(AgentRegistered.EVENT_TYPE) == []


async def test_an_unusable_key_file_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "garbage.key").write_text("not a key", encoding="utf-8")
    code, _out, err = await run_agent("--nats-url", "nats://127.0.0.1:1", "--key-file", str(tmp_path / "garbage.key"))
    assert code == 2, err.decode()
    assert b"cannot use the key file" in err


async def test_the_example_agent_checks_agent_collabs_signed_replies(
    nats_settings: NatsSettings, event_log: EventLog, start_agent_collab: StartCollab, tmp_path: Path
) -> None:
    """agent-collab signs every reply with its own key (AP-11); the example checks each one with agent-collab's
    public key in its own code before reading it -- and stops (exit 8) at the first reply the key did not sign."""
    collab_public = await keygen(tmp_path / "collab.key")  # the same Ed25519 PEM agent-collab reads
    agent_public = await keygen(tmp_path / "agent.key")
    await start_agent_collab(signed_allow_list(tmp_path, agent_public), reply_key_file=tmp_path / "collab.key")
    signed = ("--nats-url", nats_settings.url, "--key-file", str(tmp_path / "agent.key"), "--beats", "1")
    code, _out, err = await run_agent(*signed, "--period-s", "0.2", "--collab-public-key", collab_public)
    assert code == 0, err.decode()
    assert b"not checked" not in err
    await event_log.wait_for(
        AgentLifecycleChanged.EVENT_TYPE, where=lambda e: e.data["to_state"] == "decommissioned", timeout_s=10
    )
    # another key's replies: the very first (registration) is refused unread
    code, _out, err = await run_agent(*signed, "--collab-public-key", await keygen(tmp_path / "other.key"))
    assert code == 8, err.decode()
    assert b"signature that does not verify" in err


async def test_the_example_agent_speaks_the_protocol_over_tls(tmp_path: Path) -> None:
    """AP-11: a NATS server that speaks TLS only, its certificate from a CA the test makes. agent-collab and the
    example agent (``--tls-ca``, its own ssl context) both connect over verified TLS, and the agent registers,
    heartbeats and deregisters. (That a client without the CA is refused, never falling back to an unverified or
    plain connection, is ``libs/bus/tests/test_tls.py``'s.)"""
    ca = TestCA.create(tmp_path / "pki")
    server = NatsServer(tmp_path / "nats", tls=ca.issue("nats-server"))
    server.start()
    try:
        settings = NatsSettings(url=server.url, tls_ca_file=ca.ca_file, connect_timeout_s=5)
        async with Bus.connect(settings, name="test-setup") as bus:
            await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
            assert bus.nc._server_info.get("tls_required") is True  # the server really asks for TLS
            log = await EventLog(bus.nc).start()
            async with collab_replicas(settings) as start:
                await start(development_allow_list(tmp_path))
                code, _out, err = await run_agent(
                    "--nats-url", server.url, "--tls-ca", str(ca.ca_file), "--beats", "1", "--period-s", "0.2"
                )
                assert code == 0, err.decode()
                assert b"registered: version 1.0" in err
                await log.wait_for(
                    AgentLifecycleChanged.EVENT_TYPE,
                    where=lambda e: e.data["to_state"] == "decommissioned",
                    timeout_s=10,
                )
                await log.caught_up()
                assert len(log.of_type(AgentRegistered.EVENT_TYPE)) == 1
            await log.stop()
    finally:
        server.stop()


async def test_the_example_agent_gives_up_on_an_unreachable_nats_with_exit_6() -> None:
    """No server there: a few one-line warnings, then exit 6 within ``--connect-within-s`` (nats-py alone retries
    a first connection for two minutes, a traceback per attempt)."""
    with socket.socket() as probe:  # a port nothing listens on: bound, never listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        code, _out, err = await run_agent("--nats-url", f"nats://127.0.0.1:{port}", "--connect-within-s", "2")
    assert code == 6, err.decode()
    assert b"cannot connect to" in err
    assert b"Traceback" not in err
