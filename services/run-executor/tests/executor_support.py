"""Helpers and the executor fixture factory for the run-executor tests: the shipped reviewer and its input,
the engine wired to its consumers as ``__main__`` wires it (:func:`start_consumers`, used here and by
``executor_processes``), and the bounded waits on the server's view (a run's record, a consumer settled,
a watchdog schedule) that the test files share."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from temporality_bus import Bus, Consumer
from temporality_protocol import (
    Envelope,
    HumanAnswered,
    HumanPolicy,
    LaunchSource,
    OptionAnswer,
    RunRequested,
    RunState,
    TimeoutPolicy,
    make_event,
    new_id,
)
from temporality_protocol.catalog import (
    BUCKET_CHECKPOINTS,
    BUCKET_RUNS,
    CONSUMERS,
    EVENTS_STREAM,
    TIMER_FIRED_RUN_WATCHDOG,
    TIMER_SCHEDULE_RUN_WATCHDOG,
    TIMERS_STREAMS,
)
from temporality_run_executor.__main__ import SPEC, configure
from temporality_run_executor.agents import AgentCard, AgentDirectory, ProviderConfig
from temporality_run_executor.engine import Engine, ProviderFactory
from temporality_run_executor.providers import AssistantTurn, Provider, ToolSpec, TurnContext
from temporality_run_executor.providers.factory import ProviderCache
from temporality_run_executor.providers.script import Script
from temporality_run_executor.records import Checkpoint, Message, RunRecord
from temporality_run_executor.settings import Settings
from temporality_run_executor.tools import Tool, ToolPolicy, ToolRegistry
from temporality_run_executor.watchdog import DEFAULT_GRACE_S, WatchdogPayload
from temporality_service import run_until
from temporality_testing.inprocess import Main
from temporality_testing.timers import armed_schedules
from temporality_testing.waiting import stays

REVIEWER = AgentCard(
    id="reviewer",
    role="Code reviewer",
    system_prompt="You review pull requests.",
    provider=ProviderConfig(kind="scripted", script="reviewer"),
)

#: Answers at once: its first turn (the checkpoint still at turn 0) is its last, and ends the run.
FINISHER = AgentCard(
    id="finisher",
    role="Finisher",
    system_prompt="You answer at once.",
    tools=ToolPolicy(allow=[]),
    provider=ProviderConfig(
        kind="scripted", script=Script.model_validate({"steps": [{"id": "done", "answer": "LGTM"}]})
    ),
)
#: The events that end a run.
TERMINAL = ("run.completed", "run.failed", "run.cancelled")

PR_WITH_CONTRACT_CHANGE: dict[str, Any] = {
    "repository": {"id": "r1", "name": "orders-service", "url": "https://dev.azure.com/x/_git/orders", "project": "P"},
    "pull_request": {
        "id": 42,
        "title": "Orders API: return totals as money objects",
        "description": "Changes the response of GET /api/orders/{id}. Not sure about old clients.",
        "url": "https://dev.azure.com/x/pr/42",
        "status": "active",
        "created_at": "2026-11-30T10:00:00Z",
    },
    "source_branch": "feature/money",
    "target_branch": "main",
    "author": {"id": "u1", "display_name": "Jamie Doe", "unique_name": "jamie@example.com"},
    "reviewers": [],
    "commits": {"source": "abc", "target": "def"},
}


def run_requested(
    run_id: str | None = None,
    *,
    pr: dict[str, Any] | None = None,
    on_timeout: TimeoutPolicy | None = None,
    agent: str = "reviewer",
    allowed: list[str] | None = None,
) -> Envelope:
    run_id = run_id or new_id("run")
    data = RunRequested(
        run_id=run_id,
        agent=agent,
        title="Review PR #42: Orders API: return totals as money objects",
        launch=LaunchSource(kind="webhook", trigger_id="ado-pr-review", delivery_id="dlv-1"),
        input=pr if pr is not None else PR_WITH_CONTRACT_CHANGE,
        human=HumanPolicy(
            allowed_recipients=allowed if allowed is not None else ["user:alice"],
            default_timeout_s=600,
            on_timeout=on_timeout or TimeoutPolicy(),
        ),
    )
    return make_event(data, source="/test", id=f"evt-rr-{run_id}", run_id=run_id)


def keep_v1(run_id: str, request_id: str, *, waited_s: float = 1.0) -> HumanAnswered:
    """alice's answer to the reviewer's question ``request_id``: option ``keep-v1`` (keep the v1 contract), on the
    web channel, after ``waited_s``."""
    return HumanAnswered(
        request_id=request_id,
        run_id=run_id,
        recipient="user:alice",
        responder="user:alice",
        answer=OptionAnswer(option_id="keep-v1"),
        channel="web",
        waited_s=waited_s,
    )


def expires_in(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


class HeldProvider(Provider):
    """A provider that counts its calls and, with ``hold``, keeps each call waiting until the test sets
    ``release`` (``entered`` is set once a call is in): a turn in progress, or a driver hung in one. The call
    then returns :meth:`answer`: ``inner``'s reply unless a subclass says otherwise."""

    def __init__(self, inner: Provider | None = None, *, hold: bool = True) -> None:
        self.inner = inner
        self.hold = hold
        self.calls = 0
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(
        self,
        messages: list[Message],
        tools: list[ToolSpec],
        *,
        budget_s: float | None = None,
        context: TurnContext | None = None,
    ) -> AssistantTurn:
        self.calls += 1
        if self.hold:
            self.entered.set()
            await self.release.wait()
        return await self.answer(messages, tools, budget_s=budget_s, context=context)

    async def answer(
        self, messages: list[Message], tools: list[ToolSpec], *, budget_s: float | None, context: TurnContext | None
    ) -> AssistantTurn:
        assert self.inner is not None, "a HeldProvider without inner must override answer"
        return await self.inner.complete(messages, tools, budget_s=budget_s, context=context)


