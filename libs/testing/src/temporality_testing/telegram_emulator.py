"""A small Telegram Bot API emulator over real HTTP, for testing the Telegram channel adapter.

No real Bot API server can run here (TEST-PEERS.md), so the seam is faked at the wire: the bot under
test (python-telegram-bot) talks HTTP to ``POST /bot<token>/<method>`` on 127.0.0.1, with the real
request and response formats:

* every call is a POST, form-encoded (or JSON) string values; ``reply_markup`` is a JSON string;
* responses are ``{"ok": true, "result": ...}``; errors ``{"ok": false, "error_code": N, "description": ...}``
  (401 for a wrong token, 404 for an unknown method, 400 for a bad request such as an edit that
  changes nothing, 403 for a chat that blocked the bot);
* ``getMe`` (``id, is_bot, first_name, username``), ``deleteWebhook``, ``getUpdates`` (long poll:
  updates below ``offset`` are dropped, the call blocks up to ``timeout`` seconds), ``sendMessage``,
  ``editMessageText``, ``editMessageReplyMarkup``, ``answerCallbackQuery``;
* messages carry ``message_id``, ``date`` (unix seconds), ``chat {id, type}``, ``from``;
* the Bot API's documented limits, refused with 400 like the real API (so a bot that sends too much fails here
  as it would there): a message's text 1-4,096 characters (``sendMessage``, ``editMessageText``: "Bad Request:
  message is too long"; counted in UTF-16 code units, as Telegram counts entity offsets: never more lenient
  than the real server), an inline button's ``callback_data`` 1-64 bytes ("Bad Request: BUTTON_DATA_INVALID"),
  ``answerCallbackQuery``'s ``text`` 0-200 characters ("Bad Request: MESSAGE_TOO_LONG").

Test-side helpers act as people: :meth:`TelegramEmulator.press` (a button press, a ``callback_query``
update), :meth:`TelegramEmulator.reply` (a text reply to a message), :meth:`TelegramEmulator.say`
(plain text), :meth:`TelegramEmulator.edit` (a person edits their message: an ``edited_message`` update); and read what the bot did, waiting on a condition with a timeout:
:meth:`wait_for_message`, :meth:`wait_for_callback_answer`, :meth:`wait_for_edit`. Fault injection:
:meth:`block` makes ``sendMessage`` to a chat fail with 403 like a user who blocked the bot. Two pollers:
:attr:`TelegramEmulator.poll_overlaps` counts the ``getUpdates`` calls that began while another was open.

Usage::

    async with TelegramEmulator(token="123:abc").serve() as tg:
        Application.builder().token(tg.token).base_url(tg.base_url) ...
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from temporality_embedded.processes import free_port
from temporality_testing.asgi import served_asgi

__all__ = [
    "BOT_ID",
    "MAX_CALLBACK_DATA_BYTES",
    "MAX_CALLBACK_TEXT",
    "MAX_TEXT",
    "TelegramEmulator",
    "TelegramUser",
    "text_length",
]

BOT_ID = 7_000_001
Json = dict[str, Any]
#: The Bot API's limits (https://core.telegram.org/bots/api): message text, callback answer text, callback data.
MAX_TEXT = 4096
MAX_CALLBACK_TEXT = 200
MAX_CALLBACK_DATA_BYTES = 64


def text_length(text: str) -> int:
    """``text``'s length as the emulator checks it: UTF-16 code units (an emoji counts 2)."""
    return len(text.encode("utf-16-le")) // 2


@dataclass(frozen=True)
class TelegramUser:
    id: int
    first_name: str
    username: str | None = None

    def wire(self) -> Json:
        out: Json = {"id": self.id, "is_bot": False, "first_name": self.first_name}
        if self.username:
            out["username"] = self.username
        return out


class _ApiError(Exception):
    def __init__(self, code: int, description: str) -> None:
        super().__init__(description)
        self.code = code
        self.description = description


