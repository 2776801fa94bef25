"""What a team lead's review of the console found, each fixed and checked in a real headless Chromium (Playwright
driving Debian's chromium) against the journal service on a real port, fed through a real nats-server (and the
real trigger-gateway where triggers are involved): long words wrap, the Waiting page's durations count up, the Runs
list and a trigger's two deliveries tables keep (and page to) their older rows, the Analytics page has a period in
its address, a save reads as a success, the wizard's own checks run and speak in words, the actions stay in their
table, and a mindmap trigger is created and edited. Every browser assertion waits on its condition with a timeout
(Playwright's ``expect``); the Waiting page's clock is Playwright's (``page.clock``), never a sleep.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from journal_support import (
    ADMIN,
    ADMIN_TOKEN,
    OPERATOR_TOKEN,
    ServedJournal,
    publish_recorded,
    viewer_page,
)
from playwright.async_api import BrowserContext, Page, expect
from wizard_support import REVIEW, expect_step, go_to_step, on_screen, open_wizard, save, walk_wizard

import temporality_journal
from temporality_protocol import (
    Envelope,
    HumanPolicy,
    HumanRequested,
    LaunchSource,
    RunRequested,
    RunStarted,
    derive_id,
    make_event,
)
from temporality_protocol.events import RunStreamed

MakeStory = Callable[..., Any]  # journal_support.RunStory
WAIT_MS = 20_000
pytestmark = pytest.mark.timeout(240)

#: One unbroken word as long as a run title may be (the gateway cuts titles at 200 characters).
LONG_WORD = "x" * 200
#: A 200-character title of words: the gateway cut it there, mid-word.
CUT_TITLE = ("Refactor the payment service retry policy " * 6)[:200]


def _requested(run_id: str, at: datetime, trigger_id: str = "bulk") -> Envelope:
    launch = LaunchSource(kind="webhook", trigger_id=trigger_id, delivery_id=f"dlv-{run_id}")
    return make_event(
        RunRequested(run_id=run_id, agent="reviewer", title=f"Run {run_id}", launch=launch),
        source="/temporality/test",
        id=derive_id("evt", run_id, "requested"),
        run_id=run_id,
        time=at,
    )


async def _wide(page: Page) -> Any:
    """How wide the page is against the window (a long word must not widen it)."""
    return await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")


async def _fits(page: Page) -> None:
    """The page needs no horizontal scrolling (waited for: the rows render after their read)."""
    await page.wait_for_function("document.documentElement.scrollWidth <= window.innerWidth", timeout=WAIT_MS)


async def test_long_words_wrap_titles_cut_say_so_and_the_waiting_durations_count_up(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory
) -> None:
    asked_at = datetime.now(UTC) - timedelta(minutes=30)
    s = story(title=LONG_WORD)
    cut = story(title=CUT_TITLE)
    metrics = make_event(
        RunStreamed(
            run_id=s.run_id,
            agent=s.agent,
            turn=1,
            kind="metrics",
            correlation_id=s.run_id,
            request_id=s.run_id,
            data={"prompt_tokens": 10, "completion_tokens": 5, "tool_calls": 1},
        ),
        source="/temporality/run-executor",
        id=derive_id("evt", s.run_id, "metrics.1"),
        run_id=s.run_id,
    )
    await publish_recorded(
        served_journal,
        cut.requested(),
        s.requested(),
        s.created(),
        s.started(),
        metrics,
        s.human_requested(question="y" * 340, time=asked_at),  # not notified yet
    )
    page = await browser_context.new_page()
    await page.clock.install()  # the page's clock: moved on below instead of waiting 30 s
    await page.goto(f"{served_journal.url}/console/#/waiting")
    await page.get_by_label("API token").fill(OPERATOR_TOKEN)
    await page.get_by_role("button", name="Sign in").click()

    row = page.locator(f'#waiting tr[data-run-id="{s.run_id}"]')
    waited = row.locator("td.waited")
    await expect(waited).to_have_text("30 min", timeout=WAIT_MS)
    await _fits(page)
    # nothing happens in the system; the page's clock moves on 2 minutes: the duration counts up by itself
    await page.clock.fast_forward("02:00")
    await expect(waited).to_have_text("32 min", timeout=WAIT_MS)

    await page.goto(f"{served_journal.url}/console/#/runs")
    await expect(page.locator("#runs tbody tr[data-run-id]")).to_have_count(2, timeout=WAIT_MS)
    await _fits(page)
    runs_row = page.locator(f'#runs tr[data-run-id="{s.run_id}"]')
    await expect(runs_row).to_contain_text("alice · not notified yet")  # not "alice · ?"
    # the cut title ends at a word boundary with "…"
    cut_link = page.locator(f'#runs tr[data-run-id="{cut.run_id}"] td').first.get_by_role("link")
    shown = await cut_link.inner_text()
    assert shown.endswith("…"), shown
    assert len(shown) < 200, shown
    assert CUT_TITLE.startswith(shown[:-1].rstrip()), shown
    assert shown[:-1].rstrip().endswith(("Refactor", "the", "payment", "service", "retry", "policy")), shown

    # the run's header: since when and for how long, the trigger a link; the metrics say no "Request" (the run)
    await page.goto(f"{served_journal.url}/console/#/runs/{s.run_id}")
    header = page.locator("#run-header")
    await expect(header.locator("#run-waited")).to_have_text("32 min", timeout=WAIT_MS)
    await expect(header).to_contain_text("not notified yet")
    await expect(header.get_by_role("link", name="ado-pr")).to_have_attribute("href", "#/triggers/ado-pr")
    step = page.locator('#timeline li[data-type="run.streamed"]')
    await expect(step).to_contain_text("Turn 1 metrics")
    await expect(step.locator("dl.facts")).not_to_contain_text("Request")
    await _fits(page)
    await page.clock.fast_forward("01:00")
    await expect(header.locator("#run-waited")).to_have_text("33 min", timeout=WAIT_MS)
    assert (await _wide(page))[0] <= 1366


async def test_the_runs_list_keeps_its_older_pages_when_a_run_changes(
    served_journal: ServedJournal, browser_context: BrowserContext
) -> None:
    start = datetime.now(UTC) - timedelta(hours=2)
    ids = [f"run-bulk-{n:03d}" for n in range(55)]
    await publish_recorded(served_journal, *[_requested(r, start + timedelta(seconds=n)) for n, r in enumerate(ids)])
    page = await viewer_page(browser_context, served_journal, "#/runs")
    rows = page.locator("#runs tbody tr[data-run-id]")
    await expect(rows).to_have_count(50, timeout=WAIT_MS)
    await expect(page.locator("#live")).to_have_attribute("data-live", "on", timeout=WAIT_MS)
    older = page.get_by_role("button", name="Older runs")
    await older.click()
    await expect(rows).to_have_count(55, timeout=WAIT_MS)
    await expect(older).to_be_hidden()

    # a new run arrives, and one of the older page's runs starts: 56 rows, the new one on top, the old one changed
    oldest = ids[0]
    started = make_event(
        RunStarted(run_id=oldest, agent="reviewer", role="reviewer", title=f"Run {oldest}"),
        source="/temporality/test",
        id=derive_id("evt", oldest, "started"),
        run_id=oldest,
    )
    await publish_recorded(served_journal, _requested("run-bulk-new", datetime.now(UTC)), started)
    await expect(rows).to_have_count(56, timeout=WAIT_MS)
    await expect(rows.first).to_have_attribute("data-run-id", "run-bulk-new")
    await expect(page.locator(f'#runs tr[data-run-id="{oldest}"] [data-state]')).to_have_attribute(
        "data-state", "running", timeout=WAIT_MS
    )
    await expect(rows.last).to_have_attribute("data-run-id", oldest)
    await expect(older).to_be_hidden()


async def test_a_trigger_s_deliveries_page_to_the_older_ones_in_both_tables(
    served_journal_with_gateway: ServedJournal, browser_context: BrowserContext
) -> None:
    served = served_journal_with_gateway
    gateway = str(served.runtime.settings.gateway_url).rstrip("/")
    async with httpx.AsyncClient(headers=ADMIN, timeout=30) as client:
        for n in range(53):
            hook = await client.post(
                f"{gateway}/hooks/seeded-hook", json={"type": "order.created", "id": f"ord-{n}", "data": {"n": n}}
            )
            assert hook.status_code in (200, 202), hook.text
    page = await browser_context.new_page()
    await page.goto(f"{served.url}/console/#/triggers/seeded-hook")
    await page.get_by_label("API token").fill(OPERATOR_TOKEN)
    await page.get_by_role("button", name="Sign in").click()

    # the gateway's processing state: 50, then the older ones, each with its Rerun
    processing = page.locator("#processing tbody tr[data-delivery-id]")
    await expect(processing).to_have_count(50, timeout=WAIT_MS)
    await page.get_by_role("button", name="Older deliveries (gateway)").click()
    await expect(processing).to_have_count(53, timeout=WAIT_MS)
    await expect(page.get_by_role("button", name="Older deliveries (gateway)")).to_be_hidden()
    await expect(processing.last.get_by_role("button", name="Rerun")).to_be_visible()

    # the journal's deliveries (the gateway's trigger.* events): 50, then the older ones
    journal = page.locator("#deliveries tbody tr[data-delivery-id]")
    await expect(journal).to_have_count(50, timeout=WAIT_MS)
    await page.get_by_role("button", name="Older deliveries", exact=True).click()
    await expect(journal).to_have_count(53, timeout=WAIT_MS)

    # one more delivery: both tables keep what they loaded and show it on top
    async with httpx.AsyncClient(headers=ADMIN, timeout=30) as client:
        hook = await client.post(
            f"{gateway}/hooks/seeded-hook", json={"type": "order.created", "id": "ord-last", "data": {"n": 99}}
        )
        assert hook.status_code in (200, 202), hook.text
        delivery = hook.json()["delivery_id"]
    await expect(journal).to_have_count(54, timeout=WAIT_MS)
    await expect(journal.first).to_have_attribute("data-delivery-id", delivery)
    await expect(processing).to_have_count(54, timeout=WAIT_MS)
    await expect(processing.first).to_have_attribute("data-delivery-id", delivery)

    # the oldest delivery, loaded from the second page, reruns
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    await processing.last.get_by_role("button", name="Rerun").click()
    await expect(page.get_by_role("status")).to_contain_text("rerun 1 as dlv-", timeout=WAIT_MS)
    await expect(processing).to_have_count(55, timeout=WAIT_MS)
    # the Rerun column stays inside its table
    inside = await page.evaluate(
        """() => { const t = document.querySelector('#processing').getBoundingClientRect();
           return [...document.querySelectorAll('#processing td.actions')]
             .every((c) => c.getBoundingClientRect().right <= t.right + 0.5); }"""
    )
    assert inside


async def test_analytics_has_a_period_in_its_address(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory
) -> None:
    now = datetime.now(UTC)
    recent = story(at=now - timedelta(days=2), title="Recent run")
    old = story(at=now - timedelta(days=40), title="Old run")
    await publish_recorded(
        served_journal,
        recent.requested(),
        recent.human_requested(question="Merge it?"),
        old.requested(),
        old.human_requested(question="Ship it?"),
    )
    page = await viewer_page(browser_context, served_journal, "#/analytics")
    facts = page.locator("#analytics dl.facts")
    await expect(facts).to_contain_text("Runs2", timeout=WAIT_MS)
    await expect(page.locator("#analytics-scope")).to_have_text("All runs")
    questions = page.locator("#top-questions li")
    await expect(questions).to_have_count(2)
    # per trigger: the runs by how they ended beside the questions (UI-2)
    per_trigger = page.locator("#analytics h2:text-is('Per trigger') + table thead")
    for column in ("Runs", "Completed", "Failed", "Cancelled", "Asked"):
        await expect(per_trigger).to_contain_text(column, timeout=WAIT_MS)

    await page.locator("#analytics-period").select_option("7d")
    await page.get_by_role("button", name="Show").click()
    await expect(page).to_have_url(f"{served_journal.url}/console/#/analytics?period=7d", timeout=WAIT_MS)
    await expect(page.locator("#analytics-scope")).to_have_text("Runs created in the last 7 days", timeout=WAIT_MS)
    await expect(facts).to_contain_text("Runs1", timeout=WAIT_MS)
    await expect(questions).to_have_text(["Merge it? — 1\N{MULTIPLICATION SIGN}asked by reviewer for trigger ado-pr"])

    # the address alone (shared) opens the same period; a from-to range works too
    other = await viewer_page(browser_context, served_journal, "#/analytics?period=30d")
    await expect(other.locator("#analytics-period")).to_have_value("30d", timeout=WAIT_MS)
    await expect(other.locator("#analytics dl.facts")).to_contain_text("Runs1", timeout=WAIT_MS)
    since = (now - timedelta(days=50)).strftime("%Y-%m-%dT%H:%M")
    until = (now - timedelta(days=30)).strftime("%Y-%m-%dT%H:%M")
    await other.locator("#analytics-period").select_option("range")
    await other.get_by_label("From", exact=True).fill(since)
    await other.get_by_label("Before", exact=True).fill(until)
    await other.get_by_role("button", name="Show").click()
    await expect(other.locator("#analytics-scope")).to_contain_text("Runs created from", timeout=WAIT_MS)
    await expect(other.locator("#top-questions li")).to_have_text(
        ["Ship it? — 1\N{MULTIPLICATION SIGN}asked by reviewer for trigger ado-pr"], timeout=WAIT_MS
    )
    assert "since=" in other.url
    assert "until=" in other.url


async def test_the_wizard_checks_in_words_saves_as_a_success_and_keeps_the_actions_in_the_table(
    served_journal_with_gateway: ServedJournal, browser_context: BrowserContext
) -> None:
    served = served_journal_with_gateway
    page = await open_wizard(browser_context, served.url, ADMIN_TOKEN)
    await expect_step(page, 1)
    step = on_screen(page)
    # the browser's own check of the id runs (its pattern compiles under the v flag) and says what the id takes
    ident = step.get_by_label("Id", exact=True)
    await ident.fill("Lead GH")
    assert await ident.evaluate("(input) => !input.checkValidity() && input.validity.patternMismatch")
    await step.get_by_label("Name", exact=True).fill("Lead's GitHub hook")
    await page.locator("#wizard-next").click()
    await expect(page.locator("#message")).to_contain_text("lowercase letters, digits and '-'", timeout=WAIT_MS)
    await expect(page.locator("#message")).to_have_attribute("role", "alert")
    await expect(ident).to_have_attribute("aria-invalid", "true")
    await ident.fill("lead-gh")
    await step.get_by_label("Adapter", exact=True).fill("generic")
    await step.get_by_label("Auth type", exact=True).select_option("none")
    await walk_wizard(
        page,
        [{}, {"Event types": "order.created"}, {"Agent": "reviewer"}, {}],
        first=1,
    )
    # step 5: a recipient without user:/group: is the gateway's pattern, said in words
    await expect_step(page, 5)
    await on_screen(page).get_by_label("Allowed recipients", exact=True).fill("alice")
    await page.locator("#wizard-next").click()
    message = page.locator("#message")
    await expect(message).to_contain_text("user:<id> or group:<id>", timeout=WAIT_MS)
    await expect(message).not_to_contain_text("pattern")
    await on_screen(page).get_by_label("Allowed recipients", exact=True).fill("user:alice")
    await walk_wizard(page, [{}, {}], first=5)
    await save(page, "lead-gh")  # "Trigger lead-gh created.", a status
    await expect(message).not_to_contain_text("revision")

    # the actions stay inside the Definitions table, at a laptop's width and a wide screen's
    for width in (1366, 1920):
        await page.set_viewport_size({"width": width, "height": 900})
        await expect(page.locator('#trigger-defs tr[data-trigger-id="lead-gh"]')).to_be_visible(timeout=WAIT_MS)
        # waited for: the rows are re-read after the save (the list moves with the trigger API's events)
        await page.wait_for_function(
            """() => { const t = document.querySelector('#trigger-defs').getBoundingClientRect();
               const cells = [...document.querySelectorAll('#trigger-defs td.actions')];
               return cells.length > 0 && cells.every((c) => c.getBoundingClientRect().right <= t.right + 0.5)
                 && t.right <= document.querySelector('main').getBoundingClientRect().right + 0.5
                 && document.documentElement.scrollWidth <= window.innerWidth; }""",
            timeout=WAIT_MS,
        )
    await page.set_viewport_size({"width": 1366, "height": 900})

    # the preview's sample headers suggest GitHub's delivery id too
    await page.goto(f"{served.url}/console/#/wizard/lead-gh")
    await go_to_step(page, 4)
    headers = on_screen(page).get_by_label("Sample headers", exact=True)
    await expect(headers).to_have_attribute(
        "placeholder", "X-GitHub-Event: pull_request\nX-GitHub-Delivery: 72d3162e-cc78-11e3-81ab-4c9367dc0958"
    )


async def test_a_mindmap_trigger_is_created_and_edited_in_the_wizard_with_both_of_its_variables(
    served_journal_with_gateway: ServedJournal, browser_context: BrowserContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = served_journal_with_gateway
    gateway = str(served.runtime.settings.gateway_url).rstrip("/")
    monkeypatch.setenv("MM_SIGNING_SECRET", "a-signing-secret-the-gateway-reads")  # the gateway resolves *_env
    monkeypatch.setenv("MM_TRIGGER_TOKEN", "a-token-the-gateway-reads")
    page = await open_wizard(browser_context, served.url, ADMIN_TOKEN)
    await expect_step(page, 1)
    # typing the adapter preselects the one auth type it accepts (besides "none", unauthenticated)
    await on_screen(page).get_by_label("Adapter", exact=True).fill("mindmap.test_case")
    await expect(on_screen(page).get_by_label("Auth type", exact=True)).to_have_value("mindmap", timeout=WAIT_MS)
    await expect(on_screen(page).get_by_label("Token environment variable", exact=True)).to_be_visible()
    # the adapters offered and their event types are the gateway's (GET /gateway/adapters)
    from temporality_trigger_gateway.adapters import ADAPTERS

    await expect(page.locator("#adapters option")).to_have_count(len(ADAPTERS))
    await expect(page.locator('#adapters option[value="github"]')).to_have_attribute(
        "label", re.compile(r"^GitHub repository webhooks")
    )
    await expect(page.locator("#tw-events-known")).to_have_text(
        "mindmap.test_case sends: test_case.created, test_case.updated"
    )
    await walk_wizard(
        page,
        [
            {
                "Id": "mm",
                "Name": "Test cases from the mind map",
                "Secret environment variable": "MM_SIGNING_SECRET",
                "Token environment variable": "MM_TRIGGER_TOKEN",
            },
            {"Event types": "test_case.created"},
            {"Agent": "reviewer"},
            {"Prompt (first message)": "Write the test case."},
            {},
            {},
        ],
    )
    await save(page, "mm")
    async with httpx.AsyncClient(headers=ADMIN, timeout=20) as client:
        stored = (await client.get(f"{gateway}/triggers/mm")).json()["trigger"]
    assert stored["auth"] == {"type": "mindmap", "secret_env": "MM_SIGNING_SECRET", "token_env": "MM_TRIGGER_TOKEN"}

    # editing only the prompt keeps the auth as it is (both variables)
    await page.goto(f"{served.url}/console/#/wizard/mm")
    await expect_step(page, 1)
    await expect(on_screen(page).get_by_label("Auth type", exact=True)).to_have_value("mindmap", timeout=WAIT_MS)
    await expect(on_screen(page).get_by_label("Token environment variable", exact=True)).to_have_value(
        "MM_TRIGGER_TOKEN"
    )
    await go_to_step(page, 4)
    await on_screen(page).get_by_label("Prompt (first message)", exact=True).fill("Write the test case, briefly.")
    await go_to_step(page, REVIEW)
    await save(page, "mm", "Save changes")
    async with httpx.AsyncClient(headers=ADMIN, timeout=20) as client:
        stored = (await client.get(f"{gateway}/triggers/mm")).json()["trigger"]
    assert stored["prompt"] == "Write the test case, briefly."
    assert stored["auth"] == {"type": "mindmap", "secret_env": "MM_SIGNING_SECRET", "token_env": "MM_TRIGGER_TOKEN"}


async def test_a_long_word_in_the_inbox_wraps_inside_the_card(
    served_journal_with_human: ServedJournal, browser_context: BrowserContext
) -> None:
    served = served_journal_with_human
    asked_at = datetime.now(UTC)
    await served.ask(
        HumanRequested(
            request_id="hreq-long-word",
            run_id="run-long-word",
            agent="reviewer",
            title=LONG_WORD,
            recipient="user:bob",
            question="q" * 340,
            timeout_s=3600,
            expires_at=asked_at + timedelta(hours=1),
            policy=HumanPolicy(allowed_recipients=["user:bob"]),
            turn=1,
        ),
        time=asked_at,
    )
    page = await browser_context.new_page()
    await page.goto(f"{served.url}/console/#/inbox")
    await page.get_by_label("Inbox token").fill("bob-inbox-token")
    await page.keyboard.press("Enter")
    card = page.locator('article.inbox-item[data-request-id="hreq-long-word"]')
    await expect(card.locator(".task")).to_have_text(LONG_WORD + "\N{HORIZONTAL ELLIPSIS}", timeout=WAIT_MS)
    await _fits(page)
    right = await card.evaluate(
        "(c) => [c.getBoundingClientRect().right, c.querySelector('.task').scrollWidth,"
        " c.querySelector('.task').clientWidth]"
    )
    assert right[0] <= 1366
    assert right[1] <= right[2]


def test_the_wizard_reads_the_adapters_from_the_gateway_and_offers_every_auth_type_they_take() -> None:
    """The wizard keeps no list of adapters of its own (it reads GET /gateway/adapters, the gateway's registry:
    test_journal_gateway and the Chromium wizard tests), and its Auth type select (AUTH_TYPES) offers every auth type
    any adapter accepts -- a new auth type in the gateway fails here until the console knows its form."""
    from temporality_trigger_gateway.adapters import ADAPTERS

    source = (Path(temporality_journal.__file__).parent / "console" / "app.js").read_text(encoding="utf-8")
    assert "const ADAPTER_AUTH" not in source
    assert "const ADAPTERS" not in source
    assert 'api("/gateway/adapters"' in source
    block = re.search(r"const AUTH_TYPES = \[(.*?)\];", source, re.DOTALL)
    assert block is not None, "AUTH_TYPES not found in app.js"
    offered = set(re.findall(r'"([a-z_0-9]+)"', block.group(1)))
    assert "none" in offered
    assert set().union(*(adapter.auth_types for adapter in ADAPTERS.values())) <= offered