async def write_run(
    bus: Bus,
    run_id: str,
    state: RunState,
    *,
    turn: int = 2,
    waiting: str | None = None,
    applied: list[str] | None = None,
) -> None:
    """Put a run record and its checkpoint straight into KV: the situation a crash (or a hang) leaves behind."""
    now = datetime.now(UTC)
    record = RunRecord(
        run_id=run_id,
        state=state,
        agent=REVIEWER.id,
        title="Review PR #42",
        launch=LaunchSource(kind="webhook", trigger_id="ado-pr-review", delivery_id="dlv-1"),
        correlation_id=run_id,
        created_at=now,
        updated_at=now,
        waiting_request_id=waiting,
        waiting_since=now if waiting is not None else None,
    )
    await (await bus.store(BUCKET_RUNS, RunRecord)).put(run_id, record)
    ckpt = Checkpoint(
        checkpoint_id=f"ckpt-{turn}",
        run_id=run_id,
        turn=turn,
        saved_at=now,
        messages=[],
        applied_requests=applied or [],
    )
    await (await bus.store(BUCKET_CHECKPOINTS, Checkpoint)).put(run_id, ckpt)


#: The executor's durable consumers on the events stream (the watchdog's is on the timers stream).
EVENT_DURABLES = ("run-executor-requests", "run-executor-human", "run-executor-agents")
POLL_S = 0.05
#: The consumers' fetch timeout: how long a stopped consumer takes to notice (its pending fetch ends first).
#: The service's 1 s default would add up to a second to the end of every test.
FETCH_TIMEOUT_S = 0.2


async def run_record(
    bus: Bus,
    run_id: str,
    expect: RunState | Callable[[RunRecord], bool] | None = None,
    *,
    timeout_s: float = 30,
) -> RunRecord:
    """The run's record; with ``expect`` (a state, or a check of the record), wait (bounded) until it holds.
    AssertionError, naming the last state seen, when it does not within ``timeout_s``."""
    store = await bus.store(BUCKET_RUNS, RunRecord)

    def holds(record: RunRecord) -> bool:
        if expect is None:
            return True
        if isinstance(expect, RunState):
            return record.state is expect
        return expect(record)

    seen: RunRecord | None = None
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                got = await store.get(run_id)
                seen = got.value if got is not None else None
                if seen is not None and holds(seen):
                    return seen
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        state = seen.state.value if seen is not None else None
        raise AssertionError(f"run {run_id}: {expect} not reached within {timeout_s}s (last seen: {state})") from None


async def settled(bus: Bus, durables: Sequence[str] = EVENT_DURABLES, *, timeout_s: float = 30) -> None:
    """Wait (bounded) until every one of ``durables`` (on the events stream) has nothing pending and nothing
    unacked, all in the same look."""
    infos: list[Any] = []
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                infos = [await bus.js.consumer_info(EVENTS_STREAM.name, durable) for durable in durables]
                if all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos):
                    return
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise AssertionError(f"{', '.join(durables)} not settled within {timeout_s}s: {infos}") from None


async def handled(bus: Bus, durable: str, seq: int, *, stream: str = EVENTS_STREAM.name, timeout_s: float = 30) -> None:
    """Wait (bounded) until ``durable`` has acked everything up to stream sequence ``seq``.

    Unlike "nothing pending" (the server may not have counted a just-published message yet), this cannot
    pass before the message was handled; whatever the handler published is on the stream by then.
    """
    info = None
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                info = await bus.js.consumer_info(stream, durable)
                if info.ack_floor.stream_seq >= seq and info.num_ack_pending == 0:
                    return
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise AssertionError(f"{durable} has not handled stream seq {seq} within {timeout_s}s: {info}") from None


async def fire_watchdog(bus: Bus, run_id: str, turn: int) -> int:
    """A watchdog firing for ``run_id`` armed at ``turn``, as the server publishes it; returns its sequence."""
    now = datetime.now(UTC)
    payload = WatchdogPayload(run_id=run_id, turn=turn, armed_at=now - timedelta(seconds=5), deadline=now)
    published = await bus.publish_raw(f"{TIMER_FIRED_RUN_WATCHDOG}.{run_id}", payload.model_dump_json().encode(), {})
    return published.seq


