"""The whole of Temporality on one machine: nats-server from the wheel, SQLite, one process per service.

The services, their modules and their HTTP port variables (``<env_prefix>PORT``) come from
:data:`temporality_protocol.catalog.SERVICES`; what is specific here (stop order, which config file
each reads, which ``StackConfig`` field holds a port) is checked against it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import SecretStr
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from temporality_bus import NatsSettings
from temporality_bus.timers import LegacyMigration
from temporality_embedded.datadir import die_with_parent
from temporality_embedded.natsserver import NatsServer, NatsUser
from temporality_embedded.processes import SERVICES, ServiceProcess, port_free
from temporality_protocol.permissions import (
    external_agent_inbox,
    external_agent_permissions,
    journal_subscriber_permissions,
    permissions_for,
    subscriber_inbox,
    subscriber_user,
)
from temporality_service.auth import ApiToken, Role, TokenFileError, dump_tokens, load_tokens
from temporality_service.secret_files import SIGN_IN_SECRETS, ensure_ed25519_key, ensure_secret_file
from temporality_service.secret_files import ensure_ed25519_key as ensure_reply_key
from temporality_service.timers_migrate import migrate

__all__ = [
    "ADMIN_TOKEN_NAME",
    "COLLAB_REPLY_KEY_ID",
    "EXAMPLE_AGENT_ID",
    "NATS_ADMIN",
    "STOP_ORDER",
    "Stack",
    "StackConfig",
    "TokenFileError",
    "check_stop_order",
    "ensure_nats_passwords",
    "ensure_reply_key",
    "ensure_secret_file",
    "ensure_tokens_file",
    "migrate_timers",
    "redacted_url",
    "sign_listed_agent",
    "stop_tiers",
]

#: Stop order: intake first, the journal last (it records everyone's goodbyes). Exactly the
#: catalogue's services (:func:`check_stop_order`; a test and every :class:`Stack` check it).
STOP_ORDER: tuple[str, ...] = ("trigger-gateway", "agent-collab", "run-executor", "human-interaction", "journal")


def stop_tiers(order: tuple[str, ...] = STOP_ORDER) -> list[tuple[str, ...]]:
    """``order`` as the tiers :meth:`Stack.stop` stops one after another: the first service (intake) alone,
    the ones between together (none waits on another to drain: what one publishes meanwhile is in the stream
    for the others' next start), the last (the journal) alone."""
    return [order[:1], order[1:-1], order[-1:]]


#: service -> (its setting naming a config file, after the service's env prefix; the file in the config dir).
_CONFIG_FILES: dict[str, tuple[str, str]] = {
    "trigger-gateway": ("TRIGGERS_FILE", "triggers.yaml"),
    "human-interaction": ("USERS_FILE", "users.yaml"),
    "run-executor": ("AGENTS_FILE", "agents.yaml"),
    "agent-collab": ("EXTERNAL_AGENTS_FILE", "external-agents.yaml"),
}
#: HTTP service -> the :class:`StackConfig` field holding its port (``temporality up --<flag>-port``).
_PORT_FIELDS: dict[str, str] = {
    "trigger-gateway": "gateway_port",
    "human-interaction": "human_port",
    "journal": "journal_port",
}


def check_stop_order(order: tuple[str, ...] | None = None) -> None:
    """Raise ``ValueError`` unless ``order`` (default :data:`STOP_ORDER`) names each service of the
    catalogue exactly once, and the per-service settings here name only services of the catalogue."""
    order = STOP_ORDER if order is None else order
    if sorted(order) != sorted(SERVICES):
        missing, extra = sorted(set(SERVICES) - set(order)), sorted(set(order) - set(SERVICES))
        duplicated = sorted({n for n in order if order.count(n) > 1})
        raise ValueError(
            f"STOP_ORDER must name every service of the catalogue once: missing {missing}, "
            f"unknown {extra}, repeated {duplicated}"
        )
    unknown = sorted((set(_CONFIG_FILES) | set(_PORT_FIELDS)) - set(SERVICES))
    not_http = sorted(n for n in _PORT_FIELDS if n in SERVICES and SERVICES[n].http_port is None)
    if unknown or not_http:
        raise ValueError(f"stack settings name unknown services {unknown} or give workers a port {not_http}")


@dataclass
class StackConfig:
    data_dir: Path
    config_dir: Path
    gateway_port: int = 8080
    human_port: int = 8081
    journal_port: int = 8082
    nats_port: int = -1  # -1: a random free port
    #: agent-collab's operator API (``GET /agents``, decommission; ``TEMPORALITY_COLLAB_PORT``): 0, a free port
    #: the OS picks, which its ready file names (:attr:`Stack.collab_url`).
    collab_port: int = 0
    #: the run-executor's agent-card API (``GET /agents``; ``TEMPORALITY_EXECUTOR_PORT``): 0, a free port the
    #: OS picks, which its ready file names (:attr:`Stack.executor_url`).
    executor_port: int = 0
    #: Connect the services to this NATS (a cluster: its nodes' URLs, comma-separated) instead of starting
    #: the embedded nats-server; the caller runs it (and :attr:`nats_auth` does not apply).
    nats_url: str | None = None
    #: The journal's database (its ``TEMPORALITY_DATABASE_URL``): a SQLAlchemy URL of SQLite or PostgreSQL
    #: (``postgresql://user:password@host:5432/db``); ``None``: SQLite in ``<data_dir>/journal.db``.
    #: ``temporality up --database-url``, by default the environment's ``TEMPORALITY_DATABASE_URL``.
    database_url: str | None = None
    log_format: str = "console"
    extra_env: Mapping[str, str] = field(default_factory=dict)
    #: The role tokens every API accepts (``TEMPORALITY_API_TOKENS_FILE``). ``None``: ``<data_dir>/api-tokens.json``,
    #: created with one fresh admin token on first start and reused afterwards (the token stays valid).
    api_tokens_file: Path | None = None
    #: Each service connects to NATS as its own user with the permissions its catalogue entry implies
    #: (``temporality_protocol.permissions``). :attr:`Stack.nats_admin` is a user with full access for the
    #: operator's (and the tests') own connections. The passwords are random, kept in
    #: ``<data_dir>/nats-users.json`` (mode 0600) and reused by the next start. Off here; ``temporality up``
    #: turns it on unless ``--no-nats-auth``.
    nats_auth: bool = False
    #: With :attr:`nats_auth`: read-only journal subscribers (DC-6), each the NATS user ``sub-<name>`` that may
    #: run the durable pull consumer ``sub-<name>`` on the events stream and nothing else (:meth:`Stack.subscriber`).
    nats_subscribers: tuple[str, ...] = ("example",)
    #: With :attr:`nats_auth`: external agents (AP-11), each the NATS user of that name (its agent id) that may only
    #: send the Agent Protocol's requests on its own subjects (``temporality.rpc.agents.<name>.*``) and read the
    #: replies below its own inbox prefix ``_INBOX.<name>``
    #: (:meth:`Stack.external_agent`). The default is the example agent of ``config/external-agents.yaml``.
    nats_external_agents: tuple[str, ...] = ("example-agent",)
    #: Processes per service (default 1), sharing its durable consumers; extra replicas of an HTTP service
    #: listen on free ports (:meth:`Stack.urls`). The journal on SQLite must stay at one.
    replicas: Mapping[str, int] = field(default_factory=dict)
    #: agent-collab signs its replies to external agents (``TEMPORALITY_COLLAB_REPLY_KEY_FILE``) with an Ed25519
    #: key in ``<data_dir>/collab-reply-key.pem`` (mode 0600), generated on first start and reused afterwards;
    #: its public key (raw, base64: the example agent's ``--collab-public-key``) is in
    #: ``collab-reply-key.pub`` next to it (:attr:`Stack.collab_public_key`). Off here; ``temporality up``
    #: turns it on unless ``--no-collab-reply-key``.
    collab_reply_key: bool = False
    #: The example agent of ``config/external-agents.yaml`` signs its messages (AP-11) with an Ed25519 key in
    #: ``<data_dir>/example-agent.key`` (mode 0600, public key in ``example-agent.pub``), made on first start and
    #: reused afterwards: when the configured allow-list lists :data:`EXAMPLE_AGENT_ID` without a ``public_key`` of
    #: its own, agent-collab reads a copy of it (``<data_dir>/external-agents.effective.yaml``, written at each
    #: start) where that agent has the key's ``public_key`` instead of any ``allow_unsigned``; the configured file
    #: is never changed (:func:`sign_listed_agent`). Off here; ``temporality up`` turns it on unless
    #: ``--no-example-agent-key``.
    example_agent_key: bool = False
    #: The embedded nats-server's JetStream fsync interval (``sync_interval``): ``"always"`` fsyncs before every
    #: acknowledgement (nothing acknowledged is lost to a power cut; several times slower publishes), a duration
    #: (``"10s"``) bounds that window; ``None``: the server's default (two minutes). ``temporality up
    #: --sync-always``. Not for :attr:`nats_url` (the caller's server has its own config).
    nats_sync_interval: str | None = None
    #: The journal's SQLite ``PRAGMA synchronous`` (``TEMPORALITY_JOURNAL_SQLITE_SYNCHRONOUS``): ``"full"`` fsyncs at
    #: every commit (no journaled row lost to a power cut), ``"normal"`` at WAL checkpoints; ``None``: the journal's
    #: default (``normal``). ``temporality up --sqlite-synchronous``, ``full`` with ``--sync-always``.
    journal_sqlite_synchronous: str | None = None
    #: People sign in to the console with their directory user id and password (``config/users.yaml``:
    #: ``console_role``, ``password_hash``; ``TEMPORALITY_JOURNAL_PASSWORD_SIGNIN``), and a signed-in person's
    #: inbox and trigger wizard work without a token (the journal vouches for them). The session key and both
    #: vouch secrets are random files in ``<data_dir>/signin`` (mode 0600), made on first start and reused; the
    #: cookie is not ``Secure`` (the stack serves plain http on loopback). Off here; ``temporality up`` turns it
    #: on unless ``--no-console-sign-in``.
    console_sign_in: bool = False
    #: Every service serves Prometheus ``/metrics``; ``False`` (``temporality up --no-metrics``,
    #: ``TEMPORALITY_METRICS_ENABLED=false``): none is made or updated and ``/metrics`` answers 404.
    metrics: bool = True
    #: Every process the stack starts (nats-server, each service, a journal rebuild) is sent SIGTERM when the
    #: process that started it dies, even by ``kill -9`` (Linux ``PR_SET_PDEATHSIG``:
    #: :func:`temporality_embedded.datadir.die_with_parent`): no service runs on orphaned. Only for a process that
    #: starts and restarts them from one thread that lives as long as they do (``temporality up``'s main thread);
    #: off here.
    die_with_parent: bool = False


#: The NATS user with full access (an operator's tools, the tests) when the stack runs with NATS auth.
NATS_ADMIN = "temporality-admin"
#: The key id of agent-collab's signed replies (``TEMPORALITY_COLLAB_REPLY_KEY_ID``; the example agent's default
#: ``--collab-key-id``).
COLLAB_REPLY_KEY_ID = "agent-collab"
#: The agent id of the example external agent (``examples/external-agent/agent.py``, ``config/external-agents.yaml``).
EXAMPLE_AGENT_ID = "example-agent"
#: The name of the admin token ``temporality up`` creates.
ADMIN_TOKEN_NAME = "local-admin"


def migrate_timers(url: str, user: str | None = None, password: str | None = None) -> LegacyMigration | None:
    """Move an older release's ``TEMPORALITY_TIMERS`` into the per-service timers streams
    (:func:`temporality_service.timers_migrate.migrate`) as ``user`` (full access, or ``timers-migrate``); ``None``
    when there was nothing to move. Blocking (callable from a running loop)."""
    return migrate(NatsSettings(url=url, user=user, password=SecretStr(password) if password is not None else None))


#: Query parameters of a database URL that hold a secret (libpq's ``password``, ``sslpassword``).
_SECRET_QUERY = re.compile(r"(?i)^(password|sslpassword|passwd|pwd)$")


#: What :func:`redacted_url` shows for a database URL it cannot parse (a libpq keyword string, ``host=db password=...``).
UNPARSEABLE_URL = "<unparseable database URL>"


def redacted_url(url: str) -> str:
    """``url`` without its secrets, for a banner or a log: the password of its user part (``user:***@host``, parsed
    as SQLAlchemy parses it, so a password holding ``/``, ``?`` or ``#`` is hidden whole) and of any ``password=``
    query parameter become ``***``. A URL SQLAlchemy does not parse is shown as :data:`UNPARSEABLE_URL`."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError):
        return UNPARSEABLE_URL
    pairs = [
        (key, value)
        for key, values in parsed.query.items()
        for value in (values if isinstance(values, tuple) else (values,))
    ]
    secret_query = any(_SECRET_QUERY.match(key) for key, _value in pairs)
    if parsed.password is None and not secret_query:
        return url  # nothing secret (shown as given)
    shown = parsed.set(query={}).render_as_string(hide_password=True)
    if not pairs:
        return shown
    masked = [(key, "***" if _SECRET_QUERY.match(key) else value) for key, value in pairs]
    return f"{shown}?{urllib.parse.urlencode(masked, safe='*/:')}"


def ensure_nats_passwords(path: Path, users: Iterable[str]) -> dict[str, str]:
    """The NATS password of each of ``users``, from ``path`` (JSON ``{user: password}``, mode 0600): kept ones
    are reused, missing ones generated and written back. Raises ``ValueError`` for an unreadable file."""
    stored: dict[str, str] = {}
    if path.exists():
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a JSON object of NATS passwords ({exc})") from exc
        if not isinstance(loaded, dict) or not all(isinstance(v, str) and v for v in loaded.values()):
            raise ValueError(f"{path}: not a JSON object of user -> password")
        stored = {str(user): password for user, password in loaded.items()}
    wanted = list(users)
    missing = [user for user in wanted if user not in stored]
    if missing:
        stored |= {user: secrets.token_urlsafe(24) for user in missing}
        _write_private(path, (json.dumps(stored, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return {user: stored[user] for user in wanted}


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (mode 0600), whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = path.with_name(path.name + ".new")
    fresh.unlink(missing_ok=True)
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    fresh.replace(path)


def ensure_tokens_file(path: Path) -> list[ApiToken]:
    """Read ``path``, or create it (mode 0600) with one fresh admin token. Raises ``TokenFileError``."""
    if path.exists():
        return load_tokens(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens = [ApiToken(name=ADMIN_TOKEN_NAME, role=Role.admin, token=SecretStr(secrets.token_urlsafe(32)))]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(dump_tokens(tokens))
    return tokens


def sign_listed_agent(text: str, agent_id: str, public_key: str) -> tuple[dict[str, Any], bool] | None:
    """The allow-list ``text`` (an ``external-agents.yaml``) with agent ``agent_id`` given ``public_key`` (raw,
    base64) in place of ``allow_unsigned``, and whether it had ``allow_unsigned: true``; everything else as it is.
    ``None`` when there is nothing to give it the key in: ``text`` is not YAML, not a mapping with a list of agents,
    or does not list ``agent_id`` exactly once as a mapping without a ``public_key`` of its own (an operator's key
    stands). Checking the rest is agent-collab's business: it reads the result as it would the file."""
    try:
        doc: Any = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    agents = doc.get("agents") if isinstance(doc, dict) else None
    if not isinstance(agents, list):
        return None
    listed = [i for i, a in enumerate(agents) if isinstance(a, dict) and a.get("id") == agent_id]
    if len(listed) != 1 or agents[listed[0]].get("public_key") is not None:
        return None
    entry = dict(agents[listed[0]])
    unsigned = entry.pop("allow_unsigned", False) is True
    entry["public_key"] = public_key
    return {**doc, "agents": [*agents[: listed[0]], entry, *agents[listed[0] + 1 :]]}, unsigned


class Stack:
    def __init__(self, config: StackConfig) -> None:
        check_stop_order()
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self._nats_passwords: dict[str, str] = {}
        if config.nats_url is not None and config.nats_auth:
            raise ValueError("nats_auth configures the embedded nats-server; it cannot apply to nats_url")
        if config.nats_url is not None and config.nats_sync_interval is not None:
            raise ValueError("nats_sync_interval configures the embedded nats-server; it cannot apply to nats_url")
        for name in config.nats_subscribers:
            journal_subscriber_permissions(name)  # a bad name fails here, before anything starts
        for name in config.nats_external_agents:
            external_agent_inbox(name)  # likewise
        self._preexec = die_with_parent() if config.die_with_parent else None
        self.nats = NatsServer(
            self.data_dir / "nats",
            port=config.nats_port,
            sync_interval=config.nats_sync_interval,
            preexec=self._preexec,
        )
        #: The first replica of each service; :attr:`replicas` has them all.
        self.services: dict[str, ServiceProcess] = {}
        self.replicas: dict[str, list[ServiceProcess]] = {}
        unknown = sorted(set(config.replicas) - set(SERVICES))
        if unknown or any(n < 1 for n in config.replicas.values()):
            raise ValueError(f"replicas: unknown services {unknown} or a count below 1 in {dict(config.replicas)}")
        self.api_tokens_file = (config.api_tokens_file or self.data_dir / "api-tokens.json").resolve()
        self.api_tokens: list[ApiToken] = []
        #: agent-collab's reply public key (raw, base64), once :meth:`start` made or read the key; ``None``
        #: without :attr:`StackConfig.collab_reply_key`.
        self.collab_public_key: str | None = None
        #: The example agent's public key (raw, base64), once :meth:`start` gave agent-collab an allow-list with it
        #: (:attr:`StackConfig.example_agent_key`); ``None`` otherwise (off, or the configured file has no place for
        #: it: see :func:`sign_listed_agent`).
        self.example_agent_public_key: str | None = None
        #: Whether the configured allow-list had the example agent ``allow_unsigned`` (its key is used instead).
        self.example_agent_was_unsigned = False
        #: The allow-list agent-collab reads: the configured one, or the copy :meth:`start` made with the key.
        self._allow_list_file: Path | None = None

    @property
    def nats_url(self) -> str:
        """What the services connect to: :attr:`StackConfig.nats_url`, else the embedded server's URL."""
        return self.config.nats_url if self.config.nats_url is not None else self.nats.url

    @property
    def nats_passwords_file(self) -> Path:
        return self.data_dir / "nats-users.json"

    @property
    def collab_reply_key_file(self) -> Path:
        """agent-collab's reply key (with :attr:`StackConfig.collab_reply_key`); the public key has suffix ``.pub``."""
        return self.data_dir / "collab-reply-key.pem"

    @property
    def example_agent_key_file(self) -> Path:
        """The example agent's private key (with :attr:`StackConfig.example_agent_key`); its public key has suffix
        ``.pub``."""
        return self.data_dir / f"{EXAMPLE_AGENT_ID}.key"

    @property
    def configured_allow_list(self) -> Path:
        """The external agents file of the config dir (``external-agents.yaml``)."""
        return self.config.config_dir.resolve() / _CONFIG_FILES["agent-collab"][1]

    @property
    def allow_list_file(self) -> Path:
        """The external agents file agent-collab reads (``TEMPORALITY_COLLAB_EXTERNAL_AGENTS_FILE``): the configured
        one, or -- with :attr:`StackConfig.example_agent_key`, once :meth:`start` made it -- its copy in the data dir
        where the example agent has its key."""
        return self._allow_list_file or self.configured_allow_list

    def _sign_example_agent(self) -> None:
        """With :attr:`StackConfig.example_agent_key`: make (or reuse) the example agent's key and write the copy of
        the configured allow-list that gives it the key's ``public_key`` (:func:`sign_listed_agent`), when the file
        lists it without a key of its own; else agent-collab reads the configured file as it is. ``ValueError`` for a
        key file that holds no Ed25519 key."""
        self._allow_list_file, self.example_agent_public_key, self.example_agent_was_unsigned = None, None, False
        if not self.config.example_agent_key:
            return
        source = self.configured_allow_list
        try:
            text = source.read_text(encoding="utf-8-sig")
        except OSError:
            return  # agent-collab says what is wrong with it
        if sign_listed_agent(text, EXAMPLE_AGENT_ID, "") is None:
            return
        public_key = ensure_ed25519_key(self.example_agent_key_file)
        signed = sign_listed_agent(text, EXAMPLE_AGENT_ID, public_key)
        assert signed is not None
        doc, self.example_agent_was_unsigned = signed
        header = (
            f"# Made by temporality up at each start from {source}, with {EXAMPLE_AGENT_ID}'s public key\n"
            f"# (its key: {self.example_agent_key_file}). Edit {source}, not this copy.\n"
        )
        derived = self.data_dir / "external-agents.effective.yaml"
        _write_private(derived, (header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)).encode("utf-8"))
        self._allow_list_file, self.example_agent_public_key = derived, public_key

    def _nats_users(self) -> dict[str, NatsUser]:
        """Every NATS user with its password (from :attr:`nats_passwords_file`) and permissions; ``{}`` without auth."""
        if not self.config.nats_auth:
            return {}
        subscribers = {subscriber_user(name): name for name in self.config.nats_subscribers}
        agents = self.config.nats_external_agents
        if not self._nats_passwords:
            self._nats_passwords = ensure_nats_passwords(
                self.nats_passwords_file, [*SERVICES, NATS_ADMIN, *subscribers, *agents]
            )
        users: dict[str, NatsUser] = {name: (self._nats_passwords[name], permissions_for(name)) for name in SERVICES}
        users[NATS_ADMIN] = (self._nats_passwords[NATS_ADMIN], None)
        for user, name in subscribers.items():
            users[user] = (self._nats_passwords[user], journal_subscriber_permissions(name))
        for name in agents:
            users[name] = (self._nats_passwords[name], external_agent_permissions(name))
        return users

    @property
    def nats_admin(self) -> tuple[str, str] | None:
        """(user, password) with full access when :attr:`StackConfig.nats_auth` is on, else ``None``."""
        if not self._nats_users():
            return None
        return NATS_ADMIN, self._nats_passwords[NATS_ADMIN]

    def subscriber(self, name: str) -> tuple[str, str, str] | None:
        """The journal subscriber ``name`` of :attr:`StackConfig.nats_subscribers`: (user, password, inbox prefix)
        to connect with; its durable is named like the user. ``None`` without NATS auth."""
        if name not in self.config.nats_subscribers or not self._nats_users():
            return None
        user = subscriber_user(name)
        return user, self._nats_passwords[user], subscriber_inbox(name)

    def external_agent(self, name: str) -> tuple[str, str, str] | None:
        """The external agent ``name`` of :attr:`StackConfig.nats_external_agents`: (user, password, inbox prefix)
        to connect with. ``None`` without NATS auth."""
        if name not in self.config.nats_external_agents or not self._nats_users():
            return None
        return name, self._nats_passwords[name], external_agent_inbox(name)

    @property
    def admin_token(self) -> str | None:
        """An admin token of :attr:`api_tokens_file` (loaded at :meth:`start`), for people and tests."""
        admins = [t for t in self.api_tokens if t.role is Role.admin]
        return admins[0].token.get_secret_value() if admins else None

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.config.gateway_port}"

    @property
    def human_url(self) -> str:
        return f"http://127.0.0.1:{self.config.human_port}"

    @property
    def journal_url(self) -> str:
        return f"http://127.0.0.1:{self.config.journal_port}"

    @property
    def collab_url(self) -> str | None:
        """agent-collab's operator API (``/agents``), once it is ready (its ready file names the port)."""
        return self._worker_url("agent-collab")

    @property
    def executor_url(self) -> str | None:
        """The run-executor's agent-card API (``/agents``), once it is ready (its ready file names the port)."""
        return self._worker_url("run-executor")

    def _worker_url(self, name: str) -> str | None:
        process = self.services.get(name)
        url = process.url if process is not None else None
        return url.replace("0.0.0.0", "127.0.0.1") if url is not None else None

    @property
    def database_url(self) -> str:
        """The journal's database: :attr:`StackConfig.database_url`, else SQLite in the data dir."""
        return self.config.database_url or f"sqlite+aiosqlite:///{self.data_dir / 'journal.db'}"

    @property
    def database_shown(self) -> str:
        """:attr:`database_url` as the banner shows it: without its password (:func:`redacted_url`)."""
        return redacted_url(self.database_url)

    @property
    def database_is_sqlite(self) -> bool:
        return self.database_url.lower().startswith("sqlite")

    def urls(self, name: str) -> list[str]:
        """The base URL of every replica of the HTTP service ``name`` (once started: extra replicas listen on a
        port the OS picked, which their ready file names)."""
        urls = [f"http://127.0.0.1:{self.http_port(name)}"]
        for process in self.replicas.get(name, [])[1:]:
            url = process.url
            if url is None:
                raise RuntimeError(f"{process.label} is not ready: no URL in {process.ready_file}")
            urls.append(url.replace("0.0.0.0", "127.0.0.1"))
        return urls

    def http_port(self, name: str, replica: int = 0) -> int | None:
        """The port ``name`` serves HTTP on (its ``StackConfig`` field, else the catalogue's default;
        0 for each further replica: see :meth:`urls`)."""
        spec = SERVICES[name]
        if spec.http_port is None:
            return None
        if replica > 0:
            return 0  # the OS picks at bind time (no race with other processes); see urls()
        port_field = _PORT_FIELDS.get(name)
        port: int = getattr(self.config, port_field) if port_field else spec.http_port
        return port

    def env_for(self, name: str, replica: int = 0) -> dict[str, str]:
        spec = SERVICES[name]
        env = {
            "TEMPORALITY_NATS_URL": self.nats_url,
            "TEMPORALITY_LOG_FORMAT": self.config.log_format,
            "TEMPORALITY_API_TOKENS_FILE": str(self.api_tokens_file),
        }
        if self.config.nats_url is None:  # the embedded server's users, not a credentials file from the shell
            env["TEMPORALITY_NATS_CREDS_FILE"] = env["TEMPORALITY_NATS_NKEY_SEED_FILE"] = ""
        if self._nats_users():
            env["TEMPORALITY_NATS_USER"] = name
            env["TEMPORALITY_NATS_PASSWORD"] = self._nats_passwords[name]
        port = self.http_port(name, replica)
        if spec.port_env is not None and port is not None:
            env[spec.port_env] = str(port)
        if name in _CONFIG_FILES:
            setting, file = _CONFIG_FILES[name]
            path = self.allow_list_file if name == "agent-collab" else self.config.config_dir.resolve() / file
            env[f"{spec.env_prefix}{setting}"] = str(path)
        if name == "agent-collab":  # a worker, but it serves the operator API on its probe port
            env["TEMPORALITY_COLLAB_PORT"] = str(self.config.collab_port if replica == 0 else 0)
            if self.config.collab_reply_key:
                env["TEMPORALITY_COLLAB_REPLY_KEY_FILE"] = str(self.collab_reply_key_file)
                env["TEMPORALITY_COLLAB_REPLY_KEY_ID"] = COLLAB_REPLY_KEY_ID
        if name == "run-executor":  # a worker, but it serves the agent cards on its probe port
            env["TEMPORALITY_EXECUTOR_PORT"] = str(self.config.executor_port if replica == 0 else 0)
        if name == "human-interaction":  # a chat question cut to fit points to the whole of it in the console
            env["TEMPORALITY_HUMAN_INBOX_URL"] = f"{self.journal_url}/#/inbox"
        if name == "journal":
            env["TEMPORALITY_DATABASE_URL"] = self.database_url
            if self.config.journal_sqlite_synchronous is not None:
                env["TEMPORALITY_JOURNAL_SQLITE_SYNCHRONOUS"] = self.config.journal_sqlite_synchronous
            env["TEMPORALITY_JOURNAL_GATEWAY_URL"] = self.gateway_url  # the console's trigger wizard
            env["TEMPORALITY_JOURNAL_HUMAN_URL"] = self.human_url  # the console's web inbox
        if self.config.console_sign_in:
            env |= self._sign_in_env(name)
        if not self.config.metrics:
            env["TEMPORALITY_METRICS_ENABLED"] = "false"
        return env | dict(self.config.extra_env)

    @property
    def sign_in_dir(self) -> Path:
        """Where the console sign-in's secrets are kept (:attr:`StackConfig.console_sign_in`)."""
        return self.data_dir / "signin"

    def _sign_in_env(self, name: str) -> dict[str, str]:
        """The console sign-in's settings of service ``name``: the journal signs people in and vouches for them,
        human-interaction (the inbox) and the trigger-gateway (the wizard) check its assertions."""
        secret = {key: str(self.sign_in_dir.resolve() / key) for key in SIGN_IN_SECRETS}
        if name == "journal":
            return {
                "TEMPORALITY_JOURNAL_PASSWORD_SIGNIN": "true",
                "TEMPORALITY_JOURNAL_SESSION_SECRET_FILE": secret["session-secret"],
                "TEMPORALITY_JOURNAL_SESSION_COOKIE_SECURE": "false",  # plain http on loopback
                "TEMPORALITY_INBOX_VOUCH_SECRET_FILE": secret["inbox-vouch"],
                "TEMPORALITY_API_VOUCH_SECRET_FILE": secret["api-vouch"],
            }
        if name == "human-interaction":
            return {"TEMPORALITY_INBOX_VOUCH_SECRET_FILE": secret["inbox-vouch"]}
        if name == "trigger-gateway":
            return {"TEMPORALITY_API_VOUCH_SECRET_FILE": secret["api-vouch"]}
        return {}

    def start(self, timeout: float = 60.0) -> None:
        """Raises ``TokenFileError`` for an invalid tokens file, ``RuntimeError``/``TimeoutError`` otherwise."""
        self._prepare()
        self.start_nats()
        try:
            # an older data dir: its timers move into the per-service streams now, once, before any service starts
            migrate_timers(self.nats_url, *(self.nats_admin or (None, None)))
            for name in SERVICES:
                self.replicas[name] = []
                for replica in range(self.config.replicas.get(name, 1)):
                    process = ServiceProcess(
                        name,
                        self.env_for(name, replica),
                        self.data_dir / "run",
                        cwd=self.data_dir,
                        replica=replica,
                        preexec=self._preexec,
                    )
                    self.replicas[name].append(process)
                    process.start()
                self.services[name] = self.replicas[name][0]
            for processes in self.replicas.values():
                for process in processes:
                    process.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _prepare(self) -> None:
        """The files the services read: the API tokens, agent-collab's reply key, the example agent's key and the
        allow-list with it, the sign-in secrets (each key and secret made on first start, kept afterwards). Raises
        ``TokenFileError`` for an invalid tokens file, ``ValueError`` for a key file that holds no Ed25519 key."""
        self.api_tokens = ensure_tokens_file(self.api_tokens_file)
        if self.config.collab_reply_key:
            self.collab_public_key = ensure_reply_key(self.collab_reply_key_file)
        self._sign_example_agent()
        if self.config.console_sign_in:
            for key in SIGN_IN_SECRETS:
                ensure_secret_file(self.sign_in_dir / key)

    def start_nats(self) -> None:
        """Start the embedded nats-server with every user (:meth:`start` does; ``temporality up --rebuild-journal``
        first, to rebuild the journal before any service starts). No-op when it runs already, or for
        :attr:`StackConfig.nats_url`."""
        if self.config.nats_url is not None or (self.nats.proc is not None and self.nats.poll() is None):
            return
        self.nats.users = self._nats_users()
        self.nats.start()

    def rebuild_journal(self, timeout: float = 600.0, *, accept_loss: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ``temporality-journal rebuild`` (drop the journal's read model; its next start replays the events
        stream) with the journal's environment, NATS running (:meth:`start_nats`) and no service started;
        ``accept_loss``: with ``--accept-loss`` (rebuild even when the stream no longer holds every event). Its exit
        code and output (stdout and stderr together). Raises ``TokenFileError``, and ``RuntimeError``/``TimeoutError``
        when nats-server does not start."""
        self._prepare()
        self.start_nats()
        script = Path(sys.executable).parent / "temporality-journal"
        command = [str(script)] if script.is_file() else [sys.executable, "-m", "temporality_journal"]
        return subprocess.run(
            [*command, "rebuild", *(["--accept-loss"] if accept_loss else [])],
            env={**os.environ, **self.env_for("journal")},
            cwd=self.data_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
            preexec_fn=self._preexec,
        )

    def restart(self, name: str, timeout: float = 30.0, **extra_env: str) -> ServiceProcess:
        """Start ``name`` again (after a kill -9 or a stop), optionally with changed environment."""
        old = self.services[name]
        old.terminate()
        process = ServiceProcess(
            name, {**self.env_for(name), **extra_env}, self.data_dir / "run", cwd=self.data_dir, preexec=self._preexec
        )
        self.services[name] = process
        if self.replicas.get(name):
            self.replicas[name][0] = process
        process.start()
        process.wait_ready(timeout)
        return process

    def respawn(self, label: str, port: int | None = None) -> ServiceProcess:
        """Start the replica ``label`` again after it exited, without waiting for it (its ready file says when it
        is). ``port``: the HTTP port it had, for one whose port the OS picked (a worker's, an extra replica's):
        kept when it is free (else the OS picks another)."""
        old = self.process(label)
        old.terminate()  # (exited: this only reaps it and closes our end of its log)
        env = self.env_for(old.name, old.replica)
        port_env = f"{SERVICES[old.name].env_prefix}PORT"
        if port is not None and env.get(port_env) == "0" and port_free(port):
            env[port_env] = str(port)
        process = ServiceProcess(
            old.name, env, self.data_dir / "run", cwd=self.data_dir, replica=old.replica, preexec=self._preexec
        )
        replicas = self.replicas.setdefault(old.name, [])
        if old in replicas:
            replicas[replicas.index(old)] = process
        if self.services.get(old.name) is old:
            self.services[old.name] = process
        process.start()
        return process

    def restart_nats(self, timeout: float = 10.0) -> str:
        """Start the embedded nats-server again after it exited: on the client port it had, with its store and
        users. Its URL; raises ``RuntimeError``/``TimeoutError`` when it does not come up."""
        self.nats.requested_port = self.nats.port
        return self.nats.start(timeout)

    #: How long :meth:`stop` waits for a service when the embedded nats-server is dead: nothing can drain then,
    #: and each service would otherwise wait out its NATS drain timeout.
    NATS_DEAD_GRACE_S = 3.0

    def stop(self) -> dict[str, int | None]:
        """Stop every process in :data:`STOP_ORDER`'s tiers (:func:`stop_tiers`): intake first, then the
        workers draining together, the journal last; then the embedded NATS. Each process's exit code.
        With the embedded nats-server dead there is nothing to drain: every service is asked to stop at once
        and killed after :attr:`NATS_DEAD_GRACE_S`."""
        codes: dict[str, int | None] = {}
        nats_dead = self.config.nats_url is None and self.nats.proc is not None and self.nats.poll() is not None
        tiers = [tuple(STOP_ORDER)] if nats_dead else stop_tiers()
        grace = self.NATS_DEAD_GRACE_S if nats_dead else 15.0
        for tier in tiers:
            processes = [p for name in tier for p in reversed(self.replicas.get(name, []))]
            processes += [self.services[n] for n in tier if n in self.services and self.services[n] not in processes]
            for process in processes:
                process.request_stop()
            for process in processes:  # each gets its full drain time: they drain at the same time
                codes[process.label] = process.wait_stopped(grace)
        self.nats.stop()
        return codes

    def process(self, label: str) -> ServiceProcess:
        """A replica by its label (``run-executor``, ``run-executor.2``, ...)."""
        for processes in self.replicas.values():
            for process in processes:
                if process.label == label:
                    return process
        return self.services[label]

    def dead(self) -> list[str]:
        everyone = [p for ps in self.replicas.values() for p in ps] or list(self.services.values())
        return [p.label for p in everyone if not p.alive()]
