"""Issue 11: a run failed by the run-executor's watchdog is in the trace of the webhook that started it -- both
ways the watchdog fails a run: a run parked on its too slow external agent (``compute_timeout``), and a hosted
run whose turn makes no progress (``stalled``).

On the shared traced stack (``tracing_support.traced_stack``), a webhook launches a run of
:data:`~tracing_support.EXTERNAL_TIGHT_AGENT`: its turns are the example external agent's tasks, with a 2 s
compute budget. The agent (``examples/external-agent/agent.py --work --think-s 30``) takes the task and is too
slow: the run parks on it, and the durable watchdog timer armed at the park (a JetStream message schedule; the
run-executor's ``run-watchdog`` namespace) fires when the budget is spent and fails the run ``compute_timeout``.
Nothing but the timer's own headers carries the trace over that wait: the firing's CONSUMER span continues the
span that parked the run, and ``run.failed`` is produced inside it.

The stalled run: :data:`~tracing_support.HOSTED_TIGHT_TRIGGER`'s scripted reviewer has a 1 s compute budget,
and the run-executor is restarted for the test with a provider that thinks 6 s per turn and a 2 s watchdog
grace. The watchdog armed before the first turn fires while that turn still thinks: no progress past budget
plus grace, so the run fails ``stalled``, in the firing's span, a child of the span that armed it.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime

import httpx
import pytest
from e2e_support import ROOT, post_hook, stop_processes
from tracing_support import (
    EXTERNAL_TIGHT_BUDGET_S,
    EXTERNAL_TIGHT_TRIGGER,
    HOSTED_TIGHT_BUDGET_S,
    HOSTED_TIGHT_TRIGGER,
    Traced,
    fresh_pr,
)

from temporality_protocol import Envelope
from temporality_testing.events import EventLog
from temporality_testing.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

AGENT = ROOT / "examples" / "external-agent" / "agent.py"
WAIT_S = 60.0
WATCHDOG_FIRED = "temporality.timers.fired.run-watchdog."


def _by_id(spans: list[ReceivedSpan], span_id: str | None) -> ReceivedSpan | None:
    return next((s for s in spans if s.span_id == span_id), None) if span_id else None


def _chain(spans: list[ReceivedSpan], span: ReceivedSpan | None) -> list[ReceivedSpan] | None:
    """``span`` and its ancestors up to the root, nearest first; ``None`` until every one has arrived."""
    chain: list[ReceivedSpan] = []
    while span is not None:
        chain.append(span)
        if span.parent_span_id is None:
            return chain
        span = _by_id(spans, span.parent_span_id)
    return None


def _produced(spans: list[ReceivedSpan], event_id: str) -> ReceivedSpan | None:
    found = [s for s in spans if s.kind == "producer" and s.attributes.get("messaging.message.id") == event_id]
    return found[0] if found else None


async def _failure_spans(otlp: OtlpReceiver, failed: Envelope) -> list[ReceivedSpan]:
    """Wait until ``run.failed``'s producer span and all its ancestors arrived; the spans then."""

    def arrived(spans: list[ReceivedSpan]) -> bool:
        return _chain(spans, _produced(spans, failed.id)) is not None

    return await otlp.wait_for(arrived, timeout_s=WAIT_S, what="run.failed's producer span and its ancestors")


def _assert_failed_in_the_watchdog_firing(spans: list[ReceivedSpan], failed: Envelope, run_id: str) -> None:
    """``run.failed`` is in the webhook's trace (from the intake, a root: Azure DevOps sent no traceparent),
    produced by the run-executor in the watchdog's firing, which continues the span that armed it: the handling
    of ``run.requested``, the child of the event's producer span in the intake."""
    chain = _chain(spans, _produced(spans, failed.id))
    assert chain is not None
    produced, intake = chain[0], chain[-1]
    assert {s.trace_id for s in chain} == {intake.trace_id}
    assert failed.traceparent is not None
    assert failed.traceparent.split("-")[1:3] == [intake.trace_id, produced.span_id]
    assert (produced.service, produced.name) == ("run-executor", "create temporality.events.run.failed")
    fired = chain[1]
    assert (fired.service, fired.kind) == ("run-executor", "consumer")
    assert fired.attributes["messaging.destination.name"] == f"{WATCHDOG_FIRED}{run_id}"
    assert [(s.service, s.kind, s.name) for s in chain[2:]] == [
        ("run-executor", "consumer", "process temporality.events.run.requested"),
        ("trigger-gateway", "producer", "create temporality.events.run.requested"),
        ("trigger-gateway", "server", "POST /hooks/{trigger_id}"),
    ]
    assert chain[2].attributes["temporality.run_id"] == run_id
    assert not [s for s in chain if s.error]


