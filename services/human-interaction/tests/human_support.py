"""Helpers for human-interaction tests: a ``human.requested`` builder and readers of the bus and KV."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.aio.subscription import Subscription
from pydantic import SecretStr

from temporality_bus import Bus, BusError, Consumer, NatsSettings, PublishResult, TransientError, written_out
from temporality_bus.pipeline import Write
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.channels.telegram import TelegramAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.egress import EgressPolicy
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.records import HumanRequestRecord, open_store
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.settings import Settings
from temporality_protocol import (
    Envelope,
    HumanNotified,
    HumanOption,
    HumanPolicy,
    HumanRequested,
    HumanRequestState,
    HumanWithdrawn,
    LaunchSource,
    RunRequested,
    TimeoutPolicy,
    decode,
    derive_id,
    make_event,
    new_id,
)
from temporality_protocol.catalog import (
    BUCKET_HUMAN_REQUESTS,
    EVENTS_STREAM,
    TIMER_SCHEDULE_HUMAN,
    TIMER_SCHEDULE_PREFIX,
    TIMERS_STREAMS,
    subject_for,
)
from temporality_protocol.events import HumanAskKind
from temporality_service import ApiAuthSettings, ApiToken, Role
from temporality_service.auth import dump_tokens
from temporality_testing.telegram_emulator import TelegramEmulator, TelegramUser
from temporality_testing.timers import armed_schedules

USERS_FILE = Path(__file__).resolve().parents[3] / "config" / "users.yaml"
ALICE = {"Authorization": "Bearer alice-demo-inbox-token-change-me"}
BOB = {"Authorization": "Bearer bob-demo-inbox-token-change-me"}
OPTIONS = [
    HumanOption(id="keep-v1", label="Keep the v1 API", consequence="The PR is asked to restore v1"),
    HumanOption(id="drop-v1", label="Drop v1", consequence="The review approves the removal"),
]


def requested(
    *,
    recipient: str = "user:alice",
    allowed: tuple[str, ...] = ("user:alice", "user:bob"),
    expires_in_s: float = 3600,
    on_timeout: TimeoutPolicy | None = None,
    allow_free_text: bool = True,
    request_id: str | None = None,
    run_id: str | None = None,
    answer_schema: dict[str, Any] | None = None,
    options: list[HumanOption] | None = None,
    title: str = "Review PR 42: remove the v1 API",
    question: str = "Should the v1 API stay for one more release?",
    context: str = "The PR removes /v1; two internal clients still call it.",
    agent_display_name: str | None = None,
    tenant: str | None = None,
    reason: str | None = None,
    reason_kind: HumanAskKind | None = None,
) -> Envelope:
    """A ``human.requested`` as run-executor would publish it."""
    request_id = request_id or new_id("hreq")
    run_id = run_id or new_id("run")
    policy = HumanPolicy(allowed_recipients=list(allowed), on_timeout=on_timeout or TimeoutPolicy())
    data = HumanRequested(
        request_id=request_id,
        run_id=run_id,
        agent="reviewer",
        agent_display_name=agent_display_name,
        title=title,
        recipient=recipient,
        question=question,
        context=context,
        reason=reason,
        reason_kind=reason_kind,
        options=OPTIONS if options is None else options,
        allow_free_text=allow_free_text,
        answer_schema=answer_schema,
        timeout_s=max(1, int(expires_in_s)),
        expires_at=datetime.now(UTC) + timedelta(seconds=expires_in_s),
        policy=policy,
        turn=3,
    )
    return make_event(data, source="/temporality/run-executor", run_id=run_id, id=new_id("evt"), tenant=tenant)


async def _on_stream(bus: Bus, subject: str) -> int:
    """How many messages the journal stream holds on ``subject``."""
    info = await bus.js.stream_info(EVENTS_STREAM.name, subjects_filter=subject)
    return int(sum((info.state.subjects or {}).values()))


async def events_of(
    bus: Bus, event_type: str, *, wait_for: int = 0, within_s: float = 30.0, settle_s: float = 0.0
) -> list[Envelope]:
    """Every ``event_type`` event in the journal stream.

    Waits (bounded by ``within_s``) until at least ``wait_for`` are on the stream, counted by the stream
    itself, so a slow consumer or a slow fetch never yields a partial list; then, with ``settle_s``,
    keeps watching that long so a late extra event is seen too. Reads back exactly what the stream holds.
    """
    subject = subject_for(event_type)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while (held := await _on_stream(bus, subject)) < wait_for:
        if loop.time() >= deadline:
            raise AssertionError(f"waited {within_s}s for {wait_for}x {event_type}; the stream holds {held}")
        await asyncio.sleep(0.05)
    if settle_s > 0:
        await asyncio.sleep(settle_s)  # the settle window: anything published meanwhile is counted below
        held = await _on_stream(bus, subject)
    if held == 0:
        return []
    sub = await bus.js.pull_subscribe(subject, stream=EVENTS_STREAM.name)
    found: list[Envelope] = []
    try:
        read_by = loop.time() + within_s
        while len(found) < held:
            if loop.time() >= read_by:
                raise AssertionError(f"read {len(found)} of the {held} {event_type} events on the stream")
            try:
                msgs = await sub.fetch(held - len(found), timeout=1)
            except TimeoutError:
                continue
            for msg in msgs:
                await msg.ack()
                found.append(decode(msg.data))
    finally:
        await sub.unsubscribe()
    return found


async def exactly(
    bus: Bus, event_type: str, count: int = 1, *, within_s: float = 30.0, settle_s: float = 1.0
) -> list[Envelope]:
    """Exactly ``count`` ``event_type`` events: waits until ``count`` are there (so it cannot pass on an
    empty stream), then a bounded settle window in which no further one may appear."""
    found = await events_of(bus, event_type, wait_for=count, within_s=within_s, settle_s=settle_s)
    assert len(found) == count, f"{len(found)}x {event_type}, expected exactly {count}: {[e.id for e in found]}"
    return found


async def stored(bus: Bus, request_id: str) -> HumanRequestRecord | None:
    got = await (await open_store(bus)).get(request_id)
    return got.value if got is not None else None


async def delivered_then_withdrawn(
    bus: Bus, client: httpx.AsyncClient, request_id: str, reason: str | None = None
) -> HumanRequestRecord:
    """Alice's request, delivered on the web inbox in its record's create and cancelled since (its run ended or
    withdrew it): the record keeps the delivery, the journal holds its ``human.notified`` exactly once, and alice
    sees the request withdrawn -- cancelled when she opens it, gone from her inbox, an answer refused. The cancel's
    own event is one ``human.withdrawn`` (``reason`` when given: ``run_completed``, ``not_needed`` ...), never an
    answer, expiry or rejection."""
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.CANCELLED
    assert record.channel == "web"  # listed in the inbox from the create: delivered
    assert [c.channel for c in record.deliveries] == ["web"]
    [notified] = await exactly(bus, "human.notified", settle_s=0.5)
    assert notified.payload(HumanNotified).request_id == request_id
    for outcome in ("human.answered", "human.expired", "human.rejected"):
        assert await events_of(bus, outcome) == []
    [withdrawn] = await exactly(bus, "human.withdrawn", settle_s=0.5)
    payload = withdrawn.payload(HumanWithdrawn)
    assert (payload.request_id, payload.recipient, payload.channel) == (request_id, "user:alice", "web")
    assert reason is None or payload.reason == reason
    assert withdrawn.id == derive_id("evt", request_id, "withdrawn")
    announced = await stored(bus, request_id)
    assert announced is not None
    assert announced.withdrawal_published
    shown = await client.get(f"/requests/{request_id}", headers=ALICE)
    assert (shown.status_code, shown.json()["status"]) == (200, "cancelled")
    assert request_id not in [r["id"] for r in (await client.get("/inbox", headers=ALICE)).json()["requests"]]
    late = await client.post(f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
    assert late.status_code == 409
    return record


async def lose_answer_publish(bus: Bus, client: httpx.AsyncClient, request_id: str, option_id: str = "keep-v1") -> None:
    """Alice answers while the journal stream is gone: the answer is bound, its ``human.answered`` is lost.

    The stream is back when this returns (empty: nothing was announced).
    """
    await bus.js.delete_stream(EVENTS_STREAM.name)  # publishing fails from here on
    lost = await client.post(f"/requests/{request_id}/answer", json={"option_id": option_id}, headers=ALICE)
    assert lost.status_code == 503
    assert lost.json()["error"] == "bus_unavailable"
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status == "answered"
    assert not record.answer_published
    await bus.ensure_stream(EVENTS_STREAM)


async def timer_messages(bus: Bus, subject: str) -> int:
    """How many messages the timers stream holds on ``subject``: on a fired subject, the firings; on a schedule
    subject, the schedules armed (a cancel's rollup, kept until it expires, is none)."""
    if subject.startswith(f"{TIMER_SCHEDULE_PREFIX}."):
        return await armed_schedules(bus, subject)
    info = await bus.js.stream_info(TIMERS_STREAMS["human-interaction"].name, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


async def wait_for_record(
    bus: Bus, request_id: str, condition: Callable[[HumanRequestRecord], bool], *, within_s: float = 30.0
) -> HumanRequestRecord:
    """The stored request once ``condition`` holds for it (watches the KV key; bounded by ``within_s``)."""
    watcher = await (await bus.kv(BUCKET_HUMAN_REQUESTS)).watch(request_id)
    try:
        async with asyncio.timeout(within_s):
            while True:
                entry = await watcher.updates(timeout=within_s)  # type: ignore[no-untyped-call]
                if entry is not None and entry.value:
                    record = HumanRequestRecord.model_validate_json(entry.value)
                    if condition(record):
                        return record
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]


@asynccontextmanager
async def running(*consumers: Consumer) -> AsyncIterator[None]:
    """Run ``consumers`` until the block ends, then stop them (bounded)."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c.run(stop)) for c in consumers]
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)


@dataclass
class KvCalls:
    """The JetStream API requests made on one KV bucket's stream, as the server routed them (:func:`kv_calls`)."""

    #: The subject filter of each listing (a watch: a consumer created on the stream), e.g. ``$KV.b.>``.
    listings: list[str] = field(default_factory=list)
    #: The key each read asked for (a direct get of the last message on ``$KV.<bucket>.<key>``).
    reads: list[str] = field(default_factory=list)


class KvSpy:
    """A plain NATS subscriber on the JetStream API subjects of a KV bucket's stream: every client's listing
    (consumer create) and read (direct / message get) of it passes through the server's subject routing, so
    this sees what the service asked of the real bucket -- no patching. :meth:`calls` is complete for every
    request made before it is called (the server queues the copies before it answers the request)."""

    def __init__(self, nc: nats.NATS, bucket: str, subs: list[Subscription]) -> None:
        self._nc, self._bucket, self._subs = nc, bucket, subs
        self._seen = KvCalls()

    async def calls(self) -> KvCalls:
        """What was asked since the spy started (or the last :meth:`reset`)."""
        await self._nc.flush()  # the PONG comes after every copy the server queued for us before it
        for sub in self._subs:
            while sub.pending_msgs:
                msg = await sub.next_msg(timeout=5)
                self._record(msg.subject, msg.data)
        return KvCalls(list(self._seen.listings), list(self._seen.reads))

    async def reset(self) -> None:
        await self.calls()
        self._seen = KvCalls()

    def _record(self, subject: str, data: bytes) -> None:
        stream = f"KV_{self._bucket}"
        prefix = f"$KV.{self._bucket}."
        if ".CONSUMER.CREATE." in subject:
            body = json.loads(data or b"{}")
            config = body.get("config") or {}
            filters = config.get("filter_subjects") or [config.get("filter_subject") or f"{prefix}>"]
            self._seen.listings.extend(str(f) for f in filters)
            return
        tail = subject.split(f".{stream}", 1)[1].lstrip(".")
        if not tail and data:
            body = json.loads(data)
            tail = str(body.get("last_by_subj") or body.get("next_by_subj") or f"seq:{body.get('seq')}")
        self._seen.reads.append(tail.removeprefix(prefix))


@asynccontextmanager
async def kv_calls(url: str, bucket: str) -> AsyncIterator[KvSpy]:
    """Watch the JetStream API requests on ``bucket``'s stream (see :class:`KvSpy`) until the block ends."""
    nc = await nats.connect(url, name="kv-spy")
    stream = f"KV_{bucket}"
    try:
        subs = [
            await nc.subscribe(subject)
            for api in ("CONSUMER.CREATE", "DIRECT.GET", "STREAM.MSG.GET")
            for subject in (f"$JS.API.{api}.{stream}", f"$JS.API.{api}.{stream}.>")
        ]
        await written_out(nc)
        yield KvSpy(nc, bucket, subs)
    finally:
        await nc.close()


#: People on Telegram in the group and timeout-chain tests (alice answers in the web inbox).
BOB_TELEGRAM = TelegramUser(1002, "Bob")
DAVE_TELEGRAM = TelegramUser(1004, "Dave")


def people(groups: dict[str, Any]) -> dict[str, Any]:
    """A directory mapping with alice (web), bob (Telegram, then web) and dave (Telegram), and ``groups``."""
    return {
        "users": {
            "alice": {
                "display_name": "Alice Example",
                "inbox_token": "alice-demo-inbox-token-change-me",
                "preferred": "web",
                "channels": {"web": {}},
            },
            "bob": {
                "display_name": "Bob Example",
                "inbox_token": "bob-demo-inbox-token-change-me",
                "preferred": "telegram",
                "fallback": ["web"],
                "channels": {"telegram": {"chat_id": BOB_TELEGRAM.id}, "web": {}},
            },
            "dave": {
                "display_name": "Dave Example",
                "preferred": "telegram",
                "channels": {"telegram": {"chat_id": DAVE_TELEGRAM.id}},
            },
        },
        "groups": groups,
    }


def service_settings(tmp_path: Path, nats_settings: NatsSettings, users: str, **overrides: Any) -> Settings:
    """The service's settings for a test that starts it as it starts (``configure``/``setup``): ``users`` as its
    users file, an admin API token (``ops``), port 0 on loopback, ``overrides`` on top (Telegram, the lease...)."""
    (tmp_path / "users.yaml").write_text(users, encoding="utf-8")
    token = ApiToken(name="ops", role=Role.admin, token=SecretStr("human-test-admin-token-0123456789"))
    (tmp_path / "tokens.json").write_text(dump_tokens([token]), encoding="utf-8")
    return Settings(
        nats=nats_settings,
        host="127.0.0.1",
        port=0,
        users_file=tmp_path / "users.yaml",
        api=ApiAuthSettings(tokens_file=tmp_path / "tokens.json"),
        **overrides,
    )


async def request_run(bus: Bus, run_id: str, allowed: list[str]) -> None:
    """The gateway's ``run.requested`` for ``run_id``: its policy (SEC-1) lets it ask ``allowed``."""
    policy = HumanPolicy(allowed_recipients=allowed)
    launch = LaunchSource(kind="webhook", trigger_id="ado-pr-review")
    run = RunRequested(run_id=run_id, agent="reviewer", title="Review PR 42", launch=launch, human=policy)
    await bus.publish(make_event(run, source="/temporality/trigger-gateway", run_id=run_id))


def count_requests(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bytes]]:
    """Every request (subject, payload) the bus connection sends from now on: KV creates and reads included
    (a ``Store`` reads through the Bus's pipeline, ``Pipeline.request``)."""
    sent: list[tuple[str, bytes]] = []
    request, piped = bus.nc.request, bus.pipeline.request

    async def counted(subject: str, payload: bytes = b"", *args: object, **kwargs: object) -> object:
        sent.append((subject, payload))
        return await request(subject, payload, *args, **kwargs)  # type: ignore[arg-type]

    async def counted_piped(subject: str, payload: bytes, **kwargs: float) -> object:
        sent.append((subject, payload))
        return await piped(subject, payload, **kwargs)

    monkeypatch.setattr(bus.nc, "request", counted)
    monkeypatch.setattr(bus.pipeline, "request", counted_piped)
    return sent


