"""Agent collaboration end to end: the run-executor and agent-collab in-process on one nats-server, scripted
agents in one saga (COL-2..COL-7, PRO-1).

``lead`` asks ``expert`` asynchronously (the answer arrives as a message), then in ``wait`` mode (answered
in time), then in ``wait`` mode with a 1 s timeout (it times out, and the late answer still arrives as a
message), then asks ``archivist``, whose run has finished (a relay run answers). ``expert`` answers each
request once it is back at a turn boundary, and its second answer to the same request is refused
locally. Nobody else is running: the test plays the person the agents park on (``human.answered``)
to let each run reach its next turn boundary at a chosen moment.

The second test: ``asker`` asks ``outsider``, which is live but in another saga (refused as
``unknown_addressee``, COL-7), then asks ``replier`` asynchronously and finishes; ``replier`` answers
after that (COL-3: ``agent.replied`` journaled, the run told there was nowhere to deliver it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from collab_support import let_go, request_run

from temporality_agent_collab.__main__ import SPEC as COLLAB_SPEC
from temporality_agent_collab.__main__ import configure as configure_collab
from temporality_agent_collab.settings import Settings as CollabSettings
from temporality_bus import Bus, NatsSettings
from temporality_protocol import (
    HumanRequested,
)
from temporality_protocol.catalog import BUCKET_CHECKPOINTS
from temporality_run_executor.__main__ import SPEC as EXECUTOR_SPEC
from temporality_run_executor.__main__ import configure as configure_executor
from temporality_run_executor.records import Checkpoint
from temporality_run_executor.settings import Settings as ExecutorSettings
from temporality_service import run_until
from temporality_testing.events import EventLog
from temporality_testing.inprocess import serving

SAGA = "saga-collab-1"


def _hold(step: str) -> dict[str, Any]:
    return {"id": step, "call": {"tool": "ask_human", "args": {"recipient": "user:alice", "question": step}}}


def _ask(step: str, to: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"id": step, "call": {"tool": "ask_agent", "args": {"to": to, "message": message, **extra}}}


def _reply(step: str, answer: str) -> dict[str, Any]:
    args = {"request_id": "{{ run.asks[0] }}", "answer": answer}
    return {"id": step, "when": "length(run.asks) > `0`", "call": {"tool": "answer_agent", "args": args}}


LEAD = [
    _ask("ask_async", "agent:expert", "Q1: is v1 still used?"),
    _hold("hold_a"),
    _ask("ask_wait", "agent:expert", "Q2: keep v1?", mode="wait", timeout=30),
    _ask("ask_short", "agent:expert", "Q3: quick?", mode="wait", timeout=1),
    _hold("hold_b"),
    _ask("ask_relay", "agent:archivist", "Q4: any history?", mode="wait", timeout=30),
    {
        "id": "done",
        "answer": "wait={{ results.ask_wait.answer }} | short={{ results.ask_short.status }} | "
        "relay={{ results.ask_relay.answer }} | mail={{ join(' / ', run.mail[].text) }}",
    },
]
EXPERT = [
    _hold("hold_1"),
    _reply("reply_1", "Answer one"),
    {
        "id": "again",
        "when": "results.reply_1 != null",
        "call": {"tool": "answer_agent", "args": {"request_id": "{{ results.reply_1.request_id }}", "answer": "Again"}},
    },
    _hold("hold_2"),
    _reply("reply_2", "Answer two"),
    _hold("hold_3"),
    _reply("reply_3", "Answer three"),
    {"id": "done", "answer": "again={{ results.again.error }}"},
]
#: Finishes at once; as a relay run (asked after it finished) it answers first.
ARCHIVIST: list[dict[str, Any]] = [
    {
        "id": "relay_reply",
        "when": "run.relay",
        "call": {"tool": "answer_agent", "args": {"request_id": "{{ run.asks[0] }}", "answer": "From the archive"}},
    },
    {"id": "done", "answer": "archived"},
]


#: Asks an agent of another saga (refused), then asks ``replier`` asynchronously and finishes at once.
ASKER: list[dict[str, Any]] = [
    _ask("ask_foreign", "agent:outsider", "Q6: who are you?", mode="wait", timeout=30),
    _ask("ask_late", "agent:replier", "Q7: tell me when you can"),
    {"id": "done", "answer": "foreign={{ results.ask_foreign.status }}/{{ results.ask_foreign.reason }}"},
]
#: Answers once let go -- the asker has finished by then -- and reports what it was told at its next boundary.
REPLIER: list[dict[str, Any]] = [
    _hold("r_hold_1"),
    _reply("r_reply", "Too late"),
    _hold("r_hold_2"),
    {
        "id": "done",
        "answer": "sent={{ results.r_reply.status }} | "
        "undelivered={{ join(' / ', run.mail[?kind=='reply_undeliverable'].outcome) }}",
    },
]
#: Live in another saga until let go.
OUTSIDER: list[dict[str, Any]] = [_hold("o_hold"), {"id": "done", "answer": "outside"}]


def _card(agent: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": agent,
        "role": agent,
        "system_prompt": "You collaborate.",
        "tools": {"allow": ["*"]},
        "provider": {"kind": "scripted", "script": {"steps": steps}},
    }


Start = Callable[[], Awaitable[None]]


@pytest.fixture
async def services(nats_settings: NatsSettings, tmp_path: Path) -> AsyncIterator[None]:
    """The run-executor and agent-collab, in-process, ready."""
    agents = tmp_path / "agents.yaml"
    cards = [
        _card("lead", LEAD),
        _card("expert", EXPERT),
        _card("archivist", ARCHIVIST),
        _card("asker", ASKER),
        _card("replier", REPLIER),
        _card("outsider", OUTSIDER),
    ]
    agents.write_text(yaml.safe_dump({"agents": cards}), encoding="utf-8")
    executor = ExecutorSettings(nats=nats_settings, agents_file=agents)
    collab = CollabSettings(nats=nats_settings)
    async with serving(
        ("run-executor", lambda s, r: run_until(EXECUTOR_SPEC, executor, configure_executor(executor), s, ready=r)),
        ("agent-collab", lambda s, r: run_until(COLLAB_SPEC, collab, configure_collab(collab), s, ready=r)),
        ready_within_s=15,
        stop_within_s=20,
    ):
        yield


async def _start(bus: Bus, agent: str, saga: str = SAGA) -> str:
    return await request_run(bus, f"run-{agent}-1", agent, saga)


async def _let_go(bus: Bus, log: EventLog, run_id: str, step: str) -> None:
    """Answer the run's ask_human of ``step`` (the scripts park on a person between their steps)."""
    (found,) = await log.wait_for(
        "human.requested", run_id=run_id, where=lambda e: e.payload(HumanRequested).question == step
    )
    await let_go(bus, found.payload(HumanRequested), run_id, waited_s=0.1)


