"""The examples read the NATS settings the services read: ``TEMPORALITY_NATS_CREDS_FILE`` (a credentials file, a
NATS in operator/JWT mode) and ``TEMPORALITY_NATS_NKEY_SEED_FILE`` (an nkey user's seed), against real
nats-servers that know no password (docs/operations.md, "A NATS without passwords").

- ``examples/journal-subscriber/subscriber.py`` handles an event as the nkey user and as the JWT user, is refused
  (exit 3) without them, and refuses two ways to authenticate at once (exit 2);
- ``examples/external-agent/agent.py`` connects with a credentials file: its register request reaches the server
  (no agent-collab here, so it then gives up waiting for the reply), and refuses a user in the URL besides it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from temporality_bus import Bus, NatsSettings
from temporality_embedded.natsserver import NatsServer
from temporality_protocol.catalog import EVENTS_STREAM
from temporality_testing.nats_auth import NkeyUser, OperatorSetup, nkey_auth_config, nkey_user

ROOT = Path(__file__).resolve().parents[1]
SUBSCRIBER = ROOT / "examples" / "journal-subscriber" / "subscriber.py"
AGENT = ROOT / "examples" / "external-agent" / "agent.py"
CREDS = "TEMPORALITY_NATS_CREDS_FILE"
SEED = "TEMPORALITY_NATS_NKEY_SEED_FILE"
WITHIN_S = 30


@pytest.fixture
def operator(tmp_path: Path) -> OperatorSetup:
    return OperatorSetup(tmp_path / "operator")


@pytest.fixture
def jwt_server(tmp_path: Path, operator: OperatorSetup) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "jwt-nats", config_file=operator.write_config())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nkey_client(tmp_path: Path) -> NkeyUser:
    return nkey_user(tmp_path / "keys", "subscriber")


@pytest.fixture
def nkey_server(tmp_path: Path, nkey_client: NkeyUser) -> Iterator[NatsServer]:
    config = nkey_auth_config(tmp_path / "nkey-nats.conf", [(nkey_client, None)])
    server = NatsServer(tmp_path / "nkey-nats", config_file=config)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _env(**given: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (CREDS, SEED)}
    return env | given


async def _publish_event(settings: NatsSettings) -> str:
    """The events stream, with one ``run.completed`` CloudEvent on it; its id."""
    event_id = f"evt-{uuid.uuid4().hex}"
    body = {"specversion": "1.0", "id": event_id, "type": "run.completed", "source": "test", "runid": "run-x"}
    async with Bus.connect(settings, name="example-test") as bus:
        await bus.ensure([EVENTS_STREAM])
        await bus.js.publish("temporality.events.run.completed", json.dumps(body).encode())
    return event_id


async def _subscriber(url: str, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SUBSCRIBER),
        "--nats-url",
        url,
        "--max-events",
        "1",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(WITHIN_S):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_subscriber_reads_an_nkey_seed_file(nkey_server: NatsServer, nkey_client: NkeyUser) -> None:
    event_id = await _publish_event(NatsSettings(url=nkey_server.url, nkey_seed_file=nkey_client.seed_file))
    code, out, err = await _subscriber(nkey_server.url, _env(**{SEED: str(nkey_client.seed_file)}))
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["id"] == event_id
    code, _, err = await _subscriber(nkey_server.url, _env())  # no credentials: refused, not retried
    assert code == 3, err
    assert "refused the credentials" in err
    assert "--nkey-seed-file" in err


async def test_the_subscriber_reads_a_credentials_file(jwt_server: NatsServer, operator: OperatorSetup) -> None:
    creds = operator.user_creds("subscriber")
    event_id = await _publish_event(NatsSettings(url=jwt_server.url, creds_file=creds))
    code, out, err = await _subscriber(jwt_server.url, _env(**{CREDS: str(creds), SEED: ""}))  # empty: unset
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["id"] == event_id
    code, _, err = await _subscriber(jwt_server.url, _env(**{CREDS: str(creds)}), "--user", "sub-example")
    assert code == 2
    assert "--user and --creds-file: give one way to authenticate to NATS" in err


async def test_the_external_agent_reads_a_credentials_file(jwt_server: NatsServer, operator: OperatorSetup) -> None:
    creds = operator.user_creds("example-agent")
    watcher = await nats.connect(jwt_server.url, user_credentials=str(operator.user_creds("watcher")))
    try:
        asked = await watcher.subscribe("temporality.rpc.agents.example-agent.register", max_msgs=1)
        await watcher.flush()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(AGENT),
            "--nats-url",
            jwt_server.url,
            "--timeout-s",
            "1",
            env=_env(**{CREDS: str(creds)}),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            request = await asyncio.wait_for(asked.next_msg(timeout=WITHIN_S), WITHIN_S + 1)
            assert json.loads(request.data)["agent_id"] == "example-agent"
            async with asyncio.timeout(WITHIN_S):
                _, err = await process.communicate()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode == 6, err.decode()  # connected; nobody answers its registration here
        assert "cannot connect" not in err.decode()
    finally:
        await watcher.close()
    refused = await asyncio.create_subprocess_exec(
        sys.executable,
        str(AGENT),
        "--nats-url",
        jwt_server.url.replace("nats://", "nats://example-agent:pw@", 1),
        env=_env(**{CREDS: str(creds)}),
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(WITHIN_S):
        _, err = await refused.communicate()
    assert refused.returncode == 2
    assert "a user in --nats-url and --creds-file: give one way to authenticate to NATS" in err.decode()
