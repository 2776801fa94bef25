"""NATS authentication by credentials file (operator/JWT mode) and by nkey seed, against a real nats-server:
``TEMPORALITY_NATS_CREDS_FILE`` and ``TEMPORALITY_NATS_NKEY_SEED_FILE`` reach nats-py through the one helper every
connection uses (:meth:`NatsSettings.auth_options` in :meth:`Bus.connect`); set with a user and password, or with
each other, they stop the start naming both; a file nats-py could not use is refused before connecting."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import nkeys  # type: ignore[import-untyped]
import pytest
from pydantic import SecretStr, ValidationError

from temporality_bus import Bus, NatsSettings
from temporality_embedded import NatsServer, dlq
from temporality_embedded.cli import build_parser
from temporality_protocol.catalog import DLQ_STREAM, EVENTS_STREAM
from temporality_testing.nats_auth import NkeyUser, OperatorSetup, new_keypair, nkey_auth_config, nkey_user

CREDS = "TEMPORALITY_NATS_CREDS_FILE"
SEED = "TEMPORALITY_NATS_NKEY_SEED_FILE"


@pytest.fixture
def operator(tmp_path: Path) -> OperatorSetup:
    return OperatorSetup(tmp_path / "operator")


@pytest.fixture
def jwt_server(tmp_path: Path, operator: OperatorSetup) -> Iterator[NatsServer]:
    """A nats-server in operator mode: only users whose JWT an account of the operator signed get in."""
    server = NatsServer(tmp_path / "jwt-nats", config_file=operator.write_config())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nkey_service(tmp_path: Path) -> NkeyUser:
    return nkey_user(tmp_path / "keys", "service")


@pytest.fixture
def nkey_server(tmp_path: Path, nkey_service: NkeyUser) -> Iterator[NatsServer]:
    """A nats-server whose one user is known by its public nkey."""
    config = nkey_auth_config(tmp_path / "nkey-nats.conf", [(nkey_service, None)])
    server = NatsServer(tmp_path / "nkey-nats", config_file=config)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def _round_trip(settings: NatsSettings) -> None:
    """Connect through :meth:`Bus.connect` and use JetStream: make the events stream, store and read an event."""
    async with Bus.connect(settings, name="creds-client") as bus:
        await bus.ensure([EVENTS_STREAM])
        ack = await bus.js.publish("temporality.events.test.ping", b"{}")
        message = await bus.js.get_msg(EVENTS_STREAM.name, ack.seq)
        assert message.data == b"{}"


async def _refused(url: str, **auth: str) -> BaseException:
    """The error of one connection attempt with nats-py's ``auth`` arguments (no retries)."""
    try:
        nc = await nats.connect(url, allow_reconnect=False, connect_timeout=3, max_reconnect_attempts=0, **auth)
    except BaseException as exc:
        return exc
    await nc.close()
    raise AssertionError("the connection was accepted")


async def test_a_credentials_file_connects_to_a_server_in_operator_mode(
    jwt_server: NatsServer, operator: OperatorSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CREDS, str(operator.user_creds("journal")))
    monkeypatch.setenv("TEMPORALITY_NATS_URL", jwt_server.url)
    settings = NatsSettings()  # as a service reads it
    assert settings.auth == "creds"
    await _round_trip(settings)
    assert "Authorization Violation" in str(await _refused(jwt_server.url))  # nobody gets in without
    stranger = operator.user_creds("stranger", signer=new_keypair(nkeys.PREFIX_BYTE_ACCOUNT))
    assert "Authorization Violation" in str(await _refused(jwt_server.url, user_credentials=str(stranger)))


async def test_an_nkey_seed_file_connects_as_the_user_of_that_public_nkey(
    nkey_server: NatsServer, nkey_service: NkeyUser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SEED, str(nkey_service.seed_file))
    monkeypatch.setenv("TEMPORALITY_NATS_URL", nkey_server.url)
    settings = NatsSettings()
    assert settings.auth == "nkey"
    await _round_trip(settings)
    assert "Authorization Violation" in str(await _refused(nkey_server.url))
    other = nkey_user(tmp_path / "other-keys", "other")
    assert "Authorization Violation" in str(await _refused(nkey_server.url, nkeys_seed=str(other.seed_file)))


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"TEMPORALITY_NATS_USER": "journal", "TEMPORALITY_NATS_PASSWORD": "pw", CREDS: "c"}, ("_USER", CREDS)),
        ({"TEMPORALITY_NATS_USER": "journal", SEED: "s"}, ("_USER", SEED)),
        ({CREDS: "c", SEED: "s"}, (CREDS, SEED)),
    ],
)
def test_two_ways_to_authenticate_are_refused_naming_both(
    tmp_path: Path, operator: OperatorSetup, monkeypatch: pytest.MonkeyPatch, given: dict[str, str], named: tuple[str]
) -> None:
    files = {"c": str(operator.user_creds("journal")), "s": str(nkey_user(tmp_path / "k", "journal").seed_file)}
    for key, value in given.items():
        monkeypatch.setenv(key, files.get(value, value))
    with pytest.raises(ValidationError) as refused:
        NatsSettings()
    message = refused.value.errors()[0]["msg"]
    assert "different ways to authenticate to NATS, set only one" in message, message
    for name in named:
        assert name in message, message


