"""The console's web inbox renders a request's form (``answer_schema``: an MCP elicitation's requested schema)
in a real headless Chromium, against the real human-interaction service behind the journal's ``/human/`` proxy
(issues 8 and 9).

A ``human.requested`` with a form is published to the test's nats-server: human-interaction stores it and
serves its fields (``form``) in the inbox; the console shows one labelled input per field (the required ones
marked), sends the typed values as one JSON-object text, shows human-interaction's 422 ``invalid_answer``
naming the field of a misfit (that field marked and focused, the form still usable), and records a fitting
answer: the ``human.answered`` event carries the typed values, read by ``temporality_protocol.forms`` as the
run-executor will. Every cross-process assertion waits on its condition with a timeout.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from journal_support import BOB_INBOX, VIEWER, ServedJournal, eventually
from playwright.async_api import BrowserContext, expect

from temporality_protocol import (
    HumanOption,
    HumanPolicy,
    HumanRequested,
    TextAnswer,
    forms,
)

WAIT_MS = 20_000
SCREENSHOTS = os.environ.get("TEMPORALITY_CONSOLE_SCREENSHOTS")  # docs/img, as the other console tests
pytestmark = pytest.mark.timeout(120)

#: The four kinds a form field has: a bounded integer, an enum with labels, a boolean, free text.
FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "title": "Replicas", "description": "How many"},
        "region": {"type": "string", "enum": ["eu", "us"], "enumNames": ["Europe", "United States"], "title": "Region"},
        "canary": {"type": "boolean", "title": "Canary first"},
        "note": {"type": "string", "title": "Note", "description": "Anything the tool should know"},
    },
    "required": ["replicas", "region"],
}


async def _ask_bob_a_form(served: ServedJournal) -> tuple[str, str]:
    """Publish a run and a ``human.requested`` to bob with :data:`FORM` (and a Decline option); its ids."""
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    request_id = f"hreq-{uuid.uuid4().hex[:12]}"
    data = HumanRequested(
        request_id=request_id,
        run_id=run_id,
        agent="deployer",
        title="Scale orders-service",
        recipient="user:bob",
        question="How should orders-service be scaled?",
        context="The deploy tool needs the replica count and the region.",
        options=[HumanOption(id="decline", label="Decline", consequence="the tool is told you declined")],
        timeout_s=3600,
        expires_at=datetime.now(UTC) + timedelta(hours=1),
        policy=HumanPolicy(allowed_recipients=["user:bob"]),
        turn=1,
        answer_schema=FORM,
    )
    await served.ask(data)
    return run_id, request_id


async def test_a_typed_request_is_a_form_a_misfit_names_its_field_and_a_fitting_answer_is_recorded(
    browser_context: BrowserContext, served_journal_with_human: ServedJournal
) -> None:
    served = served_journal_with_human
    run_id, request_id = await _ask_bob_a_form(served)
    async with httpx.AsyncClient(base_url=served.url, timeout=20) as client:

        async def _stored() -> dict[str, Any] | None:
            one = await client.get(f"/human/requests/{request_id}", headers=BOB_INBOX)
            return one.json() if one.status_code == 200 else None

        # the proxy passes the form through as human-interaction serves it (the console's input)
        item = await eventually(_stored, what="bob's request stored by human-interaction")
        assert item["answer_schema"] == FORM
        assert [(f["name"], f["type"], f["required"]) for f in item["form"]] == [
            ("replicas", "integer", True),
            ("region", "string", True),
            ("canary", "boolean", False),
            ("note", "string", False),
        ]

        page = await browser_context.new_page()
        await page.goto(f"{served.url}/console/#/inbox")
        await page.get_by_label("Inbox token").fill("bob-inbox-token")
        await page.keyboard.press("Enter")
        card = page.locator(f'#inbox .inbox-item[data-request-id="{request_id}"]')
        await expect(card.locator("h2")).to_have_text("How should orders-service be scaled?", timeout=WAIT_MS)
        await expect(card).not_to_contain_text("null")  # no source link: nothing in its place

        # one labelled input per field, the required ones marked, the description beside its input
        form = card.get_by_role("form", name="Your answer")
        replicas, region = form.get_by_label("Replicas"), form.get_by_label("Region")
        canary, note = form.get_by_label("Canary first"), form.get_by_label("Note")
        await expect(replicas).to_have_attribute("inputmode", "numeric")
        await expect(replicas).to_have_attribute("required", "")
        await expect(replicas).to_have_accessible_description("How many")
        await expect(form.locator('label[for$="-0"]')).to_have_text("Replicas (required)")
        await expect(form.locator('label[for$="-2"]')).to_have_text("Canary first")
        await expect(region.locator("option")).to_have_text(["— choose —", "Europe", "United States"])
        await expect(canary.locator("option")).to_have_text(["— not said —", "Yes", "No"])
        await expect(note).to_have_accessible_description("Anything the tool should know")
        await expect(card.get_by_role("button", name="Decline")).to_be_visible()
        await expect(card.get_by_label("Or answer in your own words")).to_have_count(0)  # the form replaces it

        # a misfit: human-interaction refuses it (422) naming the field; the field is marked, the form stays open
        await replicas.fill("30")
        await region.select_option(label="Europe")
        await canary.select_option(label="Yes")
        await form.get_by_role("button", name="Send answer").click()
        await expect(card.locator(".answer-status")).to_have_text(
            "That answer does not fit: field 'replicas': 30 is greater than the maximum of 10 (422).", timeout=WAIT_MS
        )
        await expect(replicas).to_have_attribute("aria-invalid", "true")
        await expect(replicas).to_be_focused()
        await expect(replicas).to_have_accessible_description(
            "How many field 'replicas': 30 is greater than the maximum of 10"
        )
        await expect(form.get_by_role("button", name="Send answer")).to_be_enabled()
        if SCREENSHOTS:
            await card.screenshot(path=Path(SCREENSHOTS) / "console-inbox-form.png")

        # a text where a number goes is the server's to refuse too, with the field named
        await replicas.fill("many")
        await page.keyboard.press("Enter")
        await expect(card.locator(".answer-status")).to_have_text(
            "That answer does not fit: field 'replicas': 'many' is not of type 'integer' (422).", timeout=WAIT_MS
        )
        await expect(replicas).to_have_attribute("aria-invalid", "true")

        # the fitting answer: recorded, the card says what was sent, the controls are disabled
        await replicas.fill("3")
        await form.get_by_role("button", name="Send answer").click()
        await expect(card.locator(".answer-status")).to_have_text(
            "Answer recorded: Replicas: 3, Region: Europe, Canary first: Yes. The run continues.", timeout=WAIT_MS
        )
        await expect(replicas).not_to_have_attribute("aria-invalid", "true")
        await expect(form.get_by_role("button", name="Send answer")).to_be_disabled()

        # the human.answered event carries the typed values: the run-executor reads them as the form's content
        async def _answered() -> dict[str, Any] | None:
            events = await client.get(f"/runs/{run_id}/events", headers=VIEWER)
            if events.status_code != 200:
                return None
            found = [e for e in events.json()["events"] if e["type"] == "human.answered"]
            return found[0] if found else None

        answered = await eventually(_answered, what="the journal to record human.answered")
        answer = answered["data"]["answer"]
        assert answer["type"] == "text"
        assert json.loads(answer["value"]) == {"replicas": 3, "region": "eu", "canary": True}
        read = forms.read(FORM, TextAnswer(value=answer["value"]))
        assert (read.action, read.content) == ("accept", {"replicas": 3, "region": "eu", "canary": True})
        assert answered["data"]["responder"] == "user:bob"
        assert answered["data"]["channel"] == "web"
        stored = await client.get(f"/human/requests/{request_id}", headers=BOB_INBOX)
        assert stored.json()["status"] == "answered"
