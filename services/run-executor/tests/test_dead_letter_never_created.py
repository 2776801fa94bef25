"""A dead-lettered ``run.requested`` that never created its run (a valid envelope whose data the run-executor cannot
read) fails the run: the journal showed it ``pending`` for ever from the request alone, and a cancel said 404.

The run store decides: the hook creates the run's record already failed (create-if-absent) and publishes
``run.failed`` only when that create wins. A later copy of the request (``temporality dlq redrive``, or the last
delivery still running on a slower replica) finds the record finished and starts nothing; a record the request's
handler made first leaves the hook nothing to publish.

The hook gets a real message pulled from a real nats-server, as the consumer runner would hand it over; the
``run.failed`` is read back from the real events stream (once, however often the hook runs)."""

from __future__ import annotations

import pytest
from executor_support import REVIEWER, run_requested, write_run
from test_dead_letter import EXHAUSTED, _delivered

from temporality_bus import Bus, PermanentError
from temporality_protocol import Envelope, RunFailed, RunState
from temporality_protocol.catalog import BUCKET_RUNS
from temporality_protocol.errors import InvalidEnvelope
from temporality_run_executor.agents import AgentDirectory
from temporality_run_executor.engine import Engine
from temporality_run_executor.machine import event_id
from temporality_run_executor.providers.factory import ProviderCache
from temporality_run_executor.records import RunRecord
from temporality_testing.events import EventLog


def _bad_data(run_id: str) -> Envelope:
    """A valid CloudEvent ``run.requested`` for ``run_id`` whose data is no ``RunRequested`` (no agent, no launch)."""
    good = run_requested(run_id)
    return good.model_copy(update={"data": {"run_id": run_id, "title": 42}})


async def test_a_run_requested_given_up_before_it_created_the_run_fails_it_once(bus: Bus, event_log: EventLog) -> None:
    engine = await Engine.open(bus, AgentDirectory([REVIEWER]), ProviderCache(), max_deliver=8)
    run_id = "run-dl-never-created"
    event = _bad_data(run_id)
    delivery = await _delivered(bus, event)
    refused = PermanentError("run.requested data does not validate: agent field required")

    await engine.on_dead_letter(event, delivery, refused)
    await engine.on_dead_letter(event, delivery, refused)  # the dead-lettering retried: idempotent

    await event_log.caught_up()
    (failed,) = event_log.of_type("run.failed", run_id)  # one, however often the hook runs
    assert failed.id == event_id(run_id, RunFailed.EVENT_TYPE)  # the run's own deterministic failure id
    assert failed.causationid == event.id
    assert failed.runid == run_id
    data = failed.payload(RunFailed)
    assert data.reason == "infrastructure_error"
    assert f"run.requested {event.id} dead-lettered after 1 deliveries before the run was created" in data.error
    assert "agent field required" in data.error
    # the record the hook created, failed: what a later copy of the request meets
    record = await (await bus.store(BUCKET_RUNS, RunRecord)).get(run_id)
    assert record is not None
    assert record.value.state is RunState.FAILED
    assert record.value.never_started
    assert record.value.ending is not None
    assert record.value.ending.published
    assert [e.type for e in event_log.events if e.runid == run_id] == ["run.requested", "run.failed"]


async def test_a_created_run_or_an_envelope_without_a_run_id_gets_no_extra_failure(
    bus: Bus, event_log: EventLog
) -> None:
    engine = await Engine.open(bus, AgentDirectory([REVIEWER]), ProviderCache(), max_deliver=8)
    # the envelope names no run (only its unreadable data does): nothing is published for it
    anonymous = _bad_data("run-dl-anonymous").model_copy(update={"runid": None})
    await engine.on_dead_letter(anonymous, await _delivered(bus, anonymous), EXHAUSTED)
    # a run that was created (pending): the machine fails it, once; the hook adds nothing
    await write_run(bus, "run-dl-created", RunState.PENDING)
    created = run_requested("run-dl-created")
    await engine.on_dead_letter(created, await _delivered(bus, created), EXHAUSTED)
    await event_log.caught_up()
    assert event_log.of_type("run.failed", "run-dl-anonymous") == []
    (failed,) = event_log.of_type("run.failed", "run-dl-created")
    assert "before the run was created" not in failed.payload(RunFailed).error


def _of_run(event_log: EventLog, run_id: str) -> list[str]:
    return [e.type for e in event_log.events if e.runid == run_id]


@pytest.mark.parametrize("readable", [False, True], ids=["unreadable-data", "readable-data"])
async def test_a_request_of_a_run_the_hook_failed_starts_nothing_and_publishes_nothing(
    bus: Bus, event_log: EventLog, readable: bool
) -> None:
    """``temporality dlq redrive`` of the request (or its last delivery, still running on a stalled replica, coming
    after the hook): the run stays failed, no ``run.created`` / ``run.started``, no second ``run.failed``."""
    engine = await Engine.open(bus, AgentDirectory([REVIEWER]), ProviderCache(), max_deliver=8)
    run_id = f"run-dl-redriven-{'readable' if readable else 'unreadable'}"
    # readable: every delivery died (or ran on a replica that stalled), so the hook ran with no record yet
    event = run_requested(run_id) if readable else _bad_data(run_id)
    delivery = await _delivered(bus, event)
    await engine.on_dead_letter(event, delivery, EXHAUSTED)
    await event_log.wait_for("run.failed", run_id=run_id)

    for _ in range(2):  # redriven twice (`temporality dlq redrive` publishes the payload unchanged, the same id)
        copy = event
        if readable:
            await engine.on_run_requested(copy, delivery)  # acknowledged: nothing raised, nothing to retry
        else:
            with pytest.raises(InvalidEnvelope) as refused:  # unreadable again: dead-lettered again ...
                await engine.on_run_requested(copy, delivery)
            await engine.on_dead_letter(copy, delivery, refused.value)  # ... and the run left as it is

    await event_log.caught_up()
    assert _of_run(event_log, run_id) == ["run.requested", "run.failed"]
    record = await (await bus.store(BUCKET_RUNS, RunRecord)).get(run_id)
    assert record is not None
    assert record.value.state is RunState.FAILED


async def test_a_record_made_first_by_the_request_leaves_the_hook_nothing_to_publish(
    bus: Bus, event_log: EventLog
) -> None:
    """The request's handler created the record (here: the run went on to wait for a person, which a dead-lettered
    ``run.requested`` no longer drives): the hook's create loses and it publishes nothing, the record untouched."""
    engine = await Engine.open(bus, AgentDirectory([REVIEWER]), ProviderCache(), max_deliver=8)
    run_id = "run-dl-made-first"
    await write_run(bus, run_id, RunState.WAITING_FOR_HUMAN, waiting="hr-1")
    event = run_requested(run_id)
    await engine.on_dead_letter(event, await _delivered(bus, event), EXHAUSTED)
    await event_log.caught_up()
    assert _of_run(event_log, run_id) == ["run.requested"]
    record = await (await bus.store(BUCKET_RUNS, RunRecord)).get(run_id)
    assert record is not None
    assert record.value.state is RunState.WAITING_FOR_HUMAN
    assert not record.value.never_started