async def _inbox(bus: Bus, run_id: str, kind: str, timeout_s: float = 10) -> None:
    """Wait until the run has an agent message of ``kind`` queued (so it is there at its next boundary)."""
    store = await bus.store(BUCKET_CHECKPOINTS, Checkpoint)
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                got = await store.get(run_id)
                if got is not None and any(m.kind == kind for m in got.value.inbox):
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"no {kind} queued for {run_id} within {timeout_s}s") from None


@pytest.mark.usefixtures("services")
async def test_two_agents_ask_answer_wait_time_out_and_relay_in_one_saga(bus: Bus, event_log: EventLog) -> None:
    archivist = await _start(bus, "archivist")
    await event_log.wait_for("run.completed", run_id=archivist)
    expert = await _start(bus, "expert")
    await event_log.wait_for("human.requested", run_id=expert)
    lead = await _start(bus, "lead")

    # async: sent at once; the answer comes back as a message at lead's next boundary
    await _inbox(bus, expert, "ask")
    await _let_go(bus, event_log, expert, "hold_1")
    await _inbox(bus, lead, "answer")
    await _let_go(bus, event_log, lead, "hold_a")
    # wait: lead parks; expert answers at its next boundary, in time
    await _inbox(bus, expert, "ask")
    await _let_go(bus, event_log, expert, "hold_2")
    # wait with a 1 s timeout: lead resumes without an answer; the late one still comes, as a message
    await event_log.wait_for("agent.ask_expired", run_id=lead, timeout_s=15)
    await _inbox(bus, expert, "ask")
    await _let_go(bus, event_log, expert, "hold_3")
    (late,) = await event_log.wait_for("agent.answer.received", run_id=lead, where=lambda e: e.data["late"])
    await _inbox(bus, lead, "answer")
    await _let_go(bus, event_log, lead, "hold_b")
    # a finished agent: a relay run of it answers
    (done,) = await event_log.wait_for("run.completed", run_id=lead, timeout_s=20)
    assert done.data["result"] == (
        "wait=Answer two | short=timed_out | relay=From the archive | mail=Answer one / Answer three"
    )
    assert late.data["answer"] == "Answer three"
    (expert_done,) = await event_log.wait_for("run.completed", run_id=expert)
    assert "already answered" in expert_done.data["result"]
    relay = f"{archivist}/ask/01"
    (relay_done,) = await event_log.wait_for("run.completed", run_id=relay)
    assert relay_done.data["result"] == "archived"
    await event_log.caught_up()
    # each of expert's requests answered once: its second answer never left the run
    assert len(event_log.of_type("agent.replied", expert)) == 3
    assert len(event_log.of_type("agent.replied", relay)) == 1
    assert len(event_log.of_type("agent.asked", lead)) == 4
    assert not event_log.of_type("agent.reply_undeliverable")
    assert not event_log.of_type("bus.dead_lettered")


