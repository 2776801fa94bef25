"""What the run-executor's MCP client offers a server, with the real local MCP server (``mcp_notes_server.py
--client-tools``) over stdio, on an MCP 2025-11-25 session (``handshake``: requests from the server) and an MCP
2026-07-28 one (``auto``: ``input_required`` results):

* the caller's trace context travels in the request's ``params._meta`` (``traceparent``/``tracestate``);
* ``roots/list`` is answered with the sandbox's working directory;
* ``sampling/createMessage`` is answered by the run's own model (the OpenAI-compatible emulator over real
  HTTP), counted in the run's tokens and turns, and journaled as ``run.sampled``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from executor_processes import Crash, Process, start_process
from executor_support import REVIEWER, RunExecutor, run_requested
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind

from temporality_bus import Bus, NatsSettings, tracing
from temporality_protocol import RunCompleted, RunSampled, RunUsage, derive_id
from temporality_run_executor.agents import AgentCard, Limits, McpServer, ProviderConfig, Sandbox
from temporality_run_executor.mcp_servers import McpClient, McpPool, McpToolFailed, list_card_tools
from temporality_run_executor.providers.script import Script
from temporality_run_executor.records import Message
from temporality_run_executor.tools import Sampled, SamplingParams, ToolPolicy
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, assistant_text, assistant_tool_call, usage
from temporality_testing.spans import spans_in_memory

SERVER = McpServer(
    name="notes", command=sys.executable, args=[str(Path(__file__).with_name("mcp_notes_server.py")), "--client-tools"]
)
PROTOCOLS = pytest.mark.parametrize("protocol", ["handshake", "auto"])


@pytest.fixture
async def pool() -> AsyncIterator[McpPool]:
    pool = McpPool()
    try:
        yield pool
    finally:
        await pool.aclose()


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    with spans_in_memory() as exporter:
        yield exporter


def _server(protocol: str) -> McpServer:
    return SERVER.model_copy(update={"protocol": protocol})


@PROTOCOLS
async def test_the_call_carries_the_callers_trace_context_in_its_meta(
    pool: McpPool, exported: InMemorySpanExporter, protocol: str
) -> None:
    client = McpClient(_server(protocol), Sandbox(), pool)
    with tracing.tracer().start_as_current_span("turn") as turn:
        received = json.loads(await client.call("traced", {}))
    (span,) = [s for s in exported.get_finished_spans() if s.kind is SpanKind.CLIENT and s.name == "tools/call traced"]
    assert span.context is not None
    trace_id = turn.get_span_context().trace_id
    # the server got the trace of the caller, with the client span of the call as its parent
    assert received["traceparent"].startswith(f"00-{trace_id:032x}-{span.context.span_id:016x}-")


async def test_without_a_span_the_call_carries_no_trace_context(pool: McpPool) -> None:
    received = json.loads(await McpClient(SERVER, Sandbox(), pool).call("traced", {}))
    assert received == {"traceparent": None, "tracestate": None}


@PROTOCOLS
async def test_the_call_carries_its_idempotency_key_in_its_meta(pool: McpPool, protocol: str) -> None:
    client = McpClient(_server(protocol), Sandbox(), pool)
    assert json.loads(await client.call("keyed", {})) == {"key": None, "seen": 0}  # none given: none sent
    with tracing.tracer().start_as_current_span("turn"):  # beside the trace context
        assert json.loads(await client.call("keyed", {}, key=f"call-{protocol}")) == {
            "key": f"call-{protocol}",
            "seen": 1,
        }
    assert json.loads(await client.call("keyed", {}, key=f"call-{protocol}")) == {"key": f"call-{protocol}", "seen": 2}


async def test_a_crash_replays_an_mcp_call_with_the_same_idempotency_key(
    bus: Bus, event_log: EventLog, nats_settings: NatsSettings, processes: list[Process], pool: McpPool
) -> None:
    """The driver dies after the MCP call came back, before the turn's checkpoint: the next process carries the turn
    out again and the server is sent the same key, derived from (run, turn, call index) -- what it can do its side
    effect once by."""
    script = {"steps": [{"id": "k", "call": {"tool": "notes__keyed", "args": {}}}, {"id": "done", "answer": "ok"}]}
    card = REVIEWER.model_copy(
        update={
            "provider": ProviderConfig(kind="scripted", script=Script.model_validate(script)),
            "tools": ToolPolicy(allow=["notes__keyed"]),
            "mcp_servers": [SERVER],
        }
    )
    tools = {card.id: await list_card_tools(card, pool)}
    crash = Crash("tool_returned")
    first = await start_process(nats_settings, "executor-1", [card], crash, tools)
    processes.append(first)
    event = run_requested()
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    await asyncio.wait_for(crash.crashed.wait(), 60)
    await first.end()
    processes.append(await start_process(nats_settings, "executor-2", [card], card_tools=tools))
    await event_log.wait_for("run.completed", run_id=run_id, timeout_s=60)
    await event_log.caught_up()
    (called,) = event_log.of_type("run.tool_called", run_id)
    key = derive_id("call", run_id, "1", "0")  # turn 1, call 0
    assert json.loads(called.data["result_preview"]) == {"key": key, "seen": 2}  # the same key, twice


@PROTOCOLS
async def test_roots_are_the_sandbox_working_directory(pool: McpPool, tmp_path: Path, protocol: str) -> None:
    listed = json.loads(await McpClient(_server(protocol), Sandbox(working_dir=tmp_path), pool).call("roots", {}))
    assert listed == {"roots": [{"uri": tmp_path.as_uri(), "name": "working directory"}]}
    assert json.loads(await McpClient(_server(protocol), Sandbox(), pool).call("roots", {})) == {"roots": []}


@PROTOCOLS
async def test_sampling_with_no_model_for_it_is_refused(pool: McpPool, protocol: str) -> None:
    with pytest.raises(McpToolFailed, match="no model answers sampling here"):
        await McpClient(_server(protocol), Sandbox(), pool).call("summarize", {"text": "x"})


@PROTOCOLS
async def test_a_sampling_request_continues_the_trace_of_its_call(
    pool: McpPool, exported: InMemorySpanExporter, protocol: str
) -> None:
    seen: list[SpanContext] = []

    async def sample(messages: list[Message], params: SamplingParams) -> Sampled:
        seen.append(trace.get_current_span().get_span_context())
        return Sampled(content="short", model="m")

    client = McpClient(_server(protocol), Sandbox(), pool)
    with tracing.tracer().start_as_current_span("turn"):
        assert "short" in await client.call("summarize", {"text": "x"}, sample=sample)
    (span,) = [s for s in exported.get_finished_spans() if s.name == "tools/call summarize"]
    assert span.context is not None
    assert [(c.trace_id, c.span_id) for c in seen] == [(span.context.trace_id, span.context.span_id)]


def _card(
    emulator: OpenAIEmulator, limits: Limits, protocol: str = "handshake", sampling_models: tuple[str, ...] = ()
) -> AgentCard:
    provider = ProviderConfig(
        kind="openai",
        base_url=emulator.base_url,
        model="test-model",
        retry_backoff_s=0.01,
        sampling_models=list(sampling_models),
    )
    return REVIEWER.model_copy(
        update={
            "provider": provider,
            "limits": limits,
            "tools": ToolPolicy(allow=["notes__summarize", "notes__summarize_many", "notes__draft"]),
            "mcp_servers": [_server(protocol)],
        }
    )


DRAFT = {"text": "the PR", "max_tokens": 500, "temperature": 0.2, "stop": ["END", "\n\n"], "hints": ["big", "mini"]}


@PROTOCOLS
async def test_a_sampling_request_bounds_and_model_hint_reach_the_model(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, emulator: OpenAIEmulator, protocol: str
) -> None:
    """``maxTokens``, ``temperature`` and ``stopSequences`` go to the endpoint; the first hint that matches one of
    the card's ``sampling_models`` picks the model (``big``: ``test-model-big``, before ``mini``)."""
    emulator.replies += [
        assistant_tool_call("call_draft", "notes__draft", DRAFT, usage=usage(100, 10)),
        assistant_text("A draft.", usage=usage(30, 5)),
        assistant_text("Done.", usage=usage(150, 20)),
    ]
    card = _card(emulator, Limits(), protocol, sampling_models=("test-model-mini", "test-model-big"))
    await executor(cards=[card], card_tools={card.id: await list_card_tools(card, pool)})
    event = run_requested()
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    turn, sampling, last = emulator.requests
    assert (sampling["model"], sampling["max_tokens"], sampling["temperature"]) == ("test-model-big", 500, 0.2)
    assert sampling["stop"] == ["END", "\n\n"]
    for request in (turn, last):  # the agent's own turns: the card's model, no bounds of the server's
        assert request["model"] == "test-model"
        assert not {"max_tokens", "temperature", "stop"} & request.keys()
    (called,) = event_log.of_type("run.tool_called", event.runid)
    assert json.loads(called.data["result_preview"]) == {"result": "draft (test-model-big, endTurn): A draft."}
    (sampled,) = event_log.of_type("run.sampled", event.runid)
    assert sampled.data["model"] == "test-model-big"


