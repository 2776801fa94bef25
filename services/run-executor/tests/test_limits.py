"""RUN-3: waiting for a human burns no compute budget; computing past the budget fails the run."""

from __future__ import annotations

import asyncio

from executor_support import REVIEWER, RunExecutor, run_requested

from temporality_bus import Bus
from temporality_protocol import HumanAnswered, HumanRequested, OptionAnswer, make_event
from temporality_run_executor.agents import Limits
from temporality_testing.events import EventLog


async def test_waiting_longer_than_the_compute_budget_does_not_kill_the_run(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    # two computed turns of ~0.2 s before parking; the budget is 2 s; the human takes 2.5 s
    card = REVIEWER.model_copy(update={"limits": Limits(max_compute_s=2.0)})
    await executor(cards=[card], think_s=0.2)
    event = run_requested()
    await bus.publish(event)
    (req,) = await event_log.wait_for("human.requested", run_id=event.runid)
    await asyncio.sleep(2.5)  # the human is slow: wall time passes the budget while the run waits
    request = req.payload(HumanRequested)
    answered = HumanAnswered(
        request_id=request.request_id,
        run_id=request.run_id,
        recipient="user:alice",
        responder="user:alice",
        answer=OptionAnswer(option_id="keep-v1"),
        channel="web",
        waited_s=2.5,
    )
    await bus.publish(make_event(answered, source="/test", run_id=request.run_id))
    await event_log.wait_for("run.completed", run_id=event.runid)
    assert not event_log.of_type("run.failed", event.runid)


async def test_compute_past_the_budget_fails_the_run(bus: Bus, event_log: EventLog, executor: RunExecutor) -> None:
    card = REVIEWER.model_copy(update={"limits": Limits(max_compute_s=0.1)})
    await executor(cards=[card], think_s=0.2)
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid)
    assert failed.data["reason"] == "compute_timeout"
    assert not event_log.of_type("human.requested", event.runid)


async def test_max_turns_fails_the_run(bus: Bus, event_log: EventLog, executor: RunExecutor) -> None:
    card = REVIEWER.model_copy(update={"limits": Limits(max_turns=1)})
    await executor(cards=[card])
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid)
    assert failed.data["reason"] == "max_turns"
