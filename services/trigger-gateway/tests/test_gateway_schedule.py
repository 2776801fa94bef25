"""Schedule triggers (TRG-2): cron ticks through JetStream message schedules, one run per tick with two
replicas, a disabled trigger stops ticking, a missed tick follows its policy. Real nats-server; the
replicas are the real ``configure`` + ``run_until`` (``gateway_support.replicas``)."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from gateway_support import AGENTS, AS_ADMIN, AS_OPERATOR, AS_VIEWER, eventually, journal, replicas

from temporality_bus import Bus, NatsSettings, Timers, TransientError
from temporality_bus.listing import stream_subjects
from temporality_embedded.natsserver import NatsServer, NatsUser
from temporality_protocol import RunRequested, run_id_for_delivery
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS, TIMER_NS_TRIGGER_SCHEDULE
from temporality_protocol.permissions import permissions_for
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays
from temporality_trigger_gateway import Settings
from temporality_trigger_gateway.launch import Launcher
from temporality_trigger_gateway.schedule import Scheduler, Tick, next_tick
from temporality_trigger_gateway.store import TriggerRegistry, validate_spec
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


def _trigger(trigger_id: str = "every-2s", **changes: Any) -> ScheduleTrigger:
    trigger = validate_spec(_schedule(trigger_id, **changes), environ={}, agents=AGENTS)
    assert isinstance(trigger, ScheduleTrigger)
    return trigger


# --------------------------------------------------------------------------- pure
def test_next_tick_reads_the_cron_in_the_trigger_s_time_zone() -> None:
    nightly = _trigger(cron="0 3 * * *", timezone="Europe/Berlin")
    winter = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
    assert next_tick(nightly, winter) == datetime(2026, 1, 11, 2, 0, tzinfo=UTC)  # 03:00 CET
    summer = datetime(2026, 7, 10, 12, 0, tzinfo=UTC)
    assert next_tick(nightly, summer) == datetime(2026, 7, 11, 1, 0, tzinfo=UTC)  # 03:00 CEST


async def test_a_tick_makes_one_deterministic_run_and_a_late_one_follows_the_missed_policy(
    bus: Bus, event_log: EventLog
) -> None:
    nightly, skipping = _trigger(), _trigger("skipping", missed={"policy": "skip", "grace_s": 60})
    scheduler = Scheduler(bus, TriggerRegistry.static([nightly, skipping]), launcher=Launcher(bus, retry_after_s=1))
    at = datetime(2026, 1, 10, 3, 0, tzinfo=UTC)
    assert await scheduler.launch_tick(nightly, at, now=at + timedelta(seconds=1)) == "accepted"
    # a redelivered firing is the same delivery: the same ids again, still one run
    assert await scheduler.launch_tick(nightly, at, now=at + timedelta(seconds=30)) == "accepted"
    run_id = run_id_for_delivery("every-2s", "tick:2026-01-10T03:00:00Z")
    (requested,) = await event_log.wait_for("run.requested", run_id=run_id, timeout_s=10)
    run = requested.payload(RunRequested)
    assert run.launch.kind == "schedule"
    assert run.input["prompt"] == "Summarise what happened before 2026-01-10T03:00:00+00:00"
    assert run.human.allowed_recipients == ["user:alice"]
    late = at + timedelta(hours=2)
    assert await scheduler.launch_tick(nightly, at + timedelta(hours=1), now=late) == "accepted"  # run_once
    assert await scheduler.launch_tick(skipping, at, now=late) == "rejected:missed_tick"
    (rejected,) = await event_log.wait_for("trigger.rejected", timeout_s=10)
    assert (rejected.data["trigger_id"], rejected.data["reason"]) == ("skipping", "missed_tick")
    await event_log.caught_up()
    assert len(event_log.of_type("run.requested")) == 2
    assert len(event_log.of_type("trigger.received")) == 3


async def test_a_tick_the_trigger_s_own_expression_fails_on_is_recorded_mapping_failed(
    bus: Bus, event_log: EventLog
) -> None:
    """The trigger is at fault, as for a webhook's or an event trigger's failing expression: journaled
    ``trigger.rejected(invalid_payload)`` with a ``mapping_failed:`` detail, recorded ``mapping_failed`` with the
    tick kept (re-drivable once fixed); the trigger keeps ticking."""
    broken = _trigger("broken", input={"n": "abs(payload.tick)"}, prompt=None)  # the tick is a string
    launcher = Launcher(bus, retry_after_s=1)
    scheduler = Scheduler(bus, TriggerRegistry.static([broken]), launcher=launcher)
    at = datetime(2026, 1, 10, 3, 0, tzinfo=UTC)
    assert await scheduler.launch_tick(broken, at, now=at + timedelta(seconds=1)) == "rejected:invalid_payload"
    (rejected,) = await event_log.wait_for("trigger.rejected", timeout_s=10)
    assert (rejected.data["trigger_id"], rejected.data["reason"]) == ("broken", "invalid_payload")
    assert rejected.data["detail"].startswith("mapping_failed: the trigger's input.n expression failed on the tick")

    async def recorded() -> Any:
        return await launcher.deliveries.get("broken", rejected.data["delivery_id"])

    record = await eventually(recorded, what="the tick's delivery recorded")
    assert (record.state, record.reason, record.detail) == ("rejected", "mapping_failed", rejected.data["detail"])
    assert record.event is not None
    assert record.event.payload["tick"] == "2026-01-10T03:00:00+00:00"


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
            info = await bus.js.consumer_info(timers.stream, "trigger-gateway-schedules")
            return info.num_pending == 0 and info.num_ack_pending == 0 and (info.delivered.stream_seq or 0) > 0

        await eventually(both_fired, what="the stray ticks handled")
        await stays(lambda: _no_runs(bus), settle_s=1.5, what="no run from stray ticks")


async def _no_runs(bus: Bus) -> bool:
    return not await _runs(bus)


async def test_every_tick_is_a_listed_delivery_and_a_missed_one_can_be_redriven(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        ticking = await a.post("/triggers", json=_schedule(), headers=AS_ADMIN)
        assert ticking.status_code == 201, ticking.text
        (first,) = await event_log.wait_for(
            "run.requested", where=lambda e: e.data["launch"]["trigger_id"] == "every-2s", timeout_s=15
        )
        await a.post("/triggers/every-2s/disable", headers=AS_OPERATOR)

        async def listed(trigger_id: str) -> list[dict[str, Any]]:
            answer = await a.get(f"/triggers/{trigger_id}/deliveries", headers=AS_VIEWER)
            assert answer.status_code == 200, answer.text
            rows: list[dict[str, Any]] = answer.json()["deliveries"]
            return rows

        rows = await listed("every-2s")
        row = next(r for r in rows if r["run_id"] == first.runid)  # recorded before its run.requested went out
        assert (row["kind"], row["state"], row["adapter"], row["has_event"]) == (
            "schedule",
            "accepted",
            "schedule",
            True,
        )
        assert row["source_event_id"].startswith("tick:")

        # a tick handled past its grace, policy skip: a rejected delivery, which an operator can re-drive
        spec = _schedule("nightly", cron="0 3 * * *", missed={"policy": "skip", "grace_s": 60})
        created = await a.post("/triggers", json=spec, headers=AS_ADMIN)
        assert created.status_code == 201, created.text
        revision = int(created.headers["ETag"].strip('"'))
        late = (datetime.now(UTC) - timedelta(hours=2)).replace(microsecond=0)
        tick = Tick(trigger_id="nightly", at=late, revision=revision).model_dump_json().encode()
        await Timers(bus, TIMER_NS_TRIGGER_SCHEDULE).arm("nightly", datetime.now(UTC), tick)  # fires at once
        (rejected,) = await event_log.wait_for(
            "trigger.rejected", where=lambda e: e.data["trigger_id"] == "nightly", timeout_s=10
        )
        assert rejected.data["reason"] == "missed_tick"
        (missed,) = await listed("nightly")
        assert (missed["state"], missed["reason"], missed["delivery_id"]) == (
            "rejected",
            "missed_tick",
            rejected.data["delivery_id"],
        )
        redriven = await a.post(f"/triggers/nightly/deliveries/{missed['delivery_id']}/redrive", headers=AS_OPERATOR)
        assert redriven.status_code == 202, redriven.text
        tick_id = "tick:" + late.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert redriven.json()["run_id"] == run_id_for_delivery("nightly", tick_id)
        await event_log.wait_for("run.requested", run_id=redriven.json()["run_id"], timeout_s=10)


# --------------------------------------------------------------------------- a schedule never stops ticking silently
def _schedule_subjects(timers: Timers) -> str:
    return timers.schedule_subject("key").removesuffix("key") + ">"


async def _pending(bus: Bus, timers: Timers) -> dict[str, int]:
    return await stream_subjects(bus.js, timers.stream, _schedule_subjects(timers))


async def test_a_tick_whose_launch_is_dead_lettered_still_arms_the_next(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    """A tick whose run can never be published (its input is over the server's max_payload: PermanentError) is
    dead-lettered as before, and the next tick is armed all the same: the trigger keeps ticking."""
    fields = {f"f{i}": "context.big" for i in range(40)}  # 40 x 30 kB: a run.requested over 1 MB
    spec = _schedule("too-big", context={"big": "x" * 30_000}, input=fields, prompt=None)
    async with replicas(gateway_settings, 1) as (a,):
        created = await a.post("/triggers", json=spec, headers=AS_ADMIN)
        assert created.status_code == 201, created.text
        dead = await event_log.wait_for(
            "bus.dead_lettered",
            where=lambda e: e.data.get("consumer") == "trigger-gateway-schedules",
            count=2,
            timeout_s=30,
        )
        assert len({e.data["stream_seq"] for e in dead}) >= 2  # two firings, not one redelivered
        assert all("max_payload" in e.data["error"] for e in dead), [e.data["error"] for e in dead]
        assert not event_log.of_type("run.requested")


async def test_an_arm_that_failed_on_a_change_is_retried_until_it_lands(nats_server: NatsServer, bus: Bus) -> None:
    """The server is away when a change arms the trigger's next tick: the failure is kept, and retried once the
    server is back (no other change, no restart needed)."""
    nightly = _trigger("nightly", cron="0 3 * * *")
    scheduler = Scheduler(bus, TriggerRegistry.static([nightly]))
    nats_server.stop(hold_port=True)
    try:
        with pytest.raises(TransientError):
            await scheduler.on_change("nightly", nightly, 1)
        assert scheduler.unsettled == {"nightly"}
        async with scheduler.keeping_armed(check_s=3600):
            nats_server.requested_port = nats_server.port  # the same server (port, store) comes back
            nats_server.start()

            async def armed() -> bool:
                return scheduler.timers.schedule_subject("nightly") in await _pending(bus, scheduler.timers)

            await eventually(armed, timeout_s=30, what="the failed arm retried")
            await eventually(lambda: _true(not scheduler.unsettled), what="nothing left to retry")
    finally:
        if nats_server.proc is None or nats_server.proc.poll() is not None:
            nats_server.requested_port = nats_server.port
            nats_server.start()  # for the bus fixture's teardown


async def _true(value: bool) -> bool:
    return value


async def test_the_check_arms_only_triggers_with_no_pending_tick_once_across_replicas(bus: Bus) -> None:
    """Two replicas check at once: a trigger with no schedule gets exactly one; one that has a schedule keeps it
    (the check never replaces one); a disabled trigger gets none."""
    lost, kept = _trigger("lost", cron="0 3 * * *"), _trigger("kept", cron="0 3 * * *")
    off = _trigger("off", cron="0 3 * * *", enabled=False)
    first = Scheduler(bus, TriggerRegistry.static([lost, kept, off]))
    second = Scheduler(bus, TriggerRegistry.static([lost, kept, off]))
    timers = first.timers
    later = datetime.now(UTC) + timedelta(days=1)
    marker = Tick(trigger_id="kept", at=later, revision=7).model_dump_json().encode()
    await timers.arm("kept", later, marker)
    armed = await asyncio.gather(first.arm_missing(), second.arm_missing())
    assert sorted(armed[0] + armed[1]) == ["lost"]  # one of the two armed it; the other found it armed
    pending = await _pending(bus, timers)
    assert pending == {timers.schedule_subject("lost"): 1, timers.schedule_subject("kept"): 1}
    stored = await bus.js.get_last_msg(timers.stream, timers.schedule_subject("kept"))
    assert stored.data == marker
    lost_tick = Tick.model_validate_json(
        (await bus.js.get_last_msg(timers.stream, timers.schedule_subject("lost"))).data
    )
    assert lost_tick.at == next_tick(lost, datetime.now(UTC))
    assert await first.arm_missing() == []  # both have one now
    assert await second.arm_missing() == []


async def test_a_replica_re_arms_a_trigger_whose_tick_went_missing(gateway_settings: Settings, bus: Bus) -> None:
    """The replicas' periodic check (here every second) arms the next tick of an enabled trigger whose schedule is
    gone (purged on the server: as after a tick lost before it armed the next), once for both replicas."""
    settings = gateway_settings.model_copy(update={"schedule_check_s": 1.0})
    timers = Timers(bus, TIMER_NS_TRIGGER_SCHEDULE)
    subject = timers.schedule_subject("nightly")
    async with replicas(settings) as (a, _b):
        created = await a.post("/triggers", json=_schedule("nightly", cron="0 3 * * *"), headers=AS_ADMIN)
        assert created.status_code == 201, created.text

        async def armed() -> bool:
            return subject in await _pending(bus, timers)

        await eventually(armed, what="the nightly tick armed")
        first = (await bus.js.get_last_msg(timers.stream, subject)).seq
        await bus.js.purge_stream(timers.stream, subject=subject)
        assert not await armed()

        async def re_armed() -> bool:
            return await armed() and (await bus.js.get_last_msg(timers.stream, subject)).seq > first

        await eventually(re_armed, timeout_s=20, what="the lost tick armed again by the check")
        await stays(lambda: _one_schedule(bus, timers, subject), settle_s=2.5, what="one schedule, armed once")


async def _one_schedule(bus: Bus, timers: Timers, subject: str) -> bool:
    return (await _pending(bus, timers)).get(subject) == 1


async def test_the_gateway_user_may_check_and_arm(tmp_path: Path) -> None:
    """With the catalogue's NATS permissions (no STREAM.MSG.GET on the timers stream), the check's listing and
    conditional arm are allowed."""
    users: dict[str, NatsUser] = {
        "trigger-gateway": ("gateway-password-0123456789", permissions_for("trigger-gateway")),
        "test-admin": ("admin-password-0123456789", None),
    }
    server = NatsServer(tmp_path / "nats", users=users)
    server.start()
    try:
        admin_settings = NatsSettings(url=server.url, user="test-admin", password="admin-password-0123456789")
        async with Bus.connect(admin_settings, name="test") as admin:
            await admin.ensure(ALL_STREAMS, ALL_BUCKETS)
        settings = NatsSettings(url=server.url, user="trigger-gateway", password="gateway-password-0123456789")
        async with Bus.connect(settings, name="trigger-gateway") as gateway:
            scheduler = Scheduler(gateway, TriggerRegistry.static([_trigger("nightly", cron="0 3 * * *")]))
            assert await scheduler.arm_missing() == ["nightly"]
            assert await scheduler.arm_missing() == []
    finally:
        server.stop()
