"""HUM-7: a run withdraws the questions it no longer needs (``human.cancel_requested``: several asked with
``wait_for: first``, another answered first). Each is cancelled like at the run's end -- out of the inbox,
a late answer refused -- only if it is that run's; one withdrawn before it was stored is cancelled at intake."""

from __future__ import annotations

import dataclasses
from typing import cast

import httpx
import pytest
from human_support import (
    ALICE,
    CrashingBus,
    PublishCrash,
    delivered_then_withdrawn,
    events_of,
    exactly,
    requested,
    running,
    stored,
)

from temporality_bus import Bus, Consumer, Delivery, evolve
from temporality_human_interaction.channels import ChannelAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.records import open_store
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import RunEndHandler
from temporality_protocol import (
    Envelope,
    HumanCancelRequested,
    HumanRequestState,
    HumanWithdrawn,
    RunCompleted,
    RunFailed,
    make_event,
)
from temporality_protocol.catalog import CONSUMERS


def _withdrawal(run_id: str, *request_ids: str) -> Envelope:
    data = HumanCancelRequested(run_id=run_id, request_ids=list(request_ids), answered="hreq-answered")
    return make_event(data, source="/temporality/run-executor", run_id=run_id)


async def test_a_withdrawn_request_is_cancelled_and_its_late_answer_refused(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    asked = requested()
    request_id, run_id = str(asked.data["request_id"]), str(asked.data["run_id"])
    await handler.handle(asked)
    assert [r["id"] for r in (await client.get("/inbox", headers=ALICE)).json()["requests"]] == [request_id]

    withdrawal = _withdrawal(run_id, request_id)
    await RunEndHandler(bus).handle(withdrawal)
    await RunEndHandler(bus).handle(withdrawal)  # a redelivery: no change
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.CANCELLED
    assert (await client.get("/inbox", headers=ALICE)).json()["requests"] == []
    late = await client.post(f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
    assert late.status_code == 409
    assert await events_of(bus, "human.answered") == []
    [withdrawn] = await exactly(bus, "human.withdrawn")  # one, through the redelivery
    payload = withdrawn.payload(HumanWithdrawn)
    assert (payload.request_id, payload.run_id, payload.recipient, payload.channel) == (
        request_id,
        run_id,
        "user:alice",
        "web",
    )
    assert (payload.reason, payload.run_reason) == ("not_needed", None)
    assert payload.asked_at == record.created_at
    assert payload.withdrawn_at == record.ended_at
    assert payload.waited_s == record.waited_s(payload.withdrawn_at)
    assert withdrawn.causationid == record.requested_event_id


async def test_a_run_cannot_withdraw_another_run_s_request(bus: Bus, handler: RequestHandler) -> None:
    theirs = requested()
    request_id = str(theirs.data["request_id"])
    await handler.handle(theirs)
    await RunEndHandler(bus).handle(_withdrawal("run-someone-else", request_id))
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.PENDING
    assert await events_of(bus, "human.withdrawn", settle_s=0.5) == []


async def test_a_request_withdrawn_before_it_was_stored_is_cancelled_at_intake(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    """Its web inbox delivery is stored with the record, so the inbox listed it from the create: it is announced
    (``human.notified``) and alice sees it withdrawn, whichever cancel won."""
    asked = requested()
    request_id, run_id = str(asked.data["request_id"]), str(asked.data["run_id"])
    await RunEndHandler(bus).handle(_withdrawal(run_id, request_id))
    await handler.handle(asked)  # human.requested consumed after the withdrawal
    await delivered_then_withdrawn(bus, client, request_id, reason="not_needed")


async def test_a_run_that_fails_with_a_question_open_withdraws_it_with_one_event(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    """OBS-1: the run's end cancels the question and says so with one ``human.withdrawn`` (``run_failed``, the run's
    own reason): a redelivered end publishes nothing more, and an end handled again after a crash between the
    publish and the record's mark publishes the same event (one id: JetStream keeps one)."""
    asked = requested()
    request_id, run_id = str(asked.data["request_id"]), str(asked.data["run_id"])
    await handler.handle(asked)
    end = make_event(RunFailed(run_id=run_id, reason="compute_timeout", error="30 min"), source="/t", run_id=run_id)
    await RunEndHandler(bus).handle(end)
    await RunEndHandler(bus).handle(end)  # a redelivery
    [withdrawn] = await exactly(bus, "human.withdrawn")
    payload = withdrawn.payload(HumanWithdrawn)
    assert (payload.request_id, payload.reason, payload.run_reason) == (request_id, "run_failed", "compute_timeout")
    store = await open_store(bus)
    await store.modify(request_id, lambda r: evolve(r, withdrawal_published=False))  # the crash before the mark
    await RunEndHandler(bus).handle(end)
    [again] = await exactly(bus, "human.withdrawn")
    assert again.id == withdrawn.id
    record = await stored(bus, request_id)
    assert record is not None
    assert record.withdrawal_published
    assert (record.withdrawn_because, record.withdrawn_run_reason) == ("run.failed", "compute_timeout")


def _run_completed(run_id: str) -> Envelope:
    return make_event(RunCompleted(run_id=run_id, result="done", turns=1), source="/t", run_id=run_id)


async def _cancelled_unannounced(bus: Bus, request_id: str) -> None:
    """The request is cancelled and nobody was told: no ``human.withdrawn``, the record not marked."""
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.CANCELLED
    assert not record.withdrawal_published
    assert await events_of(bus, "human.withdrawn", settle_s=0.2) == []


async def test_a_question_after_its_run_ended_whose_withdrawal_was_lost_is_announced_by_the_redelivery(
    bus: Bus, client: httpx.AsyncClient, directory: Directory, adapters: dict[str, ChannelAdapter]
) -> None:
    """The question arrives after its run ended: the intake cancels it and dies as it publishes ``human.withdrawn``
    (after the cancel's compare-and-set). JetStream redelivers the ``human.requested`` (the real consumer runner);
    that delivery finds the request no longer pending and still publishes the withdrawal, exactly once."""
    asked = requested()
    request_id, run_id = str(asked.data["request_id"]), str(asked.data["run_id"])
    await RunEndHandler(bus).handle(_run_completed(run_id))  # none of its questions stored yet: the marker only
    crashing = CrashingBus(bus, HumanWithdrawn.EVENT_TYPE)
    handled: list[bool] = []
    intake = RequestHandler(cast(Bus, crashing), directory, adapters)

    async def handle(event: Envelope, delivery: Delivery) -> None:
        try:
            await intake.handle(event, delivery)
        except PublishCrash:
            handled.append(False)
            await _cancelled_unannounced(bus, request_id)  # what the failed delivery left
            raise
        handled.append(True)

    spec = dataclasses.replace(CONSUMERS["human-interaction-requests"], backoff_s=(0.05, 0.1))
    async with running(Consumer(bus, spec, handler=handle, fetch_timeout_s=0.2)):
        await bus.publish(asked)
        [withdrawn] = await exactly(bus, "human.withdrawn")
    assert crashing.crashed
    assert handled == [False, True]  # the first delivery failed at the publish, the redelivery announced it
    payload = withdrawn.payload(HumanWithdrawn)
    assert (payload.request_id, payload.run_id, payload.reason, payload.run_reason) == (
        request_id,
        run_id,
        "run_completed",
        None,
    )
    record = await delivered_then_withdrawn(bus, client, request_id, reason="run_completed")
    assert record.withdrawn_because == "run.completed"
    await RequestHandler(bus, directory, adapters).handle(asked)  # yet another copy: marked, nothing more
    await exactly(bus, "human.withdrawn")


async def test_a_question_withdrawn_before_it_was_stored_is_announced_by_the_redelivery_after_a_crash(
    bus: Bus, client: httpx.AsyncClient, directory: Directory, adapters: dict[str, ChannelAdapter]
) -> None:
    """HUM-7: the run withdrew the question before its intake; the intake cancels it and dies at the publish. The
    redelivery announces it (``not_needed``), once however often it comes."""
    asked = requested()
    request_id, run_id = str(asked.data["request_id"]), str(asked.data["run_id"])
    await RunEndHandler(bus).handle(_withdrawal(run_id, request_id))
    with pytest.raises(PublishCrash):
        await RequestHandler(cast(Bus, CrashingBus(bus, HumanWithdrawn.EVENT_TYPE)), directory, adapters).handle(asked)
    await _cancelled_unannounced(bus, request_id)
    again = RequestHandler(bus, directory, adapters)
    await again.handle(asked)  # the redelivery
    await again.handle(asked)  # and another
    record = await delivered_then_withdrawn(bus, client, request_id, reason="not_needed")
    assert record.withdrawn_because == "not_needed"


@dataclasses.dataclass
class _Delivered:
    num_delivered: int


async def test_an_intake_given_up_after_its_cancel_lost_the_withdrawal_announces_it_from_the_hook(
    bus: Bus, client: httpx.AsyncClient, directory: Directory, adapters: dict[str, ChannelAdapter]
) -> None:
    """The intake cancels a question whose run ended and fails at the publish until the consumer gives the message
    up: the dead-letter hook finds the request cancelled, announces it once, and rejects nothing."""
    asked = requested()
    request_id, run_id = str(asked.data["request_id"]), str(asked.data["run_id"])
    await RunEndHandler(bus).handle(_run_completed(run_id))
    with pytest.raises(PublishCrash):
        await RequestHandler(cast(Bus, CrashingBus(bus, HumanWithdrawn.EVENT_TYPE)), directory, adapters).handle(asked)
    await _cancelled_unannounced(bus, request_id)
    hook = RequestHandler(bus, directory, adapters)
    await hook.on_dead_letter(asked, cast(Delivery, _Delivered(5)), RuntimeError("publish timed out"))
    await hook.on_dead_letter(asked, cast(Delivery, _Delivered(6)), RuntimeError("deliveries exhausted"))
    record = await delivered_then_withdrawn(bus, client, request_id, reason="run_completed")
    assert record.intake_failed is None
    assert await events_of(bus, "human.rejected") == []