async def test_a_run_failed_by_the_watchdog_is_in_the_webhook_s_trace(
    traced_stack: Traced, session_http: httpx.AsyncClient
) -> None:
    stack, otlp, http = traced_stack.stack, traced_stack.otlp, session_http
    events = await EventLog.connect(stack.nats.url, since=datetime.now(UTC))
    with (traced_stack.root / "slow-agent.log").open("ab") as out:
        agent = await asyncio.create_subprocess_exec(
            *(sys.executable, str(AGENT), "--nats-url", stack.nats.url, "--work", "--poll-s", "0.3"),
            *("--key-file", str(stack.example_agent_key_file)),
            *("--period-s", "0.4", "--think-s", "30"),  # takes the task, acts long after the budget is spent
            stdout=out,
            stderr=out,
        )
    try:
        await events.wait_for("agent.registered", timeout_s=WAIT_S)
        accepted = await post_hook(http, stack, fresh_pr(), trigger=EXTERNAL_TIGHT_TRIGGER)
        assert accepted.status_code == 202, accepted.text
        run_id = accepted.json()["run_id"]
        (failed,) = await events.wait_for("run.failed", run_id=run_id, timeout_s=WAIT_S)
        assert failed.data["reason"] == "compute_timeout"
        (started,) = events.of_type("run.started", run_id)
        assert (failed.time - started.time).total_seconds() >= EXTERNAL_TIGHT_BUDGET_S - 0.5

        spans = await _failure_spans(otlp, failed)
    finally:
        await stop_processes(agent)
        await events.close()
    # the watchdog armed when the run parked on its agent (in the handling of run.requested) failed it
    _assert_failed_in_the_watchdog_firing(spans, failed, run_id)


async def test_a_run_stalled_in_its_turn_is_failed_by_the_watchdog_in_the_webhook_s_trace(
    traced_stack: Traced, session_http: httpx.AsyncClient
) -> None:
    stack, otlp, http = traced_stack.stack, traced_stack.otlp, session_http
    grace_s, think_s = 2, 6
    events = await EventLog.connect(stack.nats.url, since=datetime.now(UTC))
    try:
        await asyncio.to_thread(  # off the loop: the receiver serves on it meanwhile
            stack.restart,
            "run-executor",
            TEMPORALITY_EXECUTOR_WATCHDOG_GRACE_S=str(grace_s),
            TEMPORALITY_EXECUTOR_SCRIPTED_THINK_S=str(think_s),  # every turn far over the 1 s budget
        )
        accepted = await post_hook(http, stack, fresh_pr(), trigger=HOSTED_TIGHT_TRIGGER)
        assert accepted.status_code == 202, accepted.text
        run_id = accepted.json()["run_id"]
        (failed,) = await events.wait_for("run.failed", run_id=run_id, timeout_s=WAIT_S)
        assert failed.data["reason"] == "stalled", failed.data
        assert "no progress in running at turn 0" in failed.data["error"]
        (started,) = events.of_type("run.started", run_id)
        assert (failed.time - started.time).total_seconds() >= HOSTED_TIGHT_BUDGET_S + grace_s - 0.5

        # the turn ends after its think (the run is failed by then: nothing more of it), and its span is exported
        spans = await _failure_spans(otlp, failed)
    finally:
        await asyncio.to_thread(stack.restart, "run-executor")  # the stack's own settings for the next scenario
        await events.close()
    # armed before the first turn, in the handling of run.requested (the turn that then stalled)
    _assert_failed_in_the_watchdog_firing(spans, failed, run_id)
    assert events.of_type("run.completed", run_id) == []
