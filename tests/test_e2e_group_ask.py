"""docs/human-interaction.md#groups-as-recipients end to end: the agent asks a group, one member answers.

The whole stack as processes with the shipped config, except that the webhook trigger allows
``group:api-owners`` (alice and bob) instead of alice: the scripted reviewer asks its first allowed
recipient, so it calls ``ask_human(recipient="group:api-owners")``. human-interaction asks each member (both
reach only the web inbox here), bob answers from his inbox, and the run resumes with his answer and completes.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import ALICE, CONFIG, JOURNAL, eventually, example_pr, make_stack, post_hook

from temporality_embedded import Stack

BOB = {"Authorization": "Bearer bob-demo-inbox-token-change-me"}


@pytest.fixture
def group_stack(tmp_path: Path) -> Iterator[Stack]:
    config = tmp_path / "config"
    shutil.copytree(CONFIG, config)
    triggers = config / "triggers.yaml"
    text = triggers.read_text(encoding="utf-8")
    assert text.count("allowed_recipients: [user:alice]") == 1
    triggers.write_text(
        text.replace("allowed_recipients: [user:alice]", "allowed_recipients: [group:api-owners]"), encoding="utf-8"
    )
    stack = make_stack(tmp_path, config_dir=config)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


async def _pending(http: httpx.AsyncClient, stack: Stack, who: dict[str, str], run_id: str) -> list[dict[str, Any]]:
    response = await http.get(f"{stack.human_url}/inbox", headers=who)
    assert response.status_code == 200, response.text
    return [r for r in response.json()["requests"] if r["run_id"] == run_id]


async def _run(http: httpx.AsyncClient, stack: Stack, run_id: str) -> dict[str, Any] | None:
    response = await http.get(f"{stack.journal_url}/runs/{run_id}", headers=JOURNAL)
    return response.json() if response.status_code == 200 else None


async def test_an_agent_asks_a_group_and_the_run_resumes_with_one_members_answer(
    group_stack: Stack, http: httpx.AsyncClient
) -> None:
    stack = group_stack
    accepted = await post_hook(http, stack, example_pr())
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]

    # every member is asked: the question is in alice's and in bob's inbox
    (for_bob,) = await eventually(lambda: _pending(http, stack, BOB, run_id), what="bob's inbox to show the request")
    (for_alice,) = await eventually(
        lambda: _pending(http, stack, ALICE, run_id), what="alice's inbox to show the request"
    )
    assert for_bob["id"] == for_alice["id"]
    assert [o["id"] for o in for_bob["options"]] == ["keep-v1", "ship-v2"]

    async def waiting() -> dict[str, Any] | None:
        run = await _run(http, stack, run_id)
        return run if run and run["state"] == "waiting_for_human" else None

    assert (await eventually(waiting, what="the run waiting for the group"))["waiting"]["recipient"] == (
        "group:api-owners"
    )

    # bob answers; the first valid answer of a member wins
    answered = await http.post(
        f"{stack.human_url}/requests/{for_bob['id']}/answer", json={"option_id": "ship-v2"}, headers=BOB
    )
    assert answered.status_code == 200, answered.text

    async def completed() -> dict[str, Any] | None:
        run = await _run(http, stack, run_id)
        return run if run and run["state"] == "completed" else None

    done = await eventually(completed, what=f"run {run_id} completed")
    assert "Ship it as a breaking v2 [ship-v2]" in done["result"]
    assert "Decision (user:bob)" in done["result"]

    # alice's later answer is refused: the run resumed once, with bob's
    late = await http.post(
        f"{stack.human_url}/requests/{for_alice['id']}/answer", json={"option_id": "keep-v1"}, headers=ALICE
    )
    assert late.status_code == 409, late.text
    events = (await http.get(f"{stack.journal_url}/runs/{run_id}/events", headers=JOURNAL)).json()["events"]
    (asked,) = [e for e in events if e["type"] == "human.requested"]
    assert asked["data"]["recipient"] == "group:api-owners"
    (answer,) = [e for e in events if e["type"] == "human.answered"]
    assert (answer["data"]["recipient"], answer["data"]["responder"]) == ("group:api-owners", "user:bob")
    assert [e["data"]["reason"] for e in events if e["type"] == "run.resumed"] == ["answer"]
