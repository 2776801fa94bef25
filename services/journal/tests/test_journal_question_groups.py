"""OBS-1's "most delegated questions": the same decision asked about different pull requests, ids, links or
quoted names is one group per (trigger, agent, question shape), with its count, an example and its share; the
grouping is deterministic. Pure shapes first, then ``GET /analytics/human`` through the real consumer (SQLite and
PostgreSQL)."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from temporality_journal.insights import EventRow, RunRow, human_analytics, question_shape

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("questions", "shape"),
    [
        (
            ["Merge PR #123 into main?", "merge pr #9   into main?", "Merge PR #4711 into Main?"],
            "merge pr #<n> into main?",
        ),
        (
            [
                "Approve https://dev.azure.com/org/p/_git/r/pullrequest/456 ?",
                "Approve https://github.com/o/r/pull/7 ?",
            ],
            "approve <url> ?",
        ),
        (
            ['Is "feature/login-2" ok to ship?', "Is 'hotfix' ok to ship?", "Is `main` ok to ship?"],
            "is <text> ok to ship?",
        ),
        (["Deploy commit a3f9c2d1e to prod?", "Deploy commit 0123abcdef99 to prod?"], "deploy commit <hex> to prod?"),
        (["Retry run-4f9a2c1b?", "Retry run-77aa00b1?"], "retry run-<hex>?"),
        (["Close ADO-PR12x?", "Close ADO-PR9q?"], "close ado-<id>?"),
        (["Bump 1.2.3 to 1.3.0?", "Bump 2.0 to 10.11?", "Bump 3 to 4?"], "bump <n> to <n>?"),
        (["See https://x.org/pr/9.", "See www.example.com/a?b=1."], "see <url>."),
        (
            [
                "Tell bob@example.com about 123e4567-e89b-12d3-a456-426614174000?",
                "Tell a.b@c.org about 00000000-0000-0000-0000-000000000001?",
            ],
            "tell <email> about <id>?",
        ),
        (["Don't merge PR 3?", "Don't merge PR 44?"], "don't merge pr <n>?"),
        (["Релиз 42 — ЮНИКОД?", "релиз 7 — юникод?"], "релиз <n> — юникод?"),
    ],
)
def test_one_decision_asked_about_different_things_has_one_shape(questions: list[str], shape: str) -> None:
    assert {question_shape(q) for q in questions} == {shape}


def test_different_decisions_keep_different_shapes() -> None:
    shapes = {question_shape(q) for q in ("Merge PR 1?", "Close PR 1?", "Merge PR 1 now?", "Keep v1 or ship v2?")}
    assert len(shapes) == 4


def _run(run_id: str, agent: str | None, trigger_id: str | None) -> RunRow:
    return RunRow(run_id=run_id, state="completed", agent=agent, trigger_id=trigger_id, created_at=T0)


def _ask(run_id: str, n: int, question: str) -> EventRow:
    return EventRow(
        "human.requested", T0 + timedelta(seconds=n), run_id, {"request_id": f"q-{run_id}-{n}", "question": question}
    )


def test_groups_are_per_trigger_agent_and_shape_with_count_example_and_share_in_any_event_order() -> None:
    runs = [_run(f"r{i}", "reviewer", "ado-pr") for i in range(18)]
    runs += [_run("t1", "triager", "gh"), _run("t2", "triager", "gh"), _run("x", "reviewer", "gh")]
    events = [_ask(f"r{i}", i, f"Approve the API change in PR {100 + i}?") for i in range(18)]
    events += [_ask("r0", 50, "Approve the API change in PR 100?")]  # asked twice: the most frequent text
    events += [_ask("t1", 60, "Label issue #5?"), _ask("t2", 61, "Label issue #6?")]
    events += [_ask("x", 70, "Approve the API change in PR 7?")]  # another trigger: another group
    expected = [
        ("Approve the API change in PR 100?", 19, "approve the api change in pr <n>?", "reviewer", "ado-pr", 18),
        ("Label issue #6?", 2, "label issue #<n>?", "triager", "gh", 2),  # tie: the most recently asked
        ("Approve the API change in PR 7?", 1, "approve the api change in pr <n>?", "reviewer", "gh", 1),
    ]
    for seed in range(5):
        shuffled = list(events)
        random.Random(seed).shuffle(shuffled)
        body = human_analytics(runs, shuffled, since=None, until=None, top=10)
        got = [(q.question, q.count, q.shape, q.agent, q.trigger_id, q.distinct) for q in body.top_questions]
        assert got == expected
        assert [q.share for q in body.top_questions] == [round(19 / 22, 4), round(2 / 22, 4), round(1 / 22, 4)]
    assert len(human_analytics(runs, events, since=None, until=None, top=1).top_questions) == 1


async def test_the_api_groups_a_decision_asked_about_many_pull_requests(journal: Journal, story: MakeStory) -> None:
    """The defect: 18 asks of one decision, each naming its own PR, read "1x" ten times."""
    stories = [story(agent="reviewer", trigger_id="ado-pr", at=T0 + timedelta(minutes=i)) for i in range(18)]
    other = story(agent="reviewer", trigger_id="ado-pr", at=T0 + timedelta(minutes=30))
    events = [s.requested() for s in (*stories, other)]
    events += [s.human_requested(question=f"Ship v2 of the API in PR !{200 + i}?") for i, s in enumerate(stories)]
    events.append(other.human_requested(question="Which reviewer for https://example.com/pr/9?"))
    await journal.send(*events)
    body = (await journal.client.get("/analytics/human", params={"top": 5})).json()
    first, second = body["top_questions"]
    assert (first["count"], first["shape"], first["agent"], first["trigger_id"], first["distinct"]) == (
        18,
        "ship <id> of the api in pr !<n>?",
        "reviewer",
        "ado-pr",
        18,
    )
    assert first["question"] == "Ship v2 of the API in PR !217?"  # all once: the most recently asked
    assert first["share"] == pytest.approx(18 / 19, abs=1e-4)
    assert (second["count"], second["shape"]) == (1, "which reviewer for <url>?")
