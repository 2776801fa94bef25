"""The dead-letter operator's NATS user (``dlq-operator``, ``temporality_embedded.dlq.operator_permissions``) on a real
nats-server running docker compose's config: its GENERATED authorization (``temporality nats-authorization``, the
chart's file too) and the passwords compose gives it.

``temporality dlq list|show|redrive|purge`` runs as a process with the environment of compose's ``tools`` service
(what ``docker compose --profile tools run --rm tools temporality dlq ...`` and the chart's toolbox run), against
dead letters a real consumer of the catalogue, logged in as its own service, gave up on. Then the same user is
refused everything the command does not need."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import sysconfig
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
import yaml
from e2e_support import eventually
from pydantic import SecretStr

from temporality_bus import Bus, Consumer, Delivery, NatsSettings, PermanentError
from temporality_embedded.cli import nats_authorization
from temporality_embedded.dlq import OPERATOR_USER, operator_permissions, redrive_subjects, scan
from temporality_embedded.natsserver import NatsServer, password_variable
from temporality_protocol import Envelope, RunFailed, make_event
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    CONSUMERS,
    DLQ_STREAM,
    EVENTS_PREFIX,
    EVENTS_STREAM,
    RPCS,
    SERVICES,
    TIMERS_STREAMS,
    service_source,
)
from temporality_protocol.permissions import service_inbox

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_NATS_CONF = ROOT / "deploy" / "compose" / "nats.conf"
#: The ``temporality`` console script of this environment (the tools image's command).
TEMPORALITY = Path(sysconfig.get_path("scripts")) / "temporality"
#: A consumer of the catalogue that reads ``run.failed`` (human-interaction's), and who publishes that event.
DURABLE = "human-interaction-runs"
OWNER = "human-interaction"
SENDER = "run-executor"
#: nats-py's answer to a request the server refused for permissions (it never reaches JetStream).
REFUSED = (nats.errors.TimeoutError, nats.errors.NoRespondersError)


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    return doc


def _default(value: str) -> str:
    """A compose value with ``${VAR:-default}`` resolved to its default (an empty environment)."""
    return re.sub(r"\$\{([A-Z0-9_]+):-([^}]*)\}", lambda m: m[2], value)


def _env(service: dict[str, Any]) -> dict[str, str]:
    return {str(k): _default(str(v)) for k, v in service.get("environment", {}).items()}


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NatsServer]:
    """compose's nats-server config (the generated authorization included) with compose's default passwords."""
    generated = nats_authorization([], [])
    assert (ROOT / "deploy" / "compose" / "nats-authorization.conf").read_text(encoding="utf-8") == generated
    assert (ROOT / "charts" / "temporality" / "files" / "nats-authorization.conf").read_text(encoding="utf-8") == (
        generated
    )
    for variable, value in _env(_compose()["services"]["nats"]).items():
        monkeypatch.setenv(variable, value)
    nats_server = NatsServer(tmp_path / "nats", config_file=COMPOSE_NATS_CONF)
    nats_server.start()
    try:
        yield nats_server
    finally:
        nats_server.stop()


def _password(user: str) -> str:
    """compose's default password of ``user`` (what the nats service and that user's container get)."""
    return _env(_compose()["services"]["nats"])[password_variable(user)]


@contextlib.asynccontextmanager
async def _service_bus(server: NatsServer, name: str) -> AsyncIterator[Bus]:
    settings = NatsSettings(url=server.url, user=name, password=SecretStr(_password(name)), drain_timeout_s=2.0)
    async with Bus.connect(settings, name=name, inbox_prefix=service_inbox(name)) as bus:
        yield bus


class Poisoned:
    """A handler that refuses (a permanent error) every event until :attr:`fixed`, then records it."""

    def __init__(self) -> None:
        self.fixed = False
        self.handled: list[str] = []

    async def __call__(self, event: Envelope, delivery: Delivery) -> None:
        if not self.fixed:
            raise PermanentError(f"no profile for {event.id}")
        self.handled.append(event.id)


def _event(run_id: str) -> Envelope:
    return make_event(
        RunFailed(run_id=run_id, reason="r", error="boom"), source=service_source(SENDER), id=f"e-{run_id}"
    )


async def tools(server: NatsServer, *argv: str) -> tuple[int, str, str]:
    """``temporality dlq ARGV`` as a process with the environment of compose's ``tools`` service (its URL this
    server's): exit code, stdout, stderr."""
    env = _env(_compose()["services"]["tools"])
    assert env["TEMPORALITY_NATS_USER"] == OPERATOR_USER
    env["TEMPORALITY_NATS_URL"] = server.url
    command = [str(TEMPORALITY), "dlq", *argv]
    process = await asyncio.create_subprocess_exec(
        *command,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("TEMPORALITY_")}, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def _dead_letter(publisher: Bus, reader: Bus, run_id: str) -> int:
    """Publish ``run.failed`` of ``run_id`` as its sender and wait until the poisoned consumer dead-lettered it (read
    by ``reader``, the operator's): its DLQ sequence."""
    await publisher.publish(_event(run_id))

    async def there() -> int | None:
        return next((x.seq for x in await scan(reader, DURABLE) if x.event_id == f"e-{run_id}"), None)

    return await eventually(there, timeout_s=30, what=f"the dead letter of {run_id}")


