"""SEC-1 for timers: each service's timers live in a stream of its own (``TEMPORALITY_TIMERS_<SERVICE>``), so no
other service can stop, arm, replace or purge them, and an older release's one ``TEMPORALITY_TIMERS`` stream is
migrated into them without a timer going missing.

On a real nats-server, each service logged in with its generated permissions (``permissions_for``). The control
case runs the same attack against the one shared stream of older releases and shows it worked there: ADR-51's
"atomic stop" (a publish on one's own schedule subject with ``Nats-Scheduler: <another schedule>`` and
``Nats-Schedule-Next: purge``) purges any schedule *of the same stream*."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import nats.errors
import pytest
from e2e_support import eventually
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError, NotFoundError
from pydantic import SecretStr

from temporality_bus import Bus, NatsSettings, Timers, TransientError
from temporality_bus.provenance import SCHEDULER_HEADER, forged_firing
from temporality_bus.timers import LEGACY_FIRING_KEY, migrate_legacy_timers
from temporality_embedded.cli import main
from temporality_embedded.natsserver import NatsServer, NatsUser
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
    TIMER_SCHEDULE_HUMAN,
    TIMER_SCHEDULE_PREFIX,
    TIMERS_STREAMS,
    service_problems,
)
from temporality_protocol.permissions import permissions_for, service_inbox
from temporality_service.runtime import Runtime, run_until
from temporality_service.settings import ServiceSettings

PASSWORDS = {name: f"{name}-password-0123456789" for name in SERVICES}
ADMIN = ("admin", "admin-password-0123456789")
HUMAN_STREAM = TIMERS_STREAMS["human-interaction"].name
GATEWAY_STREAM = TIMERS_STREAMS["trigger-gateway"].name
#: What the attacker (the trigger-gateway's user) aims at: human-interaction's deadline of one request.
VICTIM = f"{TIMER_SCHEDULE_HUMAN}.hr-victim"
#: nats-py's answer to a publish the server refused for permissions (the request never reaches JetStream).
REFUSED = (nats.errors.TimeoutError, nats.errors.NoRespondersError)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    users: dict[str, NatsUser] = {name: (pw, permissions_for(name)) for name, pw in PASSWORDS.items()}
    users[ADMIN[0]] = (ADMIN[1], None)
    nats_server = NatsServer(tmp_path / "nats", users=users)
    nats_server.start()
    try:
        yield nats_server
    finally:
        nats_server.stop()


@contextlib.asynccontextmanager
async def _bus(server: NatsServer, user: str) -> AsyncIterator[Bus]:
    """A Bus as ``user`` (a service: its generated permissions and inbox prefix; ``admin``: full access)."""
    password = ADMIN[1] if user == ADMIN[0] else PASSWORDS[user]
    settings = NatsSettings(url=server.url, user=user, password=SecretStr(password), drain_timeout_s=2.0)
    inbox = service_inbox(user) if user in SERVICES else "_INBOX"
    async with Bus.connect(settings, name=user, inbox_prefix=inbox) as bus:
        yield bus


async def _attacker(server: NatsServer, violations: list[str]) -> NATS:
    """The trigger-gateway's user, plain nats-py (as a compromised service would use it)."""

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc))

    return await nats.connect(
        server.url,
        user="trigger-gateway",
        password=PASSWORDS["trigger-gateway"],
        inbox_prefix=service_inbox("trigger-gateway"),
        error_cb=on_error,
        allow_reconnect=False,
    )


async def _is_schedule(bus: Bus, stream: str, subject: str) -> bool:
    try:
        last = await bus.js.get_last_msg(stream, subject)
    except NotFoundError:
        return False
    return bool(last.headers and "Nats-Schedule" in last.headers)


