"""A person on the test homeserver: a matrix-nio client that joins the rooms it is invited to, reacts,
replies, and waits (bounded) for what the bot sent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from nio import AsyncClient, AsyncClientConfig, SyncResponse  # type: ignore[import-untyped]

from temporality_bus import Bus
from temporality_human_interaction.channels import ChannelAdapter
from temporality_human_interaction.channels.matrix import MatrixAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.mirror import ChannelMirror
from temporality_human_interaction.requests import RequestHandler
from temporality_testing.synapse import MatrixAccount, Synapse

Event = dict[str, Any]


class MatrixPerson:
    def __init__(self, homeserver: str, account: MatrixAccount) -> None:
        self.account = account
        self.client = AsyncClient(homeserver, account.user_id, config=AsyncClientConfig(encryption_enabled=False))
        self.client.access_token = account.access_token
        self.client.user_id = account.user_id
        self.client.device_id = account.device_id
        #: Every timeline event seen since :meth:`start`, as ``(room_id, event source)``.
        self.seen: list[tuple[str, Event]] = []
        self.joined: set[str] = set()

    async def start(self) -> MatrixPerson:
        first = await self.client.sync(timeout=0, full_state=True)  # history before the test is not looked at
        assert isinstance(first, SyncResponse), first
        return self

    async def close(self) -> None:
        await self.client.close()

    async def _sync_once(self, timeout_ms: int = 500) -> None:
        # a room joined late hands over its latest events only (10 by default): a question with ten options and their
        # ten reactions would be out of the window
        response = await self.client.sync(timeout=timeout_ms, sync_filter={"room": {"timeline": {"limit": 100}}})
        if not isinstance(response, SyncResponse):
            return
        for room_id in response.rooms.invite:
            if room_id not in self.joined:
                await self.client.join(room_id)
                self.joined.add(room_id)
        for room_id, room in response.rooms.join.items():
            self.joined.add(room_id)
            for event in room.timeline.events:
                if isinstance(getattr(event, "source", None), dict):
                    self.seen.append((room_id, event.source))

    async def wait_for(
        self, where: Callable[[str, Event], bool], *, within_s: float = 20.0, what: str = "an event"
    ) -> tuple[str, Event]:
        """The first seen ``(room_id, event)`` for which ``where`` holds; syncs until it appears or ``within_s``."""
        try:
            async with asyncio.timeout(within_s):
                while True:
                    for room_id, event in self.seen:
                        if where(room_id, event):
                            return room_id, event
                    await self._sync_once()
        except TimeoutError:
            raise AssertionError(f"{self.account.user_id} waited {within_s}s for {what}") from None

    async def wait_for_question(self, bot: str, title: str, *, within_s: float = 20.0) -> tuple[str, Event]:
        def question(_room: str, event: Event) -> bool:
            content = event.get("content") or {}
            return (
                event.get("sender") == bot
                and event.get("type") == "m.room.message"
                and "m.relates_to" not in content
                and title in str(content.get("body", ""))
            )

        return await self.wait_for(question, within_s=within_s, what=f"the question {title!r}")

    async def wait_for_edit_of(self, event_id: str, *, within_s: float = 20.0) -> Event:
        def edit(_room: str, event: Event) -> bool:
            relates = (event.get("content") or {}).get("m.relates_to") or {}
            return relates.get("rel_type") == "m.replace" and relates.get("event_id") == event_id

        return (await self.wait_for(edit, within_s=within_s, what=f"an edit of {event_id}"))[1]

    async def wait_for_reply_to(self, event_id: str, *, sender: str, within_s: float = 20.0) -> Event:
        def reply(_room: str, event: Event) -> bool:
            relates = (event.get("content") or {}).get("m.relates_to") or {}
            return event.get("sender") == sender and (relates.get("m.in_reply_to") or {}).get("event_id") == event_id

        return (await self.wait_for(reply, within_s=within_s, what=f"a reply to {event_id}"))[1]

    async def send(self, room_id: str, event_type: str, content: Event) -> str:
        response = await self.client.room_send(room_id, event_type, content)
        event_id = getattr(response, "event_id", None)
        assert event_id, response
        return str(event_id)

    async def react(self, room_id: str, event_id: str, key: str) -> str:
        relates = {"rel_type": "m.annotation", "event_id": event_id, "key": key}
        return await self.send(room_id, "m.reaction", {"m.relates_to": relates})

    async def reply(self, room_id: str, event_id: str, text: str) -> str:
        content = {
            "msgtype": "m.text",
            "body": f"> <someone> the question\n\n{text}",
            "m.relates_to": {"m.in_reply_to": {"event_id": event_id}},
        }
        return await self.send(room_id, "m.room.message", content)

    async def say(self, room_id: str, text: str) -> str:
        return await self.send(room_id, "m.room.message", {"msgtype": "m.text", "body": text})


@contextlib.asynccontextmanager
async def alice_on_matrix(
    bus: Bus, synapse: Synapse, matrix_accounts: dict[str, MatrixAccount], *, mirror: ChannelMirror | None = None
) -> AsyncIterator[RequestHandler]:
    """The Matrix adapter under test (the bot) running, with alice in the directory reachable on Matrix only
    (``mirror``: the service's mirror of ``human-channels`` handed to it); yields the request handler that delivers
    to it."""
    directory = Directory.from_mapping(
        {
            "users": {
                "alice": {
                    "display_name": "Alice Example",
                    "preferred": "matrix",
                    "channels": {"matrix": {"user_id": matrix_accounts["alice"].user_id}},
                }
            }
        }
    )
    adapters: dict[str, ChannelAdapter] = {}
    matrix = MatrixAdapter(
        bus,
        homeserver=synapse.url,
        user_id=matrix_accounts["bot"].user_id,
        password=matrix_accounts["bot"].password,
        sync_timeout_s=5,
        mirror=mirror,
    )
    matrix.attach(AnswerRouter(bus, directory, adapters))
    async with matrix:
        assert matrix.available
        adapters[matrix.name] = matrix
        yield RequestHandler(bus, directory, adapters)