@pytest.mark.timeout(240)
async def test_the_operator_lists_shows_redrives_and_purges_as_dlq_operator(server: NatsServer) -> None:
    async with _service_bus(server, "journal") as journal:  # the owner of the events and dead-letter streams
        await journal.ensure([EVENTS_STREAM, DLQ_STREAM])
    handler = Poisoned()
    stop = asyncio.Event()
    operator = NatsSettings(
        url=server.url, user=OPERATOR_USER, password=SecretStr(_password(OPERATOR_USER)), drain_timeout_s=2.0
    )
    async with (
        _service_bus(server, SENDER) as publisher,
        _service_bus(server, OWNER) as owner,
        Bus.connect(operator, name="observer") as reader,  # as the operator (its inbox: _INBOX.dlq-operator)
    ):
        task = asyncio.create_task(Consumer(owner, CONSUMERS[DURABLE], handler=handler).run(stop))
        try:
            first = await _dead_letter(publisher, reader, "r1")
            second = await _dead_letter(publisher, reader, "r2")

            code, out, err = await tools(server, "list")
            assert code == 0, err
            rows = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0].isdigit()}
            assert set(rows) >= {str(first), str(second)}, out
            assert DURABLE in rows[str(first)]
            assert "PermanentError: no profile for e-r1" in rows[str(first)]

            code, out, err = await tools(server, "show", str(first))
            assert code == 0, err
            assert '"run_id": "r1"' in out

            # a dry run names who gets it again (the events stream's consumers, read with CONSUMER.LIST)
            code, out, err = await tools(server, "redrive", str(first))
            assert code == 0, err
            assert out.startswith("DRY RUN"), out
            assert f"{DURABLE} (which gave up on it) gets it again" in out

            handler.fixed = True
            code, out, err = await tools(server, "redrive", str(first), "--yes")
            assert code == 0, err
            assert f"redriven {first} -> {EVENTS_STREAM.name}" in out
            assert '"event": "dlq.redriven"' in err
            assert f'"user": "{OPERATOR_USER}"' in err

            async def handled() -> bool:
                return "e-r1" in handler.handled

            await eventually(handled, timeout_s=30, what="the consumer getting the re-driven event")

            code, out, err = await tools(server, "purge", str(second), "--yes")
            assert code == 0, err
            assert f"purged {second}" in out

            async def emptied() -> bool:
                return not [x for x in await scan(reader, DURABLE) if x.seq in (first, second)]

            await eventually(emptied, timeout_s=10, what="both letters gone from the DLQ")
            assert "e-r2" not in handler.handled, "a purged letter is not delivered"
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)


def _refused_publishes() -> list[str]:
    """JetStream API requests and subjects ``dlq-operator`` must not reach: the others' streams, consumers, buckets
    and timers, and anything on the dead-letter stream but reading and deleting one message."""
    dlq, events = DLQ_STREAM.name, EVENTS_STREAM.name
    timers = TIMERS_STREAMS["human-interaction"].name
    bucket = f"KV_{SERVICES['human-interaction'].buckets[0]}"
    return [
        f"$JS.API.STREAM.PURGE.{dlq}",  # every dead letter at once: payload-filtered, not grantable narrowly
        f"$JS.API.STREAM.DELETE.{dlq}",
        f"$JS.API.STREAM.UPDATE.{dlq}",
        f"$JS.API.CONSUMER.CREATE.{dlq}",
        f"$JS.API.STREAM.MSG.GET.{events}",  # reading the events themselves
        f"$JS.API.DIRECT.GET.{events}",
        f"$JS.API.STREAM.MSG.DELETE.{events}",
        f"$JS.API.STREAM.PURGE.{events}",
        f"$JS.API.STREAM.UPDATE.{events}",
        f"$JS.API.STREAM.INFO.{events}",  # not even the events stream's info: the re-drive does not need it
        f"$JS.API.CONSUMER.CREATE.{events}.journal",  # a service's durable
        f"$JS.API.CONSUMER.DELETE.{events}.journal",
        f"$JS.API.CONSUMER.MSG.NEXT.{events}.journal",
        f"$JS.API.STREAM.MSG.GET.{timers}",  # a service's timers
        f"$JS.API.STREAM.MSG.GET.{bucket}",  # a service's bucket
        f"$JS.API.DIRECT.GET.{bucket}",
        "$JS.API.STREAM.NAMES",
        "$JS.API.STREAM.LIST",
        "$JS.API.INFO",
        next(iter(RPCS)),  # asking a service
    ]


