"""The deployment files agree with the code: Dockerfile, docker-compose.yml and the Helm chart.

No Docker engine or helm binary is assumed: what can be checked statically is checked here against
the services' pyproject.toml files and docs/service-conventions.md; ``helm lint`` / ``helm template``
and ``docker compose config`` run only when those binaries exist.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import validators

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "temporality"
SERVICES = ("trigger-gateway", "run-executor", "human-interaction", "agent-collab", "journal")
#: HTTP services: port variable and default port (docs/service-conventions.md).
HTTP = {
    "trigger-gateway": ("TEMPORALITY_GATEWAY_PORT", 8080),
    "human-interaction": ("TEMPORALITY_HUMAN_PORT", 8081),
    "journal": ("TEMPORALITY_JOURNAL_PORT", 8082),
}
WORKERS = ("run-executor", "agent-collab")
#: Config files: the variable naming each, and the service reading it.
CONFIG_FILES = {
    "triggers.yaml": ("trigger-gateway", "TEMPORALITY_GATEWAY_TRIGGERS_FILE"),
    "users.yaml": ("human-interaction", "TEMPORALITY_HUMAN_USERS_FILE"),
    "agents.yaml": ("run-executor", "TEMPORALITY_EXECUTOR_AGENTS_FILE"),
}
ENV_NAME = re.compile(r"\bTEMPORALITY_[A-Z0-9_]+\b")


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
    return sorted(p.parent.relative_to(ROOT).as_posix() for p in ROOT.glob("*/*/pyproject.toml"))


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
def test_compose_service_command_is_a_console_script(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    command = service["command"] if isinstance(service["command"], list) else service["command"].split()
    scripts = _console_scripts()
    assert command[0] in scripts, f"{command[0]} is not a [project.scripts] entry of services/*/pyproject.toml"
    assert scripts[command[0]] == name, f"{name} runs {scripts[command[0]]}'s script"


def test_every_console_script_runs_somewhere(compose: dict[str, Any]) -> None:
    commands = {compose["services"][n]["command"][0] for n in SERVICES}
    assert set(_console_scripts()) == commands


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
    assert f":{default_port}/healthz" in check


@pytest.mark.parametrize("name", WORKERS)
def test_compose_worker_is_probed_on_its_ready_file(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    ready = _env(service)["TEMPORALITY_READY_FILE"]
    assert service["healthcheck"]["test"] == ["CMD", "test", "-f", ready]


def test_compose_env_names_are_ones_the_services_read() -> None:
    used = set(ENV_NAME.findall((ROOT / "docker-compose.yml").read_text(encoding="utf-8")))
    assert used
    assert used <= _documented_env(), f"not in docs/service-conventions.md: {sorted(used - _documented_env())}"


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
@pytest.fixture(scope="module")
def dockerfile() -> str:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    return re.sub(r"\\\n\s*", " ", text)  # join continuation lines


def test_dockerfile_base_uv_and_sync(dockerfile: str) -> None:
    assert re.findall(r"^FROM (\S+)", dockerfile, re.M) == ["python:3.11-slim", "python:3.11-slim"]
    assert "pip install --no-cache-dir uv==0.13.9" in dockerfile
    syncs = re.findall(r"uv sync ([^\n]*)", dockerfile)
    assert syncs
    for flags in syncs:
        assert {"--frozen", "--all-packages", "--no-dev"} <= set(flags.split())


def test_dockerfile_runs_as_non_root(dockerfile: str) -> None:
    users = re.findall(r"^USER (\S+)", dockerfile, re.M)
    assert users
    assert users[-1].split(":")[0] not in {"root", "0"}


def test_dockerfile_copies_every_workspace_member_manifest(dockerfile: str) -> None:
    """The dependency layer needs each member's pyproject.toml; a new member must be added to it."""
    members = _workspace_members()
    assert len(members) >= len(SERVICES)
    for member in members:
        assert f"COPY {member}/pyproject.toml {member}/pyproject.toml" in dockerfile, member


