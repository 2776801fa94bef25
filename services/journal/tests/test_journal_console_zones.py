"""The console's times name their zone, and the instants it writes into an address mean the same in every zone --
in real headless Chromium contexts set to different time zones (Playwright driving Debian's chromium) against
the journal service on a real port (and the real human-interaction behind its ``/human/`` proxy for the inbox).
Every browser assertion waits on its condition with a timeout (Playwright's ``expect``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from journal_support import ServedJournal, publish_recorded, viewer_page
from playwright.async_api import Browser, BrowserContext, expect

from temporality_protocol import HumanOption, HumanPolicy, HumanRequested
from temporality_protocol.events import Escalate, TimeoutPolicy

MakeStory = Callable[..., Any]  # journal_support.RunStory
WAIT_MS = 20_000
pytestmark = pytest.mark.timeout(150)
BERLIN, LOS_ANGELES = "Europe/Berlin", "America/Los_Angeles"


@pytest.fixture
def browser(browser_context: BrowserContext) -> Browser:
    """The test's Chromium, for contexts of their own time zone (closed with it)."""
    assert browser_context.browser is not None
    return browser_context.browser


def _shots() -> Path:
    """A scratch folder for this test's screenshots (not the docs' images)."""
    folder = Path("/tmp/console-outage-shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def _in_zone(browser: Browser, zone: str) -> BrowserContext:
    return await browser.new_context(viewport={"width": 1366, "height": 900}, locale="en-GB", timezone_id=zone)


async def test_the_inbox_says_the_deadline_once_in_the_reader_s_zone_with_what_happens_then(
    browser: Browser, served_journal_with_human: ServedJournal
) -> None:
    served = served_journal_with_human
    asked = datetime.now(UTC).replace(microsecond=0)
    expires = asked + timedelta(hours=1)
    request = HumanRequested(
        request_id=f"hreq-{uuid.uuid4().hex[:12]}",
        run_id=f"run-{uuid.uuid4().hex[:12]}",
        agent="reviewer",
        title="Review PR 42",
        recipient="user:alice",
        question="Keep the v1 contract?",
        options=[HumanOption(id="keep-v1", label="Keep v1"), HumanOption(id="ship-v2", label="Ship v2")],
        timeout_s=3600,
        expires_at=expires,
        policy=HumanPolicy(
            allowed_recipients=["user:alice"],
            on_timeout=TimeoutPolicy(
                action="default", default_option="keep-v1", escalate=Escalate(to="user:bob", after_s=1800)
            ),
        ),
        turn=1,
    )
    await served.ask(request, time=asked)
    context = await _in_zone(browser, BERLIN)
    try:
        page = await context.new_page()
        await page.goto(f"{served.url}/console/#/inbox")
        await page.get_by_label("Inbox token").fill("alice-inbox-token")
        await page.keyboard.press("Enter")
        deadline = page.locator(f'.inbox-item[data-request-id="{request.request_id}"] .deadline')
        berlin = ZoneInfo(BERLIN)
        due = expires.astimezone(berlin).strftime("%H:%M:%S")
        escalated = (asked + timedelta(seconds=1800)).astimezone(berlin).strftime("%H:%M:%S")
        # once, in Berlin time with its zone named: no second deadline in UTC (the chats' sentence)
        await expect(deadline).to_have_text(
            re.compile(
                rf"^Answer by \d{{1,2}} \w{{3}} \d{{4}}, {due} (CET|GMT\+1) \(in (59|60) min\)\. "
                rf"Before then, it also goes to bob at \d{{1,2}} \w{{3}} \d{{4}}, {escalated} (CET|GMT\+1)\. "
                r"Without an answer by then, the run goes on with “Keep v1”\.$"
            ),
            timeout=WAIT_MS,
        )
        assert "UTC" not in await deadline.inner_text()
        await expect(deadline.locator("time")).to_have_attribute("datetime", re.compile(r"^\d{4}-\d\d-\d\dT"))
        await page.screenshot(path=str(_shots() / "inbox-deadline.png"))
    finally:
        await context.close()


async def test_an_analytics_or_runs_link_means_the_same_instants_in_every_zone_and_old_links_read_as_before(
    browser: Browser, served_journal: ServedJournal, story: MakeStory
) -> None:
    # a run created at 09:30 UTC on 1 December: 10:30 in Berlin, 01:30 in Los Angeles
    inside = story(at=datetime(2026, 12, 1, 9, 29, 59, tzinfo=UTC), title="Created at 09:30 UTC")
    await publish_recorded(served_journal, inside.requested(), inside.human_requested(question="Merge it?"))

    berlin = await _in_zone(browser, BERLIN)
    los_angeles = await _in_zone(browser, LOS_ANGELES)
    try:
        page = await viewer_page(berlin, served_journal, "#/analytics")
        await page.locator("#analytics-period").select_option("range")
        await page.get_by_label("From", exact=True).fill("2026-12-01T10:00")  # Berlin time: 09:00 UTC
        await page.get_by_label("Before", exact=True).fill("2026-12-01T11:00")
        await page.get_by_role("button", name="Show").click()
        await expect(page).to_have_url(
            re.compile(r"since=2026-12-01T10%3A00%2B01%3A00&until=2026-12-01T11%3A00%2B01%3A00$"), timeout=WAIT_MS
        )
        scope = page.locator("#analytics-scope")
        await expect(scope).to_have_text(
            re.compile(
                r"^Runs created from 1 Dec 2026, 10:00:00 (CET|GMT\+1) to before 1 Dec 2026, 11:00:00 (CET|GMT\+1)$"
            ),
            timeout=WAIT_MS,
        )
        await expect(page.locator("#analytics dl.facts")).to_contain_text("Runs1", timeout=WAIT_MS)
        shared = page.url

        # the same link in Los Angeles: the same hour (01:00-02:00 there), the same run, the zone named
        other = await viewer_page(los_angeles, served_journal, "#/runs")
        await other.goto(shared)
        await expect(other.locator("#analytics-scope")).to_have_text(
            re.compile(
                r"^Runs created from 1 Dec 2026, 01:00:00 (PST|GMT-8) to before 1 Dec 2026, 02:00:00 (PST|GMT-8)$"
            ),
            timeout=WAIT_MS,
        )
        await expect(other.locator("#analytics dl.facts")).to_contain_text("Runs1", timeout=WAIT_MS)
        await expect(other.get_by_label("From", exact=True)).to_have_value("2026-12-01T01:00")
        # the same typed into a link by hand, "+" and all (a query's "+" arrives as a space)
        await other.goto(
            f"{served_journal.url}/console/#/analytics?since=2026-12-01T10:00+01:00&until=2026-12-01T11:00+01:00"
        )
        await expect(other.locator("#analytics-scope")).to_contain_text(
            re.compile(r"from 1 Dec 2026, 01:00:00 (PST|GMT-8)"), timeout=WAIT_MS
        )

        # a link from before (no zone) is read in the reader's time, as it always was: 10:00 in Los Angeles
        await other.goto(f"{served_journal.url}/console/#/analytics?since=2026-12-01T10:00&until=2026-12-01T11:00")
        await expect(other.locator("#analytics-scope")).to_contain_text(
            re.compile(r"from 1 Dec 2026, 10:00:00 (PST|GMT-8)"), timeout=WAIT_MS
        )
        await expect(other.locator("#analytics dl.facts")).to_contain_text("Runs0", timeout=WAIT_MS)

        # the Runs list's "Created since" alike
        await page.goto(f"{served_journal.url}/console/#/runs")
        await page.get_by_label("Created since").fill("2026-12-01T10:00")
        await page.get_by_label("Created before").fill("2026-12-01T11:00")
        await page.get_by_role("button", name="Filter").click()
        await expect(page).to_have_url(re.compile(r"since=2026-12-01T10%3A00%2B01%3A00"), timeout=WAIT_MS)
        rows = page.locator("#runs tbody tr[data-run-id]")
        await expect(rows).to_have_count(1, timeout=WAIT_MS)
        await other.goto(page.url)
        await expect(other.locator("#runs tbody tr[data-run-id]")).to_have_count(1, timeout=WAIT_MS)
        await expect(other.get_by_label("Created since")).to_have_value("2026-12-01T01:00")
        # and the row's time names the zone it is in
        await expect(other.locator(f'#runs tr[data-run-id="{inside.run_id}"] td.nowrap')).to_have_text(
            re.compile(r"^1 Dec 2026, 01:30:00 (PST|GMT-8)$")
        )
    finally:
        await berlin.close()
        await los_angeles.close()
