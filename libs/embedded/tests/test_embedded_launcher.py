"""The embedded launcher takes its services from the catalogue: modules, HTTP port variables, stop order."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from temporality_embedded import SERVICES, ServiceProcess, Stack, StackConfig, cli, stack
from temporality_embedded.stack import STOP_ORDER, check_stop_order, stop_tiers
from temporality_protocol import catalog


def test_the_launcher_s_services_are_the_catalogue_s() -> None:
    assert SERVICES is catalog.SERVICES


@pytest.mark.parametrize("name", list(catalog.SERVICES))
def test_each_service_runs_as_python_m_its_package(name: str, tmp_path: Path) -> None:
    process = ServiceProcess(name, {}, tmp_path)
    package = catalog.SERVICES[name].package
    assert process.command == [sys.executable, "-m", package]
    found = importlib.util.find_spec(package)  # locates the package without importing it
    assert found is not None, f"{package} is not installed"
    assert found.origin is not None
    assert (Path(found.origin).parent / "__main__.py").is_file(), f"{package} has no __main__"


def test_an_unknown_service_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown service 'jornal'"):
        ServiceProcess("jornal", {}, tmp_path)


def test_stop_order_covers_exactly_the_catalogue() -> None:
    check_stop_order()
    assert sorted(STOP_ORDER) == sorted(catalog.SERVICES)
    assert STOP_ORDER[-1] == "journal", "the journal records everyone's goodbyes"


def test_intake_stops_alone_first_the_workers_together_the_journal_alone_last() -> None:
    tiers = stop_tiers()
    assert tiers[0] == ("trigger-gateway",)
    assert tiers[-1] == ("journal",)
    assert sorted(n for tier in tiers for n in tier) == sorted(catalog.SERVICES), "each service in one tier"


@pytest.mark.parametrize(
    ("order", "problem"),
    [
        (STOP_ORDER[:-1], "missing ['journal']"),
        ((*STOP_ORDER, "mailer"), "unknown ['mailer']"),
        ((*STOP_ORDER[:-1], "trigger-gateway"), "repeated ['trigger-gateway']"),
    ],
)
def test_a_stop_order_that_misses_or_invents_a_service_is_refused(order: tuple[str, ...], problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        check_stop_order(order)


def test_a_stack_refuses_to_exist_with_a_stale_stop_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(stack, "STOP_ORDER", STOP_ORDER[:-1])
    with pytest.raises(ValueError, match="missing"):
        Stack(StackConfig(data_dir=tmp_path, config_dir=tmp_path))


def test_default_ports_are_the_catalogue_s() -> None:
    defaults = {f.name: f.default for f in fields(StackConfig)}
    stack_config = Stack(StackConfig(data_dir=Path("."), config_dir=Path(".")))
    for name, spec in catalog.SERVICES.items():
        assert stack_config.http_port(name) == spec.http_port
    assert {defaults[f] for f in ("gateway_port", "human_port", "journal_port")} == {
        s.http_port for s in catalog.SERVICES.values() if s.http_port is not None
    }
    args = cli.build_parser().parse_args(["up"])  # `temporality up`'s flags default to the same ports
    assert (args.gateway_port, args.human_port, args.journal_port) == (
        defaults["gateway_port"],
        defaults["human_port"],
        defaults["journal_port"],
    )


def test_each_service_gets_its_port_variable_and_config(tmp_path: Path) -> None:
    config = StackConfig(data_dir=tmp_path / "data", config_dir=tmp_path / "cfg", gateway_port=18080, human_port=18081, journal_port=18082)  # fmt: skip
    s = Stack(config)
    ports = {"trigger-gateway": 18080, "human-interaction": 18081, "journal": 18082}
    for name, spec in catalog.SERVICES.items():
        env = s.env_for(name)
        port_vars = {k for k in env if k.endswith("_PORT")}
        if name == "agent-collab":  # a worker serving its operator API on a free port (StackConfig.collab_port)
            assert {k: env[k] for k in port_vars} == {"TEMPORALITY_COLLAB_PORT": "0"}
        elif name == "run-executor":  # a worker serving its agent cards on a free port (StackConfig.executor_port)
            assert {k: env[k] for k in port_vars} == {"TEMPORALITY_EXECUTOR_PORT": "0"}
        elif spec.http_port is None:
            assert port_vars == set(), name
        else:
            assert spec.port_env == f"{spec.env_prefix}PORT"
            assert port_vars == {spec.port_env}
            assert env[spec.port_env] == str(ports[name])
        own = {
            k
            for k in env
            if k.startswith("TEMPORALITY_")
            and not k.startswith(("TEMPORALITY_NATS_", "TEMPORALITY_LOG_", "TEMPORALITY_API_"))
        }
        assert all(k.startswith(spec.env_prefix) or k == "TEMPORALITY_DATABASE_URL" for k in own), (name, own)
    assert s.env_for("trigger-gateway")["TEMPORALITY_GATEWAY_TRIGGERS_FILE"] == str(
        (tmp_path / "cfg" / "triggers.yaml").resolve()
    )
    assert s.env_for("human-interaction")["TEMPORALITY_HUMAN_USERS_FILE"].endswith("users.yaml")
    # a chat question cut to fit links to the whole of it in this stack's console
    assert s.env_for("human-interaction")["TEMPORALITY_HUMAN_INBOX_URL"] == f"{s.journal_url}/#/inbox"
    assert s.env_for("run-executor")["TEMPORALITY_EXECUTOR_AGENTS_FILE"].endswith("agents.yaml")
    assert s.env_for("journal")["TEMPORALITY_DATABASE_URL"].startswith("sqlite+aiosqlite:///")
