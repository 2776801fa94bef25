"""The journal's ``temporality_runs`` gauge: the runs by state its ``/metrics`` reports are the runs its own API
lists in each state, after real events through a real bus into the journal service (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from journal_support import VIEWER, eventually, serve_journal, served_settings
from prometheus_client.parser import text_string_to_metric_families

from conftest import RunStory
from temporality_bus import Bus, NatsSettings
from temporality_journal.metrics import OPEN_STATES
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
        httpx.AsyncClient(base_url=journal.url, headers=VIEWER, timeout=10) as client,
    ):
        for event in events:
            await bus.publish(event)

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
