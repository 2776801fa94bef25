"""The Telegram Bot API emulator speaks the real wire format (what python-telegram-bot 22 sends and expects)."""

from __future__ import annotations

import asyncio
import json

import httpx

from temporality_testing.telegram_emulator import BOT_ID, TelegramEmulator, TelegramUser

ALICE = TelegramUser(1001, "Alice")


async def _call(client: httpx.AsyncClient, tg: TelegramEmulator, method: str, **params: object) -> httpx.Response:
    data = {k: json.dumps(v) if isinstance(v, dict | list) else str(v) for k, v in params.items()}
    return await client.post(f"{tg.base_url}{tg.token}/{method}", data=data)  # form-encoded, like PTB


async def test_envelope_errors_and_get_me() -> None:
    async with TelegramEmulator().serve() as tg, httpx.AsyncClient(timeout=10) as client:
        me = (await _call(client, tg, "getMe")).json()
        assert me == {"ok": True, "result": {"id": BOT_ID, "is_bot": True, "first_name": "Temporality",
                                             "username": tg.bot_username}}  # fmt: skip
        assert (await _call(client, tg, "deleteWebhook")).json() == {"ok": True, "result": True}
        wrong = await client.post(f"{tg.base_url}0:wrong/getMe")
        assert (wrong.status_code, wrong.json()["error_code"]) == (401, 401)
        unknown = await _call(client, tg, "sendDice", chat_id=1)
        assert unknown.json() == {"ok": False, "error_code": 404, "description": "Not Found"}


async def test_send_edit_and_the_not_modified_error() -> None:
    async with TelegramEmulator().serve() as tg, httpx.AsyncClient(timeout=10) as client:
        keyboard = {"inline_keyboard": [[{"text": "1. Yes", "callback_data": "tok:1"}]]}
        sent = (await _call(client, tg, "sendMessage", chat_id=ALICE.id, text="Q?", reply_markup=keyboard)).json()
        message = sent["result"]
        assert message["chat"] == {"id": ALICE.id, "type": "private"}
        assert isinstance(message["date"], int)
        assert message["date"] < 10**11
        assert tg.buttons(message) == [{"text": "1. Yes", "callback_data": "tok:1"}]
        edited = await _call(
            client, tg, "editMessageText", chat_id=ALICE.id, message_id=message["message_id"], text="A"
        )
        assert edited.json()["result"]["text"] == "A"
        assert tg.buttons(message) == []  # an edit without reply_markup removes the keyboard
        same = await _call(client, tg, "editMessageText", chat_id=ALICE.id, message_id=message["message_id"], text="A")
        assert (same.status_code, same.json()["description"]) == (400, "Bad Request: message is not modified")
        tg.block(ALICE.id)
        blocked = await _call(client, tg, "sendMessage", chat_id=ALICE.id, text="again")
        assert blocked.json()["error_code"] == 403


async def test_the_bot_apis_limits_are_refused_like_the_real_api() -> None:
    """Message text 1-4,096 (UTF-16 code units), callback data 1-64 bytes, callback answer text 0-200: 400."""
    async with TelegramEmulator().serve() as tg, httpx.AsyncClient(timeout=10) as client:
        fits = await _call(client, tg, "sendMessage", chat_id=ALICE.id, text="x" * 4096)
        assert fits.json()["ok"] is True
        message = fits.json()["result"]
        long = await _call(client, tg, "sendMessage", chat_id=ALICE.id, text="x" * 4097)
        assert (long.status_code, long.json()["description"]) == (400, "Bad Request: message is too long")
        emoji = await _call(client, tg, "sendMessage", chat_id=ALICE.id, text="😀" * 2049)  # 4,098 UTF-16 units
        assert emoji.status_code == 400
        edit = await _call(
            client, tg, "editMessageText", chat_id=ALICE.id, message_id=message["message_id"], text="y" * 4097
        )
        assert (edit.status_code, edit.json()["description"]) == (400, "Bad Request: message is too long")
        assert tg.messages[(ALICE.id, message["message_id"])]["text"] == "x" * 4096  # unchanged

        too_much = {"inline_keyboard": [[{"text": "1", "callback_data": "é" * 33}]]}  # 66 bytes
        refused = await _call(client, tg, "sendMessage", chat_id=ALICE.id, text="Q?", reply_markup=too_much)
        assert (refused.status_code, refused.json()["description"]) == (400, "Bad Request: BUTTON_DATA_INVALID")
        just = {"inline_keyboard": [[{"text": "1", "callback_data": "d" * 64}]]}
        assert (await _call(client, tg, "sendMessage", chat_id=ALICE.id, text="Q?", reply_markup=just)).json()["ok"]

        answer = await _call(client, tg, "answerCallbackQuery", callback_query_id="cq-1", text="z" * 201)
        assert (answer.status_code, answer.json()["description"]) == (400, "Bad Request: MESSAGE_TOO_LONG")
        assert tg.callback_answers == []
        ok = await _call(client, tg, "answerCallbackQuery", callback_query_id="cq-1", text="z" * 200)
        assert ok.json() == {"ok": True, "result": True}


async def test_get_updates_long_polls_and_drops_updates_below_the_offset() -> None:
    async with TelegramEmulator().serve() as tg, httpx.AsyncClient(timeout=10) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        empty = (await _call(client, tg, "getUpdates", timeout=1)).json()
        assert empty == {"ok": True, "result": []}
        assert loop.time() - started >= 0.9  # it blocked for the timeout

        waiting = asyncio.create_task(_call(client, tg, "getUpdates", timeout=5))
        said = await tg.say(ALICE, "hello")
        updates = (await asyncio.wait_for(waiting, 5)).json()["result"]
        assert [u["message"]["text"] for u in updates] == ["hello"]
        first = updates[0]["update_id"]
        query = await tg.press(ALICE, said, "tok:1")
        both = (await _call(client, tg, "getUpdates", offset=first, timeout=0)).json()["result"]
        assert [u["update_id"] for u in both] == [first, first + 1]
        later = (await _call(client, tg, "getUpdates", offset=first + 1, timeout=0)).json()["result"]
        assert [u["callback_query"]["id"] for u in later] == [query]
        assert later[0]["callback_query"]["from"]["id"] == ALICE.id

        assert (await _call(client, tg, "answerCallbackQuery", callback_query_id=query, text="ok")).json()["result"]
        assert (await tg.wait_for_callback_answer(query))["text"] == "ok"
