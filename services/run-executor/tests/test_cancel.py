"""RUN-2 cancel over a real nats-server: ``run.cancel_requested`` -> ``cancelled`` + ``run.cancelled``.

A parked run is cancelled at once (its watchdog gone, a late answer ignored); a run in the middle of a
turn finishes that turn and is cancelled at the boundary; a second cancel and a cancel of a finished run
change nothing. A cancel that comes before its run: ``test_early_cancel.py``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from executor_support import PR_WITH_CONTRACT_CHANGE, RunExecutor, run_requested

from temporality_bus import Bus
from temporality_protocol import (
    HumanAnswered,
    HumanRequested,
    OptionAnswer,
    RunCancelled,
    RunCancelRequested,
    RunState,
    make_event,
)
from temporality_protocol.catalog import BUCKET_RUNS, TIMER_SCHEDULE_RUN_WATCHDOG, TIMERS_STREAM
from temporality_run_executor.agents import AgentCard
from temporality_run_executor.providers import AssistantTurn, Provider, ToolSpec, TurnContext
from temporality_run_executor.providers.factory import ProviderCache
from temporality_run_executor.records import Message, RunRecord
from temporality_run_executor.tools import BUILTIN_TOOLS, Tool, ToolContext, ToolRegistry
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays


async def _cancel(bus: Bus, run_id: str, *, reason: str = "wrong PR", by: str = "on-call", msg_id: str = "") -> int:
    data = RunCancelRequested(run_id=run_id, reason=reason, requested_by=by)
    published = await bus.publish(make_event(data, source="/test", id=msg_id or f"evt-cancel-{run_id}", run_id=run_id))
    return published.seq


async def _record(bus: Bus, run_id: str, expect: RunState | None = None, timeout_s: float = 30) -> RunRecord:
    store = await bus.store(BUCKET_RUNS, RunRecord)
    got = None
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                got = await store.get(run_id)
                if got is not None and (expect is None or got.value.state is expect):
                    return got.value
                await asyncio.sleep(0.05)
    except TimeoutError:
        seen = got.value.state if got is not None else None
        raise AssertionError(f"run {run_id} not {expect} within {timeout_s}s (last seen: {seen})") from None


async def _processed(bus: Bus, seq: int, timeout_s: float = 30) -> None:
    """Wait (bounded) until the executor's human/cancel consumer has acked everything up to ``seq``."""
    async with asyncio.timeout(timeout_s):
        while True:
            info = await bus.js.consumer_info("TEMPORALITY_EVENTS", "run-executor-human")
            if info.ack_floor.stream_seq >= seq and info.num_ack_pending == 0:
                return
            await asyncio.sleep(0.05)