def test_dockerignore_keeps_what_the_build_copies() -> None:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    assert patterns[0] == "*", "whitelist: ignore everything, then re-include what the Dockerfile copies"
    for needed in ("!pyproject.toml", "!uv.lock", "!libs/", "!services/"):
        assert needed in patterns
    assert "**/.venv/" in patterns


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
        (("services", "journal", "replica"), 2),
        (("services", "run-executor", "port"), 9000),  # workers have no HTTP port
        (("services", "trigger-gatway"), {"enabled": True, "replicas": 1, "port": 8080}),
        (("services", "journal", "resources", "limit"), {"memory": "1Gi"}),
        (("config", "trigger.yaml"), "triggers: []\n"),
        (("postgres", "existingSecret", "nmae"), "pg"),
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
        (("nats", "url"), "localhost:4222"),
        (("ingress",), {"enabled": True}),  # needs a host
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


def test_chart_has_a_deployment_per_service(values: dict[str, Any]) -> None:
    deployments = (CHART / "templates" / "deployments.yaml").read_text(encoding="utf-8")
    assert "kind: Deployment" in deployments
    assert "range $name, $svc := .Values.services" in deployments
    assert 'command: ["temporality-{{ $name }}"]' in deployments
    assert set(values["services"]) == set(SERVICES)
    scripts = _console_scripts()
    for name in SERVICES:
        assert f"temporality-{name}" in scripts


def test_chart_ports_and_probes(values: dict[str, Any]) -> None:
    deployments = (CHART / "templates" / "deployments.yaml").read_text(encoding="utf-8")
    for name, (variable, port) in HTTP.items():
        assert values["services"][name]["port"] == port
        assert f"- name: {variable}" in deployments
    for name in WORKERS:
        assert "port" not in values["services"][name]
    assert "path: /healthz" in deployments
    assert 'command: ["test", "-f", "/tmp/ready"]' in deployments
    assert deployments.count("value: /tmp/ready") == len(WORKERS)
    assert "terminationGracePeriodSeconds: 30" in deployments
    for file, (_, variable) in CONFIG_FILES.items():
        assert f"- name: {variable}" in deployments
        assert f'{{{{ include "temporality.configDir" $ }}}}/{file}' in deployments
    assert set(values["config"]) == set(CONFIG_FILES)


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


def _helm() -> str:
    helm = shutil.which("helm")
    if helm is None:
        pytest.skip("no helm binary here: `helm lint` and `helm template` are not run (values are checked by schema)")
    return helm


def test_helm_lint() -> None:
    result = subprocess.run([_helm(), "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("extra", [[], ["--set", "postgres.url=postgresql+asyncpg://u:p@db:5432/t"]])
def test_helm_template_renders_five_deployments(extra: list[str]) -> None:
    result = subprocess.run([_helm(), "template", "t", str(CHART), *extra], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert sorted(n for k, n in kinds if k == "Deployment") == sorted(f"t-temporality-{s}" for s in SERVICES)
    assert sorted(n for k, n in kinds if k == "Service") == sorted(f"t-temporality-{s}" for s in HTTP)


def test_chart_default_config_files_load_in_the_services(values: dict[str, Any], tmp_path: Path) -> None:
    """The ConfigMap's defaults are accepted by the loaders the services use at start-up."""
    from temporality_human_interaction.directory import Directory
    from temporality_run_executor.agents import load_agents
    from temporality_trigger_gateway.triggers import parse_triggers

    config = values["config"]
    parse_triggers(yaml.safe_load(config["triggers.yaml"]), source="values.yaml config.triggers.yaml", environ={})
    Directory.from_mapping(yaml.safe_load(config["users.yaml"]), environ={})
    agents = tmp_path / "agents.yaml"
    agents.write_text(config["agents.yaml"], encoding="utf-8")
    load_agents(agents)
