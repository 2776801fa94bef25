"""The Telegram adapter (python-telegram-bot 22), embedded in the service's event loop (HUM-3).

Lifecycle: :meth:`initialize` builds the ``Application`` (``base_url`` configurable, so tests point it
at :mod:`temporality_testing.telegram_emulator`), then ``initialize()`` (getMe) and ``start()`` (the
dispatcher): from here the adapter sends. The updater's ``start_polling`` (long-poll ``getUpdates``) runs only
while this replica holds the Telegram polling lease (:mod:`.lease`, issue 11: Telegram gives one poller a bot's
updates; without a lease it always polls) — never ``run_polling``, which would take over the loop and the
signals. :meth:`shutdown` stops polling, releases the lease, then stops the rest. If that start fails (the Bot API
cannot be reached, or refuses the token), the service still starts, like the Matrix adapter: Telegram is
unavailable (delivery goes to each profile's next channel), ``telegram.start_failed`` is logged (the token
scrubbed: python-telegram-bot puts it into its ``InvalidToken`` message) and a background task tries again
(1, 2, 5, 10, then every 30 s) until it is up.

Outbound:

* **question**: the compact text (:mod:`.render`) with an inline keyboard, one button per option.
  Each button's ``callback_data`` is ``<token>:<n>``: ``token`` is a short random (72-bit,
  URL-safe) token bound to the request in KV (``telegram.token.<token>`` -> request id, claimed
  before the message is sent; ``telegram.req.<request id>`` keeps the same token for a redelivery),
  ``n`` the option's number. The raw request id never appears in the chat. After the send,
  ``telegram.msg.<chat>.<message id>`` -> request id binds replies.
* **update**: the question edited to end with the outcome line, its keyboard removed.
* **notify**: a plain message.

Inbound (handed to :meth:`ChannelAdapter.submit`, the channel-neutral binding):

* a **button press** binds that option; the press is answered (``answerCallbackQuery``) with
  "Recorded" or, shown as an alert, why it was refused: an unknown or stale token, the request
  already answered / expired / cancelled, or the presser is not the recipient;
* a **reply** to the question message binds free text; a reply that names an option (its number as people type
  it, its id or label: :func:`.render.option_choice`) binds that option; a number that is no option is refused. A
  reply to the bot's own reply about a request (a confirmation, a refusal: kept under ``telegram.msg`` like the
  question) is a reply to that request, as is a reply to a hint naming one open question (kept the same way); to a
  hint listing several questions (``telegram.hint``), the hint again;
  to another message of the bot's, a hint. An **edited message** is never bound: the person is told. A message that replies to no question binds the same way to the one question open in
  the person's private chat (``telegram.msg.<chat>.*``); with none or several open (or in a group chat) it gets a
  hint listing them. Each gets a text reply naming the question. Which are open there: from the service's mirror of
  ``human-channels`` (:func:`.mirror.chat_questions`: the chat's keys from its index, and only the records of the
  requests whose run entry is not marked ended, so a chat's ended questions cost no read), else a listing of the
  chat's keys and a read of each key and of each request's record. The confirmation says how the answer was taken
  (``as option 2 “Drop v1”`` / ``in your own words: “…”``).

Every text fits Telegram's limits (:mod:`.render`): the question and its outcome edit 4,096 characters
(:func:`.render.fitted` cuts the least important parts first), a reply 4,096, a callback answer 200.
* ``/start`` (the Start button a person presses once) is answered with what the chat is for and their
  Telegram id, the ``chat_id`` their profile needs.

The responder's identity is the Telegram user id (``from.id``), which the directory maps to a person
(``channels.telegram.chat_id``, the private chat id, equals it). The bot token is a secret: it is
never logged, and httpx's request log (which prints URLs, token included) is kept at WARNING.

Sent once: the Bot API has no idempotency key and no way to list what a bot sent, so the message id is
claimed under ``telegram.sent.<request id>.<tag>.<chat>`` the moment ``sendMessage`` returns, and a
redelivered delivery (the request handler crashed or lost its compare-and-set before recording the copy)
finds it and reuses that message instead of sending another. The bound: only a crash in the one KV write
between ``sendMessage`` returning and that claim (or the KV being unreachable right then) sends the
question a second time; both copies carry the same token, so either binds, and only the recorded one is
edited to show the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Sequence
from typing import ClassVar

import structlog
from telegram import CallbackQuery, InlineKeyboardButton, InlineKeyboardMarkup, Message, Update
from telegram.error import BadRequest, TelegramError
from telegram.ext import Application, CallbackQueryHandler, CommandHandler, ContextTypes, MessageHandler, filters

from temporality_bus import Bus
from temporality_bus.tasks import cancel_and_wait
from temporality_human_interaction.answers import AnswerSubmission
from temporality_human_interaction.channels.base import (
    ChannelAdapter,
    DeliveryFailed,
    DeliveryReceipt,
    InboundAnswer,
    InboundResult,
)
from temporality_human_interaction.channels.lease import InboundLease
from temporality_human_interaction.channels.refs import ChannelRefs, ref_key
from temporality_human_interaction.channels.render import (
    EDIT_IGNORED,
    NOT_GUESSED,
    NOT_PLACED,
    TELEGRAM_CALLBACK_TEXT_LIMIT,
    TELEGRAM_TEXT_LIMIT,
    NoSuchOption,
    clip_message,
    fitted,
    no_such_option_text,
    option_choice,
    option_number,
    outcome_text,
    question_name,
    question_text,
    recorded_as,
    refusal_text,
    telegram_size,
)
from temporality_human_interaction.directory import UserProfile
from temporality_human_interaction.mirror import ChannelMirror, chat_questions
from temporality_human_interaction.records import HumanRequestRecord, SentCopy, open_store
from temporality_protocol import TextAnswer
from temporality_protocol.events import MAX_TEXT

__all__ = ["TelegramAdapter", "sent_message_key"]

log = structlog.get_logger(__name__)


def sent_message_key(request_id: str, tag: str, chat_id: int | str) -> str:
    """``telegram.sent.<request id>.<tag>.<chat>``: the message id a send (question ``q``, ``reask-<n>``,
    ``escalation``) of a request got in a chat, claimed right after ``sendMessage`` returned."""
    return ref_key("telegram", "sent", request_id, tag or "q", chat_id)


#: Seconds between attempts to start when Telegram could not be reached (or refused the token) at start.
_RETRY_S: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 30.0)

#: What a person is told when the bus did not answer while their answer was being bound.
_TRY_AGAIN = "Your answer could not be recorded right now. Please try again in a moment."
_HINT = "tap an option below"
#: What a message that is no answer to a question is told (then which questions are open, if any).
_HOW_TO_ANSWER = "To answer a question, reply to the question's message (or tap an option)."
#: A hint lists at most this many open questions.
_LISTED = 5


class TelegramAdapter(ChannelAdapter):
    name: ClassVar[str] = "telegram"

    def __init__(
        self,
        bus: Bus,
        *,
        token: str,
        base_url: str,
        poll_timeout_s: float = 10.0,
        retry_s: Sequence[float] = _RETRY_S,
        lease: InboundLease | None = None,
        mirror: ChannelMirror | None = None,
    ) -> None:
        self._bus = bus
        #: ``human-channels`` as this replica's watch sees it: a bare message's look-up of the chat's open questions
        #: reads it instead of listing the chat's keys (:func:`.mirror.chat_questions`); None: the listing.
        self._mirror = mirror
        self._token = token
        self._base_url = base_url
        self._poll_timeout_s = poll_timeout_s
        self._retry_s = tuple(retry_s) or _RETRY_S
        self._refs = ChannelRefs(bus)
        self._app: Application | None = None  # type: ignore[type-arg]
        self._running = False
        self._retrying: asyncio.Task[None] | None = None
        #: Who may poll (issue 11): None polls whenever the adapter runs (one replica); else only the holder.
        self._lease = lease
        self._polling_lock = asyncio.Lock()
        if lease is not None:
            lease.on_change = self._sync_polling

    @property
    def available(self) -> bool:
        return self._running

    @property
    def polling(self) -> bool:
        """Whether this adapter long-polls ``getUpdates`` now (runs the inbound side)."""
        return self._app is not None and self._app.updater is not None and self._app.updater.running

    async def initialize(self) -> None:
        if self._app is not None:
            return
        logging.getLogger("httpx").setLevel(logging.WARNING)  # its INFO line prints the URL with the token
        app = Application.builder().token(self._token).base_url(self._base_url).build()
        app.add_handler(CallbackQueryHandler(self._on_button))
        app.add_handler(CommandHandler("start", self._on_start))
        app.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, self._on_text))
        app.add_error_handler(self._on_error)
        self._app = app
        try:
            await self._start(app)
        except Exception as exc:  # Telegram down, or the token refused: run without Telegram, keep trying
            log.warning("telegram.start_failed", error=self._scrubbed(exc), base_url=self._base_url)
            self._retrying = asyncio.create_task(self._keep_starting(app), name="telegram-start")
        if self._lease is not None:
            await self._lease.start()  # polls once it holds the lease (and the bot is up)

    async def _start(self, app: Application) -> None:  # type: ignore[type-arg]
        """getMe, the dispatcher, then polling (deleteWebhook + getUpdates) if this replica is to poll: each
        step only if not done yet (a retry goes on)."""
        await app.initialize()  # returns at once when it already succeeded
        if not app.running:
            await app.start()
        self._running = True
        log.info("telegram.started", bot=app.bot.username, base_url=self._base_url)
        await self._sync_polling()

    async def _sync_polling(self) -> None:
        """Poll exactly while the bot is up and this replica holds the inbound lease (or there is no lease)."""
        async with self._polling_lock:
            app = self._app
            if app is None or app.updater is None:
                return
            want = self._running and (self._lease is None or self._lease.held)
            if want and not app.updater.running:
                await app.updater.start_polling(timeout=int(self._poll_timeout_s), poll_interval=0.0)
                log.info("telegram.polling", lease=self._lease.holder if self._lease else None)
            elif not want and app.updater.running:
                await app.updater.stop()  # confirms the updates handled so far: the next poller goes on from there
                log.info("telegram.polling_stopped", lease=self._lease.holder if self._lease else None)

    async def _keep_starting(self, app: Application) -> None:  # type: ignore[type-arg]
        failures = 0
        while self._app is app and not self._running:
            await asyncio.sleep(self._retry_s[min(failures, len(self._retry_s) - 1)])  # backoff, not a test wait
            try:
                await self._start(app)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                log.warning("telegram.start_failed", error=self._scrubbed(exc), attempt=failures + 1)

    def _scrubbed(self, exc: BaseException) -> str:
        """The error as text without the bot token (PTB's ``InvalidToken`` quotes it)."""
        return (str(exc) or type(exc).__name__).replace(self._token, "<token>")

    async def shutdown(self) -> None:
        retrying, self._retrying = self._retrying, None
        if retrying is not None:
            with contextlib.suppress(Exception):  # it logs its own failures
                await cancel_and_wait(retrying)
        if self._lease is not None:
            await self._lease.stop()  # stops polling (on_change), then lets another replica take over at once
        async with self._polling_lock:
            app, self._app = self._app, None
            self._running = False
        if app is None:
            return
        if app.updater is not None and app.updater.running:
            await app.updater.stop()
        if app.running:
            await app.stop()
        await app.shutdown()
        await app.bot.shutdown()  # a start that failed in getMe left the bot's HTTP clients open (else a no-op)
        log.info("telegram.stopped")

    def _bot_app(self) -> Application:  # type: ignore[type-arg]
        if self._app is None:
            raise DeliveryFailed("the Telegram adapter is not running")
        return self._app

    # ------------------------------------------------------------------ outbound
    async def do_deliver(
        self, request: HumanRequestRecord, profile: UserProfile, *, banner: str | None = None, tag: str = ""
    ) -> DeliveryReceipt:
        assert profile.channels.telegram is not None  # reaches() checked it
        chat_id = profile.channels.telegram.chat_id
        sent_key = sent_message_key(request.request_id, tag, chat_id)
        if (sent := await self._refs.get(sent_key)) is not None:
            # sent before, its copy not recorded (a crash or a lost CAS after the send): the same message, not a new one
            log.info("telegram.already_sent", chat_id=chat_id, message_id=sent, tag=tag)
            return DeliveryReceipt(channel=self.name, reference=sent, address=str(chat_id))
        token = await self._refs.claim(ref_key("telegram", "req", request.request_id), secrets.token_urlsafe(9))
        await self._refs.claim(ref_key("telegram", "token", token), request.request_id)
        keyboard = [
            [InlineKeyboardButton(f"{n}. {option.label}"[:64], callback_data=f"{token}:{n}")]
            for n, option in enumerate(request.options, start=1)
        ]
        text = fitted(
            request,
            lambda r, note: question_text(r, hint=_HINT, banner=banner, note=note),
            telegram_size,
            TELEGRAM_TEXT_LIMIT,
            inbox_url=self.inbox_url,
        )
        try:
            message = await self._bot_app().bot.send_message(
                chat_id=chat_id,
                text=text,
                reply_markup=InlineKeyboardMarkup(keyboard) if keyboard else None,
            )
        except TelegramError as exc:
            raise DeliveryFailed(f"Telegram refused the question for chat {chat_id}: {exc}") from exc
        await self._refs.claim(sent_key, str(message.message_id))  # first thing after the send: see the docstring
        await self._refs.claim(ref_key("telegram", "msg", chat_id, message.message_id), request.request_id)
        return DeliveryReceipt(channel=self.name, reference=str(message.message_id), address=str(chat_id))

    async def do_update(self, request: HumanRequestRecord, copy: SentCopy, responder_name: str | None) -> None:
        if copy.address is None:
            raise DeliveryFailed(f"the Telegram copy of {request.request_id} has no chat id")
        outcome = outcome_text(request, responder_name=responder_name)
        text = fitted(  # the outcome line counts too: the edited message fits as the question did
            request,
            lambda r, note: question_text(r, hint=_HINT, note=note) + "\n\n" + outcome,
            telegram_size,
            TELEGRAM_TEXT_LIMIT,
            inbox_url=self.inbox_url,
        )
        try:
            await self._bot_app().bot.edit_message_text(
                text=text, chat_id=int(copy.address), message_id=int(copy.reference), reply_markup=None
            )
        except BadRequest as exc:
            if "not modified" in str(exc).lower():
                return  # already shows this outcome (a repeated update)
            raise

    async def do_notify(self, profile: UserProfile, text: str, key: str) -> DeliveryReceipt:
        # the Bot API has no idempotency key: a resend after a crash before the marker is a second message
        assert profile.channels.telegram is not None
        chat_id = profile.channels.telegram.chat_id
        try:
            message = await self._bot_app().bot.send_message(chat_id=chat_id, text=text)
        except TelegramError as exc:
            raise DeliveryFailed(f"Telegram refused the notification for chat {chat_id}: {exc}") from exc
        return DeliveryReceipt(channel=self.name, reference=str(message.message_id), address=str(chat_id))

    # ------------------------------------------------------------------ inbound
    async def _on_button(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        query = update.callback_query
        if query is None:
            return
        token, _, number = (query.data or "").partition(":")
        request_id = await self._refs.get(ref_key("telegram", "token", token)) if token else None
        if request_id is None:
            await self._answer_query(query, "This button does not belong to any question I asked.", alert=True)
            return
        got = await (await open_store(self._bus)).get(request_id)
        option = None
        chosen = option_number(number)
        if got is not None and chosen is not None and 1 <= chosen <= len(got.value.options):
            option = got.value.options[chosen - 1]
        if option is None:
            await self._answer_query(query, "This button is not one of the question's options.", alert=True)
            return
        result = await self._submit(request_id, query.from_user.id, AnswerSubmission(option_id=option.id))
        if result is None:
            await self._answer_query(query, _TRY_AGAIN, alert=True)
        elif result.refused is not None:
            await self._answer_query(query, refusal_text(result.refused, result.responder), alert=True)
        else:
            prefix = "Already recorded" if result.already_recorded else "Recorded"
            await self._answer_query(query, f"{prefix}: {option.label}")

    @staticmethod
    async def _answer_query(query: CallbackQuery, text: str, *, alert: bool = False) -> None:
        """``answerCallbackQuery`` with ``text`` cut to Telegram's 200 characters (longer is refused: the person
        would see the button spin)."""
        await query.answer(clip_message(text, TELEGRAM_CALLBACK_TEXT_LIMIT), show_alert=alert)

    async def _on_start(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """``/start`` (the Start button, which a person must press once before the bot may write to them): say
        what this chat is for and the person's Telegram id, the ``chat_id`` their directory profile needs."""
        message = update.effective_message
        if message is None or message.from_user is None:
            return
        await message.reply_text(
            f"Hello {message.from_user.first_name}. I am Temporality's bot: questions and notifications for you "
            f"arrive in this chat, and you answer them here.\nYour Telegram id is {message.from_user.id}. "
            "Whoever manages Temporality's user directory puts it into your profile "
            f"(channels: {{telegram: {{chat_id: {message.from_user.id}}}}})."
        )

    async def _on_text(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.effective_message
        if message is None or message.from_user is None or not message.text:
            return
        if update.edited_message is not None or update.edited_channel_post is not None:
            await self._on_edit(message)  # never an answer: the person is told so
            return
        replied = message.reply_to_message
        record: HumanRequestRecord | None = None
        if replied is not None:
            # a question, a reminder, an escalation, or the bot's reply about one (a confirmation, a refusal)
            request_id = await self._refs.get(ref_key("telegram", "msg", message.chat_id, replied.message_id))
            record = await self._record(request_id) if request_id is not None else None
            if record is None and await self._about_no_one_question(message, replied):
                return
        if record is None:
            # not a reply to a question: in the person's own chat with the bot, the one open question there takes it
            open_ = await self._open_questions(message.chat_id) if message.chat.type == "private" else []
            if len(open_) != 1:
                await self._send_hint(message, open_)
                return
            record = open_[0]
        chosen = option_choice(record, message.text)
        if isinstance(chosen, NoSuchOption):
            await self._reply(message, no_such_option_text(record, chosen), about=record.request_id)
            return
        option = chosen
        submission = (
            AnswerSubmission(option_id=option.id)
            if option is not None
            else AnswerSubmission(text=message.text[:MAX_TEXT])
        )
        result = await self._submit(record.request_id, message.from_user.id, submission)
        if result is None:
            await self._reply(message, _TRY_AGAIN, about=record.request_id)
        elif result.refused is not None:
            await self._reply(message, refusal_text(result.refused, result.responder), about=record.request_id)
        else:
            recorded = result.record.answer if result.record is not None else None
            text = recorded.value if isinstance(recorded, TextAnswer) else message.text
            prefix = "Already recorded" if result.already_recorded else "Recorded"
            what = recorded_as(record, option, text)
            await self._reply(message, f"{prefix} for {question_name(record)} {what}.", about=record.request_id)

    async def _about_no_one_question(self, message: Message, replied: Message) -> bool:
        """A reply to a message of the bot's that is about no one question: a hint listing several (answered with
        the hint again, never bound to one of them), or one this service cannot place (sent before it kept what
        its messages are about): told how to answer. True when it was answered here."""
        listed = await self._refs.get(ref_key("telegram", "hint", message.chat_id, replied.message_id))
        from_bot = replied.from_user is not None and replied.from_user.is_bot
        if listed is None and not from_bot:
            return False  # a reply to the person's own message (or someone else's): as a plain message
        open_ = await self._open_questions(message.chat_id) if message.chat.type == "private" else []
        lead = NOT_GUESSED if listed is not None else NOT_PLACED
        await self._send_hint(message, open_, lead=lead)
        return True

    async def _on_edit(self, message: Message) -> None:
        """An edited message: never bound (it would bind to whatever question is open now, not the one the original
        answered), and a recorded answer is never changed. The person is told so, and how to answer."""
        open_ = await self._open_questions(message.chat_id) if message.chat.type == "private" else []
        await self._send_hint(message, open_, lead=EDIT_IGNORED)

    async def _send_hint(self, message: Message, open_: list[HumanRequestRecord], *, lead: str = "") -> None:
        """Reply with how to answer and which questions are open (:func:`_hint`). A hint naming one question is kept
        about it (``telegram.msg.<chat>.<message id>``, like a confirmation), so a reply to it -- what the hint
        invites -- answers that question; one listing several is remembered (``telegram.hint.<chat>.<message id>``),
        so a reply to it is not bound to one of them."""
        sent = await self._reply(message, _hint(open_, lead), about=open_[0].request_id if len(open_) == 1 else None)
        if sent is not None and len(open_) > 1:
            key = ref_key("telegram", "hint", sent.chat_id, sent.message_id)
            await self._refs.claim(key, open_[0].request_id)  # purged with that request (the retention sweep)

    async def _reply(self, message: Message, text: str, *, about: str | None = None) -> Message | None:
        """Reply to ``message`` with ``text`` cut to Telegram's 4,096 characters (a form's refusal can be long).
        ``about``: the request the reply is about (a confirmation, a refusal): kept as its message is
        (``telegram.msg.<chat>.<message id>``), so a reply to this one is a reply to that request."""
        sent = await message.reply_text(clip_message(text, TELEGRAM_TEXT_LIMIT), do_quote=True)
        if about is not None and sent is not None:
            try:
                await self._refs.claim(ref_key("telegram", "msg", sent.chat_id, sent.message_id), about)
            except Exception as exc:  # the reply was sent: a reply to it then gets a hint instead
                log.warning("telegram.reply_not_kept", request_id=about, error=repr(exc))
        return sent

    async def _record(self, request_id: str) -> HumanRequestRecord | None:
        got = await (await open_store(self._bus)).get(request_id)
        return got.value if got is not None else None

    async def _open_questions(self, chat_id: int) -> list[HumanRequestRecord]:
        """The questions sent to ``chat_id`` that are still open, newest first (from ``telegram.msg.<chat>.*``:
        every question, reminder and escalation sent there, until the retention purges its request). With the
        mirror, only the records of those whose run entry is not marked ended are read (:func:`.mirror.chat_questions`)."""
        asked = await chat_questions(self._refs, self._mirror, ref_key("telegram", "msg", chat_id))
        records = [r for r in await asyncio.gather(*(self._record(i) for i in asked.candidates)) if r is not None]
        return sorted((r for r in records if r.pending), key=lambda r: (r.created_at, r.request_id), reverse=True)

    async def _submit(self, request_id: str, user_id: int, submission: AnswerSubmission) -> InboundResult | None:
        """Hand the answer to the binding; None when the bus failed (the person is asked to try again)."""
        try:
            return await self.submit(InboundAnswer(self.name, request_id, str(user_id), submission))
        except Exception as exc:
            log.warning("telegram.answer_failed", request_id=request_id, error=repr(exc))
            return None

    async def _on_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        log.warning("telegram.handler_error", error=repr(context.error))


def _hint(open_: list[HumanRequestRecord], lead: str = "") -> str:
    """How to answer, for a message that is no answer to one question: which questions are open here, if any
    (each with its run in short: two runs may ask about the same thing); ``lead``: why it is no answer."""
    lead = f"{lead} " if lead else ""
    if not open_:
        return f"{lead}{_HOW_TO_ANSWER} There is no open question here right now."
    names = ", ".join(question_name(r, with_run=True) for r in open_[:_LISTED])
    more = f" and {len(open_) - _LISTED} more" if len(open_) > _LISTED else ""
    if len(open_) == 1:
        return f"{lead}{_HOW_TO_ANSWER} One question is open here: {names}; a plain message answers it."
    return f"{lead}{_HOW_TO_ANSWER} {len(open_)} questions are open here: {names}{more}."