class PublishCrash(Exception):
    """Stands for the process dying as it publishes an event (after what it did before the publish)."""


class CrashingBus:
    """The real bus, except that the first publish of an event of ``event_type`` dies (:class:`PublishCrash`),
    alone (``publish``) or in a pipelined batch (``pipeline.send``: the writes before it in the batch are sent,
    as a process that dies while writing them out may have; it and the ones after it are not)."""

    def __init__(self, bus: Bus, event_type: str) -> None:
        self._bus = bus
        self._event_type = event_type
        self.crashed = False
        self.pipeline = _CrashingPipeline(self)

    def __getattr__(self, name: str) -> object:
        return getattr(self._bus, name)

    async def publish(self, event: Envelope) -> object:
        if event.type == self._event_type and not self.crashed:
            self.crashed = True
            raise PublishCrash(event.id)
        return await self._bus.publish(event)


class _CrashingPipeline:
    def __init__(self, crashing: CrashingBus) -> None:
        self._crashing = crashing

    def __getattr__(self, name: str) -> object:  # ``request`` and the rest: the real bus's pipeline
        return getattr(self._crashing._bus.pipeline, name)

    async def send(self, writes: Sequence[Write], **kwargs: Any) -> list[PublishResult | BusError]:
        crashing = self._crashing
        for i, write in enumerate(writes):
            if write.headers.get("Ce-Type") == crashing._event_type and not crashing.crashed:
                crashing.crashed = True
                await crashing._bus.pipeline.send(writes[:i], **kwargs)
                raise PublishCrash(write.headers.get("Nats-Msg-Id"))
        return await crashing._bus.pipeline.send(writes, **kwargs)