async def test_without_sampling_models_hints_are_ignored_and_max_tokens_is_capped_by_the_tokens_left(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [
        assistant_tool_call("call_draft", "notes__draft", DRAFT, usage=usage(100, 10)),
        assistant_text("A draft.", usage=usage(30, 5)),
        assistant_text("Done.", usage=usage(20, 5)),
    ]
    card = _card(emulator, Limits(max_tokens=300))
    await executor(cards=[card], card_tools={card.id: await list_card_tools(card, pool)})
    event = run_requested()
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    sampling = emulator.requests[1]
    assert sampling["model"] == "test-model"  # the card allows no other: the server's hints choose nothing
    assert sampling["max_tokens"] == 190  # 300 - the 110 the turn took: the server asked 500
    assert (sampling["temperature"], sampling["stop"]) == (0.2, ["END", "\n\n"])


async def test_the_scripted_provider_sees_the_sampling_requests_bounds(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool
) -> None:
    script = {
        "steps": [
            {
                "id": "sampled",
                "when": "run.sampling",
                "answer": "{{ run.sampling.max_tokens }} {{ run.sampling.temperature }} {{ run.sampling.stop }} "
                "{{ run.sampling.model }} {{ run.sampling.hints }}",
            },
            {"id": "draft", "call": {"tool": "notes__draft", "args": DRAFT}},
            {"id": "done", "answer": "{{ results.draft.result }}"},
        ]
    }
    provider = ProviderConfig(kind="scripted", script=Script.model_validate(script), sampling_models=["x-mini"])
    card = REVIEWER.model_copy(
        update={"provider": provider, "tools": ToolPolicy(allow=["notes__draft"]), "mcp_servers": [SERVER]}
    )
    await executor(cards=[card], card_tools={card.id: await list_card_tools(card, pool)})
    event = run_requested()
    await bus.publish(event)
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    expected = '500 0.2 ["END", "\\n\\n"] x-mini ["big", "mini"]'  # the hint "mini" matched the card's x-mini
    assert completed.data["result"] == f"draft (x-mini, endTurn): {expected}"


@PROTOCOLS
async def test_a_sampling_request_is_answered_by_the_runs_model_counted_and_journaled(
    bus: Bus,
    event_log: EventLog,
    executor: RunExecutor,
    pool: McpPool,
    emulator: OpenAIEmulator,
    protocol: str,
) -> None:
    emulator.replies += [
        assistant_tool_call("call_sum", "notes__summarize", {"text": "the PR"}, usage=usage(100, 10)),
        assistant_text("It fixes a typo.", usage=usage(30, 5)),  # the sampling request, from the MCP server
        assistant_text("Done: It fixes a typo.", usage=usage(150, 20)),
    ]
    card = _card(emulator, Limits(), protocol)
    await executor(cards=[card], card_tools={card.id: await list_card_tools(card, pool)})
    event = run_requested()
    await bus.publish(event)
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    # the sampling request reached the run's model as a conversation of its own, with no tools
    sampling = emulator.requests[1]
    assert [m["role"] for m in sampling["messages"]] == ["system", "user"]
    assert sampling["messages"][1]["content"] == "Summarize: the PR"
    assert not sampling.get("tools")
    (called,) = event_log.of_type("run.tool_called", event.runid)
    assert called.data["result_preview"] == json.dumps({"result": "summary (test-model): It fixes a typo."})
    (sampled,) = event_log.of_type("run.sampled", event.runid)
    fact = sampled.payload(RunSampled)
    assert (fact.turn, fact.call_id, fact.tool, fact.sample, fact.model) == (
        1,
        "call_sum",
        "notes__summarize",
        0,
        "test-model",
    )
    assert (fact.prompt_tokens, fact.completion_tokens, fact.total_tokens) == (30, 5, 35)
    assert fact.result_preview == "It fixes a typo."
    assert "user: Summarize: the PR" in fact.prompt_preview
    # its tokens are the run's: 110 + 35 + 170
    totals = RunUsage(turns=2, tool_calls=1, prompt_tokens=280, completion_tokens=35, total_tokens=315, samplings=1)
    assert completed.payload(RunCompleted).usage == totals


async def test_sampling_stops_at_the_runs_token_limit_and_the_run_fails_it(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [
        assistant_tool_call("call_many", "notes__summarize_many", {"text": "t", "n": 3}, usage=usage(40, 10)),
        assistant_text("one", usage=usage(30, 10)),  # 50 + 40 = 90: within 100, so a second is asked
        assistant_text("two", usage=usage(30, 10)),  # 130: past it, the third is refused
    ]
    card = _card(emulator, Limits(max_tokens=100))
    await executor(cards=[card], card_tools={card.id: await list_card_tools(card, pool)})
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid, timeout_s=60)
    assert failed.data["reason"] == "token_limit"  # at the next boundary: the samplings' tokens are the run's
    assert failed.data["usage"]["total_tokens"] == 130
    assert failed.data["usage"]["samplings"] == 2  # the refused third is no model call
    assert len(emulator.requests) == 3  # the turn and two samplings; no third sampling, no second turn
    (called,) = event_log.of_type("run.tool_called", event.runid)
    answers = json.loads(called.data["result_preview"])["answers"]
    assert answers[:2] == ["one", "two"]
    assert answers[2] == "error: the run's tokens are used up (130 of 100)"
    assert [e.data["sample"] for e in event_log.of_type("run.sampled", event.runid)] == [0, 1]


async def test_sampling_counts_as_model_calls_against_max_turns(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [
        assistant_tool_call("call_many", "notes__summarize_many", {"text": "t", "n": 3}),
        assistant_text("one"),  # turn 1 of 3: one model call left for samplings, one kept for turn 2
        assistant_text("finished"),
    ]
    card = _card(emulator, Limits(max_turns=3))
    await executor(cards=[card], card_tools={card.id: await list_card_tools(card, pool)})
    event = run_requested()
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    (called,) = event_log.of_type("run.tool_called", event.runid)
    answers = json.loads(called.data["result_preview"])["answers"]
    refused = (
        "error: the run has no model calls left (max_turns 3: 1 turn(s) and 1 sampling(s) so far, one kept for "
        "the agent's next turn)"
    )
    assert answers == ["one", refused, refused]
    assert len(emulator.requests) == 3


async def test_samplings_of_earlier_turns_count_and_the_run_fails_max_turns(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, emulator: OpenAIEmulator
) -> None:
    """The samplings are checkpointed with the run's usage: a later turn's call sees them, and the run fails
    ``max_turns`` at the boundary where its turns and samplings reach the limit."""
    emulator.replies += [
        assistant_tool_call("call_1", "notes__summarize_many", {"text": "t", "n": 1}),
        assistant_text("one"),  # turn 1 + this sampling: 2 of 3 model calls
        assistant_tool_call("call_2", "notes__summarize_many", {"text": "t", "n": 1}),  # the 3rd: none left
    ]
    card = _card(emulator, Limits(max_turns=3))
    await executor(cards=[card], card_tools={card.id: await list_card_tools(card, pool)})
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid, timeout_s=60)
    assert failed.data["reason"] == "max_turns"
    assert failed.data["error"] == "the agent used all 3 turns (2 turns, 1 MCP samplings)"
    assert (failed.data["usage"]["turns"], failed.data["usage"]["samplings"]) == (2, 1)
    assert len(emulator.requests) == 3
    first, second = event_log.of_type("run.tool_called", event.runid)
    assert json.loads(first.data["result_preview"])["answers"] == ["one"]
    (refused,) = json.loads(second.data["result_preview"])["answers"]
    assert refused.startswith("error: the run has no model calls left (max_turns 3: 2 turn(s) and 1 sampling(s)")


async def test_a_crash_after_a_sampled_call_journals_the_sampling_once_and_counts_the_committed_call(
    bus: Bus,
    event_log: EventLog,
    nats_settings: NatsSettings,
    processes: list[Process],
    pool: McpPool,
    emulator: OpenAIEmulator,
) -> None:
    """The driver dies after the call came back (its result not committed): the next process replays the turn,
    the server samples again (that model call is spent twice), one ``run.sampled`` is journaled (the same id)
    and the run counts the committed call's tokens once."""
    turn = assistant_tool_call("call_sum", "notes__summarize", {"text": "the PR"}, usage=usage(100, 10))
    sampled = assistant_text("It fixes a typo.", usage=usage(30, 5))
    emulator.replies += [turn, sampled, sampled, assistant_text("Done.", usage=usage(150, 20))]
    card = _card(emulator, Limits())
    tools = {card.id: await list_card_tools(card, pool)}
    crash = Crash("tool_returned")
    first = await start_process(nats_settings, "executor-1", [card], crash, tools)
    processes.append(first)
    event = run_requested()
    await bus.publish(event)
    await asyncio.wait_for(crash.crashed.wait(), 60)
    await first.end()
    processes.append(await start_process(nats_settings, "executor-2", [card], card_tools=tools))
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    # the replayed turn was carried out from its kept reply (the model not asked again); the server sampled again
    assert len(emulator.requests) == 4
    await event_log.caught_up()
    assert len(event_log.of_type("run.sampled", event.runid)) == 1
    totals = RunUsage(turns=2, tool_calls=1, prompt_tokens=280, completion_tokens=35, total_tokens=315, samplings=1)
    assert completed.payload(RunCompleted).usage == totals
