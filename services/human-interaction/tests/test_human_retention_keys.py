"""The retention sweep purges everything a request left behind (HUM-3), on a real nats-server with the real
handlers and Telegram through the Bot API emulator: past the retention, ``human-channels`` holds only what
is not per request -- a person's DM room, the bot's sync token, the newest-question pointer of a room whose
question is still there, and what belongs to the request and the run still pending. Within the retention
nothing is touched."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from human_support import BOB_TELEGRAM, people, requested, stored

from temporality_bus import Bus
from temporality_bus.listing import live_keys
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS, ChannelRefs, ref_key
from temporality_human_interaction.channels.telegram import TelegramAdapter, sent_message_key
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.inbox import ChannelEntry, RetentionSweeper, inbox_key, stale_references
from temporality_human_interaction.notifications import NotificationHandler
from temporality_human_interaction.policies import RunPolicies, policy_key
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import RunEndHandler
from temporality_protocol import HumanNotifyRequested, HumanPolicy, HumanRequestState, RunCompleted, make_event
from temporality_testing.telegram_emulator import TelegramEmulator

OLD_RUN, ALIVE_RUN = "run-retention-old", "run-retention-alive"
POLICY = HumanPolicy(allowed_recipients=["user:alice", "user:bob"])
RETENTION = timedelta(days=1)


async def _keys(bus: Bus) -> set[str]:
    # the bus's own listing (the keys holding a value), not nats-py's KeyValue.keys(), whose watch can end the
    # listing before its first key (NoKeysError: "empty") when that key is already in hand
    return set(await live_keys(await bus.kv(BUCKET_HUMAN_CHANNELS)))


async def test_the_sweep_leaves_nothing_of_a_purged_request_and_its_ended_run(bus: Bus) -> None:
    directory = Directory.from_mapping(people({}))
    policies = RunPolicies(bus)
    for run_id in (OLD_RUN, ALIVE_RUN):
        await policies.record(run_id, POLICY)
    refs = ChannelRefs(bus)
    async with TelegramEmulator().serve() as tg:
        bot = TelegramAdapter(bus, token=tg.token, base_url=tg.base_url, poll_timeout_s=1)
        async with WebInboxAdapter() as web, bot:
            adapters: dict[str, ChannelAdapter] = {web.name: web, bot.name: bot}
            handler = RequestHandler(bus, directory, adapters, policies=policies)
            to_bob = requested(recipient="user:bob", run_id=OLD_RUN, expires_in_s=60)  # Telegram
            to_alice = requested(recipient="user:alice", run_id=OLD_RUN, expires_in_s=60)  # web inbox
            pending = requested(recipient="user:alice", run_id=ALIVE_RUN)
            for event in (to_bob, to_alice, pending):
                await handler.handle(event)
            await tg.wait_for_message(BOB_TELEGRAM.id)
            note = HumanNotifyRequested(
                notification_id="hn-retention-1",
                run_id=OLD_RUN,
                agent="reviewer",
                title="Review PR 42",
                recipient="user:bob",
                message="The review is done.",
                policy=POLICY,
                turn=4,
            )
            notifier = NotificationHandler(bus, directory, adapters, policies=policies)
            await notifier.handle(make_event(note, source="/temporality/run-executor", run_id=OLD_RUN))
    bob_id, alice_id, pending_id = (str(e.data["request_id"]) for e in (to_bob, to_alice, pending))

    # the old run ends: its two requests are cancelled (and end the retention clock)
    ended = RunCompleted(run_id=OLD_RUN, result="done", turns=4)
    await RunEndHandler(bus).handle(make_event(ended, source="/temporality/run-executor", run_id=OLD_RUN))
    for request_id in (bob_id, alice_id):
        record = await stored(bus, request_id)
        assert record is not None
        assert record.status is HumanRequestState.CANCELLED
    # what the transports and crashes leave besides: a reminder whose send was claimed but never recorded,
    # an older version's inbox entry written before a record that never came, Matrix bindings and room pointers
    await refs.claim(sent_message_key(bob_id, "reask-1", BOB_TELEGRAM.id), "99")
    await refs.claim(inbox_key("user:alice", "hreq-never-stored"), "hreq-never-stored")
    await refs.claim(ref_key("matrix", "event", "$orphan:hs"), alice_id)
    await refs.put(ref_key("matrix", "poll", "$question-gone:hs"), "$poll:hs")
    await refs.put(ref_key("matrix", "latest", "!room-old:hs"), alice_id)
    await refs.put(ref_key("matrix", "latest", "!room-alive:hs"), pending_id)
    await refs.claim(ref_key("matrix", "room", "@alice:hs"), "!room-alive:hs")
    await refs.put(ref_key("matrix", "since", "@bot:hs"), "s123_456")

    before = await _keys(bus)
    for key in (
        policy_key(OLD_RUN),
        ref_key("runend", OLD_RUN),
        ref_key("notify", "hn-retention-1"),
        ref_key("telegram", "req", bob_id),
        ref_key("run", OLD_RUN, bob_id),
    ):
        assert key in before, sorted(before)

    now = datetime.now(UTC)
    within = RetentionSweeper(bus, retention=RETENTION, every_s=3600, clock=lambda: now + timedelta(hours=23))
    assert await within.sweep() == 0
    assert await _keys(bus) == before  # within the retention nothing goes, not even an orphan

    past = RetentionSweeper(bus, retention=RETENTION, every_s=3600, clock=lambda: now + timedelta(days=1, hours=2))
    assert await past.sweep() == 2
    assert await stored(bus, bob_id) is None
    assert await stored(bus, alice_id) is None
    assert await _keys(bus) == {
        # not per request: the DM room, the sync token, a pointer to a question still there
        ref_key("matrix", "room", "@alice:hs"),
        ref_key("matrix", "since", "@bot:hs"),
        ref_key("matrix", "latest", "!room-alive:hs"),
        # the pending request of the run still going (its run entry: the inbox's index too), and that run's policy
        ref_key("run", ALIVE_RUN, pending_id),
        policy_key(ALIVE_RUN),
    }
    assert await stored(bus, pending_id) is not None
    assert await past.sweep() == 0  # a second sweep finds nothing more


def _entry(key: str, value: str, age: timedelta, now: datetime) -> ChannelEntry:
    return ChannelEntry(key=key, value=value, created_at=now - age, revision=7)


def test_a_run_s_policy_and_end_marker_stay_while_one_of_its_requests_is_kept() -> None:
    now = datetime.now(UTC)
    old = RETENTION + timedelta(hours=1)
    long_id = "hreq-" + "x" * 100  # longer than a key part: hashed in keys
    entries = [
        _entry(policy_key("run-a"), "{}", old, now),
        _entry(ref_key("runend", "run-a"), "run.completed", old, now),
        _entry(policy_key("run-b"), "{}", old, now),  # never ended: kept, however old
        _entry(ref_key("telegram", "req", long_id), "tok", old, now),
        _entry(ref_key("telegram", "req", "hreq-gone"), "tok2", old, now),
        _entry(ref_key("notify", "hn-1"), "telegram", RETENTION - timedelta(hours=1), now),  # too young
    ]
    stale = stale_references(entries, {long_id: "run-a"}, now, RETENTION)
    assert stale == [(ref_key("telegram", "req", "hreq-gone"), 7)]
    # once run-a's last request is gone: its policy first, then its end marker
    stale = stale_references(entries, {}, now, RETENTION)
    assert [key for key, _ in stale] == [
        policy_key("run-a"),
        ref_key("runend", "run-a"),
        ref_key("telegram", "req", long_id),
        ref_key("telegram", "req", "hreq-gone"),
    ]


def test_a_withdrawal_marker_goes_with_its_request() -> None:
    now = datetime.now(UTC)
    old = RETENTION + timedelta(hours=1)
    entries = [
        _entry(ref_key("withdrawn", "run-a", "hreq-kept"), "hreq-kept", old, now),
        _entry(ref_key("withdrawn", "run-a", "hreq-gone"), "hreq-gone", old, now),
    ]
    stale = stale_references(entries, {"hreq-kept": "run-a"}, now, RETENTION)
    assert stale == [(ref_key("withdrawn", "run-a", "hreq-gone"), 7)]
