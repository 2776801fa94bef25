"""``temporality up``: the embedded Temporality in one command; Ctrl-C stops it all."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import structlog
import yaml
from pydantic import ValidationError

from temporality_bus import NatsSettings
from temporality_embedded import datadir, dlq, status
from temporality_embedded.natsserver import NatsUser, authorization_block, password_variable
from temporality_embedded.processes import SERVICES, port_free
from temporality_embedded.stack import EXAMPLE_AGENT_ID, Stack, StackConfig, TokenFileError, redacted_url
from temporality_embedded.supervisor import Supervisor, not_ready
from temporality_protocol.catalog import EVENTS_STREAM
from temporality_protocol.permissions import (
    TIMERS_MIGRATION_USER,
    external_agent_permissions,
    journal_subscriber_permissions,
    permissions_for,
    subscriber_user,
    timers_migration_permissions,
)
from temporality_service.timers_migrate import run as run_timers_migration

__all__ = [
    "DEFAULT_EXTERNAL_AGENTS",
    "DEFAULT_SUBSCRIBERS",
    "build_parser",
    "database_url",
    "main",
    "nats_authorization",
    "port_free",
    "stack_config",
    "version_text",
    "webhook_lines",
]

#: The journal's database setting, ``temporality up --database-url``'s default when set.
DATABASE_URL_ENV = "TEMPORALITY_DATABASE_URL"
#: The journal subscriber ``temporality up`` creates when ``--nats-subscriber`` names none (user ``sub-example``).
DEFAULT_SUBSCRIBERS: tuple[str, ...] = ("example",)
#: The external agents ``temporality up`` makes NATS users for when ``--nats-external-agent`` names none: the
#: example agent of ``config/external-agents.yaml``.
DEFAULT_EXTERNAL_AGENTS: tuple[str, ...] = (EXAMPLE_AGENT_ID,)


def _out(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def webhook_lines(gateway_url: str, admin_token: str | None, config_dir: Path) -> list[str]:
    """The banner's line of each webhook trigger: those of the trigger store, as the gateway's admin API lists them
    (created through the API too; one this gateway does not serve says so), else -- no admin token, or the API did
    not answer -- those of the triggers file."""
    stored = _stored_webhooks(gateway_url, admin_token)
    if stored is not None:
        return [_webhook_line(gateway_url, trigger_id, served) for trigger_id, served in stored]
    try:
        doc: Any = yaml.safe_load((config_dir / "triggers.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return []
    return [
        _webhook_line(gateway_url, str(trigger.get("id")), True)
        for trigger in doc.get("triggers") or []
        if isinstance(trigger, dict) and trigger.get("type", "webhook") == "webhook"
    ]


def _webhook_line(gateway_url: str, trigger_id: str, served: bool) -> str:
    label = f"Webhook {trigger_id}"
    line = f"  {label:<26} POST {gateway_url}/hooks/{trigger_id}"
    return line if served else f"{line}   (not served: see GET /triggers/{trigger_id})"


def _stored_webhooks(gateway_url: str, admin_token: str | None) -> list[tuple[str, bool]] | None:
    """(id, served) of every webhook trigger in the store (``GET /triggers``), or ``None`` when it cannot be read."""
    if admin_token is None:
        return None
    request = urllib.request.Request(f"{gateway_url}/triggers", headers={"Authorization": f"Bearer {admin_token}"})
    try:
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the stack's own gateway: no proxy
        with direct.open(request, timeout=5) as answer:
            listed: Any = json.loads(answer.read())
        return [
            (str(view["trigger"]["id"]), view.get("served") is True)
            for view in listed["triggers"]
            if view["trigger"].get("type") == "webhook"
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return None


#: Where ``temporality up`` keeps the NATS port it picked (``--nats-port -1``, the default), so that the URLs it
#: printed -- a journal subscriber's, an external agent's, with their kept passwords -- stay true after a restart.
NATS_PORT_FILE = "nats-port"
#: Likewise the ports the OS picked for the run-executor's agent cards and agent-collab's agents API (and their
#: /metrics) at the last start (``--executor-port -1``, ``--collab-port -1``, the defaults): the "Agent cards"
#: and "Agents API" URLs and a Prometheus scrape config stay true across restarts of the stack.
EXECUTOR_PORT_FILE = "executor-port"
COLLAB_PORT_FILE = "collab-port"


def _remembered_port(path: Path, what: str = "NATS port") -> int:
    """The port a previous ``temporality up`` on this data directory picked, if it is free now; else -1 (a new
    free one)."""
    try:
        port = int(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return -1
    if not 0 < port < 65536 or not port_free(port):
        if 0 < port < 65536:
            _out(f"note: {what} {port} of the last start is in use now; a new one is picked (URLs below change)")
        return -1
    return port


def _remember_port(path: Path, port: int, what: str = "NATS port") -> None:
    try:
        path.write_text(f"{port}\n", encoding="utf-8")
    except OSError as exc:  # a read-only data dir still runs; the next start picks a new port
        _out(f"note: could not keep the {what} in {path}: {exc}")


def _url_port(url: str | None) -> int | None:
    try:
        return int(url.rsplit(":", 1)[1].split("/")[0]) if url else None
    except (IndexError, ValueError):
        return None


def _private_data_dir(data_dir: Path) -> None:
    """Everything ``temporality up`` and its services write is the user's alone: the journal's database holds every
    webhook payload and every answer, the logs the ids. The process (and the services it starts) writes with umask
    077; a new data dir is made 0700, and one an earlier version made group- or world-readable (it holds the NATS
    port file) is made 0700 -- its files need no change then, nobody else can reach them."""
    os.umask(0o077)
    if not data_dir.exists():
        data_dir.mkdir(mode=0o700, parents=True)
    elif (data_dir / NATS_PORT_FILE).is_file() and data_dir.stat().st_mode & 0o077:
        data_dir.chmod(0o700)
        _out(f"{data_dir} was readable by other users (its journal holds every payload and answer): now 0700")


def up(args: argparse.Namespace) -> int:
    """``temporality up`` with its data directory locked for its whole life (:func:`temporality_embedded.datadir.
    claim`): a second ``up`` on it, or one beside processes a killed ``up`` left, refuses and starts nothing."""
    config_dir = Path(args.config_dir)
    if all((config_dir / name).is_file() for name in ("triggers.yaml", "users.yaml", "agents.yaml")):
        _private_data_dir(Path(args.data_dir))
        lock = datadir.claim(Path(args.data_dir), _out)
        if lock is None:
            return 2
        try:
            return _up(args)
        finally:
            lock.release()
    return _up(args)  # says which config file is missing


def _up(args: argparse.Namespace) -> int:
    # this process's own logs (the timers migration's client) are the services' business, not the banner's: only
    # a warning or an error is printed here (each service logs to <data-dir>/run)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.accept_loss and not args.rebuild_journal:
        _out("error: --accept-loss applies only with --rebuild-journal")
        return 2
    config_dir = Path(args.config_dir)
    for name in ("triggers.yaml", "users.yaml", "agents.yaml"):
        if not (config_dir / name).is_file():
            _out(f"error: {config_dir / name} not found (use --config-dir)")
            return 2
    for flag, port in (
        ("--gateway-port", args.gateway_port),
        ("--human-port", args.human_port),
        ("--journal-port", args.journal_port),
        ("--nats-port", args.nats_port),
        ("--executor-port", args.executor_port),
        ("--collab-port", args.collab_port),
    ):
        if port > 0 and not port_free(port):
            _out(f"error: 127.0.0.1:{port} is already in use; pick another with {flag}")
            return 2
    _private_data_dir(Path(args.data_dir))
    remembered = Path(args.data_dir) / NATS_PORT_FILE
    if args.nats_port == -1:
        args.nats_port = _remembered_port(remembered)
    data_dir = Path(args.data_dir)
    if args.executor_port == -1:
        args.executor_port = _remembered_port(data_dir / EXECUTOR_PORT_FILE, "run-executor's agent-card port")
    if args.collab_port == -1:
        args.collab_port = _remembered_port(data_dir / COLLAB_PORT_FILE, "agent-collab's agents API port")
    problem = _database_problem(args)
    if problem is not None:
        _out(f"error: {problem}")
        return 2
    try:
        stack = Stack(stack_config(args))
    except ValueError as exc:
        _out(f"error: {exc}")
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if args.rebuild_journal:
            _out("Rebuilding the journal: its read model is dropped; it replays the events stream when it starts ...")
            rebuilt = stack.rebuild_journal(accept_loss=args.accept_loss)
            if rebuilt.returncode != 0:
                _out(f"error: temporality-journal rebuild failed (exit {rebuilt.returncode}); nothing was started:")
                _out(rebuilt.stdout.rstrip() or "(no output)")
                stack.stop()
                return rebuilt.returncode
            _out(
                "Journal read model dropped; the journal replays the events stream from its start (see docs/journal.md)"
            )
        database = "SQLite" if stack.database_is_sqlite else "PostgreSQL"
        _out(f"Starting Temporality: nats-server (JetStream) + {database} + {len(SERVICES)} services ...")
        stack.start()
    except (TokenFileError, ValueError) as exc:  # the API tokens file, the NATS passwords file, the reply key
        _out(f"error: {exc}")
        return 2
    except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as exc:
        _out(f"error: could not start: {exc}")
        stack.stop()
        return 1
    _remember_port(remembered, stack.nats.port)
    for file, url, what in (
        (EXECUTOR_PORT_FILE, stack.executor_url, "run-executor's agent-card port"),
        (COLLAB_PORT_FILE, stack.collab_url, "agent-collab's agents API port"),
    ):
        port = _url_port(url)
        if port is not None:
            _remember_port(data_dir / file, port, what)
    _out("Temporality is up.")
    for warning in not_ready(stack):  # started, yet not ready: e.g. an MCP server of a card that does not start
        _out(warning)
    for line in webhook_lines(stack.gateway_url, stack.admin_token, config_dir):
        _out(line)
    _out(f"  Web inbox API              {stack.human_url}/inbox   (Authorization: Bearer <user's inbox token>)")
    if stack.config.console_sign_in:
        _out(
            f"  Web console                {stack.journal_url}/console/   (sign in with the admin API token, or as a "
            "directory user: the demo alice / alice-demo-password)"
        )
    else:
        _out(f"  Web console                {stack.journal_url}/console/   (sign in with the admin API token)")
    _out(f"  Journal API                {stack.journal_url}/runs   (Authorization: Bearer <API token>)")
    _out(f"  Trigger admin API          {stack.gateway_url}/triggers   (Authorization: Bearer <API token>)")
    _out(f"  Agents API (agent-collab)  {stack.collab_url}/agents   (Authorization: Bearer <API token>)")
    _out(f"  Agent cards (run-executor) {stack.executor_url}/agents   (Authorization: Bearer <API token>)")
    if stack.admin_token is not None:
        _out(f"  Admin API token            {stack.admin_token}   (from {stack.api_tokens_file})")
    _out(f"  NATS (JetStream)           {stack.nats.url}   (every event on temporality.events.>)")
    if stack.nats.sync_interval == "always":
        _out("  JetStream fsync            before every acknowledgement (--sync-always)")
    else:
        _out("  JetStream fsync            every 2 minutes (the server's default; --sync-always: every write)")
    _out(f"  Journal database           {stack.database_shown}   ({_database_source(args)})")
    if not stack.database_is_sqlite:
        pass  # PostgreSQL commits as the server (or TEMPORALITY_JOURNAL_POSTGRES_SYNCHRONOUS_COMMIT) says
    elif stack.config.journal_sqlite_synchronous == "full":
        _out("  Journal SQLite fsync       at every commit (synchronous=FULL)")
    else:
        _out(
            "  Journal SQLite fsync       at WAL checkpoints (synchronous=NORMAL; --sqlite-synchronous full: every commit)"
        )
    if stack.nats_admin is not None:
        user, password = stack.nats_admin
        _out(f"  NATS user (full access)    {user} / {password}   (each service has its own, narrower user)")
        for name in stack.config.nats_subscribers:
            subscriber = stack.subscriber(name)
            assert subscriber is not None
            user, password, inbox = subscriber
            url = stack.nats.url.replace("nats://", f"nats://{user}:{password}@", 1)
            _out(
                f"  NATS journal subscriber    {url}   (read-only: durable {user} on {EVENTS_STREAM.name}, "
                f"inbox prefix {inbox})"
            )
        for name in stack.config.nats_external_agents:
            agent = stack.external_agent(name)
            assert agent is not None
            user, password, inbox = agent
            url = stack.nats.url.replace("nats://", f"nats://{user}:{password}@", 1)
            _out(f"  NATS external agent        {url}   (Agent Protocol requests only, inbox prefix {inbox})")
        _out(f"  NATS passwords             {stack.nats_passwords_file}   (kept across restarts)")
    if stack.collab_public_key is not None:
        _out(
            f"  agent-collab reply key     {stack.collab_public_key}   (public key: agent-collab signs its replies "
            f"to external agents; {stack.collab_reply_key_file.with_suffix('.pub')}, kept across restarts)"
        )
    if stack.example_agent_public_key is not None:
        _out(
            f"  example-agent key          {stack.example_agent_public_key}   (public key of "
            f"{stack.example_agent_key_file}, kept across restarts; agent-collab reads {stack.configured_allow_list} "
            f"with it as {stack.allow_list_file})"
        )
        if stack.example_agent_was_unsigned:
            _out(
                f"note: {EXAMPLE_AGENT_ID} is allow_unsigned in {stack.configured_allow_list}: it must sign with the key "
                "above instead (--no-example-agent-key: the file as it is)"
            )
    example = _example_agent_command(stack)
    if example is not None:
        _out("  Example external agent     (from the repository's root; it signs its messages with --key-file and")
        _out("                             checks agent-collab's reply signatures with --collab-public-key)")
        _out(f"    {example}")
    _out(
        f"  Data and logs              {stack.data_dir}   (logs in {stack.data_dir / 'run'}, nats-server's in {stack.nats.log_file})"
    )
    supervisor = Supervisor(stack, _out, restart=args.restart)
    if args.restart:
        policy = supervisor.policy
        _out(
            f"  Restarts                   a service or nats-server that exits is started again after "
            f"{', '.join(f'{d:g}' for d in policy.delays_s)} s; {policy.max_crashes} crashes within "
            f"{policy.window_s:g} s stop it all (--no-restart: the first exit does); a SIGTERM'd service (exit 0) is "
            "started again, not counted"
        )
    _out("Press Ctrl-C to stop.")
    code = 0
    try:
        while not stop.wait(0.5):
            result = supervisor.check()
            if result is not None:
                code = result
                break
    finally:
        supervisor.close()
    _out("Stopping ...")
    stack.stop()
    _out("Stopped.")
    return code


def database_url(args: argparse.Namespace) -> str | None:
    """The journal's database ``temporality up`` runs with: ``--database-url``, else the environment's
    ``TEMPORALITY_DATABASE_URL`` (empty: unset), else ``None`` (SQLite in the data dir)."""
    return args.database_url or os.environ.get(DATABASE_URL_ENV) or None


def _database_source(args: argparse.Namespace) -> str:
    """Where the banner's journal database comes from."""
    if args.database_url:
        return "--database-url"
    if os.environ.get(DATABASE_URL_ENV):
        return f"{DATABASE_URL_ENV} of the environment"
    return f"the data dir's SQLite; --database-url or {DATABASE_URL_ENV}: PostgreSQL"


