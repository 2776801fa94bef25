"""External agents' tasks (AP-5, AP-7..AP-9) against a real nats-server, agent-collab in-process.

The test plays both the run-executor (it publishes ``agent.task.offered`` and ``run.cancelled``) and the external
agent (signed requests on ``temporality.rpc.agents.tasks`` / ``.act``): the dialogue's state machine is checked
message by message -- in-order actions accepted once, a repeat answered ``duplicate``, out-of-order ones refused
with a reason and journaled as ``agent.task.refused``, unsigned and replayed ones refused by the gate
(``agent.message_refused``), checkpoints stored and handed back on a resume, streaming events journaled with the
saga's correlation id.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from collab_replicas import StartCollab, collab_replicas
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from temporality_agent_collab.external import AllowList
from temporality_agent_collab.signing import public_key_text, sign
from temporality_agent_collab.tasks import TaskBoard
from temporality_bus import Bus, NatsSettings, TransientError
from temporality_protocol import (
    AgentMessageRefused,
    AgentTask,
    AgentTaskActed,
    AgentTaskCheckpointed,
    AgentTaskEnded,
    AgentTaskOffered,
    AgentTaskRefused,
    AgentTaskStreamed,
    AgentTaskTaken,
    Envelope,
    RunCancelled,
    TaskAction,
    TaskInput,
    TaskPoll,
    make_event,
)
from temporality_protocol.agent_tasks import TaskRecord, task_id_for, task_key
from temporality_protocol.catalog import (
    BUCKET_AGENT_TASKS,
    RPC_AGENTS_HEARTBEAT,
    RPC_AGENTS_LIST,
    RPC_AGENTS_REGISTER,
    RPC_AGENTS_TASKS_ACT,
    RPC_AGENTS_TASKS_POLL,
    agent_subject,
)
from temporality_testing.events import EventLog
from temporality_testing.waiting import eventually, stays

WAIT_S = 10.0
KEY = Ed25519PrivateKey.generate()
AGENT = "task-bot"
SAGA = "saga-ext-1"


#: The allow-list of the ``collab`` fixture, for a task board the test opens itself.
ALLOW = AllowList.model_validate(
    {
        "agents": [
            {"id": AGENT, "allowed_tools": ["ask_human", "notify"], "public_key": public_key_text(KEY.public_key())}
        ]
    }
)


@pytest.fixture
async def start_agent_collab(nats_settings: NatsSettings) -> AsyncIterator[StartCollab]:
    async with collab_replicas(nats_settings) as start:
        yield start


@pytest.fixture
async def collab(start_agent_collab: StartCollab, tmp_path: Path) -> None:
    path = tmp_path / "external-agents.yaml"
    path.write_text(
        f"heartbeat_interval_s: 30\nagents:\n  - id: {AGENT}\n    allowed_tools: [ask_human, notify]\n"
        f"    public_key: {public_key_text(KEY.public_key())}\n",
        encoding="utf-8",
    )
    await start_agent_collab(path)


def _signed(subject: str, body: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    raw = json.dumps(body).encode()
    return raw, sign(
        KEY, agent_subject(subject, AGENT), AGENT, raw, timestamp=int(time.time()), nonce=secrets.token_urlsafe(16)
    )


async def _send(bus: Bus, subject: str, raw: bytes, headers: dict[str, str] | None) -> dict[str, Any]:
    mine = agent_subject(subject, AGENT)  # the agent's own subject
    reply: dict[str, Any] = json.loads((await bus.nc.request(mine, raw, timeout=10, headers=headers)).data)
    return reply


async def call(bus: Bus, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    return await _send(bus, subject, *_signed(subject, body))


async def register(bus: Bus) -> None:
    body = {
        "agent_id": AGENT,
        "protocol_version": "1.0",
        "provider": "acme",
        "model": "m",
        "supported_tools": ["ask_human", "notify", "shell"],
        "max_context_size": 1000,
    }
    assert (await call(bus, RPC_AGENTS_REGISTER, body))["outcome"] == "registered"
    beat = {"agent_id": AGENT, "timestamp": "2026-12-01T00:00:00Z", "current_state": "idle", "protocol_version": "1.0"}
    assert (await call(bus, RPC_AGENTS_HEARTBEAT, beat))["accepted"]


def task_for(run_id: str) -> AgentTask:
    return AgentTask(
        run_id=run_id,
        task_id=task_id_for(run_id),
        objective="Triage PR #42",
        context={"people": ["user:alice"]},
        constraints={"tools": ["ask_human"]},
        acceptance_criteria=["a person decided"],
        timeout_s=600,
        priority="normal",
    )


async def offer(bus: Bus, run_id: str, turn: int, inputs: list[TaskInput] | None = None) -> None:
    data = AgentTaskOffered(
        run_id=run_id,
        task_id=task_id_for(run_id),
        agent_id=AGENT,
        turn=turn,
        task=task_for(run_id),
        inputs=inputs or [],
    )
    event = make_event(data, source="/test/run-executor", run_id=run_id, correlation_id=SAGA)
    await bus.publish(event)

    async def at_turn() -> bool:
        found = await (await bus.store(BUCKET_AGENT_TASKS, TaskRecord)).get(task_key(AGENT, task_id_for(run_id)))
        return found is not None and found.value.turn == turn

    await eventually(at_turn, timeout_s=WAIT_S, what=f"turn {turn} of {run_id} recorded")


async def poll(bus: Bus, session: str = "s1") -> dict[str, Any]:
    return await call(bus, RPC_AGENTS_TASKS_POLL, {"agent_id": AGENT, "protocol_version": "1.0", "session_id": session})


def action(run_id: str, turn: int, what: str, kind: str, **fields: Any) -> dict[str, Any]:
    task_id = task_id_for(run_id)
    return {
        "agent_id": AGENT,
        "protocol_version": "1.0",
        "task_id": task_id,
        "turn": turn,
        "action_id": f"{task_id}:{turn}:{what}",
        "kind": kind,
        **fields,
    }


ASK = {"name": "ask_human", "arguments": {"recipient": "user:alice", "question": "Go ahead?"}}


def reason(reply: dict[str, Any]) -> str:
    assert not reply["accepted"], reply
    value: str = reply["refusal"]["reason"]
    return value


async def refused(log: EventLog, why: str) -> list[Any]:
    return await log.wait_for(AgentTaskRefused.EVENT_TYPE, where=lambda e: e.data["reason"] == why, timeout_s=WAIT_S)


async def test_the_task_dialogue_in_order_and_out_of_order(bus: Bus, event_log: EventLog, collab: None) -> None:
    await register(bus)
    run_id = "run-ext-dialogue"
    task_id = task_id_for(run_id)
    # an action for a task never assigned: refused, journaled
    assert reason(await call(bus, RPC_AGENTS_TASKS_ACT, action(run_id, 1, "act", "tool_calls", calls=[ASK]))) == (
        "unknown_task"
    )
    await refused(event_log, "unknown_task")
    assert (await poll(bus))["tasks"] == []

    await offer(bus, run_id, 1)
    # offered but not taken yet: acting first is out of order
    assert reason(await call(bus, RPC_AGENTS_TASKS_ACT, action(run_id, 1, "early", "result", result="x"))) == (
        "not_taken"
    )
    taken = await poll(bus)
    async with asyncio.timeout(10):  # agent-collab consumes the offer on its own: poll until it has
        while not taken["tasks"]:
            await asyncio.sleep(0.05)
            taken = await poll(bus)
    (assignment,) = taken["tasks"]
    assert (assignment["turn"], assignment["state"], assignment["acted"], assignment["resumed"]) == (
        1,
        "working",
        False,
        False,
    )
    assert assignment["task"]["objective"] == "Triage PR #42"
    assert assignment["checkpoint"] is None
    (took,) = await event_log.wait_for(AgentTaskTaken.EVENT_TYPE, timeout_s=WAIT_S)
    assert (took.data["take"], took.data["resumed"]) == (1, False)

    # streaming (AP-9) and a checkpoint (AP-7) while it holds the task
    progress = action(run_id, 1, "p1", "event", event={"kind": "progress", "message": "reading", "data": {"pct": 10}})
    assert (await call(bus, RPC_AGENTS_TASKS_ACT, progress))["accepted"]
    (streamed,) = await event_log.wait_for(AgentTaskStreamed.EVENT_TYPE, timeout_s=WAIT_S)
    assert streamed.runid == run_id
    assert (streamed.data["kind"], streamed.data["correlation_id"], streamed.data["request_id"]) == (
        "progress",
        SAGA,
        task_id,
    )
    ckpt = action(run_id, 1, "c1", "checkpoint", checkpoint={"execution_state": {"step": "asking"}})
    stored = await call(bus, RPC_AGENTS_TASKS_ACT, ckpt)
    assert stored["accepted"]
    assert stored["checkpoint_id"]
    await event_log.wait_for(AgentTaskCheckpointed.EVENT_TYPE, timeout_s=WAIT_S)

    # a tool outside the agent's granted ones (it declared shell; the allow-list does not grant it)
    shell = action(run_id, 1, "sh", "tool_calls", calls=[{"name": "shell", "arguments": {}}])
    assert reason(await call(bus, RPC_AGENTS_TASKS_ACT, shell)) == "tool_not_allowed"
    # the turn's action: accepted once; the same action again is a duplicate; another one is refused
    ask = action(run_id, 1, "act", "tool_calls", calls=[ASK])
    first = await call(bus, RPC_AGENTS_TASKS_ACT, ask)
    assert (first["accepted"], first["duplicate"], first["state"]) == (True, False, "acted")
    again = await call(bus, RPC_AGENTS_TASKS_ACT, ask)  # signed afresh: a retry, not a replay
    assert (again["accepted"], again["duplicate"]) == (True, True)
    other = action(run_id, 1, "other", "result", result="done already")
    assert reason(await call(bus, RPC_AGENTS_TASKS_ACT, other)) == "turn_closed"
    assert reason(await call(bus, RPC_AGENTS_TASKS_ACT, action(run_id, 2, "act2", "result", result="x"))) == (
        "wrong_turn"
    )
    for why in ("turn_closed", "wrong_turn", "tool_not_allowed", "not_taken"):
        await refused(event_log, why)
    acted = await event_log.wait_for(AgentTaskActed.EVENT_TYPE, timeout_s=WAIT_S)
    assert [(e.data["turn"], e.data["kind"], e.data["tools"]) for e in acted] == [(1, "tool_calls", ["ask_human"])]
    assert (await poll(bus))["tasks"][0]["acted"] is True

    # the run offers turn 2 with the person's answer; the result completes the task
    answer = TaskInput(tool_call_id="ext-1-0", tool="ask_human", content='{"answer": "yes"}')
    await offer(bus, run_id, 2, [answer])
    (second,) = (await poll(bus))["tasks"]
    assert (second["turn"], second["acted"], second["inputs"]) == (2, False, [answer.model_dump()])
    assert second["checkpoint"]["execution_state"] == {"step": "asking"}
    done = await call(bus, RPC_AGENTS_TASKS_ACT, action(run_id, 2, "result", "result", result="Decided: yes"))
    assert (done["accepted"], done["state"]) == (True, "completed")
    assert (await poll(bus))["tasks"] == []
    # an action after the task ended
    late = action(run_id, 2, "late", "event", event={"kind": "log", "message": "bye"})
    assert reason(await call(bus, RPC_AGENTS_TASKS_ACT, late)) == "task_ended"
    await refused(event_log, "task_ended")
    acted = await event_log.wait_for(AgentTaskActed.EVENT_TYPE, count=2, timeout_s=WAIT_S)
    assert [e.data["kind"] for e in acted] == ["tool_calls", "result"]


async def test_unsigned_and_replayed_task_messages_are_refused_and_audited(
    bus: Bus, event_log: EventLog, collab: None
) -> None:
    await register(bus)
    run_id = "run-ext-signed"
    await offer(bus, run_id, 1)
    await poll(bus)
    body = action(run_id, 1, "act", "tool_calls", calls=[ASK])
    unsigned = await _send(bus, RPC_AGENTS_TASKS_ACT, json.dumps(body).encode(), None)
    assert reason(unsigned) == "unsigned"
    # the refusal names the action's task (as the body claimed it), so the agent can tell which one was refused
    assert unsigned["task_id"] == body["task_id"] != ""
    # a body nested past the JSON parser's depth is refused all the same, with no task id to echo
    nested = await _send(bus, RPC_AGENTS_TASKS_ACT, b"[" * 50_000 + b"]" * 50_000, None)
    assert (reason(nested), nested["task_id"]) == ("unsigned", "")
    raw, headers = _signed(RPC_AGENTS_TASKS_ACT, body)
    assert (await _send(bus, RPC_AGENTS_TASKS_ACT, raw, headers))["accepted"]
    assert reason(await _send(bus, RPC_AGENTS_TASKS_ACT, raw, headers)) == "replayed_nonce"
    gate = await event_log.wait_for(AgentMessageRefused.EVENT_TYPE, count=3, timeout_s=WAIT_S)
    assert sorted((e.data["reason"], e.data["subject"]) for e in gate) == [
        ("replayed_nonce", agent_subject(RPC_AGENTS_TASKS_ACT, AGENT)),
        ("unsigned", agent_subject(RPC_AGENTS_TASKS_ACT, AGENT)),
        ("unsigned", agent_subject(RPC_AGENTS_TASKS_ACT, AGENT)),  # the over-nested body
    ]
    # the refused copies changed nothing: one action
    record = await (await bus.store(BUCKET_AGENT_TASKS, TaskRecord)).get(task_key(AGENT, task_id_for(run_id)))
    assert record is not None
    assert len(record.value.actions) == 1


async def test_a_new_session_resumes_from_the_checkpoint_and_a_run_end_ends_the_task(
    bus: Bus, event_log: EventLog, collab: None
) -> None:
    await register(bus)
    run_id = "run-ext-resume"
    await offer(bus, run_id, 1)
    await poll(bus, session="before-crash")
    ckpt = action(run_id, 1, "c1", "checkpoint", checkpoint={"checkpoint_id": "mine-1", "memory_snapshot": {"k": 1}})
    assert (await call(bus, RPC_AGENTS_TASKS_ACT, ckpt))["checkpoint_id"] == "mine-1"
    assert (await poll(bus, session="before-crash"))["tasks"][0]["resumed"] is False  # the same process: no resume
    (back,) = (await poll(bus, session="after-crash"))["tasks"]
    assert (back["resumed"], back["turn"], back["checkpoint"]["checkpoint_id"]) == (True, 1, "mine-1")
    assert back["checkpoint"]["memory_snapshot"] == {"k": 1}
    takes = await event_log.wait_for(AgentTaskTaken.EVENT_TYPE, count=2, timeout_s=WAIT_S)
    assert [(e.data["take"], e.data["resumed"], e.data["checkpoint_id"]) for e in takes] == [
        (1, False, None),
        (2, True, "mine-1"),
    ]
    # the run is cancelled: the task ends with it, and the agent's next action is refused
    cancelled = make_event(RunCancelled(run_id=run_id, reason="operator"), source="/test/run-executor", run_id=run_id)
    await bus.publish(cancelled)

    async def ended() -> bool:
        found = await (await bus.store(BUCKET_AGENT_TASKS, TaskRecord)).get(task_key(AGENT, task_id_for(run_id)))
        return found is not None and found.value.state.value == "cancelled"

    await eventually(ended, timeout_s=WAIT_S, what="the task cancelled with its run")
    (journaled,) = await event_log.wait_for(AgentTaskEnded.EVENT_TYPE, run_id=run_id, timeout_s=WAIT_S)
    assert (journaled.data["state"], journaled.data["cause"], journaled.data["taken"]) == (
        "cancelled",
        "run.cancelled",
        True,
    )
    # the agent is told once, at its next poll, so it stops working on it; then the task is gone
    (told,) = (await poll(bus, session="after-crash"))["tasks"]
    assert (told["task"]["task_id"], told["state"], told["turn"]) == (task_id_for(run_id), "cancelled", 1)
    assert (await poll(bus, session="after-crash"))["tasks"] == []
    assert reason(await call(bus, RPC_AGENTS_TASKS_ACT, action(run_id, 1, "act", "tool_calls", calls=[ASK]))) == (
        "task_ended"
    )
    # the same run.cancelled again (a redelivery, a replay): one journaled end, nothing told twice
    await bus.publish(cancelled)
    await stays(
        lambda: len(event_log.of_type(AgentTaskEnded.EVENT_TYPE, run_id)) == 1,
        settle_s=1.0,
        what="one agent.task.ended for the run",
    )
    assert (await poll(bus, session="after-crash"))["tasks"] == []


async def test_a_cancelled_task_never_taken_is_journaled_but_nobody_is_told(
    bus: Bus, event_log: EventLog, collab: None
) -> None:
    await register(bus)
    run_id = "run-ext-untaken"
    await offer(bus, run_id, 1)
    await bus.publish(make_event(RunCancelled(run_id=run_id, reason="x"), source="/test/run-executor", run_id=run_id))
    (journaled,) = await event_log.wait_for(AgentTaskEnded.EVENT_TYPE, run_id=run_id, timeout_s=WAIT_S)
    assert (journaled.data["state"], journaled.data["taken"]) == ("cancelled", False)
    assert (await poll(bus))["tasks"] == []


async def test_a_take_whose_event_was_not_published_is_announced_at_the_next_poll(
    bus: Bus, event_log: EventLog, collab: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The take is stored before ``agent.task.taken`` is published: when that publish fails, the next poll
    (the record already taken, nothing to change) publishes it, once; later polls publish nothing."""
    await register(bus)
    run_id = "run-ext-announce"
    await offer(bus, run_id, 1)
    board = await TaskBoard.open(bus, None, ALLOW)  # type: ignore[arg-type]  # poll() never uses the gate
    real = bus.publish
    failures = [TransientError("the bus is away")]

    async def publish(event: Envelope) -> Any:
        if event.type == AgentTaskTaken.EVENT_TYPE and failures:
            raise failures.pop()
        return await real(event)

    monkeypatch.setattr(bus, "publish", publish)
    body = TaskPoll(agent_id=AGENT, protocol_version="1.0", session_id="s1")
    with pytest.raises(TransientError):
        await board.poll(body)
    tasks = await bus.store(BUCKET_AGENT_TASKS, TaskRecord)
    stored = await tasks.get(task_key(AGENT, task_id_for(run_id)))
    assert stored is not None
    assert (stored.value.take, stored.value.taken_announced) == (1, None)  # taken, not announced
    assert event_log.of_type(AgentTaskTaken.EVENT_TYPE, run_id) == []

    (task,) = (await board.poll(body)).tasks
    assert task.turn == 1
    await event_log.wait_for(AgentTaskTaken.EVENT_TYPE, count=1, timeout_s=WAIT_S)
    stored = await tasks.get(task_key(AGENT, task_id_for(run_id)))
    assert stored is not None
    assert stored.value.taken_announced == "1.1"
    await board.poll(body)
    await stays(
        lambda: len(event_log.of_type(AgentTaskTaken.EVENT_TYPE, run_id)) == 1,
        settle_s=1.0,
        what="one agent.task.taken for the take",
    )


