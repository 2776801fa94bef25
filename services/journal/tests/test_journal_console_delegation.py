"""OBS-1 on the console's Analytics page: "Why agents ask" (questions per reason_kind, the reasons given) and
"What people chose" (per most delegated question: answers per option, timeout defaults, free text). The journal as
the service runs it, events through the real bus, a real headless Chromium."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from journal_support import VIEWER_TOKEN
from playwright.async_api import BrowserContext, expect

from temporality_protocol import (
    Envelope,
    HumanAnswered,
    HumanOption,
    HumanPolicy,
    HumanRequested,
    OptionAnswer,
    TextAnswer,
    derive_id,
    make_event,
)

MakeStory = Callable[..., Any]  # journal_support.RunStory
Served = Any  # conftest.ServedJournal
WAIT_MS = 20_000
#: Shown as text, never parsed as HTML (the console renders with textContent).
HOSTILE_REASON = '<img src=x onerror="document.body.dataset.pwned=1"> compat undecided'


def _requested(s: Any, reason: str | None) -> Envelope:
    s.at += timedelta(seconds=1)
    data = HumanRequested(
        request_id=s.request_id,
        run_id=s.run_id,
        agent=s.agent,
        title=s.title,
        recipient="user:alice",
        question="Keep the v1 contract?",
        reason=reason,
        reason_kind="decision" if reason else None,
        options=[HumanOption(id="keep-v1", label="Keep v1"), HumanOption(id="ship-v2", label="Ship v2")],
        timeout_s=3600,
        expires_at=s.at + timedelta(hours=1),
        policy=HumanPolicy(allowed_recipients=["user:alice"]),
        turn=1,
    )
    return make_event(data, source="/t", id=derive_id("evt", "req", s.request_id), run_id=s.run_id, time=s.at)


def _answered(s: Any, answer: OptionAnswer | TextAnswer) -> Envelope:
    s.at += timedelta(seconds=1)
    data = HumanAnswered(
        request_id=s.request_id,
        run_id=s.run_id,
        recipient="user:alice",
        responder="user:alice",
        answer=answer,
        channel="web",
        waited_s=90,
    )
    return make_event(data, source="/t", id=derive_id("evt", "ans", s.request_id), run_id=s.run_id, time=s.at)


async def test_the_analytics_page_says_why_agents_ask_and_what_people_chose(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    runs = [story() for _ in range(4)]
    events = [s.requested() for s in runs]
    events += [_requested(s, HOSTILE_REASON if i < 3 else None) for i, s in enumerate(runs)]
    events += [
        _answered(runs[0], OptionAnswer(option_id="ship-v2")),
        _answered(runs[1], OptionAnswer(option_id="ship-v2")),
    ]
    events.append(_answered(runs[2], TextAnswer(value="ask the guild")))
    for event in events:
        await served_journal.bus.publish(event)
    await served_journal.wait_recorded(events[-1].id)

    page = await browser_context.new_page()
    await page.goto(f"{served_journal.url}/console/#/analytics")
    await page.get_by_label("API token").fill(VIEWER_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    # why: 3 decisions, 1 not given (an older executor's event), as bars and a table
    await expect(page.get_by_role("img", name="decision: 3")).to_be_visible(timeout=WAIT_MS)
    await expect(page.get_by_role("img", name="not given: 1")).to_be_visible()
    decision = page.locator('#delegation tr[data-kind="decision"]')
    await expect(decision.locator("td")).to_have_text(["3", "3", "3", "0", "0", "1 min"])
    await expect(page.locator("#top-reasons li")).to_have_text(
        [f"{HOSTILE_REASON} — 3\N{MULTIPLICATION SIGN} (decision)"]
    )
    # what people chose: two chose ship-v2, none keep-v1 (offered 4 times each), one answered in free text
    choices = page.locator("#choices section")
    await expect(choices).to_have_count(1)
    await expect(choices.locator("h3")).to_have_text("Keep the v1 contract? — 3 answered of 4")
    await expect(choices.locator('tr[data-option="ship-v2"] td')).to_have_text(["2", "66.7 %", "0", "4"])
    await expect(choices.locator('tr[data-option="keep-v1"] td')).to_have_text(["0", "0 %", "0", "4"])
    await expect(choices.locator('tr[data-option="ship-v2"] th')).to_have_text("Ship v2 [ship-v2]")
    await expect(choices.locator('tr[data-option=""] td').first).to_have_text("1")
    assert await page.evaluate("document.body.dataset.pwned") is None
    assert "[object" not in await page.locator("#analytics").inner_text()