def _at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_a_service_cannot_stop_arm_or_purge_another_service_s_timer_which_still_fires(
    server: NatsServer,
) -> None:
    async with _bus(server, ADMIN[0]) as admin:
        await admin.ensure(ALL_STREAMS, ALL_BUCKETS)
    violations: list[str] = []
    async with _bus(server, "human-interaction") as human:
        # B = human-interaction: its deadline, and its own durable reading its firings (as the service does)
        deadlines = CONSUMERS["human-interaction-deadlines"]
        assert deadlines.stream == HUMAN_STREAM
        reader = await human.js.pull_subscribe(f"{TIMER_FIRED_HUMAN}.>", durable=deadlines.durable, stream=HUMAN_STREAM)
        victim_at = datetime.now(UTC) + timedelta(seconds=20)  # after every attempt below
        await Timers(human, TIMER_NS_HUMAN).arm("hr-victim", victim_at, b"victim")

        # A = trigger-gateway, logged in with its generated permissions
        gateway = await _attacker(server, violations)
        js = gateway.jetstream()
        try:
            # 1. the atomic stop, on its own schedule subject: stored in *its* stream, where no such schedule is
            stop = {SCHEDULER_HEADER: VICTIM, "Nats-Schedule-Next": "purge"}
            ack = await js.publish(f"{TIMER_SCHEDULE_PREFIX}.trigger-debounce.stop", b"", headers=stop)
            assert ack.stream == GATEWAY_STREAM
            # 2. arming (replacing) B's timer, cancelling it, or stopping it from B's own subject: not its subject
            for headers in (
                {"Nats-Schedule": f"@at {_at(3600)}", "Nats-Schedule-Target": f"{TIMER_FIRED_HUMAN}.hr-victim"},
                {"Nats-Rollup": "sub", "Nats-TTL": "60s"},
                {SCHEDULER_HEADER: VICTIM, "Nats-Schedule-Next": "purge"},
            ):
                with pytest.raises(REFUSED):
                    await gateway.request(VICTIM, b"", timeout=1, headers=headers)
            # 3. a schedule of its own aimed at B's firings: the server refuses a target outside the stream
            aimed = {"Nats-Schedule": f"@at {_at(1)}", "Nats-Schedule-Target": f"{TIMER_FIRED_HUMAN}.hr-victim"}
            with pytest.raises(BadRequestError):
                await js.publish(f"{TIMER_SCHEDULE_PREFIX}.trigger-debounce.aimed", b"forged", headers=aimed)
            # 4. purging or deleting in B's stream, or purging its own stream: no JetStream API for that
            purge = json.dumps({"filter": VICTIM}).encode()
            for api in (
                f"$JS.API.STREAM.PURGE.{HUMAN_STREAM}",
                f"$JS.API.STREAM.MSG.DELETE.{HUMAN_STREAM}",
                f"$JS.API.STREAM.PURGE.{GATEWAY_STREAM}",
                f"$JS.API.STREAM.UPDATE.{HUMAN_STREAM}",
                f"$JS.API.CONSUMER.CREATE.{HUMAN_STREAM}.{deadlines.durable}",
            ):
                with pytest.raises(REFUSED):
                    await gateway.request(api, purge, timeout=1)

            async def refused_all() -> list[str] | None:
                seen = [v.lower() for v in violations if "permissions violation" in v.lower()]
                needles = (VICTIM, f"$js.api.stream.purge.{HUMAN_STREAM}", f"$js.api.stream.purge.{GATEWAY_STREAM}")
                return seen if all(any(n.lower() in v for v in seen) for n in needles) else None

            await eventually(refused_all, timeout_s=10, what="the server reporting each refused publish")
        finally:
            await gateway.close()

        async with _bus(server, ADMIN[0]) as admin:
            assert await _is_schedule(admin, HUMAN_STREAM, VICTIM), "B's schedule was stopped or replaced"

        # B's deadline fires, at its time, to B, scheduled by B (its consumers' sender check takes it)
        [msg] = await _fetch_msgs(reader, {f"{TIMER_FIRED_HUMAN}.hr-victim"})
        assert msg.subject == f"{TIMER_FIRED_HUMAN}.hr-victim"
        assert msg.data == b"victim"
        assert msg.headers is not None
        assert msg.headers[SCHEDULER_HEADER] == VICTIM
        assert forged_firing(msg.subject, msg.headers, "strict") is None
        assert datetime.now(UTC) >= victim_at.replace(microsecond=0)
        await reader.unsubscribe()


