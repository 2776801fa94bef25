"""A reply cut off at the output length limit (``finish_reason: length``) is never taken as finished work: a cut-off
final reply fails the run (``output_truncated``), a cut-off tool call is not made. Also a tool call that names no
tool. Over a real nats-server, the model behind the OpenAI emulator (real HTTP)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from executor_support import REVIEWER, RunExecutor, run_requested

from temporality_bus import Bus
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import (
    OpenAIEmulator,
    Reply,
    assistant_text,
    assistant_tool_call,
    malformed_tool_call,
    usage,
)


def _card(emulator: OpenAIEmulator) -> AgentCard:
    provider = ProviderConfig(kind="openai", base_url=emulator.base_url, model="gpt-emu", max_retries=0)
    return REVIEWER.model_copy(update={"provider": provider, "tools": ToolPolicy(allow=["get_input", "notify"])})


def _tool_results(request: dict[str, Any]) -> dict[str, Any]:
    return {m["tool_call_id"]: json.loads(m["content"]) for m in request["messages"] if m["role"] == "tool"}


@pytest.mark.parametrize("partial", ["The review: the change looks", None])
async def test_a_final_reply_cut_off_at_the_length_limit_fails_the_run(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator, partial: str | None
) -> None:
    emulator.replies.append(assistant_text(partial, finish="length", usage=usage(50, 4096)))
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid)
    assert failed.data["reason"] == "output_truncated"  # a reason of its own (provider_error before it)
    error = failed.data["error"]
    assert error.startswith("the final reply of model gpt-emu was cut off at the endpoint's output")
    assert "finish_reason 'length' after 4096 completion tokens" in error
    assert "max_tokens" in error
    await event_log.caught_up()
    assert not event_log.of_type("run.completed", event.runid)


async def test_a_tool_call_cut_off_at_the_length_limit_is_not_made(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [
        # arguments that happen to parse, and arguments cut mid-string: neither is made
        assistant_tool_call("call_whole", "notify", {"recipient": "user:alice", "message": "Review"}, finish="length"),
        malformed_tool_call("call_cut", "notify", '{"recipient": "user:alice", "message": "Rev', finish="length"),
        assistant_text("done"),
    ]
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid)
    assert completed.data["result"] == "done"
    for request, call_id in ((emulator.requests[1], "call_whole"), (emulator.requests[2], "call_cut")):
        error = _tool_results(request)[call_id]["error"]
        assert error.startswith("your reply was cut off at the output length limit (finish_reason 'length')")
        assert "none of them was made" in error
    await event_log.caught_up()
    assert not event_log.of_type("human.notify_requested", event.runid)


async def test_a_tool_call_that_names_no_tool_is_told_so(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    nameless = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_x", "type": "function", "function": {"arguments": "{}"}}],
    }
    body = {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": nameless}]}
    body["choices"][0]["finish_reason"] = "tool_calls"
    emulator.replies += [Reply(200, body), assistant_text("done")]
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=event.runid)
    assert _tool_results(emulator.requests[1])["call_x"]["error"] == (
        "a tool call must name its tool (function.name was missing); your tools: get_input, notify"
    )
