"""The issue's acceptance test for external agents (AP-5, AP-7..AP-9), across the five services as processes.

``examples/external-agent/agent.py`` -- written from the published schemas alone -- runs as a subprocess with
``--work``: it registers, heartbeats, takes the task of a run whose card is ``provider: {kind: external}``, asks a
human (the run parks ``waiting_for_human``), is killed -9 while the run waits (it goes ``offline``), is started
again (it resumes from its checkpoint: ``agent.task.taken`` resumed, ``run.resumed`` reason ``recovery``), the
person answers through the web inbox, and the restarted agent finishes the run. One question, one completion;
its streaming events and checkpoints are in the journal.

The tests share one stack (a stack start is most of their cost): each posts its PR with an event id of its
own, reads only its own run's questions and waits only on events stored since it began (``EventLog(since=)``),
so an earlier test's agent registering, deregistering or going offline is never taken for its own.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import (
    ALICE,
    API_TOKENS,
    CONFIG,
    JOURNAL,
    ROOT,
    eventually,
    example_pr,
    make_stack,
    post_hook,
    stop_processes,
)

from temporality_embedded import Stack
from temporality_protocol import Envelope
from temporality_testing.events import EventLog

pytestmark = pytest.mark.e2e

AGENT = ROOT / "examples" / "external-agent" / "agent.py"
OPERATOR = {"Authorization": f"Bearer {API_TOKENS[1].token.get_secret_value()}"}
CARD = ROOT / "examples" / "external-agent" / "agents.yaml"
WAIT_S = 45.0


def _config(tmp_path: Path) -> Path:
    """The shipped config, with the example's external card, the PR trigger pointing at it and a short
    heartbeat interval (1 s: the killed agent goes offline within a few seconds)."""
    config = tmp_path / "config"
    shutil.copytree(CONFIG, config)
    agents = yaml.safe_load((config / "agents.yaml").read_text(encoding="utf-8"))
    agents["agents"] += yaml.safe_load(CARD.read_text(encoding="utf-8"))["agents"]
    (config / "agents.yaml").write_text(yaml.safe_dump(agents), encoding="utf-8")
    triggers = yaml.safe_load((config / "triggers.yaml").read_text(encoding="utf-8"))
    for trigger in triggers["triggers"]:
        if trigger["id"] == "ado-pr-review":
            trigger["agent"] = "external-triager"
    (config / "triggers.yaml").write_text(yaml.safe_dump(triggers), encoding="utf-8")
    allow = yaml.safe_load((config / "external-agents.yaml").read_text(encoding="utf-8"))
    allow["heartbeat_interval_s"] = 1
    (config / "external-agents.yaml").write_text(yaml.safe_dump(allow), encoding="utf-8")
    return config


@pytest.fixture(scope="module")
def external_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("external-stack")
    stack = make_stack(root, config_dir=_config(root), TEMPORALITY_COLLAB_HEARTBEAT_GRACE_S="1")
    # as `temporality up` runs it: the example agent signs (AP-11) with the key the stack makes, and agent-collab
    # reads the shipped allow-list with its public key
    stack.config.example_agent_key = True
    stack.start()
    assert stack.example_agent_public_key is not None
    try:
        yield stack
    finally:
        stack.stop()


def _new_pr() -> dict[str, Any]:
    """The example PR as a delivery of its own (a fresh event id: never a duplicate of the other test's)."""
    return example_pr(id=str(uuid.uuid4()))


async def _start_agent(stack: Stack, log: Path, *extra: str) -> asyncio.subprocess.Process:
    out = log.open("ab")
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            str(AGENT),
            "--nats-url",
            stack.nats.url,
            "--key-file",
            str(stack.example_agent_key_file),
            "--work",
            "--tasks",
            "1",
            "--poll-s",
            "0.2",
            "--period-s",
            "0.4",
            *extra,
            stdout=out,
            stderr=out,
        )
    finally:
        out.close()


