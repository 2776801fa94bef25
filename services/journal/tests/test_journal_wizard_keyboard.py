"""The six-step trigger wizard with the keyboard alone, in a real headless Chromium, against the real
trigger-gateway behind the journal's proxy: each step's focus lands on its first field, Enter in a field is the
step's Next (checked first: an empty required field stops it, marked and focused) and never saves early, the
review is saved with Enter on its button, and the gateway holds the trigger as walked. Editing it keeps what the
form does not show. Then the steps of the other two types: a schedule (its cron on step 2, nothing to preview)
and an event trigger (its event type and filter).

Every browser assertion waits (Playwright's ``expect`` with a timeout).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from journal_support import ADMIN_TOKEN
from playwright.async_api import BrowserContext, Page, expect
from wizard_support import (
    REVIEW,
    STEPS,
    WIZARD_MS,
    Choose,
    expect_step,
    fill_step,
    on_screen,
    open_wizard,
    save,
    walk_wizard,
)

Served = Any  # conftest.ServedJournal
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def _type_into(page: Page, label: str, text: str) -> None:
    """The focused field is ``label``'s (the keyboard got there); type ``text`` into it."""
    await expect(on_screen(page).get_by_label(label, exact=True)).to_be_focused(timeout=WIZARD_MS)
    await page.keyboard.type(text)


async def _tab_to(page: Page, selector: str, at_most: int = 30, *, backwards: bool = False) -> None:
    """Tab (Shift+Tab: ``backwards``) until the element ``selector`` has the focus."""
    for _ in range(at_most):
        if await page.evaluate("(s) => document.activeElement?.matches(s) ?? false", selector):
            return
        await page.keyboard.press("Shift+Tab" if backwards else "Tab")
    raise AssertionError(f"{selector} never took the focus within {at_most} Tabs")


