"""E2E-1 across five separate service processes and a real nats-server (steps 1-17, REQUIREMENTS.md).

The tests share one embedded stack per module (nats-server from the wheel, SQLite journal, the five
services as their own OS processes, the project's shipped config plus the triggers and the agent some
scenarios need) and speak to it only over HTTP and NATS. Each test posts pull requests of its own (a
fresh event id each) and looks only at its own runs, requests and dead letters, so what an earlier test
left behind cannot satisfy (or break) a later one; "only one run" means only one run created by the test
(:func:`_run_ids` before and after), "no dead letter" means none since the test began. A test that
needs the run-executor otherwise (a think time, a crash input, a hang) restarts it with those settings
(:class:`Executor`) and gets the stack's own one back afterwards. The PostgreSQL journal and the
graceful-stop scenario start stacks of their own.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import nats
import nats.errors
import pytest
import yaml
from e2e_support import ALICE, CONFIG, JOURNAL, JOURNAL_OPERATOR, eventually, example_pr, make_stack, post_hook

from temporality_embedded import ServiceProcess, Stack
from temporality_protocol import CollaboratorsQuery, CollaboratorsReply
from temporality_protocol.catalog import (
    BUCKET_RUNS,
    CONSUMERS,
    DLQ_PREFIX,
    DLQ_STREAM,
    EVENTS_STREAM,
    RPC_GET_COLLABORATORS,
)
from temporality_testing.events import EventLog
from temporality_testing.postgres import fresh_postgres_database
from temporality_testing.waiting import stays

pytestmark = pytest.mark.e2e

E2E_TRAJECTORY = [
    "trigger.received",
    "trigger.accepted",
    "run.requested",
    "run.created",
    "run.started",
    "run.tool_called",
    "run.checkpointed",
    "run.streamed",
    "human.requested",
    "human.notified",
    "human.answered",
    "run.resumed",
    "run.completed",
]

#: The shipped trigger with a 2 s question deadline and each timeout policy (HUM-8): trigger id -> policy.
EXPIRING_TRIGGERS: dict[str, dict[str, Any]] = {
    "ado-pr-expires-default": {"action": "default", "default_option": "keep-v1"},
    "ado-pr-expires-fail": {"action": "fail"},
}
#: The shipped trigger launching :data:`TIGHT_AGENT`: the reviewer with a 1 s compute limit (the watchdog test).
TIGHT_TRIGGER = "ado-pr-tight"
TIGHT_AGENT = "reviewer-tight"
TIGHT_COMPUTE_S = 1


def _shared_config(config: Path) -> Path:
    """The shipped config plus the expiring triggers, the tight reviewer and its trigger."""
    shutil.copytree(CONFIG, config)
    agents = yaml.safe_load((config / "agents.yaml").read_text())
    reviewer = next(a for a in agents["agents"] if a["id"] == "reviewer")
    tight = copy.deepcopy(reviewer) | {"id": TIGHT_AGENT}
    tight["limits"] = {"max_turns": 20, "max_compute_s": TIGHT_COMPUTE_S}
    agents["agents"].append(tight)
    (config / "agents.yaml").write_text(yaml.safe_dump(agents))
    triggers = yaml.safe_load((config / "triggers.yaml").read_text())
    shipped = next(t for t in triggers["triggers"] if t["id"] == "ado-pr-review")
    for trigger_id, policy in EXPIRING_TRIGGERS.items():
        expiring = copy.deepcopy(shipped) | {"id": trigger_id}
        expiring["human"] |= {"default_timeout_s": 2, "on_timeout": policy}
        triggers["triggers"].append(expiring)
    triggers["triggers"].append(copy.deepcopy(shipped) | {"id": TIGHT_TRIGGER, "agent": TIGHT_AGENT})
    (config / "triggers.yaml").write_text(yaml.safe_dump(triggers))
    return config


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack for the module's scenarios (see the module docstring)."""
    root = tmp_path_factory.mktemp("e2e")
    s = make_stack(root, config_dir=_shared_config(root / "config"))
    s.start()
    try:
        yield s
    finally:
        s.stop()


