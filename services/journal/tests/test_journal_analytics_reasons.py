"""OBS-1 "which decisions are delegated, which knowledge is missing": ``GET /analytics/human``'s ``by_reason_kind``
and ``top_reasons`` (from ``human.requested``'s optional ``reason`` / ``reason_kind``) and, for each of the most
delegated questions, which options people chose (``human.answered`` joined by ``request_id``). Pure aggregations
first, then the API over events recorded through the real bus into SQLite and PostgreSQL. Events from before the
fields (no reason) count as "not given"."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporality_journal.insights import EventRow, RunRow, human_analytics
from temporality_protocol import (
    HumanAnswered,
    HumanExpired,
    HumanOption,
    HumanPolicy,
    HumanRequested,
    OptionAnswer,
    TextAnswer,
    derive_id,
    make_event,
)

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
OPTIONS = [{"id": "keep-v1", "label": "Keep v1"}, {"id": "ship-v2", "label": "Ship v2"}]


# --------------------------------------------------------------------------- pure
def _run(run_id: str) -> RunRow:
    return RunRow(run_id=run_id, state="running", agent="reviewer", trigger_id="t", created_at=T0)


def _ask(run_id: str, request_id: str, *, at: datetime = T0, **data: Any) -> EventRow:
    return EventRow("human.requested", at, run_id, {"request_id": request_id, "question": "Keep v1?"} | data)


def _answer(run_id: str, request_id: str, answer: dict[str, Any], waited: float = 10) -> EventRow:
    return EventRow("human.answered", T0, run_id, {"request_id": request_id, "answer": answer, "waited_s": waited})


def _option(option_id: str, label: str | None = None) -> dict[str, Any]:
    return {"type": "option", "option_id": option_id, "label": label}


def test_choices_count_each_offered_option_and_answers_joined_by_request() -> None:
    events = [
        _ask("r1", "q1", options=OPTIONS, reason="compat undecided", reason_kind="decision"),
        _ask("r2", "q2", options=OPTIONS, reason="compat undecided", reason_kind="decision"),
        _ask("r3", "q3", options=OPTIONS, reason="compat undecided", reason_kind="decision"),
        _ask("r4", "q4", options=OPTIONS),  # an older executor: no reason
        _ask("r5", "q5", options=[*OPTIONS, {"id": "later", "label": "Decide later"}]),
        _answer("r1", "q1", _option("ship-v2")),
        _answer("r2", "q2", _option("ship-v2")),
        _answer("r2", "q2", _option("keep-v1")),  # a second outcome for q2: the first decides
        _answer("r3", "q3", {"type": "text", "value": "ask the API guild"}),
        _answer("r4", "q4", _option("other", "Something else")),  # an id no request offered
        EventRow(
            "human.expired",
            T0,
            "r5",
            {"request_id": "q5", "action": "default", "default_answer": _option("keep-v1"), "waited_s": 60},
        ),
        _answer("r9", "q9", _option("ship-v2")),  # an answer to no known request
    ]
    body = human_analytics([_run(f"r{i}") for i in range(1, 6)], events, since=None, until=None, top=5)
    (group,) = body.top_questions
    assert (group.count, group.answered, group.free_text) == (5, 4, 1)
    assert (group.reason, group.reason_kind) == ("compat undecided", "decision")
    rows = [(c.option_id, c.label, c.offered, c.chosen, c.defaulted, c.share) for c in group.choices]
    assert rows == [
        ("ship-v2", "Ship v2", 5, 2, 0, 0.5),  # most chosen first, then in the order offered
        ("other", "Something else", 0, 1, 0, 0.25),
        ("keep-v1", "Keep v1", 5, 0, 1, 0.0),
        ("later", "Decide later", 1, 0, 0, 0.0),
    ]


def test_reasons_group_by_shape_and_kind_and_not_given_comes_last() -> None:
    events = [
        _ask("r1", "q1", reason="Release date of 2.1 unknown", reason_kind="missing_knowledge"),
        _ask("r2", "q2", reason="release date of 2.2 unknown", reason_kind="missing_knowledge", at=T0 + timedelta(1)),
        _ask("r3", "q3", reason="Deploy to prod?", reason_kind="approval"),
        _ask("r3", "q4"),
        _ask("r3", "q5", reason_kind="curiosity"),  # not of the vocabulary (a foreign writer): counted as given
        _answer("r1", "q1", _option("x"), waited=30),
        _answer("r2", "q2", _option("x"), waited=90),
    ]
    body = human_analytics([_run("r1"), _run("r2"), _run("r3")], events, since=None, until=None, top=10)
    kinds = [(k.reason_kind, k.requests_total, k.runs_asked, k.answered, k.wait_p50_s) for k in body.by_reason_kind]
    assert kinds == [
        ("missing_knowledge", 2, 2, 2, 30),
        ("approval", 1, 1, 0, None),
        ("curiosity", 1, 1, 0, None),
        (None, 1, 1, 0, None),
    ]
    first, second = body.top_reasons
    assert (first.reason, first.shape, first.reason_kind, first.count, first.share) == (
        "release date of 2.2 unknown",  # all once: the most recently asked
        "release date of <n> unknown",
        "missing_knowledge",
        2,
        0.4,
    )
    assert (first.answered, first.wait_p50_s) == (2, 30)
    assert (second.reason, second.reason_kind, second.count) == ("Deploy to prod?", "approval", 1)
    assert len(human_analytics([_run("r3")], events, since=None, until=None, top=1).top_reasons) == 1


# --------------------------------------------------------------------------- the API over the real bus
def _requested(s: Any, *, reason: str | None, kind: str | None, question: str) -> Any:
    s.at += timedelta(seconds=1)
    data = HumanRequested(
        request_id=s.request_id,
        run_id=s.run_id,
        agent=s.agent,
        title=s.title,
        recipient="user:alice",
        question=question,
        reason=reason,
        reason_kind=kind,  # type: ignore[arg-type]
        options=[HumanOption.model_validate(o) for o in OPTIONS],
        timeout_s=3600,
        expires_at=s.at + timedelta(hours=1),
        policy=HumanPolicy(allowed_recipients=["user:alice"]),
        turn=1,
    )
    return make_event(
        data, source="/temporality/test", id=derive_id("evt", "req", s.request_id), run_id=s.run_id, time=s.at
    )


def _answered(s: Any, answer: OptionAnswer | TextAnswer) -> Any:
    s.at += timedelta(seconds=1)
    data = HumanAnswered(
        request_id=s.request_id,
        run_id=s.run_id,
        recipient="user:alice",
        responder="user:alice",
        answer=answer,
        channel="web",
        waited_s=120,
    )
    return make_event(
        data, source="/temporality/test", id=derive_id("evt", "ans", s.request_id), run_id=s.run_id, time=s.at
    )


async def test_the_api_says_why_agents_ask_and_what_people_chose(journal: Journal, story: MakeStory) -> None:
    prs = [story(agent="reviewer", trigger_id="ado-pr", at=T0 + timedelta(minutes=i)) for i in range(4)]
    old = story(agent="reviewer", trigger_id="ado-pr", at=T0 + timedelta(minutes=10))  # before the fields
    events = [s.requested() for s in (*prs, old)]
    for i, s in enumerate(prs):
        events.append(
            _requested(
                s,
                reason="API compatibility undecided",
                kind="decision",
                question=f"PR !{100 + i} changes the API: keep v1?",
            )
        )
    events.append(old.human_requested(question="PR !200 changes the API: keep v1?"))
    events += [
        _answered(prs[0], OptionAnswer(option_id="ship-v2")),
        _answered(prs[1], OptionAnswer(option_id="ship-v2")),
    ]
    events += [_answered(prs[2], TextAnswer(value="ask the guild"))]
    events.append(
        make_event(
            HumanExpired(
                request_id=prs[3].request_id,
                run_id=prs[3].run_id,
                recipient="user:alice",
                action="default",
                default_answer=OptionAnswer(option_id="keep-v1"),
                waited_s=3600,
            ),
            source="/temporality/test",
            id=derive_id("evt", "exp", prs[3].request_id),
            run_id=prs[3].run_id,
            time=T0 + timedelta(hours=2),
        )
    )
    await journal.send(*events)

    body = (await journal.client.get("/analytics/human")).json()
    kinds = {k["reason_kind"]: (k["requests_total"], k["answered"], k["expired"]) for k in body["by_reason_kind"]}
    assert kinds == {"decision": (4, 3, 1), None: (1, 0, 0)}
    assert [k["reason_kind"] for k in body["by_reason_kind"]] == ["decision", None]
    (reason,) = body["top_reasons"]
    assert (reason["reason"], reason["reason_kind"], reason["count"], reason["wait_p50_s"]) == (
        "API compatibility undecided",
        "decision",
        4,
        120,
    )
    (question,) = body["top_questions"]
    assert (question["count"], question["answered"], question["free_text"]) == (5, 3, 1)
    assert (question["reason"], question["reason_kind"]) == ("API compatibility undecided", "decision")
    choices = {c["option_id"]: (c["label"], c["offered"], c["chosen"], c["defaulted"]) for c in question["choices"]}
    assert choices == {"ship-v2": ("Ship v2", 4, 2, 0), "keep-v1": ("Keep v1", 4, 0, 1)}
    assert [c["option_id"] for c in question["choices"]] == ["ship-v2", "keep-v1"]

    # the filters apply: another agent's runs have none
    none = (await journal.client.get("/analytics/human", params={"agent": "nobody"})).json()
    assert (none["by_reason_kind"], none["top_reasons"]) == ([], [])
