"""The console's read views: run filters and paging, waiting runs, triggers, human analytics (SQLite, PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from temporality_protocol import (
    Envelope,
    EventData,
    HumanExpired,
    HumanRejected,
    TriggerAccepted,
    TriggerReceived,
    TriggerRejected,
    derive_id,
    make_event,
)
from temporality_testing.waiting import eventually

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def _assert_error(response: httpx.Response, status: int, error: str = "invalid_request") -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "detail"}
    assert body["error"] == error
    assert body["detail"]


def _event(data: EventData, name: str, at: datetime, run_id: str | None = None) -> Envelope:
    return make_event(data, source="/temporality/test", id=derive_id("evt", name), run_id=run_id, time=at)


def _expired(s: Any) -> Envelope:
    s.at += timedelta(seconds=1)
    data = HumanExpired(request_id=s.request_id, run_id=s.run_id, recipient="user:alice", action="fail", waited_s=3600)
    return _event(data, f"expired.{s.run_id}", s.at, s.run_id)


def _rejected(s: Any) -> Envelope:
    s.at += timedelta(seconds=1)
    data = HumanRejected(
        request_id=s.request_id, run_id=s.run_id, recipient="user:eve", reason="recipient_not_allowed", detail="no"
    )
    return _event(data, f"hrejected.{s.run_id}", s.at, s.run_id)


# --------------------------------------------------------------------------- GET /runs filters and paging
@pytest.mark.parametrize(
    "params",
    [
        {"since": "yesterday"},
        {"until": "2026-13-01T00:00:00Z"},
        {"since": "2026-11-02T00:00:00Z", "until": "2026-11-01T00:00:00Z"},
        {"limit": str(10**20)},
        {"state": "sleeping"},
        {"before": "not-a-cursor"},
        {"before": "bm9waXBl"},  # base64 of "nopipe"
        {"before": "OTk5OS0xMi0zMVQyMzo1OTo1OS0xMjowMHx4"},  # 9999-12-31T23:59:59-12:00|x
        {"q": "x" * 201},
        {"agent": "a\x00b"},
        {"since": "9999-12-31T23:59:59-12:00"},
    ],
)
async def test_bad_run_filters_are_422(journal: Journal, params: dict[str, str]) -> None:
    response = await journal.client.get("/runs", params=params)
    assert response.status_code == 422, response.text
    assert set(response.json()) == {"error", "detail"}


async def test_runs_filtered_and_paged(journal: Journal, story: MakeStory) -> None:
    a = story(agent="reviewer", title="Review PR 42", trigger_id="ado-pr", at=T0)
    b = story(agent="triager", title="Triage ISSUE 7", trigger_id="gh-issue", at=T0 + timedelta(hours=1))
    c = story(agent="reviewer", title="review pr 43 (100%_done)", trigger_id="ado-pr", at=T0 + timedelta(hours=2))
    await journal.send(a.requested(), b.requested(), c.requested(), c.started())

    async def ids(**params: Any) -> list[str]:
        response = await journal.client.get("/runs", params=params)
        assert response.status_code == 200, response.text
        return [r["run_id"] for r in response.json()["runs"]]

    assert await ids() == [c.run_id, b.run_id, a.run_id]
    assert await ids(trigger_id="ado-pr") == [c.run_id, a.run_id]
    assert await ids(agent="triager") == [b.run_id]
    assert await ids(state="running") == [c.run_id]
    assert await ids(q="PR 4") == [c.run_id, a.run_id]  # case-insensitive
    assert await ids(q="100%_") == [c.run_id]  # % and _ are literal
    assert await ids(q="%") == [c.run_id]
    # a run id pasted into the title search finds its run, whole or its start (the review: "No runs.")
    assert await ids(q=b.run_id) == [b.run_id]
    assert await ids(q=b.run_id[:10]) == [b.run_id]  # "run-" and 6 of its 12 hex digits
    assert await ids(q=b.run_id[5:]) == []  # the start, not any part
    assert await ids(agent="Reviewer") == [c.run_id, a.run_id]  # the agent, however it is capitalised
    assert await ids(agent="TRIAGER") == [b.run_id]
    since, until = (T0 + timedelta(minutes=30)).isoformat(), (T0 + timedelta(minutes=90)).isoformat()
    assert await ids(since=since, until=until) == [b.run_id]
    assert await ids(since=since) == [c.run_id, b.run_id]
    assert await ids(until="2026-11-01T09:30:00") == [a.run_id]  # naive: UTC

    first = (await journal.client.get("/runs", params={"limit": 2})).json()
    assert [r["run_id"] for r in first["runs"]] == [c.run_id, b.run_id]
    assert first["next_before"]
    second = (await journal.client.get("/runs", params={"limit": 2, "before": first["next_before"]})).json()
    assert [r["run_id"] for r in second["runs"]] == [a.run_id]
    assert second["next_before"] is None


async def test_runs_paging_with_equal_created_at(journal: Journal, story: MakeStory) -> None:
    stories = [story(run_id=f"run-same-{i}", at=T0) for i in range(5)]
    await journal.send(*(s.requested() for s in stories))
    seen: list[str] = []
    before: str | None = None
    for _ in range(5):
        params: dict[str, Any] = {"limit": 2} | ({"before": before} if before else {})
        body = (await journal.client.get("/runs", params=params)).json()
        seen += [r["run_id"] for r in body["runs"]]
        before = body["next_before"]
        if before is None:
            break
    assert seen == [f"run-same-{i}" for i in reversed(range(5))]


# --------------------------------------------------------------------------- GET /runs/waiting
async def test_waiting_runs_oldest_wait_first(journal: Journal, story: MakeStory) -> None:
    now = datetime.now(UTC)
    early = story(at=now - timedelta(minutes=20))
    late = story(at=now - timedelta(minutes=5))
    done = story()
    await journal.send(
        early.requested(),
        late.requested(),
        done.requested(),
        late.started(),
        late.human_requested(recipient="user:bob", question="Ship it?"),
        late.notified("telegram"),
        early.started(),
        early.human_requested(question="Merge it?"),
        done.started(),
        done.completed(),
    )
    response = await journal.client.get("/runs/waiting")
    assert response.status_code == 200, response.text
    runs = response.json()["runs"]
    assert [r["run_id"] for r in runs] == [early.run_id, late.run_id]
    w = runs[1]["waiting"]
    assert (w["recipient"], w["channel"], w["question"]) == ("user:bob", "telegram", "Ship it?")
    assert 4 * 60 < w["waiting_s"] < 10 * 60
    assert runs[0]["waiting"]["waiting_s"] > w["waiting_s"]
    assert runs[0]["waiting"]["channel"] is None
    only = (await journal.client.get("/runs/waiting", params={"limit": 1})).json()["runs"]
    assert [r["run_id"] for r in only] == [early.run_id]
    _assert_error(await journal.client.get("/runs/waiting", params={"limit": "0"}), 422)
    # "waiting" is not taken for a run id, and a run's own view still works
    assert (await journal.run(early.run_id))["state"] == "waiting_for_human"


# --------------------------------------------------------------------------- triggers
def _received(trigger_id: str, delivery_id: str, at: datetime, event_type: str = "git.pullrequest.created") -> Envelope:
    data = TriggerReceived(
        trigger_id=trigger_id,
        delivery_id=delivery_id,
        adapter="azure-devops",
        source_event_type=event_type,
        body_bytes=100,
    )
    return _event(data, f"received.{delivery_id}", at)


def _accepted(trigger_id: str, delivery_id: str, run_id: str, at: datetime) -> Envelope:
    data = TriggerAccepted(
        trigger_id=trigger_id, delivery_id=delivery_id, source_event_id=f"src-{delivery_id}", run_id=run_id, agent="r"
    )
    return _event(data, f"accepted.{delivery_id}", at, run_id)


def _trigger_rejected(trigger_id: str, delivery_id: str, reason: str, at: datetime) -> Envelope:
    data = TriggerRejected(trigger_id=trigger_id, delivery_id=delivery_id, reason=reason, detail="refused")
    return _event(data, f"trejected.{delivery_id}", at)


async def test_triggers_and_deliveries(journal: Journal, story: MakeStory) -> None:
    ok = story(trigger_id="ado-pr", at=T0)
    asked = story(trigger_id="ado-pr", at=T0 + timedelta(minutes=10))
    broke = story(trigger_id="ado-pr", at=T0 + timedelta(minutes=20))
    other = story(trigger_id="gh", at=T0)
    await journal.send(
        _received("ado-pr", "d1", T0),
        _accepted("ado-pr", "d1", ok.run_id, T0 + timedelta(seconds=1)),
        _received("ado-pr", "d2", T0 + timedelta(minutes=10)),
        _accepted("ado-pr", "d2", asked.run_id, T0 + timedelta(minutes=10, seconds=1)),
        _received("ado-pr", "d3", T0 + timedelta(minutes=20)),
        _accepted("ado-pr", "d3", broke.run_id, T0 + timedelta(minutes=20, seconds=1)),
        _received("ado-pr", "d4", T0 + timedelta(minutes=30)),
        _trigger_rejected("ado-pr", "d4", "duplicate", T0 + timedelta(minutes=30, seconds=1)),
        _received("ado-pr", "d5", T0 + timedelta(minutes=40), "git.push"),
        _trigger_rejected("ado-pr", "d5", "unsupported_event", T0 + timedelta(minutes=40, seconds=1)),
        _received("ado-pr", "d6", T0 + timedelta(minutes=50)),
        _trigger_rejected("ado-pr", "d6", "duplicate", T0 + timedelta(minutes=50, seconds=1)),
        ok.requested(),
        ok.started(),
        ok.completed(),
        asked.requested(),
        asked.started(),
        asked.human_requested(),
        asked.answered(),
        asked.resumed(),
        asked.completed(),
        broke.requested(),
        broke.started(),
        broke.failed(),
        other.requested(),
    )
    response = await journal.client.get("/triggers")
    assert response.status_code == 200, response.text
    triggers = {t["trigger_id"]: t for t in response.json()["triggers"]}
    assert set(triggers) == {"ado-pr", "gh"}
    ado = triggers["ado-pr"]
    assert ado["deliveries_received"] == 6
    assert ado["deliveries_accepted"] == 3
    assert ado["deliveries_rejected"] == 2  # an ignored delivery (HTTP 200 ignored) is not a refusal
    assert ado["rejected_by_reason"] == {"duplicate": 2}
    assert (ado["deliveries_ignored"], ado["ignored_by_reason"]) == (1, {"unsupported_event": 1})
    assert datetime.fromisoformat(ado["last_delivery_at"]) == T0 + timedelta(minutes=50, seconds=1)
    assert ado["last_run"]["run_id"] == broke.run_id
    assert ado["last_run"]["state"] == "failed"
    assert (ado["runs_total"], ado["runs_completed"], ado["runs_failed"], ado["runs_needed_human"]) == (3, 2, 1, 1)
    gh = triggers["gh"]
    assert (gh["deliveries_received"], gh["runs_total"], gh["last_delivery_at"]) == (0, 1, None)
    assert gh["last_run"]["state"] == "pending"

    page = (await journal.client.get("/triggers/ado-pr/deliveries", params={"limit": 4})).json()
    assert page["trigger_id"] == "ado-pr"
    assert [d["delivery_id"] for d in page["deliveries"]] == ["d6", "d5", "d4", "d3"]
    d5 = page["deliveries"][1]
    assert (d5["outcome"], d5["reason"], d5["event_type"], d5["run_id"]) == (
        "ignored",
        "unsupported_event",
        "git.push",
        None,
    )
    d3 = page["deliveries"][3]
    assert (d3["outcome"], d3["reason"], d3["run_id"]) == ("accepted", None, broke.run_id)
    assert datetime.fromisoformat(d3["time"]) == T0 + timedelta(minutes=20)
    rest = (
        await journal.client.get("/triggers/ado-pr/deliveries", params={"limit": 4, "before": page["next_before"]})
    ).json()
    assert [d["delivery_id"] for d in rest["deliveries"]] == ["d2", "d1"]
    assert rest["next_before"] is None
    unknown = (await journal.client.get("/triggers/nope/deliveries")).json()
    assert unknown == {"trigger_id": "nope", "deliveries": [], "next_before": None}
    _assert_error(await journal.client.get("/triggers/ado-pr/deliveries", params={"limit": "1001"}), 422)
    _assert_error(
        await journal.client.get("/triggers/ado-pr/deliveries", params={"before": "@@"}), 422, "invalid_cursor"
    )
    _assert_error(await journal.client.get("/triggers/a%00b/deliveries"), 422)


# --------------------------------------------------------------------------- GET /analytics/human
async def test_human_analytics_match_the_history(journal: Journal, story: MakeStory) -> None:
    quick = story(agent="reviewer", trigger_id="ado-pr", at=T0)
    slow = story(agent="reviewer", trigger_id="ado-pr", at=T0 + timedelta(minutes=1))
    late = story(agent="triager", trigger_id="gh", at=T0 + timedelta(minutes=2))
    refused = story(agent="triager", trigger_id="gh", at=T0 + timedelta(minutes=3))
    silent = story(agent="reviewer", trigger_id="ado-pr", at=T0 + timedelta(minutes=4))
    asking = story(agent="triager", trigger_id="gh", at=T0 + timedelta(minutes=5))
    outside = story(agent="reviewer", trigger_id="ado-pr", at=T0 + timedelta(days=2))
    await journal.send(
        *(s.requested() for s in (quick, slow, late, refused, silent, asking, outside)),
        quick.human_requested(question="Merge it?"),
        quick.answered(waited_s=30),
        slow.human_requested(question="Merge it?"),
        slow.answered(waited_s=1000),
        late.human_requested(question="Which label?"),
        _expired(late),
        refused.human_requested(question="Merge it?"),
        _rejected(refused),
        asking.human_requested(question="Close as duplicate?"),
        outside.human_requested(question="Outside?"),
        outside.answered(waited_s=5),
    )
    params = {"since": T0.isoformat(), "until": (T0 + timedelta(days=1)).isoformat()}
    response = await journal.client.get("/analytics/human", params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["runs_total"] == 6
    assert body["runs_asked"] == 5
    assert body["asked_share"] == pytest.approx(5 / 6, abs=1e-4)
    assert (body["requests_total"], body["answered"], body["expired"], body["rejected"], body["pending"]) == (
        5,
        2,
        1,
        1,
        1,
    )
    wait = body["wait"]
    assert (wait["count"], wait["p50_s"], wait["p90_s"], wait["p99_s"], wait["max_s"]) == (2, 30, 1000, 1000, 1000)
    assert [b["count"] for b in wait["histogram"]] == [1, 0, 0, 1, 0, 0, 0]
    assert [b["lt_s"] for b in wait["histogram"]] == [60, 300, 900, 3600, 14400, 86400, None]
    # grouped per (trigger, agent, question shape): reviewer's two "Merge it?" apart from triager's one
    assert body["top_questions"][0] == {
        "question": "Merge it?",
        "count": 2,
        "shape": "merge it?",
        "agent": "reviewer",
        "trigger_id": "ado-pr",
        "share": 0.4,
        "distinct": 1,
        # OBS-1: no reason given (events as older executors write them); both answered in free text, no options
        "reason": None,
        "reason_kind": None,
        "answered": 2,
        "choices": [],
        "free_text": 2,
    }
    assert sorted((q["question"], q["agent"], q["count"]) for q in body["top_questions"]) == [
        ("Close as duplicate?", "triager", 1),
        ("Merge it?", "reviewer", 2),
        ("Merge it?", "triager", 1),
        ("Which label?", "triager", 1),
    ]
    by_agent = {b["key"]: b for b in body["by_agent"]}
    assert (by_agent["reviewer"]["runs_total"], by_agent["reviewer"]["runs_asked"]) == (3, 2)
    assert by_agent["reviewer"]["answered"] == 2
    triager = by_agent["triager"]
    assert (triager["expired"], triager["rejected"], triager["pending"]) == (1, 1, 1)
    assert [b["key"] for b in body["by_trigger"]] == ["ado-pr", "gh"]

    one = (await journal.client.get("/analytics/human", params={**params, "agent": "triager", "top": 1})).json()
    assert (one["runs_total"], one["requests_total"], one["answered"]) == (3, 3, 0)
    assert one["wait"]["count"] == 0
    assert one["wait"]["p50_s"] is None
    assert len(one["top_questions"]) == 1
    everything = (await journal.client.get("/analytics/human")).json()
    assert (everything["runs_total"], everything["answered"], everything["wait"]["p50_s"]) == (7, 3, 30)
    empty = (await journal.client.get("/analytics/human", params={"trigger_id": "none"})).json()
    assert (empty["runs_total"], empty["asked_share"], empty["by_agent"]) == (0, None, [])


@pytest.mark.parametrize(
    "params",
    [
        {"since": "not a date"},
        {"until": "2026-02-30T00:00:00Z"},
        {"since": "2026-11-02T00:00:00Z", "until": "2026-11-01T00:00:00+00:00"},
        {"top": "0"},
        {"top": "101"},
        {"top": str(2**63)},
        {"agent": "x" * 1000},
        {"until": "9999-12-31T23:59:59-12:00"},
        {"since": "0001-01-01T00:00:00+01:00"},
    ],
)
async def test_bad_analytics_input_is_422(journal: Journal, params: dict[str, str]) -> None:
    _assert_error(await journal.client.get("/analytics/human", params=params), 422)


async def test_new_routes_are_documented(journal: Journal) -> None:
    spec = (await journal.client.get("/openapi.json")).json()
    paths = spec["paths"]
    for path in ("/runs", "/runs/waiting", "/triggers", "/triggers/{trigger_id}/deliveries", "/analytics/human"):
        assert paths[path]["get"]["description"], path
    run_params = {p["name"]: p for p in paths["/runs"]["get"]["parameters"] if p["in"] == "query"}
    assert {"state", "trigger_id", "agent", "since", "until", "q", "before", "limit"} <= set(run_params)
    assert all(p.get("description") for p in run_params.values())
    assert "trigger API" in paths["/triggers"]["get"]["description"]


async def test_human_analytics_per_trigger_count_the_runs_by_how_they_ended(journal: Journal, story: MakeStory) -> None:
    """UI-2's successful runs beside the failed and cancelled ones, per trigger (and per agent), in the analytics:
    the console's "Per trigger" table shows them."""
    done = story(agent="reviewer", trigger_id="ado-pr", at=T0)
    broke = story(agent="reviewer", trigger_id="ado-pr", at=T0 + timedelta(minutes=1))
    stopped = story(agent="triager", trigger_id="gh", at=T0 + timedelta(minutes=2))
    going = story(agent="triager", trigger_id="gh", at=T0 + timedelta(minutes=3))
    await journal.send(
        *(s.requested() for s in (done, broke, stopped, going)),
        *(s.started() for s in (done, broke, stopped, going)),
        done.completed(),
        broke.failed(),
        stopped.cancelled(),
    )
    params = {"since": T0.isoformat(), "until": (T0 + timedelta(days=1)).isoformat()}

    async def ended() -> dict[str, Any] | None:
        body = (await journal.client.get("/analytics/human", params=params)).json()
        rows = {b["key"]: b for b in body["by_trigger"]}
        if (rows.get("gh") or {}).get("runs_cancelled") != 1:
            return None  # not all recorded yet
        return rows

    rows = await eventually(ended, 30, "the runs' endings in the analytics")
    assert [
        (k, r["runs_total"], r["runs_completed"], r["runs_failed"], r["runs_cancelled"]) for k, r in rows.items()
    ] == [
        ("ado-pr", 2, 1, 1, 0),
        ("gh", 2, 0, 0, 1),
    ]
