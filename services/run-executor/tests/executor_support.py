"""Helpers and the executor fixture factory for the run-executor tests."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from temporality_bus import Bus, Consumer
from temporality_protocol import (
    Envelope,
    HumanPolicy,
    LaunchSource,
    RunRequested,
    RunState,
    TimeoutPolicy,
    make_event,
    new_id,
)
from temporality_protocol.catalog import BUCKET_CHECKPOINTS, BUCKET_RUNS, CONSUMERS
from temporality_run_executor.agents import AgentCard, AgentDirectory, ProviderConfig
from temporality_run_executor.engine import Engine, ProviderFactory
from temporality_run_executor.providers.factory import ProviderCache
from temporality_run_executor.records import Checkpoint, RunRecord
from temporality_run_executor.tools import Tool, ToolRegistry
from temporality_run_executor.watchdog import DEFAULT_GRACE_S

REVIEWER = AgentCard(
    id="reviewer",
    role="Code reviewer",
    system_prompt="You review pull requests.",
    provider=ProviderConfig(kind="scripted", script="reviewer"),
)

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


def expires_in(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


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
    ) -> Engine:
        cache = ProviderCache(scripted_think_s=think_s)
        caches.append(cache)
        consumers: list[Consumer] = []
        engine = await Engine.open(
            bus,
            AgentDirectory(cards or [REVIEWER]),
            provider_for or cache,
            max_deliver=max_deliver,
            watchdog_grace_s=watchdog_grace_s,
            tools=tools,
            card_tools=card_tools,
            lease_s=lease_s,
        )
        for name, handler in (
            ("run-executor-requests", engine.on_run_requested),
            ("run-executor-human", engine.on_human_event),
            ("run-executor-agents", engine.on_agent_event),
        ):
            spec = dataclasses.replace(CONSUMERS[name], max_deliver=max_deliver, backoff_s=(0.05, 0.1))
            consumers.append(Consumer(bus, spec, handler=handler, max_inflight=4, on_dead_letter=engine.on_dead_letter))
        watchdog = dataclasses.replace(CONSUMERS["run-executor-watchdog"], backoff_s=(0.05, 0.1))
        consumers.append(Consumer(bus, watchdog, raw_handler=engine.on_watchdog, max_inflight=4))
        tasks.extend(asyncio.create_task(c.run(stop)) for c in consumers)
        await asyncio.wait_for(asyncio.gather(*(c.running.wait() for c in consumers)), 30)  # bound on the server
        return engine

    yield start
    stop.set()
    await asyncio.gather(*tasks)
    for cache in caches:
        await cache.aclose()
