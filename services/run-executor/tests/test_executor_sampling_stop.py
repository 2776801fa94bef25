"""MCP sampling's ``stopReason`` and stop sequences (issue 6): the answer tells the server why the model stopped
(``maxTokens`` on the provider's length limit, ``stopSequence`` when the provider names one of the request's
stop sequences as the end, else ``endTurn``), and at most four stop sequences reach the provider (OpenAI refuses
more). Over a real MCP server (stdio, ``mcp_notes_server.py``: its ``draft`` tool reports the ``stopReason`` it
got) and the OpenAI-compatible endpoint emulator (real HTTP)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from executor_support import REVIEWER, RunExecutor, run_requested

from temporality_bus import Bus
from temporality_run_executor.agents import AgentCard, Limits, McpServer, ProviderConfig
from temporality_run_executor.mcp_servers import McpPool, list_card_tools
from temporality_run_executor.providers.base import AssistantTurn
from temporality_run_executor.sampling import MAX_STOP_SEQUENCES, stop_reason
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, Reply, assistant_text, assistant_tool_call

SERVER = McpServer(
    name="notes", command=sys.executable, args=[str(Path(__file__).with_name("mcp_notes_server.py")), "--client-tools"]
)


@pytest.fixture
async def pool() -> AsyncIterator[McpPool]:
    pool = McpPool()
    try:
        yield pool
    finally:
        await pool.aclose()


def _card(emulator: OpenAIEmulator) -> AgentCard:
    provider = ProviderConfig(kind="openai", base_url=emulator.base_url, model="test-model", retry_backoff_s=0.01)
    return REVIEWER.model_copy(
        update={
            "provider": provider,
            "limits": Limits(),
            "tools": ToolPolicy(allow=["notes__draft"]),
            "mcp_servers": [SERVER],
        }
    )


def _sampled(content: str, finish: str, **choice: Any) -> Reply:
    """A chat completion answering the sampling request, with this ``finish_reason`` (and more of the choice)."""
    body = {
        "id": "chatcmpl-emu",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish} | choice
        ],
    }
    return Reply(200, body)


def _draft(stop: list[str]) -> dict[str, Any]:
    return {"text": "the PR", "max_tokens": 50, "temperature": 0.0, "stop": stop, "hints": []}


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        pytest.param(_sampled("A dra", "length"), "maxTokens", id="length"),
        pytest.param(_sampled("A draft.", "stop", stop_reason="END"), "stopSequence", id="vllm-stop-sequence"),
        pytest.param(_sampled("A draft.", "stop"), "endTurn", id="natural-end"),
    ],
)
async def test_the_sampling_answer_says_why_the_model_stopped(
    bus: Bus,
    event_log: EventLog,
    executor: RunExecutor,
    pool: McpPool,
    emulator: OpenAIEmulator,
    reply: Reply,
    expected: str,
) -> None:
    emulator.replies += [
        assistant_tool_call("call_draft", "notes__draft", _draft(["END"])),
        reply,
        assistant_text("Done."),
    ]
    card = _card(emulator)
    await executor(cards=[card], card_tools={card.id: await list_card_tools(card, pool)})
    event = run_requested()
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    (called,) = event_log.of_type("run.tool_called", event.runid)
    result = json.loads(called.data["result_preview"])["result"]
    assert result.startswith(f"draft (test-model, {expected}): ")


async def test_at_most_four_stop_sequences_reach_the_provider(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, emulator: OpenAIEmulator
) -> None:
    stops = ["S1", "S2", "S3", "S4", "S5", "S6"]
    emulator.replies += [
        assistant_tool_call("call_draft", "notes__draft", _draft(stops)),
        assistant_text("A draft."),
        assistant_text("Done."),
    ]
    card = _card(emulator)
    await executor(cards=[card], card_tools={card.id: await list_card_tools(card, pool)})
    event = run_requested()
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    _, sampling, _ = emulator.requests
    assert sampling["stop"] == stops[:MAX_STOP_SEQUENCES] == ["S1", "S2", "S3", "S4"]  # the first four, in order


def test_stop_reason_reads_the_providers_finish() -> None:
    assert stop_reason(AssistantTurn(content="x", finish_reason="length"), ["END"]) == "maxTokens"
    assert stop_reason(AssistantTurn(content="x", finish_reason="stop", stop_sequence="END"), ["END"]) == "stopSequence"
    # a stop string the request did not ask for (or an end-of-sequence token) is no stop sequence of the request
    assert stop_reason(AssistantTurn(content="x", finish_reason="stop", stop_sequence="</s>"), ["END"]) == "endTurn"
    assert stop_reason(AssistantTurn(content="x", finish_reason="stop"), ["END"]) == "endTurn"
    assert stop_reason(AssistantTurn(content="x"), []) == "endTurn"