def _database_problem(args: argparse.Namespace) -> str | None:
    """Why the journal could not use the database ``temporality up`` was given, before anything starts."""
    url = database_url(args)
    if url is None:
        return None
    scheme = url.split("://", 1)[0].split("+", 1)[0].lower() if "://" in url else ""
    if scheme not in ("sqlite", "postgresql", "postgres"):
        return (
            f"the journal's database must be SQLite or PostgreSQL (sqlite:///path, postgresql://user:password@host/db), "
            f"not {redacted_url(url)} ({_database_source(args)})"
        )
    if scheme != "sqlite" and args.sqlite_synchronous is not None:
        return "--sqlite-synchronous applies to the journal on SQLite only; this one is on PostgreSQL"
    return None


def stack_config(args: argparse.Namespace) -> StackConfig:
    """The stack ``temporality up`` runs for its parsed ``args``."""
    return StackConfig(
        data_dir=Path(args.data_dir),
        config_dir=Path(args.config_dir),
        gateway_port=args.gateway_port,
        human_port=args.human_port,
        journal_port=args.journal_port,
        nats_port=args.nats_port,
        executor_port=max(args.executor_port, 0),  # -1 (none kept, or taken): the OS picks
        collab_port=max(args.collab_port, 0),
        log_format="console",
        api_tokens_file=Path(args.api_tokens_file) if args.api_tokens_file else None,
        database_url=database_url(args),
        nats_auth=args.nats_auth,
        nats_subscribers=tuple(args.nats_subscriber or DEFAULT_SUBSCRIBERS),
        nats_external_agents=tuple(args.nats_external_agent or DEFAULT_EXTERNAL_AGENTS),
        collab_reply_key=args.collab_reply_key,
        example_agent_key=args.example_agent_key,
        nats_sync_interval="always" if args.sync_always else None,
        journal_sqlite_synchronous=args.sqlite_synchronous or ("full" if args.sync_always else None),
        console_sign_in=args.console_sign_in,
        metrics=args.metrics,
        die_with_parent=True,  # a kill -9 of `temporality up` stops its services and nats-server too
    )


