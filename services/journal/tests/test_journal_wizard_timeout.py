"""The trigger wizard's "when nobody answers" step, end to end: a real headless Chromium creates an enabled
webhook trigger with an ``on_timeout`` chain through the journal's proxy to the real trigger-gateway, the
gateway's 422 is shown next to the field it names, the stored trigger holds the chain, and a webhook posted
to it with its auth starts a run that the console lists.

Every browser assertion waits (Playwright's ``expect`` with a timeout).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from journal_support import ADMIN_TOKEN
from playwright.async_api import BrowserContext, Page, expect

Served = Any  # conftest.ServedJournal

WAIT_MS = 20_000
HOOK_TOKEN = "a-bearer-token-the-gateway-reads"


async def _sign_in(context: BrowserContext, served: Served, token: str, hash_: str) -> Page:
    page = await context.new_page()
    await page.goto(f"{served.url}/console/{hash_}")
    await page.get_by_label("API token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#who")).not_to_have_text("", timeout=WAIT_MS)
    return page


async def test_wizard_creates_a_trigger_with_an_on_timeout_chain_that_fires(
    served_journal_with_gateway: Served, browser_context: BrowserContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = served_journal_with_gateway
    gateway = str(served.runtime.settings.gateway_url).rstrip("/")
    monkeypatch.setenv("WIZARD_FIRE_TOKEN", HOOK_TOKEN)  # the gateway resolves token_env when a hook arrives
    page = await _sign_in(browser_context, served, ADMIN_TOKEN, "#/wizard")

    form = page.locator("#trigger-form")
    await form.get_by_label("Id", exact=True).fill("wizard-fires")
    await form.get_by_label("Name", exact=True).fill("Orders that need a decision")
    await form.get_by_label("Agent", exact=True).fill("reviewer")
    await form.get_by_label("Adapter").fill("generic")
    await form.get_by_label("Event types").fill("order.created")
    await form.get_by_label("Auth type").select_option("bearer")
    await form.get_by_label("Secret environment variable").fill("WIZARD_FIRE_TOKEN")
    await form.get_by_label("Input mapping").fill("order = payload.order_id")
    await form.get_by_label("Allowed recipients").fill("user:alice")
    await form.get_by_label("Default timeout (s)").fill("600")

    # the step: the default option is asked for only when the run resumes with one, and comes next by keyboard
    default_option = form.get_by_label("Default option")
    await expect(default_option).to_be_hidden()
    deadline = form.get_by_label("At the deadline")
    await expect(deadline).to_have_value("fail")
    await deadline.select_option("default")
    await expect(default_option).to_be_visible(timeout=WAIT_MS)
    await deadline.focus()
    await page.keyboard.press("Tab")
    await expect(default_option).to_be_focused()
    await form.get_by_label("Remind every (s)").fill("120")  # ... and no "Reminders at most": the gateway says so
    await form.get_by_label("Escalate to").fill("group:leads")
    await form.get_by_label("Escalate after (s)").fill("300")

    create = page.get_by_role("button", name="Create trigger")
    await create.click()
    reminders = form.get_by_label("Reminders at most")
    await expect(page.locator("#message")).to_contain_text("Not saved", timeout=WAIT_MS)
    await expect(reminders).to_have_attribute("aria-invalid", "true", timeout=WAIT_MS)
    await expect(form.locator("#tw-renotify_max-error")).to_contain_text("human.on_timeout.renotify.max")
    await expect(reminders).to_have_accessible_description(
        "1 to 20, with Remind every human.on_timeout.renotify.max: Field required"
    )
    await expect(reminders).to_be_focused()
    await page.keyboard.type("2")

    await create.click()  # now the chain is whole, but "default" names no option
    await expect(default_option).to_have_attribute("aria-invalid", "true", timeout=WAIT_MS)
    await expect(form.locator("#tw-default_option-error")).to_contain_text("needs default_option")
    await expect(reminders).not_to_have_attribute("aria-invalid", "true")
    await expect(form.locator("#tw-renotify_max-error")).to_be_hidden()
    await expect(default_option).to_be_focused()
    await page.keyboard.type("approve")
    await page.keyboard.press("Enter")  # submits the form
    await expect(page.locator("#message")).to_contain_text("Trigger wizard-fires saved", timeout=WAIT_MS)
    row = page.locator('#trigger-defs tr[data-trigger-id="wizard-fires"]')
    await expect(row.locator("td.enabled")).to_have_text("yes", timeout=WAIT_MS)

    # the gateway holds the chain exactly as the trigger API takes it
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=gateway, timeout=20) as client:
        stored = (await client.get("/triggers/wizard-fires", headers=admin)).json()["trigger"]
        assert stored["enabled"] is True
        assert stored["auth"] == {"type": "bearer", "token_env": "WIZARD_FIRE_TOKEN"}
        assert {k: stored["human"][k] for k in ("allowed_recipients", "default_timeout_s")} == {
            "allowed_recipients": ["user:alice"],
            "default_timeout_s": 600,
        }
        assert stored["human"]["on_timeout"] == {
            "action": "default",
            "default_option": "approve",
            "renotify": {"every_s": 120, "max": 2},
            "escalate": {"to": "group:leads", "after_s": 300},
        }

        # it fires: a delivery with the trigger's auth is accepted and starts a run
        payload = {"type": "order.created", "id": "ord-fire-1", "data": {"order_id": 11}}
        refused = await client.post("/hooks/wizard-fires", json=payload, headers={"Authorization": "Bearer wrong"})
        assert refused.status_code == 401, refused.text
        hook = await client.post("/hooks/wizard-fires", json=payload, headers={"Authorization": f"Bearer {HOOK_TOKEN}"})
    assert hook.status_code == 202, hook.text
    answer = hook.json()
    assert answer["status"] == "accepted", answer
    run_id = answer["run_id"]

    await page.goto(f"{served.url}/console/#/runs")
    run_row = page.locator(f'#runs tr[data-run-id="{run_id}"]')
    await expect(run_row).to_be_visible(timeout=WAIT_MS)
    await page.goto(f"{served.url}/console/#/triggers/wizard-fires")
    accepted = page.locator('#processing tr[data-state="accepted"]')
    await expect(accepted.get_by_role("link", name=run_id)).to_be_visible(timeout=WAIT_MS)
    await accepted.get_by_role("link", name=run_id).click()
    await expect(page.locator("#timeline > li .step-title")).to_contain_text(
        ["Trigger wizard-fires", "Run requested"], timeout=WAIT_MS
    )

    # editing reads the chain back into the step
    await page.goto(f"{served.url}/console/#/wizard/wizard-fires")
    await expect(deadline).to_have_value("default", timeout=WAIT_MS)
    await expect(default_option).to_have_value("approve")
    await expect(reminders).to_have_value("2")
    await expect(form.get_by_label("Escalate to")).to_have_value("group:leads")