async def _watchdog_schedules(bus: Bus, run_id: str) -> int:
    subject = f"{TIMER_SCHEDULE_RUN_WATCHDOG}.{run_id}"
    info = await bus.js.stream_info(TIMERS_STREAM.name, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


async def _disarmed(bus: Bus, run_id: str, timeout_s: float = 30) -> None:
    """Wait (bounded) until the run has no watchdog schedule left, then check it stays so."""
    async with asyncio.timeout(timeout_s):
        while await _watchdog_schedules(bus, run_id):  # noqa: ASYNC110 - polling the server's view
            await asyncio.sleep(0.05)

    async def none_left() -> bool:
        return await _watchdog_schedules(bus, run_id) == 0

    await stays(none_left, settle_s=0.5, what=f"no watchdog for {run_id}")


async def _parked(bus: Bus, event_log: EventLog) -> tuple[str, HumanRequested]:
    event = run_requested()
    assert event.runid
    await bus.publish(event)
    (requested,) = await event_log.wait_for("human.requested", run_id=event.runid)
    await _record(bus, event.runid, RunState.WAITING_FOR_HUMAN)
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
    record = await _record(bus, run_id, RunState.CANCELLED)
    assert record.cancel is not None
    assert (record.cancel.reason, record.cancel.requested_by) == ("wrong PR", "on-call")
    assert record.waiting_request_id is None
    await _disarmed(bus, run_id)  # just after the move
    # the person answers anyway (human-interaction had not cancelled the request yet): nothing moves
    answered = HumanAnswered(
        request_id=request.request_id,
        run_id=run_id,
        recipient="user:alice",
        responder="user:alice",
        answer=OptionAnswer(option_id="keep-v1"),
        channel="web",
        waited_s=1.0,
    )
    await _processed(bus, (await bus.publish(make_event(answered, source="/test", run_id=run_id))).seq)
    await event_log.caught_up()
    assert not event_log.of_type("run.resumed", run_id)
    assert not event_log.of_type("run.completed", run_id)
    assert (await _record(bus, run_id)).state is RunState.CANCELLED
    assert not event_log.of_type("bus.dead_lettered")


class GatedProvider(Provider):
    """The real scripted provider, each turn held until the test releases it: a turn in progress."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.turns = 0

    async def complete(
        self,
        messages: list[Message],
        tools: list[ToolSpec],
        *,
        budget_s: float | None = None,
        context: TurnContext | None = None,
    ) -> AssistantTurn:
        self.turns += 1
        self.entered.set()
        await self.release.wait()
        return await self.inner.complete(messages, tools, budget_s=budget_s, context=context)


async def test_a_run_in_the_middle_of_a_turn_is_cancelled_at_the_turn_boundary(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    cache = ProviderCache()
    gated: dict[str, GatedProvider] = {}

    def provider_for(card: AgentCard) -> Provider:
        return gated.setdefault(card.id, GatedProvider(cache(card)))

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
        async with asyncio.timeout(30):  # the cancel is recorded while the turn is still in progress
            while (await _record(bus, run_id)).cancel is None:  # noqa: ASYNC110 - polling KV
                await asyncio.sleep(0.02)
        assert (await _record(bus, run_id)).state is RunState.RUNNING
        gated["reviewer"].release.set()
        (cancelled,) = await event_log.wait_for("run.cancelled", run_id=run_id)
        assert cancelled.data["reason"] == "stop it (requested by admin)"
        await _record(bus, run_id, RunState.CANCELLED)
        await event_log.caught_up()
        # the turn in progress finished (its tool call, its checkpoint); no turn came after it
        (called,) = event_log.of_type("run.tool_called", run_id)
        assert (called.data["tool"], called.data["turn"]) == ("get_input", 1)
        assert [e.data["turn"] for e in event_log.of_type("run.checkpointed", run_id)] == [1]
        assert gated["reviewer"].turns == 1
        assert not event_log.of_type("human.requested", run_id)
        await _disarmed(bus, run_id)
        types = [e.type for e in event_log.events if e.runid == run_id]
        assert types.index("run.checkpointed") < types.index("run.cancelled")
    finally:
        await cache.aclose()


async def test_a_second_cancel_changes_nothing(bus: Bus, event_log: EventLog, executor: RunExecutor) -> None:
    await executor()
    run_id, _ = await _parked(bus, event_log)
    await _cancel(bus, run_id, reason="first", msg_id="evt-c1")
    await event_log.wait_for("run.cancelled", run_id=run_id)
    await _processed(bus, await _cancel(bus, run_id, reason="second", msg_id="evt-c2"))
    await event_log.caught_up()
    (cancelled,) = event_log.of_type("run.cancelled", run_id)
    assert cancelled.data["reason"] == "first (requested by on-call)"
    record = await _record(bus, run_id, RunState.CANCELLED)
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
    done = await _record(bus, run_id, RunState.COMPLETED)
    await _processed(bus, await _cancel(bus, run_id))
    await event_log.caught_up()
    assert not event_log.of_type("run.cancelled", run_id)
    after = await _record(bus, run_id)
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
    await _processed(bus, await _cancel(bus, run_id, reason="mid-tool", by="admin"))
    assert (await _record(bus, run_id)).state is RunState.RUNNING  # recorded, deferred to the boundary
    release.set()
    (cancelled,) = await event_log.wait_for("run.cancelled", run_id=run_id)
    assert cancelled.data["reason"] == "mid-tool (requested by admin)"
    await _record(bus, run_id, RunState.CANCELLED)
    await event_log.caught_up()
    assert [e.data["turn"] for e in event_log.of_type("run.checkpointed", run_id)] == [1]
    assert not event_log.of_type("human.requested", run_id)  # no turn 2
