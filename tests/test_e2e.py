"""E2E-1 across five separate service processes and a real nats-server (steps 1-17, REQUIREMENTS.md).

Each test starts the embedded stack (nats-server from the wheel, SQLite journal, the five services as
their own OS processes, the project's shipped config) and speaks to it only over HTTP and NATS.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import nats
import nats.errors
import pytest
import yaml
from e2e_support import ALICE, CONFIG, eventually, example_pr, make_stack, post_hook

from temporality_embedded import Stack
from temporality_protocol import CollaboratorsQuery, CollaboratorsReply
from temporality_protocol.catalog import CONSUMERS, EVENTS_STREAM, RPC_GET_COLLABORATORS
from temporality_testing.events import EventLog
from temporality_testing.postgres import fresh_postgres_database

pytestmark = pytest.mark.e2e

E2E_TRAJECTORY = [
    "trigger.received",
    "trigger.accepted",
    "run.requested",
    "run.created",
    "run.started",
    "run.tool_called",
    "run.checkpointed",
    "human.requested",
    "human.notified",
    "human.answered",
    "run.resumed",
    "run.completed",
]


async def _run(http: httpx.AsyncClient, stack: Stack, run_id: str) -> dict[str, Any] | None:
    response = await http.get(f"{stack.journal_url}/runs/{run_id}")
    return response.json() if response.status_code == 200 else None


async def _run_in_state(http: httpx.AsyncClient, stack: Stack, run_id: str, state: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        run = await _run(http, stack, run_id)
        return run if run and run["state"] == state else None

    return await eventually(probe, what=f"run {run_id} in state {state} in the journal")


async def _pending(http: httpx.AsyncClient, stack: Stack) -> list[dict[str, Any]]:
    response = await http.get(f"{stack.human_url}/inbox", headers=ALICE)
    assert response.status_code == 200, response.text
    requests: list[dict[str, Any]] = response.json()["requests"]
    return requests


async def _the_pending_request(http: httpx.AsyncClient, stack: Stack) -> dict[str, Any]:
    """alice's one pending request, once human-interaction has stored it.

    human-interaction consumes ``human.requested`` on its own: the journal showing the run waiting says
    nothing about whether the inbox has caught up yet.
    """
    (request,) = await eventually(lambda: _pending(http, stack), what="alice's inbox to show the request")
    return request


async def _journal_caught_up(stack: Stack) -> None:
    """Wait until the journal process has recorded every event the stream held when called.

    The journal records one event at a time but a transient failure is redelivered later, so a run's
    final state in the journal does not mean every earlier event of it is recorded; this does. Also the
    settle step before counting events ("still one run.completed").
    """
    nc = await nats.connect(stack.nats.url)
    try:
        js = nc.jetstream()
        last = (await js.stream_info(EVENTS_STREAM.name)).state.last_seq

        async def recorded() -> bool:
            info = await js.consumer_info(EVENTS_STREAM.name, CONSUMERS["journal"].durable)
            return bool(info.ack_floor.stream_seq >= last and info.num_ack_pending == 0)

        await eventually(recorded, what=f"the journal to record the stream up to seq {last}")
    finally:
        await nc.drain()


async def _settled_trajectory(http: httpx.AsyncClient, stack: Stack, run_id: str) -> list[dict[str, Any]]:
    """The run's trajectory once the journal has recorded everything published so far."""
    await _journal_caught_up(stack)
    return await _trajectory(http, stack, run_id)


async def _collaborators(stack: Stack, run_id: str, ready: Any) -> CollaboratorsReply:
    """agent-collab's get_collaborators reply once ``ready(reply)`` holds (its projection catches up on its own)."""
    nc = await nats.connect(stack.nats.url)
    try:

        async def probe() -> CollaboratorsReply | None:
            query = CollaboratorsQuery(run_id=run_id).model_dump_json().encode()
            try:
                raw = await nc.request(RPC_GET_COLLABORATORS, query, 10)
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                return None
            reply = CollaboratorsReply.model_validate_json(raw.data)
            return reply if ready(reply) else None

        reply: CollaboratorsReply = await eventually(probe, what=f"agent-collab's view of {run_id}")
        return reply
    finally:
        await nc.drain()


