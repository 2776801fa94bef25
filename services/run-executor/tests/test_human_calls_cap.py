"""One model reply may make at most ``limits.max_human_calls_per_reply`` ``ask_human`` and ``notify`` calls: the
ones past it are not made (no ``human.requested`` / ``human.notify_requested`` for them) and the model is told so
as their tool errors. Over a real nats-server, the model behind the OpenAI emulator (real HTTP)."""

from __future__ import annotations

import json
from typing import Any

from executor_support import REVIEWER, RunExecutor, run_requested

from temporality_bus import Bus
from temporality_run_executor.agents import AgentCard, Limits, ProviderConfig
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, Reply, assistant_text


def _calls(count: int) -> Reply:
    calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "notify", "arguments": json.dumps({"recipient": "user:alice", "message": f"n{i}"})},
        }
        for i in range(count)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
    return Reply(200, {"id": "c", "object": "chat.completion", "choices": [choice]})


async def test_calls_past_the_cap_are_not_made_and_the_model_is_told(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    provider = ProviderConfig(kind="openai", base_url=emulator.base_url, model="gpt-emu", max_retries=0)
    card: AgentCard = REVIEWER.model_copy(
        update={
            "provider": provider,
            "tools": ToolPolicy(allow=["notify", "ask_human"]),
            "limits": Limits(max_human_calls_per_reply=3),
        }
    )
    emulator.replies += [_calls(40), assistant_text("done")]
    await executor(cards=[card])
    event = run_requested()
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    await event_log.caught_up()
    assert len(event_log.of_type("human.notify_requested", event.runid)) == 3
    results = {
        m["tool_call_id"]: json.loads(m["content"]) for m in emulator.requests[1]["messages"] if m["role"] == "tool"
    }
    assert len(results) == 40
    assert all("error" not in results[f"call_{i}"] for i in range(3))
    refused = results["call_3"]["error"]
    assert refused.startswith(
        "one reply may make at most 3 ask_human and notify calls (limits.max_human_calls_per_reply)"
    )
    assert all("error" in results[f"call_{i}"] for i in range(3, 40))
    assert not event_log.of_type("run.failed", event.runid)  # not malformed calls: the run goes on


def test_the_default_cap_is_ten() -> None:
    assert Limits().max_human_calls_per_reply == 10
