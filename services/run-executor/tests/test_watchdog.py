"""The run watchdog over a real nats-server and real message schedules: a run hung past its compute limit
plus grace fails (``stalled``); a run waiting for a person, or one that made progress, is left alone."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import nats.js.errors
import pytest
from executor_support import (
    REVIEWER,
    HeldProvider,
    RunExecutor,
    disarmed,
    handled,
    keep_v1,
    run_record,
    run_requested,
    watchdog_handled,
    watchdog_schedules,
    write_run,
)

from temporality_bus import Bus
from temporality_protocol import HumanRequested, RunFailed, RunState, make_event
from temporality_protocol.catalog import (
    BUCKET_CHECKPOINTS,
    BUCKET_RUNS,
    CONSUMERS,
    DLQ_STREAM,
    TIMER_FIRED_RUN_WATCHDOG,
    TIMER_SCHEDULE_RUN_WATCHDOG,
    TIMERS_STREAMS,
)
from temporality_run_executor.agents import AgentCard, Limits
from temporality_run_executor.machine import moved
from temporality_run_executor.providers import AssistantTurn, Provider, ToolSpec, TurnContext
from temporality_run_executor.providers.factory import ProviderCache
from temporality_run_executor.records import Checkpoint, Message, RunRecord, ToolCall
from temporality_run_executor.watchdog import WatchdogPayload
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays

WATCHDOG = CONSUMERS["run-executor-watchdog"]
#: A tight budget so the watchdog fires within seconds: 1 s of compute plus 1 s of grace.
TIGHT = REVIEWER.model_copy(update={"limits": Limits(max_compute_s=1.0)})
GRACE_S = 1.0


class HungProvider(HeldProvider):
    """A provider call that never returns until released: a driver hung in a turn."""

    async def answer(
        self, messages: list[Message], tools: list[ToolSpec], *, budget_s: float | None, context: TurnContext | None
    ) -> AssistantTurn:
        return AssistantTurn(tool_calls=[ToolCall(id="call-context", name="get_input", arguments={})])


async def test_a_run_hung_past_its_compute_limit_is_failed_by_the_watchdog(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    hung = HungProvider()

    def provider_for(card: AgentCard) -> Provider:
        return hung

    await executor(cards=[TIGHT], provider_for=provider_for, watchdog_grace_s=GRACE_S)
    event = run_requested()
    run_id = event.runid
    assert run_id
    requested = await bus.publish(event)
    try:
        await asyncio.wait_for(hung.entered.wait(), 30)
        (failed,) = await event_log.wait_for("run.failed", run_id=run_id)
        data = failed.payload(RunFailed)
        assert data.reason == "stalled"
        assert "no progress in running at turn 0" in data.error
        record = await run_record(bus, run_id, RunState.FAILED)
        assert record.error is not None
        assert record.error.startswith("stalled: ")
        (started,) = event_log.of_type("run.started", run_id)
        # not before the compute limit plus grace (schedules fire on whole seconds, rounded up)
        assert failed.time - started.time >= timedelta(seconds=TIGHT.limits.max_compute_s + GRACE_S - 0.05)
        await disarmed(bus, run_id)
    finally:
        hung.release.set()
    # the hung driver wakes up to a failed run: it drops its turn and ends quietly
    await handled(bus, "run-executor-requests", requested.seq)
    await event_log.caught_up()
    assert event_log.of_type("run.tool_called", run_id) == []
    assert event_log.of_type("run.checkpointed", run_id) == []
    assert len(event_log.of_type("run.failed", run_id)) == 1
    assert event_log.of_type("bus.dead_lettered") == []
    assert (await run_record(bus, run_id, RunState.FAILED)).error == record.error


class SecondTurnHangs(HungProvider):
    """The first turn returns at once (a ``get_input`` call); the second hangs until released."""

    async def complete(
        self,
        messages: list[Message],
        tools: list[ToolSpec],
        *,
        budget_s: float | None = None,
        context: TurnContext | None = None,
    ) -> AssistantTurn:
        self.hold = self.calls >= 1
        return await super().complete(messages, tools, budget_s=budget_s, context=context)


async def test_a_run_hung_in_a_turn_whose_boundary_did_not_re_arm_fails_a_horizon_after_that_turn(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    """The boundary after turn 1 does not re-arm (the start's arm is a moment old: less than half the horizon), so
    the start's timer (turn 0) fires on a run at turn 1: progress, watched on from turn 1's checkpoint -- not from
    the firing -- and the run, hung in turn 2, fails about a horizon after that checkpoint."""
    grace_s = 3.0
    hung = SecondTurnHangs()

    def provider_for(card: AgentCard) -> Provider:
        return hung

    await executor(cards=[TIGHT], provider_for=provider_for, watchdog_grace_s=grace_s)
    event = run_requested()
    run_id = event.runid
    assert run_id
    requested = await bus.publish(event)
    horizon_s = TIGHT.limits.max_compute_s + grace_s
    try:
        await asyncio.wait_for(hung.entered.wait(), 30)
        (checkpointed,) = await event_log.wait_for("run.checkpointed", run_id=run_id)
        (failed,) = await event_log.wait_for("run.failed", run_id=run_id)
        data = failed.payload(RunFailed)
        assert data.reason == "stalled"
        assert "no progress in running at turn 1" in data.error
        idle = failed.time - checkpointed.time
        assert idle >= timedelta(seconds=horizon_s - 0.05)
        # from turn 1's checkpoint: re-armed from the first firing instead, it would fail 2 horizons after the
        # start (8 s); schedules fire on whole seconds, rounded up (up to 1 s per firing, 2 firings)
        assert idle < timedelta(seconds=horizon_s + 2.5)
        await disarmed(bus, run_id)
    finally:
        hung.release.set()
    await handled(bus, "run-executor-requests", requested.seq)
    await event_log.caught_up()
    assert len(event_log.of_type("run.failed", run_id)) == 1
    assert len(event_log.of_type("run.checkpointed", run_id)) == 1
    assert event_log.of_type("bus.dead_lettered") == []


async def test_a_run_waiting_for_a_human_is_left_alone(bus: Bus, event_log: EventLog, executor: RunExecutor) -> None:
    await executor(cards=[TIGHT], watchdog_grace_s=GRACE_S)
    event = run_requested()
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    (req,) = await event_log.wait_for("human.requested", run_id=run_id)
    await run_record(bus, run_id, RunState.WAITING_FOR_HUMAN)
    assert await watchdog_schedules(bus, run_id) == 0  # parked: its watchdog is cancelled
    # a firing already on its way when it parked (at the turn it parked at) is ignored
    request = req.payload(HumanRequested)
    await watchdog_handled(bus, run_id, request.turn)

    async def still_waiting() -> bool:
        got = await (await bus.store(BUCKET_RUNS, RunRecord)).get(run_id)
        return got is not None and got.value.state is RunState.WAITING_FOR_HUMAN

    # waiting longer than the compute limit plus grace (2 s) changes nothing: no watchdog counts it
    await stays(still_waiting, settle_s=3 * (TIGHT.limits.max_compute_s + GRACE_S), what="the run waiting")
    answered = keep_v1(run_id, request.request_id, waited_s=6.0)
    await bus.publish(make_event(answered, source="/test", run_id=run_id))
    await event_log.wait_for("run.completed", run_id=run_id)
    await run_record(bus, run_id, RunState.COMPLETED)
    await disarmed(bus, run_id)  # finished: cancelled again
    assert event_log.of_type("run.failed", run_id) == []


async def test_a_firing_after_progress_watches_on_and_one_without_progress_fails_the_run_once(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    await executor()  # the default grace (300 s): nothing it arms itself fires during the test
    run_id = "run-wd-direct"
    await write_run(bus, run_id, RunState.RUNNING, turn=2)  # a run left running, nobody driving it

    await watchdog_handled(bus, run_id, turn=1)  # armed at turn 1; the run has made progress since
    assert (await run_record(bus, run_id, RunState.RUNNING)).error is None
    assert await watchdog_schedules(bus, run_id) == 1  # watched on from the turn it is at
    schedule = await bus.js.get_last_msg(TIMERS_STREAMS["run-executor"].name, f"{TIMER_SCHEDULE_RUN_WATCHDOG}.{run_id}")
    rearmed = WatchdogPayload.model_validate_json(schedule.data or b"")
    assert rearmed.turn == 2
    limit = REVIEWER.limits.max_compute_s + 300
    assert rearmed.deadline - rearmed.armed_at == timedelta(seconds=limit)
    # from the progress (turn 2's checkpoint), not from the firing
    checkpoint = await (await bus.store(BUCKET_CHECKPOINTS, Checkpoint)).get(run_id)
    assert checkpoint is not None
    assert rearmed.armed_at == checkpoint.value.saved_at

    await watchdog_handled(bus, run_id, turn=2)  # no progress since that arm: stalled
    record = await run_record(bus, run_id, RunState.FAILED)
    assert record.error is not None
    assert record.error.startswith("stalled: no progress in running at turn 2")
    assert await watchdog_schedules(bus, run_id) == 0
    await watchdog_handled(bus, run_id, turn=2)  # a repeat finds it finished: nothing more
    await event_log.caught_up()
    (failed,) = event_log.of_type("run.failed", run_id)
    assert failed.payload(RunFailed).reason == "stalled"


@pytest.mark.parametrize("state", [RunState.WAITING_FOR_HUMAN, RunState.COMPLETED])
async def test_a_firing_on_a_waiting_or_finished_run_changes_nothing(
    bus: Bus, event_log: EventLog, executor: RunExecutor, state: RunState
) -> None:
    await executor()
    run_id = f"run-wd-{state.value}"
    await write_run(bus, run_id, state, turn=2, waiting="hr-1" if state is RunState.WAITING_FOR_HUMAN else None)
    await watchdog_handled(bus, run_id, turn=2)
    await watchdog_handled(bus, "run-nobody-knows", turn=0)  # a run that does not exist: ignored too
    await run_record(bus, run_id, state)
    assert await watchdog_schedules(bus, run_id) == 0
    await event_log.caught_up()
    assert event_log.of_type("run.failed") == []


async def test_an_unreadable_firing_is_dead_lettered(bus: Bus, executor: RunExecutor) -> None:
    await executor()
    fired = await bus.publish_raw(f"{TIMER_FIRED_RUN_WATCHDOG}.run-x", b"{not a payload", {})
    await handled(bus, WATCHDOG.durable, fired.seq, stream=TIMERS_STREAMS["run-executor"].name)
    subject = f"temporality.dlq.{WATCHDOG.durable}"
    info = await bus.js.stream_info(DLQ_STREAM.name, subjects_filter=subject)
    assert (info.state.subjects or {}).get(subject) == 1


async def test_a_resumed_run_failed_while_its_last_turn_is_in_the_provider_completes_nothing(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    """A final answer is decided on the record the handler holds, not read again after the provider (issue 6); the
    end's compare-and-set at that record's revision is refused by a move written meanwhile by another handler (here
    the watchdog's failure, written as it writes it), the record is read and the answer decided again on it: the
    turn's final answer completes nothing."""
    cache = ProviderCache()
    gated: dict[str, HeldProvider] = {}

    def provider_for(card: AgentCard) -> Provider:
        return gated.setdefault(card.id, HeldProvider(cache(card), hold=False))

    try:
        await executor(provider_for=provider_for)
        event = run_requested()
        run_id = event.runid
        assert run_id
        await bus.publish(event)
        (asked,) = await event_log.wait_for("human.requested", run_id=run_id)
        await run_record(bus, run_id, RunState.WAITING_FOR_HUMAN)
        request = asked.payload(HumanRequested)
        held = gated["reviewer"]
        held.hold, parked_turns = True, held.calls  # the resumed turn (the last: the review) waits in the provider
        answered = keep_v1(run_id, request.request_id)
        seq = (await bus.publish(make_event(answered, source="/test", id=f"evt-ans-{run_id}", run_id=run_id))).seq
        async with asyncio.timeout(30):
            await held.entered.wait()
        await run_record(bus, run_id, RunState.RUNNING)
        runs = await bus.store(BUCKET_RUNS, RunRecord)
        await runs.modify(run_id, lambda r: moved(r, RunState.FAILED, {}, datetime.now(UTC)))
        held.release.set()
        assert held.calls == parked_turns + 1
        await handled(bus, "run-executor-human", seq)
        await event_log.caught_up()
        assert not event_log.of_type("run.completed", run_id)
        assert (await run_record(bus, run_id)).state is RunState.FAILED
        assert not event_log.of_type("bus.dead_lettered")
    finally:
        await cache.aclose()


async def test_a_run_parked_and_resumed_at_once_never_arms_a_watchdog(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    """Issue 6: a handler parks or ends its run long before its deferred arm is due (the default: a third of the
    lease), so neither the arm nor the disarm is written -- the timers stream never holds a message for the run."""
    await executor()
    event = run_requested()
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    (asked,) = await event_log.wait_for("human.requested", run_id=run_id)
    await run_record(bus, run_id, RunState.WAITING_FOR_HUMAN)
    answered = keep_v1(run_id, asked.payload(HumanRequested).request_id)
    await bus.publish(make_event(answered, source="/test", run_id=run_id))
    await event_log.wait_for("run.completed", run_id=run_id)
    await run_record(bus, run_id, lambda r: r.ending is not None and r.ending.published)
    stream = TIMERS_STREAMS["run-executor"].name
    with pytest.raises(nats.js.errors.NotFoundError):
        await bus.js.get_last_msg(stream, f"{TIMER_SCHEDULE_RUN_WATCHDOG}.{run_id}")


async def test_a_handler_still_in_a_call_arms_its_deferred_watchdog_from_when_it_decided(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    """The arm a handler held back goes out once it has worked ``watchdog_defer_s`` (here in its first provider
    call), with the deadline it had when decided -- the compute limit plus grace from the run's start, as an arm
    sent at once -- and the park then disarms it."""
    cache = ProviderCache()
    held = HeldProvider(cache(REVIEWER))

    def provider_for(card: AgentCard) -> Provider:
        return held

    try:
        await executor(provider_for=provider_for, watchdog_defer_s=0.3)
        event = run_requested()
        run_id = event.runid
        assert run_id
        await bus.publish(event)
        async with asyncio.timeout(30):
            await held.entered.wait()
        (started,) = await event_log.wait_for("run.started", run_id=run_id)

        async def armed() -> bool:
            return await watchdog_schedules(bus, run_id) == 1

        async with asyncio.timeout(30):
            while not await armed():  # noqa: ASYNC110 - polling the server's view
                await asyncio.sleep(0.05)
        schedule = await bus.js.get_last_msg(
            TIMERS_STREAMS["run-executor"].name, f"{TIMER_SCHEDULE_RUN_WATCHDOG}.{run_id}"
        )
        payload = WatchdogPayload.model_validate_json(schedule.data or b"")
        assert payload.turn == 0
        assert abs((payload.armed_at - started.time).total_seconds()) < 0.3  # decided with run.started, sent later
        assert payload.deadline - payload.armed_at == timedelta(seconds=REVIEWER.limits.max_compute_s + 300)
        held.release.set()
        await event_log.wait_for("human.requested", run_id=run_id)
        await run_record(bus, run_id, RunState.WAITING_FOR_HUMAN)
        await disarmed(bus, run_id)  # parked: the arm it sent is cancelled
    finally:
        held.release.set()
        await cache.aclose()