async def test_an_action_stored_but_never_announced_is_announced_when_agent_collab_starts_again(
    bus: Bus,
    event_log: EventLog,
    collab: None,
    start_agent_collab: StartCollab,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """agent-collab dies between committing an action and publishing ``agent.task.acted`` (here its publish fails:
    the action is stored, neither the event nor the reply goes out) and the agent never sends the action again:
    the run parked on it would wait for its timer. The next agent-collab to start announces it, under the turn's
    event id, and notes it in the record; a later start announces nothing."""
    await register(bus)
    run_id = "run-ext-unannounced"
    await offer(bus, run_id, 1)
    await poll(bus)  # taken
    board = await TaskBoard.open(bus, None, ALLOW)  # type: ignore[arg-type]  # act() never uses the gate
    real = bus.publish

    async def dies_before_the_publish(event: Envelope) -> Any:
        if event.type == AgentTaskActed.EVENT_TYPE:
            raise TransientError("agent-collab died here")
        return await real(event)

    monkeypatch.setattr(bus, "publish", dies_before_the_publish)
    body = TaskAction.model_validate(action(run_id, 1, "result", "result", result="decided"))
    with pytest.raises(TransientError):
        await board.act(body)
    monkeypatch.setattr(bus, "publish", real)
    tasks = await bus.store(BUCKET_AGENT_TASKS, TaskRecord)
    key = task_key(AGENT, task_id_for(run_id))
    stored = await tasks.get(key)
    assert stored is not None
    assert ([a.action_id for a in stored.value.actions], stored.value.acted_announced) == ([body.action_id], None)
    assert event_log.of_type(AgentTaskActed.EVENT_TYPE, run_id) == []

    await start_agent_collab(tmp_path / "external-agents.yaml")  # agent-collab starts again
    (acted,) = await event_log.wait_for(AgentTaskActed.EVENT_TYPE, run_id=run_id, timeout_s=WAIT_S)
    assert (acted.data["turn"], acted.data["kind"], acted.data["action_id"]) == (1, "result", body.action_id)
    assert acted.id == board._acted_event(stored.value, stored.value.actions[0]).id  # what the dead one would have sent

    async def noted() -> bool:
        found = await tasks.get(key)
        return found is not None and found.value.acted_announced == 1

    await eventually(noted, timeout_s=WAIT_S, what="the announcement noted in the record")
    assert await board.announce_actions() == 0, "announced once: a later start has nothing to announce"
    # the agent's retry of the same action (signed afresh) is a duplicate and republishes the same event id
    again = await call(bus, RPC_AGENTS_TASKS_ACT, action(run_id, 1, "result", "result", result="decided"))
    assert (again["accepted"], again["duplicate"]) == (True, True), again
    await stays(
        lambda: len(event_log.of_type(AgentTaskActed.EVENT_TYPE, run_id)) == 1,
        settle_s=1.0,
        what="one agent.task.acted for the action",
    )


async def test_a_tool_the_allow_list_no_longer_grants_is_refused_before_the_agent_registers_again(
    bus: Bus, event_log: EventLog, start_agent_collab: StartCollab, tmp_path: Path
) -> None:
    """AP-11: the operator revokes ``ask_human`` in the allow-list and restarts agent-collab. The agent registered
    before keeps its stored policy until it registers again, but its grant is the stored one *within* the
    allow-list as it is now: the revoked tool is refused at once (``tool_not_allowed``, journaled), ``notify``
    still accepted."""
    path = tmp_path / "external-agents.yaml"
    entry = "heartbeat_interval_s: 30\nagents:\n  - id: {agent}\n    allowed_tools: {tools}\n    public_key: {key}\n"
    key = public_key_text(KEY.public_key())
    path.write_text(entry.format(agent=AGENT, tools="[ask_human, notify]", key=key), encoding="utf-8")
    stop = await start_agent_collab(path)
    await register(bus)
    await stop()
    path.write_text(entry.format(agent=AGENT, tools="[notify]", key=key), encoding="utf-8")  # ask_human revoked
    await start_agent_collab(path)

    run_id = "run-ext-revoked"
    await offer(bus, run_id, 1)
    await eventually(lambda: _has_task(bus, run_id), timeout_s=WAIT_S, what=f"{run_id} polled")
    reply = await call(bus, RPC_AGENTS_TASKS_ACT, action(run_id, 1, "ask", "tool_calls", calls=[ASK]))
    assert reason(reply) == "tool_not_allowed"
    assert "ask_human" in reply["refusal"]["detail"]
    (event,) = await refused(event_log, "tool_not_allowed")
    assert event.data["task_id"] == task_id_for(run_id)
    tell = {"name": "notify", "arguments": {"recipient": "user:alice", "message": "FYI"}}
    assert (await call(bus, RPC_AGENTS_TASKS_ACT, action(run_id, 1, "tell", "tool_calls", calls=[tell])))["accepted"]
    # and its card no longer advertises the revoked tool (get_collaborators, agents.list)
    listing = await call(bus, RPC_AGENTS_LIST, {"agent_id": AGENT, "protocol_versions": ["1.0"]})
    (card,) = [c for c in listing["agents"] if c["agent_id"] == AGENT]
    assert card["allowed_tools"] == ["notify"]


async def _has_task(bus: Bus, run_id: str) -> bool:
    return any(t["task"]["run_id"] == run_id for t in (await poll(bus))["tasks"])
