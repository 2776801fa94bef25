"""A driver whose lease another handler took over while its turn ran parks nothing (issue 6): the park's
compare-and-set renews the parking handler's lease, for a hosted agent's ``ask_agent`` in wait mode as for an
external agent's turn. Over a real nats-server; the takeover is written into the record mid-turn, as a second
replica that found the lease run out would write it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from executor_support import HeldProvider, RunExecutor, run_record, run_requested, settled

from temporality_bus import Bus
from temporality_protocol import RunState
from temporality_protocol.catalog import BUCKET_RUNS
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.providers.factory import ProviderCache
from temporality_run_executor.providers.script import Script
from temporality_run_executor.records import Lease, RunRecord
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog

#: Asks agent:helper and waits for the answer (a hosted agent's park, ``waiting_for_agent``).
WAITER = AgentCard(
    id="waiter",
    role="waiter",
    system_prompt="You collaborate.",
    tools=ToolPolicy(allow=["*"]),
    provider=ProviderConfig(
        kind="scripted",
        script=Script.model_validate(
            {
                "steps": [
                    {
                        "id": "ask",
                        "call": {
                            "tool": "ask_agent",
                            "args": {"to": "agent:helper", "message": "Keep v1?", "mode": "wait"},
                        },
                    },
                    {"id": "done", "answer": "{{ results.ask.status }}"},
                ]
            }
        ),
    ),
)
OTHER = "other-replica/h-1"


async def _park_after_takeover(bus: Bus, event_log: EventLog, executor: RunExecutor, *, take_over: bool) -> RunRecord:
    """Run the waiter with its asking turn held; with ``take_over``, another handler's live lease is written into
    the record meanwhile. The record once the handler is done with the run's message."""
    cache = ProviderCache()
    held = HeldProvider(cache(WAITER))
    try:
        await executor(cards=[WAITER], provider_for=lambda card: held)
        event = run_requested(agent="waiter")
        run_id = event.runid
        assert run_id
        await bus.publish(event)
        try:
            await asyncio.wait_for(held.entered.wait(), 30)
            if take_over:
                runs = await bus.store(BUCKET_RUNS, RunRecord)
                lease = Lease(holder=OTHER, expires_at=datetime.now(UTC) + timedelta(seconds=120))
                await runs.modify(run_id, lambda r: r.model_copy(update={"lease": lease}))
        finally:
            held.release.set()  # never left hanging, whatever failed
        await event_log.wait_for("agent.asked", run_id=run_id, timeout_s=30)  # published before the park's move
        await settled(bus, timeout_s=60)  # the handler is done with the message (acked)
        return await run_record(bus, run_id)
    finally:
        await cache.aclose()


async def test_a_hosted_ask_agent_park_by_a_driver_that_lost_its_lease_parks_nothing(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    record = await _park_after_takeover(bus, event_log, executor, take_over=True)
    # the move to waiting_for_agent was refused: the run is the new holder's, still running, its lease kept
    assert record.state is RunState.RUNNING
    assert record.lease is not None
    assert record.lease.holder == OTHER


async def test_a_hosted_ask_agent_park_by_the_lease_holder_parks(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    record = await _park_after_takeover(bus, event_log, executor, take_over=False)
    assert record.state is RunState.WAITING_FOR_AGENT
    assert record.lease is None  # nobody drives a parked run
