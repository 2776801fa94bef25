"""The Matrix adapter (matrix-nio), a client of any homeserver; tested against a real Synapse (HUM-3).

Lifecycle: :meth:`initialize` logs in as the bot (password, or an access token checked with
``whoami``): from here the adapter sends. The inbound side below (the syncs) runs only while this replica holds
the Matrix sync lease (:mod:`.lease`, issue 11; without a lease it always does): it syncs once. Where the last run stopped (``next_batch``, kept in KV under
``matrix.since.<bot>``) it resumes from there and processes what arrived meanwhile; on the very
first start it keeps the initial sync's ``next_batch`` without processing, so history is never
re-processed. A background task then long-polls ``/sync`` and stores ``next_batch`` after each batch.
If the homeserver cannot be reached at start-up the adapter stays unavailable (delivery falls back to
the next channel) and keeps retrying in the background. :meth:`shutdown` stops the loop and closes.

Outbound:

* **one DM room per person**, created once (``room_create(is_direct=True,
  preset=trusted_private_chat, invite=[person])``) and reused while the person is in it (joined, or the
  invite pending): its id is kept in KV (``matrix.room.<matrix user id>``). If they left it or rejected the
  invite, the next question opens a new DM. Rooms stay unencrypted.
* **question**: HTML (``formatted_body``: title, why, the question, options numbered with their
  consequences, the deadline and what happens if nobody answers) with a plain-text ``body``; the
  transaction id is derived from the request id, so a redelivered ``human.requested`` is
  deduplicated by the homeserver. Then the bot reacts with ``1️⃣``, ``2️⃣`` ... (up to ``🔟``), one
  reaction per option: the "buttons". Then an ``m.poll.start`` (MSC3381, stable names) with the
  options as its answers (their ids as answer ids), for clients that show polls
  (``matrix.poll.<question event id>`` -> the poll's event id).
  ``matrix.event.<event id>`` -> request id binds answers (the question's and the poll's event);
  ``matrix.latest.<room>`` names the newest question in the room, ``matrix.asked.<room>.<request id>`` each one
  asked there (claimed before the send: a bare answer finds the room's open questions).
* **update**: an ``m.replace`` edit of the question showing the outcome, and an ``m.poll.end`` closing its poll.
* **notify**: a plain ``m.notice``.

Inbound (all handed to :meth:`ChannelAdapter.submit`, the channel-neutral binding; the responder's
identity is the event ``sender``): a **reaction** with an option's keycap (or digit) on a question;
a **rich reply** (``m.relates_to.m.in_reply_to``) to a question — an option's number/id/label binds
that option, anything else free text; a **message that replies to no question** binds the same way to the
room's one open question (``matrix.asked.<room>.*``), or, with none or several open, is answered with how to
answer and which are open (in a room no question was asked in it is left alone; which are open: from the
service's mirror of ``human-channels``, reading only the records of the room's requests whose run entry is not
marked ended -- :func:`.mirror.chat_questions` -- else a listing and a read of every key and record); a **poll response** (``m.poll.response`` with ``m.selections``, or the
unstable ``org.matrix.msc3381.poll.response``) to the question's poll binds the option it selects. The
bot answers each with a notice in reply naming the question: recorded, or why not (not
the recipient, already answered, expired ...). The question and its edit are cut to fit an event
(:func:`.render.fitted`: an edit carries the text twice). The bot's own events are ignored; a person's edit
(``m.replace``) is never bound, they are told so. The bot's notices about a request (confirmations, refusals) are
kept under ``matrix.event`` like the question, and so is a notice naming one open question: a reply to one is a
reply to that request; a reply to a notice listing several open questions (``matrix.hint``) gets the list again.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Callable
from typing import Any, ClassVar

import structlog
from nio import (  # type: ignore[import-untyped]
    AsyncClient,
    AsyncClientConfig,
    LoginResponse,
    RoomCreateResponse,
    RoomGetStateEventResponse,
    RoomPreset,
    RoomSendResponse,
    SyncResponse,
    WhoamiResponse,
)

from temporality_bus import Bus
from temporality_human_interaction.answers import AnswerSubmission
from temporality_human_interaction.channels.base import (
    ChannelAdapter,
    ChannelUnavailable,
    DeliveryFailed,
    DeliveryReceipt,
    InboundAnswer,
    InboundResult,
)
from temporality_human_interaction.channels.lease import InboundLease
from temporality_human_interaction.channels.refs import ChannelRefs, ref_key
from temporality_human_interaction.channels.render import (
    EDIT_IGNORED,
    MATRIX_CONTENT_LIMIT,
    NOT_GUESSED,
    NOT_PLACED,
    NoSuchOption,
    fitted,
    matrix_content_size,
    no_such_option_text,
    option_choice,
    option_number,
    outcome_html,
    outcome_text,
    question_html,
    question_name,
    question_text,
    recorded_as,
    refusal_text,
)
from temporality_human_interaction.directory import UserProfile
from temporality_human_interaction.mirror import ChannelMirror, chat_questions
from temporality_human_interaction.records import HumanRequestRecord, SentCopy, open_store
from temporality_protocol import HumanOption, TextAnswer
from temporality_protocol.events import MAX_TEXT

__all__ = ["KEYCAPS", "MatrixAdapter", "option_for_reaction"]

log = structlog.get_logger(__name__)

#: The reaction offered for option n (1-based) is ``KEYCAPS[n - 1]``.
KEYCAPS = ("1️⃣", "2️⃣", "3️⃣", "4️⃣", "5️⃣", "6️⃣", "7️⃣", "8️⃣", "9️⃣", "🔟")
_HINT = "react with an option's number, vote in the poll, or reply to this message with the number"
_TRY_AGAIN = "Your answer could not be recorded right now. Please try again in a moment."
#: What a message that answers no question is told (then which questions are open here, if any).
_HOW_TO_ANSWER = "To answer a question, reply to its message, or react to it with an option's number."
#: A hint lists at most this many open questions.
_LISTED = 5
_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
POLL_START = "m.poll.start"
POLL_END = "m.poll.end"
POLL_RESPONSES = ("m.poll.response", "org.matrix.msc3381.poll.response")


def option_for_reaction(options: list[HumanOption], key: str) -> HumanOption | None:
    """The option a reaction ``key`` stands for: its keycap, or a bare digit."""
    key = key.strip()
    if key in KEYCAPS:
        number = KEYCAPS.index(key) + 1
    elif (digits := option_number(key)) is not None:
        number = digits
    else:
        return None
    return options[number - 1] if 1 <= number <= len(options) else None


def poll_content(request: HumanRequestRecord, fallback: str) -> dict[str, Any]:
    """The ``m.poll.start`` content offering ``request``'s options (answer ids = option ids), one selection."""
    answers = [{"m.id": o.id, "m.text": [{"body": o.label}]} for o in request.options[: len(KEYCAPS)]]
    return {
        "m.poll": {
            "kind": "m.disclosed",
            "max_selections": 1,
            "question": {"m.text": [{"body": request.question}]},
            "answers": answers,
        },
        "m.text": [{"body": fallback}],
    }


