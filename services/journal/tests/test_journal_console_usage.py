"""The console's run page shows a finished run's totals (``usage`` of GET /runs/{id}) in its header: nothing while
the run is live, "N turns · T tokens (P in, C out) · K tool calls" once its terminal event is journaled -- in a real
headless Chromium against the journal on a real port, fed through a real nats-server. Every browser assertion
waits on its condition with a timeout (Playwright's ``expect``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from journal_support import ServedJournal, publish_recorded, viewer_page
from playwright.async_api import BrowserContext, expect

from temporality_protocol.events import RunUsage

MakeStory = Callable[..., Any]  # journal_support.RunStory
WAIT_MS = 20_000
pytestmark = pytest.mark.timeout(180)


async def test_the_run_page_shows_the_run_s_usage_once_it_has_ended(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory
) -> None:
    s = story(title="Review PR 12")
    await publish_recorded(served_journal, s.requested(), s.started())
    page = await viewer_page(browser_context, served_journal, f"#/runs/{s.run_id}")
    header = page.locator("#run-header")
    await expect(header).to_contain_text("Review PR 12", timeout=WAIT_MS)
    await expect(page.locator("#run-usage")).to_have_count(0)  # live: no totals yet
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)

    used = RunUsage(turns=3, tool_calls=1, prompt_tokens=1200, completion_tokens=55, total_tokens=1255)
    await publish_recorded(served_journal, s.completed(usage=used))
    usage = page.locator("#run-usage")
    await expect(usage).to_have_text(f"3 turns · {1255:,} tokens ({1200:,} in, 55 out) · 1 tool call", timeout=WAIT_MS)
    await expect(header).to_contain_text("Usage")