async def _trajectory(http: httpx.AsyncClient, stack: Stack, run_id: str) -> list[dict[str, Any]]:
    response = await http.get(f"{stack.journal_url}/runs/{run_id}/events")
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["events"]
    return events


async def test_e2e_1_webhook_to_completed_review_with_a_human_answer(stack: Stack, http: httpx.AsyncClient) -> None:
    # 1-3: Azure DevOps sends the PR-created webhook; Temporality accepts it durably
    accepted = await post_hook(http, stack, example_pr())
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]

    # 4-10: a Reviewer run is created, analyses, asks; the run waits for the human. The journal shows it
    # waiting on human.requested, and on which channel only once human.notified is recorded after it.
    async def waiting_on_a_channel() -> dict[str, Any] | None:
        run = await _run(http, stack, run_id)
        return run if run and run["state"] == "waiting_for_human" and run["waiting"]["channel"] else None

    run = await eventually(waiting_on_a_channel, what=f"run {run_id} waiting with its channel in the journal")
    assert run["agent"] == "reviewer"
    assert run["trigger_id"] == "ado-pr-review"
    waiting = run["waiting"]
    assert waiting["recipient"] == "user:alice"
    assert waiting["channel"] == "web"  # alice prefers Matrix; no adapter yet -> the fallback (HUM-2)
    assert waiting["since"]
    assert "PR #42" in waiting["question"]

    # 8-9: the question reached alice's preferred available channel, compact and self-contained
    inbox = await eventually(lambda: _pending(http, stack), what="alice's inbox to show the request")
    assert len(inbox) == 1
    request = inbox[0]
    assert request["run_id"] == run_id
    assert [o["id"] for o in request["options"]] == ["keep-v1", "ship-v2"]
    assert "Missing:" in request["context"]
    assert request["id"] == waiting["request_id"]

    # 11-12: alice answers; the answer binds to that exact request
    answered = await http.post(
        f"{stack.human_url}/requests/{request['id']}/answer", json={"option_id": "keep-v1"}, headers=ALICE
    )
    assert answered.status_code == 200, answered.text
    assert answered.json()["status"] == "answered"

    # 13-15: the run resumes by itself, the agent gets the answer as the ask_human result, finishes
    done = await _run_in_state(http, stack, run_id, "completed")
    assert "Keep the v1 contract [keep-v1]" in done["result"]
    assert "Decision (user:alice)" in done["result"]

    # 16: the whole trajectory, waiting included, is in the journal in order
    events = await _settled_trajectory(http, stack, run_id)
    types = [e["type"] for e in events]
    positions = [types.index(t) for t in E2E_TRAJECTORY]
    assert positions == sorted(positions), types
    human_requested = next(e for e in events if e["type"] == "human.requested")
    answered_event = next(e for e in events if e["type"] == "human.answered")
    resumed = next(e for e in events if e["type"] == "run.resumed")
    assert answered_event["data"]["request_id"] == human_requested["data"]["request_id"] == request["id"]
    assert answered_event["data"]["responder"] == "user:alice"
    assert resumed["data"]["reason"] == "answer"
    assert resumed["data"]["waited_s"] >= 0

    # a second answer is refused and never resumes the run twice
    again = await http.post(
        f"{stack.human_url}/requests/{request['id']}/answer", json={"option_id": "ship-v2"}, headers=ALICE
    )
    assert again.status_code == 409, again.text

    # 17: Azure DevOps redelivers the same webhook three more times -> still one run
    for _ in range(3):
        duplicate = await post_hook(http, stack, example_pr())
        assert duplicate.status_code == 200, duplicate.text
        assert duplicate.json()["status"] == "duplicate"
        assert duplicate.json()["run_id"] == run_id
    await eventually(
        lambda: _trajectory_with(http, stack, run_id, "trigger.rejected", 3),
        what="three duplicate deliveries journaled",
    )
    events = await _settled_trajectory(http, stack, run_id)  # everything so far recorded: now count
    runs = (await http.get(f"{stack.journal_url}/runs")).json()["runs"]
    assert [r["run_id"] for r in runs] == [run_id]
    types = [e["type"] for e in events]
    assert types.count("trigger.received") == 4
    assert types.count("run.created") == 1
    assert types.count("run.started") == 1
    assert types.count("run.resumed") == 1
    assert types.count("run.completed") == 1
    assert types.count("human.answered") == 1
    assert await _pending(http, stack) == []

    # agent-collab knows the saga's participants (COL-1), over NATS request/reply; its projection is
    # its own consumer's, so wait for it to show the run completed and alice's answer
    def complete(reply: CollaboratorsReply) -> bool:
        ids = {c.id: c for c in reply.collaborators}
        return (
            reply.error is None
            and "agent:reviewer" in ids
            and ids["agent:reviewer"].status == "completed"
            and "human:alice" in ids
        )

    collaborators = await _collaborators(stack, run_id, complete)
    ids = {c.id: c for c in collaborators.collaborators}
    assert ids["agent:reviewer"].run_id == run_id
    assert ids["human:alice"].kind == "human"