async def _pending(http: httpx.AsyncClient, stack: Stack, run_id: str) -> list[dict[str, Any]]:
    """The questions pending in alice's inbox for ``run_id`` (the shared stack's other runs left out)."""
    response = await http.get(f"{stack.human_url}/inbox", headers=ALICE)
    assert response.status_code == 200, response.text
    requests: list[dict[str, Any]] = response.json()["requests"]
    return [r for r in requests if r["run_id"] == run_id]


async def _run(http: httpx.AsyncClient, stack: Stack, run_id: str, state: str) -> dict[str, Any] | None:
    response = await http.get(f"{stack.journal_url}/runs/{run_id}", headers=JOURNAL)
    run: dict[str, Any] | None = response.json() if response.status_code == 200 else None
    return run if run is not None and run["state"] == state else None


async def _journaled(http: httpx.AsyncClient, stack: Stack, run_id: str, *types: str) -> list[dict[str, Any]] | None:
    response = await http.get(f"{stack.journal_url}/runs/{run_id}/events", headers=JOURNAL)
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["events"]
    seen = {e["type"] for e in events}
    return events if all(t in seen for t in types) else None


def _caused_by_earlier(events: Sequence[Envelope], run_id: str) -> None:
    """Every event of the run the run-executor or agent-collab published (``agent.task.*``) names as its cause
    (``causationid``) an event of the run stored before it."""
    seen: set[str] = set()
    for event in events:
        if event.runid != run_id and event.data.get("run_id") != run_id:
            continue
        if event.source in ("/temporality/run-executor", "/temporality/agent-collab"):
            assert event.causationid in seen, f"{event.type} {event.id} is caused by {event.causationid!r}"
        seen.add(event.id)


async def test_the_example_agent_takes_a_task_asks_is_killed_resumes_and_finishes(
    external_stack: Stack, tmp_path: Path
) -> None:
    stack = external_stack
    events = await EventLog.connect(stack.nats.url, since=datetime.now(UTC))
    agent_log = tmp_path / "agent.log"
    agent = await _start_agent(stack, agent_log)
    second: asyncio.subprocess.Process | None = None
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            await events.wait_for("agent.registered", timeout_s=WAIT_S)
            accepted = await post_hook(http, stack, _new_pr())
            assert accepted.status_code == 202, accepted.text
            run_id = accepted.json()["run_id"]

            # it takes the task and asks alice: the run parks exactly like a hosted one
            (offered,) = await events.wait_for("agent.task.offered", run_id=run_id, timeout_s=WAIT_S)
            assert offered.data["task"]["objective"]
            assert offered.data["task"]["context"]["people"] == ["user:alice"]
            await eventually(lambda: _run(http, stack, run_id, "waiting_for_human"), WAIT_S, "the run parked")
            (request,) = await eventually(
                lambda: _pending(http, stack, run_id), WAIT_S, "alice's inbox to show the question"
            )
            assert request["run_id"] == run_id
            assert [o["id"] for o in request["options"]] == ["yes", "no"]
            await events.wait_for("agent.task.checkpointed", run_id=run_id, timeout_s=WAIT_S)

            # killed -9 while the run waits for alice: the agent goes offline (its heartbeat timer)
            killed_at = datetime.now(UTC)
            agent.kill()
            await agent.wait()
            await events.wait_for(
                "agent.lifecycle_changed",
                where=lambda e: e.data["to_state"] == "offline" and e.time >= killed_at,
                timeout_s=WAIT_S,
            )

            # started again: it takes its task back with its checkpoint, and the run says it resumed
            second = await _start_agent(stack, agent_log)
            (resumed_take,) = await events.wait_for(
                "agent.task.taken", run_id=run_id, where=lambda e: e.data["resumed"], timeout_s=WAIT_S
            )
            assert resumed_take.data["checkpoint_id"]
            assert await _run(http, stack, run_id, "waiting_for_human")  # still parked on alice, at zero cost

            # alice answers through the web inbox; the restarted agent gets the answer and finishes
            answered = await http.post(
                f"{stack.human_url}/requests/{request['id']}/answer", json={"option_id": "yes"}, headers=ALICE
            )
            assert answered.status_code == 200, answered.text
            done = await eventually(lambda: _run(http, stack, run_id, "completed"), WAIT_S, "the run completed")
            assert "decision" in done["result"]
            assert "yes" in done["result"]
            # the run went on with the recovered agent: run.resumed (recovery) once, after the answer's
            (recovered,) = await events.wait_for(
                "run.resumed", run_id=run_id, where=lambda e: e.data["reason"] == "recovery", timeout_s=WAIT_S
            )
            assert recovered.source == "/temporality/run-executor"
            # and every wake-up by the agent's action (its question, its result) is in the timeline: agent_action
            reasons = [e.data["reason"] for e in events.of_type("run.resumed", run_id=run_id)]
            assert reasons == ["agent_action", "answer", "recovery", "agent_action"], reasons
            assert await asyncio.wait_for(second.wait(), WAIT_S) == 0, agent_log.read_text()

            # one question, one completion; streaming events and checkpoints in the journal (AP-9, AP-7)
            wanted = ("agent.task.streamed", "agent.task.checkpointed", "agent.task.acted", "run.completed")
            journal = await eventually(lambda: _journaled(http, stack, run_id, *wanted), WAIT_S, "the journal")
            types = [e["type"] for e in journal]
            assert types.count("human.requested") == 1, types
            assert types.count("run.completed") == 1, types
            kinds = sorted(e["data"]["kind"] for e in journal if e["type"] == "agent.task.streamed")
            assert kinds == ["metrics", "partial_result", "progress"], kinds
            streamed = next(e for e in journal if e["type"] == "agent.task.streamed")
            assert streamed["data"]["correlation_id"]
            assert streamed["data"]["request_id"]
            (asked,) = events.of_type("human.requested", run_id=run_id)
            # the shipped trigger's timeout default (keep-v1) is not among this agent's options: the question is
            # asked all the same and fails at its deadline instead
            assert asked.data["policy"]["on_timeout"]["action"] == "fail", asked.data["policy"]
            assert len(events.of_type("run.completed", run_id=run_id)) == 1
            log_text = agent_log.read_text()
            assert "resuming task" in log_text, log_text
            assert "sending unsigned requests" not in log_text, "the example agent must sign"
            assert not events.of_type("agent.message_refused"), "a message of the signing agent was refused"
            _caused_by_earlier(events.events, run_id)
    finally:
        await stop_processes(agent, second)
        await events.close()


