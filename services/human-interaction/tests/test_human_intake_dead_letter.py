"""An intake the consumer gives up on (``human.requested`` dead-lettered) never leaves the run that asked waiting
forever, nor a stored question that nothing lists (:meth:`RequestHandler.on_dead_letter`), and an answer that comes
between a record and its run entry leaves that entry marked ended.

The failures are provoked on a real nats-server at the exact step, deterministically: the bucket the step writes
refuses every write (its stream's ``max_msg_size`` lowered: ``message size exceeds maximum allowed``) while the
other bucket takes them, under the real consumer runner with a short delivery limit; the bucket is given back once
the hook has failed at least once (the runner retries the dead-lettering, hook included, until it succeeds).
Without the hook the same run leaves the record pending with no run entry, no deadline and nothing published, and
neither a start nor a sweep finds it (what this commit fixes)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import cast

import httpx
import pytest
from human_support import (
    ALICE,
    CrashingBus,
    PublishCrash,
    events_of,
    exactly,
    inbox_ids,
    requested,
    running,
    stored,
    timer_messages,
)

from temporality_bus import Bus, Consumer, Delivery
from temporality_human_interaction import requests as requests_module
from temporality_human_interaction.answers import AnswerSubmission, bind_answer_outcome
from temporality_human_interaction.channels import ChannelAdapter
from temporality_human_interaction.channels.refs import ChannelRefs, ref_key
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.inbox import RUN_ENTRIES_KEY, rebuild_index
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import RunEndHandler
from temporality_protocol import (
    Envelope,
    HumanExpired,
    HumanNotified,
    HumanRejected,
    HumanRequestState,
    ProtocolError,
    RunCompleted,
    make_event,
)
from temporality_protocol.catalog import (
    BUCKET_HUMAN_CHANNELS,
    BUCKET_HUMAN_REQUESTS,
    CONSUMERS,
    TIMER_SCHEDULE_HUMAN,
)

#: Few deliveries, short backoff: an intake whose bucket refuses is given up within a second.
MAX_DELIVER = 3


async def _refuse_writes(bus: Bus, bucket: str, refuse: bool) -> None:
    """``bucket``'s stream refuses every write (``max_msg_size`` below any entry) or takes them again."""
    info = await bus.js.stream_info(f"KV_{bucket}")
    config = info.config
    config.max_msg_size = 16 if refuse else -1
    await bus.js.update_stream(config)


