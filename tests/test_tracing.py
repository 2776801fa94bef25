"""Issue 11: one OpenTelemetry trace follows webhook → run → question → answer → resume across the five
service processes, through the CloudEvents ``traceparent`` extension and the human request's stored context.

The services export with the real SDK and OTLP/HTTP exporter (``OTEL_*`` env) to a real HTTP receiver in the
test (:class:`temporality_testing.otlp_receiver.OtlpReceiver`); spans arrive after the batch processor's
delay, so every check waits on a condition. The traced scenarios share one stack with the other tracing
modules (``tracing_support.traced_stack``): each reads only the spans of its own run's trace.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import ALICE, eventually, example_pr, make_stack, post_hook
from tracing_support import (
    DEADLINE_TRIGGER,
    Traced,
    completed,
    fresh_pr,
    question,
    traceparent,
)

from temporality_embedded import Stack
from temporality_testing.events import EventLog
from temporality_testing.otlp_receiver import ReceivedSpan

pytestmark = pytest.mark.e2e
#: The scenarios on the shared traced stack run on the session's event loop, where its receiver serves.
on_the_traced_stack = pytest.mark.asyncio(loop_scope="session")

#: A trace context the client of the untraced stack sends: no service may pass it on.
CLIENT_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _one(spans: list[ReceivedSpan], service: str, name: str, **attributes: Any) -> ReceivedSpan | None:
    """The span of ``service`` named ``name`` with ``attributes``; None while it has not arrived. Several are one
    message handled again (at-least-once: a redelivery under load is a sibling span of the same parent in the
    same trace), never two different ones: anything else fails."""
    found = [
        s
        for s in spans
        if s.service == service and s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
    ]
    assert len({(s.trace_id, s.parent_span_id) for s in found}) <= 1, (
        f"{len(found)} spans {service}: {name} {attributes}: {[(s.trace_id, s.span_id, s.attributes) for s in found]}"
    )
    return found[0] if found else None


def _consumer(spans: list[ReceivedSpan], service: str, event_type: str, run_id: str) -> ReceivedSpan | None:
    return _one(
        spans,
        service,
        f"process temporality.events.{event_type}",
        **{"cloudevents.event_type": event_type, "temporality.run_id": run_id},
    )


def _parent(spans: list[ReceivedSpan], span: ReceivedSpan | None) -> ReceivedSpan | None:
    """``span``'s parent once it has arrived too. Each service exports in its own batches: a child can reach the
    receiver before its parent, so a test that reads a parent waits for it like for any other span."""
    if span is None or span.parent_span_id is None:
        return None
    return next((s for s in spans if s.span_id == span.parent_span_id), None)


def _publisher(spans: list[ReceivedSpan], consumer: ReceivedSpan | None) -> ReceivedSpan | None:
    """The span a consumed event was published in, once it and the event's PRODUCER span (``create <subject>``,
    the consumer span's parent, made by the publishing service) have arrived."""
    producer = _parent(spans, consumer)
    if producer is None:
        return None
    assert consumer is not None
    assert producer.kind == "producer", producer
    assert producer.name == "create " + consumer.attributes["messaging.destination.name"]
    assert producer.attributes["messaging.message.id"] == consumer.attributes["messaging.message.id"]
    return _parent(spans, producer)


async def _inbox(http: httpx.AsyncClient, stack: Stack) -> list[dict[str, Any]] | None:
    response = await http.get(f"{stack.human_url}/inbox", headers=ALICE)
    return response.json()["requests"] if response.status_code == 200 else None


