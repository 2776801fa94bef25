"""The journal shows people and agents by name: a ``human.answered``'s ``responder_display_name`` (human-interaction's
directory) in ``GET /runs/{id}``'s waiting questions and in the console's run trajectory, the asking agent's
``agent_display_name`` there too -- each falling back to the id for events without them; and the ``output_truncated``
failure reason in words. Over a real nats-server, the journal service on a real port, the real human-interaction
service beside it, and a real headless Chromium."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from journal_support import BOB_INBOX, VIEWER_TOKEN, ServedJournal, eventually
from playwright.async_api import BrowserContext, Page, expect

from temporality_protocol import HumanOption, HumanPolicy, HumanRequested, RunFailed

MakeStory = Callable[..., Any]
Journal = Any  # conftest.Journal
WAIT_MS = 20_000


async def test_the_waiting_questions_name_who_answered_falling_back_to_the_id(
    journal: Journal, story: MakeStory
) -> None:
    alice = story(request_id="hreq-a")  # one turn, three questions at once (HUM-7)
    bob = story(run_id=alice.run_id, request_id="hreq-b")
    carol = story(run_id=alice.run_id, request_id="hreq-c")
    await journal.send(
        alice.requested(),
        alice.started(),
        alice.human_requested(recipient="user:alice", question="Ship v2?"),
        bob.human_requested(recipient="user:bob", question="Keep v1?"),
        carol.human_requested(recipient="user:carol", question="Deploy?"),
        bob.answered(responder="user:bob", channel="web", display_name="Bob Example"),
        carol.answered(responder="user:carol", channel="web"),  # from a human-interaction before the name
    )
    run = await journal.run(alice.run_id)
    shown = {
        q["request_id"]: (q["status"], q["responder"], q["responder_display_name"]) for q in run["waiting"]["requests"]
    }  # type: ignore[index]
    assert shown == {
        "hreq-a": ("pending", None, None),
        "hreq-b": ("answered", "user:bob", "Bob Example"),
        "hreq-c": ("answered", "user:carol", None),
    }


async def _sign_in(context: BrowserContext, served: ServedJournal, hash_: str) -> Page:
    page = await context.new_page()
    await page.goto(f"{served.url}/console/{hash_}")
    await page.get_by_label("API token").fill(VIEWER_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#who")).not_to_have_text("", timeout=WAIT_MS)
    return page


async def _answered_recorded(client: httpx.AsyncClient, run_id: str) -> dict[str, Any] | None:
    events = (await client.get(f"/runs/{run_id}/events")).json()["events"]
    return next((e for e in events if e["type"] == "human.answered"), None)


async def test_the_trajectory_names_the_agent_and_the_responder_human_interaction_named(
    served_journal_with_human: ServedJournal, browser_context: BrowserContext
) -> None:
    """bob answers through the journal's inbox proxy; the real human-interaction binds it and publishes
    ``human.answered`` with the name its directory has for him; the console's trajectory shows it."""
    served = served_journal_with_human
    run_id, request_id = f"run-{uuid.uuid4().hex[:12]}", f"hreq-{uuid.uuid4().hex[:12]}"
    await served.ask(
        HumanRequested(
            request_id=request_id,
            run_id=run_id,
            agent="reviewer",
            agent_display_name="Rita the Reviewer",
            title="Review PR 42",
            recipient="user:bob",
            question="Keep the v1 field?",
            options=[HumanOption(id="keep-v1", label="Keep v1")],
            timeout_s=3600,
            expires_at=datetime.now(UTC) + timedelta(hours=1),
            policy=HumanPolicy(allowed_recipients=["user:bob"]),
            turn=1,
        )
    )
    async with httpx.AsyncClient(base_url=served.url, timeout=20) as client:

        async def _answer() -> bool:
            answer = await client.post(
                f"/human/requests/{request_id}/answer", headers=BOB_INBOX, json={"option_id": "keep-v1"}
            )
            return answer.status_code == 200  # 404 until human-interaction has stored the question

        await eventually(_answer, what="bob's answer to be taken")
        client.headers.update({"Authorization": f"Bearer {VIEWER_TOKEN}"})
        answered = await eventually(lambda: _answered_recorded(client, run_id), what="human.answered recorded")
    assert (answered["data"]["responder"], answered["data"]["responder_display_name"]) == ("user:bob", "Bob Example")

    page = await _sign_in(browser_context, served, f"#/runs/{run_id}")
    timeline = page.locator("#timeline")
    await expect(timeline.locator('li[data-type="human.answered"]')).to_contain_text(
        "Bob Example (bob)", timeout=WAIT_MS
    )
    await expect(timeline.locator('li[data-type="human.requested"]')).to_contain_text("Rita the Reviewer (reviewer)")


async def test_an_older_answer_shows_the_id_and_output_truncated_reads_as_words(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory
) -> None:
    s = story(title="Cut off")
    failed = s._event(RunFailed(run_id=s.run_id, reason="output_truncated", error="the final reply was cut off"), "f")
    for event in (s.requested(), s.started(), s.human_requested(), s.answered(responder="user:alice"), failed):
        await served_journal.bus.publish(event)
    await served_journal.wait_recorded(failed.id)

    page = await _sign_in(browser_context, served_journal, f"#/runs/{s.run_id}")
    timeline = page.locator("#timeline")
    step = timeline.locator('li[data-type="human.answered"]')
    await expect(step).to_contain_text("alice", timeout=WAIT_MS)
    await expect(step).not_to_contain_text("(alice)")  # no name: the id alone, as before
    await expect(timeline.locator('li[data-type="human.requested"]')).not_to_contain_text("By agent")
    label = timeline.locator('li[data-type="run.failed"] .reason')
    await expect(label).to_have_text("the model's reply was cut off at its output limit", timeout=WAIT_MS)
    await expect(label).to_have_attribute("data-reason", "output_truncated")