async def _until(condition: Callable[[], bool], what: str, within_s: float = 30.0) -> None:
    """Wait (bounded) until ``condition`` holds: the consumer's handlings are polled, not signalled."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        assert loop.time() < deadline, f"waited {within_s}s: {what}"
        await asyncio.sleep(0.02)


@dataclass
class Intake:
    """The intake under the real consumer runner with its dead-letter hook (``MAX_DELIVER`` deliveries)."""

    bus: Bus
    handler: RequestHandler
    #: The delivery number of every handling the runner ran, and whether it failed.
    handled: list[tuple[int, bool]] = field(default_factory=list)
    #: Every call of the dead-letter hook: whether it failed.
    hooked: list[bool] = field(default_factory=list)

    def handle(self) -> Callable[[Envelope, Delivery], Awaitable[None]]:
        async def handle(event: Envelope, delivery: Delivery) -> None:
            try:
                await self.handler.handle(event, delivery)
            except Exception:
                self.handled.append((delivery.num_delivered, True))
                raise
            self.handled.append((delivery.num_delivered, False))

        return handle

    async def on_dead_letter(self, message: Envelope | bytes, delivery: Delivery, error: BaseException) -> None:
        try:
            await self.handler.on_dead_letter(message, delivery, error)
        except Exception:
            self.hooked.append(True)
            raise
        self.hooked.append(False)

    async def given_up_while(self, bucket: str, event: Envelope) -> None:
        """Publish ``event`` while ``bucket`` refuses writes; give the bucket back once every delivery failed and
        the hook failed at least once; then wait until the message is dead-lettered."""
        await _refuse_writes(self.bus, bucket, True)
        try:
            await self.bus.publish(event)
            await _until(lambda: len(self.handled) >= MAX_DELIVER, "every delivery handled")
            await _until(lambda: True in self.hooked, "the hook failed while the bucket refused")
        finally:
            await _refuse_writes(self.bus, bucket, False)
        [dead] = await exactly(self.bus, "bus.dead_lettered")
        assert dead.data["original_id"] == event.id
        assert [n for n, _ in self.handled] == list(range(1, MAX_DELIVER + 1))
        assert all(failed for _, failed in self.handled)
        assert self.hooked[-1] is False  # it ran once more, and succeeded, once the bucket took writes


@pytest.fixture
async def intake(bus: Bus, handler: RequestHandler) -> AsyncIterator[Intake]:
    await ChannelRefs(bus).claim(RUN_ENTRIES_KEY, "2026-12-06")  # a start found every request indexed long ago
    got = Intake(bus, handler)
    spec = dataclasses.replace(CONSUMERS["human-interaction-requests"], max_deliver=MAX_DELIVER, backoff_s=(0.05, 0.1))
    consumer = Consumer(bus, spec, handler=got.handle(), on_dead_letter=got.on_dead_letter, fetch_timeout_s=0.2)
    async with running(consumer):
        yield got


def _ids(event: Envelope) -> tuple[str, str]:
    return str(event.data["request_id"]), str(event.data["run_id"])


async def _answer(bus: Bus, request_id: str) -> None:
    """Alice answers ``request_id`` by its id (the inbox API's binding)."""
    submission = AnswerSubmission(option_id="keep-v1")
    await bind_answer_outcome(bus, request_id=request_id, responder="user:alice", submission=submission, channel="web")


def _run_completed(run_id: str) -> Envelope:
    return make_event(
        RunCompleted(run_id=run_id, result="done", turns=2), source="/temporality/run-executor", run_id=run_id
    )


async def test_an_intake_given_up_between_its_record_and_its_run_entry_is_listed_and_cancelled_with_its_run(
    bus: Bus, intake: Intake, client: httpx.AsyncClient
) -> None:
    event = requested()
    request_id, run_id = _ids(event)
    await intake.given_up_while(BUCKET_HUMAN_CHANNELS.name, event)  # the record stored, its run entry refused

    record = await stored(bus, request_id)
    assert record is not None
    assert (record.status, record.channel, record.intake_failed) == (HumanRequestState.PENDING, "web", None)
    entry = await ChannelRefs(bus).get_ref(ref_key("run", run_id, request_id))
    assert entry is not None
    assert (entry.answerers, entry.expires_at, entry.ended_at) == (["user:alice"], record.expires_at, None)
    assert await timer_messages(bus, f"{TIMER_SCHEDULE_HUMAN}.{request_id}") == 1  # it expires with its policy
    [notified] = await exactly(bus, "human.notified")  # delivered by its stored record: announced
    assert notified.payload(HumanNotified).request_id == request_id
    assert await events_of(bus, "human.rejected") == []
    assert request_id in await inbox_ids(client, ALICE)  # listed

    await RunEndHandler(bus).handle(_run_completed(run_id))  # the run's end finds it through its run entry
    ended = await stored(bus, request_id)
    assert ended is not None
    assert ended.status is HumanRequestState.CANCELLED
    assert request_id not in await inbox_ids(client, ALICE)


async def test_an_intake_given_up_before_its_deadline_was_armed_still_expires(
    bus: Bus, intake: Intake, deadline_consumer: None
) -> None:
    event = requested(expires_in_s=1)
    request_id, run_id = _ids(event)
    await intake.given_up_while(BUCKET_HUMAN_CHANNELS.name, event)
    [expired] = await exactly(bus, "human.expired")  # the run that asked resumes, with its timeout policy
    assert (expired.payload(HumanExpired).request_id, expired.runid) == (request_id, run_id)
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.EXPIRED
    entry = await ChannelRefs(bus).get_ref(ref_key("run", run_id, request_id))
    assert entry is not None
    assert entry.ended == "expired"


async def test_an_intake_given_up_before_its_record_rejects_the_run_and_a_late_copy_asks_nobody(
    bus: Bus, intake: Intake, handler: RequestHandler, client: httpx.AsyncClient
) -> None:
    event = requested()
    request_id, run_id = _ids(event)
    await intake.given_up_while(BUCKET_HUMAN_REQUESTS.name, event)  # the record's create refused

    [rejected] = await exactly(bus, "human.rejected")
    data = rejected.payload(HumanRejected)
    assert (data.request_id, data.run_id, data.recipient, data.reason) == (
        request_id,
        run_id,
        "user:alice",
        "intake_failed",
    )
    # (the hook that succeeds is a retry past the limit: the first error is in the log, request.dead_lettered)
    assert data.detail.startswith("human-interaction could not take the request in (given up after ")
    assert (rejected.runid, rejected.causationid) == (run_id, event.id)
    stand_in = await stored(bus, request_id)  # stored in its place: cancelled, asking nobody, none of the question
    assert stand_in is not None
    assert stand_in.status is HumanRequestState.CANCELLED
    assert stand_in.intake_failed is not None
    assert stand_in.intake_failed in data.detail
    assert (stand_in.question, stand_in.title, stand_in.options, stand_in.channel) == ("", "", [], None)
    entry = await ChannelRefs(bus).get_ref(ref_key("run", run_id, request_id))
    assert entry is not None
    assert entry.ended == "cancelled"  # listed by no inbox, purged after the retention
    assert await timer_messages(bus, f"{TIMER_SCHEDULE_HUMAN}.{request_id}") == 0

    # the same event again, later (published again after the duplicate window): the question is asked of nobody
    await handler.handle(event)
    await handler.on_dead_letter(event, _Delivered(MAX_DELIVER + 1), RuntimeError("again"))  # type: ignore[arg-type]
    assert await stored(bus, request_id) == stand_in
    await exactly(bus, "human.rejected", settle_s=0.3)  # the hook again: the same event id, deduplicated
    assert await events_of(bus, "human.notified") == []
    assert request_id not in await inbox_ids(client, ALICE)
    shown = await client.get(f"/requests/{request_id}", headers=ALICE)
    assert (shown.status_code, shown.json()["status"]) == (200, "cancelled")


async def test_an_id_another_run_uses_is_refused_and_that_run_s_request_left_alone(
    bus: Bus, intake: Intake, handler: RequestHandler
) -> None:
    first = requested()
    request_id, owner = _ids(first)
    await handler.handle(first)
    taken = requested(request_id=request_id)  # another run, the same id: a permanent error, dead-lettered at once
    await bus.publish(taken)
    [rejected] = await exactly(bus, "human.rejected")
    data = rejected.payload(HumanRejected)
    assert (data.run_id, data.reason) == (taken.data["run_id"], "invalid_request")
    assert f"already used by run {owner}" in data.detail
    [dead] = await exactly(bus, "bus.dead_lettered")
    assert dead.data["original_id"] == taken.id
    record = await stored(bus, request_id)
    assert record is not None
    assert (record.run_id, record.status) == (owner, HumanRequestState.PENDING)


async def test_an_answer_between_the_record_and_its_run_entry_leaves_the_entry_marked(
    bus: Bus, handler: RequestHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    event = requested()
    request_id, run_id = _ids(event)
    real = requests_module.index_new_request

    async def answered_first(*args: object, **kwargs: object) -> int | None:
        await _answer(bus, request_id)  # the answer by id, after the record's create and before its run entry
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(requests_module, "index_new_request", answered_first)
    await handler.handle(event)
    entry = await ChannelRefs(bus).get_ref(ref_key("run", run_id, request_id))
    assert entry is not None
    assert (entry.ended, entry.answerers) == ("answered", ["user:alice"])  # not counted waiting, listed nowhere
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.ANSWERED
    await exactly(bus, "human.answered")


async def test_an_answer_while_the_run_entry_is_refused_leaves_the_entry_marked_on_redelivery(
    bus: Bus, handler: RequestHandler
) -> None:
    event = requested()
    request_id, run_id = _ids(event)
    await _refuse_writes(bus, BUCKET_HUMAN_CHANNELS.name, True)
    try:
        with pytest.raises(Exception, match="message size exceeds maximum allowed"):
            await handler.handle(event)  # stored; its run entry refused
    finally:
        await _refuse_writes(bus, BUCKET_HUMAN_CHANNELS.name, False)
    await _answer(bus, request_id)
    await handler.handle(event)  # the redelivery: answered already, not indexed again
    entry = await ChannelRefs(bus).get_ref(ref_key("run", run_id, request_id))
    assert entry is not None
    assert entry.ended == "answered"
    assert (await rebuild_index(bus)).read == 0  # nothing a start must read for it


@dataclass
class _Delivered:
    """What the hook reads of a :class:`Delivery`: its number."""

    num_delivered: int


async def test_a_request_that_does_not_read_is_refused_to_the_run_it_names(bus: Bus, handler: RequestHandler) -> None:
    good = requested()
    request_id, run_id = _ids(good)
    unreadable = good.model_copy(update={"data": {**good.data, "options": "not a list"}})
    with pytest.raises(ProtocolError):
        await handler.handle(unreadable)  # the runner dead-letters it at once
    await handler.on_dead_letter(unreadable, _Delivered(1), ProtocolError("unreadable"))  # type: ignore[arg-type]
    [rejected] = await exactly(bus, "human.rejected")
    data = rejected.payload(HumanRejected)
    assert (data.request_id, data.run_id, data.reason) == (request_id, run_id, "invalid_request")
    assert data.detail.startswith("the request does not read (given up after 1 deliveries: ProtocolError")
    assert await stored(bus, request_id) is None  # nothing stored: any delivery of it is refused the same way


async def test_a_hook_killed_between_its_stand_in_and_the_rejection_rejects_once_when_run_again(
    bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter]
) -> None:
    event = requested()
    request_id, run_id = _ids(event)
    crashing = CrashingBus(bus, HumanRejected.EVENT_TYPE)
    dying = RequestHandler(cast(Bus, crashing), directory, adapters)
    with pytest.raises(PublishCrash):  # the process dies as it publishes: the stand-in is stored, nobody told
        await dying.on_dead_letter(event, _Delivered(MAX_DELIVER), RuntimeError("refused"))  # type: ignore[arg-type]
    stand_in = await stored(bus, request_id)
    assert stand_in is not None
    assert stand_in.status is HumanRequestState.CANCELLED
    await exactly(bus, "human.rejected", 0, settle_s=0.2)
    # the runner's next delivery, past the limit, runs the hook again (another replica): the run is told, once
    again = RequestHandler(bus, directory, adapters)
    await again.on_dead_letter(event, _Delivered(MAX_DELIVER + 1), RuntimeError("deliveries exhausted"))  # type: ignore[arg-type]
    await again.on_dead_letter(event, _Delivered(MAX_DELIVER + 2), RuntimeError("deliveries exhausted"))  # type: ignore[arg-type]
    [rejected] = await exactly(bus, "human.rejected")
    assert rejected.payload(HumanRejected).reason == "intake_failed"
    assert await stored(bus, request_id) == stand_in  # the first intake_failed kept
    entry = await ChannelRefs(bus).get_ref(ref_key("run", run_id, request_id))
    assert entry is not None
    assert entry.ended == "cancelled"