@on_the_traced_stack
async def test_one_trace_follows_webhook_run_question_answer_and_resume(
    traced_stack: Traced, session_http: httpx.AsyncClient
) -> None:
    stack, otlp, http = traced_stack.stack, traced_stack.otlp, session_http
    # a trace context the answering client sends: it must become a span link of the answer, not its parent
    client_traceparent, client_trace, client_span = traceparent()
    accepted = await post_hook(http, stack, fresh_pr())
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]

    request = await eventually(lambda: question(http, stack, run_id), what="alice's question in her inbox")
    answered = await http.post(
        f"{stack.human_url}/requests/{request['id']}/answer",
        json={"option_id": "keep-v1"},
        headers={**ALICE, "traceparent": client_traceparent},
    )
    assert answered.status_code == 200, answered.text

    await eventually(lambda: completed(http, stack, run_id), what=f"run {run_id} completed")

    def http_answer_of(spans: list[ReceivedSpan]) -> ReceivedSpan | None:
        found = [s for s in spans if s.name == "POST /requests/{request_id}/answer" and s.trace_id == client_trace]
        assert len(found) <= 1, found
        return found[0] if found else None

    def whole(spans: list[ReceivedSpan]) -> bool:
        return all(
            (
                _publisher(spans, _consumer(spans, "run-executor", "run.requested", run_id)),
                _parent(spans, _consumer(spans, "human-interaction", "human.requested", run_id)),
                http_answer_of(spans),
                _one(spans, "human-interaction", "answer web", **{"temporality.request_id": request["id"]}),
                _publisher(spans, _consumer(spans, "run-executor", "human.answered", run_id)),
                _publisher(spans, _consumer(spans, "agent-collab", "run.completed", run_id)),
                _consumer(spans, "human-interaction", "run.completed", run_id),
            )
        )

    spans = await otlp.wait_for(whole, what="the spans of webhook, run, question, answer, resume and completion")
    started = _consumer(spans, "run-executor", "run.requested", run_id)
    intake = _publisher(spans, started)
    asked = _consumer(spans, "human-interaction", "human.requested", run_id)
    http_answer = http_answer_of(spans)
    answer = _one(spans, "human-interaction", "answer web", **{"temporality.request_id": request["id"]})
    resumed = _consumer(spans, "run-executor", "human.answered", run_id)
    completion = _consumer(spans, "agent-collab", "run.completed", run_id)
    assert intake is not None
    assert started is not None
    assert asked is not None
    assert answer is not None
    assert http_answer is not None
    assert resumed is not None
    assert completion is not None

    # one trace, from the webhook (a root: Azure DevOps sent no traceparent) to the run's completion
    assert {s.trace_id for s in (intake, started, asked, answer, resumed, completion)} == {intake.trace_id}
    assert (intake.service, intake.name) == ("trigger-gateway", "POST /hooks/{trigger_id}")
    assert intake.parent_span_id is None
    assert intake.kind == "server"
    assert intake.attributes["http.route"] == "/hooks/{trigger_id}"
    assert intake.attributes["http.response.status_code"] == 202
    # the run starts in the child of run.requested's PRODUCER span, the intake's child (the event carried it)
    assert started.kind == "consumer"
    produced = _parent(spans, started)
    assert produced is not None
    assert (produced.service, produced.kind, produced.parent_span_id) == ("trigger-gateway", "producer", intake.span_id)
    assert produced.attributes["messaging.destination.name"] == "temporality.events.run.requested"
    assert produced.attributes["cloudevents.event_type"] == "run.requested"
    assert started.attributes["messaging.system"] == "nats"
    assert started.attributes["messaging.destination.name"] == "temporality.events.run.requested"
    assert started.attributes["messaging.consumer.group.name"] == "run-executor-requests"
    # human.requested was published inside the run's handling (its PRODUCER span, a span of the run-executor's)
    by_id = {s.span_id: s for s in spans}
    asker = by_id[asked.parent_span_id or ""]
    assert (asker.service, asker.kind) == ("run-executor", "producer")
    # ... and the answer, a new HTTP request after the wait, continues exactly that context: the stored
    # request's traceparent is the parent of the answer's span; the HTTP request's own SERVER span (in the
    # trace its client sent) is its link
    assert http_answer.service == "human-interaction"
    assert http_answer.kind == "server"
    assert http_answer.parent_span_id == client_span
    assert http_answer.attributes["http.route"] == "/requests/{request_id}/answer"
    assert http_answer.attributes["http.response.status_code"] == 200
    assert answer.parent_span_id == asker.span_id
    assert answer.links == [(http_answer.trace_id, http_answer.span_id)]
    assert answer.attributes["temporality.request_id"] == request["id"]
    assert answer.attributes["temporality.channel"] == "web"
    # the run resumes below the answer (human.answered, produced in it, carried it), and completes in it
    assert _publisher(spans, resumed) == answer
    assert resumed.attributes["messaging.message.id"]
    assert _publisher(spans, completion) == resumed
    # probes are never traced
    assert not [s for s in spans if s.attributes.get("url.path") in ("/healthz", "/readyz", "/metrics")]
    # every service exported under its own name
    assert {s.service for s in spans if s.trace_id == intake.trace_id} >= {
        "trigger-gateway",
        "run-executor",
        "human-interaction",
        "agent-collab",
    }
    assert not [s for s in spans if s.trace_id == intake.trace_id and s.error]


