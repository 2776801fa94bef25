"""OpenTelemetry traces across the bus: the CloudEvents Distributed Tracing extension (W3C Trace Context).

Only the OpenTelemetry *API* lives here; a process turns tracing on by handing its SDK tracer provider to
:func:`enable` (``temporality_service.tracing`` does, from the ``OTEL_*`` environment). Until then
nothing here builds a span or encodes a header: publishing and consuming cost one attribute check.

=======================  ==============================================================================
publishing               inside a span (an HTTP request's, a consumer's, a stored context's) each event is
                         written in a PRODUCER span ``create <subject>``, that span's child, and sent with
                         the producer span's ``traceparent`` / ``tracestate`` as envelope extension
                         attributes (:func:`traced`, applied by ``Bus.publish`` and every ``event_write``);
                         outside any span it keeps what its maker set (a human request's stored context)
consuming                each envelope is handled in a CONSUMER span named ``process <subject>``, the
                         child of the context the event carries (its producer span; a root span when it
                         carries none), with
                         the messaging attributes: ``messaging.system`` nats, ``messaging.destination.name``
                         the subject, ``messaging.message.id`` the event id, ``messaging.consumer.group.name``
                         the durable (:func:`consuming`, applied by the consumer runner)
dead-lettering           in an error span ``dead-letter <subject>`` continuing the message's context
                         (the ``on_dead_letter`` hook and ``bus.dead_lettered`` inside it)
timers                   armed inside a span, a timer's schedule message carries that span's context in
                         its headers (``traceparent``/``tracestate``, which the server copies onto the
                         fired message; :func:`timer_headers`); the fired message is handled in a CONSUMER
                         span ``process <fired subject>`` continuing it (:func:`consuming_raw`). A timer
                         that re-arms itself for ever (a schedule's ticks) sends
                         ``Temporality-Trace-Link`` instead: each firing is a new trace *linked* to the
                         arming span, not one endless trace. Armed outside any span, or by a namespace
                         that keeps its own context (human-interaction's ``human`` timers: the
                         request's stored context, :func:`continued`): no header, no span
request/reply (RPC)      the request carries the caller's context in its NATS headers (:func:`rpc_headers`,
                         a CLIENT span ``send <subject>`` around the call); the responder handles it in
                         a SERVER span ``process <subject>`` continuing it (:func:`serving`)
batch consumers          no per-message span (the journal records batches)
=======================  ==============================================================================

The propagator is the W3C one (:class:`TraceContextTextMapPropagator`), used directly rather than the
global one, so the envelope's attributes are always Trace Context whatever ``OTEL_PROPAGATORS`` says
for HTTP. A value it cannot parse is ignored (the event is handled in a root span), never an error.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Literal

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from temporality_protocol import EncodedEvent, Envelope

__all__ = [
    "MESSAGING_SYSTEM",
    "TRACE_LINK_HEADER",
    "TRACE_LINK_STATE_HEADER",
    "TimerTrace",
    "calling",
    "consuming",
    "consuming_raw",
    "context_of",
    "continued",
    "current_trace",
    "disable",
    "enable",
    "enabled",
    "event_context",
    "serving",
    "timer_headers",
    "trace_id_of",
    "traced",
    "tracer",
]

#: ``messaging.system`` of every consumer span (the semantic conventions name no value for NATS).
MESSAGING_SYSTEM = "nats"
_INSTRUMENTATION = "temporality"
_PROPAGATOR = TraceContextTextMapPropagator()
#: A self-re-arming timer's arming context: the firing is a new trace linked to it (see the module docstring).
TRACE_LINK_HEADER = "Temporality-Trace-Link"
TRACE_LINK_STATE_HEADER = "Temporality-Trace-Link-State"
#: What a timer does with the context it was armed in: ``continue`` it when it fires (the default), start a
#: new trace with a ``link`` to it (a timer that re-arms itself for ever), or carry ``none`` (the handler
#: continues a context of its own).
TimerTrace = Literal["continue", "link", "none"]


class _State:
    """The process's tracer once tracing is on (``None``: off, the default)."""

    tracer: Tracer | None = None


def enable(provider: TracerProvider) -> None:
    """Trace with ``provider`` (an SDK tracer provider) from now on: consumers open spans."""
    _State.tracer = provider.get_tracer(_INSTRUMENTATION)


def disable() -> None:
    """Back to no tracing (the provider is the caller's to shut down)."""
    _State.tracer = None


def enabled() -> bool:
    return _State.tracer is not None


def tracer() -> Tracer:
    """The process's tracer; the no-op one while tracing is off (its spans record nothing)."""
    return _State.tracer or trace.NoOpTracer()