class Executor:
    """The shared stack's run-executor for one test: restarted with settings of the test's, and the stack's
    own one again at the end of the test (:meth:`restore`, by the ``executor`` fixture)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.env: dict[str, str] = {}

    def restart(self, **env: str) -> ServiceProcess:
        """Start it again (after a kill -9, or to change its settings) with ``env`` over the stack's own."""
        self.env = env
        return self.stack.restart("run-executor", **env)

    def restore(self) -> None:
        """The stack's own run-executor, running, unless it already is."""
        if self.env or not self.stack.services["run-executor"].alive():
            self.restart()


@pytest.fixture
def executor(stack: Stack) -> Iterator[Executor]:
    process = Executor(stack)
    try:
        yield process
    finally:
        process.restore()


@pytest.fixture
async def stack_events(stack: Stack) -> AsyncIterator[EventLog]:
    """Everything on the shared stack's events stream, from its start (earlier tests' events included)."""
    log = await EventLog.connect(stack.nats.url)
    try:
        yield log
    finally:
        await log.close()


def _new_pr(title_suffix: str = "") -> dict[str, Any]:
    """The example PR as a delivery of its own (a fresh event id: never a duplicate of another test's)."""
    pr = example_pr(id=str(uuid.uuid4()))
    pr["resource"]["title"] += title_suffix
    return pr


async def _journaled_runs(http: httpx.AsyncClient, stack: Stack) -> list[dict[str, Any]]:
    """Every run the journal lists, once it has recorded everything published so far (:func:`_journal_caught_up`):
    a test's "before" to tell its own runs from earlier tests'."""
    await _journal_caught_up(stack)
    response = await http.get(f"{stack.journal_url}/runs", headers=JOURNAL)
    assert response.status_code == 200, response.text
    runs: list[dict[str, Any]] = response.json()["runs"]
    return runs


