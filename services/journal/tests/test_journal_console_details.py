"""Details of the console a review found wanting -- in a real headless Chromium (Playwright driving Debian's
chromium) against the journal service on a real port, fed through a real nats-server (and the real
trigger-gateway for the wizard): a trigger's failed, cancelled and all runs; which trigger and agent each of the
most delegated questions is for; a cancelled run's reason read as such and a wait in time order; a question's
step with the agent's reason and its kind (as text); ids and event
types that break only between their parts at 1024 px; the wizard's warning for a webhook without
authentication. Every browser assertion waits on its condition with a timeout (Playwright's ``expect``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from journal_support import ADMIN_TOKEN, ServedJournal, publish_recorded, viewer_page
from playwright.async_api import BrowserContext, Page, expect
from wizard_support import Choose, expect_step, on_screen, walk_wizard

from temporality_protocol import Envelope, TriggerAccepted, TriggerReceived, derive_id, make_event

MakeStory = Callable[..., Any]  # journal_support.RunStory
WAIT_MS = 20_000
pytestmark = pytest.mark.timeout(150)
#: A long event type of the kind that broke mid-word ("git.pullrequest.crea|ted") at 1024 px.
LONG_TYPE = "git.pullrequest.created"


def _shot(name: str) -> str:
    folder = Path("/tmp/console-outage-shots")
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder / f"{name}.png")


def _accepted(s: Any, delivery_id: str, event_type: str = LONG_TYPE) -> list[Envelope]:
    received = TriggerReceived(
        trigger_id=s.trigger_id,
        delivery_id=delivery_id,
        adapter="azure_devops.pull_request",
        source_event_id=f"src-{delivery_id}",
        source_event_type=event_type,
        body_bytes=100,
    )
    accepted = TriggerAccepted(
        trigger_id=s.trigger_id,
        delivery_id=delivery_id,
        source_event_id=f"src-{delivery_id}",
        run_id=s.run_id,
        agent=s.agent,
    )
    return [
        make_event(received, source="/temporality/test", id=derive_id("evt", delivery_id, "received"), run_id=s.run_id),
        make_event(accepted, source="/temporality/test", id=derive_id("evt", delivery_id, "accepted"), run_id=s.run_id),
    ]


async def _words_whole(page: Page, selector: str) -> list[str]:
    """The parts (between the <wbr>s idText puts after . - _ / : ,) of the cells ``selector`` that the page shows
    broken over two lines: none when ids and event types break only between their parts."""
    broken: list[str] = await page.evaluate(
        """(selector) => {
          const broken = [];
          for (const cell of document.querySelectorAll(selector)) {
            const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
            for (let node = walker.nextNode(); node; node = walker.nextNode()) {
              const range = document.createRange();
              range.selectNodeContents(node);
              const lines = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
              if (lines.size > 1) broken.push(node.textContent);
            }
          }
          return broken;
        }""",
        selector,
    )
    return broken


async def test_a_triggers_runs_by_outcome_the_questions_by_trigger_and_whole_words_at_1024_px(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory
) -> None:
    trigger = f"ado-pr-{uuid.uuid4().hex[:6]}"
    done, failed, cancelled, going = (story(trigger_id=trigger, title=f"Review PR {n}") for n in range(4))
    other = story(trigger_id="ado-pr-fast", title="Review PR 9")
    events: list[Envelope] = []
    for n, s in enumerate((done, failed, cancelled, going, other)):
        events += [*_accepted(s, f"dlv-{trigger}-{n}"), s.requested(), s.started()]
    events += [
        done.human_requested(question="Ship it as a breaking v2?"),
        other.human_requested(question="Ship it as a breaking v2?"),
        done.completed(),
        failed.failed(),
        cancelled.cancelled(),
    ]
    await publish_recorded(served_journal, *events)
    page = await viewer_page(browser_context, served_journal, "#/triggers")
    await page.set_viewport_size({"width": 1024, "height": 768})
    row = page.locator(f'#triggers tr[data-trigger-id="{trigger}"]')
    await expect(row.locator("td.runs-completed")).to_have_text("1", timeout=WAIT_MS)
    await expect(row.locator("td.runs-failed")).to_have_text("1")
    await expect(row.locator("td.runs-cancelled")).to_have_text("1")
    await expect(row.locator("td.runs-total")).to_have_text("4")  # the one still going included
    headers = await page.locator("#triggers thead th").all_inner_texts()
    assert headers[6:10] == ["Successful runs", "Failed", "Cancelled", "All runs"], headers

    # ids and event types break between their parts, never inside one, and the page does not scroll sideways
    await expect(row.locator("td.ids")).to_have_text(["azure_devops.pull_request", LONG_TYPE])
    assert await _words_whole(page, "#triggers td.ids") == []
    await page.screenshot(path=_shot("triggers-1024"), full_page=True)
    assert await page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    await row.get_by_role("link", name=trigger).click()
    await expect(page.locator("#deliveries tbody tr[data-delivery-id]")).to_have_count(4, timeout=WAIT_MS)
    assert await _words_whole(page, "#deliveries td.ids") == []
    assert await page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    await page.screenshot(path=_shot("deliveries-1024"), full_page=True)

    # the same question for two triggers: two rows, each saying whose it is
    await page.get_by_role("link", name="Analytics").click()
    questions = page.locator("#top-questions li")
    await expect(questions).to_have_count(2, timeout=WAIT_MS)
    await expect(questions.locator(".asked-by")).to_have_text(
        sorted([f"asked by reviewer for trigger {trigger}", "asked by reviewer for trigger ado-pr-fast"])
    )
    await expect(questions.locator(".question-text")).to_have_text(["Ship it as a breaking v2?"] * 2)
    await page.screenshot(path=_shot("top-questions"), full_page=True)


async def test_a_cancelled_run_says_why_as_cancelled_and_a_wait_reads_in_time_order(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory
) -> None:
    s = story(title="Review PR 42")
    await publish_recorded(
        served_journal,
        s.requested(),
        s.started(),
        s.human_requested(reason="<b>sign-off</b> before merging", reason_kind="approval"),
        s.notified("web"),
        s.answered(channel="web"),
        s.resumed(),
        s.cancelled(),
    )
    page = await viewer_page(browser_context, served_journal, f"#/runs/{s.run_id}")
    facts = page.locator("#run-header dl.facts")
    await expect(facts.locator("dt")).to_contain_text(["State", "Cancelled"], timeout=WAIT_MS)
    await expect(facts.locator("dt", has_text="Error")).to_have_count(0)
    await expect(facts).to_contain_text("by user:bob")
    await expect(page.locator("#timeline > li .step-title")).to_have_text(
        [
            "Trigger ado-pr",
            "Run started",
            "Human request",
            "Notified alice on web",
            "Waited 1 min",
            "Human response",
            "Run resumed",
            "Cancelled",
        ],
        timeout=WAIT_MS,
    )
    # the request's step says why the agent asks and the kind of help, as the inbox card does -- as text
    asked = page.locator("#timeline > li[data-type='human.requested'] dl.facts")
    await expect(asked.locator("dt")).to_contain_text(["Question", "Asked", "Why", "Kind"], timeout=WAIT_MS)
    await expect(asked.locator("dt:text-is('Why') + dd")).to_have_text("<b>sign-off</b> before merging")
    await expect(asked.locator("dt:text-is('Kind') + dd")).to_have_text("Approval")
    await expect(asked.locator("b")).to_have_count(0)
    await page.screenshot(path=_shot("cancelled-run"), full_page=True)


async def test_the_wizard_warns_of_a_webhook_without_authentication_on_its_step_and_the_review(
    served_journal_with_gateway: ServedJournal, browser_context: BrowserContext
) -> None:
    page = await browser_context.new_page()
    await page.goto(f"{served_journal_with_gateway.url}/console/#/wizard")
    await page.get_by_label("API token").fill(ADMIN_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect_step(page, 1)
    step = on_screen(page)
    warning = page.locator("#auth-none-warning")
    await step.get_by_label("Adapter", exact=True).fill("generic")  # preselects standard_webhooks
    await expect(step.get_by_label("Auth type", exact=True)).to_have_value("standard_webhooks", timeout=WAIT_MS)
    await expect(warning).to_be_hidden()
    await step.get_by_label("Auth type", exact=True).select_option("none")
    await expect(warning).to_be_visible()
    await expect(warning).to_contain_text("No authentication: anyone who can reach the trigger-gateway")
    await expect(step.get_by_label("Auth type", exact=True)).to_have_accessible_description(
        "how the gateway checks the sender No authentication: anyone who can reach the trigger-gateway's /hooks/ "
        "address can start runs of this trigger. Pick the auth type the source signs or authenticates its calls with."
    )
    await page.screenshot(path=_shot("wizard-auth-none"), full_page=True)
    await walk_wizard(
        page,
        [
            {"Id": "open-hook", "Name": "No auth", "Auth type": Choose("none")},
            {"Event types": "order.created"},
            {"Agent": "reviewer"},
            {},
            {},
            {},
        ],
    )
    review = page.locator("#wizard-summary")
    await expect(review.locator("#review-auth-none")).to_contain_text("none — No authentication", timeout=WAIT_MS)
    await page.screenshot(path=_shot("wizard-review-auth-none"), full_page=True)
