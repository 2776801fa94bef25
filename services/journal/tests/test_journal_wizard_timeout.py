"""The trigger wizard's "when nobody answers" step, end to end: a real headless Chromium creates an enabled
webhook trigger with an ``on_timeout`` chain through the journal's proxy to the real trigger-gateway, the
gateway's 422 field errors stop the step's Next and are shown next to the fields they name, the stored trigger
holds the chain and the maximum timeout, and a webhook posted to it with its auth starts a run that the
console lists.

Every browser assertion waits (Playwright's ``expect`` with a timeout).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from journal_support import ADMIN_TOKEN
from playwright.async_api import BrowserContext, expect
from wizard_support import REVIEW, Choose, expect_step, go_to_step, on_screen, open_wizard, save, walk_wizard

Served = Any  # conftest.ServedJournal

WAIT_MS = 20_000
HOOK_TOKEN = "a-bearer-token-the-gateway-reads"


async def test_wizard_creates_a_trigger_with_an_on_timeout_chain_that_fires(
    served_journal_with_gateway: Served, browser_context: BrowserContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = served_journal_with_gateway
    gateway = str(served.runtime.settings.gateway_url).rstrip("/")
    monkeypatch.setenv("WIZARD_FIRE_TOKEN", HOOK_TOKEN)  # the gateway resolves token_env when a hook arrives
    page = await open_wizard(browser_context, served.url, ADMIN_TOKEN)

    form = page.locator("#trigger-form")
    await walk_wizard(
        page,
        [
            {
                "Id": "wizard-fires",
                "Name": "Orders that need a decision",
                "Adapter": "generic",
                "Auth type": Choose("bearer"),
                "Secret environment variable": "WIZARD_FIRE_TOKEN",
            },
            {"Event types": "order.created"},
            {"Agent": "reviewer"},
            {"Input mapping": "order = payload.order_id"},
            {"Allowed recipients": "user:alice", "Default timeout (s)": "600", "Maximum timeout (s)": "86400"},
        ],
    )

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

    # the step's check is the gateway's: its 422 field errors, each under its field, the first focused
    next_button = page.get_by_role("button", name="Next")
    await next_button.click()
    reminders = form.get_by_label("Reminders at most")
    await expect(page.locator("#message")).to_contain_text("Check step 6 (When nobody answers)", timeout=WAIT_MS)
    await expect(reminders).to_have_attribute("aria-invalid", "true", timeout=WAIT_MS)
    await expect(form.locator("#tw-renotify_max-error")).to_contain_text("human.on_timeout.renotify.max")
    await expect(reminders).to_have_accessible_description(
        "1 to 20, with Remind every human.on_timeout.renotify.max: Field required"
    )
    await expect(reminders).to_be_focused()
    await page.keyboard.type("2")

    await page.keyboard.press("Enter")  # Next: now the chain is whole, but "default" names no option
    await expect(default_option).to_have_attribute("aria-invalid", "true", timeout=WAIT_MS)
    await expect(form.locator("#tw-default_option-error")).to_contain_text("needs default_option")
    await expect(reminders).not_to_have_attribute("aria-invalid", "true")
    await expect(form.locator("#tw-renotify_max-error")).to_be_hidden()
    await expect(default_option).to_be_focused()
    await page.keyboard.type("approve")
    await page.keyboard.press("Enter")  # Next: the review, never an early save
    await expect_step(page, REVIEW)
    review = on_screen(page)
    await expect(review.locator('[data-step="5"]')).to_contain_text("Maximum timeout24 h (86400 s)")
    await expect(review.locator('[data-step="6"]')).to_contain_text("resume with a default option (approve)")
    await save(page, "wizard-fires")
    row = page.locator('#trigger-defs tr[data-trigger-id="wizard-fires"]')
    await expect(row.locator("td.enabled")).to_have_text("yes", timeout=WAIT_MS)

    # the gateway holds the chain exactly as the trigger API takes it
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=gateway, timeout=20) as client:
        stored = (await client.get("/triggers/wizard-fires", headers=admin)).json()["trigger"]
        assert stored["enabled"] is True
        assert stored["auth"] == {"type": "bearer", "token_env": "WIZARD_FIRE_TOKEN"}
        assert {k: stored["human"][k] for k in ("allowed_recipients", "default_timeout_s", "max_timeout_s")} == {
            "allowed_recipients": ["user:alice"],
            "default_timeout_s": 600,
            "max_timeout_s": 86400,
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
    await expect(form.get_by_label("Name", exact=True)).to_have_value("Orders that need a decision", timeout=WAIT_MS)
    await go_to_step(page, 5)
    await expect(form.get_by_label("Maximum timeout (s)")).to_have_value("86400")
    await go_to_step(page, 6)
    await expect(deadline).to_have_value("default", timeout=WAIT_MS)
    await expect(default_option).to_have_value("approve")
    await expect(reminders).to_have_value("2")
    await expect(form.get_by_label("Escalate to")).to_have_value("group:leads")
