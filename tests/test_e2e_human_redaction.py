"""SEC-1 across the processes: a secret in what the agent asks a person never reaches the bus or the journal.

The whole stack as processes, one redaction setting for all of them (``TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS``
adds a deployment's own kind). A pull request whose title holds a GitHub token and a ticket secret starts the
scripted reviewer, which quotes the title in its question: the ``human.requested`` the run-executor
publishes carries ``[REDACTED:…]`` markers instead, in the stream and in the journal, and so does everything
human-interaction shows and journals after it. The run's own input (the source's data, which the agent
needs) still has them: checked too, so the test proves the secrets really went in.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from e2e_support import ALICE, JOURNAL, eventually, example_pr, make_stack, post_hook

from temporality_embedded import Stack
from temporality_protocol.catalog import EVENTS_STREAM, subject_for

GITHUB = "ghp_" + "Lm3Nb4Vc5Xz6As7Df8Gh" * 2
TICKET = "TKT-fedcba9876543210"
SECRETS = (GITHUB, "fedcba9876543210")


@pytest.fixture
def redacting_stack(tmp_path: Path) -> Iterator[Stack]:
    stack = make_stack(
        tmp_path, TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS='{"ticket_secret": "TKT-(?P<secret>[0-9a-f]{16})"}'
    )
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def _leaks(blob: Any) -> list[str]:
    text = blob if isinstance(blob, str) else json.dumps(blob)
    return [s for s in SECRETS if s in text]


async def _on_the_stream(stack: Stack, event_type: str) -> list[dict[str, Any]]:
    """Every ``event_type`` event as the stream holds it (the bus copy, before any consumer)."""
    nc = await nats.connect(stack.nats.url)
    try:
        js = nc.jetstream()
        subject = subject_for(event_type)
        info = await js.stream_info(EVENTS_STREAM.name, subjects_filter=subject)
        held = int(sum((info.state.subjects or {}).values()))
        sub = await js.pull_subscribe(subject, stream=EVENTS_STREAM.name)
        found: list[dict[str, Any]] = []
        while len(found) < held:
            found += [json.loads(m.data) for m in await sub.fetch(held - len(found), timeout=5)]
        return found
    finally:
        await nc.close()


async def test_a_secret_in_the_question_is_redacted_before_it_reaches_the_bus(
    redacting_stack: Stack, http: httpx.AsyncClient
) -> None:
    stack = redacting_stack
    pr = example_pr()
    pr["resource"]["title"] = f"Rotate the API token {GITHUB} and ticket {TICKET}"
    accepted = await post_hook(http, stack, pr)
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]

    async def notified_events() -> list[dict[str, Any]] | None:
        response = await http.get(f"{stack.journal_url}/runs/{run_id}/events", headers=JOURNAL)
        events: list[dict[str, Any]] = response.json()["events"] if response.status_code == 200 else []
        return events if any(e["type"] == "human.notified" for e in events) else None

    journal = await eventually(notified_events, what="the journal to record human.notified")
    [journaled] = [e for e in journal if e["type"] == "human.requested"]
    [on_bus] = [e for e in await _on_the_stream(stack, "human.requested") if e["data"]["run_id"] == run_id]
    for copy in (journaled["data"], on_bus["data"]):
        assert _leaks(copy) == []
        assert "[REDACTED:github_token]" in copy["question"]
        assert "TKT-[REDACTED:ticket_secret]" in copy["question"]
        assert "[REDACTED:github_token]" in copy["title"]

    # what human-interaction shows and journals after it holds none either, and counts what was redacted
    inbox = (await http.get(f"{stack.human_url}/inbox", headers=ALICE)).json()["requests"]
    [request] = [r for r in inbox if r["run_id"] == run_id]
    assert _leaks(request) == []
    [notified] = [e for e in journal if e["type"] == "human.notified"]
    assert notified["data"]["redacted"]["github_token"] >= 1
    assert notified["data"]["redacted"]["ticket_secret"] >= 1

    # control: the secrets did go in -- the run's own input (the source's data) carries them
    [run_requested] = [e for e in journal if e["type"] == "run.requested"]
    assert _leaks(run_requested["data"]) == list(SECRETS)
