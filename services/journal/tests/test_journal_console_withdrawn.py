"""A question still open when its run is cancelled reads "Question withdrawn: the run was cancelled" in the run's
timeline: from human-interaction's ``human.withdrawn`` (its details one click away, like any event's), or, for
history journaled before that event existed, derived from the run's end -- once either way. In a real headless
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
    # the run's end journaled before human-interaction's human.withdrawn (as in history from before that event):
    # the timeline derives the withdrawal from the end
    await publish_recorded(served_journal, s.cancelled())
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


async def test_a_human_withdrawn_event_is_the_step_once_with_its_details(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory
) -> None:
    s = story(title="Review PR 44")
    await publish_recorded(
        served_journal, s.requested(), s.created(), s.started(), s.human_requested(), s.notified("web"), s.cancelled()
    )
    page = await viewer_page(browser_context, served_journal, f"#/runs/{s.run_id}")
    withdrawn = page.locator('#timeline > li[data-type="human.withdrawn"]')
    await expect(withdrawn.locator("details")).to_have_count(0, timeout=WAIT_MS)  # derived, until the event comes
    await publish_recorded(served_journal, s.withdrawn("run_cancelled", waited_s=600))
    steps = page.locator("#timeline > li .step-title")
    expected = [
        "Trigger ado-pr",
        "Run created",
        "Run started",
        "Human request",
        "Notified alice on web",
        "Cancelled",
        "Question withdrawn: the run was cancelled",  # the event's step, not a second, derived one
    ]
    await expect(steps).to_have_text(expected, timeout=WAIT_MS)
    await expect(withdrawn).to_have_count(1)
    await expect(withdrawn.locator("details")).to_have_count(1)  # its event, one click away
    await expect(withdrawn).to_contain_text("Merge it?")
    await expect(withdrawn).to_contain_text(s.request_id)
    await expect(withdrawn).to_contain_text("10 min")  # open for: the event's waited_s
    await expect(withdrawn).to_contain_text("by user:bob")  # the run's own reason
    await withdrawn.locator("summary").click()
    await expect(withdrawn.locator("pre")).to_contain_text('"type": "human.withdrawn"')
    await page.reload()
    await expect(page.locator("#timeline > li .step-title")).to_have_text(expected, timeout=WAIT_MS)

    # HUM-7: a question the run no longer needed (another was answered first) says why, while the run goes on
    first = story(title="Review PR 45")
    await publish_recorded(
        served_journal, first.requested(), first.started(), first.human_requested(), first.withdrawn("not_needed")
    )
    await page.goto(f"{served_journal.url}/console/#/runs/{first.run_id}")
    await expect(page.locator("#timeline > li .step-title").last).to_have_text(
        "Question withdrawn: another question was answered first", timeout=WAIT_MS
    )
