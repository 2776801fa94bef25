"""SEC-1/AP-11 for timer firings, which carry no envelope: the sender of a firing is its ``Nats-Scheduler``
header (set by nats-server, never by a publisher), held against the owner of the fired namespace.

On a real nats-server with every service's catalogue permissions: each service's timers live in a stream of
their own, and a schedule fires only onto a subject of its own stream, so the server refuses the
trigger-gateway's schedule aimed at human-interaction's deadline subject. Where one stream holds several
services' namespaces (the one ``TEMPORALITY_TIMERS`` stream of older releases, until it is migrated) the
server takes it (a schedule's target is not checked against the publisher's permissions); human-interaction's
deadline consumer, its raw handler wrapped by :func:`temporality_bus.timers.checking_firings` (as the service
runtime wraps every raw handler), dead-letters and journals that firing and never hands it over, while its own
deadline fires as always."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nats.js.errors import BadRequestError

from temporality_bus import Bus, Consumer, Delivery, NatsSettings, SourceCheck, Timers, TransientError, schedule_at
from temporality_bus.provenance import SCHEDULER_HEADER, forged_firing
from temporality_bus.timers import checking_firings
from temporality_embedded.natsserver import NatsServer, NatsUser
from temporality_protocol import BusDeadLettered
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    CONSUMERS,
    DLQ_STREAM,
    EVENTS_STREAM,
    LEGACY_TIMERS_STREAM,
    TIMER_FIRED_HUMAN,
    TIMER_NS_HUMAN,
    TIMER_NS_TRIGGER_DEBOUNCE,
    TIMER_SCHEDULE_HUMAN,
    TIMER_SCHEDULE_PREFIX,
)
from temporality_protocol.permissions import permissions_for
from temporality_testing.events import EventLog

GATEWAY_DEBOUNCE = f"{TIMER_SCHEDULE_PREFIX}.{TIMER_NS_TRIGGER_DEBOUNCE}"
RETENTION_SCHEDULE = f"{TIMER_SCHEDULE_PREFIX}.run-retention"
WATCHDOG_SCHEDULE = f"{TIMER_SCHEDULE_PREFIX}.run-watchdog"
FIRED_RETENTION = "temporality.timers.fired.run-retention.run-1"


# --------------------------------------------------------------------------- the rule
@pytest.mark.parametrize(
    ("subject", "scheduler", "strict", "claimed"),
    [
        # the owner's own schedule: always fine, in the fired namespace or another of its own
        (f"{TIMER_FIRED_HUMAN}.hr-1", f"{TIMER_SCHEDULE_HUMAN}.hr-1", None, None),
        (f"{TIMER_FIRED_HUMAN}.hr-1", f"{TIMER_SCHEDULE_HUMAN}.hr-1.rearm", None, None),
        (FIRED_RETENTION, f"{WATCHDOG_SCHEDULE}.run-1", None, None),  # both the run-executor's
        # another service's schedule fired onto the human timers: refused in both modes
        (f"{TIMER_FIRED_HUMAN}.hr-1", f"{GATEWAY_DEBOUNCE}.x", "armed by trigger-gateway", "armed by trigger-gateway"),
        (FIRED_RETENTION, f"{TIMER_SCHEDULE_HUMAN}.x", "armed by human-interaction", "armed by human-interaction"),
        # no scheduler (published by hand, not fired by the server): strict refuses, claimed lets a test's through
        (f"{TIMER_FIRED_HUMAN}.hr-1", None, "without Nats-Scheduler", None),
        # a scheduler no service arms: strict refuses, claimed has no claim to hold against the owner
        (f"{TIMER_FIRED_HUMAN}.hr-1", f"{TIMER_SCHEDULE_PREFIX}.nobody.x", "no service's timer schedule", None),
        (f"{TIMER_FIRED_HUMAN}.hr-1", "somewhere.else", "no service's timer schedule", None),
    ],
)
def test_a_firing_is_checked_against_the_owner_of_its_namespace(
    subject: str, scheduler: str | None, strict: str | None, claimed: str | None
) -> None:
    headers = {SCHEDULER_HEADER: scheduler} if scheduler is not None else {}
    modes: tuple[tuple[SourceCheck, str | None], ...] = (("strict", strict), ("claimed", claimed))
    for mode, expected in modes:
        why = forged_firing(subject, headers, mode)
        if expected is None:
            assert why is None, (mode, why)
        else:
            assert why is not None, mode
            assert expected in why, (mode, why)
    assert forged_firing(subject, headers, "off") is None


def test_a_message_that_is_no_firing_is_not_checked() -> None:
    for subject in ("temporality.events.run.failed", TIMER_FIRED_HUMAN, f"{TIMER_SCHEDULE_HUMAN}.hr-1"):
        assert forged_firing(subject, None, "strict") is None


def test_the_refusal_names_the_scheduler_and_the_owner() -> None:
    why = forged_firing(f"{TIMER_FIRED_HUMAN}.hr-1", {SCHEDULER_HEADER: f"{GATEWAY_DEBOUNCE}.x"}, "strict")
    assert why == (
        f"Nats-Scheduler '{GATEWAY_DEBOUNCE}.x' was armed by trigger-gateway, but the 'human' timers are "
        "human-interaction's"
    )


# --------------------------------------------------------------------------- on the real server
PASSWORDS = {"trigger-gateway": "gateway-password-0123456789", "human-interaction": "human-password-0123456789"}
ADMIN = ("test-admin", "admin-password-0123456789")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server where the two services have their catalogue permissions (and a test user has all)."""
    users: dict[str, NatsUser] = {name: (pw, permissions_for(name)) for name, pw in PASSWORDS.items()}
    users[ADMIN[0]] = (ADMIN[1], None)
    nats_server = NatsServer(tmp_path / "nats", users=users)
    nats_server.start()
    try:
        yield nats_server
    finally:
        nats_server.stop()


