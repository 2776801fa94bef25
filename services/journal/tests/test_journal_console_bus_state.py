"""The console says when the journal has lost its message bus, and a steady stream of events does not hold the
Runs page back -- in a real headless Chromium (Playwright driving Debian's chromium) against the journal service on
a real port, fed through a real nats-server that the first test stops and starts again. Every browser assertion
waits on its condition with a timeout (Playwright's ``expect``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from journal_support import ServedJournal, publish_recorded, viewer_page
from playwright.async_api import BrowserContext, expect

from temporality_embedded.natsserver import NatsServer

MakeStory = Callable[..., Any]  # journal_support.RunStory
WAIT_MS = 20_000
#: The console asks /readyz every 10 s; the journal's client notices the outage at once, its return within a few s.
OUTAGE_WAIT_MS = 40_000
pytestmark = pytest.mark.timeout(240)


async def _readyz(served: ServedJournal) -> httpx.Response:
    async with httpx.AsyncClient(base_url=served.url, timeout=10) as client:
        return await client.get("/readyz")


async def test_the_console_shows_a_banner_while_the_journal_has_lost_nats_and_drops_it_once_back(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory, nats_server: NatsServer
) -> None:
    before = story(title="Before the outage")
    await publish_recorded(served_journal, before.requested())
    page = await viewer_page(browser_context, served_journal, "#/runs")
    badge = page.locator("#live")
    banner = page.locator("#journal-state")
    await expect(page.locator(f'#runs a[href="#/runs/{before.run_id}"]')).to_be_visible(timeout=WAIT_MS)
    await expect(badge).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    await expect(banner).to_be_hidden()

    nats_server.requested_port = nats_server.port  # it comes back where the journal reconnects to
    nats_server.stop(hold_port=True)  # held meanwhile: no other test's server takes the port (and answers)
    try:
        # the page's own tail stays open (it reads the journal's database): only the banner and the badge say it
        await expect(banner).to_be_visible(timeout=OUTAGE_WAIT_MS)
        await expect(page.get_by_role("alert").filter(has_text="message bus")).to_be_visible()
        text = await page.locator("#journal-state-text").inner_text()
        assert "lost its connection to the message bus since" in text, text
        assert "what you see may be out of date, and actions may fail until it is back." in text, text
        assert (await _readyz(served_journal)).json()["nats"] == "disconnected"
        await expect(banner).to_have_attribute("data-state", "bus-lost")
        await expect(badge).to_have_attribute("data-live", "stale")
        await expect(badge).to_have_text("not live")
        # keyboard-reachable, and not a modal: the page behind it stays usable
        check = page.get_by_role("button", name="Check again")
        await check.focus()
        await expect(check).to_be_focused()
        await page.keyboard.press("Enter")
        await expect(banner).to_be_visible()
        await page.get_by_role("link", name="Waiting").click()
        await expect(page.get_by_role("heading", name="Waiting for a human or an agent")).to_be_visible(timeout=WAIT_MS)
        await expect(banner).to_be_visible()
        await expect(badge).to_have_text("not live", timeout=WAIT_MS)
        await page.get_by_role("link", name="Runs").click()
        await expect(badge).to_have_text("not live", timeout=WAIT_MS)
    finally:
        nats_server.start()

    # back: the banner goes once the journal says ready and the page has re-read; the badge is live again
    await expect(banner).to_be_hidden(timeout=OUTAGE_WAIT_MS)
    assert (await _readyz(served_journal)).status_code == 200
    await expect(badge).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    await expect(badge).to_have_text("live")
    after = story(title="After the outage")
    await publish_recorded(served_journal, after.requested())
    await expect(page.locator(f'#runs a[href="#/runs/{after.run_id}"]')).to_be_visible(timeout=WAIT_MS)


async def test_a_steady_stream_of_run_events_does_not_hold_the_runs_page_back(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory
) -> None:
    page = await viewer_page(browser_context, served_journal, "#/runs")
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    await expect(page.locator("#runs tbody tr")).to_have_count(1, timeout=WAIT_MS)  # "No runs."
    batch = uuid.uuid4().hex[:6]
    first = story(title=f"Steady {batch} 0")
    await publish_recorded(served_journal, first.requested())
    every_s, for_s = 0.2, 6.0
    published = 1

    async def steady() -> None:  # a new run every 200 ms: each within the page's quiet time of the last
        nonlocal published
        deadline = time.monotonic() + for_s
        while time.monotonic() < deadline:
            await asyncio.sleep(every_s)
            await served_journal.bus.publish(story(title=f"Steady {batch} {published}").requested())
            published += 1

    publisher = asyncio.create_task(steady())
    try:
        # the page refreshes while the events keep coming (at most 2 s after the first), not after they stop
        await expect(page.locator(f'#runs a[href="#/runs/{first.run_id}"]')).to_be_visible(timeout=int(for_s * 1000))
        assert not publisher.done(), "the Runs page showed the new run only once the stream had stopped"
        shown_while_streaming = published
    finally:
        await publisher
    assert shown_while_streaming < published
    # and after the last one the page settles on every run (50 a page)
    await expect(page.locator("#runs tbody tr")).to_have_count(published, timeout=WAIT_MS)