async def test_in_the_one_shared_stream_of_older_releases_the_same_stop_worked(server: NatsServer) -> None:
    """The control: the attack above, against the layout this release replaces, purges B's schedule at once."""
    async with _bus(server, ADMIN[0]) as admin:
        await admin.ensure([EVENTS_STREAM, DLQ_STREAM, LEGACY_TIMERS_STREAM])
        later = datetime.now(UTC) + timedelta(hours=1)
        await Timers(admin, TIMER_NS_HUMAN, stream=LEGACY_TIMERS_STREAM).arm("hr-victim", later, b"victim")
        assert await _is_schedule(admin, LEGACY_TIMERS_STREAM.name, VICTIM)
        violations: list[str] = []
        gateway = await _attacker(server, violations)
        try:
            stop = {SCHEDULER_HEADER: VICTIM, "Nats-Schedule-Next": "purge"}
            ack = await gateway.jetstream().publish(f"{TIMER_SCHEDULE_PREFIX}.trigger-debounce.stop", b"", headers=stop)
            assert ack.stream == LEGACY_TIMERS_STREAM.name
        finally:
            await gateway.close()
        assert not await _is_schedule(admin, LEGACY_TIMERS_STREAM.name, VICTIM), "the shared stream's gap is gone?"


async def _fetch_all(sub: JetStreamContext.PullSubscription, want: set[str], timeout_s: float = 60) -> list[str]:
    """Fetch (and ack) firings until every subject of ``want`` came; the subjects in the order they came."""
    return [msg.subject for msg in await _fetch_msgs(sub, want, timeout_s)]


async def _fetch_msgs(sub: JetStreamContext.PullSubscription, want: set[str], timeout_s: float = 60) -> list[Msg]:
    """Fetch (and ack) firings until every subject of ``want`` came, each checked as its consumers check it."""
    got: list[Msg] = []
    until = asyncio.get_running_loop().time() + timeout_s
    while not want <= {msg.subject for msg in got}:
        if asyncio.get_running_loop().time() > until:
            raise AssertionError(f"within {timeout_s}s only {[m.subject for m in got]} of {sorted(want)} fired")
        # an empty fetch: nats-py raises its TimeoutError, or asyncio's when the request itself timed out
        with contextlib.suppress(nats.errors.TimeoutError, TimeoutError):
            for msg in await sub.fetch(10, timeout=2):
                assert msg.headers is not None
                assert forged_firing(msg.subject, msg.headers, "strict") is None, msg.headers
                got.append(msg)
                await msg.ack()
    return got