def _example_agent_command(stack: Stack) -> str | None:
    """How to run ``examples/external-agent/agent.py`` against this stack as the ``example-agent`` of
    ``config/external-agents.yaml``: its NATS URL (its own user with NATS auth), ``--key-file`` when the stack
    gave agent-collab its public key (:attr:`Stack.example_agent_public_key`) and, when agent-collab signs its
    replies, ``--collab-public-key``. ``None`` when NATS auth is on and there is no ``example-agent`` user."""
    agent_id = EXAMPLE_AGENT_ID
    url = stack.nats.url
    if stack.nats_admin is not None:
        agent = stack.external_agent(agent_id)
        if agent is None:
            return None
        user, password, _inbox = agent
        url = url.replace("nats://", f"nats://{user}:{password}@", 1)
    words = [_python(), "examples/external-agent/agent.py", "--nats-url", url]
    if stack.example_agent_public_key is not None:
        words += ["--key-file", str(stack.example_agent_key_file)]
    if stack.collab_public_key is not None:
        words += ["--collab-public-key", stack.collab_public_key]
    return shlex.join(words)


def _python() -> str:
    """The interpreter running ``temporality up`` (the project's environment, which has the example's
    dependencies), relative to the working directory when it is below it (``.venv/bin/python``)."""
    executable = Path(sys.executable)
    try:
        return str(executable.relative_to(Path.cwd()))
    except ValueError:
        return str(executable)


