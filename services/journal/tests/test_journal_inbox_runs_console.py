"""The web inbox tells two runs' same question apart: each card shows its run (short id; a link to the timeline
for a tab with a role, text for an inbox token alone) and when it was asked -- in a real headless Chromium
against the journal with the real human-interaction behind its ``/human/`` proxy, on a real nats-server; every
browser assertion waits on its condition with a timeout.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from journal_support import ServedJournal, viewer_page
from playwright.async_api import BrowserContext, expect

from temporality_protocol import (
    HumanPolicy,
    HumanRequested,
)

MakeStory = Callable[..., Any]  # journal_support.RunStory
WAIT_MS = 20_000
pytestmark = pytest.mark.timeout(180)


async def _ask_bob(served: ServedJournal, run_id: str, asked_at: datetime) -> str:
    request_id = f"hreq-{uuid.uuid4().hex[:12]}"
    data = HumanRequested(
        request_id=request_id,
        run_id=run_id,
        agent="reviewer",
        title="Review PR 42",
        recipient="user:bob",
        question="Merge PR 42?",
        timeout_s=3600,
        expires_at=asked_at + timedelta(hours=1),
        policy=HumanPolicy(allowed_recipients=["user:bob"]),
        turn=1,
    )
    await served.ask(data, trigger_id="ado-pr", time=asked_at)
    return request_id


async def test_the_inbox_tells_two_runs_same_question_apart(
    served_journal_with_human: ServedJournal, browser_context: BrowserContext
) -> None:
    served = served_journal_with_human
    now = datetime.now(UTC)
    one, two = (f"run-{uuid.uuid4().hex[:12]}" for _ in range(2))
    first = await _ask_bob(served, one, now - timedelta(minutes=20))
    second = await _ask_bob(served, two, now - timedelta(minutes=2))

    # an operator's tab (an API token) signed in to bob's inbox too: the run links to its timeline
    page = await viewer_page(browser_context, served, "#/runs")
    await page.goto(f"{served.url}/console/#/inbox")
    await page.get_by_label("Inbox token").fill("bob-inbox-token")
    await page.keyboard.press("Enter")
    cards = {rid: page.locator(f'#inbox .inbox-item[data-request-id="{rid}"]') for rid in (first, second)}
    for rid, run_id in ((first, one), (second, two)):
        asked = cards[rid].locator(".asked")
        await expect(asked).to_contain_text(f"Run {run_id[:12]}…", timeout=WAIT_MS)
        await expect(asked.get_by_role("link")).to_have_attribute("title", run_id)
    await expect(cards[first].locator(".asked")).to_contain_text(re.compile(r"asked .+ \((19|20|21) min ago\)"))
    await expect(cards[second].locator(".asked")).to_contain_text(re.compile(r"asked .+ \((1|2|3) min ago\)"))
    await cards[first].locator(".asked").get_by_role("link").click()
    await expect(page.locator("h1")).to_have_text(f"Run {one}", timeout=WAIT_MS)

    # bob alone (his inbox token, no API token): the run id as text, no link into pages he may not read
    alone = await browser_context.browser.new_context()  # type: ignore[union-attr]
    try:
        bob = await alone.new_page()
        await bob.goto(f"{served.url}/console/#/inbox")
        await bob.get_by_label("Inbox token").fill("bob-inbox-token")
        await bob.keyboard.press("Enter")
        asked = bob.locator(f'#inbox .inbox-item[data-request-id="{second}"] .asked')
        await expect(asked).to_contain_text(f"Run {two[:12]}…", timeout=WAIT_MS)
        await expect(asked.get_by_role("link")).to_have_count(0)
        await expect(asked.locator("code")).to_have_attribute("title", two)
    finally:
        await alone.close()
