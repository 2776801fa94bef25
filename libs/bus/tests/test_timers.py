"""Timers against the real nats-server: what ADR-51 message schedules really do on arm, cancel and re-arm."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone

import nats.errors
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from temporality_bus import Bus, Timers, fire_time, parse_fired_subject
from temporality_bus.timers import CANCEL_TTL_S
from temporality_testing.timers import TEST_TIMERS_STREAM

NS = "test"


_OPEN: list[JetStreamContext.PullSubscription] = []


@pytest.fixture
async def bus(bus: Bus) -> AsyncIterator[Bus]:
    """The shared fixture's bus; the readers a test opened are unsubscribed before it drains (an open pull
    subscription makes ``nc.drain()`` wait for its whole timeout: TEST-PEERS.md)."""
    yield bus
    while _OPEN:
        await _OPEN.pop().unsubscribe()


async def _reader(bus: Bus, timers: Timers, durable: str) -> JetStreamContext.PullSubscription:
    sub = await bus.js.pull_subscribe(timers.fired_filter, durable=durable, stream=TEST_TIMERS_STREAM.name)
    _OPEN.append(sub)
    return sub


async def _next(sub: JetStreamContext.PullSubscription, timeout_s: float) -> tuple[Msg, datetime]:
    """The next fired timer and when (by our clock) it arrived."""
    (msg,) = await sub.fetch(1, timeout=timeout_s)
    arrived = datetime.now(UTC)
    await msg.ack()
    return msg, arrived


async def _nothing_fires(sub: JetStreamContext.PullSubscription, for_s: float) -> None:
    with pytest.raises(nats.errors.TimeoutError):
        await sub.fetch(1, timeout=for_s)


async def _schedule_gone(bus: Bus, subject: str, within_s: float = 5.0) -> None:
    """The stream holds no schedule on ``subject`` (waits: the server removes a fired one after publishing)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            await bus.js.get_last_msg(TEST_TIMERS_STREAM.name, subject)
        except nats.js.errors.NotFoundError:
            return
        assert time.monotonic() < deadline, f"a schedule is still stored on {subject}"
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- pure parts
def test_fire_time_rounds_up_to_the_second_and_never_earlier() -> None:
    exact = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert fire_time(exact) == exact
    assert fire_time(exact + timedelta(microseconds=1)) == exact + timedelta(seconds=1)
    assert fire_time(exact + timedelta(milliseconds=999)) == exact + timedelta(seconds=1)
    plus_two = timezone(timedelta(hours=2))
    assert fire_time(datetime(2025, 1, 1, 14, 0, 0, 500, tzinfo=plus_two)) == exact + timedelta(seconds=1)
    with pytest.raises(ValueError, match="aware"):
        fire_time(datetime(2025, 1, 1))  # noqa: DTZ001 - the point of the test


def test_subjects_and_parsing(bus: Bus) -> None:
    timers = Timers(bus, "human")
    assert timers.schedule_subject("hr-1") == "temporality.timers.schedule.human.hr-1"
    assert timers.fired_subject("hr-1.repair") == "temporality.timers.fired.human.hr-1.repair"
    assert timers.fired_filter == "temporality.timers.fired.human.>"
    assert timers.key_of("temporality.timers.fired.human.hr-1.repair") == "hr-1.repair"
    assert parse_fired_subject("temporality.timers.fired.renotify.r-9") == ("renotify", "r-9")
    for bad_subject in ("temporality.timers.fired.human", "temporality.timers.schedule.human.x", "x.y.z"):
        with pytest.raises(ValueError, match="not a fired-timer subject"):
            parse_fired_subject(bad_subject)
    with pytest.raises(ValueError, match="namespace 'other'"):
        timers.key_of("temporality.timers.fired.other.k")
    for bad_key in ("", "a b", "a.*", "a.>", ".a", "a.", "a..b"):
        with pytest.raises(ValueError, match="timer key"):
            timers.schedule_subject(bad_key)
    for bad_ns in ("", "a.b", "*"):
        with pytest.raises(ValueError, match="timer namespace"):
            Timers(bus, bad_ns)


# --------------------------------------------------------------------------- against the server
async def test_an_armed_timer_fires_once_not_before_its_time(bus: Bus) -> None:
    timers = Timers(bus, NS, stream=TEST_TIMERS_STREAM)
    sub = await _reader(bus, timers, "t-fire")
    at = datetime.now(UTC) + timedelta(seconds=1, milliseconds=300)  # not a whole second: rounded up
    result = await timers.arm("k1", at, b"wake up", msg_id="tmr-k1")
    assert not result.duplicate
    msg, arrived = await _next(sub, 15)
    assert arrived >= at  # never early
    assert msg.data == b"wake up"
    assert msg.subject == timers.fired_subject("k1")
    assert msg.headers is not None
    assert msg.headers["Nats-Scheduler"] == timers.schedule_subject("k1")
    assert timers.key_of(msg.subject) == "k1"
    await _nothing_fires(sub, 2.0)  # once
    await _schedule_gone(bus, timers.schedule_subject("k1"))  # a fired @at schedule is removed
    await timers.cancel("k1")  # nothing left to cancel: a no-op
    await _nothing_fires(sub, 1.0)