async def _trajectory_with(
    http: httpx.AsyncClient, stack: Stack, run_id: str, event_type: str, count: int
) -> list[dict[str, Any]] | None:
    events = await _trajectory(http, stack, run_id)
    return events if sum(e["type"] == event_type for e in events) >= count else None


async def test_run_executor_killed_while_the_run_waits(stack: Stack, http: httpx.AsyncClient) -> None:
    run_id = (await post_hook(http, stack, example_pr())).json()["run_id"]
    await _run_in_state(http, stack, run_id, "waiting_for_human")
    executor_pid = stack.services["run-executor"].pid
    stack.services["run-executor"].kill9()

    # the request is durable; answering while the executor is down loses nothing
    request = await _the_pending_request(http, stack)
    answered = await http.post(
        f"{stack.human_url}/requests/{request['id']}/answer",
        json={"text": "Ship it as v2, with a changelog"},
        headers=ALICE,
    )
    assert answered.status_code == 200, answered.text

    restarted = stack.restart("run-executor")
    assert restarted.pid != executor_pid
    done = await _run_in_state(http, stack, run_id, "completed")
    assert "Ship it as v2, with a changelog" in done["result"]
    types = [e["type"] for e in await _settled_trajectory(http, stack, run_id)]
    assert types.count("human.requested") == 1
    assert types.count("run.resumed") == 1
    assert types.count("run.completed") == 1


async def test_run_executor_killed_mid_run_resumes_from_the_last_checkpoint(
    tmp_path: Any, http: httpx.AsyncClient
) -> None:
    # the scripted reviewer "thinks" 3 s per turn: long enough to kill it between turn 1 and turn 2
    stack = make_stack(tmp_path, TEMPORALITY_EXECUTOR_SCRIPTED_THINK_S="3")
    stack.start()
    nc = await nats.connect(stack.nats.url)
    events = await EventLog(nc).start()
    try:
        run_id = (await post_hook(http, stack, example_pr())).json()["run_id"]
        await events.wait_for("run.checkpointed", run_id=run_id, where=lambda e: e.data["turn"] == 1)
        stack.services["run-executor"].kill9()  # mid turn 2: the run.requested message is un-acked
        stack.restart("run-executor", TEMPORALITY_EXECUTOR_SCRIPTED_THINK_S="0")

        (recovered,) = await events.wait_for(
            "run.resumed", run_id=run_id, where=lambda e: e.data["reason"] == "recovery", timeout_s=60
        )
        assert recovered.data["from_turn"] == 1  # AP-8: continued from the checkpoint, turn 1 not redone
        await _run_in_state(http, stack, run_id, "waiting_for_human")
        request = await _the_pending_request(http, stack)
        response = await http.post(
            f"{stack.human_url}/requests/{request['id']}/answer", json={"option_id": "keep-v1"}, headers=ALICE
        )
        assert response.status_code == 200
        await _run_in_state(http, stack, run_id, "completed")
        # this log is read by its own consumer: wait until it has seen the completion, then everything
        # the stream holds by then (the settle step before counting)
        await events.wait_for("run.completed", run_id=run_id)
        await events.caught_up()
        # no duplicated effects: one question, one tool call per turn, one completion
        assert len(events.of_type("human.requested", run_id)) == 1
        assert len(events.of_type("run.tool_called", run_id)) == 1
        assert [e.data["turn"] for e in events.of_type("run.checkpointed", run_id)] == [1, 2]
        assert len(events.of_type("run.completed", run_id)) == 1
        assert not events.of_type("bus.dead_lettered")
    finally:
        await events.stop()
        await nc.drain()
        stack.stop()