async def test_upgrading_moves_the_legacy_timers_into_the_service_streams_and_none_goes_missing(
    server: NatsServer,
) -> None:
    legacy = LEGACY_TIMERS_STREAM
    async with _bus(server, ADMIN[0]) as admin:
        # an older release's layout: one timers stream, the deadlines durable on it
        await admin.ensure([EVENTS_STREAM, DLQ_STREAM, legacy])
    # a new service started on its own user before the migration cannot create its stream, and says what to do
    settings = ServiceSettings(
        nats=NatsSettings(url=server.url, user="human-interaction", password=PASSWORDS["human-interaction"])
    )

    async def setup(runtime: Runtime[ServiceSettings]) -> None:
        raise AssertionError("set up without its timers stream")

    with pytest.raises(RuntimeError, match="timers-migrate"):
        await run_until(SERVICES["human-interaction"], settings, setup, asyncio.Event())
    async with _bus(server, ADMIN[0]) as admin:
        human = Timers(admin, TIMER_NS_HUMAN, stream=legacy)
        watchdog = Timers(admin, TIMER_NS_RUN_WATCHDOG, stream=legacy)
        old_reader = await admin.js.pull_subscribe(
            f"{TIMER_FIRED_HUMAN}.>", durable="human-interaction-deadlines", stream=legacy.name
        )
        await human.arm("hr-acked", datetime.now(UTC), b"taken before the upgrade")
        assert await _fetch_all(old_reader, {f"{TIMER_FIRED_HUMAN}.hr-acked"}) == [f"{TIMER_FIRED_HUMAN}.hr-acked"]
        await old_reader.unsubscribe()
        await human.arm("hr-fired", datetime.now(UTC), b"fired, never taken")

        async def stored() -> int:
            info = await admin.js.stream_info(legacy.name, subjects_filter=f"{TIMER_FIRED_HUMAN}.hr-fired")
            return (info.state.subjects or {}).get(f"{TIMER_FIRED_HUMAN}.hr-fired", 0)

        await eventually(stored, timeout_s=20, what="the legacy firing stored")
        later = datetime.now(UTC) + timedelta(seconds=10)  # after the migration
        await human.arm("hr-later", later, b"pending deadline", msg_id="hr-later-1")
        await watchdog.arm("run-1", later, b"pending watchdog")
        await human.arm("hr-cancelled", later, b"cancelled before the upgrade")
        await human.cancel("hr-cancelled")

        # two migrations at once (two services starting without NATS users, or an operator and one)
        first, second = await asyncio.gather(migrate_legacy_timers(admin), migrate_legacy_timers(admin))
        reports = [r for r in (first, second) if r is not None]
        assert reports, "neither migration moved anything"
        assert max(r.schedules for r in reports) == 2  # hr-later and run-1 (hr-cancelled holds a cancel)
        assert max(r.firings for r in reports) == 1  # hr-fired; hr-acked was taken
        with pytest.raises(NotFoundError):
            await admin.js.stream_info(legacy.name)
        assert await migrate_legacy_timers(admin) is None  # nothing left: a later start does nothing
        assert await _is_schedule(admin, HUMAN_STREAM, f"{TIMER_SCHEDULE_HUMAN}.hr-later")
        assert not await _is_schedule(admin, HUMAN_STREAM, f"{TIMER_SCHEDULE_HUMAN}.hr-cancelled")

    # each service reads its firings from its own stream, as its own user, with its durables of the catalogue
    async with _bus(server, "human-interaction") as human_bus, _bus(server, "run-executor") as executor_bus:
        deadlines = CONSUMERS["human-interaction-deadlines"]
        watchdogs = CONSUMERS["run-executor-watchdog"]
        human_reader = await human_bus.js.pull_subscribe(
            f"{TIMER_FIRED_HUMAN}.>", durable=deadlines.durable, stream=deadlines.stream
        )
        executor_reader = await executor_bus.js.pull_subscribe(
            watchdogs.filter_subjects[0], durable=watchdogs.durable, stream=watchdogs.stream
        )
        try:
            fired = await _fetch_all(human_reader, {f"{TIMER_FIRED_HUMAN}.hr-fired", f"{TIMER_FIRED_HUMAN}.hr-later"})
        except AssertionError as exc:
            info = await human_bus.js.stream_info(HUMAN_STREAM, subjects_filter=">")
            cinfo = await human_bus.js.consumer_info(HUMAN_STREAM, deadlines.durable)
            raise AssertionError(f"{exc}; {info.state.subjects} {info.state} {cinfo}") from None
        assert sorted(fired) == [f"{TIMER_FIRED_HUMAN}.hr-fired", f"{TIMER_FIRED_HUMAN}.hr-later"], fired
        assert await _fetch_all(executor_reader, {"temporality.timers.fired.run-watchdog.run-1"}) == [
            "temporality.timers.fired.run-watchdog.run-1"
        ]
        await human_reader.unsubscribe()
        await executor_reader.unsubscribe()
    async with _bus(server, ADMIN[0]) as admin:
        info = await admin.js.stream_info(HUMAN_STREAM, subjects_filter=f"{TIMER_FIRED_HUMAN}.>")
        # once each: neither the taken nor the cancelled one came back, and the concurrent copies made no twin
        assert info.state.subjects == {f"{TIMER_FIRED_HUMAN}.hr-fired": 1, f"{TIMER_FIRED_HUMAN}.hr-later": 1}
        schedules = await admin.js.stream_info(HUMAN_STREAM, subjects_filter=f"{TIMER_SCHEDULE_HUMAN}.>")
        assert not any(LEGACY_FIRING_KEY in s for s in (schedules.state.subjects or {})), "the re-fire was kept"


