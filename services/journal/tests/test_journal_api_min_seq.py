"""Read your bus writes (``min_seq``): a NATS subscriber that saw an event at stream sequence N asks the journal
with ``min_seq=N`` and gets an answer that holds it -- the journal waits (bounded) until it has recorded that far,
else 503 ``journal_behind`` with ``Retry-After`` and how far it is. Against a real nats-server and the journal's
real consumer (the in-process app, and the journal service on a real port with a subscriber of its own)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from journal_support import VIEWER, RunStory, api_auth, serve_journal, served_settings
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from temporality_bus import Bus, NatsSettings
from temporality_journal import Database, Settings, create_app
from temporality_journal.catchup import RETRY_AFTER_S, CatchUp
from temporality_protocol import Envelope
from temporality_protocol.catalog import EVENTS_STREAM
from temporality_testing.waiting import eventually

MakeStory = Callable[..., RunStory]
#: Other runs' events on the stream before the subscriber's: the journal starts that far behind the bus.
BACKLOG = 3000
Journal = Any  # conftest.Journal


@asynccontextmanager
async def _api(bus: Bus, database: Database, wait_s: float) -> AsyncIterator[httpx.AsyncClient]:
    """The journal API over ``database`` whose ``min_seq`` waits at most ``wait_s``."""
    app = create_app(Settings(), database, bus, api_auth(), catch_up=CatchUp(database, wait_s=wait_s))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://journal", headers=VIEWER
    ) as client:
        yield client


async def _publish(bus: Bus, events: list[Envelope]) -> list[int]:
    """Publish each event; their stream sequences."""
    return [(await bus.publish(event)).seq for event in events]


def _story_events(story: RunStory) -> list[Envelope]:
    return [story.requested(), story.started(), story.completed()]


async def test_a_read_with_min_seq_waits_until_the_journal_recorded_that_far(
    idle_journal: Journal, bus: Bus, database: Database, story: MakeStory
) -> None:
    """Asked before the journal has recorded anything (its consumer not started), the reads wait; once the
    consumer records the events they answer with the event at min_seq in them. Without the wait they would have
    been a 404 (the run unknown) at once."""
    run = story()
    events = _story_events(run)
    seqs = await _publish(bus, events)
    async with _api(bus, database, wait_s=60) as client:  # the test's bound, not the default
        params = {"min_seq": str(seqs[-1])}
        trajectory = asyncio.create_task(client.get(f"/runs/{run.run_id}/events", params=params))
        one = asyncio.create_task(client.get(f"/runs/{run.run_id}", params=params))
        listed = asyncio.create_task(client.get("/events", params={**params, "run_id": run.run_id}))
        await idle_journal.start()
        async with asyncio.timeout(60):
            got = await trajectory
            run_view = await one
            recent = await listed
    assert got.status_code == 200, got.text
    assert [e["id"] for e in got.json()["events"]] == [e.id for e in events]
    assert got.json()["events"][-1]["stream_seq"] == seqs[-1]
    assert run_view.status_code == 200, run_view.text
    assert run_view.json()["state"] == "completed"
    assert recent.status_code == 200, recent.text
    assert [e["id"] for e in recent.json()["events"]] == [e.id for e in reversed(events)]


async def test_a_journal_that_stays_behind_answers_503_with_retry_after_and_its_mark(
    idle_journal: Journal, bus: Bus, database: Database, story: MakeStory
) -> None:
    first, second = story(), story()
    await idle_journal.start()
    done = _story_events(first)
    await idle_journal.send(*done)  # recorded: the journal's mark is the last one's sequence
    recorded = await CatchUp(database).recorded()
    assert recorded > 0
    async with _api(bus, database, wait_s=0.3) as client:
        # a sequence past anything on the stream: the wait ends, 503 saying how far the journal is
        ahead = recorded + 1000
        for path in (f"/runs/{first.run_id}/events", f"/runs/{first.run_id}", "/events"):
            behind = await client.get(path, params={"min_seq": str(ahead)})
            assert behind.status_code == 503, behind.text
            assert behind.headers["retry-after"] == str(RETRY_AFTER_S)
            body = behind.json()
            assert body["error"] == "journal_behind"
            assert (body["min_seq"], body["recorded_seq"]) == (ahead, recorded)
            assert f"up to sequence {recorded}, not yet up to min_seq {ahead}" in body["detail"]

        # reached already: no wait, the answer as without min_seq
        now = await client.get(f"/runs/{first.run_id}/events", params={"min_seq": str(recorded)})
        assert now.status_code == 200, now.text
        assert [e["id"] for e in now.json()["events"]] == [e.id for e in done]

        # a later event: a retry after the 503, as the docs say, gets it once the journal recorded it
        later = _story_events(second)
        seqs = await _publish(bus, later)

        async def complete() -> dict[str, Any] | None:
            answer = await client.get(f"/runs/{second.run_id}/events", params={"min_seq": str(seqs[-1])})
            if answer.status_code == 503:
                assert answer.json()["recorded_seq"] < seqs[-1]
                return None
            assert answer.status_code == 200, answer.text
            body: dict[str, Any] = answer.json()
            return body

        trajectory = await eventually(complete, 60, "the trajectory with min_seq")
        assert [e["id"] for e in trajectory["events"]] == [e.id for e in later]


@pytest.mark.parametrize("value", ["-1", "x", "1.5", str(2**63)])
async def test_a_bad_min_seq_is_422(journal: Journal, value: str) -> None:
    for path in ("/runs/run-x/events", "/runs/run-x", "/events"):
        refused = await journal.client.get(path, params={"min_seq": value})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"] == "invalid_request"
        assert "min_seq" in refused.json()["detail"]


async def test_min_seq_is_checked_after_the_token(journal: Journal) -> None:
    """An unknown token: a 401 at once, not a wait for a sequence far ahead (then a 503)."""
    wrong = {"Authorization": "Bearer not-a-token-of-this-journal"}
    for path in ("/runs/run-x/events", "/runs/run-x", "/events"):
        refused = await journal.client.get(path, params={"min_seq": "999999"}, headers=wrong)
        assert refused.status_code == 401, refused.text


async def test_a_subscriber_reads_the_whole_trajectory_when_run_completed_arrives(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, story: MakeStory
) -> None:
    """The reviewer's subscriber (DC-6): its own durable on the events stream, and on each run.completed the
    trajectory from the journal service (on a real port) with min_seq = the message's stream sequence. The journal
    starts behind the bus -- a backlog of other runs' events ahead of these -- as a busy one is: every 200 holds the
    run's every event up to run.completed (a 503 is retried after Retry-After, as documented). Without min_seq the
    same reads are 404s and trajectories without their run.completed."""
    backlog = [story().requested() for _ in range(BACKLOG)]
    runs = [story() for _ in range(12)]
    expected = {r.run_id: [r.requested(), r.created(), r.started(), r.completed()] for r in runs}
    await bus.publish_many(backlog)
    for events in expected.values():
        await bus.publish_many(events)
    nc = await nats.connect(nats_settings.url)
    behind = 0
    checked: set[str] = set()
    try:
        js = nc.jetstream()
        config = ConsumerConfig(
            durable_name="sub-trajectories",
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            filter_subject="temporality.events.run.completed",
        )
        sub = await js.pull_subscribe(
            "temporality.events.run.completed", durable="sub-trajectories", stream=EVENTS_STREAM.name, config=config
        )
        async with (
            serve_journal(served_settings(tmp_path, nats_settings), bus) as served,
            httpx.AsyncClient(base_url=served.url, headers=VIEWER, timeout=30) as client,
            asyncio.timeout(180),
        ):
            while len(checked) < len(runs):
                try:
                    messages = await sub.fetch(16, timeout=1)
                except TimeoutError:  # nats.errors.TimeoutError, and the plain one fetch raises at its deadline
                    continue
                for msg in messages:
                    run_id = json.loads(msg.data)["runid"]
                    params = {"min_seq": str(msg.metadata.sequence.stream)}
                    while (answer := await client.get(f"/runs/{run_id}/events", params=params)).status_code == 503:
                        behind += 1
                        await asyncio.sleep(int(answer.headers["retry-after"]))
                    assert answer.status_code == 200, answer.text
                    got = [e["id"] for e in answer.json()["events"]]
                    assert got == [e.id for e in expected[run_id]], (run_id, got)
                    checked.add(run_id)
                    await msg.ack()
    finally:
        await nc.drain()
    assert checked == set(expected)
