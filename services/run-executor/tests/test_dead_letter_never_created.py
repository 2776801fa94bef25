"""A dead-lettered ``run.requested`` that never created its run (a valid envelope whose data the run-executor cannot
read) fails the run: the journal showed it ``pending`` for ever from the request alone, and a cancel said 404.

The hook gets a real message pulled from a real nats-server, as the consumer runner would hand it over; the
``run.failed`` is read back from the real events stream (once, however often the hook runs)."""

from __future__ import annotations

from executor_support import REVIEWER, run_requested, write_run
from test_dead_letter import EXHAUSTED, _delivered

from temporality_bus import Bus, PermanentError
from temporality_protocol import Envelope, RunFailed, RunState
from temporality_protocol.catalog import BUCKET_RUNS
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
    # nothing drives it: no record is made for it
    assert await (await bus.store(BUCKET_RUNS, RunRecord)).get(run_id) is None


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
