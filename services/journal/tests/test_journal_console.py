"""The web console in a real headless Chromium, against the journal service on a real port and a real bus.

Events are published to NATS; the journal's own consumer records them; the page reads the API and the
live tail. Every browser assertion waits (Playwright's ``expect`` with a timeout).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from journal_support import OPERATOR_TOKEN, VIEWER, VIEWER_TOKEN
from playwright.async_api import BrowserContext, Page, expect

from temporality_protocol import Envelope, RunToolCalled, TriggerAccepted, derive_id, make_event

MakeStory = Callable[..., Any]  # conftest.RunStory
Served = Any  # conftest.ServedJournal

WAIT_MS = 20_000
#: Set to a folder to save the screenshots docs/console.md shows (``docs/img``); unset in normal runs.
SCREENSHOTS = os.environ.get("TEMPORALITY_CONSOLE_SCREENSHOTS")
#: Shown as text, never parsed as HTML (the console renders with textContent).
HOSTILE = '<img src=x onerror="document.body.dataset.pwned=1"> Merge it?'


def _trigger_accepted(s: Any) -> Envelope:
    data = TriggerAccepted(
        trigger_id=s.trigger_id, delivery_id="dlv-1", source_event_id="ado-1", run_id=s.run_id, agent=s.agent
    )
    return make_event(data, source="/temporality/test", id=derive_id("evt", s.run_id, "accepted"), run_id=s.run_id)


def _tool_called(s: Any) -> Envelope:
    data = RunToolCalled(run_id=s.run_id, turn=1, call_id="c1", tool="get_pr_context", result_preview="3 files changed")
    return make_event(data, source="/temporality/test", id=derive_id("evt", s.run_id, "tool"), run_id=s.run_id)


async def _screenshot(page: Page, name: str) -> None:
    if SCREENSHOTS:
        await page.screenshot(path=Path(SCREENSHOTS) / f"console-{name}.png", full_page=True)


async def _publish(served: Served, *events: Envelope) -> None:
    for event in events:
        await served.bus.publish(event)
    await served.wait_recorded(events[-1].id)


async def _sign_in(context: BrowserContext, served: Served, token: str, hash_: str = "#/runs") -> Page:
    page = await context.new_page()
    await page.goto(f"{served.url}/console/{hash_}")
    await page.get_by_label("API token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#who")).not_to_have_text("", timeout=WAIT_MS)
    return page


async def _waiting_run(served: Served, story: MakeStory, **kwargs: Any) -> Any:
    s = story(title="Review PR 42: API contract", **kwargs)
    await _publish(
        served,
        _trigger_accepted(s),
        s.requested(),
        s.created(),
        s.started(),
        _tool_called(s),
        s.human_requested(question=HOSTILE),
        s.notified("matrix"),
    )
    return s


async def test_sign_in_timeline_reads_like_ui_1_and_updates_live(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    s = await _waiting_run(served_journal, story)
    page = await _sign_in(browser_context, served_journal, VIEWER_TOKEN)
    await expect(page.locator("#who")).to_have_text("board (viewer)", timeout=WAIT_MS)

    row = page.locator(f'#runs tr[data-run-id="{s.run_id}"]')
    await expect(row).to_contain_text("waiting for human", timeout=WAIT_MS)
    await expect(row).to_contain_text("alice · matrix")
    await row.get_by_role("link").click()

    steps = page.locator("#timeline > li .step-title")
    await expect(steps).to_have_text(
        [
            "Trigger ado-pr",
            "Run requested",
            "Run created",
            "Run started",
            "Tool call: get_pr_context",
            "Human request",
            re.compile(r"^Waiting (29|30|31) min$"),  # the story asked ~30 minutes ago
            "Notified alice on matrix",
        ],
        timeout=WAIT_MS,
    )
    request = page.locator('#timeline > li[data-type="human.requested"]')
    await expect(request).to_contain_text(HOSTILE)  # the literal text, not markup
    await expect(page.locator("#run-header")).to_contain_text("Waiting for")
    await expect(page.locator("#run-header")).to_contain_text("alice")
    await _screenshot(page, "run-waiting")
    assert await page.locator("#view img").count() == 0
    assert await page.evaluate("document.body.dataset.pwned === undefined")
    # each step's event is one click away
    await request.get_by_text("Event details").click()
    await expect(request.locator("pre")).to_contain_text(s.request_id)

    # live: the answer, the resume and the completion arrive over the SSE tail, without a reload
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    await _publish(served_journal, s.answered(), s.resumed(), s.completed("Kept v1; asked the author to restore it"))
    await expect(steps.nth(6)).to_have_text("Waited 1 min", timeout=WAIT_MS)  # waited_s = 60 of human.answered
    await expect(steps).to_have_text(
        [
            "Trigger ado-pr",
            "Run requested",
            "Run created",
            "Run started",
            "Tool call: get_pr_context",
            "Human request",
            "Waited 1 min",
            "Notified alice on matrix",
            "Human response",
            "Run resumed",
            "Completed",
        ],
        timeout=WAIT_MS,
    )
    response = page.locator('#timeline > li[data-type="human.answered"]')
    await expect(response).to_contain_text("yes")
    await expect(response).to_contain_text("alice")
    await expect(response).to_contain_text("matrix")
    await expect(page.locator('#run-header [data-state="completed"]')).to_be_visible(timeout=WAIT_MS)
    await expect(page.locator("#run-header")).to_contain_text("Kept v1")
    await _screenshot(page, "run-completed")


async def test_waiting_page_says_whom_which_channel_what_and_since_when(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    s = await _waiting_run(served_journal, story)
    page = await _sign_in(browser_context, served_journal, VIEWER_TOKEN, "#/waiting")
    row = page.locator(f'#waiting tr[data-run-id="{s.run_id}"]')
    await expect(row).to_be_visible(timeout=WAIT_MS)
    cells = row.locator("td")
    await expect(cells.nth(0)).to_have_text("Review PR 42: API contract")
    await expect(cells.nth(1)).to_have_text("alice")
    await expect(cells.nth(2)).to_have_text("matrix")
    await expect(cells.nth(3)).to_have_text(HOSTILE)
    await expect(cells.nth(5)).to_have_text(re.compile(r"^(29|30|31) min$"))
    await _screenshot(page, "waiting")
    # the answer arrives live: the run leaves the list without a reload
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    await _publish(served_journal, s.answered(), s.resumed())
    await expect(row).to_have_count(0, timeout=WAIT_MS)
    await expect(page.locator("#waiting")).to_contain_text("Nobody is being waited for", timeout=WAIT_MS)


async def test_a_wrong_token_gets_a_clear_message_and_no_data(
    served_journal: Served, browser_context: BrowserContext
) -> None:
    page = await browser_context.new_page()
    await page.goto(f"{served_journal.url}/")  # redirected to the console
    await expect(page).to_have_url(re.compile(r"/console/"), timeout=WAIT_MS)
    await page.get_by_label("API token").fill("not-a-token-this-journal-knows")
    await page.keyboard.press("Enter")  # the keyboard is enough
    alert = page.get_by_role("alert")
    await expect(alert).to_contain_text("refused", timeout=WAIT_MS)
    await expect(alert).to_contain_text("401")
    await expect(page.locator("#nav")).to_be_hidden()
    assert await page.evaluate("sessionStorage.length") == 0


async def test_viewer_has_no_cancel_button_and_an_operator_cancels(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    s = await _waiting_run(served_journal, story)
    viewer = await _sign_in(browser_context, served_journal, VIEWER_TOKEN, f"#/runs/{s.run_id}")
    await expect(viewer.locator("#run-header")).to_contain_text("Waiting for", timeout=WAIT_MS)
    await expect(viewer.locator("#cancel-run")).to_have_count(0)

    operator_context = await browser_context.browser.new_context()  # type: ignore[union-attr]
    try:
        operator = await _sign_in(operator_context, served_journal, OPERATOR_TOKEN, f"#/runs/{s.run_id}")
        await expect(operator.locator("#who")).to_have_text("oncall (operator)")
        await expect(operator.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
        await operator.get_by_label("Reason").fill("the PR was closed")
        await operator.get_by_role("button", name="Cancel run").click()
        await expect(operator.get_by_role("alert")).to_contain_text("Cancel requested by oncall", timeout=WAIT_MS)
        # the journal recorded the request (published to NATS) and the tail brought it to the timeline
        step = operator.locator('#timeline > li[data-type="run.cancel_requested"]')
        await expect(step).to_contain_text("Cancel requested by oncall", timeout=WAIT_MS)
        await expect(step).to_contain_text("the PR was closed")
    finally:
        await operator_context.close()
    async with httpx.AsyncClient(base_url=served_journal.url, headers=VIEWER) as client:
        events = (await client.get("/events", params={"type": "run.cancel_requested"})).json()["events"]
    assert [(e["run_id"], e["data"]["requested_by"]) for e in events] == [(s.run_id, "oncall")]


async def test_triggers_and_analytics_pages(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    s = await _waiting_run(served_journal, story)
    await _publish(served_journal, s.answered(), s.resumed(), s.completed())
    page = await _sign_in(browser_context, served_journal, VIEWER_TOKEN, "#/triggers")
    row = page.locator(f'#triggers tr[data-trigger-id="{s.trigger_id}"]')
    await expect(row.locator("td").nth(3)).to_have_text("reviewer", timeout=WAIT_MS)  # agent
    await expect(row.locator("td").nth(6)).to_have_text("1")  # successful runs
    await expect(row.locator("td").nth(7)).to_have_text("1")  # needed a human
    await row.get_by_role("link", name=s.trigger_id).click()
    await expect(page.locator("#deliveries")).to_contain_text("dlv-1", timeout=WAIT_MS)
    await expect(page.locator("#deliveries")).to_contain_text("accepted")

    await page.get_by_role("link", name="Analytics").click()
    await expect(page.locator("#analytics")).to_contain_text("Runs that asked a human", timeout=WAIT_MS)
    await expect(page.locator("#analytics")).to_contain_text("1 (100 %)")
    await expect(page.locator("#analytics")).to_contain_text(HOSTILE)  # the most delegated question
    # the charts: one bar per outcome and per wait bucket, labelled for screen readers
    await expect(page.get_by_role("img", name="answered: 1")).to_be_visible()
    await expect(page.get_by_role("img", name="timed out: 0")).to_be_visible()
    await expect(page.get_by_role("img", name="< 1 min: 0")).to_be_visible()
    await expect(page.get_by_role("img", name="< 5 min: 1")).to_be_visible()  # waited 60 s
    assert "[object" not in await page.locator("#analytics").inner_text()
    await _screenshot(page, "analytics")


async def test_runs_list_filters(served_journal: Served, browser_context: BrowserContext, story: MakeStory) -> None:
    review, triage = story(title="Review PR 7"), story(agent="triager", title="Triage bug 9")
    await _publish(served_journal, review.requested(), triage.requested(), triage.started())
    page = await _sign_in(browser_context, served_journal, VIEWER_TOKEN)
    rows = page.locator("#runs tbody tr[data-run-id]")
    await expect(rows).to_have_count(2, timeout=WAIT_MS)

    await page.get_by_label("Agent").fill("triager")
    await page.get_by_role("button", name="Filter").click()
    await expect(page).to_have_url(re.compile(r"#/runs\?agent=triager$"), timeout=WAIT_MS)
    await expect(rows).to_have_count(1, timeout=WAIT_MS)
    await expect(rows.first).to_have_attribute("data-run-id", triage.run_id)

    await page.get_by_label("Agent").fill("")
    await page.get_by_label("State").select_option("pending")
    await page.get_by_role("button", name="Filter").click()
    await expect(rows).to_have_count(1, timeout=WAIT_MS)
    await expect(rows.first).to_have_attribute("data-run-id", review.run_id)

    await page.get_by_label("State").select_option("")
    await page.get_by_label("Title contains").fill("nothing like this")
    await page.get_by_role("button", name="Filter").click()
    await expect(page.locator("#runs")).to_contain_text("No runs.", timeout=WAIT_MS)
