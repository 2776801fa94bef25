"""The web console in a real headless Chromium, against the journal service on a real port and a real bus.

Events are published to NATS; the journal's own consumer records them; the page reads the API and the
live tail. Every browser assertion waits (Playwright's ``expect`` with a timeout).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from journal_support import ADMIN_TOKEN, OPERATOR, OPERATOR_TOKEN, VIEWER, VIEWER_TOKEN, console_screenshot
from playwright.async_api import BrowserContext, Page, expect
from wizard_support import REVIEW, Choose, expect_step, go_to_step, on_screen, save, walk_wizard

from temporality_journal import Database, Recorder
from temporality_protocol import (
    Envelope,
    RunStarted,
    RunToolCalled,
    TriggerAccepted,
    TriggerReceived,
    TriggerRejected,
    derive_id,
    make_event,
)
from temporality_protocol.events import (
    AgentAsked,
    AgentAskUndeliverable,
    AgentMessageReceived,
    AgentTaskStreamed,
    RunSampled,
    RunStreamed,
)

MakeStory = Callable[..., Any]  # journal_support.RunStory
Served = Any  # conftest.ServedJournal

WAIT_MS = 20_000
#: Shown as text, never parsed as HTML (the console renders with textContent).
HOSTILE = '<img src=x onerror="document.body.dataset.pwned=1"> Merge it?'


def _trigger_accepted(s: Any) -> Envelope:
    data = TriggerAccepted(
        trigger_id=s.trigger_id, delivery_id="dlv-1", source_event_id="ado-1", run_id=s.run_id, agent=s.agent
    )
    return make_event(data, source="/temporality/test", id=derive_id("evt", s.run_id, "accepted"), run_id=s.run_id)


def _trigger_received(s: Any, delivery_id: str) -> Envelope:
    data = TriggerReceived(
        trigger_id=s.trigger_id,
        delivery_id=delivery_id,
        adapter="azure_devops.pull_request",
        source_event_id="ado-1",
        source_event_type="git.pullrequest.created",
        body_bytes=2048,
    )
    return make_event(data, source="/temporality/test", id=derive_id("evt", delivery_id, "received"), run_id=s.run_id)


def _duplicate(s: Any, delivery_id: str) -> Envelope:
    """The gateway's answer to a redelivery of the run's source event (Azure DevOps retries)."""
    data = TriggerRejected(
        trigger_id=s.trigger_id,
        delivery_id=delivery_id,
        reason="duplicate",
        detail=f"source event ado-1 was already accepted as run {s.run_id} (delivery dlv-1)",
    )
    return make_event(data, source="/temporality/test", id=derive_id("evt", delivery_id, "rejected"), run_id=s.run_id)


def _tool_called(s: Any) -> Envelope:
    data = RunToolCalled(run_id=s.run_id, turn=1, call_id="c1", tool="get_pr_context", result_preview="3 files changed")
    return make_event(data, source="/temporality/test", id=derive_id("evt", s.run_id, "tool"), run_id=s.run_id)


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
        _trigger_received(s, "dlv-1"),  # reads in the "Trigger …" step of its acceptance
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
            "Notified alice on matrix",
            re.compile(r"^Waiting (29|30|31) min$"),  # the story asked ~30 minutes ago: up to now, so last
        ],
        timeout=WAIT_MS,
    )
    request = page.locator('#timeline > li[data-type="human.requested"]')
    await expect(request).to_contain_text(HOSTILE)  # the literal text, not markup
    await expect(page.locator("#run-header")).to_contain_text("Waiting for")
    await expect(page.locator("#run-header")).to_contain_text("alice")
    await console_screenshot(page, "run-waiting")
    assert await page.locator("#view img").count() == 0
    assert await page.evaluate("document.body.dataset.pwned === undefined")
    # each step's event is one click away
    await request.get_by_text("Event details").click()
    await expect(request.locator("pre")).to_contain_text(s.request_id)

    # live: the answer, the resume and the completion arrive over the SSE tail, without a reload
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    await _publish(
        served_journal,
        _trigger_received(s, "dlv-2"),  # Azure DevOps redelivered the webhook: one step, not two raw ones
        _duplicate(s, "dlv-2"),
        s.answered(),
        s.resumed(),
        s.completed("Kept v1; asked the author to restore it"),
    )
    await expect(steps.nth(8)).to_have_text("Waited 1 min", timeout=WAIT_MS)  # waited_s = 60 of human.answered
    await expect(steps).to_have_text(
        [
            "Trigger ado-pr",
            "Run requested",
            "Run created",
            "Run started",
            "Tool call: get_pr_context",
            "Human request",
            "Notified alice on matrix",
            "Duplicate delivery ignored",
            "Waited 1 min",  # in time order: just before the answer it waited for
            "Human response",
            "Run resumed",
            "Completed",
        ],
        timeout=WAIT_MS,
    )
    duplicate = page.locator('#timeline > li[data-type="trigger.rejected"]')
    await expect(duplicate).to_contain_text("already accepted as run")
    await expect(page.locator('#timeline > li[data-type="trigger.received"]')).to_have_count(0)
    response = page.locator('#timeline > li[data-type="human.answered"]')
    await expect(response).to_contain_text("yes")
    await expect(response).to_contain_text("alice")
    await expect(response).to_contain_text("matrix")
    await expect(page.locator('#run-header [data-state="completed"]')).to_be_visible(timeout=WAIT_MS)
    await expect(page.locator("#run-header")).to_contain_text("Kept v1")
    await console_screenshot(page, "run-completed")


async def test_an_event_committed_late_with_a_lower_stream_seq_reaches_the_open_timeline(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    """The run page tails after the trajectory's newest *cursor* (``commit_seq``), not its stream sequence: an
    event a second replica (or a JetStream redelivery) commits later with a lower sequence still arrives."""
    s = story()
    async with Database.open(served_journal.runtime.settings.database_url) as database:
        replica = Recorder(database)  # a second journal replica on the same database
        for seq, event in enumerate([s.requested(), s.started(), s.human_requested()], 101):
            assert await replica.record(event, seq)
        page = await _sign_in(browser_context, served_journal, VIEWER_TOKEN, f"#/runs/{quote(s.run_id, safe='')}")
        steps = page.locator("#timeline > li .step-title")
        await expect(steps).to_have_text(
            ["Trigger ado-pr", "Run started", "Human request", re.compile(r"^Waiting \d+ min$")], timeout=WAIT_MS
        )
        await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
        assert await replica.record(s.notified("telegram"), 50)  # committed last, sequence lowest
        await expect(steps).to_have_text(
            ["Notified alice on telegram", "Trigger ado-pr", "Run started", "Human request", re.compile("^Waiting")],
            timeout=WAIT_MS,
        )


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
    await console_screenshot(page, "waiting")
    # the answer arrives live: the run leaves the list without a reload
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    await _publish(served_journal, s.answered(), s.resumed())
    await expect(row).to_have_count(0, timeout=WAIT_MS)
    await expect(page.locator("#waiting")).to_contain_text("Nobody is being waited for", timeout=WAIT_MS)


async def test_a_run_waiting_on_several_questions_shows_each_with_its_channel_and_outcome(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    alice = story(title="Review PR 43: release", request_id="hreq-a")
    bob = story(run_id=alice.run_id, request_id="hreq-b")
    asked = [alice.requested(), alice.started(), alice.human_requested(recipient="user:alice", question="Ship v2?")]
    bob.at = alice.at  # asked a second after alice: the questions are listed in the order they were asked
    await _publish(
        served_journal,
        *asked,
        bob.human_requested(recipient="user:bob", question="Keep v1?"),
        alice.notified("web"),
        bob.notified("matrix"),
        bob.answered(responder="user:bob", channel="matrix"),
    )
    page = await _sign_in(browser_context, served_journal, VIEWER_TOKEN, "#/waiting")
    row = page.locator(f'#waiting tr[data-run-id="{alice.run_id}"]')
    await expect(row.locator("td").nth(1).locator(".question-line")).to_have_text(
        ["alice (waiting)", "bob (answered by bob)"], timeout=WAIT_MS
    )
    await expect(row.locator("td").nth(2).locator(".question-line")).to_have_text(["web", "matrix"])
    await expect(row.locator("td").nth(3).locator(".question-line")).to_have_text(["Ship v2?", "Keep v1?"])
    await row.get_by_role("link").click()
    await expect(page.locator("#run-questions li")).to_have_text(
        ["alice (web): Ship v2? — waiting", "bob (matrix): Keep v1? — answered by bob"], timeout=WAIT_MS
    )


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
        await expect(operator.get_by_role("status")).to_contain_text("Cancel requested by oncall", timeout=WAIT_MS)
        # the journal recorded the request (published to NATS) and the tail brought it to the timeline
        step = operator.locator('#timeline > li[data-type="run.cancel_requested"]')
        await expect(step).to_contain_text("Cancel requested by oncall", timeout=WAIT_MS)
        await expect(step).to_contain_text("the PR was closed")
    finally:
        await operator_context.close()
    async with httpx.AsyncClient(base_url=served_journal.url, headers=OPERATOR) as client:  # audited: operator's
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
    await expect(row.locator("td.runs-completed")).to_have_text("1")  # successful runs
    await expect(row.locator("td.needed-human")).to_have_text("1")  # needed a human
    await row.get_by_role("link", name=s.trigger_id).click()
    await expect(page.locator("#deliveries")).to_contain_text("dlv-1", timeout=WAIT_MS)
    await expect(page.locator("#deliveries")).to_contain_text("accepted")

    await page.get_by_role("link", name="Analytics").click()
    await expect(page.locator("#analytics")).to_contain_text("Runs that asked a human", timeout=WAIT_MS)
    await expect(page.locator("#analytics")).to_contain_text("1 (100 %)")
    await expect(page.locator("#analytics")).to_contain_text(HOSTILE)  # the most delegated question
    await expect(page.locator("#analytics")).to_contain_text("Escalated / reminders sent0 / 0")  # (no policy step)
    # the charts: one bar per outcome and per wait bucket, labelled for screen readers
    await expect(page.get_by_role("img", name="answered: 1")).to_be_visible()
    await expect(page.get_by_role("img", name="timed out: 0")).to_be_visible()
    await expect(page.get_by_role("img", name="< 1 min: 0")).to_be_visible()
    await expect(page.get_by_role("img", name="< 5 min: 1")).to_be_visible()  # waited 60 s
    # per stage: the question was asked at the run's turn 1 (RunStory's human.requested)
    await expect(page.get_by_role("img", name="turn 1: 1")).to_be_visible()
    stage = page.locator('#stages tr[data-turn="1"]')
    await expect(stage.locator("th")).to_have_text("turn 1")
    # ... by the one run, which got that far (it completed after 2 turns)
    await expect(stage.locator("td")).to_have_text(["1", "1", "100 %", "1", "100 %", "1", "0", "0", "0", "0", "1 min"])
    assert "[object" not in await page.locator("#analytics").inner_text()
    await console_screenshot(page, "analytics")


async def test_runs_list_filters(served_journal: Served, browser_context: BrowserContext, story: MakeStory) -> None:
    review, triage = story(title="Review PR 7"), story(agent="triager", title="Triage bug 9")
    await _publish(served_journal, review.requested(), triage.requested(), triage.started())
    page = await _sign_in(browser_context, served_journal, VIEWER_TOKEN)
    rows = page.locator("#runs tbody tr[data-run-id]")
    await expect(rows).to_have_count(2, timeout=WAIT_MS)

    await page.get_by_label("Agent", exact=True).fill("triager")
    await page.get_by_role("button", name="Filter").click()
    await expect(page).to_have_url(re.compile(r"#/runs\?agent=triager$"), timeout=WAIT_MS)
    await expect(rows).to_have_count(1, timeout=WAIT_MS)
    await expect(rows.first).to_have_attribute("data-run-id", triage.run_id)

    await page.get_by_label("Agent", exact=True).fill("")
    await page.get_by_label("State").select_option("pending")
    await page.get_by_role("button", name="Filter").click()
    await expect(rows).to_have_count(1, timeout=WAIT_MS)
    await expect(rows.first).to_have_attribute("data-run-id", review.run_id)

    await page.get_by_label("State").select_option("")
    await page.get_by_label("Title or run id").fill("nothing like this")
    await page.get_by_role("button", name="Filter").click()
    await expect(page.locator("#runs")).to_contain_text("No runs.", timeout=WAIT_MS)

    # a run id pasted into the search finds its run; the agent however it is capitalised
    await page.get_by_label("Title or run id").fill(review.run_id)
    await page.get_by_role("button", name="Filter").click()
    await expect(rows).to_have_count(1, timeout=WAIT_MS)
    await expect(rows.first).to_have_attribute("data-run-id", review.run_id)
    await page.get_by_label("Title or run id").fill("")
    await page.get_by_label("Agent", exact=True).fill("Triager")
    await page.get_by_role("button", name="Filter").click()
    await expect(rows).to_have_count(1, timeout=WAIT_MS)
    await expect(rows.first).to_have_attribute("data-run-id", triage.run_id)
    await expect(page.get_by_role("link", name="Audit")).to_be_hidden()  # a viewer: no audit trail

    # an unknown run id: said where the run would be, nothing left "Loading…"
    await page.goto(f"{served_journal.url}/console/#/runs/run-no-such-run")
    await expect(page.locator("#run-missing")).to_have_text("The journal has no run with this id.", timeout=WAIT_MS)
    await expect(page.locator("#view")).not_to_contain_text("Loading")
    await page.get_by_role("link", name="Search the runs for this id").click()
    await expect(page).to_have_url(re.compile(r"#/runs\?q=run-no-such-run$"), timeout=WAIT_MS)
    await expect(page.locator("#runs")).to_contain_text("No runs.", timeout=WAIT_MS)


async def test_agent_asks_read_in_the_timeline_and_relay_run_ids_open(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    asker, target = story(agent="planner"), story()
    relay = f"{target.run_id}/ask/01"
    asked = make_event(
        AgentAsked(
            request_id="req-c1",
            asker_run_id=asker.run_id,
            asker_agent="planner",
            to="agent:ghost",
            message="Is it safe?",
        ),
        id=derive_id("evt", "console", "asked"),
        run_id=asker.run_id,
        correlation_id="saga-console",
        source="/temporality/test",
    )
    refused = make_event(
        AgentAskUndeliverable(
            request_id="req-c1",
            asker_run_id=asker.run_id,
            to="agent:ghost",
            reason="unknown_addressee",
            detail="nobody",
        ),
        id=derive_id("evt", "console", "undeliverable"),
        run_id=asker.run_id,
        correlation_id="saga-console",
        source="/temporality/test",
    )
    received = make_event(
        AgentMessageReceived(
            request_id="req-c2",
            asker_run_id=asker.run_id,
            asker_agent="planner",
            to="agent:reviewer",
            resolved_run_id=target.run_id,
            recipient_run_id=relay,
            mode="async",
            timeout_s=300,
            message="Why did you approve?",
            relay=True,
            relay_run=relay,
        ),
        id=derive_id("evt", "console", "received"),
        run_id=relay,
        correlation_id="saga-console",
        source="/temporality/test",
    )
    relay_started = make_event(
        RunStarted(run_id=relay, agent="reviewer", role="reviewer", title="Relay"),
        source="/temporality/test",
        id=derive_id("evt", relay, "started"),
        run_id=relay,
    )
    await _publish(served_journal, asker.requested(), asker.started(), asked, refused, relay_started, received)
    page = await _sign_in(browser_context, served_journal, VIEWER_TOKEN, f"#/runs/{asker.run_id}")
    steps = page.locator("#timeline > li .step-title")
    await expect(steps).to_contain_text(
        ["Asked agent ghost: Is it safe?", "Ask undeliverable: no such agent or run"], timeout=WAIT_MS
    )
    await page.goto(f"{served_journal.url}/console/#/runs/{quote(relay, safe='')}")
    await expect(steps).to_have_text(
        ["Run started", "Message from agent planner: Why did you approve?"], timeout=WAIT_MS
    )


async def test_trigger_wizard_creates_previews_and_disables_and_a_viewer_only_reads(
    served_journal_with_gateway: Served, browser_context: BrowserContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = served_journal_with_gateway
    monkeypatch.setenv("WIZARD_HOOK_TOKEN", "a-bearer-token-the-gateway-reads")  # the gateway resolves *_env
    page = await _sign_in(browser_context, served, ADMIN_TOKEN, "#/triggers")
    defs = page.locator("#trigger-defs")
    await expect(defs.locator('tr[data-trigger-id="seeded-hook"]')).to_contain_text("webhook", timeout=WAIT_MS)
    await page.get_by_role("link", name="New trigger").click()

    form = page.locator("#trigger-form")
    source = {"Id": "wizard-orders", "Name": "Orders from the shop", "Adapter": "generic"}
    await walk_wizard(
        page,
        [
            {**source, "Auth type": Choose("bearer"), "Secret environment variable": "WIZARD_HOOK_TOKEN"},
            {"Event types": "order.created"},
        ],
    )
    # a field in error is named by its step's check, before anything is saved: the gateway knows no such agent
    agent = on_screen(page).get_by_label("Agent", exact=True)
    await agent.fill("nobody")
    await page.get_by_role("button", name="Next").click()
    await expect(agent).to_have_attribute("aria-invalid", "true", timeout=WAIT_MS)
    await expect(form.locator("#tw-agent-error")).to_contain_text("agent: unknown agent")
    await expect(page.locator("#message")).to_contain_text("Check step 3 (Which agent): agent: unknown agent")
    await expect(agent).to_be_focused()
    await expect_step(page, 3)
    await walk_wizard(page, [{"Agent": "reviewer"}], first=3)
    await on_screen(page).get_by_label("Input mapping").fill("order = payload.order_id\ncustomer = payload.customer")
    await (
        on_screen(page)
        .get_by_label("Sample payload (JSON)")
        .fill('{"type": "order.created", "id": "ord-7", "data": {"order_id": 7, "customer": "<b>ACME</b>"}}')
    )
    await page.get_by_role("button", name="Preview").click()
    await expect(page.locator("#preview-input")).to_contain_text('"order": 7', timeout=WAIT_MS)
    await expect(page.locator("#preview-input")).to_contain_text('"customer": "<b>ACME</b>"')  # text, not markup
    await expect(page.locator("#preview-event")).to_contain_text("order.created")
    await console_screenshot(page, "trigger-wizard")
    await walk_wizard(page, [{}, {"Allowed recipients": "user:alice"}, {}], first=4)
    review = on_screen(page)
    await expect(review.locator('[data-step="3"]')).to_contain_text("reviewer")
    await expect(review.locator('[data-step="4"]')).to_contain_text("order = payload.order_id")
    await console_screenshot(page, "trigger-wizard-review")
    await save(page, "wizard-orders")
    row = defs.locator('tr[data-trigger-id="wizard-orders"]')
    await expect(row.locator("td.enabled")).to_have_text("yes", timeout=WAIT_MS)
    await expect(row).to_contain_text("root")  # changed by the admin token's name
    await expect(row.locator("td.source")).to_have_text("generic")  # UI-2's source and event, as configured
    await expect(row.locator("td.events")).to_have_text("order.created")
    await row.get_by_role("button", name="Disable").click()
    await expect(row.locator("td.enabled")).to_have_text("no", timeout=WAIT_MS)
    await expect(row.get_by_role("button", name="Enable")).to_be_visible()

    async with httpx.AsyncClient(base_url=served.url, headers=VIEWER) as client:
        stored = (await client.get("/gateway/triggers/wizard-orders")).json()["trigger"]
    assert stored["auth"] == {"type": "bearer", "token_env": "WIZARD_HOOK_TOKEN"}
    assert stored["input"] == {"order": "payload.order_id", "customer": "payload.customer"}
    assert (stored["enabled"], stored["human"]["allowed_recipients"]) == (False, ["user:alice"])

    viewer = await _sign_in(browser_context, served, VIEWER_TOKEN, "#/triggers")
    viewer_row = viewer.locator('#trigger-defs tr[data-trigger-id="wizard-orders"]')
    await expect(viewer_row.locator("td.enabled")).to_have_text("no", timeout=WAIT_MS)
    assert await viewer.locator("#trigger-defs button, #trigger-defs a.button").count() == 0
    assert await viewer.get_by_role("link", name="New trigger").count() == 0


async def test_trigger_wizard_edit_says_412_when_someone_else_changed_it(
    served_journal_with_gateway: Served, browser_context: BrowserContext
) -> None:
    served = served_journal_with_gateway
    page = await _sign_in(browser_context, served, ADMIN_TOKEN, "#/triggers")
    row = page.locator('#trigger-defs tr[data-trigger-id="seeded-hook"]')
    await row.get_by_role("link", name="Edit").click()
    form = page.locator("#trigger-form")
    await expect(form.get_by_label("Adapter")).to_have_value("generic", timeout=WAIT_MS)
    await expect(form.get_by_label("Id", exact=True)).to_be_disabled()
    async with httpx.AsyncClient(base_url=served.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        assert (await client.post("/gateway/triggers/seeded-hook/disable")).status_code == 200  # meanwhile

    # an edit may go straight to the review (every step is reached): the step left is checked first
    await form.get_by_label("Name", exact=True).fill("Renamed in the console")
    await go_to_step(page, REVIEW)
    await page.get_by_role("button", name="Save changes").click()
    await expect(page.locator("#message")).to_contain_text("Someone else changed this trigger", timeout=WAIT_MS)
    await page.get_by_role("button", name="Reload").click()
    await expect(form.get_by_label("Enabled")).not_to_be_checked(timeout=WAIT_MS)  # their version
    await form.get_by_label("Name", exact=True).fill("Renamed in the console")
    await go_to_step(page, REVIEW)
    await save(page, "seeded-hook", "Save changes")
    await expect(row).to_contain_text("Renamed in the console", timeout=WAIT_MS)
    await expect(row.locator("td.enabled")).to_have_text("no")


async def test_a_run_known_only_from_events_opens_with_what_is_known(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    s = story()
    await _publish(served_journal, _trigger_accepted(s), s.notified("web"))  # no run event (yet)
    page = await _sign_in(browser_context, served_journal, OPERATOR_TOKEN, f"#/runs/{s.run_id}")
    header = page.locator("#run-header")
    await expect(header.locator("#run-unprojected")).to_contain_text("Known from its events only", timeout=WAIT_MS)
    await expect(header.locator('[data-state="pending"]')).to_be_visible()
    await expect(header).to_contain_text("ado-pr")  # the trigger, from trigger.accepted
    await expect(page.locator("#timeline > li .step-title")).to_have_text(["Trigger ado-pr", "Notified alice on web"])
    await expect(page.locator("#cancel-run")).to_have_count(0)  # nothing the executor knows to cancel yet
    await expect(page.get_by_role("alert")).to_be_hidden()  # no 404


async def test_trigger_wizard_prompt_condition_dedupe_and_concurrency(
    served_journal_with_gateway: Served, browser_context: BrowserContext
) -> None:
    served = served_journal_with_gateway
    page = await _sign_in(browser_context, served, ADMIN_TOKEN, "#/wizard")
    form = page.locator("#trigger-form")
    await walk_wizard(
        page,
        [
            # "none" picked: the adapter alone would preselect standard_webhooks, which needs a secret
            {
                "Id": "wizard-flow",
                "Name": "Orders, one run per customer",
                "Adapter": "generic",
                "Auth type": Choose("none"),
            },
            {
                "Event types": "order.created",
                "Condition (when)": "payload.total > `100`",
                "Remember event ids (days)": "3",
            },
            {
                "Agent": "reviewer",
                "Concurrency key": "payload.customer",
                "When a run of the key is active": Choose("supersede"),
                "Debounce (s)": "30",
            },
        ],
    )
    await form.get_by_label("Input mapping").fill("order = payload.order_id\ncustomer = payload.customer")
    await form.get_by_label("Prompt (first message)").fill("Check order ${order} of ${customer}.")
    await form.get_by_label("Sample headers").fill("Idempotency-Key: ord-9")
    sample = form.get_by_label("Sample payload (JSON)")
    await sample.fill(
        '{"type": "order.created", "id": "ord-9", "data": {"order_id": 9, "customer": "acme", "total": 250}}'
    )
    await page.get_by_role("button", name="Preview").click()
    await expect(page.locator("#preview-input")).to_contain_text('"prompt": "Check order 9 of acme."', timeout=WAIT_MS)
    # the condition is checked in the preview too: a small order starts no run
    await sample.fill(
        '{"type": "order.created", "id": "ord-8", "data": {"order_id": 8, "customer": "acme", "total": 5}}'
    )
    await page.get_by_role("button", name="Preview").click()
    await expect(page.locator("#preview")).to_contain_text("No run: filtered", timeout=WAIT_MS)
    await walk_wizard(page, [{}, {}, {}], first=4)  # a sample the condition filters is no error
    await save(page, "wizard-flow")

    async with httpx.AsyncClient(base_url=served.url, headers=VIEWER) as client:
        stored = (await client.get("/gateway/triggers/wizard-flow")).json()["trigger"]
    assert stored["prompt"] == "Check order ${order} of ${customer}."
    assert stored["when"] == "payload.total > `100`"
    assert stored["deduplication"] == {"ttl_days": 3}
    assert {k: stored["concurrency"][k] for k in ("key", "policy", "debounce_s")} == {
        "key": "payload.customer",
        "policy": "supersede",
        "debounce_s": 30,
    }
    # editing starts from the stored values, and clearing a field removes it
    await page.locator('#trigger-defs tr[data-trigger-id="wizard-flow"]').get_by_role("link", name="Edit").click()
    await expect(form.get_by_label("Name", exact=True)).to_have_value("Orders, one run per customer", timeout=WAIT_MS)
    await go_to_step(page, 3)
    await expect(form.get_by_label("Concurrency key")).to_have_value("payload.customer")
    await expect(form.get_by_label("When a run of the key is active")).to_have_value("supersede")
    await form.get_by_label("Concurrency key").fill("")
    await go_to_step(page, 4)
    await expect(form.get_by_label("Prompt (first message)")).to_have_value("Check order ${order} of ${customer}.")
    await go_to_step(page, 2)
    await form.get_by_label("Condition (when)").fill("")
    await go_to_step(page, REVIEW)
    await save(page, "wizard-flow", "Save changes")
    async with httpx.AsyncClient(base_url=served.url, headers=VIEWER) as client:
        stored = (await client.get("/gateway/triggers/wizard-flow")).json()["trigger"]
    assert (stored.get("concurrency"), stored.get("when"), stored["deduplication"]) == (None, None, {"ttl_days": 3})


async def test_an_operator_re_drives_a_rejected_delivery(
    served_journal_with_gateway: Served, browser_context: BrowserContext
) -> None:
    served = served_journal_with_gateway
    gateway = str(served.runtime.settings.gateway_url).rstrip("/")
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=20) as client:
        assert (await client.post(f"{gateway}/triggers/seeded-hook/disable")).status_code == 200
        hook = await client.post(
            f"{gateway}/hooks/seeded-hook", json={"type": "order.created", "id": "ord-redrive", "data": {"n": 1}}
        )
        assert hook.json()["reason"] == "disabled", hook.text
        assert (await client.post(f"{gateway}/triggers/seeded-hook/enable")).status_code == 200
    page = await _sign_in(browser_context, served, OPERATOR_TOKEN, "#/triggers/seeded-hook")
    rejected = page.locator('#processing tr[data-state="rejected"]')
    await expect(rejected).to_contain_text("disabled", timeout=WAIT_MS)
    await rejected.get_by_role("button", name="Re-drive").click()
    await expect(page.get_by_role("status")).to_contain_text("re-driven as dlv-", timeout=WAIT_MS)
    await expect(page.get_by_role("status")).to_contain_text(": accepted (run run-")
    accepted = page.locator('#processing tr[data-state="accepted"]')
    await expect(accepted).to_contain_text("re-drive of", timeout=WAIT_MS)
    await expect(accepted.get_by_role("link")).to_have_text(re.compile(r"^run-"))
    first_run = await accepted.get_by_role("link").inner_text()

    # an accepted delivery runs again only as a new run, asked for explicitly (a confirmation, then {"rerun": 1})
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    await accepted.get_by_role("button", name="Rerun").click()
    await expect(page.get_by_role("status")).to_contain_text("rerun 1 as dlv-", timeout=WAIT_MS)
    await expect(page.get_by_role("status")).to_contain_text(": accepted (run run-")
    rerun = page.locator("#processing tr[data-state]", has_text="rerun 1 of")
    await expect(rerun).to_have_count(1, timeout=WAIT_MS)
    await expect(rerun.get_by_role("link")).to_have_text(re.compile(r"^run-"))
    assert await rerun.get_by_role("link").inner_text() != first_run  # a new run
    # the new run's timeline links the run it runs again, and says who asked
    await rerun.get_by_role("link").click()
    requested = page.locator('#timeline li[data-type="run.requested"]')
    await expect(requested).to_contain_text("Rerun of", timeout=WAIT_MS)
    await expect(requested.get_by_role("link", name=first_run)).to_have_attribute("href", f"#/runs/{first_run}")
    await expect(requested).to_contain_text("Rerun asked by")

    viewer = await _sign_in(browser_context, served, VIEWER_TOKEN, "#/triggers/seeded-hook")
    await expect(viewer.locator("#processing tr[data-state]")).to_have_count(3, timeout=WAIT_MS)
    assert await viewer.locator("#processing button").count() == 0  # viewers read, operators re-drive


async def test_a_tool_s_sampling_reads_in_the_timeline(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    """An MCP tool that asked the run's model mid-call (``run.sampled``) is a step of its own, with the prompt,
    the answer and the tokens."""
    s = story(title="Sampled")
    sampled = make_event(
        RunSampled(
            run_id=s.run_id,
            turn=1,
            call_id="c1",
            tool="docs.summarize",
            sample=0,
            model="gpt-test",
            prompt_preview="Summarize the diff",
            result_preview="Two files renamed",
            total_tokens=42,
        ),
        source="/temporality/test",
        id=derive_id("evt", s.run_id, "sampled"),
        run_id=s.run_id,
    )
    await _publish(served_journal, s.requested(), s.started(), sampled)
    page = await _sign_in(browser_context, served_journal, VIEWER_TOKEN, f"#/runs/{s.run_id}")
    steps = page.locator("#timeline > li .step-title")
    await expect(steps).to_contain_text(
        ["Run started", "Tool docs.summarize asked the model (gpt-test)"], timeout=WAIT_MS
    )
    step = page.locator('#timeline > li[data-type="run.sampled"]')
    await expect(step).to_contain_text("Summarize the diff")
    await expect(step).to_contain_text("Two files renamed")
    await expect(step).to_contain_text("42")


async def test_what_a_run_streams_reads_in_the_timeline(
    served_journal: Served, browser_context: BrowserContext, story: MakeStory
) -> None:
    """AP-9: a hosted run's ``run.streamed`` (a ``report_progress`` call, a turn's metrics) and an external agent's
    ``agent.task.streamed`` (the same payload) are steps of the timeline, the request id with them."""
    s = story(title="Streamed")

    def streamed(data: RunStreamed | AgentTaskStreamed, part: str) -> Envelope:
        return make_event(data, source="/temporality/test", id=derive_id("evt", s.run_id, part), run_id=s.run_id)

    common = {"run_id": s.run_id, "turn": 1, "correlation_id": "saga-1", "request_id": "req-7"}
    progress = RunStreamed(**common, agent=s.agent, kind="progress", message="Read 2 of 3 files", data={"percent": 66})
    metrics = RunStreamed(
        **common,
        agent=s.agent,
        kind="metrics",
        message="turn 1",
        data={"prompt_tokens": 120, "completion_tokens": 30, "provider_latency_s": 1.5, "tool_calls": 2},
    )
    warning = AgentTaskStreamed(
        **common, task_id="task-1", agent_id="example-agent", kind="warning", message="No tests"
    )
    await _publish(
        served_journal,
        s.requested(),
        s.started(),
        streamed(metrics, "metrics"),
        streamed(progress, "progress"),
        streamed(warning, "warning"),
    )
    page = await _sign_in(browser_context, served_journal, VIEWER_TOKEN, f"#/runs/{s.run_id}")
    steps = page.locator("#timeline > li .step-title")
    await expect(steps).to_contain_text(
        ["Run started", "Turn 1 metrics", "Progress: Read 2 of 3 files", "Warning: No tests"], timeout=WAIT_MS
    )
    turn = page.locator('#timeline > li[data-type="run.streamed"]').first
    await expect(turn).to_contain_text("120 in · 30 out")
    await expect(turn).to_contain_text("1.50 s")
    step = page.locator('#timeline > li[data-type="run.streamed"]').nth(1)
    await expect(step).to_contain_text('{"percent":66}')
    await expect(step).to_contain_text("req-7")
    await expect(page.locator('#timeline > li[data-type="agent.task.streamed"]')).to_contain_text("example-agent")
