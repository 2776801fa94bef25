"""CLIENT spans of the run-executor's outside calls, with tracing on: each model-provider request (real HTTP to the
OpenAI emulator, which receives the span's ``traceparent``) and each MCP tool call (a real stdio MCP server)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from temporality_bus import tracing
from temporality_run_executor.agents import McpServer, Sandbox
from temporality_run_executor.mcp_servers import McpClient, McpPool, McpToolFailed
from temporality_run_executor.providers import OpenAICompatible
from temporality_run_executor.records import Message
from temporality_testing.openai_emulator import OpenAIEmulator, assistant_text, rate_limited, usage
from temporality_testing.spans import spans_in_memory

SERVER = McpServer(name="notes", command=sys.executable, args=[str(Path(__file__).with_name("mcp_notes_server.py"))])


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, spans kept in memory."""
    with spans_in_memory() as exporter:
        yield exporter


async def test_each_provider_attempt_is_a_client_span_whose_context_the_request_carries(
    emulator: OpenAIEmulator, exported: InMemorySpanExporter
) -> None:
    emulator.replies += [rate_limited("0"), assistant_text("done", usage=usage(12, 3))]
    provider = OpenAICompatible(base_url=emulator.base_url, model="test-model", api_key=None, backoff_s=0.01)
    try:
        with tracing.tracer().start_as_current_span("turn") as turn:
            reply = await provider.complete([Message(role="user", content="hi")], [])
    finally:
        await provider.aclose()
    assert reply.content == "done"
    spans = sorted(
        (s for s in exported.get_finished_spans() if s.kind is SpanKind.CLIENT), key=lambda s: s.start_time or 0
    )
    assert [s.name for s in spans] == ["chat test-model", "chat test-model"]  # one per attempt
    assert [s.attributes["http.response.status_code"] for s in spans if s.attributes] == [429, 200]
    assert spans[0].status.status_code is StatusCode.ERROR
    last = spans[1]
    assert last.attributes is not None
    assert last.attributes["gen_ai.request.model"] == "test-model"
    assert last.attributes["server.address"] == "127.0.0.1"
    assert (last.attributes["gen_ai.usage.input_tokens"], last.attributes["gen_ai.usage.output_tokens"]) == (12, 3)
    for span, sent in zip(spans, emulator.traceparents, strict=True):
        assert span.context is not None
        assert span.parent is not None
        assert span.parent.span_id == turn.get_span_context().span_id
        assert sent is not None
        assert sent.startswith(f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-")


async def test_with_tracing_off_the_provider_sends_no_trace_context(emulator: OpenAIEmulator) -> None:
    emulator.replies.append(assistant_text("done"))
    provider = OpenAICompatible(base_url=emulator.base_url, model="m", api_key=None)
    try:
        assert (await provider.complete([Message(role="user", content="hi")], [])).content == "done"
    finally:
        await provider.aclose()
    assert emulator.traceparents == [None]


async def test_mcp_tool_calls_are_client_spans_failures_in_error(exported: InMemorySpanExporter) -> None:
    pool = McpPool()
    try:
        client = McpClient(SERVER, Sandbox(), pool)
        with tracing.tracer().start_as_current_span("turn") as turn:
            assert "cwd" in await client.call("whoami", {})
            with pytest.raises(McpToolFailed):
                await client.call("boom", {})
    finally:
        await pool.aclose()
    spans = {s.name: s for s in exported.get_finished_spans() if s.kind is SpanKind.CLIENT}
    assert set(spans) == {"tools/call whoami", "tools/call boom"}
    for name, span in spans.items():
        assert span.parent is not None
        assert span.parent.span_id == turn.get_span_context().span_id
        assert span.attributes is not None
        assert span.attributes["gen_ai.tool.name"] == name.removeprefix("tools/call ")
        assert span.attributes["temporality.mcp.server"] == "notes"
    assert spans["tools/call whoami"].status.status_code is StatusCode.UNSET
    assert spans["tools/call boom"].status.status_code is StatusCode.ERROR