class TimerLosingBus:
    """The real bus, except that in a pipelined batch (``pipeline.send``) every write of a human-interaction timer
    fails (a :class:`TransientError`, not sent) while the batch's other writes are sent and stored: the partial
    failure a round of independent writes can have (``lost``: the schedule subjects of the timers lost)."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self.lost: list[str] = []
        self.pipeline = _TimerLosingPipeline(self)

    def __getattr__(self, name: str) -> object:
        return getattr(self._bus, name)


class _TimerLosingPipeline:
    def __init__(self, losing: TimerLosingBus) -> None:
        self._losing = losing

    def __getattr__(self, name: str) -> object:
        return getattr(self._losing._bus.pipeline, name)

    async def send(self, writes: Sequence[Write], **kwargs: Any) -> list[PublishResult | BusError]:
        def timer(write: Write) -> bool:
            return write.subject.startswith(f"{TIMER_SCHEDULE_HUMAN}.")

        sent = iter(await self._losing._bus.pipeline.send([w for w in writes if not timer(w)], **kwargs))
        outcomes: list[PublishResult | BusError] = []
        for write in writes:
            if timer(write):
                self._losing.lost.append(write.subject)
                outcomes.append(TransientError(f"lost on the way: {write.subject}"))
            else:
                outcomes.append(next(sent))
        return outcomes


#: Alice and Bob, both on the web inbox, and the group of both of them.
ALICE_BOB_AND_API_OWNERS = """users:
  alice:
    display_name: Alice Example
    inbox_token: alice-demo-inbox-token-change-me
    preferred: web
    channels: {web: {}}
  bob:
    display_name: Bob Example
    inbox_token: bob-demo-inbox-token-change-me
    preferred: web
    channels: {web: {}}
