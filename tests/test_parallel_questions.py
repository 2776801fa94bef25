"""HUM-7 across the five service processes: one agent turn asks two people at once.

A scripted agent (deterministic, for tests: the scripted provider's ``calls`` step, several tool calls in
one reply as a model's parallel tool calls) asks alice and bob in the same turn. The run parks once, with
two human requests, each in its own person's web inbox.

* ``wait_for: all`` (the default): bob answers first, then alice; the run stays parked until both are in,
  resumes once, and completes with both answers in its tool results (in call order).
* ``wait_for: first``: bob answers; the run resumes at once, alice's question gets ``not_needed`` as its
  result, and the run withdraws it (``human.cancel_requested``): human-interaction cancels her request --
  her late answer is refused with 409 ``cancelled``, and one ``human.withdrawn``
  (``reason: not_needed``) says so.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import ALICE, CONFIG, HOOK_AUTH, JOURNAL, eventually, example_pr, make_stack

from temporality_embedded import Stack
from temporality_testing.waiting import stays

pytestmark = pytest.mark.e2e

BOB = {"Authorization": "Bearer bob-demo-inbox-token-change-me"}
RESULT = (
    "alice={{ results.ask[0].status }}:{{ results.ask[0].answer.option_id || '-' }} "
    "bob={{ results.ask[1].status }}:{{ results.ask[1].answer.option_id || '-' }}"
)


def _pollster(wait_for: str) -> dict[str, Any]:
    """A scripted agent card (deterministic): two ask_human calls in one reply, then their results."""
    ask: list[dict[str, Any]] = [
        {
            "tool": "ask_human",
            "args": {
                "recipient": "user:alice",
                "question": "Alice: may PR #42 ship as a breaking v2?",
                "options": [{"id": "ship", "label": "Ship v2"}, {"id": "hold", "label": "Hold"}],
                "wait_for": wait_for,
            },
        },
        {
            "tool": "ask_human",
            "args": {
                "recipient": "user:bob",
                "question": "Bob: must v1 clients keep working?",
                "options": [{"id": "keep", "label": "Keep v1"}, {"id": "drop", "label": "Drop v1"}],
                "wait_for": wait_for,
            },
        },
    ]
    return {
        "id": f"pollster-{wait_for}",
        "role": "Asks two people at once",
        "description": "The scripted agent of tests/test_parallel_questions.py",
        "system_prompt": "Ask alice and bob together, then report both answers.",
        "tools": {"allow": ["ask_human"]},
        "provider": {
            "kind": "scripted",
            "script": {
                "steps": [
                    {"id": "ask", "say": "Two questions at once.", "calls": ask},
                    {"id": "done", "answer": RESULT},
                ]
            },
        },
        "limits": {"max_turns": 5, "max_compute_s": 120},
    }


@pytest.fixture(scope="module")
def polling_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack for both policies: a pollster agent and a webhook trigger (``pollster-<wait_for>``) each."""
    root = tmp_path_factory.mktemp("parallel-questions")
    config = root / "config"
    shutil.copytree(CONFIG, config)
    agents = yaml.safe_load((config / "agents.yaml").read_text())
    agents["agents"] += [_pollster("all"), _pollster("first")]
    (config / "agents.yaml").write_text(yaml.safe_dump(agents))
    triggers = yaml.safe_load((config / "triggers.yaml").read_text())
    shipped = triggers["triggers"][0]
    # nobody's answer is forced by a timeout default here (the shipped default names the reviewer's option)
    shipped["human"] |= {"allowed_recipients": ["user:alice", "user:bob"], "on_timeout": {"action": "fail"}}
    triggers["triggers"] = [
        {**copy.deepcopy(shipped), "id": f"pollster-{wait_for}", "agent": f"pollster-{wait_for}"}
        for wait_for in ("all", "first")
    ]
    (config / "triggers.yaml").write_text(yaml.safe_dump(triggers))
    stack = make_stack(root, config_dir=config)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


async def _inbox_request(http: httpx.AsyncClient, stack: Stack, person: dict[str, str], run_id: str) -> str:
    """The person's pending request of the run, once human-interaction has stored it."""

    async def probe() -> str | None:
        response = await http.get(f"{stack.human_url}/inbox", headers=person)
        assert response.status_code == 200, response.text
        mine = [r for r in response.json()["requests"] if r["run_id"] == run_id]
        return str(mine[0]["id"]) if mine else None

    return await eventually(probe, what=f"the inbox of {person['Authorization']} to show the run's question")


async def _journal_run(http: httpx.AsyncClient, stack: Stack, run_id: str) -> dict[str, Any] | None:
    response = await http.get(f"{stack.journal_url}/runs/{run_id}", headers=JOURNAL)
    return response.json() if response.status_code == 200 else None


async def _events(http: httpx.AsyncClient, stack: Stack, run_id: str) -> list[dict[str, Any]]:
    response = await http.get(f"{stack.journal_url}/runs/{run_id}/events", headers=JOURNAL)
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["events"]
    return events


async def _count_withdrawn(http: httpx.AsyncClient, stack: Stack, run_id: str, expected: int) -> bool:
    events = await _events(http, stack, run_id)
    return sum(e["type"] == "human.withdrawn" for e in events) == expected


