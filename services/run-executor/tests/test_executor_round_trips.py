"""What one run costs the executor in bus requests (issue 6: resuming >= 1,000 runs/s wants few round trips).

Every JetStream request the engine makes (KV reads and writes, event publishes, timer arms) is counted on the
client, for one run parked on ``ask_human`` and then resumed by its answer to the end. A change that adds a
read back, splits a compare-and-set in two or awaits a timer alone shows here as a higher count. These are
requests, the concurrent ones included. The sequential round trips (the waits one after the other: a request
sent while none of the engine's is in flight starts one; the events and timers the engine fires without
waiting begin none, and the handler's wait for them, ``Engine._settle``, counts as one whether or not their
acknowledgements are back by then -- 3 to park, 3 to resume -- so the count does not hang on timing, and a read
sent between a fire and its settle is a wait of its own) are counted too: 12 to park, 9 to resume (8 until the
end's event was marked published on the record, 6 December; 14 to park and 22 requests until, 6 December, a new
run's record was created running with its lease -- no compare-and-set before ``run.started`` -- and a turn
boundary stopped re-arming the watchdog its handler armed a moment before). (Until
2026-12-05, late, the fired writes stayed in flight until the settle, so a read sent meanwhile counted as no
wait (9 to park, 7 to resume), and before that the test's own publish of the run's request, acknowledged or
not when the engine sent its first request, decided whether that one began a wait. Counted only until their acknowledgements came back, as until
2026-12-05, the fired writes made the park's count depend on how soon those came: 12, or 13 once the
pipeline's replies were read straight off the parser, for the same requests in the same order. Under that
count: 18 and 10 before the events and timers were sent without waiting for each acknowledgement, and before the resume took
its lease in the move to ``resuming``; 9 before the answer went into the checkpoint alongside ``run.resumed``
and the record's moves to ``resuming`` and ``running`` became one compare-and-set; 14 to park before a pending
run's first checkpoint went out with ``run.created`` and the watchdog, 13 before a run's first message stopped
reading the record and checkpoint it almost never has: each one wait fewer before ``run.started``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import nats.aio.client
import pytest
from executor_support import RunExecutor, run_requested

from temporality_bus import Bus, Pipeline
from temporality_bus.pipeline import Write
from temporality_protocol import HumanAnswered, HumanRequested, OptionAnswer, make_event
from temporality_protocol.catalog import BUCKET_RUNS
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.engine import Engine
from temporality_run_executor.providers.script import Script
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog

#: Starting the run (record created running and leased without a read first, marker, then run.created, the
#: watchdog, run.started and the first checkpoint together), its two turns (get_input, ask_human) and the park.
#: (+1 per turn since AP-9: each provider reply's ``run.streamed`` metrics, sent with the turn's other events,
#: never a wait of its own: the sequential counts below did not change.)
PARK_REQUESTS = 17
#: The resume (the outcome applied), the last turn and the end (retention armed): the record and checkpoint
#: read; the checkpoint written with run.resumed and the watchdog; the record (running); run.streamed; the record
#: (completed: a compare-and-set at the revision the handler holds since the move to running, which is the read
#: after the final reply that until 7 December was a request and a wait of its own: 13 and 9); run.completed, the watchdog off and the retention (the
#: end's event after its record since 6 December: the same requests and waits); the record (its event marked
#: published, once acknowledged: since 6 December, +1 request and +1 wait -- the record is the terminal event's
#: outbox, and a republish past the events stream's duplicate window would be stored twice. The wait comes after
#: run.completed and the watchdog's disarm are acknowledged: it delays the handler's ack, not the event).
RESUME_REQUESTS = 10
#: The same, as waits one after the other (requests in flight together count once).
PARK_SEQUENTIAL = 12
#: The handler waiting for the writes it fired (``Engine._settle``), among the counted requests.
SETTLE = "<settle: the fired writes' acknowledgements>"
#: The test's own publishes (the run's request, the answer): never the engine's.
OWN = frozenset({"temporality.events.run.requested", "temporality.events.human.answered"})
RESUME_SEQUENTIAL = 8


class Requests:
    """The subjects of the client's requests and pipelined writes (:class:`Pipeline`) while ``counting``, each
    with whether it began a wait of its own (no other request or batch of this client was in flight when it was
    sent; the writes of one batch after its first never do)."""

    def __init__(self) -> None:
        self.subjects: list[tuple[str, bool]] = []
        self.inflight = 0
        self.counting = False
        #: The tasks of the writes the engine fired (``Engine._fire``), until the handler waits for them.
        self.fired: set[asyncio.Task[Any]] = set()

    async def until(self, *subjects: str, timeout_s: float = 30) -> list[tuple[str, bool]]:
        """Wait (bounded) until ``subjects`` were requested in this order; what was counted, then reset."""

        def seen() -> bool:
            rest = iter(s for s, _ in self.subjects)
            return all(any(s == wanted for s in rest) for wanted in subjects)

        async with asyncio.timeout(timeout_s):
            while not seen():  # noqa: ASYNC110 - polling a list this process fills
                await asyncio.sleep(0.01)
        counted, self.subjects, self.counting = self.subjects, [], False
        return counted


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Requests:
    seen = Requests()
    original = nats.aio.client.Client.request

    async def request(self: nats.aio.client.Client, subject: str, *args: Any, **kwargs: Any) -> Any:
        if subject in OWN:  # the test's own: neither counted nor in flight for the engine's
            return await original(self, subject, *args, **kwargs)
        if seen.counting:
            seen.subjects.append((subject, seen.inflight == 0))
        seen.inflight += 1
        try:
            return await original(self, subject, *args, **kwargs)
        finally:
            seen.inflight -= 1

    async def round_(self: Pipeline, writes: Sequence[Write], *args: Any, **kwargs: Any) -> Any:
        if all(w.subject in OWN for w in writes):  # the test's own publish: its acknowledgement, whether back
            # before the engine's first request or not, must not decide whether that request begins a wait
            return await original_round(self, writes, *args, **kwargs)
        fired = asyncio.current_task() in seen.fired
        if seen.counting:  # one batch of writes: one round trip, which begins a wait when none is in flight
            seen.subjects.extend((w.subject, not fired and seen.inflight == 0 and i == 0) for i, w in enumerate(writes))
        if asyncio.current_task() in seen.fired:  # nobody waits for it here: the handler's settle does (below)
            return await original_round(self, writes, *args, **kwargs)
        seen.inflight += 1
        try:
            return await original_round(self, writes, *args, **kwargs)
        finally:
            seen.inflight -= 1

    # The writes the engine fires without waiting (events, timers: ``Engine._fire``) begin no wait and are in
    # flight for nobody: the handler waits for them once, at ``Engine._settle``, counted as one wait (SETTLE)
    # whether or not their acknowledgements happen to be back by then; a read sent meanwhile is a wait of its own.
    async def send_(self: Engine, writes: Sequence[Any]) -> None:
        task = asyncio.current_task()
        fired = task is not None and getattr(task.get_coro(), "cr_code", None) is send_.__code__
        if fired:
            assert task is not None
            seen.fired.add(task)
        await original_send(self, writes)

    async def settle_(self: Engine, view: Any) -> None:
        tasks = {task for task, _ in view.unacked}
        if tasks and seen.counting:
            seen.subjects.append((SETTLE, seen.inflight == 0))
        seen.inflight += bool(tasks)
        try:
            await original_settle(self, view)
        finally:
            seen.inflight -= bool(tasks)
            seen.fired -= tasks

    original_round, original_send, original_settle = Pipeline._round, Engine._send, Engine._settle
    monkeypatch.setattr(nats.aio.client.Client, "request", request)
    monkeypatch.setattr(Pipeline, "_round", round_)
    monkeypatch.setattr(Engine, "_send", send_)
    monkeypatch.setattr(Engine, "_settle", settle_)
    return seen


async def test_a_parked_and_resumed_run_costs_a_bounded_number_of_requests(
    bus: Bus, event_log: EventLog, executor: RunExecutor, requests: Requests
) -> None:
    await executor()
    event = run_requested()
    run_id = event.runid
    assert run_id
    record = f"$KV.{BUCKET_RUNS.name}.{run_id}"
    requests.counting = True
    await bus.publish(event)  # the test's own request: left out below
    # the park ends with the move to waiting_for_human, after the question
    park_waits = _executor(await requests.until("temporality.events.human.requested", record))
    park = [(s, began) for s, began in park_waits if s != SETTLE]
    (asked,) = await event_log.wait_for("human.requested", run_id=run_id)
    request = asked.payload(HumanRequested)
    answer = HumanAnswered(
        request_id=request.request_id,
        run_id=run_id,
        recipient=request.recipient,
        responder=request.recipient,
        answer=OptionAnswer(option_id=request.options[0].id),
        channel="web",
        waited_s=1.0,
    )
    requests.counting = True
    await bus.publish(make_event(answer, source="/test", id=f"evt-ans-{run_id}", run_id=run_id))
    # the end: the move to completed, then run.completed, the watchdog off and the retention armed, then the
    # record's mark that the event went out
    resume_waits = _executor(
        await requests.until(
            record, "temporality.events.run.completed", f"temporality.timers.schedule.run-retention.{run_id}", record
        )
    )
    resume = [(s, began) for s, began in resume_waits if s != SETTLE]
    await event_log.wait_for("run.completed", run_id=run_id)
    assert len(park) <= PARK_REQUESTS, park
    assert len(resume) <= RESUME_REQUESTS, resume
    assert [s for s, _ in park].count("temporality.events.human.requested") == 1
    assert _waits(park_waits) <= PARK_SEQUENTIAL, park_waits
    assert _waits(resume_waits) <= RESUME_SEQUENTIAL, resume_waits


def _executor(subjects: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """The engine's requests: without the test's own publishes (the run's request and the answer)."""
    return [(s, began) for s, began in subjects if s not in OWN]


def _waits(requests: list[tuple[str, bool]]) -> int:
    """The sequential round trips among ``requests``: those that began a wait of their own."""
    return sum(began for _, began in requests)


#: A run of two turns, the first a ``notify`` (a side effect before the turn's checkpoint: its reply is kept on the
#: run record first, since 6 December late), the second the answer, to its end. Keeping the reply is the
#: compare-and-set that replaces the record's read after the provider call: the same requests and waits as the code
#: before it (2ec1b7a, this test run there twice: 20 and 13 each time, the same subjects in the same order but that
#: one read, ``DIRECT.GET`` of the record, which is now its write).
NOTIFY_REQUESTS = 20
NOTIFY_SEQUENTIAL = 13
NOTIFIER = AgentCard(
    id="notifier",
    role="Notifier",
    system_prompt="You tell alice.",
    tools=ToolPolicy(allow=["notify"]),
    provider=ProviderConfig(
        kind="scripted",
        script=Script.model_validate(
            {
                "steps": [
                    {"id": "tell", "call": {"tool": "notify", "args": {"recipient": "user:alice", "message": "hi"}}},
                    {"id": "done", "answer": "told"},
                ]
            }
        ),
    ),
)


async def test_a_turn_with_a_side_effect_keeps_its_reply_at_no_extra_round_trip(
    bus: Bus, event_log: EventLog, executor: RunExecutor, requests: Requests
) -> None:
    await executor(cards=[NOTIFIER])
    event = run_requested(agent=NOTIFIER.id)
    run_id = event.runid
    assert run_id
    record = f"$KV.{BUCKET_RUNS.name}.{run_id}"
    requests.counting = True
    await bus.publish(event)
    waits = _executor(
        await requests.until(
            "temporality.events.human.notify_requested",
            "temporality.events.run.completed",
            f"temporality.timers.schedule.run-retention.{run_id}",
            record,
        )
    )
    await event_log.wait_for("run.completed", run_id=run_id)
    counted = [(s, began) for s, began in waits if s != SETTLE]
    assert [s for s, _ in counted].count("temporality.events.human.notify_requested") == 1
    assert len(counted) <= NOTIFY_REQUESTS, counted
    assert _waits(waits) <= NOTIFY_SEQUENTIAL, waits