async def _runs_since(http: httpx.AsyncClient, stack: Stack, before: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs the journal lists (once caught up) that ``before`` did not."""
    known = {r["run_id"] for r in before}
    return [r for r in await _journaled_runs(http, stack) if r["run_id"] not in known]


async def _dead_letters(events: EventLog) -> int:
    """How many ``bus.dead_lettered`` the stream holds now (the baseline of "no dead letter since")."""
    await events.caught_up()
    return len(events.of_type("bus.dead_lettered"))


async def _run(http: httpx.AsyncClient, stack: Stack, run_id: str) -> dict[str, Any] | None:
    response = await http.get(f"{stack.journal_url}/runs/{run_id}", headers=JOURNAL)
    return response.json() if response.status_code == 200 else None


async def _run_in_state(http: httpx.AsyncClient, stack: Stack, run_id: str, state: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        run = await _run(http, stack, run_id)
        return run if run and run["state"] == state else None

    return await eventually(probe, what=f"run {run_id} in state {state} in the journal")


async def _pending(http: httpx.AsyncClient, stack: Stack, run_id: str) -> list[dict[str, Any]]:
    """alice's pending requests of the run ``run_id`` (her inbox may hold other tests' requests)."""
    response = await http.get(f"{stack.human_url}/inbox", headers=ALICE)
    assert response.status_code == 200, response.text
    requests: list[dict[str, Any]] = response.json()["requests"]
    return [r for r in requests if r["run_id"] == run_id]


async def _the_pending_request(http: httpx.AsyncClient, stack: Stack, run_id: str) -> dict[str, Any]:
    """alice's one pending request of the run, once human-interaction has stored it.

    human-interaction consumes ``human.requested`` on its own: the journal showing the run waiting says
    nothing about whether the inbox has caught up yet.
    """
    (request,) = await eventually(lambda: _pending(http, stack, run_id), what=f"alice's inbox to show {run_id}")
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


async def _requests_acked(stack: Stack) -> None:
    """Wait until the run-executor has acked every ``run.requested`` (none left to deliver, none in its hands).

    A run that asks parks: the question is published, then its ``run.requested`` is acked. The journal (and
    the inbox) can show the run waiting a moment before that ack; a run-executor killed in that moment is
    handed the message again on restart, and recovers the run (a ``run.resumed`` of reason ``recovery``).
    """
    nc = await nats.connect(stack.nats.url)
    try:
        js = nc.jetstream()
        durable = CONSUMERS["run-executor-requests"]

        async def acked() -> bool:
            info = await js.consumer_info(durable.stream, durable.durable)
            return bool(info.num_pending == 0 and info.num_ack_pending == 0)

        await eventually(acked, what="the run-executor to ack every run.requested")
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
    response = await http.get(f"{stack.journal_url}/runs/{run_id}/events", headers=JOURNAL)
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["events"]
    return events


#: The example PR's web page, derived by the gateway from the payload's repository ``remoteUrl``.
PR_42_WEB = "https://dev.azure.com/fabrikam/Fabrikam/_git/orders-service/pullrequest/42"


async def test_e2e_1_webhook_to_completed_review_with_a_human_answer(stack: Stack, http: httpx.AsyncClient) -> None:
    before = await _journaled_runs(http, stack)
    pr = _new_pr()
    # 1-3: Azure DevOps sends the PR-created webhook; Temporality accepts it durably
    accepted = await post_hook(http, stack, pr)
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
    inbox = await eventually(lambda: _pending(http, stack, run_id), what="alice's inbox to show the request")
    assert len(inbox) == 1
    request = inbox[0]
    assert request["run_id"] == run_id
    assert [o["id"] for o in request["options"]] == ["keep-v1", "ship-v2"]
    assert "Missing:" in request["context"]
    assert request["id"] == waiting["request_id"]
    # HUM-5: one tap from the PR -- its web page, from the webhook through run.requested and human.requested
    assert request["source_link"] == {"href": PR_42_WEB, "label": "PR #42 in orders-service"}

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
    assert human_requested["data"]["source_link"]["href"] == PR_42_WEB
    assert answered_event["data"]["responder"] == "user:alice"
    assert answered_event["data"]["responder_display_name"] == "Alice Example"  # config/users.yaml's, for the console
    assert human_requested["data"]["agent_display_name"] is None  # the shipped card has none: the question shows its id
    assert resumed["data"]["reason"] == "answer"
    assert resumed["data"]["waited_s"] >= 0
    # AP-9: the shipped card offers report_progress; the reviewer reports after reading the input, before it asks
    calls = [e["data"]["tool"] for e in events if e["type"] == "run.tool_called"]
    assert calls == ["get_input", "report_progress"]
    (progress,) = [e for e in events if e["type"] == "run.streamed" and e["data"]["kind"] == "progress"]
    assert progress["data"]["message"] == "Read PR #42; API-contract keywords found: 3"
    assert progress["data"]["data"]["pr"] == 42
    assert progress["data"]["turn"] == 2
    assert progress["data"]["request_id"] == run_id  # the run's own request: it answers none
    saga = next(e for e in events if e["type"] == "run.requested")["correlation_id"]
    assert progress["data"]["correlation_id"] == progress["correlation_id"] == saga
    assert events.index(progress) < types.index("human.requested")

    # a second answer is refused and never resumes the run twice
    again = await http.post(
        f"{stack.human_url}/requests/{request['id']}/answer", json={"option_id": "ship-v2"}, headers=ALICE
    )
    assert again.status_code == 409, again.text

    # 17: Azure DevOps redelivers the same webhook three more times -> still one run
    for _ in range(3):
        duplicate = await post_hook(http, stack, pr)
        assert duplicate.status_code == 200, duplicate.text
        assert duplicate.json()["status"] == "duplicate"
        assert duplicate.json()["run_id"] == run_id
    await eventually(
        lambda: _trajectory_with(http, stack, run_id, "trigger.rejected", 3),
        what="three duplicate deliveries journaled",
    )
    events = await _settled_trajectory(http, stack, run_id)  # everything so far recorded: now count
    assert [r["run_id"] for r in await _runs_since(http, stack, before)] == [run_id]
    types = [e["type"] for e in events]
    assert types.count("trigger.received") == 4
    assert types.count("run.created") == 1
    assert types.count("run.started") == 1
    assert types.count("run.resumed") == 1
    assert types.count("run.completed") == 1
    assert types.count("human.answered") == 1
    assert await _pending(http, stack, run_id) == []

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


async def test_run_executor_killed_while_the_run_waits(
    stack: Stack, http: httpx.AsyncClient, executor: Executor
) -> None:
    run_id = (await post_hook(http, stack, _new_pr())).json()["run_id"]
    await _run_in_state(http, stack, run_id, "waiting_for_human")
    await _requests_acked(stack)  # parked for good: killed while it waits, not while it parks
    executor_pid = stack.services["run-executor"].pid
    stack.services["run-executor"].kill9()

    # the request is durable; answering while the executor is down loses nothing
    request = await _the_pending_request(http, stack, run_id)
    answered = await http.post(
        f"{stack.human_url}/requests/{request['id']}/answer",
        json={"text": "Ship it as v2, with a changelog"},
        headers=ALICE,
    )
    assert answered.status_code == 200, answered.text

    restarted = executor.restart()
    assert restarted.pid != executor_pid
    done = await _run_in_state(http, stack, run_id, "completed")
    assert "Ship it as v2, with a changelog" in done["result"]
    types = [e["type"] for e in await _settled_trajectory(http, stack, run_id)]
    assert types.count("human.requested") == 1
    assert types.count("run.resumed") == 1
    assert types.count("run.completed") == 1


async def test_run_executor_killed_mid_run_resumes_from_the_last_checkpoint(
    stack: Stack, http: httpx.AsyncClient, executor: Executor, stack_events: EventLog
) -> None:
    events = stack_events
    dead_letters = await _dead_letters(events)
    # the scripted reviewer "thinks" 3 s per turn: long enough to kill it between turn 1 and turn 2
    executor.restart(TEMPORALITY_EXECUTOR_SCRIPTED_THINK_S="3")
    run_id = (await post_hook(http, stack, _new_pr())).json()["run_id"]
    await events.wait_for("run.checkpointed", run_id=run_id, where=lambda e: e.data["turn"] == 1)
    stack.services["run-executor"].kill9()  # mid turn 2: the run.requested message is un-acked
    executor.restart()  # the stack's own: no think time

    (recovered,) = await events.wait_for(
        "run.resumed", run_id=run_id, where=lambda e: e.data["reason"] == "recovery", timeout_s=60
    )
    assert recovered.data["from_turn"] == 1  # AP-8: continued from the checkpoint, turn 1 not redone
    await _run_in_state(http, stack, run_id, "waiting_for_human")
    request = await _the_pending_request(http, stack, run_id)
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
    assert [e.data["tool"] for e in events.of_type("run.tool_called", run_id)] == ["get_input", "report_progress"]
    assert [e.data["turn"] for e in events.of_type("run.checkpointed", run_id)] == [1, 2, 3]
    streamed = events.of_type("run.streamed", run_id)
    assert [e.data["turn"] for e in streamed if e.data["kind"] == "progress"] == [2]  # one report, not replayed twice
    assert sorted(e.data["turn"] for e in streamed if e.data["kind"] == "metrics") == [1, 2, 3, 4]
    assert len(events.of_type("run.completed", run_id)) == 1
    assert len(events.of_type("bus.dead_lettered")) == dead_letters  # none since the test began


async def test_poison_message_is_dead_lettered_and_journaled_and_consumers_go_on(
    stack: Stack, http: httpx.AsyncClient, stack_events: EventLog
) -> None:
    nc = await nats.connect(stack.nats.url)
    try:
        js = nc.jetstream()
        poison = await js.publish(
            "temporality.events.run.requested",
            b"\xff not a cloudevent",
            headers={"Nats-Msg-Id": f"poison-{uuid.uuid4()}"},
        )
    finally:
        await nc.drain()

    def ours(data: dict[str, Any]) -> bool:
        return bool(data["consumer"] == "run-executor-requests" and data["stream_seq"] == poison.seq)

    dead = await stack_events.wait_for("bus.dead_lettered", where=lambda e: ours(e.data))
    assert "InvalidEnvelope" in dead[0].data["error"]

    async def journaled() -> list[dict[str, Any]] | None:
        body = (
            await http.get(  # dead letters are in the audit trail: the operator's
                f"{stack.journal_url}/events", params={"type": "bus.dead_lettered"}, headers=JOURNAL_OPERATOR
            )
        ).json()
        return [e for e in body["events"] if ours(e["data"])] or None

    await eventually(journaled, what="the dead letter in the journal")
    # the consumers keep going: a real webhook still produces a waiting run
    run_id = (await post_hook(http, stack, _new_pr())).json()["run_id"]
    await _run_in_state(http, stack, run_id, "waiting_for_human")
    assert stack.dead() == []


async def test_bad_input_at_the_gateway_and_the_inbox(stack: Stack, http: httpx.AsyncClient) -> None:
    before = await _journaled_runs(http, stack)
    hook = f"{stack.gateway_url}/hooks/ado-pr-review"
    malformed = await post_hook(http, stack, b"{not json")
    assert malformed.status_code == 400
    assert malformed.json()["error"]
    bad_auth = await http.post(hook, json=_new_pr(), headers={"Authorization": "Basic " + "eDp5"})
    assert bad_auth.status_code == 401
    assert "Basic" in bad_auth.headers["www-authenticate"]
    unknown = await http.post(f"{stack.gateway_url}/hooks/no-such-trigger", json=_new_pr())
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

    run_id = (await post_hook(http, stack, _new_pr())).json()["run_id"]
    await _run_in_state(http, stack, run_id, "waiting_for_human")
    request = await _the_pending_request(http, stack, run_id)
    url = f"{stack.human_url}/requests/{request['id']}/answer"
    bob = {"Authorization": "Bearer bob-demo-inbox-token-change-me"}
    assert (await http.post(url, json={"option_id": "keep-v1"}, headers=bob)).status_code == 403
    assert (await http.post(url, json={"option_id": "no-such-option"}, headers=ALICE)).status_code == 422
    assert (await http.post(url, json={}, headers=ALICE)).status_code == 422
    garbage = await http.post(url, content=b"{oops", headers={**ALICE, "Content-Type": "application/json"})
    assert garbage.status_code == 400
    # none of that touched the request: it is still pending and answerable
    assert (await http.post(url, json={"option_id": "keep-v1"}, headers=ALICE)).status_code == 200
    await _run_in_state(http, stack, run_id, "completed")
    # nothing was journaled as a run for the rejected deliveries
    assert [r["run_id"] for r in await _runs_since(http, stack, before)] == [run_id]
    body = json.dumps(await _journaled_runs(http, stack))
    assert "change-me" not in body


async def test_services_stop_gracefully_on_sigterm(tmp_path: Path) -> None:
    stack = make_stack(tmp_path)  # a stack of its own: the shared one must keep running
    stack.start()
    codes = stack.stop()
    assert codes == dict.fromkeys(codes, 0)
    assert set(codes) == {"trigger-gateway", "run-executor", "human-interaction", "agent-collab", "journal"}


@pytest.mark.parametrize(("action", "final_state"), [("default", "completed"), ("fail", "failed")])
async def test_nobody_answers_the_timeout_policy_applies(
    stack: Stack, http: httpx.AsyncClient, action: str, final_state: str
) -> None:
    """HUM-8 across processes: the deadline is a JetStream message schedule owned by human-interaction."""
    trigger = next(t for t, policy in EXPIRING_TRIGGERS.items() if policy["action"] == action)
    run_id = (await post_hook(http, stack, _new_pr(), trigger=trigger)).json()["run_id"]
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
    assert await _pending(http, stack, run_id) == []
    late = await http.post(
        f"{stack.human_url}/requests/{await _request_id(http, stack, run_id)}/answer",
        json={"option_id": "ship-v2"},
        headers=ALICE,
    )
    assert late.status_code == 409


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
            request = await _the_pending_request(http, stack, run_id)  # human-interaction stored it too
            assert request["id"] == waiting["waiting"]["request_id"]
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


# --------------------------------------------------------------------------- no run is ever left behind
#: The input that takes the executor down on every attempt (TEMPORALITY_EXECUTOR_SCRIPTED_CRASH_ON: the
#: scripted provider exits 137, as the OOM killer would, when the last message contains it).
CRASH_MARKER = "OOM-ON-THIS-INPUT"
#: Deliveries of a run's message before it is dead-lettered (TEMPORALITY_EXECUTOR_MAX_DELIVER): low, so
#: the crash loop is short.
CRASH_MAX_DELIVER = 2


#: The run-executor settings of the crash-loop tests.
CRASH_ENV = {
    "TEMPORALITY_EXECUTOR_SCRIPTED_CRASH_ON": CRASH_MARKER,
    "TEMPORALITY_EXECUTOR_MAX_DELIVER": str(CRASH_MAX_DELIVER),
}


async def _fails_while_the_executor_keeps_dying(
    http: httpx.AsyncClient, stack: Stack, executor: Executor, run_id: str
) -> list[int]:
    """Restart the run-executor (with the crash settings) each time the run takes it down (as a supervisor
    would) until the run is failed in the journal; the exit codes of the crashes."""
    exits: list[int] = []

    async def failed() -> dict[str, Any] | None:
        process = stack.services["run-executor"]
        if not process.alive():
            assert process.proc is not None
            exits.append(process.proc.returncode)
            assert len(exits) <= CRASH_MAX_DELIVER, f"crashed more often than its deliveries allow: {exits}"
            await asyncio.to_thread(executor.restart, **CRASH_ENV)
        run = await _run(http, stack, run_id)
        return run if run and run["state"] == "failed" else None

    await eventually(failed, timeout_s=120, what=f"run {run_id} failed while the executor keeps crashing")
    return exits


async def _stored_run(stack: Stack, run_id: str) -> dict[str, Any]:
    """The run record in KV (the run-executor's own state, not the journal's projection of it)."""
    nc = await nats.connect(stack.nats.url)
    try:
        entry = await (await nc.jetstream().key_value(BUCKET_RUNS.name)).get(run_id)
        assert entry.value is not None
        record: dict[str, Any] = json.loads(entry.value)
        return record
    finally:
        await nc.drain()


async def _stored_run_in_state(stack: Stack, run_id: str, state: str) -> dict[str, Any]:
    """The KV record once it is in ``state`` (``run.failed`` is published just before the record is moved)."""

    async def probe() -> dict[str, Any] | None:
        record = await _stored_run(stack, run_id)
        return record if record["state"] == state else None

    return await eventually(probe, what=f"run {run_id} in state {state} in KV")


async def _dead_letter(stack: Stack, durable: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The last message the DLQ holds for ``durable``: its headers and the original CloudEvent."""
    nc = await nats.connect(stack.nats.url)
    try:
        msg = await nc.jetstream().get_last_msg(DLQ_STREAM.name, f"{DLQ_PREFIX}.{durable}")
        assert msg.data is not None
        return dict(msg.headers or {}), json.loads(msg.data)
    finally:
        await nc.drain()