@pytest.mark.usefixtures("services")
async def test_a_foreign_addressee_is_refused_and_a_reply_to_a_finished_asker_is_journaled_and_reported(
    bus: Bus, event_log: EventLog
) -> None:
    outsider = await _start(bus, "outsider", saga="saga-collab-other")
    await event_log.wait_for("human.requested", run_id=outsider)
    replier = await _start(bus, "replier")
    await event_log.wait_for("human.requested", run_id=replier)
    asker = await _start(bus, "asker")

    # COL-7: outsider is live, but in another saga: the wait ends at once, refused like an unknown agent
    (done,) = await event_log.wait_for("run.completed", run_id=asker, timeout_s=20)
    assert done.data["result"] == "foreign=undeliverable/unknown_addressee"
    (refused,) = event_log.of_type("agent.ask_undeliverable", asker)
    assert refused.data["to"] == "agent:outsider"
    assert refused.data["reason"] == "unknown_addressee"

    # COL-3: replier answers after the asker has finished: journaled, and replier is told at its next boundary
    await _inbox(bus, replier, "ask")
    await _let_go(bus, event_log, replier, "r_hold_1")
    (replied,) = await event_log.wait_for("agent.replied", run_id=replier)
    (undelivered,) = await event_log.wait_for("agent.reply_undeliverable", run_id=replier)
    assert undelivered.data["request_id"] == replied.data["request_id"]
    assert undelivered.data["reason"] == "asker_finished"
    assert undelivered.data["asker_run_id"] == asker
    await _inbox(bus, replier, "reply_undeliverable")
    await _let_go(bus, event_log, replier, "r_hold_2")
    (replier_done,) = await event_log.wait_for("run.completed", run_id=replier, timeout_s=20)
    assert replier_done.data["result"] == "sent=sent | undelivered=asker_finished"

    await _let_go(bus, event_log, outsider, "o_hold")
    await event_log.wait_for("run.completed", run_id=outsider)
    await event_log.caught_up()
    assert not event_log.of_type("agent.message.received", outsider)  # nothing ever reached the other saga
    assert not event_log.of_type("agent.answer.received", asker)
    assert len(event_log.of_type("agent.asked", asker)) == 2
    assert len(event_log.of_type("agent.replied", replier)) == 1
    assert not event_log.of_type("bus.dead_lettered")
