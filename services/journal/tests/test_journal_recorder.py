"""Events through a real nats-server and the real Consumer into SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporality_protocol import CONTENT_TYPE, Envelope, encode
from temporality_protocol.catalog import EVENTS_PREFIX

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal


async def _trajectory(journal: Journal, run_id: str) -> list[dict[str, Any]]:
    response = await journal.client.get(f"/runs/{run_id}/events")
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["events"]
    return events


async def test_full_trajectory_gives_the_right_state_at_each_step(journal: Journal, story: MakeStory) -> None:
    s = story()
    steps = [
        (s.requested(), "pending"),
        (s.created(), "pending"),
        (s.started(), "running"),
        (s.human_requested(), "waiting_for_human"),
        (s.notified("matrix"), "waiting_for_human"),
        (s.answered(), "resuming"),
        (s.resumed(), "running"),
        (s.completed("merged"), "completed"),
    ]
    for event, expected in steps:
        await journal.send(event)
        run = await journal.run(s.run_id)
        assert run["state"] == expected, event.type
        assert (run["waiting"] is not None) == (expected == "waiting_for_human")

    run = await journal.run(s.run_id)
    assert run["result"] == "merged"
    assert run["agent"] == "reviewer"
    assert run["trigger_id"] == "ado-pr"
    assert run["launch_kind"] == "webhook"
    assert datetime.fromisoformat(run["finished_at"]) == steps[-1][0].time

    events = await _trajectory(journal, s.run_id)
    assert [e["id"] for e in events] == [event.id for event, _ in steps]
    assert [e["type"] for e in events] == [event.type for event, _ in steps]
    seqs = [e["stream_seq"] for e in events]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    first = events[0]
    assert first["actor"] == "service:test"
    assert first["data"]["launch"]["trigger_id"] == "ado-pr"
    assert datetime.fromisoformat(first["time"]) == steps[0][0].time


async def test_waiting_run_shows_whom_which_channel_and_since(journal: Journal, story: MakeStory) -> None:
    s = story()
    asked_at = datetime.now(UTC) - timedelta(minutes=14)
    await journal.send(
        s.requested(),
        s.started(),
        s.human_requested(recipient="user:alice", question="Merge PR 42?", time=asked_at),
        s.notified("matrix"),
    )
    run = await journal.run(s.run_id)
    assert run["state"] == "waiting_for_human"
    waiting = run["waiting"]
    assert waiting["request_id"] == s.request_id
    assert waiting["recipient"] == "user:alice"
    assert waiting["channel"] == "matrix"
    assert waiting["question"] == "Merge PR 42?"
    assert datetime.fromisoformat(waiting["since"]) == asked_at
    assert 14 * 60 <= waiting["waiting_s"] < 16 * 60

    listed = (await journal.client.get("/runs", params={"state": "waiting_for_human"})).json()["runs"]
    assert [r["run_id"] for r in listed] == [s.run_id]
    assert listed[0]["waiting"]["recipient"] == "user:alice"


async def test_the_same_event_delivered_twice_is_stored_once(journal: Journal, story: MakeStory) -> None:
    s = story()
    asked = s.human_requested()
    await journal.send(s.requested(), s.started(), asked, s.notified("telegram"))
    before = await journal.run(s.run_id)

    # A second copy on the stream under another Nats-Msg-Id, so JetStream's dedupe cannot hide it.
    await journal.bus.publish_raw(
        asked.nats_subject, encode(asked), {"Nats-Msg-Id": f"{asked.id}-copy", "Content-Type": CONTENT_TYPE}
    )
    await journal.wait_handled(asked.id, times=2)
    # And once more with the same Nats-Msg-Id: JetStream drops it.
    assert (await journal.bus.publish(asked)).duplicate

    stored = (await journal.client.get("/events", params={"run_id": s.run_id})).json()["events"]
    assert [e["id"] for e in stored].count(asked.id) == 1
    assert await journal.run(s.run_id) == before | {"waiting": before["waiting"] | {"waiting_s": _any_number()}}


async def test_a_crash_between_commit_and_ack_is_harmless(journal: Journal, story: MakeStory) -> None:
    s = story()
    started = s.started()
    journal.fail_after_commit.add(started.id)
    await journal.bus.publish(s.requested())
    await journal.bus.publish(started)
    await journal.wait_handled(started.id, times=2)  # naked once, redelivered once
    await journal.send(s.human_requested())

    events = await _trajectory(journal, s.run_id)
    assert [e["type"] for e in events] == ["run.requested", "run.started", "human.requested"]
    assert (await journal.run(s.run_id))["state"] == "waiting_for_human"


async def test_terminal_state_is_sticky(journal: Journal, story: MakeStory) -> None:
    s = story()
    await journal.send(s.requested(), s.started(), s.cancelled())
    done = await journal.run(s.run_id)
    assert done["state"] == "cancelled"
    assert done["error"] == "by user:bob"

    await journal.send(s.started("started-late"), s.human_requested(), s.resumed(), s.completed())
    assert await journal.run(s.run_id) == done
    assert len(await _trajectory(journal, s.run_id)) == 7  # every event is still journaled


async def test_an_event_of_an_unknown_type_is_stored_and_projects_nothing(journal: Journal, story: MakeStory) -> None:
    s = story()
    await journal.send(s.requested())
    before = await journal.run(s.run_id)
    future = Envelope(
        id="evt-from-the-future",
        source="/temporality/v9",
        type="run.teleported",
        time=datetime.now(UTC),
        data={"run_id": s.run_id, "to": "mars"},
        runid=s.run_id,
        protocolversion="1.0",
    )
    await journal.send(future)

    found = (await journal.client.get("/events", params={"type": "run.teleported"})).json()["events"]
    assert [(e["id"], e["run_id"], e["data"]) for e in found] == [(future.id, s.run_id, future.data)]
    assert await journal.run(s.run_id) == before


async def test_events_without_a_run_and_with_invalid_data_are_stored(journal: Journal, story: MakeStory) -> None:
    s = story()
    no_run = Envelope(
        id="evt-no-run", source="/x", type="trigger.received", time=datetime.now(UTC), data={"whatever": 1}
    )
    broken = s.started().model_copy(update={"data": {"run_id": s.run_id}})  # run.started without agent/role/title
    await journal.send(no_run, s.requested(), broken)

    assert (await journal.client.get("/events", params={"type": "trigger.received"})).json()["events"][0]["id"] == (
        no_run.id
    )
    assert [e["type"] for e in await _trajectory(journal, s.run_id)] == ["run.requested", "run.started"]
    assert (await journal.run(s.run_id))["state"] == "pending"  # the broken event did not move the run


async def test_poison_messages_are_dead_lettered_and_journaled(journal: Journal) -> None:
    await journal.bus.publish_raw(f"{EVENTS_PREFIX}.garbage", b"not a cloudevent", {"Nats-Msg-Id": "garbage-1"})
    dead_id = await journal.wait_type("bus.dead_lettered")
    dead = (await journal.client.get("/events", params={"type": "bus.dead_lettered"})).json()["events"]
    assert dead[0]["id"] == dead_id
    assert dead[0]["data"]["consumer"] == "journal"
    assert dead[0]["data"]["subject"] == f"{EVENTS_PREFIX}.garbage"


class _any_number:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, int | float)

    def __hash__(self) -> int:
        return 0