async def _assert_failed_as_infrastructure_error(
    http: httpx.AsyncClient, stack: Stack, run_id: str, durable: str, original_type: str
) -> list[dict[str, Any]]:
    """In KV, the journal and the trajectory: failed once (infrastructure_error), then dead-lettered."""
    stored = await _stored_run_in_state(stack, run_id, "failed")
    assert stored["error"].startswith("infrastructure_error: ")
    journaled = await _run_in_state(http, stack, run_id, "failed")
    assert journaled["error"].startswith("infrastructure_error: ")
    await eventually(
        lambda: _trajectory_with(http, stack, run_id, "bus.dead_lettered", 1), what="the dead letter in the journal"
    )
    events = await _settled_trajectory(http, stack, run_id)
    types = [e["type"] for e in events]
    (failed,) = [e for e in events if e["type"] == "run.failed"]
    assert failed["data"]["reason"] == "infrastructure_error"
    assert f"dead-lettered after {CRASH_MAX_DELIVER + 1} deliveries" in failed["data"]["error"]
    (dead,) = [e for e in events if e["type"] == "bus.dead_lettered"]
    assert dead["data"]["consumer"] == durable
    assert dead["data"]["original_type"] == original_type
    assert dead["data"]["deliveries"] == CRASH_MAX_DELIVER + 1
    assert types.index("run.failed") < types.index("bus.dead_lettered")  # failed before the message went
    assert "run.completed" not in types
    headers, original = await _dead_letter(stack, durable)
    assert "deliveries exhausted" in headers["Temporality-Error"]
    assert (original["type"], original["runid"]) == (original_type, run_id)
    return events


