"""A question still open when its run is cancelled reads "Question withdrawn: the run was cancelled" in the run's
timeline (derived from the run's end: human-interaction publishes no human.* event for it) -- in a real headless
Chromium against the journal service on a real port, fed through a real nats-server; every browser assertion
waits on its condition with a timeout.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from journal_support import ServedJournal, publish_recorded, viewer_page
from playwright.async_api import BrowserContext, expect

MakeStory = Callable[..., Any]  # journal_support.RunStory
WAIT_MS = 20_000
pytestmark = pytest.mark.timeout(180)


async def test_a_cancelled_run_s_open_question_reads_withdrawn_in_its_timeline(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory
) -> None:
    s = story(title="Review PR 42")
    await publish_recorded(
        served_journal, s.requested(), s.created(), s.started(), s.human_requested(), s.notified("web")
    )
    page = await viewer_page(browser_context, served_journal, f"#/runs/{s.run_id}")
    steps = page.locator("#timeline > li .step-title")
    # the question's wait, up to now, comes after everything journaled (time order)
    await expect(steps.nth(-2)).to_have_text("Notified alice on web", timeout=WAIT_MS)
    await expect(steps.last).to_have_text(re.compile(r"^Waiting \d+ min$"))
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    await publish_recorded(served_journal, s.cancelled())  # human-interaction withdraws the question: no human.* event
    await expect(steps).to_have_text(
        [
            "Trigger ado-pr",  # run.requested without a trigger.accepted before it
            "Run created",
            "Run started",
            "Human request",
            "Notified alice on web",
            "Cancelled",
            "Question withdrawn: the run was cancelled",
        ],
        timeout=WAIT_MS,
    )
    withdrawn = page.locator('#timeline > li[data-type="human.withdrawn"]')
    await expect(withdrawn).to_contain_text("Merge it?")
    await expect(withdrawn).to_contain_text(s.request_id)
    await expect(withdrawn.locator("details")).to_have_count(0)  # derived from the run's end: no event of its own
    # derived at read time: the same after a reload
    await page.reload()
    await expect(page.locator('#timeline > li[data-type="human.withdrawn"] .step-title')).to_have_text(
        "Question withdrawn: the run was cancelled", timeout=WAIT_MS
    )
    # an answered question is not withdrawn when its run completes
    done = story(title="Review PR 43")
    await publish_recorded(
        served_journal,
        done.requested(),
        done.started(),
        done.human_requested(),
        done.answered(),
        done.resumed(),
        done.completed(),
    )
    await page.goto(f"{served_journal.url}/console/#/runs/{done.run_id}")
    await expect(page.locator("#timeline > li .step-title").last).to_have_text("Completed", timeout=WAIT_MS)
    await expect(page.locator('#timeline > li[data-type="human.withdrawn"]')).to_have_count(0)
