"""The journal's ``temporality_runs`` gauge: the runs by state its ``/metrics`` reports are the runs its own API
lists in each state, after real events through a real bus into the journal service (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from journal_support import VIEWER, RunStory, eventually, serve_journal, served_settings
from prometheus_client.parser import text_string_to_metric_families

from temporality_bus import Bus, NatsSettings
from temporality_journal.metrics import FAILURE_REASONS, OPEN_STATES, finished_as
from temporality_protocol import Envelope, RunFailed, RunState, make_event
from temporality_service import metrics


def _runs_gauge(text: str) -> dict[str, float]:
    return {
        sample.labels["state"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "temporality_runs" and sample.labels.get("service") == "journal"
    }


@pytest.mark.timeout(120)
async def test_runs_by_state_match_the_journals_runs(
    tmp_path: Path,
    nats_settings: NatsSettings,
    bus: Bus,
    database_url: str,
    story: Callable[..., RunStory],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics, "STATE_REFRESH_S", 0.2)
    queued, running, waiting, waiting_too, done = (story() for _ in range(5))
    events = [queued.requested()]
    events += [running.requested(), running.started()]
    for run in (waiting, waiting_too):
        events += [run.requested(), run.started(), run.human_requested()]
    events += [done.requested(), done.started(), done.completed()]
    expected = {state.value: 0.0 for state in OPEN_STATES} | {"pending": 1, "running": 1, "waiting_for_human": 2}

    settings = served_settings(tmp_path, nats_settings, database_url)
    async with (
        serve_journal(settings, bus) as journal,
        httpx.AsyncClient(base_url=journal.url, headers=VIEWER, timeout=30) as client,
    ):
        for event in events:
            await bus.publish(event)
        # every event recorded first: the gauge's expected counts also hold before done's three events are
        await journal.wait_recorded(events[-1].id)

        async def reported() -> dict[str, float] | None:
            response = await client.get("/metrics")
            assert response.status_code == 200
            gauge = _runs_gauge(response.text)
            return gauge if gauge == expected else None

        gauge = await eventually(reported, what=f"temporality_runs == {expected}")
        for state in OPEN_STATES:  # the same numbers as the journal's own list of runs in that state
            listed = (await client.get("/runs", params={"state": state.value})).json()["runs"]
            assert len(listed) == gauge[state.value], state
        assert "completed" not in gauge  # finished runs are not counted (the table only grows)

        # a run moving on moves the gauge: the waiting one is answered and resumes, then completes
        for event in (waiting.answered(), waiting.resumed(), waiting.completed()):
            await bus.publish(event)
        expected = expected | {"waiting_for_human": 1}
        await eventually(reported, what="one run waiting for a person less")


def _finished_counter(text: str) -> dict[tuple[str, str], float]:
    return {
        (sample.labels["outcome"], sample.labels["reason"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "temporality_runs_finished_total" and sample.labels.get("service") == "journal"
    }


def _failed(run: RunStory, reason: str) -> Envelope:
    return make_event(
        RunFailed(run_id=run.run_id, reason=reason, error="e"), source="/temporality/test", run_id=run.run_id
    )


def test_a_failure_s_outcome_and_reason_are_bounded() -> None:
    run = RunStory(run_id="run-x")
    assert finished_as(RunState.COMPLETED, run.completed()) == ("completed", "none")
    assert finished_as(RunState.CANCELLED, run.cancelled()) == ("cancelled", "none")
    assert finished_as(RunState.FAILED, _failed(run, "provider_error")) == ("failed", "provider_error")
    for reason in ("stalled", "compute_timeout", "human_request_expired"):
        assert finished_as(RunState.FAILED, _failed(run, reason)) == ("timed_out", reason)
    assert finished_as(RunState.FAILED, _failed(run, "a reason from a newer executor")) == ("failed", "other")
    assert finished_as(RunState.FAILED, run.failed()) == ("failed", "other")  # tool_error: not a known reason


@pytest.mark.timeout(120)
async def test_finished_runs_are_counted_once_by_outcome(
    tmp_path: Path,
    nats_settings: NatsSettings,
    bus: Bus,
    database_url: str,
    story: Callable[..., RunStory],
) -> None:
    """Runs finishing every way, through the real bus into the served journal: each counted once, by outcome
    and reason, whatever comes after (a redelivered or late terminal event counts nothing)."""
    completed, failed, stalled, cancelled, odd, open_run = (story() for _ in range(6))
    ending = {
        completed.run_id: completed.completed(),
        failed.run_id: _failed(failed, "provider_error"),
        stalled.run_id: _failed(stalled, "stalled"),
        cancelled.run_id: cancelled.cancelled(),
        odd.run_id: odd.failed(),
    }
    events = [
        e for run in (completed, failed, stalled, cancelled, odd, open_run) for e in (run.requested(), run.started())
    ]
    events += list(ending.values())
    events += [completed.failed(), ending[completed.run_id], cancelled.completed()]  # after the end: no new count

    settings = served_settings(tmp_path, nats_settings, database_url)
    async with (
        serve_journal(settings, bus) as journal,
        httpx.AsyncClient(base_url=journal.url, headers=VIEWER, timeout=30) as client,
    ):
        before = _finished_counter((await client.get("/metrics")).text)
        assert set(before) >= {("completed", "none"), ("cancelled", "none"), ("failed", "other")}
        assert {reason for _, reason in before} >= set(FAILURE_REASONS)  # every series there from the start
        assert set(before.values()) == {0.0}
        for event in events:
            await bus.publish(event)
        for event in events:
            await journal.wait_recorded(event.id)
        expected = before | {
            ("completed", "none"): 1,
            ("failed", "provider_error"): 1,
            ("timed_out", "stalled"): 1,
            ("cancelled", "none"): 1,
            ("failed", "other"): 1,
        }

        async def counted() -> dict[tuple[str, str], float] | None:
            counter = _finished_counter((await client.get("/metrics")).text)
            return counter if counter == expected else None

        await eventually(counted, what=f"temporality_runs_finished_total == {expected}")
        listed = (await client.get("/runs", params={"state": "running"})).json()["runs"]
        assert [run["run_id"] for run in listed] == [open_run.run_id]
