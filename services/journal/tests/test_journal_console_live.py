"""The console's Triggers, deliveries and Analytics pages update live, and the "live" badge says what the page's
tail does (none on a page without one) -- in a real headless Chromium (Playwright driving Debian's chromium)
against the journal service on a real port, fed through a real nats-server. Every browser assertion waits on
its condition with a timeout (Playwright's ``expect``); no reload between an event and what the page shows.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from journal_support import VIEWER_TOKEN, ServedJournal, publish_recorded, viewer_page
from playwright.async_api import BrowserContext, expect

from temporality_protocol import (
    Envelope,
    TriggerAccepted,
    TriggerReceived,
    TriggerRejected,
    derive_id,
    make_event,
)

MakeStory = Callable[..., Any]  # journal_support.RunStory
WAIT_MS = 20_000
pytestmark = pytest.mark.timeout(180)


def _delivery(
    s: Any, delivery_id: str, reason: Any = None, event_type: str = "git.pullrequest.created"
) -> list[Envelope]:
    """A delivery of ``s``'s trigger: received, then accepted (starting ``s``'s run) or rejected with ``reason``."""
    received = TriggerReceived(
        trigger_id=s.trigger_id,
        delivery_id=delivery_id,
        adapter="azure_devops.pull_request",
        source_event_id=f"src-{delivery_id}",
        source_event_type=event_type,
        body_bytes=100,
    )
    decided: Any = (
        TriggerAccepted(
            trigger_id=s.trigger_id,
            delivery_id=delivery_id,
            source_event_id=f"src-{delivery_id}",
            run_id=s.run_id,
            agent=s.agent,
        )
        if reason is None
        else TriggerRejected(trigger_id=s.trigger_id, delivery_id=delivery_id, reason=reason, detail="not taken")
    )
    run_id = s.run_id if reason is None else None
    return [
        make_event(received, source="/temporality/test", id=derive_id("evt", delivery_id, "received")),
        make_event(decided, source="/temporality/test", id=derive_id("evt", delivery_id, "decided"), run_id=run_id),
    ]


async def test_triggers_deliveries_and_analytics_pages_update_live(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory
) -> None:
    trigger = f"live-{uuid.uuid4().hex[:6]}"
    first = story(trigger_id=trigger, title="Review PR 1")
    await publish_recorded(served_journal, *_delivery(first, f"{trigger}-d1"), first.requested(), first.started())
    page = await viewer_page(browser_context, served_journal, "#/triggers")
    row = page.locator(f'#triggers tr[data-trigger-id="{trigger}"]')
    await expect(row.locator(".accepted-received")).to_have_text("1 / 1", timeout=WAIT_MS)
    await expect(row.locator("td").nth(6)).to_have_text("0")  # successful runs
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    await expect(page.locator("#live")).to_have_text("live")

    # an accepted delivery and a completed run, an ignored ping and a refused duplicate: the row moves, no reload
    second = story(trigger_id=trigger, title="Review PR 2")
    await publish_recorded(
        served_journal,
        *_delivery(second, f"{trigger}-d2"),
        second.requested(),
        second.started(),
        first.completed(),
        *_delivery(second, f"{trigger}-ping", "unsupported_event", "ping"),
        *_delivery(second, f"{trigger}-dup", "duplicate"),
    )
    await expect(row.locator(".accepted-received")).to_have_text("2 / 4", timeout=WAIT_MS)
    await expect(row.locator("td").nth(6)).to_have_text("1")
    await expect(row.locator("td.deliveries .muted")).to_have_text("1 ignored · 1 refused")

    # one trigger's deliveries: the ping reads "ignored", the duplicate "rejected"; a new one arrives live
    await row.get_by_role("link", name=trigger).click()
    deliveries = page.locator("#deliveries")
    await expect(deliveries.locator(f'tr[data-delivery-id="{trigger}-ping"] .outcome')).to_have_text(
        "ignored", timeout=WAIT_MS
    )
    await expect(deliveries.locator(f'tr[data-delivery-id="{trigger}-dup"] .outcome')).to_have_text("rejected")
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    await publish_recorded(served_journal, *_delivery(second, f"{trigger}-filtered", "filtered"))
    await expect(deliveries.locator(f'tr[data-delivery-id="{trigger}-filtered"] .outcome')).to_have_text(
        "ignored", timeout=WAIT_MS
    )

    # analytics: a question asked, then its run cancelled -- pending, then withdrawn, live
    await page.get_by_role("link", name="Analytics").click()
    analytics = page.locator("#analytics")
    await expect(analytics).to_contain_text("Runs that asked a human", timeout=WAIT_MS)
    await expect(page.get_by_role("img", name="pending: 0")).to_be_visible(timeout=WAIT_MS)
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    await publish_recorded(served_journal, second.human_requested(question="Merge PR 2?"))
    await expect(page.get_by_role("img", name="pending: 1")).to_be_visible(timeout=WAIT_MS)
    await expect(analytics).to_contain_text("Merge PR 2?")
    await publish_recorded(served_journal, second.cancelled())
    await expect(page.get_by_role("img", name="withdrawn: 1")).to_be_visible(timeout=WAIT_MS)
    await expect(page.get_by_role("img", name="pending: 0")).to_be_visible()


async def test_a_page_without_a_live_tail_shows_no_live_badge(
    served_journal: ServedJournal, browser_context: BrowserContext
) -> None:
    page = await browser_context.new_page()
    await page.goto(f"{served_journal.url}/console/#/runs")
    await expect(page.get_by_label("API token")).to_be_visible(timeout=WAIT_MS)
    await expect(page.locator("#live")).to_be_hidden()  # signed out: nothing is live
    await page.get_by_label("API token").fill(VIEWER_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    await page.goto(f"{served_journal.url}/console/#/wizard")  # the wizard reads the gateway once: no tail
    await expect(page.locator("#live")).to_be_hidden(timeout=WAIT_MS)
    await page.get_by_role("link", name="Waiting").click()
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    await expect(page.locator("#live")).to_be_visible()
