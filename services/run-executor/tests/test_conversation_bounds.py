"""What a run's conversation may hold (``bounds``): a model reply or tool result too big for the bus never
dead-letters the run. A tool's long result and a long final reply are cut, marked; a call with a huge name or
huge arguments is a malformed call the model is told about; a conversation still too big for the server's
``max_payload`` (read from the connection) fails the run ``conversation_too_large``, saying both sizes. Over a
real nats-server, the model behind the OpenAI emulator (real HTTP)."""

from __future__ import annotations

import json
from typing import Any

from executor_support import REVIEWER, RunExecutor, run_record, run_requested

from temporality_bus import Bus
from temporality_protocol import RunState
from temporality_run_executor.agents import AgentCard, Limits, ProviderConfig
from temporality_run_executor.bounds import MAX_ARGUMENTS_BYTES, MAX_ITEM_BYTES, MAX_RESULT_BYTES
from temporality_run_executor.tools import Tool, ToolContext, ToolPolicy
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, assistant_text, assistant_tool_call

#: What the test tool returns per call (bytes of ASCII).
_big: dict[str, int] = {"size": 2_000_000}


async def _read_big(arguments: dict[str, Any], ctx: ToolContext) -> str:
    return "x" * _big["size"]


BIG_READ = Tool(name="big_read", description="returns a lot", parameters={"type": "object"}, implementation=_read_big)


def _card(emulator: OpenAIEmulator, **limits: Any) -> AgentCard:
    provider = ProviderConfig(kind="openai", base_url=emulator.base_url, model="gpt-emu", max_retries=0)
    return REVIEWER.model_copy(
        update={
            "provider": provider,
            "tools": ToolPolicy(allow=["get_input", "notify", "big_read"]),
            "limits": Limits(**limits),
        }
    )


def _tool_results(request: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in request["messages"] if m["role"] == "tool"}


async def test_a_huge_tool_result_is_cut_and_the_model_told(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    _big["size"] = 2_000_000
    emulator.replies += [assistant_tool_call("call_big", "big_read", {}), assistant_text("done")]
    await executor(cards=[_card(emulator)], card_tools={"reviewer": [BIG_READ]})
    event = run_requested()
    await bus.publish(event)
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    assert completed.data["result"] == "done"
    result = _tool_results(emulator.requests[1])["call_big"]
    assert len(result.encode()) <= MAX_ITEM_BYTES
    assert result.startswith("xxxx")
    assert "[cut by Temporality: this result was 2000000 bytes; only its first 65536 are kept" in result
    (called,) = event_log.of_type("run.tool_called", event.runid)
    assert len(called.data["result_preview"]) <= 4096


async def test_huge_arguments_a_huge_name_and_a_huge_final_reply(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    """The reviewer's replies: 2 MB of tool arguments, a 300 KB tool name, a 3 MB final answer."""
    emulator.replies += [
        assistant_tool_call("call_args", "notify", {"recipient": "user:alice", "message": "m" * 2_000_000}),
        assistant_tool_call("call_name", "n" * 300_000, {}),
        assistant_text("r" * 3_000_000),
    ]
    await executor(cards=[_card(emulator)], card_tools={"reviewer": [BIG_READ]})
    event = run_requested()
    await bus.publish(event)
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)

    args_error = json.loads(_tool_results(emulator.requests[1])["call_args"])["error"]
    assert args_error.startswith("the arguments of 'notify' were ")
    assert f"a call may send at most {MAX_ARGUMENTS_BYTES}, so it was not made" in args_error
    sent = emulator.requests[1]["messages"][-2]["tool_calls"][0]["function"]["arguments"]
    assert len(sent) < 1024  # what the model sent, as the conversation keeps it
    assert "[cut by Temporality:" in sent
    name_error = json.loads(_tool_results(emulator.requests[2])["call_name"])["error"]
    assert name_error.startswith("a tool name must be at most 256 characters; this call's was 300000")

    record = await run_record(bus, event.runid, RunState.COMPLETED)
    assert record.result is not None
    assert len(record.result.encode()) <= MAX_RESULT_BYTES
    assert record.result.endswith(
        f"[cut by Temporality: the final reply was 3000000 bytes; its first {MAX_RESULT_BYTES} are kept]"
    )
    assert completed.data["result"] == record.result[:16384]
    assert completed.data["usage"]["tool_calls"] == 2
    await event_log.caught_up()
    assert not event_log.of_type("human.notify_requested", event.runid)  # the huge call was not made
    called = {e.data["call_id"]: e for e in event_log.of_type("run.tool_called", event.runid)}
    assert called["call_args"].data["arguments"] == {}  # the events carry none of it
    assert len(called["call_name"].data["tool"]) == 64
    assert not event_log.of_type("run.failed", event.runid)
