"""One terminal event per run, and it is the one its record says, when the watchdog races the run's end.

Over a real nats-server: the executor's real consumers, the real run store, the real watchdog consumer
handling a real firing. The interleavings are forced at the engine's test seam (``Engine.crash_point``,
awaited at named points of the driver): the test holds one handler at an exact point while another
handler runs to its end -- no sleeps, no timing.

The bug these found: the executor published a run's terminal event *before* the compare-and-set that moved the
record to its terminal state, so a watchdog (or a cancel, or another driver) that ended the run in between left
the journal with two terminal events (``run.completed`` then ``run.failed``) and the record saying the second.
The end is now committed first, its event published after it, built from the record (see ``engine``'s docstring).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from executor_support import (
    FINISHER,
    TERMINAL,
    HeldProvider,
    RunExecutor,
    handled,
    run_record,
    run_requested,
    watchdog_handled,
)

from temporality_bus import Bus
from temporality_protocol import RunCompleted, RunFailed, RunState
from temporality_run_executor.agents import AgentCard
from temporality_run_executor.machine import ending_event
from temporality_run_executor.providers import Provider
from temporality_run_executor.providers.factory import ProviderCache
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays


async def _one_ending(event_log: EventLog, run_id: str, expected: str) -> None:
    """The stream holds exactly one terminal event for the run, ``expected``, and no other comes."""
    await event_log.caught_up()

    def only_expected() -> bool:
        return [e.type for e in event_log.events if e.runid == run_id and e.type in TERMINAL] == [expected]

    await stays(only_expected, settle_s=1.0, what=f"one {expected} for {run_id}, no other terminal event")


async def _finish_with(bus: Bus, executor: RunExecutor, point: str, meanwhile: Callable[[str], Awaitable[None]]) -> str:
    """Run the finisher; the first time its driver passes ``point``, hold it there while ``meanwhile(run_id)``
    runs to its end. Returns the run id once the run's ``run.requested`` is handled."""
    engine = await executor(cards=[FINISHER])
    event = run_requested(agent=FINISHER.id)
    run_id = event.runid
    assert run_id
    interleaved = asyncio.Event()

    async def hold(passing: str) -> None:
        if passing == point and not interleaved.is_set():
            interleaved.set()
            await meanwhile(run_id)

    engine.crash_point = hold
    requested = await bus.publish(event)
    await handled(bus, "run-executor-requests", requested.seq)
    assert interleaved.is_set()
    return run_id


async def test_the_watchdog_failing_the_run_after_its_driver_decided_to_complete_it_leaves_one_ending(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    """The driver has decided to complete the run (its final answer in); before any of the end's effects, the
    watchdog fails the run (stalled at turn 0). The driver's end then loses its compare-and-set and publishes
    nothing: the journal has ``run.failed`` only, as the record says."""

    async def watchdog_fails_it(run_id: str) -> None:
        await watchdog_handled(bus, run_id, turn=0)  # the real watchdog consumer ends the run meanwhile
        await run_record(bus, run_id, RunState.FAILED)

    run_id = await _finish_with(bus, executor, "decided:ProviderReplied", watchdog_fails_it)
    await _one_ending(event_log, run_id, "run.failed")
    record = await run_record(bus, run_id, RunState.FAILED)
    (failed,) = event_log.of_type("run.failed", run_id)
    assert failed.payload(RunFailed).reason == "stalled"
    announced = ending_event(record)
    assert announced is not None
    assert failed.payload(RunFailed) == announced.data  # the event is the record's
    assert not event_log.of_type("bus.dead_lettered")


async def test_the_watchdog_firing_after_the_end_is_committed_but_before_its_event_leaves_one_ending(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    """The driver has committed the end (the record says completed) and not published its event yet; the watchdog
    fires then. It fails nothing (the run has ended), and publishes the record's ``run.completed`` (the disarm had
    not gone out: the driver may have died); the driver's own publish of it is the same id, deduplicated."""

    async def watchdog_fires(run_id: str) -> None:
        await watchdog_handled(bus, run_id, turn=0)
        # the driver is held here, so this is the watchdog's: what recovers a driver killed at this point
        await event_log.wait_for("run.completed", run_id=run_id)

    run_id = await _finish_with(bus, executor, "effect:Transition:completed", watchdog_fires)
    await _one_ending(event_log, run_id, "run.completed")
    record = await run_record(bus, run_id, RunState.COMPLETED)
    (completed,) = event_log.of_type("run.completed", run_id)
    assert completed.payload(RunCompleted).result == record.result == "LGTM"
    assert not event_log.of_type("bus.dead_lettered")


async def test_the_driver_completing_the_run_after_the_watchdog_decided_to_fail_it_leaves_one_ending(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    """The watchdog's own end: it has decided to fail the run (stalled at turn 0, its driver in the provider);
    before any of that end's effects, the driver's turn comes back and completes the run. The watchdog's end then
    loses its compare-and-set and publishes nothing: ``run.completed`` only, as the record says."""
    cache = ProviderCache()
    held = HeldProvider(cache(FINISHER))

    def provider_for(card: AgentCard) -> Provider:
        return held

    try:
        engine = await executor(cards=[FINISHER], provider_for=provider_for)
        event = run_requested(agent=FINISHER.id)
        run_id = event.runid
        assert run_id
        interleaved = asyncio.Event()

        async def driver_first(point: str) -> None:
            if point == "decided:WatchdogFired" and not interleaved.is_set():
                interleaved.set()
                held.release.set()  # the turn comes back: the driver completes the run meanwhile
                await event_log.wait_for("run.completed", run_id=run_id)
                await run_record(bus, run_id, RunState.COMPLETED)

        engine.crash_point = driver_first
        requested = await bus.publish(event)
        async with asyncio.timeout(30):
            await held.entered.wait()
        await watchdog_handled(bus, run_id, turn=0)
        await handled(bus, "run-executor-requests", requested.seq)
        assert interleaved.is_set()
        await _one_ending(event_log, run_id, "run.completed")
        record = await run_record(bus, run_id, RunState.COMPLETED)
        assert record.error is None
        assert not event_log.of_type("bus.dead_lettered")
    finally:
        held.release.set()
        await cache.aclose()
