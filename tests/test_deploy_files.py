"""The deployment files agree with the code: Dockerfile, docker-compose.yml and the Helm chart.

No Docker engine or helm binary is assumed: what can be checked statically is checked here against
the service catalogue (``temporality_protocol.catalog.SERVICES``: names, HTTP ports, port variables),
the workspace's pyproject.toml files and docs/service-conventions.md; ``helm lint`` / ``helm template``
and ``docker compose config`` run only when those binaries exist, ``uv export`` when uv does.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import textwrap
import tomllib
from collections.abc import Callable, Iterator
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
import yaml
from jsonschema import validators

from temporality_embedded.cli import nats_authorization
from temporality_embedded.natsserver import NatsServer, password_variable
from temporality_protocol.catalog import SERVICES as CATALOGUE
from temporality_protocol.permissions import service_inbox

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
    assert set(compose["services"]) == {"nats", "postgres", *SERVICES}


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
    assert url == expected


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
    assert f"./{COMPOSE_NATS_AUTH.relative_to(ROOT)}:{config}:ro" in nats["volumes"]
    server_env = _env(nats)
    assert set(server_env) == {password_variable(name) for name in SERVICES}
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
    server = NatsServer(tmp_path / "nats", config_file=COMPOSE_NATS_AUTH)
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


def test_compose_env_names_are_ones_the_services_read() -> None:
    used = set(ENV_NAME.findall((ROOT / "docker-compose.yml").read_text(encoding="utf-8")))
    assert used
    assert used <= _documented_env(), f"not in docs/service-conventions.md: {sorted(used - _documented_env())}"


# --------------------------------------------------------------------------- redaction patterns (SEC-1)
#: The redaction file compose gives every redacting service (``REDACTION_ENV_FILE`` names another one).
COMPOSE_REDACTION_ENV = ROOT / "deploy" / "compose" / "redaction.env"
#: What a service's source does when it redacts with the deployment's patterns.
_REDACTS = re.compile(r"\bprocess_redactor\(|\bREDACT_PATTERNS_ENV\b|\begress_redact_patterns\b")


def _redacting_services() -> set[str]:
    """The services whose own code redacts with ``TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS``, read from the
    source: a service that starts redacting is counted (and must then get the patterns) without editing this."""
    libraries = [
        p.relative_to(ROOT).as_posix()
        for p in ROOT.glob("libs/*/src/**/*.py")
        if p.name != "redaction.py" and _REDACTS.search(p.read_text(encoding="utf-8"))
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
    from temporality_protocol.redaction import REDACT_PATTERNS_ENV, process_redactor

    monkeypatch.setenv(REDACT_PATTERNS_ENV, value)
    process_redactor.cache_clear()
    executor = process_redactor()  # the run-executor checks it at configure, then redacts every question with it
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


def test_docker_compose_config_if_available() -> None:
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("no `docker compose` plugin here; the YAML is checked above instead")
    result = subprocess.run(
        [docker, "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr


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
    assert set(stages) == {"uv", "runtime", *SERVICES, *(f"build-{name}" for name in SERVICES)}


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


@pytest.mark.parametrize("name", SERVICES)
def test_each_image_gets_only_its_service_and_the_libs_it_needs(name: str) -> None:
    """What the build stage's `uv sync --package` installs, read from the lock file: no other service."""
    command = [_uv(), "export", "--frozen", "--no-dev", "--package", CATALOGUE[name].distribution, "--no-hashes"]
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
    broken = deepcopy(values)
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    errors = _validate(values_schema, broken)
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
    broken = deepcopy(values)
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert _validate(values_schema, broken)


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


def test_helm_lint() -> None:
    report = _helm().lint(CHART, strict=True)
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
        assert volume["secret"] == {"secretName": "nats-ca", "defaultMode": 0o400}
    plain = _deployments()["journal"]["spec"]["template"]["spec"]["containers"][0]
    assert not {e["name"] for e in plain["env"]} & {"TEMPORALITY_NATS_USER", "TEMPORALITY_NATS_TLS_CA_FILE"}


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
