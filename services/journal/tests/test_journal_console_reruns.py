"""The console shows reruns (a "rerun of" marker in the Runs list, a run's reruns on its page) and the Audit page
tails the audit trail live -- in a real headless Chromium (Playwright driving Debian's chromium) against the
journal service on a real port, fed through a real nats-server. Every browser assertion waits on its condition
with a timeout (Playwright's ``expect``); nothing is reloaded between an event and what the page shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from journal_support import (
    OPERATOR_TOKEN,
    ServedJournal,
    console_screenshot,
    publish_recorded,
    rerun_events,
    viewer_page,
)
from playwright.async_api import BrowserContext, Page, expect

from temporality_protocol import RunCancelRequested, derive_id, make_event

MakeStory = Callable[..., Any]  # journal_support.RunStory
WAIT_MS = 20_000
pytestmark = pytest.mark.timeout(180)


async def _operator_page(context: BrowserContext, served: ServedJournal, hash_: str) -> Page:
    page = await context.new_page()
    await page.goto(f"{served.url}/console/{hash_}")
    await page.get_by_label("API token").fill(OPERATOR_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#who")).to_have_text("oncall (operator)", timeout=WAIT_MS)
    return page


async def test_the_runs_list_marks_a_rerun_and_a_run_s_page_lists_its_reruns(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory
) -> None:
    original = story(title="Review PR 77")
    rerun = f"{original.run_id}-rerun-1"
    requested, created = rerun_events(original, rerun)
    await publish_recorded(served_journal, original.requested(), original.failed())
    page = await viewer_page(browser_context, served_journal, "#/runs")
    rows = page.locator("#runs tbody tr[data-run-id]")
    await expect(rows).to_have_count(1, timeout=WAIT_MS)
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)

    # the rerun arrives while the list is open: its row says what it runs again, the original's does not
    await publish_recorded(served_journal, requested, created)
    rerun_row = page.locator(f'#runs tr[data-run-id="{rerun}"]')
    marker = rerun_row.locator(".rerun-of")
    await expect(marker).to_have_text(f"rerun of {original.run_id[:12]}…", timeout=WAIT_MS)
    await expect(marker).to_have_attribute("title", "Rerun asked by oncall")
    await expect(page.locator(f'#runs tr[data-run-id="{original.run_id}"] .rerun-of')).to_have_count(0)
    await console_screenshot(page, "runs-rerun")

    # the marker links the original run, whose page lists its reruns; the rerun's page links back
    await marker.get_by_role("link", name=f"rerun of run {original.run_id}").click()
    await expect(page.locator("#run-header")).to_contain_text("Review PR 77", timeout=WAIT_MS)
    reruns = page.locator("#run-reruns")
    await expect(reruns).to_be_visible(timeout=WAIT_MS)
    await expect(page.get_by_role("region", name="Reruns")).to_contain_text("asked by oncall")
    await expect(page.locator("#run-rerun-of")).to_have_count(0)
    await console_screenshot(page, "run-reruns")
    await reruns.get_by_role("link", name=rerun).click()
    await expect(page.locator("#run-rerun-of")).to_have_text(original.run_id, timeout=WAIT_MS)
    await expect(page.locator("#run-header")).to_contain_text("Rerun asked by")
    await expect(page.locator("#run-reruns")).to_be_hidden()  # the rerun has no reruns of its own


async def test_the_audit_page_shows_new_entries_live_with_its_filters_and_can_be_paused_by_keyboard(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory
) -> None:
    original = story()
    await publish_recorded(served_journal, original.requested(), original.failed())
    page = await _operator_page(browser_context, served_journal, "#/audit?kind=run_rerun")
    audit = page.locator("#audit")
    await expect(audit).to_contain_text("Nothing in the audit trail matches.", timeout=WAIT_MS)
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    await expect(page.locator("#live")).to_have_text("live")
    status = page.get_by_role("status")
    await expect(status).to_have_text("Live: new entries matching the filters appear at the top.")
    await page.evaluate("window.__notReloaded = true")

    # a cancel request (another kind: filtered out) and a rerun (kind run_rerun), published while the page is open
    cancel = make_event(
        RunCancelRequested(run_id=original.run_id, reason="stuck", requested_by="oncall"),
        source="/temporality/journal",
        id=derive_id("evt", original.run_id, "cancel"),
        run_id=original.run_id,
    )
    first, _ = rerun_events(original, f"{original.run_id}-rerun-1", by="user:alice")
    await publish_recorded(served_journal, cancel, first)
    row = audit.locator(f'tr[data-id="{first.id}"]')
    await expect(row).to_contain_text("user:alice", timeout=WAIT_MS)
    await expect(row).to_contain_text("reruns")
    await expect(row).to_contain_text(f"rerun of {original.run_id}")
    await expect(row).to_have_class("new")
    await expect(status).to_have_text("1 new entry at the top.")
    await expect(audit.locator("td.empty")).to_have_count(0)
    await expect(audit.locator(f'tr[data-id="{cancel.id}"]')).to_have_count(0)
    assert await page.evaluate("window.__notReloaded === true")
    await console_screenshot(page, "audit-live")

    # paused from the keyboard: the next rerun is held back (and counted) until resumed, then on top
    pause = page.get_by_role("button", name="Pause live updates")
    await pause.focus()
    await page.keyboard.press("Enter")
    resume = page.get_by_role("button", name="Resume live updates")
    await expect(resume).to_have_attribute("aria-pressed", "true")
    second, _ = rerun_events(original, f"{original.run_id}-rerun-2", n=2)
    await publish_recorded(served_journal, second)
    await expect(status).to_have_text("Paused: 1 new audited event held back.", timeout=WAIT_MS)
    await expect(audit.locator(f'tr[data-id="{second.id}"]')).to_have_count(0)
    await expect(resume).to_be_focused()
    await page.keyboard.press("Space")
    await expect(page.get_by_role("button", name="Pause live updates")).to_have_attribute("aria-pressed", "false")
    await expect(audit.locator("tbody tr").first).to_have_attribute("data-id", second.id, timeout=WAIT_MS)
    await expect(audit.locator("tbody tr[data-id]")).to_have_count(2)
    assert await page.evaluate("window.__notReloaded === true")
