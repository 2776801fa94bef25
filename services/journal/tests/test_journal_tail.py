"""The live tail over Server-Sent Events, against the journal service on a real port and a real bus."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from journal_support import VIEWER

MakeStory = Callable[..., Any]  # conftest.RunStory
Served = Any  # conftest.ServedJournal


@dataclass
class Sse:
    id: str | None
    event: str | None
    data: Any
    comment: str | None


class SseReader:
    """Reads an open ``text/event-stream`` response one event (or comment block) at a time, bounded."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines = response.aiter_lines()

    async def next(self, within_s: float = 20.0) -> Sse:
        fields: dict[str, list[str]] = {}
        async with asyncio.timeout(within_s):
            async for line in self.lines:
                if line == "":
                    if fields:
                        data = "\n".join(fields["data"]) if "data" in fields else None
                        return Sse(
                            id=fields.get("id", [None])[-1],
                            event=fields.get("event", [None])[-1],
                            data=json.loads(data) if data is not None else None,
                            comment="\n".join(fields[""]) if "" in fields else None,
                        )
                    continue
                name, _, value = line.partition(":")
                fields.setdefault(name, []).append(value.removeprefix(" "))
        raise AssertionError("the stream ended")

    async def next_event(self, within_s: float = 20.0) -> Sse:
        """The next event with data (skipping keep-alive comments)."""
        async with asyncio.timeout(within_s):
            while True:
                item = await self.next(within_s)
                if item.data is not None:
                    return item


@asynccontextmanager
async def tail(served: Served, headers: dict[str, str] | None = None, **params: Any) -> AsyncIterator[SseReader]:
    """An open tail whose start position is fixed (its first comment was read)."""
    async with (
        httpx.AsyncClient(base_url=served.url, headers=VIEWER, timeout=30) as client,
        client.stream("GET", "/events/stream", params=params, headers=headers or {}) as response,
    ):
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        reader = SseReader(response)
        first = await reader.next()
        assert first.comment is not None
        assert first.comment.startswith("tail after ")
        yield reader


async def test_live_events_arrive_in_stream_order_with_their_sequence(served_journal: Served, story: MakeStory) -> None:
    a, b = story(), story()
    async with tail(served_journal) as everything, tail(served_journal, run_id=a.run_id) as only_a:
        sent = [a.requested(), b.requested(), a.started(), a.human_requested()]
        for event in sent:
            await served_journal.bus.publish(event)

        got = [await everything.next_event() for _ in sent]
        assert [(g.event, g.data["id"]) for g in got] == [(e.type, e.id) for e in sent]
        seqs = [int(g.id or "") for g in got]
        assert seqs == sorted(seqs)
        assert [g.data["stream_seq"] for g in got] == seqs
        assert got[3].data["data"]["question"] == "Merge it?"
        assert got[3].data["run_id"] == a.run_id

        mine = [await only_a.next_event() for _ in range(3)]
        assert [m.data["id"] for m in mine] == [sent[0].id, sent[2].id, sent[3].id]


async def test_resume_after_last_event_id_and_replay_from_the_start(served_journal: Served, story: MakeStory) -> None:
    s = story()
    sent = [s.requested(), s.started(), s.human_requested(), s.answered()]
    for event in sent:
        await served_journal.bus.publish(event)
    await served_journal.wait_recorded(sent[-1].id)
    await served_journal.wait_recorded(sent[0].id)

    async with tail(served_journal, after=0) as replay:
        got = [await replay.next_event() for _ in sent]
    assert [g.data["id"] for g in got] == [e.id for e in sent]

    # a reconnect: Last-Event-ID wins over the URL's ``after``
    async with tail(served_journal, headers={"Last-Event-ID": got[1].id or ""}, after=0) as resumed:
        rest = [await resumed.next_event() for _ in sent[2:]]
        assert [r.data["id"] for r in rest] == [e.id for e in sent[2:]]
        later = s.resumed()
        await served_journal.bus.publish(later)
        assert (await resumed.next_event()).data["id"] == later.id

    async with tail(served_journal, after=0, type="human.answered") as answers:
        assert (await answers.next_event()).data["id"] == sent[3].id


async def test_tail_refuses_bad_input_and_anonymous_callers(served_journal: Served) -> None:
    async with httpx.AsyncClient(base_url=served_journal.url, headers=VIEWER, timeout=10) as client:
        for value in ("abc", "-1", "1.5", "99999999999999999999", "0x10", "1 2"):
            response = await client.get("/events/stream", headers={"Last-Event-ID": value})
            assert response.status_code == 422, (value, response.text)
            assert response.json()["error"] == "invalid_last_event_id"
        bad_after = await client.get("/events/stream", params={"after": "-3"})
        assert bad_after.status_code == 422
        assert bad_after.json()["error"] == "invalid_request"
        anonymous = await client.get("/events/stream", headers={"Authorization": ""})
        assert anonymous.status_code == 401
        assert anonymous.json()["error"] == "unauthorized"


async def test_stopping_the_service_ends_open_streams(served_journal: Served) -> None:
    async with tail(served_journal) as open_stream:
        served_journal.stop.set()
        async with asyncio.timeout(20):
            async for _ in open_stream.lines:
                pass  # keep-alives until the stream ends
        await asyncio.wait_for(served_journal.task, 20)
