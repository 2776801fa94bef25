"""A pipelined round whose timer write fails while the rest of it is stored (a review of the round trips,
2026-12-06).

The intake sends a web inbox question's deadline, the chain's next step and ``human.notified`` in one round; an
answer its repair timer and ``human.answered``. Each write of a round is stored or not on its own, so an event can
be stored while a timer is not: what that leaves, what the log says, and what repairs it
(docs/human-interaction.md, *Round trips on the loop's path*). :class:`~human_support.TimerLosingBus` fails only
the timers' writes; everything else is the real bus on a real nats-server.
"""

from __future__ import annotations

from typing import Any, cast

import httpx
import pytest
import structlog
from human_support import ALICE, CrashingBus, TimerLosingBus, exactly, requested, stored, timer_messages

from temporality_bus import Bus, TransientError
from temporality_human_interaction.api import create_app
from temporality_human_interaction.channels import ChannelAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.settings import Settings
from temporality_protocol import HumanAnswered, HumanNotified, TimeoutPolicy
from temporality_protocol.catalog import EVENTS_STREAM, TIMER_SCHEDULE_HUMAN
from temporality_protocol.events import Renotify


def _logged(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == event]


@pytest.mark.parametrize("chain", [False, True], ids=["deadline", "deadline-and-chain-step"])
async def test_a_lost_intake_timer_fails_the_handler_after_human_notified_and_the_redelivery_arms_it(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter], chain: bool
) -> None:
    """The deadline's (and the chain step's) write fails, ``human.notified`` is stored: the handler fails, the log
    names the timers the announced question lacks, and the redelivery arms them under the same msg ids while the
    event it sends again is deduplicated (one ``human.notified``)."""
    losing = TimerLosingBus(bus)
    event = requested(
        recipient="user:alice", on_timeout=TimeoutPolicy(renotify=Renotify(every_s=600, max=1)) if chain else None
    )
    request_id = str(event.data["request_id"])
    deadline, step = f"{TIMER_SCHEDULE_HUMAN}.{request_id}", f"{TIMER_SCHEDULE_HUMAN}.{request_id}.chain"
    timers, kinds = ([deadline, step], ["deadline", "chain"]) if chain else ([deadline], ["deadline"])

    with structlog.testing.capture_logs() as logs, pytest.raises(TransientError, match="lost on the way"):
        await RequestHandler(cast(Bus, losing), directory, adapters).handle(event)
    assert losing.lost == timers
    [notified] = await exactly(bus, "human.notified")  # stored although its timers are not
    assert notified.payload(HumanNotified).request_id == request_id
    for subject in timers:
        assert await timer_messages(bus, subject) == 0
    assert [(e["write"], e["log_level"]) for e in _logged(logs, "request.write_failed")] == [
        (kind, "warning") for kind in kinds
    ]
    [told] = _logged(logs, "request.notified")
    assert told["timers_failed"] == kinds

    with structlog.testing.capture_logs() as logs:
        await RequestHandler(bus, directory, adapters).handle(event)  # the redelivery, on a bus that loses nothing
    [again] = await exactly(bus, "human.notified")
    assert again.id == notified.id
    for subject in timers:
        assert await timer_messages(bus, subject) == 1
    assert _logged(logs, "request.write_failed") == []
    [told] = _logged(logs, "request.notified")
    assert told["timers_failed"] == []


async def test_a_lost_repair_timer_leaves_the_answer_announced_and_marked(
    bus: Bus, directory: Directory, handler: RequestHandler
) -> None:
    """The answer's repair timer fails in the round that stores ``human.answered``: the POST succeeds, the event is
    stored once and the record marked published, with no repair timer -- logged as ``answer.repair_timer_failed``."""
    event = requested(recipient="user:alice")
    request_id = str(event.data["request_id"])
    await handler.handle(event)
    losing = TimerLosingBus(bus)
    app = create_app(Settings(bus_timeout_s=2.0), cast(Bus, losing), directory)

    with structlog.testing.capture_logs() as logs:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://human.test") as client:
            answered = await client.post(f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
    assert answered.status_code == 200, answered.text
    repair = f"{TIMER_SCHEDULE_HUMAN}.{request_id}.repair"
    assert losing.lost == [repair]
    [published] = await exactly(bus, "human.answered")
    assert published.payload(HumanAnswered).request_id == request_id
    record = await stored(bus, request_id)
    assert record is not None
    assert record.answer_published
    assert await timer_messages(bus, repair) == 0
    [failed] = _logged(logs, "answer.repair_timer_failed")
    assert failed["log_level"] == "warning"
    assert "lost on the way" in failed["error"]
    assert _logged(logs, "answer.repair_timer_armed") == []
    assert len(_logged(logs, "request.answered")) == 1


async def test_the_crashing_bus_pipeline_passes_what_it_does_not_crash_through(bus: Bus) -> None:
    """``CrashingBus.pipeline`` is the real pipeline but for ``send``: ``request`` (a Store's read) works through it."""
    crashing = CrashingBus(bus, HumanNotified.EVENT_TYPE)
    reply = await crashing.pipeline.request(f"$JS.API.STREAM.INFO.{EVENTS_STREAM.name}", b"", timeout_s=5)
    assert EVENTS_STREAM.name in reply.data.decode()
