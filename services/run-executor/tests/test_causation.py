"""The run-executor's events say what caused them (the envelope's ``causationid``), over a real nats-server.

A run's trajectory is one chain: ``run.created`` <- its ``run.requested``, ``run.started`` <- ``run.created``, the
first turn's events <- ``run.started``, a later turn's <- the previous turn's ``run.checkpointed`` (a park's
``human.requested`` too), ``run.resumed`` <- the outcome that ended the wait, the resumed turn's <- ``run.resumed``,
the end <- the last event of the turn that ended it (a cancel: its ``run.cancel_requested``; an expiry that fails
the run: its ``human.expired``). The crash matrix (``test_crash_matrix.py``) holds every crash point to the same
rule and to one causation per event id.
"""

from __future__ import annotations

from causation_support import Wire, assert_caused
from executor_support import RunExecutor, keep_v1, run_requested

from temporality_bus import Bus
from temporality_protocol import (
    HumanExpired,
    HumanRequested,
    RunCancelRequested,
    TimeoutPolicy,
    derive_id,
    make_event,
)
from temporality_testing.events import EventLog


def _id(run_id: str, event_type: str, *parts: str) -> str:
    return derive_id("evt", run_id, event_type, *parts)


async def test_a_run_that_asks_and_resumes_is_one_chain_of_causes(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    wire = await Wire().start(bus.nc)
    await executor()
    requested = run_requested()
    run_id = requested.runid
    assert run_id
    await bus.publish(requested)
    (asked,) = await event_log.wait_for("human.requested", run_id=run_id, timeout_s=30)
    request_id = asked.payload(HumanRequested).request_id
    answered = make_event(
        keep_v1(run_id, request_id), source="/test", id=f"evt-ans-{run_id}", run_id=run_id, causation_id=asked.id
    )
    await bus.publish(answered)
    await event_log.wait_for("run.completed", run_id=run_id, timeout_s=30)
    await event_log.caught_up()
    await bus.nc.flush()

    mine = assert_caused(event_log.events, run_id)
    cause = {(e.type, e.data.get("turn"), e.data.get("kind")): e.causationid for e in mine.values()}
    started, created = _id(run_id, "run.started"), _id(run_id, "run.created")
    checkpointed = {turn: _id(run_id, "run.checkpointed", str(turn)) for turn in (1, 2)}
    resumed = _id(run_id, "run.resumed", request_id)
    assert cause[("run.created", None, None)] == requested.id
    assert cause[("run.started", None, None)] == created
    # turn 1 (get_input) follows from run.started
    assert cause[("run.tool_called", 1, None)] == started
    assert cause[("run.checkpointed", 1, None)] == started
    assert cause[("run.streamed", 1, "metrics")] == started
    # turn 2 (ask_human) from turn 1's checkpoint; the park's question from turn 2's
    assert cause[("run.checkpointed", 2, None)] == checkpointed[1]
    assert cause[("run.streamed", 2, "metrics")] == checkpointed[1]
    assert asked.causationid == checkpointed[2]
    # the resume from the answer, the resumed turn from run.resumed, the end from that turn's last event
    assert cause[("run.resumed", None, None)] == answered.id
    assert mine[resumed].causationid == answered.id
    assert cause[("run.streamed", 3, "metrics")] == resumed
    assert cause[("run.completed", None, None)] == _id(run_id, "run.streamed", "3", "metrics")
    assert not wire.same_causation()


async def test_a_cancelled_run_is_caused_by_its_cancel_request(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    await executor()
    requested = run_requested()
    run_id = requested.runid
    assert run_id
    await bus.publish(requested)
    await event_log.wait_for("human.requested", run_id=run_id, timeout_s=30)
    cancel = make_event(
        RunCancelRequested(run_id=run_id, reason="wrong PR", requested_by="on-call"),
        source="/test",
        id=f"evt-cancel-{run_id}",
        run_id=run_id,
    )
    await bus.publish(cancel)
    (cancelled,) = await event_log.wait_for("run.cancelled", run_id=run_id, timeout_s=30)
    await event_log.caught_up()
    assert cancelled.causationid == cancel.id
    assert_caused(event_log.events, run_id)


async def test_an_expiry_that_fails_the_run_causes_its_failure(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    await executor()
    requested = run_requested(on_timeout=TimeoutPolicy(action="fail"))
    run_id = requested.runid
    assert run_id
    await bus.publish(requested)
    (asked,) = await event_log.wait_for("human.requested", run_id=run_id, timeout_s=30)
    request_id = asked.payload(HumanRequested).request_id
    expired = make_event(
        HumanExpired(request_id=request_id, run_id=run_id, recipient="user:alice", action="fail", waited_s=600.0),
        source="/test",
        id=f"evt-expired-{run_id}",
        run_id=run_id,
        causation_id=asked.id,
    )
    await bus.publish(expired)
    (failed,) = await event_log.wait_for("run.failed", run_id=run_id, timeout_s=30)
    await event_log.caught_up()
    assert failed.data["reason"] == "human_request_expired"
    assert failed.causationid == expired.id
    assert_caused(event_log.events, run_id)