async def test_a_task_waits_for_its_agent_and_survives_kill9_of_the_executor_and_agent_collab(
    external_stack: Stack, tmp_path: Path
) -> None:
    """The run is requested before its agent is up: the executor offers turn 1 and parks the run on its agent
    (compute budget). kill -9 of the run-executor while the run is parked on the agent (the agent, started then,
    acts and the new executor wakes the run), then of agent-collab while the run is parked on alice: nothing is
    lost -- one task offer per turn, one question, one completion."""
    stack = external_stack
    events = await EventLog.connect(stack.nats.url, since=datetime.now(UTC))
    agent_log = tmp_path / "agent.log"
    agent: asyncio.subprocess.Process | None = None
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            accepted = await post_hook(http, stack, _new_pr())
            assert accepted.status_code == 202, accepted.text
            run_id = accepted.json()["run_id"]
            await events.wait_for("agent.task.offered", run_id=run_id, timeout_s=WAIT_S)
            await eventually(
                lambda: _run(http, stack, run_id, "waiting_for_agent"), WAIT_S, "the run waiting for its agent"
            )

            stack.services["run-executor"].kill9()  # mid-task: the run is parked on the agent's action
            stack.restart("run-executor")
            agent = await _start_agent(stack, agent_log)
            (request,) = await eventually(
                lambda: _pending(http, stack, run_id), WAIT_S, "alice's inbox to show the question"
            )
            await eventually(lambda: _run(http, stack, run_id, "waiting_for_human"), WAIT_S, "the run parked")

            stack.services["agent-collab"].kill9()  # mid-task: the run is parked, the agent polls a dead service
            stack.restart("agent-collab")
            answered = await http.post(
                f"{stack.human_url}/requests/{request['id']}/answer", json={"option_id": "no"}, headers=ALICE
            )
            assert answered.status_code == 200, answered.text
            done = await eventually(lambda: _run(http, stack, run_id, "completed"), WAIT_S, "the run completed")
            assert "no" in done["result"]
            assert await asyncio.wait_for(agent.wait(), WAIT_S) == 0, agent_log.read_text()
            journal = await eventually(
                lambda: _journaled(http, stack, run_id, "run.completed", "agent.task.acted"), WAIT_S, "the journal"
            )
            types = [e["type"] for e in journal]
            assert types.count("human.requested") == 1, types
            assert types.count("run.completed") == 1, types
            assert sorted(e["data"]["turn"] for e in journal if e["type"] == "agent.task.offered") == [1, 2], types
            assert [e["data"]["kind"] for e in journal if e["type"] == "agent.task.acted"] == ["tool_calls", "result"]
    finally:
        await stop_processes(agent)
        await events.close()


