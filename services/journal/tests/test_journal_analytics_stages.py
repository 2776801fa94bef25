"""OBS-1 "at which stage": ``GET /analytics/human``'s ``by_stage``, the turn of its run each question was asked
in (``human.requested.turn``), over events recorded through the real bus into SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporality_protocol import HumanExpired, RunCompleted, RunFailed, derive_id, make_event
from temporality_protocol.events import RunUsage

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def _expired(s: Any) -> Any:
    s.at += timedelta(seconds=1)
    data = HumanExpired(request_id=s.request_id, run_id=s.run_id, recipient="user:alice", action="fail", waited_s=60)
    return make_event(data, source="/temporality/test", id=derive_id("evt", "expired", s.request_id), time=s.at)


def _ended(s: Any, *, turns: int, usage: bool = True) -> Any:
    """The run's terminal event counting ``turns``: in ``usage`` (failed), or only as run.completed's own field
    (an executor before the usage count)."""
    s.at += timedelta(seconds=1)
    data: Any = (
        RunFailed(run_id=s.run_id, reason="tool_error", error="boom", usage=RunUsage(turns=turns))
        if usage
        else RunCompleted(run_id=s.run_id, result="done", turns=turns)
    )
    return make_event(data, source="/temporality/test", id=derive_id("evt", "ended", s.run_id), time=s.at)


async def test_questions_are_counted_per_turn_of_their_run(journal: Journal, story: MakeStory) -> None:
    early = story(agent="reviewer", at=T0)  # asks at turn 1, then again at turn 3
    late = story(agent="reviewer", at=T0 + timedelta(minutes=1))  # asks at turn 3
    twice = story(agent="triager", at=T0 + timedelta(minutes=2))  # two questions in one turn (HUM-7)
    quiet = story(agent="triager", at=T0 + timedelta(minutes=3))  # never asks
    events = [s.requested() for s in (early, late, twice, quiet)]
    events += [early.human_requested(question="Which branch?", turn=1), early.answered(channel="web", waited_s=20)]
    early.request_id = f"hreq-{early.run_id}-2"
    events += [early.human_requested(question="Merge it?", turn=3), early.answered(channel="web", waited_s=200)]
    events += [late.human_requested(question="Merge it?", turn=3), _expired(late)]
    events.append(twice.human_requested(question="Label?", turn=2))
    twice.request_id = f"hreq-{twice.run_id}-2"
    events += [twice.human_requested(question="Owner?", turn=2), twice.answered(channel="web", waited_s=40)]
    # how far each run got: early failed after 4 turns, late after 3; quiet completed after 1 (counted only as
    # run.completed's turns); twice is still going (known to have reached turn 2, where it asked)
    events += [_ended(early, turns=4), _ended(late, turns=3), _ended(quiet, turns=1, usage=False)]
    await journal.send(*events)

    response = await journal.client.get("/analytics/human")
    assert response.status_code == 200, response.text
    stages = {s["turn"]: s for s in response.json()["by_stage"]}
    assert list(stages) == [1, 2, 3]
    assert {t: (s["runs_total"], s["runs_asked"], s["requests_total"]) for t, s in stages.items()} == {
        1: (4, 1, 1),
        2: (4, 1, 2),
        3: (4, 2, 2),
    }
    assert (stages[3]["answered"], stages[3]["expired"], stages[3]["asked_share"]) == (1, 1, 0.5)
    assert (stages[2]["answered"], stages[2]["pending"], stages[2]["wait_p50_s"]) == (1, 1, 40)
    assert (stages[1]["wait_p50_s"], stages[3]["wait_p50_s"]) == (20, 200)
    # the runs that got to each turn, and the share of them that asked there
    assert {t: (s["runs_reached"], s["reached_share"]) for t, s in stages.items()} == {
        1: (4, 0.25),
        2: (3, 0.3333),
        3: (2, 1.0),
    }

    # the filters apply to the stages too
    one = (await journal.client.get("/analytics/human", params={"agent": "triager"})).json()
    assert [(s["turn"], s["runs_total"], s["requests_total"]) for s in one["by_stage"]] == [(2, 2, 2)]
    none = (await journal.client.get("/analytics/human", params={"agent": "nobody"})).json()
    assert none["by_stage"] == []