@dataclass
class TelegramEmulator:
    token: str = "4242:emulated-token"
    bot_username: str = "temporality_test_bot"
    port: int = 0
    #: Every API call as received: ``(method, params)``.
    calls: list[tuple[str, Json]] = field(default_factory=list)
    #: Current state of every message by ``(chat_id, message_id)``.
    messages: dict[tuple[int, int], Json] = field(default_factory=dict)
    #: Every ``answerCallbackQuery`` call's params, in order.
    callback_answers: list[Json] = field(default_factory=list)
    #: ``getUpdates`` calls being answered now, and how many began while another one was (two pollers of one
    #: bot: Telegram answers one of them ``409 Conflict``; a poll the client gave up on still counts until it ends).
    polls_in_flight: int = 0
    poll_overlaps: int = 0
    _updates: list[Json] = field(default_factory=list)
    _next_update: int = 1
    _next_message: int = 1
    _next_query: int = 1
    _blocked: set[int] = field(default_factory=set)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def base_url(self) -> str:
        """What python-telegram-bot's ``base_url`` takes: a call goes to ``<base_url><token>/<method>``."""
        return f"http://127.0.0.1:{self.port}/bot"

    def bot_user(self) -> Json:
        return {"id": BOT_ID, "is_bot": True, "first_name": "Temporality", "username": self.bot_username}

    # ------------------------------------------------------------------ the HTTP side
    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/bot{token}/{method}")
        async def call(token: str, method: str, request: Request) -> JSONResponse:
            params = _params(request.headers.get("content-type", ""), await request.body())
            self.calls.append((method, params))
            if token != self.token:
                return _error(401, "Unauthorized")
            handler = self._methods().get(method)
            if handler is None:
                return _error(404, "Not Found")
            try:
                result = await handler(params)
            except _ApiError as exc:
                return _error(exc.code, exc.description)
            return JSONResponse({"ok": True, "result": result})

        return app

    def _methods(self) -> dict[str, Callable[[Json], Any]]:
        return {
            "getMe": self._get_me,
            "deleteWebhook": self._true,
            "getUpdates": self._get_updates,
            "sendMessage": self._send_message,
            "editMessageText": self._edit_text,
            "editMessageReplyMarkup": self._edit_markup,
            "answerCallbackQuery": self._answer_callback,
        }

    async def _get_me(self, params: Json) -> Json:
        return self.bot_user()

    async def _true(self, params: Json) -> bool:
        return True

    async def _get_updates(self, params: Json) -> list[Json]:
        offset = int(params.get("offset") or 0)
        timeout = float(params.get("timeout") or 0)
        limit = int(params.get("limit") or 100)
        if offset:
            self._updates = [u for u in self._updates if u["update_id"] >= offset]  # confirmed: dropped
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        if self.polls_in_flight:
            self.poll_overlaps += 1
        self.polls_in_flight += 1
        try:
            async with self._changed:
                while not self._updates and not self._stopping.is_set():
                    left = until - loop.time()
                    if left <= 0:
                        break
                    try:
                        await asyncio.wait_for(self._changed.wait(), min(left, 0.5))
                    except TimeoutError:
                        continue
        finally:
            self.polls_in_flight -= 1
        return self._updates[:limit]

    async def _send_message(self, params: Json) -> Json:
        chat_id = _int(params, "chat_id")
        if chat_id in self._blocked:
            raise _ApiError(403, "Forbidden: bot was blocked by the user")
        text = params.get("text")
        if not text:
            raise _ApiError(400, "Bad Request: message text is empty")
        if text_length(str(text)) > MAX_TEXT:
            raise _ApiError(400, "Bad Request: message is too long")
        markup = _markup(params)
        message: Json = {
            "message_id": self._next_message,
            "date": int(time.time()),
            "chat": {"id": chat_id, "type": "private"},
            "from": self.bot_user(),
            "text": str(text),
        }
        self._next_message += 1
        if markup is not None:
            message["reply_markup"] = markup
        reply_to = params.get("reply_to_message_id")
        if reply_to is None and params.get("reply_parameters"):
            reply_to = json.loads(params["reply_parameters"]).get("message_id")
        if reply_to is not None and (chat_id, int(reply_to)) in self.messages:
            message["reply_to_message"] = self.messages[(chat_id, int(reply_to))]
        await self._store(message)
        return message

    async def _edit_text(self, params: Json) -> Json:
        message = self._existing(params)
        text = str(params.get("text") or "")
        if not text:
            raise _ApiError(400, "Bad Request: message text is empty")
        if text_length(text) > MAX_TEXT:
            raise _ApiError(400, "Bad Request: message is too long")
        markup = _markup(params)
        if text == message.get("text") and markup == message.get("reply_markup"):
            raise _ApiError(400, "Bad Request: message is not modified")
        edited = {**message, "text": text, "edit_date": int(time.time())}
        edited.pop("reply_markup", None)
        if markup is not None:
            edited["reply_markup"] = markup
        await self._store(edited)
        return edited

    async def _edit_markup(self, params: Json) -> Json:
        message = self._existing(params)
        edited = {**message, "edit_date": int(time.time())}
        edited.pop("reply_markup", None)
        markup = _markup(params)
        if markup is not None:
            edited["reply_markup"] = markup
        await self._store(edited)
        return edited

    async def _answer_callback(self, params: Json) -> bool:
        if not params.get("callback_query_id"):
            raise _ApiError(400, "Bad Request: query id is empty")
        if text_length(str(params.get("text") or "")) > MAX_CALLBACK_TEXT:
            raise _ApiError(400, "Bad Request: MESSAGE_TOO_LONG")
        self.callback_answers.append(params)
        await self._notify()
        return True

    def _existing(self, params: Json) -> Json:
        key = (_int(params, "chat_id"), _int(params, "message_id"))
        if key not in self.messages:
            raise _ApiError(400, "Bad Request: message to edit not found")
        return self.messages[key]

    async def _store(self, message: Json) -> None:
        self.messages[(message["chat"]["id"], message["message_id"])] = message
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _push(self, update: Json) -> Json:
        update = {"update_id": self._next_update, **update}
        self._next_update += 1
        self._updates.append(update)
        await self._notify()
        return update

    # ------------------------------------------------------------------ a person's side
    async def press(self, user: TelegramUser, message: Json, data: str) -> str:
        """``user`` presses the inline button with ``data`` under ``message``; returns the callback query id."""
        query_id = f"cq-{self._next_query}"
        self._next_query += 1
        current = self.messages.get((message["chat"]["id"], message["message_id"]), message)
        await self._push(
            {
                "callback_query": {
                    "id": query_id,
                    "from": user.wire(),
                    "chat_instance": f"ci-{current['chat']['id']}",
                    "message": current,
                    "data": data,
                }
            }
        )
        return query_id

    async def say(self, user: TelegramUser, text: str, *, reply_to: Json | None = None) -> Json:
        """``user`` writes ``text``: in their private chat with the bot, or, replying to a message, in that
        message's chat (a group the bot shares with several people, when it is not ``user``'s own)."""
        chat: Json = {"id": user.id, "type": "private", "first_name": user.first_name}
        if reply_to is not None and reply_to["chat"]["id"] != user.id:
            chat = {"id": reply_to["chat"]["id"], "type": "group", "title": "shared chat"}
        message: Json = {
            "message_id": self._next_message,
            "date": int(time.time()),
            "chat": chat,
            "from": user.wire(),
            "text": text,
        }
        if text.startswith("/"):  # a command: Telegram marks it as one (how a bot tells "/start" from text)
            message["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
        self._next_message += 1
        if reply_to is not None:
            message["reply_to_message"] = self.messages.get((reply_to["chat"]["id"], reply_to["message_id"]), reply_to)
        self.messages[(chat["id"], message["message_id"])] = message
        await self._push({"message": message})
        return message

    async def reply(self, user: TelegramUser, to: Json, text: str) -> Json:
        return await self.say(user, text, reply_to=to)

    async def edit(self, user: TelegramUser, message: Json, text: str) -> Json:
        """``user`` edits their own ``message`` (one :meth:`say` returned) to ``text``: an ``edited_message``
        update carrying the message as it is now (``edit_date`` set)."""
        key = (message["chat"]["id"], message["message_id"])
        current = self.messages.get(key, message)
        if current["from"]["id"] != user.id:
            raise ValueError(f"{user.first_name} cannot edit message {key}: not theirs")
        edited = {**current, "text": text, "edit_date": int(time.time())}
        self.messages[key] = edited
        await self._push({"edited_message": edited})
        return edited

    def block(self, chat_id: int) -> None:
        """From now on ``sendMessage`` to ``chat_id`` fails with 403 (the user blocked the bot)."""
        self._blocked.add(chat_id)

    def unblock(self, chat_id: int) -> None:
        """``sendMessage`` to ``chat_id`` works again (the user restarted the bot)."""
        self._blocked.discard(chat_id)

    def buttons(self, message: Json) -> list[Json]:
        """The inline buttons of ``message`` as it stands now, row by row flattened."""
        current = self.messages.get((message["chat"]["id"], message["message_id"]), message)
        rows = (current.get("reply_markup") or {}).get("inline_keyboard") or []
        return [button for row in rows for button in row]

    # ------------------------------------------------------------------ waiting on what the bot did
    async def wait_until(self, found: Callable[[], Any], *, within_s: float = 10.0, what: str = "condition") -> Any:
        """The first truthy ``found()``, re-checked on every change; AssertionError after ``within_s``."""
        try:
            async with asyncio.timeout(within_s), self._changed:
                while not (result := found()):
                    await self._changed.wait()
                return result
        except TimeoutError:
            raise AssertionError(f"telegram emulator: waited {within_s}s for {what}") from None

    async def wait_for_message(
        self, chat_id: int, where: Callable[[Json], bool] = lambda m: True, *, within_s: float = 10.0
    ) -> Json:
        """The first message the bot sent to ``chat_id`` matching ``where``."""

        def found() -> Json | None:
            for (chat, _), message in sorted(self.messages.items()):
                if chat == chat_id and message["from"]["id"] == BOT_ID and where(message):
                    return message
            return None

        result: Json = await self.wait_until(found, within_s=within_s, what=f"a bot message to {chat_id}")
        return result

    async def wait_for_edit(
        self, message: Json, where: Callable[[Json], bool] = lambda m: True, *, within_s: float = 10.0
    ) -> Json:
        """``message`` once the bot edited it (``edit_date`` set) and ``where`` holds for it."""
        key = (message["chat"]["id"], message["message_id"])

        def found() -> Json | None:
            current = self.messages.get(key)
            return current if current is not None and "edit_date" in current and where(current) else None

        result: Json = await self.wait_until(found, within_s=within_s, what=f"an edit of message {key}")
        return result

    async def wait_for_callback_answer(self, query_id: str, *, within_s: float = 10.0) -> Json:
        def found() -> Json | None:
            return next((a for a in self.callback_answers if a.get("callback_query_id") == query_id), None)

        result: Json = await self.wait_until(found, within_s=within_s, what=f"answerCallbackQuery {query_id}")
        return result

    # ------------------------------------------------------------------ lifecycle
    @asynccontextmanager
    async def serve(self) -> AsyncIterator[TelegramEmulator]:
        self.port = self.port or free_port()  # a port given in advance: a client told it before the server is up
        self._stopping = asyncio.Event()
        self._changed = asyncio.Condition()
        stopping = self._stopping

        async def wake() -> None:
            stopping.set()
            await self._notify()

        async with served_asgi(self.app(), self.port, lifespan="off", before_stop=wake):
            yield self


def _params(content_type: str, body: bytes) -> Json:
    if not body:
        return {}
    if content_type.startswith("application/json"):
        loaded = json.loads(body)
        return {
            k: v if isinstance(v, str) else json.dumps(v) if isinstance(v, dict | list) else v
            for k, v in loaded.items()
        }
    return dict(parse_qsl(body.decode(), keep_blank_values=True))


def _int(params: Json, name: str) -> int:
    try:
        return int(params[name])
    except (KeyError, ValueError):
        raise _ApiError(400, f"Bad Request: {name} is required") from None


def _markup(params: Json) -> Json | None:
    raw = params.get("reply_markup")
    if not raw:
        return None
    markup = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(markup, dict) or not markup.get("inline_keyboard"):
        return None  # an empty keyboard removes the buttons
    for row in markup["inline_keyboard"]:
        for button in row:
            data = button.get("callback_data")
            if data is not None and not 1 <= len(str(data).encode()) <= MAX_CALLBACK_DATA_BYTES:
                raise _ApiError(400, "Bad Request: BUTTON_DATA_INVALID")
    return markup


def _error(code: int, description: str) -> JSONResponse:
    return JSONResponse({"ok": False, "error_code": code, "description": description}, status_code=code)