async def _answer(http: httpx.AsyncClient, stack: Stack, person: dict[str, str], request_id: str, option: str) -> None:
    response = await http.post(
        f"{stack.human_url}/requests/{request_id}/answer", json={"option_id": option}, headers=person
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("wait_for", ["all", "first"])
async def test_two_questions_in_one_turn_answered_in_reverse_order(
    polling_stack: Stack, http: httpx.AsyncClient, wait_for: str
) -> None:
    stack = polling_stack
    accepted = await http.post(
        f"{stack.gateway_url}/hooks/pollster-{wait_for}",
        content=json.dumps(example_pr()).encode(),
        headers={"Authorization": HOOK_AUTH, "Content-Type": "application/json"},
    )
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]
    alice_request = await _inbox_request(http, stack, ALICE, run_id)
    bob_request = await _inbox_request(http, stack, BOB, run_id)
    assert alice_request != bob_request

    async def waiting_on_both() -> dict[str, Any] | None:
        run = await _journal_run(http, stack, run_id)
        waiting = run["waiting"] if run and run["state"] == "waiting_for_human" else None
        return waiting if waiting and waiting["request_id"] is None else None

    waiting = await eventually(waiting_on_both, what="the journal to show the run waiting on both questions")
    assert waiting["recipient"] == "user:alice, user:bob"

    # bob answers first
    await _answer(http, stack, BOB, bob_request, "keep")

    async def bob_answered_in_journal() -> list[dict[str, Any]] | None:
        events = await _events(http, stack, run_id)
        return events if any(e["type"] == "human.answered" for e in events) else None

    await eventually(bob_answered_in_journal, what="the journal to record bob's answer")
    if wait_for == "all":

        async def still_waiting() -> bool:
            run = await _journal_run(http, stack, run_id)
            return run is not None and run["state"] == "waiting_for_human"

        await stays(still_waiting, settle_s=1.5, what="the run waiting for alice after bob answered")
        await _answer(http, stack, ALICE, alice_request, "ship")

    async def completed() -> dict[str, Any] | None:
        run = await _journal_run(http, stack, run_id)
        return run if run and run["state"] == "completed" else None

    done = await eventually(completed, what=f"run {run_id} completed")
    assert done["waiting"] is None
    needed = {"run.resumed", "run.completed"} | ({"human.cancel_requested"} if wait_for == "first" else set())

    async def recorded() -> list[dict[str, Any]] | None:  # the journal may record a redelivered event later
        events = await _events(http, stack, run_id)
        types = [e["type"] for e in events]
        return events if needed <= set(types) and types.count("human.requested") == 2 else None

    events = await eventually(recorded, what=f"the journal to record {sorted(needed)} of run {run_id}")
    types = [e["type"] for e in events]
    assert types.count("human.requested") == 2
    assert types.count("run.resumed") == 1
    assert types.count("run.completed") == 1
    answered = [e["data"]["request_id"] for e in events if e["type"] == "human.answered"]
    if wait_for == "all":
        assert done["result"] == "alice=answered:ship bob=answered:keep"
        assert answered == [bob_request, alice_request]
        last_answer = max(i for i, t in enumerate(types) if t == "human.answered")
        assert types.index("run.resumed") > last_answer  # resumed once both were in
        assert "human.withdrawn" not in types  # both answered: nothing to withdraw
    else:
        assert done["result"] == "alice=not_needed:- bob=answered:keep"
        assert answered == [bob_request]
        (withdrawal,) = [e["data"] for e in events if e["type"] == "human.cancel_requested"]
        assert (withdrawal["request_ids"], withdrawal["answered"]) == ([alice_request], bob_request)
        assert types.index("human.cancel_requested") < types.index("run.resumed")

        # alice's question is cancelled (the withdrawal, or the run's end: whichever human-interaction reads
        # first), and her late answer refused
        async def cancelled() -> bool:
            response = await http.get(f"{stack.human_url}/requests/{alice_request}", headers=ALICE)
            return response.status_code == 200 and response.json()["status"] == "cancelled"

        await eventually(cancelled, what="alice's request cancelled")
        late = await http.post(
            f"{stack.human_url}/requests/{alice_request}/answer", json={"option_id": "ship"}, headers=ALICE
        )
        assert late.status_code == 409, late.text

        # ... and announced once as withdrawn because the run no longer needed it (docs/human-interaction.md,
        # "A withdrawn question says so"); bob's answered question is not withdrawn
        async def withdrawn() -> list[dict[str, Any]] | None:
            found = [e["data"] for e in await _events(http, stack, run_id) if e["type"] == "human.withdrawn"]
            return found or None

        await eventually(withdrawn, what=f"the journal to record alice's question of run {run_id} withdrawn")
        await stays(  # exactly one: a redelivered cancel or the run's end announces nothing more
            lambda: _count_withdrawn(http, stack, run_id, 1), settle_s=1.5, what="one human.withdrawn only"
        )
        (announced,) = [e["data"] for e in await _events(http, stack, run_id) if e["type"] == "human.withdrawn"]
        assert (announced["request_id"], announced["recipient"]) == (alice_request, "user:alice")
        # not_needed when human-interaction handles the run's human.cancel_requested first; the run completes one
        # scripted turn later, and a loaded machine may let the run's end cancel it first (run_completed): either
        # way one event, for alice's question, and never another reason
        assert announced["reason"] in ("not_needed", "run_completed"), announced
        assert announced["run_reason"] is None
    # each answer is bound to its own request (the result above: each call read its own tool result, by position)
    for person, request_id, option in ((BOB, bob_request, "keep"), (ALICE, alice_request, "ship")):
        if wait_for == "first" and request_id == alice_request:
            continue
        view = (await http.get(f"{stack.human_url}/requests/{request_id}", headers=person)).json()
        assert (view["status"], view["answer"]["option_id"]) == ("answered", option)