@contextlib.asynccontextmanager
async def _as(server: NatsServer, user: str, password: str, mode: SourceCheck = "strict") -> AsyncIterator[Bus]:
    settings = NatsSettings(
        url=server.url, user=user, password=password, ack_wait_s=2.0, drain_timeout_s=2.0, source_check=mode
    )
    async with Bus.connect(settings, name=user if user in PASSWORDS else "test") as bus:
        yield bus


async def _dead_letters(bus: Bus, durable: str) -> int:
    info = await bus.js.stream_info(DLQ_STREAM.name, subjects_filter=f"temporality.dlq.{durable}")
    return int((info.state.subjects or {}).get(f"temporality.dlq.{durable}", 0))


async def test_the_server_refuses_a_schedule_aimed_at_another_service_s_timers(server: NatsServer) -> None:
    """Per-service timers streams: a schedule may target only a subject of its own stream (ADR-51)."""
    async with _as(server, *ADMIN) as admin:
        await admin.ensure(ALL_STREAMS, ALL_BUCKETS)
    async with _as(server, "trigger-gateway", PASSWORDS["trigger-gateway"]) as gateway:
        at = datetime.now(UTC) + timedelta(seconds=1)
        schedule = {"Nats-Schedule": f"@at {at:%Y-%m-%dT%H:%M:%SZ}", "Nats-Schedule-Target": f"{TIMER_FIRED_HUMAN}.x"}
        with pytest.raises(BadRequestError) as refused:
            await gateway.js.publish(f"{GATEWAY_DEBOUNCE}.forge", b"forged", headers=schedule)
        assert "target" in str(refused.value.description), refused.value
        with pytest.raises(TransientError):  # what Timers / schedule_at make of it
            await schedule_at(
                gateway,
                schedule_subject=f"{GATEWAY_DEBOUNCE}.forge",
                target_subject=f"{TIMER_FIRED_HUMAN}.hr-forged",
                at=at,
                payload=b"forged",
                msg_id=None,
            )
    async with _as(server, *ADMIN) as admin:
        human = await admin.js.stream_info(Timers(admin, TIMER_NS_HUMAN).stream, subjects_filter=">")
        assert not human.state.subjects, "nothing reached human-interaction's timers stream"


