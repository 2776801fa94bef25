"""RUN-2: a cancel that comes while the run is in its last turn -- the provider call that returns the final answer in
flight, or that answer being applied -- leaves exactly one terminal event, the one its record says.

Over a real nats-server: the executor's real consumers (the cancel is a real ``run.cancel_requested``, handled by
the real ``run-executor-human`` consumer), the real run store, the real watchdog timers. The interleavings are
forced at the engine's test seam (``Engine.crash_point``, as in ``test_terminal_race.py``): the driver is held at
an exact point of its last turn while the cancel is handled to its end -- no sleeps, no timing.

What the code does (``machine``: ``_cancel_recorded``, ``_provider_replied``, ``_end``, ``moved``, ``flagged``): a
cancel for a run being driven (``running``) is only recorded on the record (``FlagCancel``, one compare-and-set)
and deferred to the driver's next turn boundary; a last turn has none -- its answer ends the run -- so the run
completes, its record keeping the cancel that came too late. The end's compare-and-set is made on the stored
record (re-read when the driver's copy is stale), so the cancel recorded meanwhile is kept and not overwritten;
a cancel that comes once the end is committed finds a finished run and changes nothing (``flagged`` refuses,
``run.cancel.ignored``). A cancel that the run sees at a boundary before its last turn cancels it
(``test_cancel.py``). Either way one terminal event, the watchdog disarmed, no lease, nothing to wait on.
"""

from __future__ import annotations

import asyncio

import pytest
from executor_support import (
    FINISHER,
    TERMINAL,
    HeldProvider,
    RunExecutor,
    disarmed,
    handled,
    keep_v1,
    run_record,
    run_requested,
)

from temporality_bus import Bus
from temporality_protocol import HumanRequested, RunCancelRequested, RunCompleted, RunState, make_event
from temporality_run_executor.agents import AgentCard
from temporality_run_executor.engine import Engine
from temporality_run_executor.machine import ending_event
from temporality_run_executor.providers import Provider
from temporality_run_executor.providers.factory import ProviderCache
from temporality_run_executor.records import RunRecord
from temporality_testing.events import EventLog
from temporality_testing.waiting import eventually, stays


async def _cancel(bus: Bus, run_id: str, done: asyncio.Event) -> None:
    """A real ``run.cancel_requested`` for the run, handled to its end by the executor's human consumer (``done``:
    its handler passed its last seam, everything it sent stored). Not "the consumer acked it": a held handler of
    the same consumer (an answer's) keeps the consumer's ack floor back."""
    data = RunCancelRequested(run_id=run_id, reason="too late", requested_by="on-call")
    await bus.publish(make_event(data, source="/test", id=f"evt-cancel-{run_id}", run_id=run_id))
    async with asyncio.timeout(30):
        await done.wait()


def _hold_once(engine: Engine, point: str, armed: asyncio.Event, run_id: str, bus: Bus) -> asyncio.Event:
    """Once ``armed``, the first time a handler of ``engine`` passes ``point``, hold it there while the run's cancel
    is handled to its end; returns the event set once that happened."""
    interleaved, cancel_done = asyncio.Event(), asyncio.Event()

    async def hold(passing: str) -> None:
        if passing == "handled:CancelRequested":
            cancel_done.set()
        elif passing == point and armed.is_set() and not interleaved.is_set():
            interleaved.set()
            await _cancel(bus, run_id, cancel_done)

    engine.crash_point = hold
    return interleaved


async def _one_ending(bus: Bus, event_log: EventLog, run_id: str) -> RunRecord:
    """Exactly one terminal event for the run, ``run.completed``, and none comes after it; the record completed, its
    event the record's and marked published; the watchdog disarmed; no lease held, nothing waited on."""

    async def ended() -> list[str]:
        return [e.type for e in event_log.events if e.runid == run_id and e.type in TERMINAL]

    first = (await eventually(ended, what=f"a terminal event of {run_id}"))[0]
    assert first == "run.completed", f"the run ended {first}, not run.completed"
    await event_log.caught_up()

    def only_completed() -> bool:
        return [e.type for e in event_log.events if e.runid == run_id and e.type in TERMINAL] == ["run.completed"]

    await stays(only_completed, settle_s=1.0, what=f"one run.completed for {run_id}, no other terminal event")
    record = await run_record(bus, run_id, lambda r: r.ending is not None and r.ending.published)
    assert record.state is RunState.COMPLETED
    (completed,) = event_log.of_type("run.completed", run_id)
    announced = ending_event(record)
    assert announced is not None
    assert completed.payload(RunCompleted) == announced.data  # the event is the record's
    assert (record.lease, record.waiting_request_id) == (None, None)
    await disarmed(bus, run_id, settle_s=0.5)
    assert not event_log.of_type("bus.dead_lettered")
    return record