async def test_an_older_pod_arming_while_the_migration_runs_loses_no_timer(server: NatsServer) -> None:
    """A rolling update keeps the old release's pods until the new ones are ready: they arm timers while the
    migration runs. Every arm the server stored -- in the legacy stream before its subjects moved aside, or in
    the new stream after -- is a schedule of the new stream once the migration is done. (The migration used to
    read the legacy schedules before moving the subjects aside: an arm stored in between was deleted with the
    legacy stream.)"""
    legacy = LEGACY_TIMERS_STREAM
    later = datetime.now(UTC) + timedelta(hours=1)
    async with _bus(server, ADMIN[0]) as admin, _bus(server, ADMIN[0]) as old_pod_bus:
        await admin.ensure([EVENTS_STREAM, DLQ_STREAM, legacy])
        old_pod = Timers(old_pod_bus, TIMER_NS_HUMAN, stream=legacy)
        # many pending schedules: the migration reads them one by one, a wide window for the race
        before = [f"hr-before-{i}" for i in range(300)]
        await old_pod_bus.publish_raw_many(
            [(w.subject, w.payload, w.headers) for w in (old_pod.arm_write(k, later, b"before") for k in before)]
        )
        stored: dict[str, str] = {}  # key -> the stream that stored its arm
        migrated = asyncio.Event()

        async def keep_arming() -> None:
            n = 0
            while not migrated.is_set():
                key, n = f"hr-during-{n}", n + 1
                with contextlib.suppress(TransientError):  # refused while no stream holds the subject: retried
                    stored[key] = (await old_pod.arm(key, later, b"during")).stream

        async def armed_in(stream: str, count: int) -> bool:
            return sum(s == stream for s in stored.values()) >= count

        arming = asyncio.create_task(keep_arming())
        try:
            await eventually(lambda: armed_in(legacy.name, 20), timeout_s=30, what="the old pod arming, legacy")
            report = await migrate_legacy_timers(admin)
            await eventually(lambda: armed_in(HUMAN_STREAM, 1), timeout_s=30, what="the old pod arming, new stream")
        finally:
            migrated.set()
            await arming
        assert report is not None
        in_legacy = sorted(k for k, stream in stored.items() if stream == legacy.name)
        assert len(in_legacy) >= 20
        assert report.schedules == len(before) + len(in_legacy), report
        info = await admin.js.stream_info(HUMAN_STREAM, subjects_filter=f"{TIMER_SCHEDULE_HUMAN}.>")
        subjects = info.state.subjects or {}
        missing = [k for k in [*before, *stored] if f"{TIMER_SCHEDULE_HUMAN}.{k}" not in subjects]
        assert not missing, f"{len(missing)} stored arms are gone: {missing[:5]}"
        for key in (before[0], in_legacy[-1], max(stored, key=lambda k: int(k.rsplit("-", 1)[1]))):
            assert await _is_schedule(admin, HUMAN_STREAM, f"{TIMER_SCHEDULE_HUMAN}.{key}"), key
        with pytest.raises(NotFoundError):
            await admin.js.stream_info(legacy.name)


def test_the_migration_command_says_when_there_is_nothing_to_migrate(
    server: NatsServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TEMPORALITY_NATS_USER", ADMIN[0])
    monkeypatch.setenv("TEMPORALITY_NATS_PASSWORD", ADMIN[1])
    assert main(["timers-migrate", "--nats-url", server.url]) == 0
    assert "nothing to migrate" in capsys.readouterr().out
    monkeypatch.setenv("TEMPORALITY_NATS_USER", "trigger-gateway")  # not allowed to: it fails, and says so
    monkeypatch.setenv("TEMPORALITY_NATS_PASSWORD", PASSWORDS["trigger-gateway"])
    assert main(["timers-migrate", "--nats-url", server.url]) == 1
    assert "error: migrating the legacy timers stream failed" in capsys.readouterr().out


def test_each_service_owns_one_timers_stream_of_its_namespaces_and_gets_rights_on_no_other() -> None:
    for name, spec in SERVICES.items():
        stream = TIMERS_STREAMS.get(name)
        assert (stream is not None) == bool(spec.timers), name
        granted = " ".join(permissions_for(name).publish)
        for other, other_stream in TIMERS_STREAMS.items():
            if other != name:
                assert other_stream.name + "." not in granted + " ", f"{name} has a right on {other_stream.name}"
                assert not any(f"timers.schedule.{ns}." in granted for ns in SERVICES[other].timers), (
                    f"{name} may arm {other}'s"
                )
        assert LEGACY_TIMERS_STREAM.name + "." not in granted, f"{name} has a right on the legacy stream"
        if stream is None:
            continue
        assert stream.name in spec.streams  # it creates and updates its own
        assert sorted(stream.subjects) == sorted(
            f"temporality.timers.{kind}.{ns}.>" for ns in spec.timers for kind in ("schedule", "fired")
        )
        for durable in spec.consumers:
            if CONSUMERS[durable].filter_subjects[0].startswith("temporality.timers."):
                assert CONSUMERS[durable].stream == stream.name, durable
    bad = dict(SERVICES)
    bad["journal"] = dataclasses.replace(bad["journal"], timers=(TIMER_NS_HUMAN,))
    assert any("which is human-interaction's" in p for p in service_problems(bad))
