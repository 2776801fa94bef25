"""The journal's ``/readyz`` says how many events it has not recorded yet (its durable consumer's pending count,
``backlog``), and the console shows "recording N events behind the bus" above ``backlog.warn_above``, and drops it
once the journal caught up -- the real journal service on a real port with a real nats-server, held back by a real
lock on its SQLite file (another writer holding it: the recorder cannot commit, the events pile up on the bus), and a
real headless Chromium. Every cross-process assertion waits on its condition with a timeout."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from journal_support import publish_recorded, serve_journal, served_settings, viewer_page
from playwright.async_api import BrowserContext, expect

from temporality_bus import Bus, NatsSettings
from temporality_journal.backlog import REFRESH_S
from temporality_testing.waiting import eventually

pytestmark = pytest.mark.timeout(240)
#: The console asks /readyz every 10 s; the journal reads the count at most every REFRESH_S.
BANNER_WAIT_MS = 40_000
WARN_ABOVE = 5


async def _backlog(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/readyz")
    assert response.status_code == 200, response.text  # behind is not "not ready"
    backlog: dict[str, Any] = response.json()["backlog"]
    return backlog


async def test_readyz_counts_the_events_not_recorded_yet_and_the_console_says_it_is_behind(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, browser_context: BrowserContext, story: Any
) -> None:
    settings = served_settings(tmp_path, nats_settings).model_copy(update={"behind_warn_events": WARN_ABOVE})
    async with serve_journal(settings, bus) as served:
        first = story(title="Recorded before")
        await publish_recorded(served, first.requested())
        async with httpx.AsyncClient(base_url=served.url, timeout=10) as client:

            async def caught_up() -> bool:
                backlog = await _backlog(client)
                return backlog["pending"] == 0 and backlog["warn_above"] == WARN_ABOVE

            await eventually(caught_up, timeout_s=3 * REFRESH_S + 10, what="/readyz backlog.pending 0")
            assert (await _backlog(client))["checked_at"].endswith("Z")
            page = await viewer_page(browser_context, served, "#/runs")
            banner = page.locator("#journal-state")
            await expect(banner).to_be_hidden()

            # another writer holds the journal's SQLite write lock: the recorder cannot commit, the bus holds on
            lock = sqlite3.connect(tmp_path / "served" / "journal.db", isolation_level=None, timeout=30)
            try:
                lock.execute("BEGIN IMMEDIATE")
                held = [story(title=f"Held back {n}").requested() for n in range(20)]
                for event in held:
                    await bus.publish(event)

                async def behind() -> bool:
                    return ((await _backlog(client))["pending"] or 0) >= len(held)

                await eventually(behind, timeout_s=3 * REFRESH_S + 10, what="/readyz backlog.pending >= 20")
                await expect(banner).to_be_visible(timeout=BANNER_WAIT_MS)
                await expect(banner).to_have_attribute("data-state", "behind")
                text = await page.locator("#journal-state-text").inner_text()
                assert "The journal is recording " in text, text
                assert " events behind the bus" in text, text
                await expect(page.locator("#live")).to_have_attribute("data-live", "on")  # behind, still live
            finally:
                lock.rollback()
                lock.close()
            await served.wait_recorded(held[-1].id, within_s=90)
            await eventually(caught_up, timeout_s=3 * REFRESH_S + 30, what="/readyz backlog.pending 0 again")
            await expect(banner).to_be_hidden(timeout=BANNER_WAIT_MS)