@pytest.mark.parametrize(
    ("point", "recorded"),
    [
        # the final answer is back from the provider, not decided on yet: the driver reads the record afresh (the
        # cancel is on it) and completes the run all the same -- its last turn has no boundary after it
        ("provider_replied", True),
        # the driver has decided to complete the run, none of the end's effects done: its compare-and-set is on a
        # stale copy, loses, and is made again on the stored record, the cancel kept on it
        ("decided:ProviderReplied", True),
        # the end is committed, its event not published yet: the cancel finds a finished run and changes nothing
        ("effect:Transition:completed", False),
    ],
)
async def test_a_cancel_during_the_last_turn_leaves_one_ending(
    bus: Bus, event_log: EventLog, executor: RunExecutor, point: str, recorded: bool
) -> None:
    engine = await executor(cards=[FINISHER])
    event = run_requested(agent=FINISHER.id)
    run_id = event.runid
    assert run_id
    armed = asyncio.Event()
    armed.set()
    interleaved = _hold_once(engine, point, armed, run_id, bus)
    requested = await bus.publish(event)
    await handled(bus, "run-executor-requests", requested.seq)
    assert interleaved.is_set()
    record = await _one_ending(bus, event_log, run_id)
    assert record.result == "LGTM"
    if recorded:  # recorded while the run was driven, too late to stop it
        assert record.cancel is not None
        assert (record.cancel.reason, record.cancel.event_id) == ("too late", f"evt-cancel-{run_id}")
    else:
        assert record.cancel is None


async def test_a_cancel_while_the_last_provider_call_is_in_flight_leaves_one_ending(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    """The provider call that returns the final answer is in flight (held) while the cancel is handled: recorded,
    deferred (the run is driven); the answer then ends the run, completed."""
    cache = ProviderCache()
    held = HeldProvider(cache(FINISHER))

    def provider_for(card: AgentCard) -> Provider:
        return held

    try:
        await executor(cards=[FINISHER], provider_for=provider_for)
        event = run_requested(agent=FINISHER.id)
        run_id = event.runid
        assert run_id
        requested = await bus.publish(event)
        async with asyncio.timeout(30):
            await held.entered.wait()
        data = RunCancelRequested(run_id=run_id, reason="too late", requested_by="on-call")
        cancel = make_event(data, source="/test", id=f"evt-cancel-{run_id}", run_id=run_id)
        await handled(bus, "run-executor-human", (await bus.publish(cancel)).seq)
        running = await run_record(bus, run_id, lambda r: r.cancel is not None)
        assert running.state is RunState.RUNNING  # recorded, deferred to a boundary the run will not reach
        held.release.set()
        await handled(bus, "run-executor-requests", requested.seq)
        record = await _one_ending(bus, event_log, run_id)
        assert record.cancel is not None
        assert held.calls == 1
    finally:
        held.release.set()
        await cache.aclose()


async def test_a_cancel_during_the_last_turn_after_a_resume_leaves_one_ending(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    """The reviewer parked on a person; the answer resumes it into its last turn (the review), and the cancel is
    handled while that turn's reply is back but not applied. The run completes; no request is left waited on."""
    engine = await executor()
    event = run_requested()
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    (asked,) = await event_log.wait_for("human.requested", run_id=run_id)
    await run_record(bus, run_id, RunState.WAITING_FOR_HUMAN)
    armed = asyncio.Event()
    interleaved = _hold_once(engine, "provider_replied", armed, run_id, bus)
    armed.set()  # from now on: the provider calls after the resume (the last turn)
    answer = keep_v1(run_id, asked.payload(HumanRequested).request_id)
    answered = await bus.publish(make_event(answer, source="/test", run_id=run_id))
    await handled(bus, "run-executor-human", answered.seq)
    assert interleaved.is_set()
    record = await _one_ending(bus, event_log, run_id)
    assert record.cancel is not None
    assert record.result is not None
    assert "keep" in record.result.lower() or "v1" in record.result
