"""Every service's console script: ``--help`` prints what configures it and touches nothing.

Until 2026-12-06 three of the five scripts (the gateway, the executor, agent-collab) took no notice of their
command line: ``temporality-trigger-gateway --help`` started the service on the default NATS URL and created
the streams and buckets on whatever server answered there. Here each script runs with a real nats-server as
its ``TEMPORALITY_NATS_URL``, whose monitoring counts every client connection ever made to it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from temporality_embedded.natsserver import NatsServer
from temporality_protocol.catalog import SERVICES

SCRIPTS = Path(sys.executable).parent


@pytest.fixture
def watched_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats", monitoring=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _connections_ever(server: NatsServer) -> int:
    with urllib.request.urlopen(f"{server.monitoring_url}/varz", timeout=5) as response:
        return int(json.load(response)["total_connections"])


def _script(service: str, *args: str, server: NatsServer, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPTS / f"temporality-{service}"), *args],
        env={"PATH": "/usr/bin:/bin", "TEMPORALITY_NATS_URL": server.url, "HOME": str(tmp_path)},
        cwd=tmp_path / "cwd",  # a relative triggers file or database is not created here either (checked below)
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_help_prints_the_settings_and_connects_to_nothing(
    service: str, watched_server: NatsServer, tmp_path: Path
) -> None:
    spec = SERVICES[service]
    (tmp_path / "cwd").mkdir()
    done = _script(service, "--help", server=watched_server, tmp_path=tmp_path)

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: temporality-{service} [-h | --help]")
    assert spec.description in done.stdout
    assert "TEMPORALITY_NATS_URL=nats://127.0.0.1:4222" in done.stdout  # the default, not the environment's
    assert f"{spec.env_prefix}" in done.stdout  # the service's own settings are listed
    if service == "journal":  # a service's own commands are in its usage
        assert done.stdout.splitlines()[0].endswith("[rebuild | migrations | downgrade]")
    assert _connections_ever(watched_server) == 0
    assert list((tmp_path / "cwd").iterdir()) == []  # no database, no seeded triggers file


def test_an_unknown_argument_is_refused_before_anything_starts(watched_server: NatsServer, tmp_path: Path) -> None:
    (tmp_path / "cwd").mkdir()
    done = _script("trigger-gateway", "rebuild", server=watched_server, tmp_path=tmp_path)  # the journal's

    assert done.returncode == 2
    assert done.stderr.startswith("usage: temporality-trigger-gateway")
    assert "see --help" in done.stderr
    assert _connections_ever(watched_server) == 0