async def _still_serves_runs(http: httpx.AsyncClient, stack: Stack) -> None:
    """After the crash loop the executor (still configured to crash on that input) serves other runs."""
    run_id = (await post_hook(http, stack, _new_pr())).json()["run_id"]
    waiting = await _run_in_state(http, stack, run_id, "waiting_for_human")
    request_id = waiting["waiting"]["request_id"]

    async def in_the_inbox() -> bool:  # the journal showing the run waiting says nothing about the inbox
        return request_id in [r["id"] for r in await _pending(http, stack, run_id)]

    await eventually(in_the_inbox, what=f"alice's inbox to show {request_id}")
    answered = await http.post(
        f"{stack.human_url}/requests/{request_id}/answer",
        json={"option_id": "keep-v1"},
        headers=ALICE,
    )
    assert answered.status_code == 200, answered.text
    await _run_in_state(http, stack, run_id, "completed")
    assert stack.dead() == []


async def test_an_input_that_crashes_the_executor_every_time_fails_the_run_in_the_start_phase(
    stack: Stack, http: httpx.AsyncClient, executor: Executor
) -> None:
    executor.restart(**CRASH_ENV)
    accepted = await post_hook(http, stack, _new_pr(f" ({CRASH_MARKER})"))
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]
    exits = await _fails_while_the_executor_keeps_dying(http, stack, executor, run_id)
    assert exits == [137] * CRASH_MAX_DELIVER  # each delivery took the process down; the next one never ran
    events = await _assert_failed_as_infrastructure_error(http, stack, run_id, "run-executor-requests", "run.requested")
    types = [e["type"] for e in events]
    assert "human.requested" not in types
    assert "run.checkpointed" not in types  # it never got past its first turn
    recoveries = [e for e in events if e["type"] == "run.resumed" and e["data"]["reason"] == "recovery"]
    assert len(recoveries) == CRASH_MAX_DELIVER - 1  # every delivery after the first tried again
    await _still_serves_runs(http, stack)


