"""Two replicas of every stateless service, sharing their durable consumers, under concurrent and duplicated
traffic: one run per event, one question per run, one delivery per question, one resume per answer."""

from __future__ import annotations

import asyncio
import collections
import json
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from e2e_support import ALICE, HOOK_AUTH, JOURNAL, eventually, example_pr, make_stack

from temporality_embedded import Stack
from temporality_protocol.catalog import EVENTS_STREAM

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RUNS = 12
TWO = {"trigger-gateway": 2, "run-executor": 2, "human-interaction": 2, "agent-collab": 2}


async def _event_types(stack: Stack) -> list[dict[str, Any]]:
    """Every event of the stream (type, run id, data), read straight from JetStream."""
    nc = await nats.connect(stack.nats.url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(EVENTS_STREAM.name)
        events = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(EVENTS_STREAM.name, seq)
            events.append(json.loads(msg.data or b"{}"))
        return events
    finally:
        await nc.close()


async def test_two_replicas_of_each_service_give_one_effect_per_cause(tmp_path: Path) -> None:
    stack = make_stack(tmp_path, replicas=TWO, TEMPORALITY_LOG_LEVEL="info")
    await asyncio.to_thread(stack.start, 180)
    try:
        gateways, humans = stack.urls("trigger-gateway"), stack.urls("human-interaction")
        assert len(gateways) == len(humans) == 2
        async with httpx.AsyncClient(timeout=30) as http:
            # every event delivered twice at once, once through each gateway replica
            async def deliver(i: int, gateway: str) -> httpx.Response:
                payload = example_pr(id=f"replicas-{i}")
                payload["resource"]["pullRequestId"] = 5000 + i
                return await http.post(
                    f"{gateway}/hooks/ado-pr-review",
                    content=json.dumps(payload).encode(),
                    headers={"Authorization": HOOK_AUTH, "Content-Type": "application/json"},
                )

            answers = await asyncio.gather(*(deliver(i, g) for i in range(RUNS) for g in gateways))
            assert all(r.status_code in (200, 202) for r in answers), [r.text for r in answers]
            by_event: dict[int, set[str]] = collections.defaultdict(set)
            for index, response in enumerate(answers):
                by_event[index // 2].add(response.json()["run_id"])
            assert all(len(ids) == 1 for ids in by_event.values()), "a duplicated delivery started a second run"
            run_ids = {ids.pop() for ids in by_event.values()}
            assert len(run_ids) == RUNS

            async def questions() -> list[dict[str, Any]] | None:
                inbox = (await http.get(f"{humans[0]}/inbox", headers=ALICE)).json()
                mine = [q for q in inbox["requests"] if q["run_id"] in run_ids]
                return mine if len(mine) == RUNS else None

            asked = await eventually(questions, timeout_s=150, what=f"{RUNS} questions in alice's inbox")
            assert len({q["run_id"] for q in asked}) == RUNS, "one question per run"

            # every answer sent twice at once, once through each human-interaction replica
            async def answer(question: dict[str, Any], human: str) -> httpx.Response:
                return await http.post(
                    f"{human}/requests/{question['id']}/answer",
                    json={"option_id": question["options"][0]["id"]},
                    headers=ALICE,
                )

            replies = await asyncio.gather(*(answer(q, h) for q in asked for h in humans))
            assert all(r.status_code in (200, 202, 409) for r in replies), [r.text for r in replies]
            assert sum(r.status_code in (200, 202) for r in replies) >= RUNS

            async def all_completed() -> bool:
                states = []
                for run_id in run_ids:
                    run = await http.get(f"{stack.journal_url}/runs/{run_id}", headers=JOURNAL)
                    states.append(run.json().get("state") if run.status_code == 200 else None)
                return all(state == "completed" for state in states)

            await eventually(all_completed, timeout_s=150, what=f"all {RUNS} runs completed")

        assert not stack.dead(), stack.dead()
        per_run: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for event in await _event_types(stack):
            run_id = event.get("runid") or event.get("data", {}).get("run_id")
            if run_id in run_ids:
                per_run[run_id][event["type"]] += 1
        for run_id in run_ids:
            counts = per_run[run_id]
            for event_type in ("run.requested", "run.started", "human.requested", "human.answered", "run.completed"):
                assert counts[event_type] == 1, (run_id, event_type, dict(counts))
            assert counts["human.notified"] == 1, ("one delivery per question", run_id, dict(counts))
            assert counts["run.resumed"] == 1, ("one resume per answer", run_id, dict(counts))
    finally:
        await asyncio.to_thread(stack.stop)
