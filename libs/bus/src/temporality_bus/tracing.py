"""OpenTelemetry traces across the bus: the CloudEvents Distributed Tracing extension (W3C Trace Context).

Only the OpenTelemetry *API* lives here; a process turns tracing on by handing its SDK tracer provider to
:func:`enable` (``temporality_service.tracing`` does, from the ``OTEL_*`` environment). Until then
nothing here builds a span or encodes a header: publishing and consuming cost one attribute check.

=======================  ==============================================================================
publishing               inside a span (an HTTP request's, a consumer's, a stored context's) the event is
                         sent with that span's ``traceparent`` / ``tracestate`` as envelope extension
                         attributes (:func:`traced`, applied by ``Bus.publish`` and every ``event_write``);
                         outside any span it keeps what its maker set (a human request's stored context)
consuming                each envelope is handled in a CONSUMER span named ``process <subject>``, the
                         child of the context the event carries (a root span when it carries none), with
                         the messaging attributes: ``messaging.system`` nats, ``messaging.destination.name``
                         the subject, ``messaging.message.id`` the event id, ``messaging.consumer.group.name``
                         the durable (:func:`consuming`, applied by the consumer runner)
dead-lettering           in an error span ``dead-letter <subject>`` continuing the message's context
                         (the ``on_dead_letter`` hook and ``bus.dead_lettered`` inside it)
raw messages (timers)    no span: a timer carries no context; the handler continues the one it stored
                         (:func:`continued`)
batch consumers          no per-message span (the journal records batches)
=======================  ==============================================================================

The propagator is the W3C one (:class:`TraceContextTextMapPropagator`), used directly rather than the
global one, so the envelope's attributes are always Trace Context whatever ``OTEL_PROPAGATORS`` says
for HTTP. A value it cannot parse is ignored (the event is handled in a root span), never an error.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from temporality_protocol import Envelope

__all__ = [
    "MESSAGING_SYSTEM",
    "consuming",
    "context_of",
    "continued",
    "current_trace",
    "disable",
    "enable",
    "enabled",
    "event_context",
    "traced",
    "tracer",
]

#: ``messaging.system`` of every consumer span (the semantic conventions name no value for NATS).
MESSAGING_SYSTEM = "nats"
_INSTRUMENTATION = "temporality"
_PROPAGATOR = TraceContextTextMapPropagator()


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
    """``event`` carrying the current span's trace context; ``event`` itself outside any span, and always
    with tracing off (one attribute read: the gateway's intake calls this for every event it writes)."""
    if _State.tracer is None or not trace.get_current_span().get_span_context().is_valid:
        return event
    current = current_trace()
    if current is None or current == (event.traceparent, event.tracestate):
        return event
    traceparent, tracestate = current
    return event.model_copy(update={"traceparent": traceparent, "tracestate": tracestate})


def context_of(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """The remote span context a stored ``traceparent`` names, or ``None`` (absent or unparseable)."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    context = _PROPAGATOR.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


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
