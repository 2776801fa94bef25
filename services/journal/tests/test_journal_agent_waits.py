"""A run that waits on another agent (``ask_agent`` in wait mode, COL-2) is ``waiting_for_agent`` in the journal:
whom (the address the model wrote), what (its message), since when; the answer, the expiry or an undeliverable
address ends the wait, and ``run.resumed`` moves it on. Pure projection first, then the waiting-runs view."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from journal_support import VIEWER_TOKEN, replay_states
from playwright.async_api import BrowserContext, expect

from temporality_protocol import (
    AgentAnswerReceived,
    AgentAsked,
    AgentAskExpired,
    AgentAskUndeliverable,
    Envelope,
    EventData,
    RunResumed,
    RunState,
    derive_id,
    make_event,
)

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal
Served = Any  # journal_support.ServedJournal
WAIT_MS = 20_000

REQUEST = "req-" + "a" * 16


def _event(s: Any, data: EventData, name: str) -> Envelope:
    s.at += timedelta(seconds=1)
    return make_event(data, source="/temporality/test", id=derive_id("evt", s.run_id, name), run_id=s.run_id, time=s.at)


def _asked(s: Any, mode: Literal["async", "wait"] = "wait", request_id: str = REQUEST) -> Envelope:
    data = AgentAsked(
        request_id=request_id,
        asker_run_id=s.run_id,
        asker_agent="reviewer",
        to="agent:security",
        mode=mode,
        timeout_s=300,
        message="Is this dependency bump safe?",
    )
    return _event(s, data, f"asked.{request_id}")


def _answered(s: Any, *, late: bool = False, request_id: str = REQUEST) -> Envelope:
    data = AgentAnswerReceived(
        request_id=request_id,
        asker_run_id=s.run_id,
        replier_run_id="run-security",
        replier_agent="security",
        outcome="answer",
        answer="Yes, no CVE.",
        mode="wait",
        late=late,
        waited_s=12.0,
    )
    return _event(s, data, f"answer.{request_id}.{late}")


def _expired(s: Any) -> Envelope:
    data = AgentAskExpired(
        request_id=REQUEST, asker_run_id=s.run_id, recipient_run_id="run-security", timeout_s=300, waited_s=300
    )
    return _event(s, data, "expired")


def _undeliverable(s: Any) -> Envelope:
    data = AgentAskUndeliverable(
        request_id=REQUEST,
        asker_run_id=s.run_id,
        to="agent:security",
        reason="unknown_addressee",
        detail="no agent security in this saga",
    )
    return _event(s, data, "undeliverable")


def _resumed(s: Any) -> Envelope:
    data = RunResumed(run_id=s.run_id, reason="answer", from_turn=1, request_id=REQUEST, waited_s=12)
    return _event(s, data, "resumed")


def test_a_waiting_ask_parks_the_run_on_the_agent_and_its_answer_moves_it_on(story: MakeStory) -> None:
    s = story()
    asked_at = s.at + timedelta(seconds=3)
    states = replay_states([s.requested(), s.started(), _asked(s), _answered(s), _resumed(s), s.completed()])
    waiting = states[2]
    assert waiting.state is RunState.WAITING_FOR_AGENT
    assert waiting.waiting_request_id == REQUEST
    assert waiting.waiting_recipient == "agent:security"
    assert waiting.waiting_question == "Is this dependency bump safe?"
    assert waiting.waiting_since == asked_at
    assert waiting.waiting_channel is None
    assert [r.state for r in states[3:]] == [RunState.RESUMING, RunState.RUNNING, RunState.COMPLETED]
    for run in states[3:]:
        assert (run.waiting_request_id, run.waiting_recipient, run.waiting_since, run.waiting_question) == (
            None,
            None,
            None,
            None,
        )


def test_an_async_ask_moves_nothing(story: MakeStory) -> None:
    s = story()
    states = replay_states([s.requested(), s.started(), _asked(s, mode="async")])
    assert states[-1].state is RunState.RUNNING
    assert states[-1].waiting_request_id is None


def test_the_expiry_or_an_undeliverable_address_ends_the_wait_a_late_answer_does_not(story: MakeStory) -> None:
    s = story()
    expired = replay_states([s.requested(), s.started(), _asked(s), _expired(s), _resumed(s), _answered(s, late=True)])
    assert [r.state for r in expired[3:]] == [RunState.RESUMING, RunState.RUNNING, RunState.RUNNING]
    t = story(run_id="run-undeliverable")
    undeliverable = replay_states([t.requested(), t.started(), _asked(t), _undeliverable(t)])
    assert undeliverable[-1].state is RunState.RESUMING


def test_an_answer_to_another_request_leaves_the_wait_alone(story: MakeStory) -> None:
    s = story()
    states = replay_states([s.requested(), s.started(), _asked(s), _answered(s, request_id="req-" + "b" * 16)])
    assert states[-1].state is RunState.WAITING_FOR_AGENT
    assert states[-1].waiting_request_id == REQUEST


async def test_the_waiting_view_lists_runs_waiting_on_agents_beside_runs_waiting_on_people(
    journal: Journal, story: MakeStory
) -> None:
    now = datetime.now(UTC)
    on_agent = story(run_id="run-on-agent", at=now - timedelta(minutes=20))
    on_person = story(run_id="run-on-person", at=now - timedelta(minutes=5))
    answered = story(run_id="run-answered", at=now - timedelta(minutes=30))
    await journal.send(
        on_agent.requested(),
        on_agent.started(),
        _asked(on_agent),
        on_person.requested(),
        on_person.started(),
        on_person.human_requested(recipient="user:bob", question="Ship it?"),
        answered.requested(),
        answered.started(),
        _asked(answered),
        _answered(answered),
    )
    response = await journal.client.get("/runs/waiting")
    assert response.status_code == 200, response.text
    runs = response.json()["runs"]
    assert [(r["run_id"], r["state"]) for r in runs] == [
        ("run-on-agent", "waiting_for_agent"),
        ("run-on-person", "waiting_for_human"),
    ]
    waiting = runs[0]["waiting"]
    assert (waiting["request_id"], waiting["recipient"], waiting["channel"], waiting["question"]) == (
        REQUEST,
        "agent:security",
        None,
        "Is this dependency bump safe?",
    )
    assert waiting["waiting_s"] > 15 * 60
    assert (await journal.run("run-answered"))["state"] == "resuming"
    filtered = (await journal.client.get("/runs", params={"state": "waiting_for_agent"})).json()["runs"]
    assert [r["run_id"] for r in filtered] == ["run-on-agent"]


async def test_the_console_shows_whom_a_run_waits_on_and_drops_it_when_the_answer_arrives(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    """In Chromium: the waiting list names the agent asked, what and since when; the run's timeline has a live
    "Waiting" step after the ask; the answer and the resume, arriving over the live tail, take it off the list."""
    s = story(title="Review PR 7", at=datetime.now(UTC) - timedelta(minutes=12))
    events = [s.requested(), s.started(), _asked(s)]
    for event in events:
        await served_journal.bus.publish(event)
    await served_journal.wait_recorded(events[-1].id)

    page = await browser_context.new_page()
    await page.goto(f"{served_journal.url}/console/#/waiting")
    await page.get_by_label("API token").fill(VIEWER_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    row = page.locator(f'#waiting tr[data-run-id="{s.run_id}"]')
    await expect(row).to_be_visible(timeout=WAIT_MS)
    cells = row.locator("td")
    await expect(cells.nth(1)).to_have_text("agent:security")
    await expect(cells.nth(2)).to_have_text("agent (ask_agent)")
    await expect(cells.nth(3)).to_have_text("Is this dependency bump safe?")
    await expect(cells.nth(6)).to_have_text("waiting for agent")

    await row.get_by_role("link").click()
    steps = page.locator("#timeline > li .step-title")
    await expect(steps).to_have_text(
        [
            "Trigger ado-pr",
            "Run started",
            "Asked agent security: Is this dependency bump safe?",
            re.compile(r"^Waiting 1[123] min$"),  # asked ~12 minutes ago
        ],
        timeout=WAIT_MS,
    )
    await expect(page.locator("#run-header")).to_contain_text("agent:security")

    await page.goto(f"{served_journal.url}/console/#/waiting")
    await expect(row).to_be_visible(timeout=WAIT_MS)
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    answered = [_answered(s), _resumed(s)]
    for event in answered:
        await served_journal.bus.publish(event)
    await expect(row).to_have_count(0, timeout=WAIT_MS)