@on_the_traced_stack
async def test_the_run_resumed_by_the_deadline_timer_continues_the_trace(
    traced_stack: Traced, session_http: httpx.AsyncClient
) -> None:
    """Nobody answers (:data:`tracing_support.DEADLINE_TRIGGER`: 2 s): the deadline (a JetStream message
    schedule, carrying no context) fires in a span that continues the question's stored context, and the run
    resumes with the default in its child."""
    stack, otlp, http = traced_stack.stack, traced_stack.otlp, session_http
    accepted = await post_hook(http, stack, fresh_pr(), trigger=DEADLINE_TRIGGER)
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]
    await eventually(lambda: completed(http, stack, run_id), what=f"run {run_id} completed")

    def whole(spans: list[ReceivedSpan]) -> bool:
        return all(
            (
                _publisher(spans, _consumer(spans, "run-executor", "run.requested", run_id)),
                _consumer(spans, "human-interaction", "human.requested", run_id),
                # the deadline's span and the producer of human.requested it continues
                _parent(spans, _publisher(spans, _consumer(spans, "run-executor", "human.expired", run_id))),
                _publisher(spans, _consumer(spans, "agent-collab", "run.completed", run_id)),
            )
        )

    spans = await otlp.wait_for(whole, what="the spans of webhook, question, expiry and completion")
    by_id = {s.span_id: s for s in spans}
    intake = _publisher(spans, _consumer(spans, "run-executor", "run.requested", run_id))
    asked = _consumer(spans, "human-interaction", "human.requested", run_id)
    resumed = _consumer(spans, "run-executor", "human.expired", run_id)
    completion = _consumer(spans, "agent-collab", "run.completed", run_id)
    assert intake is not None
    assert asked is not None
    assert resumed is not None
    assert completion is not None
    assert (intake.service, intake.name, intake.parent_span_id) == ("trigger-gateway", "POST /hooks/{trigger_id}", None)
    deadline = _publisher(spans, resumed)
    assert deadline is not None
    assert deadline.service == "human-interaction"
    assert deadline.name == "human.deadline"
    assert deadline.attributes["temporality.run_id"] == run_id
    assert deadline.parent_span_id == asked.parent_span_id  # the stored context: human.requested's producer
    assert by_id[deadline.parent_span_id or ""].service == "run-executor"
    assert _publisher(spans, completion) == resumed
    assert {s.trace_id for s in (intake, asked, deadline, resumed, completion)} == {intake.trace_id}


async def test_without_an_endpoint_no_event_carries_a_trace_context(tmp_path: Path, http: httpx.AsyncClient) -> None:
    """Tracing off (no ``OTEL_*`` endpoint): the services add no ``traceparent``, even to an answer sent with one."""
    assert not [k for k in os.environ if k.startswith("OTEL_EXPORTER_OTLP")]  # the processes inherit this env
    stack = make_stack(tmp_path)
    await asyncio.to_thread(stack.start)
    log = await EventLog.connect(stack.nats.url)
    try:
        accepted = await post_hook(http, stack, example_pr(), traceparent=CLIENT_TRACEPARENT)
        assert accepted.status_code == 202, accepted.text
        run_id = accepted.json()["run_id"]
        (request,) = await eventually(lambda: _inbox(http, stack), what="alice's question in her inbox")
        answered = await http.post(
            f"{stack.human_url}/requests/{request['id']}/answer",
            json={"option_id": "keep-v1"},
            headers={**ALICE, "traceparent": CLIENT_TRACEPARENT},
        )
        assert answered.status_code == 200, answered.text
        await log.wait_for("run.completed", run_id=run_id)
        events = await log.caught_up()
        assert {"trigger.received", "run.requested", "human.requested", "human.answered", "run.resumed"} <= {
            e.type for e in events
        }
        assert [(e.type, e.traceparent) for e in events if e.traceparent or e.tracestate] == []
    finally:
        await log.close()
        await asyncio.to_thread(stack.stop)


def test_an_otlp_protocol_the_service_cannot_speak_is_exit_2_before_connecting(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TEMPORALITY_NATS_URL": "nats://127.0.0.1:1",  # never reached
        "TEMPORALITY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'journal.db'}",
        "TEMPORALITY_LOG_FORMAT": "json",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    }
    result = subprocess.run(
        [sys.executable, "-m", "temporality_journal"], env=env, cwd=tmp_path, capture_output=True, timeout=60
    )
    assert result.returncode == 2, result.stderr.decode(errors="replace")
    assert b"config.invalid" in result.stderr
    assert b"OTEL_EXPORTER_OTLP_PROTOCOL" in result.stderr
    assert b"nats.connected" not in result.stderr