@pytest.mark.timeout(120)
async def test_dlq_operator_is_refused_everything_else(server: NatsServer) -> None:
    async with _service_bus(server, "journal") as journal:
        await journal.ensure([EVENTS_STREAM, DLQ_STREAM])
    async with _service_bus(server, OWNER) as owner:  # its timers stream and buckets exist
        spec = SERVICES[OWNER]
        await owner.ensure(
            [s for s in ALL_STREAMS if s.name in spec.streams], [b for b in ALL_BUCKETS if b.name in spec.buckets]
        )
        await owner.publish_raw(f"temporality.dlq.{DURABLE}", b"{}", {"Temporality-Error": "x"})
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc).lower())

    nc = await nats.connect(
        server.url,
        user=OPERATOR_USER,
        password=_password(OPERATOR_USER),
        inbox_prefix=service_inbox(OPERATOR_USER),
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        js = nc.jetstream(timeout=2)
        # what it needs works
        assert (await js.stream_info(DLQ_STREAM.name)).state.messages == 1
        refused = _refused_publishes()
        for subject in refused:
            with pytest.raises(REFUSED):
                await nc.request(subject, b"{}", timeout=1)
        forged = [
            f"temporality.dlq.{DURABLE}",  # forging a dead letter
            "temporality.timers.schedule.human.forged",  # arming a timer
            "temporality.timers.fired.human.forged",  # forging a firing
            f"$KV.{SERVICES[OWNER].buckets[0]}.forged",  # writing a bucket
        ]
        for subject in forged:
            await nc.publish(subject, b"{}")
        for subject in ("_INBOX.>", f"{service_inbox(OWNER)}.>", "temporality.events.>", "temporality.dlq.>"):
            await nc.subscribe(subject)
        needles = [
            *refused,
            *forged,
            "_inbox.>",
            f"{service_inbox(OWNER)}.>",
            "temporality.events.>",
            "temporality.dlq.>",
        ]

        async def all_reported() -> list[str] | None:
            seen = [v for v in violations if "permissions violation" in v]
            return seen if all(any(n.lower() in v for v in seen) for n in needles) else None

        await eventually(all_reported, timeout_s=30, what="the server reporting every refused publish/subscribe")
    finally:
        await nc.close()
    async with _service_bus(server, "journal") as journal:
        assert (await journal.js.stream_info(DLQ_STREAM.name)).state.messages == 1, "the letter survived the purge"
        assert (await journal.js.stream_info(EVENTS_STREAM.name)).state.messages == 0


async def test_a_wrong_password_exits_1_naming_the_user(server: NatsServer) -> None:
    env = _env(_compose()["services"]["tools"])
    assert env["TEMPORALITY_NATS_PASSWORD"] == _password(OPERATOR_USER)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "temporality_embedded.cli",
        "dlq",
        "list",
        env={**os.environ, **env, "TEMPORALITY_NATS_URL": server.url, "TEMPORALITY_NATS_PASSWORD": "not-it"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 1, err
    assert f"as {OPERATOR_USER} failed" in err.decode()


def test_the_role_is_what_the_command_sends_and_no_more() -> None:
    permissions = operator_permissions()
    assert redrive_subjects() == (f"{EVENTS_PREFIX}.>",), "the journal reads every event: one subject covers them"
    assert set(permissions.publish) == {
        "$JS.API.STREAM.INFO.TEMPORALITY_DLQ",
        "$JS.API.STREAM.MSG.GET.TEMPORALITY_DLQ",
        "$JS.API.STREAM.MSG.DELETE.TEMPORALITY_DLQ",
        "$JS.API.CONSUMER.LIST.TEMPORALITY_EVENTS",
        "temporality.events.>",
    }
    assert permissions.subscribe == ("_INBOX.dlq-operator.>",)
    assert not permissions.allow_responses
    assert OPERATOR_USER not in SERVICES
    # in a JetStream domain its API requests move, the events it re-drives do not
    moved = set(permissions.in_domain("hub").publish)
    assert "$JS.hub.API.STREAM.MSG.GET.TEMPORALITY_DLQ" in moved
    assert "temporality.events.>" in moved
    with pytest.raises(ValueError, match="dead-letter operator"):
        nats_authorization([], [OPERATOR_USER])
