"""Schedule triggers (TRG-2): cron ticks through JetStream message schedules, one run per tick with two
replicas, a disabled trigger stops ticking, a missed tick follows its policy. Real nats-server; the
replicas are the real ``configure`` + ``run_until`` (``gateway_support.replicas``)."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from gateway_support import AGENTS, AS_ADMIN, AS_OPERATOR, eventually, journal, replicas

from temporality_bus import Bus, Timers
from temporality_protocol import RunRequested
from temporality_protocol.catalog import TIMER_NS_TRIGGER_SCHEDULE
from temporality_testing.waiting import stays
from temporality_trigger_gateway import Settings
from temporality_trigger_gateway.schedule import Tick, next_tick, tick_events
from temporality_trigger_gateway.store import validate_spec
from temporality_trigger_gateway.triggers import ScheduleTrigger


def _schedule(trigger_id: str = "every-2s", **changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "id": trigger_id,
        "name": "Every two seconds",
        "type": "schedule",
        "cron": "* * * * * */2",  # croniter: the sixth field is seconds
        "agent": "reviewer",
        "prompt": "Summarise what happened before ${tick}",
        "human": {"allowed_recipients": ["user:alice"]},
    }
    spec.update(changes)
    return spec


def _trigger(**changes: Any) -> ScheduleTrigger:
    trigger = validate_spec(_schedule(**changes), environ={}, agents=AGENTS)
    assert isinstance(trigger, ScheduleTrigger)
    return trigger


# --------------------------------------------------------------------------- pure
def test_next_tick_reads_the_cron_in_the_trigger_s_time_zone() -> None:
    nightly = _trigger(cron="0 3 * * *", timezone="Europe/Berlin")
    winter = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
    assert next_tick(nightly, winter) == datetime(2026, 1, 11, 2, 0, tzinfo=UTC)  # 03:00 CET
    summer = datetime(2026, 7, 10, 12, 0, tzinfo=UTC)
    assert next_tick(nightly, summer) == datetime(2026, 7, 11, 1, 0, tzinfo=UTC)  # 03:00 CEST


def test_a_tick_makes_one_deterministic_run_and_a_late_one_follows_the_missed_policy() -> None:
    at = datetime(2026, 1, 10, 3, 0, tzinfo=UTC)
    events = tick_events(_trigger(), at, now=at + timedelta(seconds=1))
    assert [e.type for e in events] == ["trigger.received", "trigger.accepted", "run.requested"]
    again = tick_events(_trigger(), at, now=at + timedelta(seconds=30))
    assert [e.id for e in again] == [e.id for e in events]  # a redelivered firing: the same ids
    requested = events[-1].payload(RunRequested)
    assert requested.launch.kind == "schedule"
    assert requested.input["prompt"] == "Summarise what happened before 2026-01-10T03:00:00+00:00"
    assert requested.human.allowed_recipients == ["user:alice"]
    late = at + timedelta(hours=2)
    assert tick_events(_trigger(), at, now=late)[-1].type == "run.requested"  # run_once (default)
    skipped = tick_events(_trigger(missed={"policy": "skip", "grace_s": 60}), at, now=late)
    assert [e.type for e in skipped] == ["trigger.received", "trigger.rejected"]
    assert skipped[-1].data["reason"] == "missed_tick"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cron": "61 * * * *"}, "not a valid cron expression"),
        ({"cron": "every day"}, "String should match pattern"),
        ({"timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"missed": {"policy": "later"}}, "Input should be 'run_once' or 'skip'"),
        ({"input": {"t": "payload.tick"}, "prompt": "${nope}"}, "the template uses nope"),
    ],
)
def test_an_invalid_schedule_trigger_is_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _trigger(**changes)


# --------------------------------------------------------------------------- two replicas, real ticks
async def _runs(bus: Bus) -> list[RunRequested]:
    return [e.payload(RunRequested) for e in await journal(bus) if e.type == "run.requested"]


async def test_two_replicas_make_exactly_one_run_per_tick_and_stop_when_disabled(
    gateway_settings: Settings, bus: Bus
) -> None:
    async with replicas(gateway_settings) as (a, b):
        created = await a.post("/triggers", json=_schedule(), headers=AS_ADMIN)
        assert created.status_code == 201, created.text

        async def three_ticks() -> bool:
            return len({r.event.id for r in await _runs(bus) if r.event is not None}) >= 3

        await eventually(three_ticks, timeout_s=30, what="three ticks")
        disabled = await b.post("/triggers/every-2s/disable", headers=AS_OPERATOR)
        assert disabled.status_code == 200

        async def settled_count() -> int:
            return len(await _runs(bus))

        count = await settled_count()
        await asyncio.sleep(0)  # let the cancel reach the server before the settle window starts

        async def no_new_runs() -> bool:
            # at most one tick already in flight when it was disabled may still land
            return await settled_count() <= count + 1

        await stays(no_new_runs, settle_s=5, what="no ticks after disable")
        events = await journal(bus)
        runs = [e.payload(RunRequested) for e in events if e.type == "run.requested"]
        per_tick = Counter(r.event.id for r in runs if r.event is not None)
        assert per_tick
        assert set(per_tick.values()) == {1}, per_tick  # one run per tick, never two
        accepted = Counter(e.data["source_event_id"] for e in events if e.type == "trigger.accepted")
        assert set(accepted.values()) == {1}
        assert all(r.launch.kind == "schedule" and r.launch.trigger_id == "every-2s" for r in runs)
        ticks = sorted(datetime.fromisoformat(r.event.payload["tick"]) for r in runs if r.event is not None)
        assert all((later - earlier) >= timedelta(seconds=2) for earlier, later in itertools.pairwise(ticks))


async def test_a_tick_armed_for_an_old_revision_or_a_deleted_trigger_starts_nothing(
    gateway_settings: Settings, bus: Bus
) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        nightly = _schedule("nightly", cron="0 3 * * *")
        assert (await a.post("/triggers", json=nightly, headers=AS_ADMIN)).status_code == 201
        timers = Timers(bus, TIMER_NS_TRIGGER_SCHEDULE)
        now = datetime.now(UTC)
        stale = Tick(trigger_id="nightly", at=now, revision=0).model_dump_json().encode()
        gone = Tick(trigger_id="ghost", at=now, revision=1).model_dump_json().encode()
        await timers.arm("ghost", now, gone)  # fires at once
        await timers.arm("stale", now, stale, target_key="nightly")

        async def both_fired() -> bool:
            info = await bus.js.consumer_info("TEMPORALITY_TIMERS", "trigger-gateway-schedules")
            return info.num_pending == 0 and info.num_ack_pending == 0 and (info.delivered.stream_seq or 0) > 0

        await eventually(both_fired, what="the stray ticks handled")
        await stays(lambda: _no_runs(bus), settle_s=1.5, what="no run from stray ticks")


async def _no_runs(bus: Bus) -> bool:
    return not await _runs(bus)