async def watchdog_handled(bus: Bus, run_id: str, turn: int) -> None:
    """:func:`fire_watchdog`, then wait (bounded) until the executor's watchdog consumer has handled the firing."""
    seq = await fire_watchdog(bus, run_id, turn)
    await handled(bus, CONSUMERS["run-executor-watchdog"].durable, seq, stream=TIMERS_STREAMS["run-executor"].name)


async def watchdog_schedules(bus: Bus, run_id: str) -> int:
    """How many watchdog schedules the timers stream holds for ``run_id`` (0 or 1: one per subject)."""
    return await armed_schedules(bus, f"{TIMER_SCHEDULE_RUN_WATCHDOG}.{run_id}")


async def disarmed(bus: Bus, run_id: str, *, settle_s: float = 0.0, timeout_s: float = 30) -> None:
    """Wait (bounded) until the run has no watchdog schedule (a finished run is disarmed just after its move);
    with ``settle_s``, then check that it stays so for that long."""
    try:
        async with asyncio.timeout(timeout_s):
            while await watchdog_schedules(bus, run_id):  # noqa: ASYNC110 - polling the server's view
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise AssertionError(f"run {run_id} still has a watchdog armed after {timeout_s}s") from None
    if settle_s:

        async def none_left() -> bool:
            return await watchdog_schedules(bus, run_id) == 0

        await stays(none_left, settle_s=settle_s, what=f"no watchdog for {run_id}")


def start_consumers(
    bus: Bus, engine: Engine, stop: asyncio.Event, *, max_deliver: int = 8
) -> tuple[list[Consumer], list[asyncio.Task[None]]]:
    """The engine's four consumers, wired as ``__main__`` wires them (the run consumers with the dead-letter
    hook, the watchdog's firings) with fast retries (backoff 0.05, 0.1 s) and a short fetch timeout, running
    until ``stop``."""
    consumers: list[Consumer] = []
    for name, handler in (
        ("run-executor-requests", engine.on_run_requested),
        ("run-executor-human", engine.on_human_event),
        ("run-executor-agents", engine.on_agent_event),
    ):
        spec = dataclasses.replace(CONSUMERS[name], max_deliver=max_deliver, backoff_s=(0.05, 0.1))
        consumers.append(
            Consumer(
                bus,
                spec,
                handler=handler,
                max_inflight=4,
                on_dead_letter=engine.on_dead_letter,
                fetch_timeout_s=FETCH_TIMEOUT_S,
            )
        )
    watchdog = dataclasses.replace(CONSUMERS["run-executor-watchdog"], backoff_s=(0.05, 0.1))
    consumers.append(
        Consumer(bus, watchdog, raw_handler=engine.on_watchdog, max_inflight=4, fetch_timeout_s=FETCH_TIMEOUT_S)
    )
    return consumers, [asyncio.create_task(c.run(stop)) for c in consumers]


async def consumers_running(consumers: Sequence[Consumer]) -> None:
    await asyncio.wait_for(asyncio.gather(*(c.running.wait() for c in consumers)), 30)  # bound on the server


def executor_main(settings: Settings) -> Main:
    """The run-executor service as ``__main__`` runs it, in this event loop (for ``temporality_testing.inprocess``)."""

    def main(stop: asyncio.Event, ready: asyncio.Event) -> Awaitable[None]:
        return run_until(SPEC, settings, configure(settings), stop, ready=ready)

    return main


RunExecutor = Callable[..., Awaitable[Engine]]


@pytest.fixture
async def executor(bus: Bus) -> AsyncIterator[RunExecutor]:
    """Start the engine's three consumers in this loop (real Consumers on the real server), wired as
    ``__main__`` wires them: the run consumers with the dead-letter hook, the watchdog's firings."""
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    caches: list[ProviderCache] = []

    async def start(
        cards: list[AgentCard] | None = None,
        max_deliver: int = 8,
        think_s: float = 0.0,
        *,
        provider_for: ProviderFactory | None = None,
        watchdog_grace_s: float = DEFAULT_GRACE_S,
        tools: ToolRegistry | None = None,
        card_tools: dict[str, list[Tool]] | None = None,
        lease_s: float | None = None,
        watchdog_defer_s: float | None = None,
    ) -> Engine:
        cache = ProviderCache(scripted_think_s=think_s)
        caches.append(cache)
        engine = await Engine.open(
            bus,
            AgentDirectory(cards or [REVIEWER]),
            provider_for or cache,
            max_deliver=max_deliver,
            watchdog_grace_s=watchdog_grace_s,
            tools=tools,
            card_tools=card_tools,
            lease_s=lease_s,
            watchdog_defer_s=watchdog_defer_s,
        )
        consumers, started = start_consumers(bus, engine, stop, max_deliver=max_deliver)
        tasks.extend(started)
        await consumers_running(consumers)
        return engine

    yield start
    stop.set()
    await asyncio.gather(*tasks)
    for cache in caches:
        await cache.aclose()