def current_trace() -> tuple[str, str | None] | None:
    """The current span's ``(traceparent, tracestate)``, or ``None`` outside any valid span."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    traceparent = carrier.get("traceparent")
    return None if traceparent is None else (traceparent, carrier.get("tracestate"))


def traced(event: Envelope) -> Envelope:
    """``event`` carrying the context of its PRODUCER span ``create <subject>``, a child of the current span
    made (and ended) here, as the event is written; ``event`` itself outside any span, and always with tracing
    off (one attribute read: the gateway's intake calls this for every event it writes).

    One producer span per event written (the messaging conventions' ``create`` operation: the event's own
    creation context, also when a batch of events goes out in one pipelined send), the parent of every
    consumer span that handles the event."""
    context = producer_context(event)
    if context is None:
        return event
    return event.model_copy(update={"traceparent": context[0], "tracestate": context[1]})


def producer_context(event: Envelope | EncodedEvent) -> tuple[str, str | None] | None:
    """The ``(traceparent, tracestate)`` of ``event``'s PRODUCER span (:func:`traced`), made and ended here;
    ``None`` outside any span and with tracing off (one attribute read)."""
    tracer = _State.tracer
    if tracer is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    subject = event.nats_subject
    attributes: dict[str, str] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "create",
        "messaging.operation.name": "create",
        "messaging.destination.name": subject,
        "messaging.message.id": event.id,
        "cloudevents.event_id": event.id,
        "cloudevents.event_type": event.type,
        "cloudevents.event_source": event.source,
    }
    if event.runid is not None:
        attributes["temporality.run_id"] = event.runid
    # started and ended without becoming the current span (no context attach and detach): only its ids are needed
    span = tracer.start_span(f"create {subject}", kind=SpanKind.PRODUCER, attributes=attributes)
    span.end()
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier["traceparent"], carrier.get("tracestate")


def context_of(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """The remote span context a stored ``traceparent`` names, or ``None`` (absent or unparseable)."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    context = _PROPAGATOR.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id (32 lowercase hex digits) of a ``traceparent``, or ``None`` (absent or unparseable)."""
    context = context_of(traceparent)
    if context is None:
        return None
    return trace.format_trace_id(trace.get_current_span(context).get_span_context().trace_id)


def event_context(event: Envelope) -> Context | None:
    """The context ``event`` was published in (its ``traceparent``), or ``None``."""
    return context_of(event.traceparent, event.tracestate)


@contextmanager
def consuming(event: Envelope, subject: str, durable: str) -> Iterator[Span | None]:
    """Handle ``event`` in a CONSUMER span, the child of the context it carries; nothing with tracing off."""
    if _State.tracer is None:
        yield None
        return
    attributes: dict[str, str] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": subject,
        "messaging.message.id": event.id,
        "messaging.consumer.group.name": durable,
        "cloudevents.event_id": event.id,
        "cloudevents.event_type": event.type,
        "cloudevents.event_source": event.source,
    }
    if event.runid is not None:
        attributes["temporality.run_id"] = event.runid
    with _State.tracer.start_as_current_span(
        f"process {subject}", context=event_context(event), kind=SpanKind.CONSUMER, attributes=attributes
    ) as span:
        yield span


@contextmanager
def continued(
    name: str,
    traceparent: str | None,
    tracestate: str | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: dict[str, str] | None = None,
    links: Sequence[Link] = (),
) -> Iterator[Span | None]:
    """A span continuing a stored trace context (its child), e.g. a human request's hours later; a root
    span when nothing usable was stored; nothing with tracing off. What is published inside carries it."""
    if _State.tracer is None:
        yield None
        return
    with _State.tracer.start_as_current_span(
        name, context=context_of(traceparent, tracestate), kind=kind, attributes=attributes, links=links
    ) as span:
        yield span


def timer_headers(mode: TimerTrace) -> dict[str, str]:
    """The headers a timer armed now carries for ``mode``: the current span's context (nothing outside a
    span, with tracing off, or for ``none``)."""
    if _State.tracer is None or mode == "none":
        return {}
    current = current_trace()
    if current is None:
        return {}
    traceparent, tracestate = current
    if mode == "continue":
        return {"traceparent": traceparent} | ({"tracestate": tracestate} if tracestate else {})
    return {TRACE_LINK_HEADER: traceparent} | ({TRACE_LINK_STATE_HEADER: tracestate} if tracestate else {})


@contextmanager
def consuming_raw(headers: Mapping[str, str] | None, subject: str, durable: str) -> Iterator[Span | None]:
    """Handle a raw message (a fired timer) in a CONSUMER span continuing the context of its headers, or a
    root span linked to a :data:`TRACE_LINK_HEADER` context; nothing with tracing off or no context carried
    (the handler may continue one it stored)."""
    if _State.tracer is None or not headers:
        yield None
        return
    parent = context_of(headers.get("traceparent"), headers.get("tracestate"))
    linked = context_of(headers.get(TRACE_LINK_HEADER), headers.get(TRACE_LINK_STATE_HEADER))
    if parent is None and linked is None:
        yield None
        return
    links = [] if linked is None else [Link(trace.get_current_span(linked).get_span_context())]
    attributes = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": subject,
        "messaging.consumer.group.name": durable,
    }
    with _State.tracer.start_as_current_span(
        f"process {subject}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes, links=links
    ) as span:
        yield span


@contextmanager
def calling(subject: str) -> Iterator[dict[str, str]]:
    """A CLIENT span ``send <subject>`` around a NATS request; yields the headers carrying its context
    (empty with tracing off: add them to the request)."""
    if _State.tracer is None:
        yield {}
        return
    attributes = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": subject,
    }
    with _State.tracer.start_as_current_span(f"send {subject}", kind=SpanKind.CLIENT, attributes=attributes):
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        yield carrier


@contextmanager
def serving(headers: Mapping[str, str] | None, subject: str) -> Iterator[Span | None]:
    """Answer a NATS request in a SERVER span ``process <subject>``, the child of the caller's context in its
    headers (a root span without one); nothing with tracing off."""
    if _State.tracer is None:
        yield None
        return
    headers = headers or {}
    attributes = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": subject,
    }
    with _State.tracer.start_as_current_span(
        f"process {subject}",
        context=context_of(headers.get("traceparent"), headers.get("tracestate")),
        kind=SpanKind.SERVER,
        attributes=attributes,
    ) as span:
        yield span
