"""The web inbox of the console in a real headless Chromium, against the whole system: answer in the inbox
and watch the run complete (UI-1, HUM; issue 9).

The embedded stack runs the five services as their own processes over a real nats-server with the
project's shipped config (``tests/e2e_support.make_stack``, the cross-service tests' own helper): the
``ado-pr-review`` webhook starts the scripted Reviewer, which asks ``user:alice``; with no Matrix configured
her question falls back to the web inbox. She signs in to the console's inbox with her inbox token, answers
there, and the run resumes and completes. Every assertion waits on a condition with a timeout.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from journal_support import ADMIN_TOKEN, console_screenshot, eventually
from playwright.async_api import BrowserContext, Page, expect

from temporality_embedded import Stack

WAIT_MS = 30_000
SCREENSHOTS = os.environ.get("TEMPORALITY_CONSOLE_SCREENSHOTS")
ALICE_TOKEN = "alice-demo-inbox-token-change-me"  # config/users.yaml (a demo value)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _e2e_support() -> ModuleType:
    """``tests/e2e_support.py`` (the cross-service tests' stack helpers), importable from here too."""
    if "e2e_support" in sys.modules:  # a whole-suite run collected tests/ first
        return sys.modules["e2e_support"]
    path = Path(__file__).resolve().parents[3] / "tests" / "e2e_support.py"
    spec = importlib.util.spec_from_file_location("e2e_support", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["e2e_support"] = module
    spec.loader.exec_module(module)
    return module


E2E = _e2e_support()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s: Stack = E2E.make_stack(tmp_path)
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


async def _open_inbox(context: BrowserContext, stack: Stack, *, paused_clock: bool = False) -> Page:
    """A new tab on the console's inbox, signed in as alice with her inbox token, her question shown."""
    page = await context.new_page()
    if paused_clock:
        await page.clock.install()
    await page.goto(f"{stack.journal_url}/console/#/inbox")
    token = page.get_by_label("Inbox token")
    await expect(token).to_be_focused(timeout=WAIT_MS)
    await expect(page.locator("#inbox-signin")).to_contain_text("not an operator's API token")
    await page.keyboard.type(ALICE_TOKEN)
    await page.keyboard.press("Enter")  # the keyboard is enough
    await expect(page.locator("#inbox-who")).to_have_text("Signed in to the inbox as alice", timeout=WAIT_MS)
    await expect(page.locator("#inbox .inbox-item")).to_have_count(1, timeout=WAIT_MS)
    if paused_clock:  # this tab's inbox no longer re-reads by itself: its card stays as it was loaded
        # a jump of 1 ms, not more: pause_at fires the timers due within the jump, and a re-read (every 10 s)
        # fired by a 1 s jump could still be in flight when the other tab answers, and drop this tab's card
        await page.clock.pause_at(await page.evaluate("Date.now() + 1"))
    return page


async def _run(http: httpx.AsyncClient, stack: Stack, run_id: str, state: str) -> dict[str, Any] | None:
    answer = await http.get(f"{stack.journal_url}/runs/{run_id}", headers=E2E.JOURNAL)
    run: dict[str, Any] | None = answer.json() if answer.status_code == 200 else None
    return run if run is not None and run["state"] == state else None


async def test_answer_in_the_inbox_and_watch_the_run_complete(
    browser_context: BrowserContext, stack: Stack, http: httpx.AsyncClient
) -> None:
    accepted = await E2E.post_hook(http, stack, E2E.example_pr())
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]
    await eventually(lambda: _run(http, stack, run_id, "waiting_for_human"), what=f"run {run_id} waiting")

    page = await _open_inbox(browser_context, stack)
    card = page.locator("#inbox .inbox-item")
    await expect(card.locator("h2")).to_contain_text("changes a public API contract")
    await expect(card.locator(".why")).to_contain_text("Missing: whether backward compatibility is required")
    # OBS-1: why the agent asks (the scripted Reviewer's ask_human reason), its kind as a label; the context then
    # reads as the context
    await expect(card.locator(".reason")).to_have_text(
        "Decision Why: API contract change, backward compatibility undecided"
    )
    await expect(card.locator(".reason .reason-kind")).to_have_text("Decision")
    await expect(card.locator(".why strong")).to_have_text("Context:")
    await expect(card.locator(".deadline")).to_contain_text("Answer by")
    # config/triggers.yaml: on_timeout {action: default, default_option: keep-v1} -- from the item's at_deadline,
    # the deadline said once (in the browser's time, its zone named), not again in UTC as the chats' sentence has it
    await expect(card.locator(".on-timeout")).to_have_text(
        re.compile(r"^(Before then, .+\. )?Without an answer by then, the run goes on with “Keep the v1 contract”\.$"),
        timeout=WAIT_MS,
    )
    await expect(card.locator(".deadline")).not_to_contain_text("No answer by")
    await expect(card.get_by_role("button", name="Keep the v1 contract")).to_be_visible()
    await expect(card.get_by_role("button", name="Ship it as a breaking v2")).to_be_visible()
    await expect(card.get_by_label("Or answer in your own words")).to_be_visible()
    await console_screenshot(page, "inbox")

    stale = await _open_inbox(browser_context, stack, paused_clock=True)  # a second tab, loaded before the answer

    # one click (here: the keyboard) answers; the page says it was recorded
    await card.get_by_role("button", name="Keep the v1 contract").focus()
    await page.keyboard.press("Enter")
    await expect(card.locator(".answer-status")).to_have_text(
        "Answer recorded: Keep the v1 contract. The run continues.", timeout=WAIT_MS
    )
    await expect(card.get_by_role("button", name="Ship it as a breaking v2")).to_be_disabled()
    await console_screenshot(page, "inbox-answered")

    # the other tab still offers the question: human-interaction refuses the second answer and says why
    stale_card = stale.locator("#inbox .inbox-item")
    await stale_card.get_by_label("Or answer in your own words").fill("ship it")
    await stale_card.get_by_role("button", name="Send answer").click()
    await expect(stale_card.locator(".answer-status")).to_have_text(
        re.compile(r"^Already answered: already answered by Alice Example.* at .+ \(409\)\.$"), timeout=WAIT_MS
    )
    await stale.close()

    # the run resumed by itself and completed with alice's decision
    run = await eventually(lambda: _run(http, stack, run_id, "completed"), timeout_s=60, what=f"run {run_id} done")
    assert "Keep the v1 contract [keep-v1]" in run["result"]
    await page.goto(f"{stack.journal_url}/console/#/runs/{run_id}")
    await page.get_by_label("API token").fill(E2E.API_TOKENS[0].token.get_secret_value())
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator('#run-header [data-state="completed"]')).to_be_visible(timeout=WAIT_MS)
    response = page.locator('#timeline > li[data-type="human.answered"]')
    await expect(response).to_contain_text("Keep the v1 contract", timeout=WAIT_MS)
    await expect(response).to_contain_text("web")
    # a fresh inbox is empty now
    inbox = await browser_context.new_page()
    await inbox.goto(f"{stack.journal_url}/console/#/inbox")
    await inbox.get_by_label("Inbox token").fill(ALICE_TOKEN)
    await inbox.get_by_role("button", name="Open my inbox").click()
    await expect(inbox.locator("#inbox")).to_have_text("No questions are waiting for you.", timeout=WAIT_MS)


async def test_a_refused_inbox_token_is_said_and_an_api_token_is_not_one(
    browser_context: BrowserContext, served_journal_with_human: Any
) -> None:
    page = await browser_context.new_page()
    await page.goto(f"{served_journal_with_human.url}/console/#/inbox")
    await page.get_by_label("Inbox token").fill(ADMIN_TOKEN)  # an API token is not an inbox token
    await page.get_by_role("button", name="Open my inbox").click()
    alert = page.get_by_role("alert")
    await expect(alert).to_contain_text("That inbox token was refused", timeout=WAIT_MS)
    await expect(alert).to_contain_text("(401)")
    await expect(page.locator("#inbox")).to_have_count(0)
    assert await page.evaluate("sessionStorage.length") == 0
