"""A turn's lease keeper ends with the turn even when one cancellation of it is dropped (issue 6).

nats-py waits for each request's reply with ``asyncio.wait_for``, which before Python 3.12 drops a cancellation
that lands as the reply arrives: the keeper's renewal loop went on, and the handler that awaited its end after the
provider call hung there with the run's message in hand, renewing the lease forever. Over a real nats-server; the
keeper is replaced by one that drops its first cancellation, as that race does. (The keeper starts a third of the
lease into a call: the lease is short here, and the provider call held until the keeper runs.)"""

from __future__ import annotations

import asyncio

from executor_support import REVIEWER, HeldProvider, RunExecutor, run_record, run_requested, settled

from temporality_bus import Bus
from temporality_protocol import RunState
from temporality_run_executor.providers.factory import ProviderCache
from temporality_testing.events import EventLog


async def test_a_turn_ends_when_its_lease_keeper_drops_one_cancellation(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    cache = ProviderCache()
    held = HeldProvider(cache(REVIEWER))
    dropped: list[str] = []
    keeping = asyncio.Event()
    try:
        engine = await executor(provider_for=lambda card: held, lease_s=0.6)

        async def keeper_dropping_one_cancel(run_id: str, holder: str) -> None:
            keeping.set()
            while True:
                try:
                    await asyncio.sleep(0.05)  # a renewal's request, waiting for its reply
                except asyncio.CancelledError:
                    if dropped:
                        raise
                    dropped.append(run_id)  # "the reply arrived": the cancellation is gone, the loop goes on

        engine._keep_lease = keeper_dropping_one_cancel  # type: ignore[method-assign]
        event = run_requested()
        run_id = event.runid
        assert run_id
        await bus.publish(event)
        await asyncio.wait_for(held.entered.wait(), 30)
        await asyncio.wait_for(keeping.wait(), 30)  # the call outlived a third of the lease: its keeper runs
        held.release.set()
        await event_log.wait_for("run.started", run_id=run_id, timeout_s=30)
        await settled(bus, timeout_s=60)  # the handler let go of the message: the turn did not hang on its keeper
        record = await run_record(bus, run_id)
        assert record.state is not RunState.RUNNING
        assert dropped == [run_id]
    finally:
        held.release.set()
        await cache.aclose()