def test_empty_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """compose's ``${TEMPORALITY_NATS_CREDS_FILE:-}``, and what ``temporality up`` gives its services."""
    monkeypatch.setenv(CREDS, "")
    monkeypatch.setenv(SEED, "")
    settings = NatsSettings(user="journal", password=SecretStr("pw"))
    assert (settings.creds_file, settings.nkey_seed_file, settings.auth) == (None, None, "password")
    assert settings.auth_options() == {"user": "journal", "password": "pw"}
    assert NatsSettings(user=None).auth_options() == {"user": None, "password": None}


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "cannot read it"),
        ("user: x\npassword: y\n", "not a NATS credentials file (no user JWT"),
        ("-----BEGIN NATS USER JWT-----\na.b.c\n------END NATS USER JWT------\n", "no -----BEGIN USER NKEY SEED"),
        (
            "-----BEGIN NATS USER JWT-----\na.b.c\n------END NATS USER JWT------\n"
            "-----BEGIN USER NKEY SEED-----\nSUNOTASEED\n------END USER NKEY SEED------\n",
            "holds no valid nkey seed",
        ),
    ],
)
def test_a_credentials_file_nats_py_could_not_use_is_refused_at_start(
    tmp_path: Path, content: str | None, said: str
) -> None:
    """nats-py would wait forever for the JWT line of a file without one: the settings refuse it first."""
    path = tmp_path / "service.creds"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ValidationError) as refused:
        NatsSettings(creds_file=path)
    message = refused.value.errors()[0]["msg"]
    assert said in message, message
    assert f"{CREDS} {path}" in message, message


def test_an_nkey_seed_file_must_hold_a_user_seed(tmp_path: Path) -> None:
    account_seed = tmp_path / "account.nk"
    account_seed.write_bytes(bytes(new_keypair(nkeys.PREFIX_BYTE_ACCOUNT).seed))
    with pytest.raises(ValidationError, match="not a user's"):
        NatsSettings(nkey_seed_file=account_seed)
    garbage = tmp_path / "garbage.nk"
    garbage.write_text("not a seed\n", encoding="utf-8")
    with pytest.raises(ValidationError, match="holds no valid nkey seed") as refused:
        NatsSettings(nkey_seed_file=garbage)
    assert "not a seed" not in str(refused.value)  # a file's content is never shown


def test_a_service_with_a_password_and_a_credentials_file_stops_at_start_naming_both(
    tmp_path: Path, operator: OperatorSetup
) -> None:
    """A real service process: ``settings.invalid`` naming both settings (and not the password), exit 2, nothing
    connected."""
    env = {
        "PATH": "/usr/bin:/bin",
        "TEMPORALITY_NATS_URL": "nats://127.0.0.1:1",
        "TEMPORALITY_NATS_USER": "human-interaction",
        "TEMPORALITY_NATS_PASSWORD": "f2-nats-password-kept-out",
        CREDS: str(operator.user_creds("human-interaction")),
        "TEMPORALITY_LOG_FORMAT": "json",
    }
    result = subprocess.run(
        [sys.executable, "-m", "temporality_human_interaction"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "settings.invalid" in output
    assert f"TEMPORALITY_NATS_USER/_PASSWORD and {CREDS} are both set" in output, output
    assert "f2-nats-password-kept-out" not in output  # the error does not show the settings' input


def test_timers_migrate_refuses_both_too(tmp_path: Path, operator: OperatorSetup) -> None:
    """The operator's tool (``temporality timers-migrate``) reads the same settings and says so, exit 2."""
    env = {
        "PATH": "/usr/bin:/bin",
        SEED: str(nkey_user(tmp_path / "k", "timers-migrate").seed_file),
        CREDS: str(operator.user_creds("timers-migrate")),
    }
    script = Path(sys.executable).parent / "temporality"
    result = subprocess.run(
        [str(script), "timers-migrate"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"error: NATS settings: Value error, {CREDS} and {SEED} are both set" in result.stdout, result.stdout


async def test_temporality_dlq_connects_with_the_nkey_seed_file(
    nkey_server: NatsServer, nkey_service: NkeyUser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's dead-letter tool reads the same settings: it lists (none) on the nkey-only server."""
    monkeypatch.setenv(SEED, str(nkey_service.seed_file))
    async with Bus.connect(NatsSettings(url=nkey_server.url), name="layout") as bus:
        await bus.ensure([EVENTS_STREAM, DLQ_STREAM])
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(dlq.main, ["list", "--nats-url", nkey_server.url], out, err)
    assert code == 0, out.getvalue() + err.getvalue()
    monkeypatch.delenv(SEED)
    code = await asyncio.to_thread(dlq.main, ["list", "--nats-url", nkey_server.url], io.StringIO(), io.StringIO())
    assert code != 0  # without it the server refuses


def test_temporality_dlq_on_a_data_dir_uses_the_stacks_user_not_the_shells_files(
    tmp_path: Path, operator: OperatorSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CREDS, str(operator.user_creds("me")))
    data_dir = tmp_path / "up"
    data_dir.mkdir()
    (data_dir / "nats-port").write_text("4999\n", encoding="utf-8")
    (data_dir / "nats-users.json").write_text(json.dumps({"temporality-admin": "pw-of-the-stack"}), encoding="utf-8")
    settings = dlq.settings_for(build_parser().parse_args(["dlq", "list", "--data-dir", str(data_dir)]))
    assert (settings.auth, settings.user, settings.url) == ("password", "temporality-admin", "nats://127.0.0.1:4999")
    settings = dlq.settings_for(build_parser().parse_args(["dlq", "list", "--user", "dlq-operator"]))
    assert (settings.auth, settings.creds_file) == ("password", None)  # the flag over the environment's file
    assert dlq.settings_for(build_parser().parse_args(["dlq", "list"])).auth == "creds"