groups:
  api-owners:
    display_name: API owners
    members: [alice, bob]
"""


async def inbox_ids(client: httpx.AsyncClient, headers: dict[str, str]) -> list[str]:
    """The ids of the requests ``GET /inbox`` lists for the person ``headers`` sign in as, sorted."""
    reply = await client.get("/inbox", headers=headers)
    assert reply.status_code == 200, reply.text
    return sorted(r["id"] for r in reply.json()["requests"])


# ------------------------------------------------------------------------------------- Telegram and the web inbox
#: Alice's Telegram account in the Bot API emulator.
TG_ALICE = TelegramUser(1001, "Alice")


def telegram_first(*, fallback: Sequence[str] = ()) -> dict[str, Any]:
    """A directory of one person, alice, asked on Telegram first, with a web inbox too."""
    alice: dict[str, Any] = {
        "display_name": "Alice Example",
        "inbox_token": "alice-demo-inbox-token-change-me",
        "preferred": "telegram",
        "channels": {"telegram": {"chat_id": TG_ALICE.id}, "web": {}},
    }
    if fallback:
        alice["fallback"] = list(fallback)
    return {"users": {"alice": alice}}


@dataclass
class TelegramDesk:
    """The Bot API emulator, and the Telegram and web-inbox adapters answering through one router."""

    bus: Bus
    tg: TelegramEmulator
    directory: Directory
    adapters: dict[str, ChannelAdapter]
    router: AnswerRouter

    def intake(self, egress: EgressPolicy | None = None) -> RequestHandler:
        """The handler of ``human.requested`` over these adapters."""
        return RequestHandler(self.bus, self.directory, self.adapters, egress=egress)


@asynccontextmanager
async def telegram_and_web(
    bus: Bus, users: dict[str, Any], *, egress: EgressPolicy | None = None
) -> AsyncIterator[TelegramDesk]:
    """A real Telegram adapter polling the emulator over HTTP, and the web inbox; ``egress`` applied to both."""
    directory = Directory.from_mapping(users)
    async with TelegramEmulator().serve() as tg:
        adapters: dict[str, ChannelAdapter] = {}
        router = AnswerRouter(bus, directory, adapters)
        web = WebInboxAdapter()
        bot = TelegramAdapter(bus, token=tg.token, base_url=tg.base_url, poll_timeout_s=1)
        for adapter in (web, bot):
            adapter.attach(router)
            if egress is not None:
                adapter.egress = egress
        async with web, bot:
            adapters.update({web.name: web, bot.name: bot})
            yield TelegramDesk(bus, tg, directory, adapters, router)


async def ask_on_telegram(
    bus: Bus, intake: RequestHandler, emulator: TelegramEmulator, **kw: Any
) -> tuple[str, dict[str, Any]]:
    """A question (:func:`requested` with ``kw``) taken in and delivered on Telegram: its request id and the message
    the emulator's chat got (in the chat the stored copy names)."""
    event = requested(**kw)
    await intake.handle(event)
    request_id = str(event.data["request_id"])
    record = await stored(bus, request_id)
    assert record is not None
    copy = record.copy_on("telegram")
    assert copy is not None
    assert copy.address is not None
    message = await emulator.wait_for_message(int(copy.address), lambda m: m["message_id"] == int(copy.reference))
    return request_id, message