async def test_poison_message_is_dead_lettered_and_journaled_and_consumers_go_on(
    stack: Stack, http: httpx.AsyncClient, stack_events: EventLog
) -> None:
    nc = await nats.connect(stack.nats.url)
    try:
        js = nc.jetstream()
        await js.publish(
            "temporality.events.run.requested", b"\xff not a cloudevent", headers={"Nats-Msg-Id": "poison-1"}
        )
    finally:
        await nc.drain()
    dead = await stack_events.wait_for(
        "bus.dead_lettered", where=lambda e: e.data["consumer"] == "run-executor-requests"
    )
    assert "InvalidEnvelope" in dead[0].data["error"]

    async def journaled() -> list[dict[str, Any]] | None:
        body = (await http.get(f"{stack.journal_url}/events", params={"type": "bus.dead_lettered"})).json()
        consumers = {e["data"]["consumer"] for e in body["events"]}
        return body["events"] if "run-executor-requests" in consumers else None

    await eventually(journaled, what="the dead letter in the journal")
    # the consumers keep going: a real webhook still produces a waiting run
    run_id = (await post_hook(http, stack, example_pr())).json()["run_id"]
    await _run_in_state(http, stack, run_id, "waiting_for_human")
    assert stack.dead() == []


async def test_bad_input_at_the_gateway_and_the_inbox(stack: Stack, http: httpx.AsyncClient) -> None:
    hook = f"{stack.gateway_url}/hooks/ado-pr-review"
    malformed = await post_hook(http, stack, b"{not json")
    assert malformed.status_code == 400
    assert malformed.json()["error"]
    bad_auth = await http.post(hook, json=example_pr(), headers={"Authorization": "Basic " + "eDp5"})
    assert bad_auth.status_code == 401
    assert "Basic" in bad_auth.headers["www-authenticate"]
    unknown = await http.post(f"{stack.gateway_url}/hooks/no-such-trigger", json=example_pr())
    assert unknown.status_code == 404
    oversized = await post_hook(http, stack, b'{"pad": "' + b"x" * 2_000_000 + b'"}')
    assert oversized.status_code == 413
    wrong_shape = await post_hook(http, stack, {"hello": "world"})
    assert wrong_shape.status_code == 422

    no_token = await http.get(f"{stack.human_url}/inbox")
    assert no_token.status_code == 401
    wrong_token = await http.get(f"{stack.human_url}/inbox", headers={"Authorization": "Bearer nope"})
    assert wrong_token.status_code == 401
    missing = await http.post(f"{stack.human_url}/requests/hr-missing/answer", json={"option_id": "x"}, headers=ALICE)
    assert missing.status_code == 404

    run_id = (await post_hook(http, stack, example_pr())).json()["run_id"]
    await _run_in_state(http, stack, run_id, "waiting_for_human")
    request = await _the_pending_request(http, stack)
    url = f"{stack.human_url}/requests/{request['id']}/answer"
    bob = {"Authorization": "Bearer bob-demo-token"}
    assert (await http.post(url, json={"option_id": "keep-v1"}, headers=bob)).status_code == 403
    assert (await http.post(url, json={"option_id": "no-such-option"}, headers=ALICE)).status_code == 422
    assert (await http.post(url, json={}, headers=ALICE)).status_code == 422
    garbage = await http.post(url, content=b"{oops", headers={**ALICE, "Content-Type": "application/json"})
    assert garbage.status_code == 400
    # none of that touched the request: it is still pending and answerable
    assert (await http.post(url, json={"option_id": "keep-v1"}, headers=ALICE)).status_code == 200
    await _run_in_state(http, stack, run_id, "completed")
    # nothing was journaled as a run for the rejected deliveries
    runs = (await http.get(f"{stack.journal_url}/runs")).json()["runs"]
    assert [r["run_id"] for r in runs] == [run_id]
    body = json.dumps(runs)
    assert "change-me" not in body


