"""The journal's inbox proxy carries the caller's trace context to human-interaction (issue 11).

human-interaction is the shared traced stack's (``tracing_support.traced_stack``): a process exporting with the
real SDK and OTLP exporter to a real receiver, whose SERVER span of the forwarded request shows which trace
and parent the request arrived with. The journal runs three ways: the stack's own, a process tracing for real
(its SERVER span, then its CLIENT span, then human-interaction's), in this process with tracing on but no
SERVER span (the CLIENT span continues the caller's ``traceparent``), and in this process with tracing off (the
caller's context passes unchanged). The journal in this process records the events of a NATS of its own (the
test's), never the stack's: it forwards only HTTP to the stack's human-interaction. Each request carries a
trace id of its own; spans arrive after the batch processor's delay: every check waits on its condition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path

import httpx
import pytest
from e2e_support import ALICE, API_TOKENS
from tracing_support import (
    Traced,
    traceparent,
)

from temporality_bus import NatsSettings
from temporality_embedded.processes import free_port
from temporality_journal import Settings
from temporality_journal.__main__ import SPEC, configure
from temporality_service import ApiAuthSettings, run_until
from temporality_service.auth import dump_tokens
from temporality_testing.inprocess import serving
from temporality_testing.otlp_receiver import ReceivedSpan
from temporality_testing.spans import spans_in_memory

#: On the shared traced stack: the session's event loop, where its receiver serves.
pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]


def _one(
    spans: list[ReceivedSpan], service: str, kind: str, name: str, trace_id: str, parent: str
) -> ReceivedSpan | None:
    found = [
        s
        for s in spans
        if (s.service, s.kind, s.name, s.trace_id, s.parent_span_id) == (service, kind, name, trace_id, parent)
    ]
    return found[0] if found else None


def _caller() -> tuple[dict[str, str], str, str]:
    """A caller's trace headers (a trace of its own), its trace id and span id."""
    header, trace_id, span_id = traceparent()
    return {"traceparent": header, "tracestate": "vendor=caller"}, trace_id, span_id


async def test_the_journal_process_continues_the_callers_trace_to_human_interaction(
    traced_stack: Traced, session_http: httpx.AsyncClient
) -> None:
    """The stack's journal, a process tracing for real: SERVER -> CLIENT -> human-interaction's SERVER."""
    stack, otlp = traced_stack.stack, traced_stack.otlp
    caller, trace_id, caller_span = _caller()
    answer = await session_http.get(f"{stack.journal_url}/human/inbox", headers={**ALICE, **caller})
    assert answer.status_code == 200, answer.text

    def chain(spans: list[ReceivedSpan]) -> bool:
        server = _one(spans, "journal", "server", "GET /human/inbox", trace_id, caller_span)
        client = server and _one(spans, "journal", "client", "GET /inbox", trace_id, server.span_id)
        return bool(client and _one(spans, "human-interaction", "server", "GET /inbox", trace_id, client.span_id))

    spans = await otlp.wait_for(chain, what="journal server -> client -> human-interaction server")
    client = next(s for s in spans if (s.service, s.kind, s.trace_id) == ("journal", "client", trace_id))
    assert client.attributes["http.request.method"] == "GET"
    assert client.attributes["url.template"] == "/inbox"
    assert client.attributes["http.response.status_code"] == 200
    assert client.attributes["server.port"] == httpx.URL(stack.human_url).port


async def test_the_journal_in_process_passes_the_callers_trace_on_with_or_without_tracing(
    traced_stack: Traced, session_http: httpx.AsyncClient, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    stack, otlp = traced_stack.stack, traced_stack.otlp
    tokens = tmp_path / "tokens.json"
    tokens.write_text(dump_tokens(API_TOKENS), encoding="utf-8")
    settings = Settings(
        nats=nats_settings,  # the test's NATS: this journal must not consume the stack's events
        port=free_port(),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'journal.db'}",
        api=ApiAuthSettings(tokens_file=tokens),
        human_url=stack.human_url,
    )

    def journal(stop: asyncio.Event, ready: asyncio.Event) -> Awaitable[None]:
        return run_until(SPEC, settings, configure(settings), stop, ready=ready)

    inbox = f"http://127.0.0.1:{settings.port}/human/inbox"
    async with serving(("journal", journal)):
        # tracing on, no SERVER span (no global tracer provider here): the CLIENT span continues the caller's
        caller, trace_id, caller_span = _caller()
        with spans_in_memory() as exported:
            answer = await session_http.get(inbox, headers={**ALICE, **caller})
            assert answer.status_code == 200, answer.text
            (client_span,) = [s for s in exported.get_finished_spans() if s.name == "GET /inbox"]
        context = client_span.get_span_context()
        assert f"{context.trace_id:032x}" == trace_id
        assert client_span.parent is not None
        assert f"{client_span.parent.span_id:016x}" == caller_span
        mine = f"{context.span_id:016x}"
        await otlp.wait_for(
            lambda spans: _one(spans, "human-interaction", "server", "GET /inbox", trace_id, mine) is not None,
            what="human-interaction's span, the child of the journal's in-process CLIENT span",
        )

        # tracing off: the caller's context reaches human-interaction unchanged (its parent: the caller)
        caller, trace_id, caller_span = _caller()
        answer = await session_http.get(inbox, headers={**ALICE, **caller})
        assert answer.status_code == 200, answer.text
        await otlp.wait_for(
            lambda spans: _one(spans, "human-interaction", "server", "GET /inbox", trace_id, caller_span) is not None,
            what="human-interaction's span, the child of the caller's span",
        )
