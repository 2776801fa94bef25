"""A real Synapse homeserver for tests (PyPI ``matrix-synapse``), started as a subprocess on 127.0.0.1.

What TEST-PEERS.md found works here: ``python -m synapse.app.homeserver -c homeserver.yaml`` with a
config written per run — SQLite, one ``client`` listener on a free 127.0.0.1 port, no federation,
open registration without verification, bcrypt rounds 4, presence off, and **every** ``rc_*`` rate
limit raised (with the defaults nio silently sleeps ~4.5 s per 429: slow tests, not red ones). Ready
when ``GET /_matrix/client/versions`` answers 200 (1-3 s cold). Users are registered through open
registration (``m.login.dummy``). Stopped by its pid (SIGTERM, then SIGKILL after a grace period).

Usage::

    with Synapse(tmp_dir) as hs:        # or hs.start() / hs.stop()
        alice = hs.register("alice", "secret-pass")   # -> MatrixAccount(user_id, access_token, password)
        hs.url                                        # http://127.0.0.1:PORT

``synapse_available()`` says whether the package is importable, so a fixture can skip visibly.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import yaml

from temporality_embedded.processes import free_port

__all__ = ["MatrixAccount", "Synapse", "SynapseError", "homeserver_config", "synapse_available"]

SERVER_NAME = "localhost"
_UNLIMITED = {"per_second": 1000, "burst_count": 1000}


class SynapseError(RuntimeError):
    """Synapse did not start (the message carries the tail of its log) or refused a registration."""


@dataclass(frozen=True)
class MatrixAccount:
    user_id: str
    access_token: str
    password: str
    device_id: str | None = None


def synapse_available() -> bool:
    return importlib.util.find_spec("synapse") is not None


def homeserver_config(data_dir: Path, port: int) -> dict[str, Any]:
    """The ``homeserver.yaml`` for a throwaway test server in ``data_dir`` listening on ``port``."""
    return {
        "server_name": SERVER_NAME,
        "pid_file": str(data_dir / "homeserver.pid"),
        "listeners": [
            {
                "port": port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "x_forwarded": False,
                "resources": [{"names": ["client"], "compress": False}],
            }
        ],
        "database": {"name": "sqlite3", "args": {"database": str(data_dir / "homeserver.db")}},
        "media_store_path": str(data_dir / "media"),
        "signing_key_path": str(data_dir / "signing.key"),
        "registration_shared_secret": "temporality-test-registration-secret",
        "macaroon_secret_key": "temporality-test-macaroon-secret",
        "form_secret": "temporality-test-form-secret",
        "report_stats": False,
        "enable_registration": True,
        "enable_registration_without_verification": True,
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "federation_domain_whitelist": [],
        "bcrypt_rounds": 4,
        "presence": {"enabled": False},
        "rc_message": _UNLIMITED,
        "rc_registration": _UNLIMITED,
        "rc_login": {"address": _UNLIMITED, "account": _UNLIMITED, "failed_attempts": _UNLIMITED},
        "rc_joins": {"local": _UNLIMITED, "remote": _UNLIMITED},
        "rc_joins_per_room": _UNLIMITED,
        "rc_invites": {"per_room": _UNLIMITED, "per_user": _UNLIMITED, "per_issuer": _UNLIMITED},
        "rc_room_creation": _UNLIMITED,
        "rc_profile": _UNLIMITED,
        "rc_presence": {"per_user": _UNLIMITED},
        "rc_admin_redaction": _UNLIMITED,
        "rc_3pid_validation": _UNLIMITED,
        "rc_delayed_event_mgmt": _UNLIMITED,
        "rc_reports": _UNLIMITED,
    }


class Synapse:
    """One Synapse process owned by the test run."""

    def __init__(self, data_dir: Path, *, start_timeout_s: float = 60.0) -> None:
        self.data_dir = data_dir
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.log_file = data_dir / "synapse.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def server_name(self) -> str:
        return SERVER_NAME

    def user_id(self, localpart: str) -> str:
        return f"@{localpart}:{SERVER_NAME}"

    def start(self) -> None:
        if not synapse_available():
            raise SynapseError("matrix-synapse is not installed")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "media").mkdir(exist_ok=True)
        self.port = free_port()
        config = self.data_dir / "homeserver.yaml"
        config.write_text(yaml.safe_dump(homeserver_config(self.data_dir, self.port)), encoding="utf-8")
        with self.log_file.open("ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "synapse.app.homeserver", "-c", str(config)],
                cwd=self.data_dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "SYNAPSE_CACHE_FACTOR": "0.5"},
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self._proc is not None and self._proc.poll() is not None:
                    raise SynapseError(f"synapse exited with {self._proc.returncode}:\n{self._log_tail()}")
                try:
                    if client.get(f"{self.url}/_matrix/client/versions").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        self.stop()
        raise SynapseError(f"synapse did not answer within {self.start_timeout_s}s:\n{self._log_tail()}")

    def _log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def register(self, localpart: str, password: str) -> MatrixAccount:
        """Register ``@localpart:localhost`` by open registration; returns its access token."""
        body = {"username": localpart, "password": password, "auth": {"type": "m.login.dummy"}}
        with httpx.Client(timeout=30.0) as client:
            response = client.post(f"{self.url}/_matrix/client/v3/register", json=body)
        if response.status_code != 200:
            raise SynapseError(f"registering {localpart} failed: {response.status_code} {response.text}")
        data = response.json()
        return MatrixAccount(data["user_id"], data["access_token"], password, data.get("device_id"))

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
