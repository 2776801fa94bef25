"""The system on a 3-node JetStream cluster (R3 streams and KV): ``kill -9`` of a node under load loses no
accepted webhook, starts no second run, and every run finishes; the node rejoins and catches up.

The webhook sender behaves like Azure DevOps does: a delivery that was not accepted (a 5xx while the
cluster elects a new leader, a dropped connection) is sent again, unchanged. Every run is parked on a
person and answered through the inbox, so the KV buckets, the timers and the consumers all live through
the failover.
"""

from __future__ import annotations

import asyncio
import collections
import json
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from e2e_support import ALICE, JOURNAL, eventually, example_pr, make_stack, post_hook

from temporality_embedded import LocalCluster, Stack
from temporality_protocol.catalog import ALL_BUCKETS, EVENTS_STREAM

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RUNS = 8


async def _send_until_accepted(http: httpx.AsyncClient, stack: Stack, index: int) -> str:
    """Deliver webhook ``index`` until the gateway accepts it (the sender's retries); its run id."""
    payload = example_pr(id=f"cluster-{index}")
    payload["resource"]["pullRequestId"] = 7000 + index
    last = ""
    for _ in range(120):
        try:
            response = await post_hook(http, stack, payload)
        except httpx.TransportError as exc:
            last = repr(exc)
        else:
            if response.status_code in (200, 202):
                run_id: str = response.json()["run_id"]
                return run_id
            assert response.status_code >= 500, response.text  # only an outage may refuse it
            last = f"{response.status_code} {response.text}"
        await asyncio.sleep(0.25)
    raise AssertionError(f"webhook {index} was never accepted; last: {last}")


async def _answer_until_taken(http: httpx.AsyncClient, human_url: str, question: dict[str, Any]) -> None:
    last = ""
    for _ in range(120):
        try:
            response = await http.post(
                f"{human_url}/requests/{question['id']}/answer",
                json={"option_id": question["options"][0]["id"]},
                headers=ALICE,
            )
        except httpx.TransportError as exc:
            last = repr(exc)
        else:
            if response.status_code in (200, 202):
                return
            assert response.status_code >= 500, response.text
            last = f"{response.status_code} {response.text}"
        await asyncio.sleep(0.25)
    raise AssertionError(f"the answer to {question['id']} was never taken; last: {last}")


async def _events(url: str) -> list[dict[str, Any]]:
    nc = await nats.connect(url.split(","))
    try:
        js = nc.jetstream()
        info = await js.stream_info(EVENTS_STREAM.name)
        return [
            json.loads((await js.get_msg(EVENTS_STREAM.name, seq)).data or b"{}")
            for seq in range(info.state.first_seq, info.state.last_seq + 1)
        ]
    finally:
        await nc.close()


async def _replication(url: str) -> dict[str, Any]:
    """Per stream (KV buckets included): its replica count and whether every follower is current."""
    nc = await nats.connect(url.split(","))
    try:
        js = nc.jetstream()
        names = [EVENTS_STREAM.name, *(f"KV_{bucket.name}" for bucket in ALL_BUCKETS)]
        view: dict[str, Any] = {}
        for name in names:
            info = await js.stream_info(name)
            cluster = info.cluster
            followers = list(cluster.replicas or []) if cluster is not None else []
            view[name] = {
                "replicas": info.config.num_replicas,
                "leader": cluster.leader if cluster is not None else None,
                "current": all(peer.current and not peer.offline for peer in followers) and len(followers) == 2,
            }
        return view
    finally:
        await nc.close()


async def test_a_node_killed_under_load_loses_nothing_and_the_node_rejoins(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "nats")
    await asyncio.to_thread(cluster.start)
    stack = make_stack(
        tmp_path, nats_url=cluster.url, TEMPORALITY_NATS_STREAM_REPLICAS="3", TEMPORALITY_LOG_LEVEL="info"
    )
    try:
        await asyncio.to_thread(stack.start, 180)
        layout = await _replication(cluster.url)
        assert all(entry["replicas"] == 3 for entry in layout.values()), layout
        # the node that leads the journal's stream: losing it is the hardest case
        leader = layout[EVENTS_STREAM.name]["leader"]
        victim = next(i for i, node in enumerate(cluster.nodes) if node.cluster and node.cluster.name == leader)
        survivor_url = ",".join(node.url for i, node in enumerate(cluster.nodes) if i != victim)

        async with httpx.AsyncClient(timeout=30) as http:
            before = await asyncio.gather(*(_send_until_accepted(http, stack, i) for i in range(RUNS // 2)))
            during = [asyncio.create_task(_send_until_accepted(http, stack, i)) for i in range(RUNS // 2, RUNS)]
            await asyncio.to_thread(cluster.kill, victim)  # while the second half is in flight
            run_ids = {*before, *(await asyncio.gather(*during))}
            assert len(run_ids) == RUNS, "every delivery has its own run"

            human = stack.urls("human-interaction")[0]

            async def questions() -> list[dict[str, Any]] | None:
                try:
                    inbox = (await http.get(f"{human}/inbox", headers=ALICE)).json()
                except (httpx.TransportError, ValueError):
                    return None
                mine = [q for q in inbox.get("requests", []) if q["run_id"] in run_ids]
                return mine if len(mine) == RUNS else None

            asked = await eventually(questions, timeout_s=150, what=f"{RUNS} questions in alice's inbox")
            await asyncio.gather(*(_answer_until_taken(http, human, q) for q in asked))

            async def all_completed() -> bool:
                states = []
                for run_id in run_ids:
                    try:
                        run = await http.get(f"{stack.journal_url}/runs/{run_id}", headers=JOURNAL)
                    except httpx.TransportError:
                        return False
                    states.append(run.json().get("state") if run.status_code == 200 else None)
                return all(state == "completed" for state in states)

            await eventually(all_completed, timeout_s=150, what=f"all {RUNS} runs completed on two nodes")

        assert not stack.dead(), stack.dead()
        per_run: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        events = await _events(survivor_url)
        for event in events:
            run_id = event.get("runid") or event.get("data", {}).get("run_id")
            if run_id in run_ids:
                per_run[run_id][event["type"]] += 1
        for run_id in run_ids:
            counts = per_run[run_id]
            for event_type in ("run.requested", "run.started", "human.requested", "human.answered", "run.completed"):
                assert counts[event_type] == 1, (run_id, event_type, dict(counts))
            resumes = collections.Counter(
                e["data"].get("reason")
                for e in events
                if e["type"] == "run.resumed" and (e.get("runid") or e["data"].get("run_id")) == run_id
            )
            # one resume per answer; a failover may redeliver run.requested to a second executor, which then
            # recovers the run (reason "recovery", journaled) without repeating any of its effects
            assert resumes["answer"] == 1, ("one resume per answer", run_id, dict(counts), dict(resumes))

        # the killed node comes back on its ports and store, and every stream is whole on three nodes again
        await asyncio.to_thread(cluster.restart, victim)

        async def whole_again() -> dict[str, Any] | None:
            view = await _replication(cluster.url)
            return view if all(entry["current"] for entry in view.values()) else None

        await eventually(whole_again, timeout_s=60, what="every stream current on all three nodes")
    finally:
        await asyncio.to_thread(stack.stop)
        await asyncio.to_thread(cluster.stop)