async def test_a_keyboard_walk_through_the_six_steps_creates_a_trigger(
    served_journal_with_gateway: Served, browser_context: BrowserContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = served_journal_with_gateway
    gateway = str(served.runtime.settings.gateway_url).rstrip("/")
    page = await open_wizard(browser_context, served.url, ADMIN_TOKEN)
    await expect(page.locator("#trigger-form nav.steps li")).to_have_text(
        [f"{n}{title}" for n, title in enumerate(STEPS, 1)] + ["Review"]
    )

    # 1. where the event comes from: Enter before the step is whole stops on the first field missing
    await expect_step(page, 1)
    await _type_into(page, "Id", "kb-orders")
    await page.keyboard.press("Enter")
    name = on_screen(page).get_by_label("Name", exact=True)
    await expect(name).to_have_attribute("aria-invalid", "true", timeout=WIZARD_MS)
    await expect(name).to_be_focused()
    await expect(page.locator("#message")).to_contain_text("Check step 1 (Where the event comes from): Name")
    await expect_step(page, 1)
    await page.keyboard.type("Orders, by keyboard")
    await page.keyboard.press("Tab")  # Type: webhook
    await expect(on_screen(page).get_by_label("Type", exact=True)).to_be_focused()
    await page.keyboard.press("Tab")  # Enabled
    await page.keyboard.press("Tab")
    await _type_into(page, "Adapter", "generic")
    auth = on_screen(page).get_by_label("Auth type", exact=True)
    await expect(auth).to_have_value("standard_webhooks")  # the adapter's own, preselected
    await page.keyboard.press("Tab")  # Auth type: standard_webhooks -> hmac_sha256 -> header -> ... -> bearer
    for _ in range(5):
        await page.keyboard.press("ArrowUp")
    await expect(auth).to_have_value("bearer")
    await page.keyboard.press("Tab")
    await _type_into(page, "Secret environment variable", "KB_HOOK_TOKEN")
    await expect(on_screen(page).get_by_label("User name", exact=True)).to_be_hidden()  # basic only
    await page.keyboard.press("Enter")

    # 2. which event
    await expect_step(page, 2)
    await _type_into(page, "Event types", "order.created")
    await page.keyboard.press("Enter")
    # 3. which agent
    await expect_step(page, 3)
    await _type_into(page, "Agent", "reviewer")
    await page.keyboard.press("Enter")
    # 4. which data: Enter in a text area is a new line; the preview by its button; Next by its button
    await expect_step(page, 4)
    await _type_into(page, "Input mapping", "order = payload.order_id")
    await page.keyboard.press("Enter")
    await page.keyboard.type("customer = payload.customer")
    await expect_step(page, 4)
    await page.keyboard.press("Tab")
    await _type_into(page, "Prompt (first message)", "Check order ${order} of ${customer}.")
    await page.keyboard.press("Tab")
    await _type_into(
        page,
        "Sample payload (JSON)",
        '{"type": "order.created", "id": "o-5", "data": {"order_id": 5, "customer": "acme"}}',
    )
    await _tab_to(page, "#preview-button")
    await page.keyboard.press("Enter")
    await expect(page.locator("#preview-input")).to_contain_text(
        '"prompt": "Check order 5 of acme."', timeout=WIZARD_MS
    )
    await _tab_to(page, "#wizard-next")
    await page.keyboard.press("Enter")
    # 5. who may be asked
    await expect_step(page, 5)
    await _type_into(page, "Allowed recipients", "user:alice, group:leads")
    await page.keyboard.press("Tab")
    await _type_into(page, "Default timeout (s)", "900")
    await page.keyboard.press("Tab")
    await _type_into(page, "Maximum timeout (s)", "600")  # shorter than the default: the gateway refuses it
    await page.keyboard.press("Enter")
    timeout = on_screen(page).get_by_label("Default timeout (s)", exact=True)
    await expect(timeout).to_have_attribute("aria-invalid", "true", timeout=WIZARD_MS)
    await expect(page.locator("#tw-timeout-error")).to_contain_text("must not exceed max_timeout_s")
    await expect(timeout).to_be_focused()
    await page.keyboard.press("Tab")
    await page.keyboard.press("Control+A")
    await page.keyboard.type("7200")
    await page.keyboard.press("Enter")
    # 6. when nobody answers: cancel the run
    await expect_step(page, 6)
    deadline = on_screen(page).get_by_label("At the deadline", exact=True)
    await expect(deadline).to_be_focused()
    await page.keyboard.press("ArrowDown")
    await page.keyboard.press("ArrowDown")
    await expect(deadline).to_have_value("cancel")
    await page.keyboard.press("Tab")  # Remind every (the default option is for "default" only)
    await _type_into(page, "Remind every (s)", "300")
    await page.keyboard.press("Tab")
    await _type_into(page, "Reminders at most", "2")
    await page.keyboard.press("Enter")

    # the review: its heading has the focus; nothing is saved yet
    await expect_step(page, REVIEW)
    await expect(page.locator("#wizard-review-title")).to_be_focused()
    async with httpx.AsyncClient(base_url=gateway, headers=ADMIN, timeout=20) as client:
        assert (await client.get("/triggers/kb-orders")).status_code == 404
    review = on_screen(page)
    await expect(review.locator('[data-step="1"]')).to_contain_text("bearer · secret in $KB_HOOK_TOKEN")
    await expect(review.locator('[data-step="6"]')).to_contain_text("cancel the run")
    # "Change" goes back to a step by keyboard, and Next comes back to the review
    await _tab_to(page, 'button[aria-label="Change step 3: Which agent"]')
    await page.keyboard.press("Enter")
    await expect_step(page, 3)
    await expect(on_screen(page).get_by_label("Agent", exact=True)).to_be_focused()
    await page.keyboard.press("Enter")
    for step in (4, 5, 6):
        await expect_step(page, step)
        await _tab_to(page, "#wizard-next")
        await page.keyboard.press("Enter")
    await expect_step(page, REVIEW)
    await _tab_to(page, "#save-trigger")
    await page.keyboard.press("Enter")
    # the save's 422 (the gateway has no such variable) takes the keyboard to the field it names, on its step
    await expect(page.locator("#message")).to_contain_text("Not saved: auth: environment variable KB_HOOK_TOKEN")
    await expect_step(page, 1)
    secret = on_screen(page).get_by_label("Secret environment variable", exact=True)
    await expect(secret).to_be_focused()
    await expect(secret).to_have_attribute("aria-invalid", "true")
    monkeypatch.setenv("KB_HOOK_TOKEN", "a-bearer-token-the-gateway-reads")  # the gateway resolves *_env
    await _tab_to(page, f'nav.steps button[data-step="{REVIEW}"]', backwards=True)  # every step reached
    await page.keyboard.press("Enter")
    await expect_step(page, REVIEW)
    await _tab_to(page, "#save-trigger")
    await page.keyboard.press("Enter")
    await expect(page.locator("#message")).to_contain_text("Trigger kb-orders created.", timeout=WIZARD_MS)

    async with httpx.AsyncClient(base_url=gateway, headers=ADMIN, timeout=20) as client:
        read = await client.get("/triggers/kb-orders")
        assert read.status_code == 200, read.text
        stored = read.json()["trigger"]
        assert {k: stored[k] for k in ("type", "adapter", "events", "agent", "enabled")} == {
            "type": "webhook",
            "adapter": "generic",
            "events": ["order.created"],
            "agent": "reviewer",
            "enabled": True,
        }
        assert stored["auth"] == {"type": "bearer", "token_env": "KB_HOOK_TOKEN"}
        assert stored["input"] == {"order": "payload.order_id", "customer": "payload.customer"}
        assert stored["prompt"] == "Check order ${order} of ${customer}."
        assert {k: stored["human"][k] for k in ("allowed_recipients", "default_timeout_s", "max_timeout_s")} == {
            "allowed_recipients": ["user:alice", "group:leads"],
            "default_timeout_s": 900,
            "max_timeout_s": 7200,
        }
        on_timeout = {k: v for k, v in stored["human"]["on_timeout"].items() if v is not None}
        assert on_timeout == {"action": "cancel", "renotify": {"every_s": 300, "max": 2}}

        # a field the form does not show (the tenant), set through the API, survives an edit in the wizard
        etag = read.headers["etag"]
        replaced = await client.put(
            "/triggers/kb-orders", json={**stored, "tenant": "acme"}, headers={"If-Match": etag}
        )
        assert replaced.status_code == 200, replaced.text

    await page.goto(f"{served.url}/console/#/wizard/kb-orders")
    await expect_step(page, 1)
    name = on_screen(page).get_by_label("Name", exact=True)
    await expect(name).to_have_value("Orders, by keyboard", timeout=WIZARD_MS)
    await expect(name).to_be_focused()  # the id is fixed when editing: the first field that takes input
    await page.keyboard.press("Control+A")
    await page.keyboard.type("Orders, renamed by keyboard")
    await _tab_to(page, f'nav.steps button[data-step="{REVIEW}"]')  # an edit reaches every step at once
    await page.keyboard.press("Enter")
    await expect_step(page, REVIEW)
    await _tab_to(page, "#save-trigger")
    await page.keyboard.press("Enter")
    await expect(page.locator("#message")).to_contain_text("Trigger kb-orders saved: now revision", timeout=WIZARD_MS)
    async with httpx.AsyncClient(base_url=gateway, headers=ADMIN, timeout=20) as client:
        stored = (await client.get("/triggers/kb-orders")).json()["trigger"]
    assert (stored["name"], stored["tenant"], stored["human"]["max_timeout_s"]) == (
        "Orders, renamed by keyboard",
        "acme",
        7200,
    )


async def test_a_schedule_and_an_event_trigger_through_the_steps(
    served_journal_with_gateway: Served, browser_context: BrowserContext
) -> None:
    """The steps follow the type: a schedule's cron is step 2's (the gateway's word on a bad one stops it) and it
    has nothing to preview, yet its steps pass the gateway's check; an event trigger's event type and filter."""
    served = served_journal_with_gateway
    gateway = str(served.runtime.settings.gateway_url).rstrip("/")
    page = await open_wizard(browser_context, served.url, ADMIN_TOKEN)
    await walk_wizard(page, [{"Id": "nightly", "Name": "Nightly triage", "Type": Choose("schedule")}])
    await expect(on_screen(page).get_by_label("Event types", exact=True)).to_be_hidden()
    await fill_step(page, {"Cron": "61 3 * * *", "Time zone": "Europe/Berlin"})
    await page.keyboard.press("Enter")
    cron = on_screen(page).get_by_label("Cron", exact=True)
    await expect(cron).to_have_attribute("aria-invalid", "true", timeout=WIZARD_MS)
    await expect(cron).to_be_focused()
    await expect(page.locator("#message")).to_contain_text("Check step 2 (Which event): cron")
    await cron.fill("0 3 * * *")
    await walk_wizard(page, [{}, {"Agent": "reviewer"}], first=2)
    await expect(page.get_by_role("button", name="Preview")).to_be_disabled()
    await expect(on_screen(page)).to_contain_text("A schedule has no delivery to preview.")
    await walk_wizard(page, [{"Prompt (first message)": "Triage the open bugs."}, {}, {}], first=4)
    await expect(on_screen(page).locator('[data-step="2"]')).to_contain_text("0 3 * * * (Europe/Berlin)")
    await save(page, "nightly")

    await page.goto(f"{served.url}/console/#/wizard")
    await walk_wizard(page, [{"Id": "on-failure", "Name": "When a review fails", "Type": Choose("event")}])
    await fill_step(page, {"Event type": "run.failed", "Filter": "actor_type = service\nbroken line"})
    await page.get_by_role("button", name="Next").click()  # stopped: the filter's second line is no name = value
    event_filter = on_screen(page).get_by_label("Filter", exact=True)
    await expect(event_filter).to_have_attribute("aria-invalid", "true", timeout=WIZARD_MS)
    await expect(page.locator("#tw-filter-error")).to_contain_text("Filter, line 2: write name = value")
    await event_filter.fill("actor_type = service")
    await walk_wizard(page, [{}, {"Agent": "reviewer"}, {}, {}, {}], first=2)
    await save(page, "on-failure")

    async with httpx.AsyncClient(base_url=gateway, headers=ADMIN, timeout=20) as client:
        nightly = (await client.get("/triggers/nightly")).json()["trigger"]
        on_failure = (await client.get("/triggers/on-failure")).json()["trigger"]
    assert {k: nightly.get(k) for k in ("type", "cron", "timezone", "agent", "prompt")} == {
        "type": "schedule",
        "cron": "0 3 * * *",
        "timezone": "Europe/Berlin",
        "agent": "reviewer",
        "prompt": "Triage the open bugs.",
    }
    assert "adapter" not in nightly
    assert "events" not in nightly
    assert {k: on_failure.get(k) for k in ("type", "event_type", "filter")} == {
        "type": "event",
        "event_type": "run.failed",
        "filter": {"actor_type": "service"},
    }