async def test_an_answer_that_crashes_the_executor_every_time_fails_the_run_visibly(
    stack: Stack, http: httpx.AsyncClient, executor: Executor
) -> None:
    executor.restart(**CRASH_ENV)
    run_id = (await post_hook(http, stack, _new_pr())).json()["run_id"]
    waiting = await _run_in_state(http, stack, run_id, "waiting_for_human")
    request = await _the_pending_request(http, stack, run_id)  # human-interaction stored it too
    assert request["id"] == waiting["waiting"]["request_id"]
    answered = await http.post(
        f"{stack.human_url}/requests/{waiting['waiting']['request_id']}/answer",
        json={"text": f"Keep v1 ({CRASH_MARKER})"},
        headers=ALICE,
    )
    assert answered.status_code == 200, answered.text  # bound: the answer is the user's, and then lost
    exits = await _fails_while_the_executor_keeps_dying(http, stack, executor, run_id)
    assert exits == [137] * CRASH_MAX_DELIVER
    events = await _assert_failed_as_infrastructure_error(http, stack, run_id, "run-executor-human", "human.answered")
    types = [e["type"] for e in events]
    assert types.count("human.answered") == 1
    resumed = [e["data"]["reason"] for e in events if e["type"] == "run.resumed"]
    assert resumed == ["answer"]  # resumed with it once, then crashed on it every time
    assert types.index("run.resumed") < types.index("run.failed")
    assert await _pending(http, stack, run_id) == []  # the request stays answered; the run says what happened
    await _still_serves_runs(http, stack)


