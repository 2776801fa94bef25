"""A provider reply that cannot be read -- a ``content`` that is no text, ``tool_calls`` that are no list -- fails the
run ``provider_error`` (after the provider's retries), never dead-letters it (``infrastructure_error``), and is never
taken apart as it is (a string of ``tool_calls`` read one character at a time). Over a real nats-server, the model
behind the OpenAI emulator (real HTTP)."""

from __future__ import annotations

from typing import Any

import pytest
from executor_support import REVIEWER, RunExecutor, run_requested

from temporality_bus import Bus
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, Reply, assistant_text


def _reply(message: dict[str, Any], finish: str = "stop") -> Reply:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
    return Reply(200, {"id": "c", "object": "chat.completion", "choices": [choice]})


@pytest.mark.parametrize(
    ("message", "why"),
    [
        ({"content": 42}, "message.content is a int, not a string"),
        ({"content": None, "tool_calls": "get_input"}, "message.tool_calls is a str, not a list"),
    ],
)
async def test_an_unreadable_reply_fails_the_run_provider_error(
    bus: Bus,
    event_log: EventLog,
    executor: RunExecutor,
    emulator: OpenAIEmulator,
    message: dict[str, Any],
    why: str,
) -> None:
    provider = ProviderConfig(
        kind="openai", base_url=emulator.base_url, model="gpt-emu", max_retries=1, retry_backoff_s=0.01
    )
    card: AgentCard = REVIEWER.model_copy(update={"provider": provider, "tools": ToolPolicy(allow=["get_input"])})
    emulator.replies += [_reply(message), _reply(message)]
    await executor(cards=[card])
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid, timeout_s=60)
    assert failed.data["reason"] == "provider_error"
    assert failed.data["error"].startswith(f"malformed chat completion ({why}): ")
    assert "gave up after 2 attempt(s)" in failed.data["error"]
    assert len(emulator.requests) == 2  # retried once, as any malformed reply
    await event_log.caught_up()
    assert not event_log.of_type("run.tool_called", event.runid)


async def test_a_malformed_reply_then_a_good_one_completes(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    provider = ProviderConfig(
        kind="openai", base_url=emulator.base_url, model="gpt-emu", max_retries=1, retry_backoff_s=0.01
    )
    card: AgentCard = REVIEWER.model_copy(update={"provider": provider, "tools": ToolPolicy(allow=["get_input"])})
    emulator.replies += [_reply({"content": ["not", "text"]}), assistant_text("fine")]
    await executor(cards=[card])
    event = run_requested()
    await bus.publish(event)
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    assert completed.data["result"] == "fine"
