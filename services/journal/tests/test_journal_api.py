"""The HTTP API: filters, ordering, validation and error bodies, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from journal_support import VIEWER, api_auth

from temporality_bus import Bus
from temporality_journal import Database, Recorder, Settings, create_app
from temporality_protocol import TriggerAccepted, derive_id, make_event
from temporality_protocol.events import AgentMessageReceived

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal


def _assert_error(response: httpx.Response, status: int, error: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "detail"}
    assert body["error"] == error
    assert isinstance(body["detail"], str)
    assert body["detail"]


async def test_unknown_run_is_404(journal: Journal) -> None:
    _assert_error(await journal.client.get("/runs/run-nope"), 404, "run_not_found")
    _assert_error(await journal.client.get("/runs/run-nope/events"), 404, "run_not_found")
    _assert_error(await journal.client.get("/no/such/path"), 404, "not_found")


@pytest.mark.parametrize(
    "params",
    [{"state": "sleeping"}, {"limit": "0"}, {"limit": "1001"}, {"limit": "many"}],
)
async def test_bad_run_filters_are_422(journal: Journal, params: dict[str, str]) -> None:
    _assert_error(await journal.client.get("/runs", params=params), 422, "invalid_request")


async def test_bad_event_filters_are_422(journal: Journal) -> None:
    _assert_error(await journal.client.get("/events", params={"limit": "-1"}), 422, "invalid_request")
    # NATS's one-token * is no event type nor family (families are written human.>: test_journal_api_type_filter.py):
    # a 422 naming the parameter, not a 200 with no events
    for pattern in ("human.*", "agent.*", "agent.>.x"):
        refused = await journal.client.get("/events", params={"type": pattern})
        _assert_error(refused, 422, "invalid_request")
        assert "type" in refused.json()["detail"], refused.text
        streamed = await journal.client.get("/events/stream", params={"type": pattern})
        _assert_error(streamed, 422, "invalid_request")
    _assert_error(await journal.client.get("/runs/x/events", params={"after": "-1"}), 422, "invalid_request")


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/events", {"run_id": "run-\x00"}),
        ("/events", {"type": "run.\x00started"}),
        ("/runs/run-%00/events", {}),
        ("/runs/run-%00", {}),
        ("/runs", {"trigger_id": "t\x00"}),
    ],
)
async def test_a_nul_in_a_filter_is_422_on_both_databases(journal: Journal, path: str, params: dict[str, str]) -> None:
    """PostgreSQL refuses a text with U+0000 outright ("invalid byte sequence for encoding UTF8: 0x00": a 500 until
    2026-12-06 for these three), SQLite would just find nothing: every text the API reads refuses it first."""
    _assert_error(await journal.client.get(path, params=params), 422, "invalid_request")


async def test_runs_newest_first_filtered_by_state_and_limited(journal: Journal, story: MakeStory) -> None:
    old, mid, new = story(), story(), story()
    mid.at = old.at + timedelta(minutes=1)
    new.at = old.at + timedelta(minutes=2)
    await journal.send(old.requested(), mid.requested(), new.requested(), mid.started(), new.started(), new.failed())

    runs = (await journal.client.get("/runs")).json()["runs"]
    assert [r["run_id"] for r in runs] == [new.run_id, mid.run_id, old.run_id]
    assert [r["state"] for r in runs] == ["failed", "running", "pending"]
    assert runs[0]["error"] == "tool_error: boom"
    assert runs[0]["waiting"] is None

    running = (await journal.client.get("/runs", params={"state": "running"})).json()["runs"]
    assert [r["run_id"] for r in running] == [mid.run_id]
    limited = (await journal.client.get("/runs", params={"limit": 2})).json()["runs"]
    assert [r["run_id"] for r in limited] == [new.run_id, mid.run_id]
    assert (await journal.client.get("/runs", params={"state": "completed"})).json()["runs"] == []


async def test_events_filters_newest_first(journal: Journal, story: MakeStory) -> None:
    a, b = story(), story()
    await journal.send(a.requested(), b.requested(), a.started(), b.started())

    recent = (await journal.client.get("/events")).json()["events"]
    assert [(e["run_id"], e["type"]) for e in recent] == [
        (b.run_id, "run.started"),
        (a.run_id, "run.started"),
        (b.run_id, "run.requested"),
        (a.run_id, "run.requested"),
    ]
    only_a = (await journal.client.get("/events", params={"run_id": a.run_id})).json()["events"]
    assert [e["type"] for e in only_a] == ["run.started", "run.requested"]
    started = (await journal.client.get("/events", params={"type": "run.started", "limit": 1})).json()["events"]
    assert [e["run_id"] for e in started] == [b.run_id]


async def test_events_are_listed_and_paged_in_commit_order_not_stream_order(journal: Journal, story: MakeStory) -> None:
    """A redelivered event keeps its (low) stream sequence but is committed last: the list shows it where it
    was committed, as the live tail does, and the ``before`` cursor pages without repeating or skipping, also
    while new events are journaled between pages."""
    s = story()
    first, second, late = s.requested(), s.started(), s.human_requested()
    replica = Recorder(journal.database)  # a second writer on the same database, as in the tail tests
    assert await replica.record(first, 101)
    assert await replica.record(second, 102)
    assert await replica.record(late, 50)  # committed after 101 and 102, with a lower stream sequence

    listed = (await journal.client.get("/events", params={"run_id": s.run_id})).json()
    assert [e["id"] for e in listed["events"]] == [late.id, second.id, first.id]
    assert [e["stream_seq"] for e in listed["events"]] == [50, 102, 101]
    cursors = [e["commit_seq"] for e in listed["events"]]
    assert cursors == sorted(cursors, reverse=True)
    assert listed["next_before"] is None  # everything on one page

    page1 = (await journal.client.get("/events", params={"run_id": s.run_id, "limit": 2})).json()
    assert [e["id"] for e in page1["events"]] == [late.id, second.id]
    assert page1["next_before"] == page1["events"][-1]["commit_seq"]
    newer = s.answered()
    assert await replica.record(newer, 103)  # journaled between the pages: not in the older pages
    page2 = (
        await journal.client.get("/events", params={"run_id": s.run_id, "limit": 2, "before": page1["next_before"]})
    ).json()
    assert [e["id"] for e in page2["events"]] == [first.id]
    assert page2["next_before"] is None
    # the newest is on a fresh first page, and the other filters combine with the cursor
    assert (await journal.client.get("/events", params={"run_id": s.run_id, "limit": 1})).json()["events"][0][
        "id"
    ] == newer.id
    typed = (
        await journal.client.get("/events", params={"type": "run.requested", "before": page1["next_before"]})
    ).json()
    assert [e["id"] for e in typed["events"] if e["run_id"] == s.run_id] == [first.id]
    for bad in ("-1", "abc", "1.5"):
        _assert_error(await journal.client.get("/events", params={"before": bad}), 422, "invalid_request")


async def test_trajectory_pages_by_stream_sequence(journal: Journal, story: MakeStory) -> None:
    s = story()
    await journal.send(s.requested(), s.started(), s.human_requested())
    everything = (await journal.client.get(f"/runs/{s.run_id}/events")).json()["events"]
    after_first = (
        await journal.client.get(f"/runs/{s.run_id}/events", params={"after": everything[0]["stream_seq"]})
    ).json()
    assert after_first["run_id"] == s.run_id
    assert [e["id"] for e in after_first["events"]] == [e["id"] for e in everything[1:]]
    tail = (await journal.client.get(f"/runs/{s.run_id}/events", params={"after": everything[-1]["stream_seq"]})).json()
    assert tail["events"] == []  # a known run with nothing newer: 200, not 404
    assert tail["next_after"] is None

    # a page the limit cut says where the next begins; the last page says there is none
    first = (await journal.client.get(f"/runs/{s.run_id}/events", params={"limit": 2})).json()
    assert [e["id"] for e in first["events"]] == [e["id"] for e in everything[:2]]
    assert first["next_after"] == everything[1]["stream_seq"]
    rest = (
        await journal.client.get(f"/runs/{s.run_id}/events", params={"limit": 2, "after": first["next_after"]})
    ).json()
    assert [e["id"] for e in rest["events"]] == [everything[2]["id"]]
    assert rest["next_after"] is None
    exact = (await journal.client.get(f"/runs/{s.run_id}/events", params={"limit": 3})).json()
    assert len(exact["events"]) == 3
    assert exact["next_after"] is None  # all three fit: no next page


async def test_recorder_alone_is_idempotent(database: Database, bus: Bus, story: MakeStory) -> None:
    """Without the bus: the recorder reports whether an id was new, and the API reads the result."""
    s = story()
    recorder = Recorder(database)
    requested = s.requested()
    assert await recorder.record(requested, 1) is True
    assert await recorder.record(requested, 2) is False
    assert await recorder.record(s.started(), 3) is True
    app = create_app(Settings(), database, bus, api_auth())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://journal", headers=VIEWER) as client:
        events = (await client.get(f"/runs/{s.run_id}/events")).json()["events"]
        assert [(e["type"], e["stream_seq"]) for e in events] == [("run.requested", 1), ("run.started", 3)]
        assert (await client.get(f"/runs/{s.run_id}")).json()["last_event_seq"] == 3


async def test_a_run_known_only_from_events_is_answered_from_them(journal: Journal, story: MakeStory) -> None:
    """A run with no run event yet (only its trigger's acceptance and a notification; a relay run with only its
    message) is not a 404: ``/runs/{id}`` says what its events say, ``projected: false``."""
    s = story(trigger_id="ado-pr", agent="reviewer")
    accepted = make_event(
        TriggerAccepted(
            trigger_id="ado-pr", delivery_id="dlv-9", source_event_id="e-9", run_id=s.run_id, agent="reviewer"
        ),
        source="/t",
        id=derive_id("evt", s.run_id, "accepted"),
        run_id=s.run_id,
    )
    relay = f"{s.run_id}/ask/01"
    message = make_event(
        AgentMessageReceived(
            request_id="req-9",
            asker_run_id="run-asker",
            asker_agent="planner",
            to="agent:reviewer",
            resolved_run_id=s.run_id,
            resolved_agent="reviewer",
            recipient_run_id=relay,
            mode="async",
            timeout_s=300,
            message="Why?",
            relay=True,
            relay_run=relay,
        ),
        source="/t",
        id=derive_id("evt", relay, "received"),
        run_id=relay,
    )
    await journal.send(accepted, s.notified("web"), message)
    run = await journal.run(s.run_id)
    assert (run["projected"], run["state"], run["agent"], run["trigger_id"]) == (False, "pending", "reviewer", "ado-pr")
    assert run["last_event_seq"] is not None
    events = (await journal.client.get(f"/runs/{s.run_id}/events")).json()["events"]
    assert [e["type"] for e in events] == ["trigger.accepted", "human.notified"]
    relayed = await journal.run(quote(relay, safe=""))
    assert (relayed["run_id"], relayed["projected"], relayed["agent"]) == (relay, False, "reviewer")
    assert run["run_id"] not in [r["run_id"] for r in (await journal.client.get("/runs")).json()["runs"]]

    # once a run event arrives, the row answers
    await journal.send(s.requested(), s.started())
    run = await journal.run(s.run_id)
    assert (run["projected"], run["state"]) == (True, "running")


_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_events_carry_the_trace_context_they_were_published_with(journal: Journal, story: MakeStory) -> None:
    """From an event to its trace: ``traceparent``/``tracestate`` as the envelope carried them, and the trace id,
    on both reads (``/events``, a run's trajectory) and both write paths (the consumer's batch, one by one)."""
    s = story()
    traced = s.requested().model_copy(update={"traceparent": _TRACEPARENT, "tracestate": "vendor=opaque,x=1"})
    untraced = s.started()
    garbled = s.human_requested().model_copy(update={"traceparent": "not-a-traceparent"})
    await journal.send(traced, untraced, garbled)
    alone = s.notified().model_copy(
        update={"traceparent": _TRACEPARENT.replace("00f067aa0ba902b7", "b7ad6b7169203331")}
    )
    assert await journal.recorder.record(alone, 10_000)

    expected = {
        traced.id: (_TRACEPARENT, "vendor=opaque,x=1", "4bf92f3577b34da6a3ce929d0e0e4736"),
        untraced.id: (None, None, None),
        garbled.id: ("not-a-traceparent", None, None),  # kept as it came; no trace to look up
        alone.id: (alone.traceparent, None, "4bf92f3577b34da6a3ce929d0e0e4736"),
    }
    recent = (await journal.client.get("/events", params={"run_id": s.run_id})).json()["events"]
    trajectory = (await journal.client.get(f"/runs/{s.run_id}/events")).json()["events"]
    for events in (recent, trajectory):
        assert {e["id"]: (e["traceparent"], e["tracestate"], e["trace_id"]) for e in events} == expected


async def test_the_event_schema_documents_the_trace_fields(journal: Journal) -> None:
    schema = (await journal.client.get("/openapi.json")).json()["components"]["schemas"]["EventView"]
    for name in ("traceparent", "tracestate", "trace_id"):
        field = schema["properties"][name]
        assert {"type": "string"} in field["anyOf"], field
        assert {"type": "null"} in field["anyOf"], field
        assert "trace" in field["description"], field
