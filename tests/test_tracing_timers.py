"""Issue 11: durable timers fire in spans that continue the trace that armed them, in a running stack.

The mechanism is tested at the bus (``libs/bus/tests/test_bus_trace_timers_rpc.py``: nats-server copies the
schedule's headers onto the fired message). Here the five services run as processes exporting to a real OTLP
receiver, and two timers of two services fire for real:

* the run-executor's checkpoint retention (``run-retention``, armed when a run ends: here 1 s after it), whose
  firing is a child of the span in which the run completed;
* agent-collab's heartbeat deadline (``agent-heartbeat``, re-armed by every heartbeat of an external agent:
  the example agent is killed -9, the last arm fires and the agent goes ``offline``), whose firing is a child
  of the span of the last heartbeat it answered, and publishes ``agent.lifecycle_changed`` in that trace.

The stack is the one the tracing scenarios share (``tracing_support.traced_stack``: 1 s heartbeat interval,
0.5 s grace, checkpoint retention 1 s after a run ends) and runs with ``TEMPORALITY_NATS_SOURCE_CHECK=strict``
(the production default; the test suite runs ``claimed``): every event the real services exchange passes the
consumers' sender check.

Each service exports in its own batches, so a child can arrive before its parent: every span read, parents
and ancestors included, is waited for.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import ALICE, ROOT, eventually, post_hook, stop_processes
from tracing_support import (
    Traced,
    completed,
    fresh_pr,
    question,
)

from temporality_embedded import Stack
from temporality_testing.events import EventLog
from temporality_testing.otlp_receiver import ReceivedSpan

#: On the shared traced stack: the session's event loop, where its receiver serves.
pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

AGENT = ROOT / "examples" / "external-agent" / "agent.py"
AGENT_ID = "example-agent"
WAIT_S = 45.0
#: agent-collab answers every agent's heartbeats in one queue subscription: the span names its pattern.
HEARTBEAT_SPAN = "process temporality.rpc.agents.*.heartbeat"


def _firing(spans: list[ReceivedSpan], service: str, subject: str) -> list[ReceivedSpan]:
    return [
        s
        for s in spans
        if s.service == service and s.kind == "consumer" and s.attributes.get("messaging.destination.name") == subject
    ]


def _by_id(spans: list[ReceivedSpan], span_id: str | None) -> ReceivedSpan | None:
    return next((s for s in spans if s.span_id == span_id), None) if span_id else None


def _ancestors_arrived(spans: list[ReceivedSpan], span: ReceivedSpan | None) -> bool:
    """``span`` and every ancestor up to its root have arrived."""
    while span is not None:
        if span.parent_span_id is None:
            return True
        span = _by_id(spans, span.parent_span_id)
    return False


def _chain(spans: list[ReceivedSpan], span: ReceivedSpan) -> list[ReceivedSpan]:
    """``span`` and its ancestors, nearest first (all arrived: see :func:`_ancestors_arrived`)."""
    chain = [span]
    while (parent := _by_id(spans, chain[-1].parent_span_id)) is not None:
        chain.append(parent)
    return chain


def _agent(stack: Stack, log: Path) -> Callable[[], Any]:
    async def start() -> asyncio.subprocess.Process:
        with log.open("ab") as out:
            return await asyncio.create_subprocess_exec(
                *(sys.executable, str(AGENT), "--nats-url", stack.nats.url, "--work", "--poll-s", "0.5"),
                *("--key-file", str(stack.example_agent_key_file)),
                *("--period-s", "0.4"),
                stdout=out,
                stderr=out,
            )

    return start


async def test_the_retention_and_heartbeat_timers_fire_in_the_traces_that_armed_them(
    traced_stack: Traced, session_http: httpx.AsyncClient
) -> None:
    stack, otlp, http = traced_stack.stack, traced_stack.otlp, session_http
    events = await EventLog.connect(stack.nats.url, since=datetime.now(UTC))
    agent = await _agent(stack, traced_stack.root / "agent.log")()
    try:
        # a run completes (alice answers): its checkpoint retention is armed in the completing span
        accepted = await post_hook(http, stack, fresh_pr())
        assert accepted.status_code == 202, accepted.text
        run_id = accepted.json()["run_id"]
        request = await eventually(lambda: question(http, stack, run_id), WAIT_S, "alice's question")
        answered = await http.post(
            f"{stack.human_url}/requests/{request['id']}/answer", json={"option_id": "keep-v1"}, headers=ALICE
        )
        assert answered.status_code == 200, answered.text
        await eventually(lambda: completed(http, stack, run_id), WAIT_S, f"run {run_id} completed")

        # the external agent, registered and heartbeating, is killed -9: its last heartbeat's timer fires
        (registered,) = await events.wait_for("agent.registered", timeout_s=WAIT_S)
        # this agent's heartbeat (an earlier test's example agent, under the same id, heartbeated before it)
        await otlp.wait_for(
            lambda spans: any(
                s.service == "agent-collab" and s.name == HEARTBEAT_SPAN and s.start >= registered.time for s in spans
            ),
            timeout_s=WAIT_S,
            what="a heartbeat of this agent that agent-collab answered",
        )
        killed_at = datetime.now(UTC)
        agent.kill()
        await agent.wait()
        (offline,) = await events.wait_for(
            "agent.lifecycle_changed",
            where=lambda e: e.data["to_state"] == "offline" and e.time >= killed_at,
            timeout_s=WAIT_S,
        )
        assert offline.traceparent is not None
        offline_trace, offline_span = offline.traceparent.split("-")[1:3]

        retention_subject = f"temporality.timers.fired.run-retention.{run_id}"
        heartbeat_subject = f"temporality.timers.fired.agent-heartbeat.{AGENT_ID}"

        def arrived(spans: list[ReceivedSpan]) -> bool:
            resumed = _resumed(spans, run_id)
            return (
                resumed is not None
                and _ancestors_arrived(spans, resumed)
                and bool(_firing(spans, "run-executor", retention_subject))
                and all(_ancestors_arrived(spans, s) for s in _firing(spans, "run-executor", retention_subject))
                and _ancestors_arrived(spans, _by_id(spans, offline_span))
            )

        spans = await otlp.wait_for(arrived, timeout_s=WAIT_S, what="the timers' spans and their ancestors")
    finally:
        await stop_processes(agent)
        await events.close()

    # the retention timer fired in a child of the span that completed the run (the answer's handling),
    # in the webhook's trace
    resumed = _resumed(spans, run_id)
    assert resumed is not None
    intake = _chain(spans, resumed)[-1]
    assert intake.service == "trigger-gateway"
    assert intake.name == "POST /hooks/{trigger_id}"
    firings = _firing(spans, "run-executor", retention_subject)
    for firing in firings:  # (a redelivery would be a sibling: same parent)
        assert firing.trace_id == intake.trace_id
        assert firing.parent_span_id == resumed.span_id
        assert firing.attributes["messaging.consumer.group.name"] == "run-executor-retention"
        assert not firing.error

    # the heartbeat deadline fired in a child of the span of a heartbeat agent-collab answered, and the agent's
    # offline event was published inside that firing's trace
    chain = _chain(spans, _by_id_strict(spans, offline_span))
    fired = next(s for s in chain if s.attributes.get("messaging.destination.name") == heartbeat_subject)
    assert fired.service == "agent-collab"
    assert fired.kind == "consumer"
    assert fired.trace_id == offline_trace
    assert fired.attributes["messaging.consumer.group.name"] == "agent-collab-heartbeats"
    armed_in = _by_id_strict(spans, fired.parent_span_id)
    assert armed_in.service == "agent-collab"
    assert armed_in.kind == "server"
    assert armed_in.name == HEARTBEAT_SPAN
    assert armed_in.trace_id == fired.trace_id
    assert armed_in.parent_span_id is None  # the example agent sends no trace context: its heartbeat is a root


def _resumed(spans: list[ReceivedSpan], run_id: str) -> ReceivedSpan | None:
    """The run-executor's span handling alice's answer (the run resumed and completed in it)."""
    return next(
        (
            s
            for s in spans
            if s.service == "run-executor"
            and s.name == "process temporality.events.human.answered"
            and s.attributes.get("temporality.run_id") == run_id
        ),
        None,
    )


def _by_id_strict(spans: list[ReceivedSpan], span_id: str | None) -> ReceivedSpan:
    span = _by_id(spans, span_id)
    assert span is not None, f"span {span_id} never arrived"
    return span
