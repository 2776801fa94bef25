"""One trace across the human wait: everything about a request continues the trace it was asked in.

``human.requested`` carries the run's trace context (``traceparent``); the stored request keeps it
(:attr:`~.records.HumanRequestRecord.traceparent`), so what happens hours later joins the same trace as a
**child** of the span that published ``human.requested`` -- a parent, not only a span link, so one trace
follows webhook → run → question → answer → resume in any tracing UI:

* an answer, from any channel (the web inbox, Matrix, Telegram), is bound in an ``answer <channel>`` span
  whose parent is the stored context; the HTTP request's own SERVER span (the web inbox's, in the trace
  its client started, or a new one) is a **link** of it. ``human.answered`` is published inside it;
* a timer firing (the deadline, a chain step, an answer's repair) in a ``human.deadline`` span, likewise;
* an event built for the request outside any span carries the stored context itself (``events.py``).

With tracing off nothing is read or built here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link

from temporality_bus import Bus
from temporality_bus import tracing as bus_tracing
from temporality_human_interaction.records import is_request_id, open_store

__all__ = ["answering", "request_context"]


async def request_context(bus: Bus, request_id: str) -> Context | None:
    """The stored trace context of request ``request_id`` (``None``: tracing off, no such request, none kept)."""
    if not bus_tracing.enabled() or not is_request_id(request_id):
        return None
    got = await (await open_store(bus)).get(request_id)
    if got is None:
        return None
    return bus_tracing.context_of(got.value.traceparent, got.value.tracestate)


@asynccontextmanager
async def answering(bus: Bus, channel: str, request_id: str) -> AsyncIterator[None]:
    """An answer from ``channel`` handled in a span continuing the request's trace (the current span, an
    HTTP request's, becomes its link); nothing with tracing off."""
    if not bus_tracing.enabled():
        yield
        return
    stored = await request_context(bus, request_id)
    current = trace.get_current_span().get_span_context()
    # no stored context (a request asked before tracing was on): the child of the HTTP span, if any
    links = [Link(current, {"temporality.link": "request"})] if stored is not None and current.is_valid else []
    with bus_tracing.tracer().start_as_current_span(
        f"answer {channel}",
        context=stored,
        links=links,
        attributes={"temporality.request_id": request_id, "temporality.channel": channel},
    ):
        yield
