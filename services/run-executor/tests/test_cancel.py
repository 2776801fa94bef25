"""RUN-2 cancel over a real nats-server: ``run.cancel_requested`` -> ``cancelled`` + ``run.cancelled``.

A parked run is cancelled at once (its watchdog gone, a late answer ignored); a run in the middle of a
turn finishes that turn and is cancelled at the boundary; a second cancel and a cancel of a finished run
change nothing. A cancel that comes before its run: ``test_early_cancel.py``; during its last turn:
``test_final_turn_cancel.py``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from executor_support import (
    PR_WITH_CONTRACT_CHANGE,
    HeldProvider,
    RunExecutor,
    disarmed,
    handled,
    keep_v1,
    run_record,
    run_requested,
)

from temporality_bus import Bus
from temporality_protocol import (
    HumanRequested,
    RunCancelled,
    RunCancelRequested,
    RunState,
    make_event,
)
from temporality_run_executor.agents import AgentCard
from temporality_run_executor.providers import Provider
from temporality_run_executor.providers.factory import ProviderCache
from temporality_run_executor.tools import BUILTIN_TOOLS, Tool, ToolContext, ToolRegistry
from temporality_testing.events import EventLog


async def _cancel(bus: Bus, run_id: str, *, reason: str = "wrong PR", by: str = "on-call", msg_id: str = "") -> int:
    data = RunCancelRequested(run_id=run_id, reason=reason, requested_by=by)
    published = await bus.publish(make_event(data, source="/test", id=msg_id or f"evt-cancel-{run_id}", run_id=run_id))
    return published.seq


async def _parked(bus: Bus, event_log: EventLog) -> tuple[str, HumanRequested]:
    event = run_requested()
    assert event.runid
    await bus.publish(event)
    (requested,) = await event_log.wait_for("human.requested", run_id=event.runid)
    await run_record(bus, event.runid, RunState.WAITING_FOR_HUMAN)
    return event.runid, requested.payload(HumanRequested)


async def test_cancelling_a_parked_run_ends_it_and_a_late_answer_is_ignored(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    await executor()
    run_id, request = await _parked(bus, event_log)
    await _cancel(bus, run_id)
    (cancelled,) = await event_log.wait_for("run.cancelled", run_id=run_id)
    assert cancelled.payload(RunCancelled).reason == "wrong PR (requested by on-call)"
    assert cancelled.causationid == f"evt-cancel-{run_id}"
    record = await run_record(bus, run_id, RunState.CANCELLED)
    assert record.cancel is not None
    assert (record.cancel.reason, record.cancel.requested_by) == ("wrong PR", "on-call")
    assert record.waiting_request_id is None
    await disarmed(bus, run_id, settle_s=0.5)  # just after the move
    # the person answers anyway (human-interaction had not cancelled the request yet): nothing moves
    answered = keep_v1(run_id, request.request_id)
    await handled(
        bus, "run-executor-human", (await bus.publish(make_event(answered, source="/test", run_id=run_id))).seq
    )
    await event_log.caught_up()
    assert not event_log.of_type("run.resumed", run_id)
    assert not event_log.of_type("run.completed", run_id)
    assert (await run_record(bus, run_id)).state is RunState.CANCELLED
    assert not event_log.of_type("bus.dead_lettered")


async def test_a_run_in_the_middle_of_a_turn_is_cancelled_at_the_turn_boundary(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    cache = ProviderCache()
    gated: dict[str, HeldProvider] = {}  # the real scripted provider, each turn held: a turn in progress

    def provider_for(card: AgentCard) -> Provider:
        return gated.setdefault(card.id, HeldProvider(cache(card)))

    try:
        await executor(provider_for=provider_for)
        event = run_requested()
        run_id = event.runid
        assert run_id
        await bus.publish(event)
        async with asyncio.timeout(30):
            while "reviewer" not in gated:  # noqa: ASYNC110 - the provider is made by the handler
                await asyncio.sleep(0.02)
            await gated["reviewer"].entered.wait()  # turn 1 is in the provider
        await _cancel(bus, run_id, reason="stop it", by="admin")
        await run_record(bus, run_id, lambda r: r.cancel is not None)  # recorded while the turn is still in progress
        assert (await run_record(bus, run_id)).state is RunState.RUNNING
        gated["reviewer"].release.set()
        (cancelled,) = await event_log.wait_for("run.cancelled", run_id=run_id)
        assert cancelled.data["reason"] == "stop it (requested by admin)"
        await run_record(bus, run_id, RunState.CANCELLED)
        await event_log.caught_up()
        # the turn in progress finished (its tool call, its checkpoint); no turn came after it
        (called,) = event_log.of_type("run.tool_called", run_id)
        assert (called.data["tool"], called.data["turn"]) == ("get_input", 1)
        assert [e.data["turn"] for e in event_log.of_type("run.checkpointed", run_id)] == [1]
        assert gated["reviewer"].calls == 1
        assert not event_log.of_type("human.requested", run_id)
        await disarmed(bus, run_id, settle_s=0.5)
        types = [e.type for e in event_log.events if e.runid == run_id]
        assert types.index("run.checkpointed") < types.index("run.cancelled")
    finally:
        await cache.aclose()


async def test_a_second_cancel_changes_nothing(bus: Bus, event_log: EventLog, executor: RunExecutor) -> None:
    await executor()
    run_id, _ = await _parked(bus, event_log)
    await _cancel(bus, run_id, reason="first", msg_id="evt-c1")
    await event_log.wait_for("run.cancelled", run_id=run_id)
    await handled(bus, "run-executor-human", await _cancel(bus, run_id, reason="second", msg_id="evt-c2"))
    await event_log.caught_up()
    (cancelled,) = event_log.of_type("run.cancelled", run_id)
    assert cancelled.data["reason"] == "first (requested by on-call)"
    record = await run_record(bus, run_id, RunState.CANCELLED)
    assert record.cancel is not None
    assert record.cancel.event_id == "evt-c1"
    assert not event_log.of_type("bus.dead_lettered")


async def test_a_finished_run_ignores_a_cancel(bus: Bus, event_log: EventLog, executor: RunExecutor) -> None:
    await executor()
    pr = json.loads(json.dumps(PR_WITH_CONTRACT_CHANGE))
    pr["pull_request"]["title"], pr["pull_request"]["description"] = "Fix typo", "Spelling."
    event = run_requested(pr=pr)
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=run_id)
    done = await run_record(bus, run_id, RunState.COMPLETED)
    await handled(bus, "run-executor-human", await _cancel(bus, run_id))
    await event_log.caught_up()
    assert not event_log.of_type("run.cancelled", run_id)
    after = await run_record(bus, run_id)
    assert (after.state, after.result, after.cancel) == (RunState.COMPLETED, done.result, None)
    assert not event_log.of_type("bus.dead_lettered")


async def test_a_cancel_recorded_during_a_tool_call_applies_at_the_boundary_after_it(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_input(arguments: dict[str, Any], ctx: ToolContext) -> str:
        entered.set()
        await release.wait()
        return json.dumps(ctx.run.input, sort_keys=True)

    gated = Tool(name="get_input", description="d", parameters={"type": "object"}, implementation=slow_input)
    await executor(tools=ToolRegistry([gated, *(t for t in BUILTIN_TOOLS if t.name != "get_input")]))
    event = run_requested()
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    await asyncio.wait_for(entered.wait(), 30)  # turn 1's tool call is running
    await handled(bus, "run-executor-human", await _cancel(bus, run_id, reason="mid-tool", by="admin"))
    assert (await run_record(bus, run_id)).state is RunState.RUNNING  # recorded, deferred to the boundary
    release.set()
    (cancelled,) = await event_log.wait_for("run.cancelled", run_id=run_id)
    assert cancelled.data["reason"] == "mid-tool (requested by admin)"
    await run_record(bus, run_id, RunState.CANCELLED)
    await event_log.caught_up()
    assert [e.data["turn"] for e in event_log.of_type("run.checkpointed", run_id)] == [1]
    assert not event_log.of_type("human.requested", run_id)  # no turn 2