async def test_services_stop_gracefully_on_sigterm(stack: Stack) -> None:
    codes = stack.stop()
    assert codes == dict.fromkeys(codes, 0)
    assert set(codes) == {"trigger-gateway", "run-executor", "human-interaction", "agent-collab", "journal"}


@pytest.mark.parametrize(("action", "final_state"), [("default", "completed"), ("fail", "failed")])
async def test_nobody_answers_the_timeout_policy_applies(
    tmp_path: Path, http: httpx.AsyncClient, action: str, final_state: str
) -> None:
    """HUM-8 across processes: the deadline is a JetStream message schedule owned by human-interaction."""
    config = tmp_path / "config"
    shutil.copytree(CONFIG, config)
    triggers = yaml.safe_load((config / "triggers.yaml").read_text())
    policy: dict[str, Any] = {"action": action}
    if action == "default":
        policy["default_option"] = "keep-v1"
    triggers["triggers"][0]["human"] |= {"default_timeout_s": 2, "on_timeout": policy}
    (config / "triggers.yaml").write_text(yaml.safe_dump(triggers))
    stack = make_stack(tmp_path, config_dir=config)
    stack.start()
    try:
        run_id = (await post_hook(http, stack, example_pr())).json()["run_id"]
        await _run_in_state(http, stack, run_id, "waiting_for_human")
        done = await _run_in_state(http, stack, run_id, final_state)
        types = [e["type"] for e in await _settled_trajectory(http, stack, run_id)]
        assert "human.expired" in types
        assert "human.answered" not in types
        if action == "default":
            assert "Keep the v1 contract [keep-v1]" in done["result"]
            assert "the timeout policy's default" in done["result"]
        else:
            assert done["error"].startswith("human_request_expired")
        assert await _pending(http, stack) == []
        late = await http.post(
            f"{stack.human_url}/requests/{await _request_id(http, stack, run_id)}/answer",
            json={"option_id": "ship-v2"},
            headers=ALICE,
        )
        assert late.status_code == 409
    finally:
        stack.stop()


async def _request_id(http: httpx.AsyncClient, stack: Stack, run_id: str) -> str:
    events = await _trajectory(http, stack, run_id)
    return str(next(e for e in events if e["type"] == "human.requested")["data"]["request_id"])


async def test_e2e_1_with_the_journal_on_postgresql(tmp_path: Path, http: httpx.AsyncClient) -> None:
    """The deployment shape: the journal process on PostgreSQL through asyncpg (TEMPORALITY_DATABASE_URL)."""
    async with fresh_postgres_database("e2e") as database_url:
        stack = make_stack(tmp_path, TEMPORALITY_DATABASE_URL=database_url)
        stack.start()
        try:
            run_id = (await post_hook(http, stack, example_pr())).json()["run_id"]
            waiting = await _run_in_state(http, stack, run_id, "waiting_for_human")
            answered = await http.post(
                f"{stack.human_url}/requests/{waiting['waiting']['request_id']}/answer",
                json={"option_id": "ship-v2"},
                headers=ALICE,
            )
            assert answered.status_code == 200, answered.text
            done = await _run_in_state(http, stack, run_id, "completed")
            assert "Ship it as a breaking v2 [ship-v2]" in done["result"]
            types = [e["type"] for e in await _settled_trajectory(http, stack, run_id)]
            positions = [types.index(t) for t in E2E_TRAJECTORY]
            assert positions == sorted(positions), types
        finally:
            stack.stop()
        # the rows are really in PostgreSQL, not in a SQLite file somewhere
        conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            stored = await conn.fetchval("SELECT count(*) FROM events WHERE run_id = $1", run_id)
            state = await conn.fetchval("SELECT state FROM runs WHERE run_id = $1", run_id)
        finally:
            await conn.close()
        assert stored >= len(E2E_TRAJECTORY)
        assert state == "completed"