def nats_authorization(subscribers: list[str], external_agents: list[str], domain: str | None = None) -> str:
    """The nats-server ``authorization`` block for every service, the journal ``subscribers``, the
    ``external_agents``, the timers migration (``timers-migrate``) and the dead-letter operator (``dlq-operator``,
    :func:`temporality_embedded.dlq.operator_permissions`), with each password read from the server's
    environment (``$TRIGGER_GATEWAY_PASSWORD``); with ``domain``, for clients reaching JetStream in that domain
    (:meth:`~temporality_protocol.permissions.Permissions.in_domain`). Raises ``ValueError`` for a bad subscriber
    or external agent name, or domain."""
    users: dict[str, NatsUser] = {name: ("", permissions_for(name).in_domain(domain)) for name in SERVICES}
    users |= {subscriber_user(n): ("", journal_subscriber_permissions(n).in_domain(domain)) for n in subscribers}
    if dlq.OPERATOR_USER in external_agents:
        raise ValueError(f"external agent user {dlq.OPERATOR_USER!r} is the dead-letter operator's NATS user")
    users |= {name: ("", external_agent_permissions(name).in_domain(domain)) for name in external_agents}
    # upgrading: temporality timers-migrate
    users[TIMERS_MIGRATION_USER] = ("", timers_migration_permissions().in_domain(domain))
    # an operator's temporality dlq (compose's tools service, the chart's toolbox)
    users[dlq.OPERATOR_USER] = ("", dlq.operator_permissions().in_domain(domain))
    block = authorization_block(users)
    for entry in block["users"]:
        entry["password"] = f"@@{password_variable(str(entry['user']))}@@"
    text = json.dumps(block, indent=2)
    variables = ", ".join(password_variable(user) for user in sorted(users))
    return (
        "# nats-server authorization for Temporality, derived from the service catalogue (temporality_protocol.\n"
        f"# permissions). Each password comes from the server's environment: {variables}.\n"
        + "authorization: "
        + re.sub(r'"@@([A-Z0-9_]+)@@"', r"$\1", text)
        + "\n"
    )


