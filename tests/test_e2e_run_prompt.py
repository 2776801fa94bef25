"""RUN-1 across the processes: a webhook-started run exposes which system prompt and sandbox it ran with.

The five services as processes (the shipped config, a real embedded nats-server, real HTTP): the journal's
``GET /runs/{id}`` shows the run's ``agent_card`` with the SHA-256 of the prompt the run was given and its sandbox;
the run-executor's admin-only ``GET /agents/{id}/prompt`` answers the prompt with the same digest (so the digest
says which prompt the run ran with), and refuses a viewer or an operator (403). Every wait has a timeout."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import API_TOKENS, JOURNAL, eventually, example_pr, make_stack, post_hook

from temporality_embedded import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
VIEWER, OPERATOR, ADMIN = ({"Authorization": f"Bearer {t.token.get_secret_value()}"} for t in API_TOKENS)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = make_stack(tmp_path)
    s.start()
    try:
        yield s
    finally:
        s.stop()


async def test_a_run_names_its_prompt_by_the_digest_an_admin_reads_with_the_prompt(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    accepted = await post_hook(http, stack, example_pr(id=str(uuid.uuid4())))
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]

    async def started() -> dict[str, Any] | None:
        answer = await http.get(f"{stack.journal_url}/runs/{run_id}", headers=JOURNAL)
        card = answer.json().get("agent_card") if answer.status_code == 200 else None
        return card if card and card.get("system_prompt_sha256") else None

    card = await eventually(started, timeout_s=90, what="the run's agent card in the journal")
    assert card["sandbox"] == {"kind": "process", "network": True, "working_dir_set": False}
    assert card["provider"] == "scripted"

    executor = stack.executor_url
    assert executor is not None
    agent = (await http.get(f"{stack.journal_url}/runs/{run_id}", headers=JOURNAL)).json()["agent"]
    for who in (VIEWER, OPERATOR):
        refused = await http.get(f"{executor}/agents/{agent}/prompt", headers=who)
        assert refused.status_code == 403, refused.text
        assert "system_prompt" not in refused.text
    prompt = await http.get(f"{executor}/agents/{agent}/prompt", headers=ADMIN)
    assert prompt.status_code == 200, prompt.text
    body = prompt.json()
    assert body["sha256"] == card["system_prompt_sha256"]  # the prompt this run ran with
    assert body["instructions"].startswith(body["system_prompt"].strip())
    assert [s["name"] for s in body["skills"]] == card["skills"]
    # the viewer's card view names the same digest, never the prompt
    view = await http.get(f"{executor}/agents/{agent}", headers=VIEWER)
    assert view.json()["system_prompt_sha256"] == card["system_prompt_sha256"]
    assert body["system_prompt"].strip() not in view.text