def poll_selection(event_type: str, content: dict[str, Any]) -> str | None:
    """The answer id a poll response selects (stable ``m.selections`` or MSC3381's unstable form); else None."""
    if event_type == "m.poll.response":
        selections = content.get("m.selections")
    else:
        selections = (content.get("org.matrix.msc3381.poll.response") or {}).get("answers")
    if not isinstance(selections, list) or not selections or not isinstance(selections[0], str):
        return None
    return selections[0]


def _strip_reply_fallback(body: str) -> str:
    """A rich reply's ``body`` starts with the quoted original (``> ...`` lines, then a blank line)."""
    lines = body.splitlines()
    while lines and lines[0].startswith(">"):
        lines.pop(0)
    return "\n".join(lines).strip()


class MatrixAdapter(ChannelAdapter):
    name: ClassVar[str] = "matrix"

    def __init__(
        self,
        bus: Bus,
        *,
        homeserver: str,
        user_id: str,
        password: str | None = None,
        access_token: str | None = None,
        sync_timeout_s: float = 10.0,
        device_name: str = "temporality-human-interaction",
        lease: InboundLease | None = None,
        mirror: ChannelMirror | None = None,
    ) -> None:
        if password is None and access_token is None:
            raise ValueError("the Matrix adapter needs a password or an access token")
        self._bus = bus
        self._homeserver = homeserver.rstrip("/")
        self._user_id = user_id
        self._password = password
        self._access_token = access_token
        self._sync_timeout_ms = int(sync_timeout_s * 1000)
        self._device_name = device_name
        self._refs = ChannelRefs(bus)
        #: ``human-channels`` as this replica's watch sees it: a bare message's look-up of the room's open questions
        #: reads it instead of listing the room's keys (:func:`.mirror.chat_questions`); None: the listing.
        self._mirror = mirror
        self._client: Any = None
        self._logged_in = False  # sends work from here
        self._synced = False  # the inbound side: the first sync done, /sync long-polled
        #: Who may sync (issue 11): None syncs whenever the adapter runs (one replica); else only the holder.
        self._lease = lease
        self._lease_changed = asyncio.Event()
        if lease is not None:
            lease.on_change = self._on_lease_change
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._since_key = ref_key("matrix", "since", user_id)

    @property
    def available(self) -> bool:
        return self._client is not None and self._logged_in

    @property
    def syncing(self) -> bool:
        """Whether this adapter runs the inbound side (syncs and processes what people send)."""
        return self._synced

    def _inbound_wanted(self) -> bool:
        return self._lease is None or self._lease.held

    async def _on_lease_change(self) -> None:
        self._lease_changed.set()  # the sync loop starts (or stops after its current long poll) syncing

    # ------------------------------------------------------------------ lifecycle
    async def initialize(self) -> None:
        if self._task is not None:
            return
        self._stopping = False
        self._client = AsyncClient(
            self._homeserver,
            self._user_id,
            config=AsyncClientConfig(store_sync_tokens=False, encryption_enabled=False),
        )
        if self._lease is not None:
            await self._lease.start()  # syncs once it holds the lease
        try:
            await self._connect()
        except Exception as exc:  # the homeserver is down or refuses: run degraded, keep trying
            log.warning("matrix.start_failed", error=str(exc), homeserver=self._homeserver)
        self._task = asyncio.create_task(self._run(), name="matrix-sync")

    async def shutdown(self) -> None:
        task, self._task = self._task, None
        self._stopping = True  # the loop stops even if a library swallows the cancellation below
        self._synced = False
        self._logged_in = False
        if task is not None:
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=10)
            if not done:
                log.warning("matrix.sync_task_did_not_stop")
            elif not task.cancelled() and task.exception() is not None:
                log.warning("matrix.sync_task_failed", error=repr(task.exception()))
        if self._lease is not None:
            await self._lease.stop()  # after the sync loop stopped: another replica syncs on at once
        client, self._client = self._client, None
        if client is not None:
            await client.close()
            log.info("matrix.stopped")

    async def _connect(self) -> None:
        """Log in (or check the token): ``available`` (sends work) from here; then the first sync when this replica
        runs the inbound side."""
        if not self._logged_in:
            await self._log_in()
            self._logged_in = True
            log.info("matrix.logged_in", user_id=self._client.user_id)
        if not self._synced and self._inbound_wanted():
            await self._first_sync()

    async def _log_in(self) -> None:
        client = self._client
        if self._access_token is not None:
            client.access_token = self._access_token
            who = await client.whoami()
            if not isinstance(who, WhoamiResponse):
                raise ChannelUnavailable(f"the Matrix access token was refused: {getattr(who, 'message', who)}")
            client.user_id = who.user_id
            client.device_id = who.device_id
        else:
            assert self._password is not None
            login = await client.login(password=self._password, device_name=self._device_name)
            if not isinstance(login, LoginResponse):
                raise ChannelUnavailable(f"the Matrix login was refused: {getattr(login, 'message', login)}")

    async def _first_sync(self) -> None:
        """Sync once from where the last sync (of any replica) stopped and process what arrived meanwhile."""
        client = self._client
        since = await self._refs.get(self._since_key)
        response = await client.sync(timeout=0, since=since, full_state=since is None)
        if not isinstance(response, SyncResponse):
            raise ChannelUnavailable(f"the first Matrix sync failed: {getattr(response, 'message', response)}")
        self._synced = True
        log.info("matrix.started", user_id=client.user_id, resumed=since is not None)
        if since is not None:
            await self._process(response)  # what arrived while we were away
        await self._refs.put(self._since_key, response.next_batch)

    async def _run(self) -> None:
        failures = 0
        while not self._stopping:
            try:
                if not self._inbound_wanted():  # another replica syncs: only send (log in if not yet)
                    if self._synced:
                        self._synced = False
                        log.info("matrix.sync_stopped", lease=self._lease.holder if self._lease else None)
                    if not self._logged_in:
                        await self._connect()
                    self._lease_changed.clear()
                    if not self._inbound_wanted():
                        await self._lease_changed.wait()
                    continue
                if not self._synced:
                    await self._connect()
                response = await self._client.sync(timeout=self._sync_timeout_ms)
                if self._stopping:
                    return
                if not self._inbound_wanted():
                    continue  # lost the lease during the long poll: the new holder syncs from the stored token
                if not isinstance(response, SyncResponse):
                    raise ChannelUnavailable(f"sync failed: {getattr(response, 'message', response)}")
                await self._process(response)
                await self._refs.put(self._since_key, response.next_batch)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = _RETRY_S[min(failures, len(_RETRY_S) - 1)]
                failures += 1
                log.warning("matrix.sync_failed", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)  # backoff between reconnect attempts, not a test wait

    # ------------------------------------------------------------------ outbound
    async def _send(self, room_id: str, event_type: str, content: dict[str, Any], tx_id: str | None) -> str:
        response = await self._client.room_send(room_id, event_type, content, tx_id=tx_id)
        if not isinstance(response, RoomSendResponse):
            raise DeliveryFailed(
                f"Matrix refused the {event_type} in {room_id}: {getattr(response, 'message', response)}"
            )
        return str(response.event_id)

    async def dm_room(self, matrix_user: str) -> str:
        """The DM room with ``matrix_user``: the one kept in KV while they are in it (joined or invited), else a
        new one (then kept).

        A person who left the room, or rejected its invite, would never see a question sent there, and the
        send would succeed: so the kept room is used only while the homeserver says their membership is
        ``join`` or ``invite``; otherwise a new DM invites them again (``matrix.dm_replaced`` in the log)."""
        key = ref_key("matrix", "room", matrix_user)
        existing = await self._refs.get(key)
        if existing is not None:
            membership = await self._membership(existing, matrix_user)
            if membership in ("join", "invite"):
                return existing
            log.info("matrix.dm_replaced", room_id=existing, membership=membership)
        created = await self._client.room_create(
            is_direct=True, preset=RoomPreset.trusted_private_chat, invite=[matrix_user], name="Temporality"
        )
        if not isinstance(created, RoomCreateResponse):
            raise DeliveryFailed(f"cannot open a DM with {matrix_user}: {getattr(created, 'message', created)}")
        if existing is not None:  # compare-and-set: two questions (or replicas) replacing it at once open one DM
            room_id = await self._refs.replace(key, existing, created.room_id)
        else:
            room_id = await self._refs.claim(key, created.room_id)
        if room_id != created.room_id:  # another one won: its room is the DM; ours is given up, its invite withdrawn
            await self._abandon(created.room_id, matrix_user)
        log.info("matrix.dm_created", room_id=room_id, replaces=existing, reused=room_id != created.room_id)
        return room_id

    async def _abandon(self, room_id: str, matrix_user: str) -> None:
        """Withdraw the invite to a DM that lost the race (a kick rescinds an invite), and leave it; best effort:
        the person is asked in the room that won either way."""
        kicked = await self._client.room_kick(room_id, matrix_user, reason="Another DM with Temporality is used.")
        left = await self._client.room_leave(room_id)
        log.info("matrix.dm_abandoned", room_id=room_id, kicked=type(kicked).__name__, left=type(left).__name__)

    async def _membership(self, room_id: str, matrix_user: str) -> str:
        """``matrix_user``'s membership of ``room_id`` as the homeserver has it now (``join``, ``invite``, ``leave``,
        ``ban``, ...); ``none`` when they never were a member, or the bot may no longer read the room."""
        got = await self._client.room_get_state_event(room_id, "m.room.member", matrix_user)
        if isinstance(got, RoomGetStateEventResponse):
            return str(got.content.get("membership", "none"))
        status = getattr(got, "status_code", "")
        if status in ("M_NOT_FOUND", "M_FORBIDDEN"):
            return "none"
        raise DeliveryFailed(f"cannot read {matrix_user}'s membership of {room_id}: {getattr(got, 'message', got)}")

    async def do_deliver(
        self, request: HumanRequestRecord, profile: UserProfile, *, banner: str | None = None, tag: str = ""
    ) -> DeliveryReceipt:
        assert profile.channels.matrix is not None  # reaches() checked it
        room_id = await self.dm_room(profile.channels.matrix.user_id)

        def question(r: HumanRequestRecord, note: str | None) -> dict[str, Any]:
            return {
                "msgtype": "m.text",
                "body": question_text(r, hint=_HINT, banner=banner, note=note),
                "format": "org.matrix.custom.html",
                "formatted_body": question_html(r, hint=_HINT, banner=banner, note=note),
            }

        content = self._fitted(request, question)
        send = f"{request.request_id}-{tag}" if tag else request.request_id  # a reminder is a new message
        # asked in this room before it is sent: a bare answer finds it however fast it comes
        await self._refs.claim(ref_key("matrix", "asked", room_id, request.request_id), request.request_id)
        event_id = await self._send(room_id, "m.room.message", content, tx_id=f"q-{send}")
        await self._refs.claim(ref_key("matrix", "event", event_id), request.request_id)
        await self._refs.put(ref_key("matrix", "latest", room_id), request.request_id)
        for number, _ in enumerate(request.options[: len(KEYCAPS)], start=1):
            reaction = {"m.relates_to": {"rel_type": "m.annotation", "event_id": event_id, "key": KEYCAPS[number - 1]}}
            await self._send(room_id, "m.reaction", reaction, tx_id=f"r-{send}-{number}")
        if request.options:
            fallback = "\n".join(
                [request.question, *(f"{n}. {o.label}" for n, o in enumerate(request.options[: len(KEYCAPS)], 1))]
            )
            poll_id = await self._send(room_id, POLL_START, poll_content(request, fallback), tx_id=f"p-{send}")
            await self._refs.claim(ref_key("matrix", "event", poll_id), request.request_id)
            await self._refs.put(ref_key("matrix", "poll", event_id), poll_id)
        return DeliveryReceipt(channel=self.name, reference=event_id, address=room_id)

    async def do_update(self, request: HumanRequestRecord, copy: SentCopy, responder_name: str | None) -> None:
        if copy.address is None:
            raise DeliveryFailed(f"the Matrix copy of {request.request_id} has no room id")
        outcome = outcome_text(request, responder_name=responder_name)

        def edit(r: HumanRequestRecord, note: str | None) -> dict[str, Any]:
            new_content = {
                "msgtype": "m.text",
                "body": question_text(r, hint=_HINT, note=note) + "\n\n" + outcome,
                "format": "org.matrix.custom.html",
                "formatted_body": question_html(r, hint=_HINT, note=note)
                + outcome_html(r, responder_name=responder_name),
            }
            return {
                **new_content,
                "body": "* " + new_content["body"],
                "formatted_body": "* " + new_content["formatted_body"],
                "m.new_content": new_content,
                "m.relates_to": {"rel_type": "m.replace", "event_id": copy.reference},
            }

        content = self._fitted(request, edit)  # the edit carries the text twice: it must fit as a whole
        # one edit per copy: a room may hold the question and its reminders (same request, other events)
        copy_ref = hashlib.sha256(copy.reference.encode()).hexdigest()[:16]
        await self._send(
            copy.address, "m.room.message", content, tx_id=f"u-{request.request_id}-{request.status.value}-{copy_ref}"
        )
        poll_id = await self._refs.get(ref_key("matrix", "poll", copy.reference))
        if poll_id is not None:  # close the question's poll, saying how it ended
            end = {"m.relates_to": {"rel_type": "m.reference", "event_id": poll_id}, "m.text": [{"body": outcome}]}
            await self._send(copy.address, POLL_END, end, tx_id=f"e-{request.request_id}-{copy_ref}")

    def _fitted(
        self, request: HumanRequestRecord, render: Callable[[HumanRequestRecord, str | None], dict[str, Any]]
    ) -> dict[str, Any]:
        """The event content ``render`` builds, cut to fit a Matrix event (:func:`.render.fitted`)."""
        return fitted(request, render, matrix_content_size, MATRIX_CONTENT_LIMIT, inbox_url=self.inbox_url)

    async def do_notify(self, profile: UserProfile, text: str, key: str) -> DeliveryReceipt:
        assert profile.channels.matrix is not None
        room_id = await self.dm_room(profile.channels.matrix.user_id)
        # the homeserver answers a repeated transaction id (same access token) with the first event: sent once
        content = {"msgtype": "m.notice", "body": text}
        event_id = await self._send(room_id, "m.room.message", content, tx_id=f"n-{key}")
        return DeliveryReceipt(channel=self.name, reference=event_id, address=room_id)

    # ------------------------------------------------------------------ inbound
    async def _process(self, response: Any) -> None:
        for room_id, room in response.rooms.join.items():
            for event in room.timeline.events:
                source = getattr(event, "source", None)
                if not isinstance(source, dict) or source.get("sender") == self._client.user_id:
                    continue
                try:
                    await self._on_event(room_id, source)
                except Exception as exc:  # one bad event never stops the sync loop
                    log.warning(
                        "matrix.event_failed", room_id=room_id, event_id=source.get("event_id"), error=repr(exc)
                    )

    async def _on_event(self, room_id: str, source: dict[str, Any]) -> None:
        kind = source.get("type")
        content = source.get("content") or {}
        sender = str(source.get("sender"))
        relates = content.get("m.relates_to") or {}
        if kind == "m.reaction" and relates.get("rel_type") == "m.annotation":
            await self._on_reaction(room_id, source, relates)
        elif kind in POLL_RESPONSES and relates.get("rel_type") == "m.reference":
            await self._on_poll_response(room_id, source, str(kind), content, relates)
        elif kind == "m.room.message" and relates.get("rel_type") == "m.replace":
            await self._on_edit(room_id, source)
        elif kind == "m.room.message":
            body = content.get("body")
            if not isinstance(body, str) or not body.strip():
                return
            replied = (relates.get("m.in_reply_to") or {}).get("event_id")
            # a question, its poll, or a notice of the bot's about one (a confirmation, a refusal)
            request_id = await self._refs.get(ref_key("matrix", "event", replied)) if replied else None
            record = await self._record(request_id) if request_id is not None else None
            if record is not None:
                await self._on_text(room_id, source, record, _strip_reply_fallback(body), sender)
            elif replied and await self._about_no_one_question(room_id, source, str(replied)):
                return
            else:  # a bare message (or a reply to someone's message): the room's one open question takes it
                await self._on_bare(room_id, source, _strip_reply_fallback(body) if replied else body, sender)

    async def _about_no_one_question(self, room_id: str, source: dict[str, Any], replied: str) -> bool:
        """A reply to an event of the bot's that is about no one question: a hint listing several (answered with the
        hint again, never bound to one of them), or one this service cannot place (sent before it kept what its
        notices are about): told how to answer. True when it was answered here."""
        listed = await self._refs.get(ref_key("matrix", "hint", replied))
        if listed is None and not await self._sent_by_bot(room_id, replied):
            return False  # a reply to the person's own message: as a plain message
        asked, _ = await self._asked_in(room_id)
        open_ = _open(asked)
        await self._send_hint(room_id, source, open_, lead=NOT_GUESSED if listed is not None else NOT_PLACED)
        return True

    async def _sent_by_bot(self, room_id: str, event_id: str) -> bool:
        """Whether ``event_id`` in ``room_id`` is the bot's own (False when the homeserver cannot say)."""
        got = await self._client.room_get_event(room_id, event_id)
        return bool(getattr(getattr(got, "event", None), "sender", None) == self._client.user_id)

    async def _on_edit(self, room_id: str, source: dict[str, Any]) -> None:
        """An edit (``m.replace``) of a person's message: never bound (it would bind to whatever question is open
        now) and never a change of a recorded answer; the person is told so, and how to answer. In a room no
        question was ever asked in it is left alone, like a bare message."""
        asked, ended = await self._asked_in(room_id)
        if not asked and not ended:
            return
        await self._send_hint(room_id, source, _open(asked), lead=EDIT_IGNORED)

    async def _on_bare(self, room_id: str, source: dict[str, Any], body: str, sender: str) -> None:
        """A message that answers no question by itself: bound to the room's open question when exactly one is open,
        else the person is told how to answer (and which are open). In a room no question was ever asked in, it is
        a conversation, not an answer: left alone."""
        asked, ended = await self._asked_in(room_id)
        if not asked and not ended:
            return
        open_ = _open(asked)
        if len(open_) == 1:
            await self._on_text(room_id, source, open_[0], body, sender)
            return
        await self._send_hint(room_id, source, open_)

    async def _send_hint(
        self, room_id: str, source: dict[str, Any], open_: list[HumanRequestRecord], *, lead: str = ""
    ) -> None:
        """A notice with how to answer and which questions are open. One naming a single question is kept about it
        (``matrix.event.<event id>``, like a confirmation), so a reply to it -- what it invites -- answers that
        question; one listing several is remembered (``matrix.hint.<event id>``), so a reply to it is not bound to one
        of them."""
        lead = f"{lead} " if lead else ""
        if not open_:
            hint = f"{lead}{_HOW_TO_ANSWER} There is no open question here right now."
        else:
            names = ", ".join(question_name(r, with_run=True) for r in open_[:_LISTED])
            more = f" and {len(open_) - _LISTED} more" if len(open_) > _LISTED else ""
            if len(open_) == 1:
                hint = f"{lead}{_HOW_TO_ANSWER} One question is open here: {names}; a plain message answers it."
            else:
                hint = f"{lead}{_HOW_TO_ANSWER} {len(open_)} questions are open here: {names}{more}."
        event_id = await self._notice(room_id, source, hint, about=open_[0].request_id if len(open_) == 1 else None)
        if len(open_) > 1:
            await self._refs.claim(ref_key("matrix", "hint", event_id), open_[0].request_id)

    async def _asked_in(self, room_id: str) -> tuple[list[HumanRequestRecord], int]:
        """The questions asked in ``room_id`` (``matrix.asked.<room>.*``, and the room's newest question, which a
        version before them recorded alone) that may be open and are still stored, and how many others are known
        to have ended without being read: with the mirror, those whose run entry is marked ended
        (:func:`.mirror.chat_questions`; their records are still stored), else none (every record is read)."""
        asked = await chat_questions(
            self._refs,
            self._mirror,
            ref_key("matrix", "asked", room_id),
            also=[ref_key("matrix", "latest", room_id)],
        )
        records = await asyncio.gather(*(self._record(i) for i in asked.candidates))
        return [r for r in records if r is not None], asked.ended

    async def _record(self, request_id: str) -> HumanRequestRecord | None:
        got = await (await open_store(self._bus)).get(request_id)
        return got.value if got is not None else None

    async def _on_reaction(self, room_id: str, source: dict[str, Any], relates: dict[str, Any]) -> None:
        request_id = await self._refs.get(ref_key("matrix", "event", str(relates.get("event_id"))))
        if request_id is None:
            return  # a reaction to anything else
        record = await self._record(request_id)
        option = option_for_reaction(record.options, str(relates.get("key", ""))) if record is not None else None
        if record is None or option is None:
            return  # an emoji that names no option: not an answer
        result = await self._submit(request_id, str(source.get("sender")), AnswerSubmission(option_id=option.id))
        await self._tell(room_id, source, record, result, f"Recorded: {option.label}")

    async def _on_poll_response(
        self, room_id: str, source: dict[str, Any], kind: str, content: dict[str, Any], relates: dict[str, Any]
    ) -> None:
        request_id = await self._refs.get(ref_key("matrix", "event", str(relates.get("event_id"))))
        selected = poll_selection(kind, content)
        if request_id is None or selected is None:
            return  # a response to another poll, or one that selects nothing (a retraction)
        record = await self._record(request_id)
        option = record.option(selected) if record is not None else None
        if record is None or option is None:
            return  # an answer id the request does not offer: not an answer
        result = await self._submit(request_id, str(source.get("sender")), AnswerSubmission(option_id=option.id))
        await self._tell(room_id, source, record, result, f"Recorded: {option.label}")

    async def _on_text(
        self, room_id: str, source: dict[str, Any], record: HumanRequestRecord, text: str, sender: str
    ) -> None:
        if not text:
            return
        chosen = option_choice(record, text)
        if isinstance(chosen, NoSuchOption):
            await self._notice(room_id, source, no_such_option_text(record, chosen), about=record.request_id)
            return
        option = chosen
        submission = (
            AnswerSubmission(option_id=option.id) if option is not None else AnswerSubmission(text=text[:MAX_TEXT])
        )
        result = await self._submit(record.request_id, sender, submission)
        recorded = result.record.answer if result is not None and result.record is not None else None
        quoted = recorded.value if isinstance(recorded, TextAnswer) else text
        await self._tell(room_id, source, record, result, f"Recorded {recorded_as(record, option, quoted)}")

    async def _submit(self, request_id: str, sender: str, submission: AnswerSubmission) -> InboundResult | None:
        try:
            return await self.submit(InboundAnswer(self.name, request_id, sender, submission))
        except Exception as exc:
            log.warning("matrix.answer_failed", request_id=request_id, error=repr(exc))
            return None

    async def _tell(
        self,
        room_id: str,
        source: dict[str, Any],
        record: HumanRequestRecord,
        result: InboundResult | None,
        ok: str,
    ) -> None:
        """Answer the responder with a notice replying to their event, naming the question it was about."""
        if result is None:
            text = _TRY_AGAIN
        elif result.refused is not None:
            text = refusal_text(result.refused, result.responder)
        elif result.already_recorded:
            text = f"Already {ok[0].lower()}{ok[1:]}"
        else:
            text = ok
        name = question_name(record)
        await self._notice(room_id, source, text if name in text else f"{name} — {text}", about=record.request_id)

    async def _notice(self, room_id: str, source: dict[str, Any], text: str, *, about: str | None = None) -> str:
        """A notice to the sender of ``source``, replying to it (sent once per event: its transaction id); its event
        id. ``about``: the request it is about (a confirmation, a refusal): kept as its question's event is
        (``matrix.event.<event id>``), so a reply to the notice is a reply to that request."""
        sender = str(source.get("sender"))
        content = {
            "msgtype": "m.notice",
            "body": f"{sender}: {text}",
            "m.relates_to": {"m.in_reply_to": {"event_id": source.get("event_id")}},
        }
        tx = re.sub(r"[^A-Za-z0-9_-]", "_", f"t-{source.get('event_id')}")
        event_id = await self._send(room_id, "m.room.message", content, tx_id=tx)
        if about is not None:
            await self._refs.claim(ref_key("matrix", "event", event_id), about)
        return event_id


def _open(asked: list[HumanRequestRecord]) -> list[HumanRequestRecord]:
    """The open ones of ``asked``, newest first."""
    return sorted((r for r in asked if r.pending), key=lambda r: (r.created_at, r.request_id), reverse=True)