async def test_a_cancelled_timer_never_fires(bus: Bus) -> None:
    timers = Timers(bus, NS, stream=TEST_TIMERS_STREAM)
    sub = await _reader(bus, timers, "t-cancel")
    at = datetime.now(UTC) + timedelta(seconds=2)
    await timers.arm("k2", at, b"never", msg_id="tmr-k2")
    await timers.arm("other", at, b"still fires")  # cancel removes only its own key
    await timers.cancel("k2")
    await timers.cancel("k2")  # idempotent
    msg, arrived = await _next(sub, 15)
    assert msg.data == b"still fires"
    assert arrived >= at
    await _nothing_fires(sub, 3.0)  # well past k2's time: it never fired


async def test_a_cancelled_key_armed_again_fires_and_the_cancel_expires(bus: Bus) -> None:
    """The cancel is a rollup on the key's subject that schedules nothing: arming the key again replaces it,
    and it leaves nothing behind (``Nats-TTL``)."""
    timers = Timers(bus, NS, stream=TEST_TIMERS_STREAM)
    sub = await _reader(bus, timers, "t-cancel-rearm")
    await timers.arm("k8", datetime.now(UTC) + timedelta(seconds=2), b"cancelled", msg_id="tmr-k8")
    await timers.cancel("k8")
    await timers.rearm("k8", datetime.now(UTC) + timedelta(seconds=1), b"armed again", msg_id="tmr-k8-again")
    msg, _ = await _next(sub, 15)
    assert msg.data == b"armed again"
    await _nothing_fires(sub, 2.0)
    await timers.cancel("k9")  # never armed
    stored = await bus.js.get_last_msg(TEST_TIMERS_STREAM.name, timers.schedule_subject("k9"))
    assert stored.headers is not None
    assert stored.headers.get("Nats-TTL") == f"{CANCEL_TTL_S}s"  # it expires itself


async def test_rearming_later_replaces_the_schedule_and_fires_once_at_the_later_time(bus: Bus) -> None:
    timers = Timers(bus, NS, stream=TEST_TIMERS_STREAM)
    sub = await _reader(bus, timers, "t-later")
    now = datetime.now(UTC)
    first, later = now + timedelta(seconds=1), now + timedelta(seconds=4)
    await timers.arm("k3", first, b"first", msg_id="tmr-k3")
    await timers.rearm("k3", later, b"later", msg_id="tmr-k3-rearm")
    msg, arrived = await _next(sub, 20)
    assert msg.data == b"later"
    assert arrived >= later  # the first schedule did not fire at +1 s
    await _nothing_fires(sub, 2.0)


async def test_rearming_earlier_replaces_the_later_schedule(bus: Bus) -> None:
    timers = Timers(bus, NS, stream=TEST_TIMERS_STREAM)
    sub = await _reader(bus, timers, "t-earlier")
    now = datetime.now(UTC)
    await timers.arm("k4", now + timedelta(hours=1), b"in an hour", msg_id="tmr-k4")
    await timers.rearm("k4", now + timedelta(seconds=1), b"soon", msg_id="tmr-k4-rearm")
    msg, _ = await _next(sub, 15)
    assert msg.data == b"soon"
    # the hour-long schedule was replaced, not kept beside the new one: nothing is left to fire
    await _schedule_gone(bus, timers.schedule_subject("k4"))


async def test_the_same_msg_id_is_deduplicated_a_new_one_arms_again_after_firing(bus: Bus) -> None:
    timers = Timers(bus, NS, stream=TEST_TIMERS_STREAM)
    sub = await _reader(bus, timers, "t-dedupe")
    at = datetime.now(UTC) + timedelta(seconds=1)
    assert not (await timers.arm("k5", at, b"one", msg_id="tmr-k5")).duplicate
    assert (await timers.arm("k5", at, b"two", msg_id="tmr-k5")).duplicate  # a redelivered arm: dropped
    msg, _ = await _next(sub, 15)
    assert msg.data == b"one"
    await _nothing_fires(sub, 1.5)
    # after it fired, the same id is still inside the duplicate window: a re-arm needs its own id
    assert (await timers.rearm("k5", datetime.now(UTC), b"three", msg_id="tmr-k5")).duplicate
    await timers.rearm("k5", datetime.now(UTC), b"again", msg_id="tmr-k5-again")  # in the past: fires at once
    msg, _ = await _next(sub, 15)
    assert msg.data == b"again"


async def test_a_target_key_fires_another_keys_subject(bus: Bus) -> None:
    timers = Timers(bus, NS, stream=TEST_TIMERS_STREAM)
    sub = await _reader(bus, timers, "t-target")
    await timers.arm("k6.rearm", datetime.now(UTC), b"as k6", target_key="k6")
    msg, _ = await _next(sub, 15)
    assert msg.subject == timers.fired_subject("k6")
    assert msg.headers is not None
    assert msg.headers["Nats-Scheduler"] == timers.schedule_subject("k6.rearm")


async def test_namespaces_do_not_see_each_others_timers(bus: Bus) -> None:
    mine, theirs = Timers(bus, "ns-a", stream=TEST_TIMERS_STREAM), Timers(bus, "ns-b", stream=TEST_TIMERS_STREAM)
    sub = await _reader(bus, mine, "t-ns")
    await theirs.arm("k7", datetime.now(UTC), b"theirs")
    await mine.arm("k7", datetime.now(UTC) + timedelta(seconds=1), b"mine")
    msg, _ = await _next(sub, 15)
    assert msg.data == b"mine"
    await theirs.cancel("k7")  # theirs already fired; cancelling it touches nothing of mine
    await _nothing_fires(sub, 1.0)