def version_text() -> str:
    """``temporality <version>`` of the installed package, with the checkout's commit (``git rev-parse``) when this
    runs from a git checkout of the repository (``uv sync``'s editable install); ``+dirty`` when it has changes."""
    try:
        text = f"temporality {importlib.metadata.version('temporality-embedded')}"
    except importlib.metadata.PackageNotFoundError:
        text = "temporality (version unknown: not installed as a package)"
    root = Path(__file__).resolve().parents[4]
    if (root / ".git").exists() and (root / "libs" / "embedded").is_dir():
        git = ["git", "-C", str(root)]
        try:
            commit = subprocess.run(
                [*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5, check=True
            ).stdout.strip()
            changed = subprocess.run(
                [*git, "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return text
        if commit:
            text += f" (git {commit}{'+dirty' if changed else ''}, {root})"
    return text


class _VersionAction(argparse.Action):
    """``--version``: :func:`version_text`, worked out only when asked for (it may run git)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        _out(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="temporality", description="Temporality: event-triggered agent runs")
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the version (and the git commit when run from a checkout) and exit",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    p_up = commands.add_parser(
        "up",
        help="run nats-server, the journal's database (SQLite, or your PostgreSQL) and every service on this machine",
    )
    p_up.add_argument(
        "--data-dir", default=".temporality", help="JetStream store, SQLite journal, logs (default: .temporality)"
    )
    p_up.add_argument("--config-dir", default="config", help="triggers.yaml, users.yaml, agents.yaml (default: config)")
    p_up.add_argument(
        "--gateway-port", type=int, default=8080, help="webhooks and the trigger admin API (default: 8080)"
    )
    p_up.add_argument(
        "--human-port", type=int, default=8081, help="human-interaction: the web inbox API (default: 8081)"
    )
    p_up.add_argument("--journal-port", type=int, default=8082, help="the journal API and the console (default: 8082)")
    p_up.add_argument(
        "--nats-port",
        type=int,
        default=-1,
        help="-1: the port the last start on this --data-dir used if it is free (kept in <data-dir>/nats-port), "
        "else a free one (default: -1)",
    )
    p_up.add_argument(
        "--executor-port",
        type=int,
        default=-1,
        help="the run-executor's agent-card API and /metrics (the 'Agent cards' URL); -1: the port the last start "
        "on this --data-dir used if it is free (kept in <data-dir>/executor-port), else one the OS picks "
        "(default: -1)",
    )
    p_up.add_argument(
        "--collab-port",
        type=int,
        default=-1,
        help="agent-collab's agents API and /metrics (the 'Agents API' URL); -1: the port the last start on this "
        "--data-dir used if it is free (kept in <data-dir>/collab-port), else one the OS picks (default: -1)",
    )
    p_up.add_argument(
        "--nats-auth",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="each service connects to NATS as its own user, with the permissions the catalogue gives it, plus a "
        "read-only journal subscriber user (default: on; --no-nats-auth: no NATS authentication)",
    )
    p_up.add_argument(
        "--nats-subscriber",
        action="append",
        metavar="NAME",
        help="a read-only journal subscriber: NATS user and durable sub-NAME (repeatable; default: "
        + ", ".join(DEFAULT_SUBSCRIBERS)
        + ")",
    )
    p_up.add_argument(
        "--nats-external-agent",
        action="append",
        metavar="NAME",
        help="an external agent's NATS user NAME (its agent id): Agent Protocol requests on its own subjects "
        "temporality.rpc.agents.NAME.* only, replies below _INBOX.NAME "
        "(repeatable; default: " + ", ".join(DEFAULT_EXTERNAL_AGENTS) + ")",
    )
    p_up.add_argument(
        "--collab-reply-key",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="agent-collab signs its replies to external agents with an Ed25519 key kept in "
        "<data-dir>/collab-reply-key.pem (made on first start; public key in collab-reply-key.pub) "
        "(default: on; --no-collab-reply-key: unsigned replies)",
    )
    p_up.add_argument(
        "--example-agent-key",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"the example agent ({EXAMPLE_AGENT_ID}) signs its messages with an Ed25519 key kept in "
        f"<data-dir>/{EXAMPLE_AGENT_ID}.key (made on first start): agent-collab reads the config dir's "
        "external-agents.yaml with its public key in place of allow_unsigned, as "
        "<data-dir>/external-agents.effective.yaml, when it lists the agent without a public_key (default: on; "
        "--no-example-agent-key: the file as it is)",
    )
    p_up.add_argument(
        "--console-sign-in",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="people sign in to the console with their directory user id and password (users.yaml: console_role, "
        "password_hash), their inbox and the trigger wizard vouched for by the journal; secrets kept in "
        "<data-dir>/signin (default: on; --no-console-sign-in: API tokens and inbox tokens only)",
    )
    p_up.add_argument(
        "--sync-always",
        action="store_true",
        help="the nats-server fsyncs before acknowledging every write (JetStream's sync_interval: always): an "
        "acknowledged event survives a power loss, at several times the cost of each publish "
        "(default: the server's fsync every 2 minutes; a killed process loses nothing either way); also sets "
        "--sqlite-synchronous full unless that is given",
    )
    p_up.add_argument(
        "--sqlite-synchronous",
        choices=("normal", "full"),
        default=None,
        help="the journal's SQLite PRAGMA synchronous: full fsyncs at every commit (no journaled row lost to a "
        "power loss, a slower journal), normal at WAL checkpoints (a power loss may take its last commits, "
        "which `temporality-journal rebuild` restores from the stream) (default: normal; full with --sync-always)",
    )
    p_up.add_argument(
        "--metrics",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="every service serves Prometheus metrics on GET /metrics (default: on; --no-metrics: none is made "
        "or updated and /metrics answers 404)",
    )
    p_up.add_argument(
        "--restart",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a service or the nats-server that exits is reported (exit code or signal, last log lines) and started "
        "again after 1, 2, 5, 10, 30 s, on the same ports and data; 5 crashes of one within 2 minutes stop the "
        "stack (default: on; --no-restart: the first exit stops the stack with exit code 1, e.g. in CI)",
    )
    p_up.add_argument(
        "--rebuild-journal",
        action="store_true",
        help="before the services start, run `temporality-journal rebuild` with the journal's settings: the "
        "journal's read model (its SQLite database's runs and events) is dropped and replayed from the events "
        "stream when the journal starts (docs/journal.md, 'Schema and rebuild'); a failed rebuild stops "
        "here with its exit code and output",
    )
    p_up.add_argument(
        "--accept-loss",
        action="store_true",
        help="with --rebuild-journal: rebuild even when the events stream no longer holds every event (retention, "
        "a purge): what only the journal's database still has is lost (the rebuild refuses without it)",
    )
    p_up.add_argument(
        "--database-url",
        default=None,
        metavar="URL",
        help="the journal's database, SQLite or PostgreSQL (postgresql://user:password@host:5432/db; the journal "
        "makes its tables there at start); the banner shows it without the password. Prefer the environment's "
        f"{DATABASE_URL_ENV}, which is the default: a password on the command line is visible in ps "
        "(default: <data-dir>/journal.db, SQLite)",
    )
    p_up.add_argument(
        "--api-tokens-file",
        default=None,
        help="role tokens for the APIs (default: <data-dir>/api-tokens.json, created with a fresh admin token)",
    )
    p_auth = commands.add_parser(
        "nats-authorization",
        help="print the nats-server authorization block (every service's user, subscribers, external agents, "
        "timers-migrate, dlq-operator)",
    )
    p_auth.add_argument("--subscriber", action="append", default=[], metavar="NAME", help="journal subscriber sub-NAME")
    p_auth.add_argument(
        "--external-agent",
        action="append",
        default=[],
        metavar="USER",
        help="an external agent's user (its agent id): Agent Protocol requests on temporality.rpc.agents.USER.* "
        "only, replies below _INBOX.USER",
    )
    p_auth.add_argument(
        "--jetstream-domain",
        default=None,
        metavar="DOMAIN",
        help="the services reach JetStream in this domain (TEMPORALITY_NATS_JETSTREAM_DOMAIN): their API requests "
        "and KV writes are allowed at $JS.DOMAIN.API... instead of $JS.API... and $KV...",
    )
    p_migrate = commands.add_parser(
        "timers-migrate",
        help="upgrading: move the timers of an older release's one TEMPORALITY_TIMERS stream into the per-service "
        "timers streams, then delete it (as the NATS user timers-migrate, or one with full access: "
        "TEMPORALITY_NATS_URL, _USER, _PASSWORD, or _CREDS_FILE or _NKEY_SEED_FILE instead of user and password)",
    )
    p_migrate.add_argument("--nats-url", default=None, help="default: TEMPORALITY_NATS_URL or nats://127.0.0.1:4222")
    dlq.add_parser(commands)  # temporality dlq list|show|redrive|purge (temporality_embedded.dlq)
    status.add_parser(commands)  # temporality status (temporality_embedded.status)
    return parser


def timers_migrate(url: str | None) -> int:
    """``temporality timers-migrate``: 0 when moved or nothing to move, 1 when it failed (run it again)."""
    try:
        settings = NatsSettings()  # TEMPORALITY_NATS_URL, _USER, _PASSWORD (or _CREDS_FILE, _NKEY_SEED_FILE), TLS
    except ValidationError as exc:
        _out(f"error: NATS settings: {exc.errors()[0]['msg']}")
        return 2
    return run_timers_migration(settings.model_copy(update={"url": url}) if url else settings, sys.stdout)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "up":
        return up(args)
    if args.command == "timers-migrate":
        return timers_migrate(args.nats_url)
    if args.command == "dlq":
        return dlq.run(args)
    if args.command == "status":
        try:
            return status.run(args, sys.stdout)
        except BrokenPipeError:  # `temporality status | head`: the reader left; nothing more to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
    if args.command == "nats-authorization":
        try:
            sys.stdout.write(nats_authorization(args.subscriber, args.external_agent, args.jetstream_domain))
        except ValueError as exc:
            _out(f"error: {exc}")
            return 2
        return 0
    return 2  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":
    sys.exit(main())
