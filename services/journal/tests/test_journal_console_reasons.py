"""The console says machine reasons in words (issue 9): a run resumed because of ``agent_action`` reads "the agent
acted on its turn", a failure's ``max_turns`` "it reached its turn limit", a refused delivery's ``filtered``
"the trigger's condition did not match" -- each with the raw value in its tooltip (``title``) and
``data-reason``; a reason the console does not know yet is shown as it is, underscores as spaces. In a real
headless Chromium against the journal service on a real port and a real bus."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from journal_support import VIEWER_TOKEN, console_screenshot
from playwright.async_api import BrowserContext, Page, expect

import temporality_journal
from temporality_protocol import RunFailed, RunFailureReason, RunResumed, TriggerRejected, derive_id, make_event
from temporality_protocol.events import (
    AgentReplyUndeliverable,
    DeliveryAttempt,
    HumanNotificationDelivered,
    HumanNotificationFailed,
    HumanNotifyRequested,
    HumanPolicy,
    HumanRejected,
)

MakeStory = Callable[..., Any]
Served = Any

WAIT_MS = 20_000


async def _sign_in(context: BrowserContext, served: Served, hash_: str) -> Page:
    page = await context.new_page()
    await page.goto(f"{served.url}/console/{hash_}")
    await page.get_by_label("API token").fill(VIEWER_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#who")).not_to_have_text("", timeout=WAIT_MS)
    return page


async def test_timeline_reasons_read_as_words_with_the_raw_value_in_the_tooltip(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    s = story(title="Reasons in words")
    resumed = s._event(RunResumed(run_id=s.run_id, reason="agent_action", from_turn=2, waited_s=5), "resumed.agent")
    rejected = s._event(
        HumanRejected(
            request_id="req-x", run_id=s.run_id, recipient="user:zed", reason="unknown_recipient", detail="not found"
        ),
        "rejected",
    )
    undeliverable = s._event(
        AgentReplyUndeliverable(request_id="req-y", replier_run_id=s.run_id, reason="asker_finished", detail="gone"),
        "reply-undeliverable",
    )
    failed = s._event(RunFailed(run_id=s.run_id, reason="max_turns", error="20 turns"), "failed")
    for event in (s.requested(), s.started(), resumed, rejected, undeliverable, failed):
        await served_journal.bus.publish(event)
    await served_journal.wait_recorded(failed.id)

    page = await _sign_in(browser_context, served_journal, f"#/runs/{s.run_id}")
    timeline = page.locator("#timeline")
    expected = {
        "run.resumed": ("agent_action", "the agent acted on its turn"),
        "human.rejected": ("unknown_recipient", "no such person or group"),
        "agent.reply_undeliverable": ("asker_finished", "the asking run has finished"),
        "run.failed": ("max_turns", "it reached its turn limit"),
    }
    for event_type, (raw, words) in expected.items():
        label = timeline.locator(f'li[data-type="{event_type}"] .reason')
        await expect(label).to_have_text(words, timeout=WAIT_MS)
        await expect(label).to_have_attribute("title", raw)
        await expect(label).to_have_attribute("data-reason", raw)
    resumed_step = timeline.locator('li[data-type="run.resumed"]')
    await expect(resumed_step).to_contain_text("Because")
    await expect(resumed_step.locator("dl.facts")).not_to_contain_text("agent_action")  # words, not the raw value
    await expect(timeline.locator('li[data-type="agent.reply_undeliverable"] .step-title')).to_have_text(
        "Reply undeliverable: the asking run has finished"
    )
    # the raw value is also in the step's event, one click away
    await resumed_step.get_by_text("Event details").click()
    await expect(resumed_step.locator("pre")).to_contain_text('"reason": "agent_action"')
    # the tooltip is what a pointer shows
    await timeline.locator('li[data-type="run.failed"] .reason').hover()
    assert await page.evaluate("document.querySelector('li[data-type=\"run.failed\"] .reason').title") == "max_turns"
    await console_screenshot(page, "run-reasons")


async def test_an_unknown_reason_shows_as_it_is_and_delivery_reasons_read_as_words(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    s = story(title="A newer reason")
    failed = s._event(RunFailed(run_id=s.run_id, reason="brand_new_reason", error="?"), "failed")
    ignored = make_event(
        TriggerRejected(
            trigger_id=s.trigger_id, delivery_id="dlv-filtered", reason="filtered", detail="when: did not match"
        ),
        source="/temporality/test",
        id=derive_id("evt", s.run_id, "filtered"),
    )
    for event in (s.requested(), s.started(), failed, ignored):
        await served_journal.bus.publish(event)
    await served_journal.wait_recorded(ignored.id)

    page = await _sign_in(browser_context, served_journal, f"#/runs/{s.run_id}")
    label = page.locator('#timeline li[data-type="run.failed"] .reason')
    await expect(label).to_have_text("brand new reason", timeout=WAIT_MS)
    await expect(label).to_have_attribute("title", "brand_new_reason")

    await page.goto(f"{served_journal.url}/console/#/triggers/{s.trigger_id}")
    row = page.locator("#deliveries tr", has_text="dlv-filtered")
    reason = row.locator(".reason")
    await expect(reason).to_have_text("the trigger's condition did not match", timeout=WAIT_MS)
    await expect(reason).to_have_attribute("title", "filtered")


async def test_an_agents_notification_shows_who_was_told_on_which_channel_and_who_was_not(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    """HUM-9: ``human.notify_requested``, then a ``human.notification_delivered`` per person told (the channel, the
    fallback and what failed first) or ``human.notification_failed`` (why, in words; who was not told)."""
    s = story(title="Notifications")
    policy = HumanPolicy(allowed_recipients=["group:pair"])
    asked = s._event(
        HumanNotifyRequested(
            notification_id="hn-1",
            run_id=s.run_id,
            agent="reviewer",
            title="Review PR 42",
            recipient="group:pair",
            message="Review finished: two comments.",
            policy=policy,
            turn=2,
        ),
        "notify",
    )
    blocked = DeliveryAttempt(channel="telegram", error="user:frank: Forbidden: bot was blocked by the user")
    told = s._event(
        HumanNotificationDelivered(
            notification_id="hn-1",
            run_id=s.run_id,
            recipient="group:pair",
            person="user:alice",
            channel="telegram",
            fallback_from="matrix",
            failed_attempts=[DeliveryAttempt(channel="matrix", error="no matrix adapter runs in this deployment")],
        ),
        "notified.alice",
    )
    failed = s._event(
        HumanNotificationFailed(
            notification_id="hn-1",
            run_id=s.run_id,
            recipient="group:pair",
            reason="no_channel",
            detail="did not reach user:frank",
            unreached=["user:frank"],
            failed_attempts=[blocked],
            deliveries=8,
        ),
        "notify.failed",
    )
    for event in (s.requested(), s.started(), asked, told, failed):
        await served_journal.bus.publish(event)
    await served_journal.wait_recorded(failed.id)

    page = await _sign_in(browser_context, served_journal, f"#/runs/{s.run_id}")
    timeline = page.locator("#timeline")
    await expect(timeline.locator('li[data-type="human.notify_requested"] .step-title')).to_have_text(
        "Notify group:pair: Review finished: two comments.", timeout=WAIT_MS
    )
    delivered = timeline.locator('li[data-type="human.notification_delivered"]')
    await expect(delivered.locator(".step-title")).to_have_text("Notification delivered to alice on telegram")
    await expect(delivered.locator("dl.facts")).to_contain_text("matrix: no matrix adapter runs in this deployment")
    not_told = timeline.locator('li[data-type="human.notification_failed"]')
    await expect(not_told.locator(".step-title")).to_have_text("Notification to group:pair not delivered")
    await expect(not_told.locator(".reason")).to_have_text("no channel reached them")
    await expect(not_told.locator(".reason")).to_have_attribute("data-reason", "no_channel")
    await expect(not_told.locator("dl.facts")).to_contain_text("frank")


def test_every_run_failure_reason_has_words_in_the_console() -> None:
    """A reason the protocol adds (``conversation_too_large``) gets its words in the console's table too, not only
    the fallback of underscores as spaces."""

    app = (Path(temporality_journal.__file__).parent / "console" / "app.js").read_text(encoding="utf-8")
    block = re.search(r'"run\.failed": \{(.*?)\n  \}', app, re.S)
    assert block is not None, "the console's run.failed reasons table"
    labelled = set(re.findall(r"^\s*(\w+):", block.group(1), re.M))
    assert set(get_args(RunFailureReason)) <= labelled, set(get_args(RunFailureReason)) - labelled