@pytest.mark.parametrize("mode", ["strict", "claimed"])
async def test_another_service_s_schedule_fired_onto_human_deadlines_is_dead_lettered_never_handled(
    server: NatsServer, mode: SourceCheck
) -> None:
    spec = CONSUMERS["human-interaction-deadlines"]
    async with contextlib.AsyncExitStack() as stack:
        # the layout of older releases: one timers stream for every service's namespaces (until it is migrated)
        admin = await stack.enter_async_context(_as(server, *ADMIN, mode))
        await admin.ensure([EVENTS_STREAM, DLQ_STREAM, LEGACY_TIMERS_STREAM], ALL_BUCKETS)
        spec = dataclasses.replace(spec, stream=LEGACY_TIMERS_STREAM.name)
        journal = await EventLog(admin.nc).start()
        stack.push_async_callback(journal.stop)
        human = await stack.enter_async_context(_as(server, "human-interaction", PASSWORDS["human-interaction"], mode))
        gateway = await stack.enter_async_context(_as(server, "trigger-gateway", PASSWORDS["trigger-gateway"], mode))

        handled: list[bytes] = []

        async def deadline(data: bytes, delivery: Delivery) -> None:
            handled.append(data)

        stop = asyncio.Event()
        # (as the admin: human-interaction's user may consume only from its own timers stream)
        consumer = Consumer(admin, spec, raw_handler=checking_firings(deadline, mode))
        task = asyncio.create_task(consumer.run(stop))
        stack.push_async_callback(asyncio.wait_for, task, 10)
        stack.callback(stop.set)

        at = datetime.now(UTC) + timedelta(seconds=1)
        # a publisher cannot claim a scheduler: the server refuses the schedule
        with pytest.raises(BadRequestError, match="invalid scheduler"):
            await gateway.js.publish(
                f"{GATEWAY_DEBOUNCE}.claim",
                b"claimed",
                headers={
                    "Nats-Schedule": f"@at {at:%Y-%m-%dT%H:%M:%SZ}",
                    "Nats-Schedule-Target": f"{TIMER_FIRED_HUMAN}.hr-claimed",
                    SCHEDULER_HEADER: f"{TIMER_SCHEDULE_HUMAN}.hr-claimed",
                },
            )
        # but in one stream it can aim a schedule of its own namespace at another service's timers: the server takes it
        await schedule_at(
            gateway,
            schedule_subject=f"{GATEWAY_DEBOUNCE}.forge",
            target_subject=f"{TIMER_FIRED_HUMAN}.hr-forged",
            at=at,
            payload=b"forged",
            msg_id=None,
        )
        await Timers(human, TIMER_NS_HUMAN, stream=LEGACY_TIMERS_STREAM).arm(
            "hr-real", at, b"real"
        )  # human-interaction's own deadline

        [record] = await journal.wait_for(
            "bus.dead_lettered", where=lambda e: e.data.get("consumer") == spec.durable, timeout_s=20
        )
        refused = record.payload(BusDeadLettered)
        assert refused.subject == f"{TIMER_FIRED_HUMAN}.hr-forged"
        assert refused.error.startswith("ForgedEvent: Nats-Scheduler")
        assert "armed by trigger-gateway" in refused.error
        assert refused.deliveries == 1  # refused at once, never retried
        deadline_s = time.monotonic() + 20
        while handled != [b"real"] or await _dead_letters(admin, spec.durable) != 1:
            assert time.monotonic() < deadline_s, (handled, await _dead_letters(admin, spec.durable))
            await asyncio.sleep(0.05)
        assert b"forged" not in handled


def test_with_the_check_off_the_handler_is_not_wrapped() -> None:
    async def handler(data: bytes, delivery: Delivery) -> None:
        raise AssertionError("never called")

    assert checking_firings(handler, "off") is handler
    assert checking_firings(handler, "strict") is not handler
