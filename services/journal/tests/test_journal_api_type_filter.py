"""``type=`` on ``GET /events`` and ``GET /events/stream``: repeated (any of them), families in NATS wording
(``human.>``: every type below ``human``, ``>`` every type), and a 422 that says what to write for anything else
(``human.*``: on NATS ``*`` is one token, it would miss ``human.directory.changed``). On SQLite and PostgreSQL, and
the live tail of the journal service on a real port."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from journal_support import OPERATOR, VIEWER, RunStory

from temporality_protocol import Envelope, make_event
from temporality_protocol.events import HumanDirectoryChanged

MakeStory = Callable[..., RunStory]
Journal = Any  # conftest.Journal
Served = Any  # conftest.ServedJournal


def _directory_changed() -> Envelope:
    data = HumanDirectoryChanged(kind="user", entry_id="alice", action="updated", revision=2, changed_by="admin")
    return make_event(data, source="/temporality/test", actor="token:admin")


def _events(story: RunStory) -> list[Envelope]:
    return [
        story.requested(),
        story.started(),
        story.human_requested(),
        story.notified(),
        _directory_changed(),
        story.completed(),
    ]


async def _types(journal: Journal, *types: str, **params: str) -> list[str]:
    """The types ``GET /events`` lists (oldest first) for ``type=`` each of ``types``, as the operator."""
    response = await journal.client.get(
        "/events", params=[*(("type", t) for t in types), *params.items()], headers=OPERATOR
    )
    assert response.status_code == 200, response.text
    return [e["type"] for e in reversed(response.json()["events"])]


async def test_several_types_and_families(journal: Journal, story: MakeStory) -> None:
    await journal.send(*_events(story()))
    everything = ["run.requested", "run.started", "human.requested", "human.notified"]
    everything += ["human.directory.changed", "run.completed"]
    # one type: as it always was
    assert await _types(journal, "run.completed") == ["run.completed"]
    # several: any of them (until 7 December the last one alone)
    assert await _types(journal, "human.requested", "run.completed") == ["human.requested", "run.completed"]
    # a family: every type below it, however many tokens (human.directory.changed too)
    assert await _types(journal, "human.>") == ["human.requested", "human.notified", "human.directory.changed"]
    assert await _types(journal, "human.directory.>") == ["human.directory.changed"]
    assert await _types(journal, "run.>", "human.notified") == [
        "run.requested",
        "run.started",
        "human.notified",
        "run.completed",
    ]
    # the same type twice, a type inside a family asked too: each event once
    assert await _types(journal, "run.completed", "run.completed", "run.>") == [
        "run.requested",
        "run.started",
        "run.completed",
    ]
    assert await _types(journal, ">") == everything
    assert await _types(journal, "human.>", ">") == everything
    # a family is a prefix of whole tokens, taken literally: _ and % are no wildcards, "hum" is not "human"
    for literal in ("ru_.>", "run%.>", "hum.>", "human.directory.changed.>"):
        assert await _types(journal, literal) == [], literal


async def test_a_viewer_still_gets_no_operator_only_event_through_a_family(journal: Journal, story: MakeStory) -> None:
    await journal.send(*_events(story()))
    response = await journal.client.get("/events", params={"type": "human.>"}, headers=VIEWER)
    assert response.status_code == 200, response.text
    assert [e["type"] for e in reversed(response.json()["events"])] == ["human.requested", "human.notified"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("human.*", "human.>"),
        ("*", "human.>"),
        ("run.*.x", "human.>"),
        ("human.>.x", "last token"),
        ("human>", "last token"),
        (".>", "no family"),
        ("human..>", "no family"),
        ("a" * 201, "too long"),
        ("run.\x00started", "NUL"),
    ],
)
async def test_a_type_that_is_neither_a_type_nor_a_family_is_422_saying_what_to_write(
    journal: Journal, value: str, says: str
) -> None:
    for path in ("/events", "/events/stream"):
        refused = await journal.client.get(path, params=[("type", "run.completed"), ("type", value)])
        assert refused.status_code == 422, (path, refused.text)
        body = refused.json()
        assert set(body) == {"error", "detail"}
        assert body["error"] == "invalid_request"
        assert body["detail"].startswith("query.type: "), body
        assert says in body["detail"], body
        assert len(body["detail"]) < 400  # never the whole input back


async def test_more_than_fifty_types_is_422(journal: Journal) -> None:
    for path in ("/events", "/events/stream"):
        refused = await journal.client.get(path, params=[("type", f"run.t{i}") for i in range(51)])
        assert refused.status_code == 422, refused.text
        assert "at most 50" in refused.json()["detail"]


async def _read_events(response: httpx.Response, until_id: str) -> list[dict[str, Any]]:
    """The ``data`` of each SSE event of ``response`` up to the one with CloudEvent id ``until_id`` (bounded)."""
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(30):
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                got.append(json.loads(line.removeprefix("data: ")))
                if got[-1]["id"] == until_id:
                    return got
    raise AssertionError(f"the stream ended before {until_id}: {got}")


async def test_the_live_tail_takes_several_types_and_families(served_journal: Served, story: MakeStory) -> None:
    run = story()
    events = _events(run)
    sentinel = run.cancelled()  # after run.completed: nothing moves, but it is on the stream (run.>)
    for event in [*events, sentinel]:
        await served_journal.bus.publish(event)
    params = {"after": "0", "type": ["human.>", "run.completed", "run.cancelled"]}
    async with (
        httpx.AsyncClient(base_url=served_journal.url, headers=OPERATOR, timeout=30) as client,
        client.stream("GET", "/events/stream", params=params) as response,
    ):
        assert response.status_code == 200, await response.aread()
        got = await _read_events(response, sentinel.id)
    assert [g["type"] for g in got] == [
        "human.requested",
        "human.notified",
        "human.directory.changed",
        "run.completed",
        "run.cancelled",
    ]