async def test_a_hung_executor_s_run_is_failed_by_the_watchdog_of_another(
    stack: Stack, http: httpx.AsyncClient, executor: Executor, stack_events: EventLog, tmp_path: Path
) -> None:
    """Executor A hangs mid-turn (SIGSTOP: no heartbeat, no progress, no crash); its run.requested stays in
    A's hands (ack_wait 60 s), so nothing would ever move the run. Executor B's watchdog fails it once it
    sat past its compute limit (1 s: the tight reviewer's) plus grace (2 s); a run waiting for a person
    meanwhile is left alone."""
    events = stack_events
    dead_letters = await _dead_letters(events)
    limit_and_grace_s = TIGHT_COMPUTE_S + 2
    both = {"TEMPORALITY_NATS_ACK_WAIT_S": "60", "TEMPORALITY_EXECUTOR_WATCHDOG_GRACE_S": "2"}
    hung = executor.restart(**both, TEMPORALITY_EXECUTOR_SCRIPTED_THINK_S="30")  # A: a turn far over budget
    replica: ServiceProcess | None = None
    try:
        run_id = (await post_hook(http, stack, _new_pr(), trigger=TIGHT_TRIGGER)).json()["run_id"]
        (started,) = await events.wait_for("run.started", run_id=run_id)
        assert hung.pid is not None
        os.kill(hung.pid, signal.SIGSTOP)  # hangs in its first turn, the message un-acked in its hands

        env = {**stack.env_for("run-executor"), **both, "TEMPORALITY_EXECUTOR_SCRIPTED_THINK_S": "0"}
        replica = ServiceProcess("run-executor", env, tmp_path / "replica", cwd=stack.data_dir)
        replica.start()
        await asyncio.to_thread(replica.wait_ready, 60)

        (failed,) = await events.wait_for("run.failed", run_id=run_id, timeout_s=60)
        assert failed.data["reason"] == "stalled"
        assert "no progress in running at turn 0" in failed.data["error"]
        assert (failed.time - started.time).total_seconds() >= limit_and_grace_s - 0.5
        stored = await _stored_run_in_state(stack, run_id, "failed")
        assert stored["error"].startswith("stalled: ")
        assert (await _run_in_state(http, stack, run_id, "failed"))["error"].startswith("stalled: ")

        # a run that waits for a person (driven by B) is never the watchdog's business
        other = (await post_hook(http, stack, _new_pr(), trigger=TIGHT_TRIGGER)).json()["run_id"]
        waiting = await _run_in_state(http, stack, other, "waiting_for_human")
        await _stored_run_in_state(stack, other, "waiting_for_human")

        async def still_waiting() -> bool:
            return bool((await _stored_run(stack, other))["state"] == "waiting_for_human")

        await stays(still_waiting, settle_s=2 * limit_and_grace_s + 1, what=f"run {other} waiting for alice")
        assert (await _the_pending_request(http, stack, other))["id"] == waiting["waiting"]["request_id"]
        answered = await http.post(
            f"{stack.human_url}/requests/{waiting['waiting']['request_id']}/answer",
            json={"option_id": "keep-v1"},
            headers=ALICE,
        )
        assert answered.status_code == 200, answered.text
        await _run_in_state(http, stack, other, "completed")
        await events.caught_up()
        assert events.of_type("run.failed", other) == []
        assert len(events.of_type("run.failed", run_id)) == 1
        assert len(events.of_type("bus.dead_lettered")) == dead_letters  # none since the test began
    finally:
        stack.services["run-executor"].kill9()  # SIGKILL ends a stopped process too (the fixture restarts it)
        if replica is not None:
            replica.terminate()
