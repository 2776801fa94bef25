"""A question whose run ended without an answer, expiry or rejection journaled is withdrawn, not pending
(SQLite, PostgreSQL): cancelling a waiting run withdraws its question in human-interaction, which says so with a
``human.withdrawn`` (since 2026-12-07). ``/analytics/human`` counts that event as the outcome; for history from
before it (no such event) it reads the withdrawal from the run's end -- once either way -- and agrees with
``/runs/waiting``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


async def test_a_cancelled_waiting_run_s_question_is_withdrawn_not_pending(journal: Journal, story: MakeStory) -> None:
    waiting = [story(trigger_id="gh-pr", at=T0 + timedelta(minutes=i)) for i in range(2)]
    cancelled = story(trigger_id="gh-pr", at=T0 + timedelta(minutes=5))
    failed = story(trigger_id="gh-pr", agent="triager", at=T0 + timedelta(minutes=6))
    answered = story(trigger_id="gh-pr", at=T0 + timedelta(minutes=7))
    for s in (*waiting, cancelled, failed, answered):
        await journal.send(s.requested(), s.created(), s.started(), s.human_requested(question="Merge PR 7?"))
    await journal.send(answered.answered(), answered.resumed(), answered.completed())
    # before the cancel: four questions open, four runs waiting
    before = (await journal.client.get("/analytics/human")).json()
    assert (before["pending"], before["withdrawn"]) == (4, 0)
    await journal.send(cancelled.cancelled(), failed.failed())

    body = (await journal.client.get("/analytics/human")).json()
    waiting_runs = (await journal.client.get("/runs/waiting")).json()["runs"]
    assert {r["run_id"] for r in waiting_runs} == {s.run_id for s in waiting}
    assert body["pending"] == len(waiting_runs) == 2  # what the inbox and /runs/waiting say
    assert (body["requests_total"], body["answered"], body["withdrawn"], body["expired"], body["rejected"]) == (
        5,
        1,
        2,
        0,
        0,
    )
    assert body["wait"]["count"] == 1  # a withdrawn question has no wait time
    by_agent = {b["key"]: b for b in body["by_agent"]}
    assert (by_agent["reviewer"]["pending"], by_agent["reviewer"]["withdrawn"]) == (2, 1)
    assert (by_agent["triager"]["pending"], by_agent["triager"]["withdrawn"]) == (0, 1)
    (gh,) = body["by_trigger"]
    assert (gh["key"], gh["pending"], gh["withdrawn"], gh["answered"]) == ("gh-pr", 2, 2, 1)


async def test_a_human_withdrawn_is_the_outcome_and_never_counted_twice(journal: Journal, story: MakeStory) -> None:
    """Runs cancelled with a question open: one with human-interaction's ``human.withdrawn`` (journaled after the
    run's end, as it is published), one from before that event (derived). Two withdrawn, not three, none pending;
    a question a running run withdrew (HUM-7, ``not_needed``) is withdrawn at once, not pending until the run ends."""
    announced = story(trigger_id="gh-pr", at=T0)
    history = story(trigger_id="gh-pr", at=T0 + timedelta(minutes=1))
    running = story(trigger_id="gh-pr", at=T0 + timedelta(minutes=2))
    for s in (announced, history, running):
        await journal.send(s.requested(), s.created(), s.started(), s.human_requested(question="Merge PR 7?"))
    await journal.send(announced.cancelled(), announced.withdrawn("run_cancelled", waited_s=300))
    await journal.send(history.cancelled())
    await journal.send(running.withdrawn("not_needed", waited_s=30))
    await journal.send(announced.withdrawn("run_cancelled", waited_s=300))  # a redelivery: the same event id

    body = (await journal.client.get("/analytics/human")).json()
    assert (body["requests_total"], body["withdrawn"], body["pending"], body["answered"]) == (3, 3, 0, 0)
    assert body["wait"]["count"] == 0  # a withdrawn question has no answer wait
    (gh,) = body["by_trigger"]
    assert (gh["withdrawn"], gh["pending"]) == (3, 0)
    (stage,) = body["by_stage"]
    assert (stage["withdrawn"], stage["pending"]) == (3, 0)
    events = (await journal.client.get("/events", params={"type": "human.withdrawn"})).json()["events"]
    assert sorted(e["data"]["reason"] for e in events) == ["not_needed", "run_cancelled"]
