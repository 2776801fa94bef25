"""The timers migration's own NATS user (``timers-migrate``, ``timers_migration_permissions``) on a real nats-server
running the GENERATED authorization (``temporality nats-authorization``: compose's and the chart's file).

The upgrade as it happens in production: an older release's server (no per-service streams, one
``TEMPORALITY_TIMERS`` with pending schedules, a firing no consumer took yet and the old durable) restarts with the
new release's authorization; the services with timers cannot lay out their streams until the migration ran; the
migration runs as its own user in its own process (``python -m temporality_service.timers_migrate``, what the
chart's Job and compose's one-shot run), twice at once; then every service lays out its streams as its own user and
reads its timers there. The same user is refused whatever the migration does not need."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import nats.errors
import pytest
from e2e_support import eventually
from nats.js.errors import BadRequestError, NotFoundError
from pydantic import SecretStr

from temporality_bus import Bus, NatsSettings, Timers
from temporality_embedded.cli import nats_authorization
from temporality_embedded.dlq import OPERATOR_USER
from temporality_embedded.natsserver import NatsServer, password_variable
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    CONSUMERS,
    DLQ_STREAM,
    EVENTS_STREAM,
    LEGACY_TIMERS_STREAM,
    SERVICES,
    TIMER_FIRED_HUMAN,
    TIMER_NS_HUMAN,
    TIMER_NS_RUN_WATCHDOG,
    TIMERS_STREAMS,
    subject_for,
)
from temporality_protocol.permissions import (
    TIMERS_MIGRATION_USER,
    external_agent_inbox,
    service_inbox,
    timers_migration_permissions,
)
from temporality_service.timers_migrate import run

ROOT = Path(__file__).resolve().parents[1]
#: Every user of the generated authorization (the server reads each one's password from its environment).
USERS = (*SERVICES, TIMERS_MIGRATION_USER, OPERATOR_USER)
PASSWORDS = {user: f"{user}-password-{os.urandom(6).hex()}" for user in USERS}
#: nats-py's answer to a request the server refused for permissions (it never reaches JetStream).
REFUSED = (nats.errors.TimeoutError, nats.errors.NoRespondersError)
HUMAN_STREAM = TIMERS_STREAMS["human-interaction"].name
WATCHDOG_FIRED = f"temporality.timers.fired.{TIMER_NS_RUN_WATCHDOG}.run-1"
#: What the chart's Job and compose's one-shot run (in a service image).
MIGRATE_COMMAND = ["python", "-m", "temporality_service.timers_migrate"]


@contextlib.asynccontextmanager
async def _bus(server: NatsServer | str, user: str | None, password: str | None = None) -> AsyncIterator[Bus]:
    """A Bus on ``server`` (or its URL) as ``user`` (a service: its inbox prefix, as the runtime connects; ``None``: no authentication), with
    ``password`` (default: this module's for ``user``)."""
    if user is not None and password is None:
        password = PASSWORDS[user]
    settings = NatsSettings(
        url=server if isinstance(server, str) else server.url,
        user=user,
        password=SecretStr(password) if password else None,
        drain_timeout_s=2.0,
    )
    inbox = service_inbox(user) if user in SERVICES else None
    async with Bus.connect(settings, name=user or "older-release", inbox_prefix=inbox) as bus:
        yield bus


def _new_release_server(root: Path, monkeypatch: pytest.MonkeyPatch) -> NatsServer:
    """The server on ``root``'s JetStream store, restarted with the generated authorization (compose's file)."""
    generated = nats_authorization([], [])
    assert (ROOT / "deploy" / "compose" / "nats-authorization.conf").read_text(encoding="utf-8") == generated
    assert (ROOT / "charts" / "temporality" / "files" / "nats-authorization.conf").read_text(encoding="utf-8") == (
        generated
    )
    root.mkdir(parents=True, exist_ok=True)
    config = root / "auth.conf"
    config.write_text(generated, encoding="utf-8")
    for user in USERS:
        monkeypatch.setenv(password_variable(user), PASSWORDS[user])  # the server reads them from its env
    return NatsServer(root, config_file=config)


async def migrate_process(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run the migration's ``command`` (``python`` as this interpreter) with ``env`` over this process's; its exit
    code and output."""
    executable = [sys.executable if command[0] == "python" else command[0], *command[1:]]
    process = await asyncio.create_subprocess_exec(
        *executable,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode()


async def _migrate_process(server: NatsServer) -> tuple[int, str]:
    """``python -m temporality_service.timers_migrate`` as the migration's user, the environment the Job gets."""
    env = {
        "TEMPORALITY_NATS_URL": server.url,
        "TEMPORALITY_NATS_USER": TIMERS_MIGRATION_USER,
        "TEMPORALITY_NATS_PASSWORD": PASSWORDS[TIMERS_MIGRATION_USER],
    }
    return await migrate_process(MIGRATE_COMMAND, env)


async def _fetch_subjects(bus: Bus, durable: str, want: set[str], timeout_s: float = 90) -> list[str]:
    """Fetch (and ack) as ``bus``'s service, through its durable of the catalogue, until ``want`` all came."""
    consumer = CONSUMERS[durable]
    sub = await bus.js.pull_subscribe(consumer.filter_subjects[0], durable=durable, stream=consumer.stream)
    got: list[str] = []
    try:
        async with asyncio.timeout(timeout_s):
            while not want <= set(got):
                with contextlib.suppress(nats.errors.TimeoutError, TimeoutError):  # an empty fetch
                    for msg in await sub.fetch(10, timeout=2):
                        got.append(msg.subject)
                        await msg.ack()
    except TimeoutError:
        raise AssertionError(f"within {timeout_s}s only {got} of {sorted(want)} came to {durable}") from None
    finally:
        await sub.unsubscribe()
    return got


async def lay_out(server: NatsServer | str, name: str, password: str | None = None) -> None:
    """What a service's runtime does first at start, as its own user: create or update what it owns."""
    spec = SERVICES[name]
    async with _bus(server, name, password) as bus:
        streams = [s for s in ALL_STREAMS if s.name in spec.streams]
        await bus.ensure(streams, [b for b in ALL_BUCKETS if b.name in spec.buckets])


async def older_release(root: Path) -> None:
    """An older release's server on ``root``'s store: one timers stream with the old durables on it, a firing that
    human-interaction's has not taken, a pending deadline and a pending watchdog (due in 30 s); stopped again."""
    older = NatsServer(root)
    older.start()
    try:
        async with _bus(older, None) as bus:
            await bus.ensure([EVENTS_STREAM, DLQ_STREAM, LEGACY_TIMERS_STREAM])
            human = Timers(bus, TIMER_NS_HUMAN, stream=LEGACY_TIMERS_STREAM)
            # the old release's durables of both services: a firing stored before the migration (the watchdog's, when
            # the machine is slow) is fired again only for a consumer that reads it, as in production
            for durable in ("human-interaction-deadlines", "run-executor-watchdog"):
                await bus.js.pull_subscribe(
                    CONSUMERS[durable].filter_subjects[0], durable=durable, stream=LEGACY_TIMERS_STREAM.name
                )
            await human.arm("hr-fired", datetime.now(UTC), b"fired, never taken")

            async def stored() -> int:
                info = await bus.js.stream_info(LEGACY_TIMERS_STREAM.name, subjects_filter=f"{TIMER_FIRED_HUMAN}.>")
                return (info.state.subjects or {}).get(f"{TIMER_FIRED_HUMAN}.hr-fired", 0)

            await eventually(stored, timeout_s=20, what="the older release's firing stored")
            later = datetime.now(UTC) + timedelta(seconds=30)  # after the migration, mostly (either way it comes)
            await human.arm("hr-later", later, b"pending deadline")
            await Timers(bus, TIMER_NS_RUN_WATCHDOG, stream=LEGACY_TIMERS_STREAM).arm("run-1", later, b"watchdog")
    finally:
        older.stop()


async def services_start_and_get_their_timers(server: NatsServer | str, passwords: dict[str, str]) -> None:
    """After the migration: every service lays out what it owns as its own user (``passwords``), and human-
    interaction and the run-executor read the older release's timers through their durables, in their streams."""
    for name in SERVICES:
        await lay_out(server, name, passwords[name])
    async with (
        _bus(server, "human-interaction", passwords["human-interaction"]) as human_bus,
        _bus(server, "run-executor", passwords["run-executor"]) as executor_bus,
    ):
        want = {f"{TIMER_FIRED_HUMAN}.hr-fired", f"{TIMER_FIRED_HUMAN}.hr-later"}
        fired = await _fetch_subjects(human_bus, "human-interaction-deadlines", want)
        assert sorted(fired) == sorted(want), fired
        assert await _fetch_subjects(executor_bus, "run-executor-watchdog", {WATCHDOG_FIRED}) == [WATCHDOG_FIRED]


@pytest.mark.timeout(300)
async def test_the_upgrade_runs_as_the_migration_s_own_user_and_the_services_start_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "nats"
    await older_release(root)
    # the new release's server: same store, the generated users
    server = _new_release_server(root, monkeypatch)
    server.start()
    try:
        # a service with timers cannot lay out its stream before the migration (the old stream holds its subjects)
        with pytest.raises((BadRequestError, NotFoundError)):  # create refused (subjects overlap), update: none
            await lay_out(server, "human-interaction")
        # the migration, as its own user, in two processes at once (the Job retried while one still runs)
        (first, out_first), (second, out_second) = await asyncio.gather(
            _migrate_process(server), _migrate_process(server)
        )
        assert (first, second) == (0, 0), out_first + out_second
        assert "migrated TEMPORALITY_TIMERS" in out_first + out_second, out_first + out_second
        again, out_again = await _migrate_process(server)  # the next upgrade's Job: nothing left
        assert again == 0, out_again
        assert "nothing to migrate" in out_again
        await services_start_and_get_their_timers(server, PASSWORDS)
    finally:
        server.stop()


async def test_the_migration_s_user_is_refused_what_the_migration_does_not_need(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = _new_release_server(tmp_path / "nats", monkeypatch)
    server.start()
    try:
        for name in ("journal", "human-interaction"):  # the events stream, a timers stream and buckets exist
            await lay_out(server, name)
        bucket = SERVICES["human-interaction"].buckets[0]
        violations: list[str] = []

        async def on_error(exc: Exception) -> None:
            violations.append(str(exc).lower())

        nc = await nats.connect(
            server.url,
            user=TIMERS_MIGRATION_USER,
            password=PASSWORDS[TIMERS_MIGRATION_USER],
            inbox_prefix=service_inbox(TIMERS_MIGRATION_USER),
            error_cb=on_error,
            allow_reconnect=False,
        )
        try:
            js = nc.jetstream(timeout=2)
            # what it needs: the timers streams' info (here: the one that exists)
            assert (await js.stream_info(HUMAN_STREAM)).config.name == HUMAN_STREAM
            # an event: not even one the catalogue lets a service send
            with pytest.raises(REFUSED):
                await js.publish(subject_for("human.answered"), b"{}")
            refused = [
                f"$JS.API.STREAM.MSG.GET.KV_{bucket}",  # reading a bucket
                f"$JS.API.DIRECT.GET.KV_{bucket}",
                f"$JS.API.STREAM.INFO.KV_{bucket}",
                f"$JS.API.STREAM.MSG.GET.{HUMAN_STREAM}",  # reading a service's timers
                f"$JS.API.STREAM.UPDATE.{HUMAN_STREAM}",  # changing, purging or deleting a service's stream
                f"$JS.API.STREAM.PURGE.{HUMAN_STREAM}",
                f"$JS.API.STREAM.DELETE.{HUMAN_STREAM}",
                f"$JS.API.STREAM.DELETE.{EVENTS_STREAM.name}",
                f"$JS.API.STREAM.PURGE.{LEGACY_TIMERS_STREAM.name}",  # even the old stream: only what the move does
                f"$JS.API.CONSUMER.CREATE.{HUMAN_STREAM}.human-interaction-deadlines",  # a service's durable
                "$JS.API.STREAM.NAMES",
                "temporality.timers.fired.human.forged",  # a firing, not a schedule
            ]
            for subject in refused:
                with pytest.raises(REFUSED):
                    await nc.request(subject, b"{}", timeout=1)
            await nc.subscribe("_INBOX.>")  # another client's replies
            await nc.subscribe(subject_for("human.answered"))

            async def all_reported() -> list[str] | None:
                seen = [v for v in violations if "permissions violation" in v]
                needles = [subject_for("human.answered"), *refused, "_inbox.>"]
                return seen if all(any(n.lower() in v for v in seen) for n in needles) else None

            await eventually(all_reported, timeout_s=20, what="the server reporting every refused publish/subscribe")
        finally:
            await nc.close()
        async with _bus(server, "journal") as journal:
            assert (await journal.js.stream_info(EVENTS_STREAM.name)).state.messages == 0, (
                "the refused event stayed out"
            )
    finally:
        server.stop()


def test_the_role_is_derived_from_the_catalogue_and_grants_only_the_move() -> None:
    permissions = timers_migration_permissions()
    publish = set(permissions.publish)
    legacy = LEGACY_TIMERS_STREAM.name
    namespaces = {ns for spec in SERVICES.values() for ns in spec.timers}
    assert publish == {
        f"$JS.API.STREAM.INFO.{legacy}",
        f"$JS.API.STREAM.UPDATE.{legacy}",
        f"$JS.API.STREAM.DELETE.{legacy}",
        f"$JS.API.STREAM.MSG.GET.{legacy}",
        f"$JS.API.CONSUMER.LIST.{legacy}",
        *(f"$JS.API.STREAM.{op}.{s.name}" for s in TIMERS_STREAMS.values() for op in ("INFO", "CREATE")),
        *(f"temporality.timers.schedule.{ns}.>" for ns in namespaces),
    }
    assert permissions.subscribe == ("_INBOX.timers-migrate.>",)
    assert not permissions.allow_responses
    assert TIMERS_MIGRATION_USER not in SERVICES
    with pytest.raises(ValueError, match="service's NATS user"):
        external_agent_inbox(TIMERS_MIGRATION_USER)


def test_a_refused_password_fails_the_migration_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Job's exit code and log when its Secret's password is not the server's: 1, saying so; it does not hang."""
    server = _new_release_server(tmp_path / "nats", monkeypatch)
    server.start()
    try:
        settings = NatsSettings(
            url=server.url, user=TIMERS_MIGRATION_USER, password=SecretStr("not-the-password"), reconnect_wait_s=0.05
        )
        assert run(settings) == 1
        out = capsys.readouterr().out
        assert f"error: cannot connect to NATS at {server.url} as {TIMERS_MIGRATION_USER}" in out, out
    finally:
        server.stop()
