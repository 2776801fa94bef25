"""RUN-1 in the journal: ``GET /runs/{run_id}`` answers what the run was started with -- its ``run.started``'s agent
card, the SHA-256 of the system prompt it was given and its sandbox among it -- and the console's run page shows the
digest (short) and the sandbox in its header and its "Run started" step. The journal as the service runs it, fed
through a real nats-server, over real HTTP; the page in a real headless Chromium. Every wait has a timeout."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from journal_support import VIEWER, ServedJournal, console_screenshot, eventually, publish_recorded, viewer_page
from playwright.async_api import BrowserContext, expect

from temporality_protocol import AgentSummary, SandboxSummary

MakeStory = Callable[..., Any]  # journal_support.RunStory
WAIT_MS = 20_000
pytestmark = pytest.mark.timeout(180)

DIGEST = hashlib.sha256(b"You review pull requests.\n\n## Skill: contracts\nAsk before breaking.").hexdigest()
CARD = AgentSummary(
    provider="scripted",
    skills=["contracts"],
    tools=["get_input", "ask_human"],
    mcp_servers=["notes"],
    max_turns=20,
    max_compute_s=900.0,
    system_prompt_sha256=DIGEST,
    sandbox=SandboxSummary(kind="process", network=False, working_dir_set=True),
)


async def _run(client: httpx.AsyncClient, run_id: str, started: bool = True) -> dict[str, Any]:
    """The run once the journal shows it running (its run.started projected)."""

    async def probe() -> dict[str, Any] | None:
        answer = await client.get(f"/runs/{run_id}", headers=VIEWER)
        body: dict[str, Any] = answer.json()
        return body if answer.status_code == 200 and (body["state"] == "running") == started else None

    return await eventually(probe, timeout_s=30, what=f"run {run_id} in the journal")


async def test_a_run_s_detail_names_its_prompt_by_digest_and_its_sandbox(
    served_journal: ServedJournal, story: MakeStory
) -> None:
    with_card, older, unstarted = story(), story(title="An older executor's run"), story(title="Not started")
    await publish_recorded(
        served_journal,
        with_card.requested(),
        with_card.started(card=CARD),
        older.requested(),
        older.started(),  # an executor before RUN-1's agent card: no card at all
        unstarted.requested(),
    )
    async with httpx.AsyncClient(base_url=served_journal.url, timeout=10) as client:
        run = await _run(client, with_card.run_id)
        assert run["agent_card"] == CARD.model_dump(mode="json")
        assert run["agent_card"]["system_prompt_sha256"] == DIGEST
        assert run["agent_card"]["sandbox"] == {"kind": "process", "network": False, "working_dir_set": True}
        assert (await _run(client, older.run_id))["agent_card"] is None
        assert (await _run(client, unstarted.run_id, started=False))["agent_card"] is None

        # a card without the newer fields (an executor before the digest and the sandbox) reads as before
        plain = story(title="Card without digest")
        bare = CARD.model_copy(update={"system_prompt_sha256": None, "sandbox": None})
        await publish_recorded(served_journal, plain.requested(), plain.started(card=bare))
        shown = (await _run(client, plain.run_id))["agent_card"]
        assert shown["provider"] == "scripted"
        assert (shown["system_prompt_sha256"], shown["sandbox"]) == (None, None)

        # lists stay lean: the card is in the run's own view only
        listed = await client.get("/runs", headers=VIEWER)
        assert listed.status_code == 200
        assert {r["run_id"]: r["agent_card"] for r in listed.json()["runs"]}[with_card.run_id] is None
        assert (await client.get(f"/runs/{with_card.run_id}")).status_code == 401


async def test_the_run_page_shows_the_prompt_digest_short_and_the_sandbox(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory
) -> None:
    s = story(title="Review PR 9")
    await publish_recorded(served_journal, s.requested(), s.started(card=CARD))
    page = await viewer_page(browser_context, served_journal, f"#/runs/{s.run_id}")
    prompt = page.locator("#run-prompt")
    await expect(prompt).to_have_text(f"sha256:{DIGEST[:12]}", timeout=WAIT_MS)
    await expect(prompt).to_have_attribute("title", f"sha256:{DIGEST}")
    await expect(page.locator("#run-sandbox")).to_have_text("process · network off · own working directory")
    started = page.locator('#timeline > li[data-type="run.started"]')
    await expect(started).to_contain_text(f"sha256:{DIGEST[:12]}", timeout=WAIT_MS)
    await expect(started).to_contain_text("process · network off · own working directory")
    await expect(started).to_contain_text("notes")
    await console_screenshot(page, "run-agent-card")

    # a run whose run.started has no card: no Prompt nor Sandbox line, the rest as before
    older = story(title="Older executor")
    await publish_recorded(served_journal, older.requested(), older.started())
    await page.goto(f"{served_journal.url}/console/#/runs/{older.run_id}")
    await expect(page.locator("#run-header")).to_contain_text("Older executor", timeout=WAIT_MS)
    await expect(page.locator('#timeline > li[data-type="run.started"]')).to_have_count(1, timeout=WAIT_MS)
    await expect(page.locator("#run-prompt")).to_have_count(0)
    await expect(page.locator("#run-sandbox")).to_have_count(0)
