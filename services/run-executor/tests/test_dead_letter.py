"""The run-executor's dead-letter hook: the run a given-up message drives fails visibly, others are left alone.

The run state is written straight into KV (the situations a crash leaves behind); the hook gets a real
message pulled from the real server, as the consumer runner would hand it over.
"""

from __future__ import annotations

import pytest
from executor_support import REVIEWER, run_requested, write_run

from temporality_bus import Bus, Conflict, Delivery
from temporality_protocol import (
    Envelope,
    HumanAnswered,
    RunFailed,
    RunState,
    TextAnswer,
    make_event,
)
from temporality_protocol.catalog import BUCKET_CHECKPOINTS, BUCKET_RUNS, EVENTS_STREAM
from temporality_run_executor.agents import AgentDirectory
from temporality_run_executor.engine import Engine
from temporality_run_executor.providers.factory import ProviderCache
from temporality_run_executor.records import RunRecord
from temporality_testing.events import EventLog

RUN_ID = "run-dl-1"
EXHAUSTED = RuntimeError("deliveries exhausted without a settled outcome")


def _answered(request_id: str) -> Envelope:
    data = HumanAnswered(
        request_id=request_id,
        run_id=RUN_ID,
        recipient="user:alice",
        responder="user:alice",
        answer=TextAnswer(value="yes"),
        channel="web",
        waited_s=1.0,
    )
    return make_event(data, source="/test", id=f"evt-ans-{request_id}", run_id=RUN_ID)


async def _delivered(bus: Bus, event: Envelope) -> Delivery:
    """``event`` as a consumer receives it: published, then pulled from the stream."""
    await bus.publish(event)
    sub = await bus.js.pull_subscribe(event.nats_subject, durable="dl-probe", stream=EVENTS_STREAM.name)
    try:
        (msg,) = await sub.fetch(1, timeout=10)
        return Delivery(msg)
    finally:
        await sub.unsubscribe()


# (message, state, waiting request, applied requests, the run fails)
CASES = [
    pytest.param("run.requested", RunState.PENDING, None, [], True, id="requested-pending"),
    pytest.param("run.requested", RunState.RUNNING, None, [], True, id="requested-running-never-resumed"),
    pytest.param("run.requested", RunState.RUNNING, None, ["hr-1"], False, id="requested-running-after-a-resume"),
    pytest.param("run.requested", RunState.WAITING_FOR_HUMAN, "hr-1", [], False, id="requested-while-waiting"),
    pytest.param("hr-1", RunState.WAITING_FOR_HUMAN, "hr-1", [], True, id="answer-to-the-awaited-request"),
    pytest.param("hr-1", RunState.RESUMING, "hr-1", [], True, id="answer-while-resuming-with-it"),
    pytest.param("hr-0", RunState.WAITING_FOR_HUMAN, "hr-1", ["hr-0"], False, id="stale-answer-while-waiting"),
    pytest.param("hr-1", RunState.RUNNING, None, ["hr-0", "hr-1"], True, id="answer-the-run-resumed-with"),
    pytest.param("hr-0", RunState.RUNNING, None, ["hr-0", "hr-1"], False, id="older-answer-while-running"),
    pytest.param("run.requested", RunState.COMPLETED, None, [], False, id="requested-completed"),
    pytest.param("hr-1", RunState.FAILED, None, ["hr-1"], False, id="answer-failed"),
]


@pytest.mark.parametrize(("message", "state", "waiting", "applied", "fails"), CASES)
async def test_a_dead_lettered_message_fails_exactly_the_run_it_drives(
    bus: Bus,
    event_log: EventLog,
    message: str,
    state: RunState,
    waiting: str | None,
    applied: list[str],
    fails: bool,
) -> None:
    engine = await Engine.open(bus, AgentDirectory([REVIEWER]), ProviderCache(), max_deliver=8)
    await write_run(bus, RUN_ID, state, waiting=waiting, applied=applied)
    event = run_requested(RUN_ID) if message == "run.requested" else _answered(message)
    delivery = await _delivered(bus, event)

    await engine.on_dead_letter(event, delivery, EXHAUSTED)
    await engine.on_dead_letter(event, delivery, EXHAUSTED)  # the dead-lettering retried: idempotent

    stored = await (await bus.store(BUCKET_RUNS, RunRecord)).get(RUN_ID)
    assert stored is not None
    await event_log.caught_up()
    failures = event_log.of_type("run.failed", RUN_ID)
    if not fails:
        assert stored.value.state is state
        assert failures == []
        return
    assert stored.value.state is RunState.FAILED
    assert stored.value.error is not None
    assert stored.value.error.startswith("infrastructure_error: ")
    (failed,) = failures  # one run.failed however often the hook runs
    data = failed.payload(RunFailed)
    assert data.reason == "infrastructure_error"
    assert f"{event.type} {event.id} dead-lettered after 1 deliveries" in data.error
    assert "deliveries exhausted" in data.error
    assert failed.causationid == event.id


async def test_losing_a_race_to_another_driver_does_not_fail_the_run(bus: Bus, event_log: EventLog) -> None:
    engine = await Engine.open(bus, AgentDirectory([REVIEWER]), ProviderCache(), max_deliver=8)
    await write_run(bus, RUN_ID, RunState.RUNNING)
    event = run_requested(RUN_ID)
    delivery = await _delivered(bus, event)
    await engine.on_dead_letter(event, delivery, Conflict(BUCKET_CHECKPOINTS.name, RUN_ID, 3))
    await engine.on_dead_letter(b"not an envelope", delivery, EXHAUSTED)  # names no run: nothing to fail
    stored = await (await bus.store(BUCKET_RUNS, RunRecord)).get(RUN_ID)
    assert stored is not None
    assert stored.value.state is RunState.RUNNING
    await event_log.caught_up()
    assert event_log.of_type("run.failed") == []
