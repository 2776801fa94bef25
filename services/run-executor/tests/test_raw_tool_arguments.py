"""Tool-call arguments that are not a JSON object are journaled as written (``run.tool_called.raw_arguments``):
bounded at 2,000 characters and redacted, so who reads the journal sees what the model sent (``result_preview``
cuts it at 200). Over a real nats-server, the model behind the OpenAI emulator (real HTTP)."""

from __future__ import annotations

from executor_support import REVIEWER, RunExecutor, run_requested

from temporality_bus import Bus
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, assistant_text, assistant_tool_call, malformed_tool_call


def _card(emulator: OpenAIEmulator) -> AgentCard:
    provider = ProviderConfig(kind="openai", base_url=emulator.base_url, model="gpt-emu", max_retries=0)
    return REVIEWER.model_copy(update={"provider": provider, "tools": ToolPolicy(allow=["get_input", "notify"])})


async def test_arguments_that_are_not_json_are_journaled_raw_bounded_and_redacted(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    raw = '{"recipient": "user:alice", "message": "DB_PASSWORD=s3cr3t-value-123 ' + "x" * 3000  # not closed
    emulator.replies += [
        malformed_tool_call("call_bad", "notify", raw),
        assistant_tool_call("call_ok", "get_input", {}),
        assistant_text("done"),
    ]
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=event.runid)
    await event_log.caught_up()
    called = {e.data["call_id"]: e.data for e in event_log.of_type("run.tool_called", event.runid)}
    bad = called["call_bad"]
    assert bad["arguments"] == {}
    journaled = bad["raw_arguments"]
    assert journaled.startswith('{"recipient": "user:alice", "message": "DB_PASSWORD=')
    assert "s3cr3t-value-123" not in journaled
    assert "[REDACTED:" in journaled
    assert len(journaled) == 2000
    assert called["call_ok"]["raw_arguments"] is None  # a call with valid arguments has none