async def test_a_run_cancelled_while_its_agent_works_ends_the_wait_at_once_and_the_agent_is_told(
    external_stack: Stack, tmp_path: Path
) -> None:
    """The agent takes the task and works on it (``--think-s``: no action yet) while the run is parked on it.
    An operator cancels the run: the wait ends at once (not at the agent's 600 s budget), the run is cancelled --
    not failed --, the task's end is journaled, and the agent, told in its next poll, drops the task."""
    stack = external_stack
    events = await EventLog.connect(stack.nats.url, since=datetime.now(UTC))
    agent_log = tmp_path / "agent.log"
    agent = await _start_agent(stack, agent_log, "--think-s", "300")
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            await events.wait_for("agent.registered", timeout_s=WAIT_S)
            accepted = await post_hook(http, stack, _new_pr())
            assert accepted.status_code == 202, accepted.text
            run_id = accepted.json()["run_id"]
            await events.wait_for("agent.task.taken", run_id=run_id, timeout_s=WAIT_S)
            await eventually(
                lambda: _run(http, stack, run_id, "waiting_for_agent"), WAIT_S, "the run waiting for its agent"
            )

            loop = asyncio.get_running_loop()
            asked_at = loop.time()
            cancel = await http.post(
                f"{stack.journal_url}/runs/{run_id}/cancel", json={"reason": "not needed"}, headers=OPERATOR
            )
            assert cancel.status_code == 202, cancel.text
            # the agent thinks for 300 s before it acts (its budget is 600 s): a run that ends well before that was
            # ended by the cancel, not by the agent (a generous bound: the shared machine can be very loaded)
            (cancelled,) = await events.wait_for("run.cancelled", run_id=run_id, timeout_s=150)
            took = loop.time() - asked_at
            assert took < 150, f"the cancel took {took:.1f} s to end the wait"
            assert "not needed" in cancelled.data["reason"]
            (ended,) = await events.wait_for("agent.task.ended", run_id=run_id, timeout_s=WAIT_S)
            assert (ended.data["state"], ended.data["cause"], ended.data["taken"]) == (
                "cancelled",
                "run.cancelled",
                True,
            )
            # told at its next poll, the agent drops the task: its one task is over, it exits cleanly
            assert await asyncio.wait_for(agent.wait(), WAIT_S) == 0, agent_log.read_text()
            assert "cancelled (its run" in agent_log.read_text(), agent_log.read_text()
            journal = await eventually(
                lambda: _journaled(http, stack, run_id, "run.cancelled", "agent.task.ended"), WAIT_S, "the journal"
            )
            types = [e["type"] for e in journal]
            assert "run.failed" not in types, types
            assert "human.requested" not in types, types  # it never acted
            assert ended.causationid == cancelled.id  # the task ended with its run
            _caused_by_earlier(events.events, run_id)
            assert types.count("agent.task.offered") == 1, types
            assert await _run(http, stack, run_id, "cancelled")
    finally:
        await stop_processes(agent)
        await events.close()
