"""OBS-1: ``ask_human``'s optional ``reason`` (a short phrase) and ``reason_kind`` reach ``human.requested`` for the
journal's analytics. The scripted reviewer gives both; a model behind the OpenAI-compatible API (the emulator, real
HTTP) sees them in the tool's schema, gets a clear tool error for a reason over the bound (no question is asked) and
asks with a valid one; an ask without them carries ``None`` and checkpoints no reason keys. Over a real nats-server."""

from __future__ import annotations

import json
from typing import Any

from executor_support import REVIEWER, RunExecutor, keep_v1, run_requested

from temporality_bus import Bus
from temporality_protocol import MAX_REASON, HumanRequested, make_event
from temporality_protocol.catalog import BUCKET_CHECKPOINTS
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.records import Checkpoint
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, assistant_text, assistant_tool_call

ASK: dict[str, Any] = {
    "recipient": "user:alice",
    "question": "Must v1 clients keep working?",
    "options": [{"id": "keep-v1", "label": "Keep v1"}, {"id": "ship-v2", "label": "Ship v2"}],
}


async def test_the_scripted_reviewer_says_why_it_asks(bus: Bus, event_log: EventLog, executor: RunExecutor) -> None:
    await executor(cards=[REVIEWER])
    event = run_requested()
    await bus.publish(event)
    (requested,) = await event_log.wait_for("human.requested", run_id=event.runid)
    request = requested.payload(HumanRequested)
    assert request.reason == "API contract change, backward compatibility undecided"
    assert request.reason_kind == "decision"


def _card(emulator: OpenAIEmulator) -> AgentCard:
    provider = ProviderConfig(kind="openai", base_url=emulator.base_url, model="gpt-emu", max_retries=0)
    return REVIEWER.model_copy(update={"provider": provider, "tools": ToolPolicy(allow=["ask_human"])})


def _tool_results(request: dict[str, Any]) -> dict[str, Any]:
    return {m["tool_call_id"]: json.loads(m["content"]) for m in request["messages"] if m["role"] == "tool"}


async def test_a_model_sees_the_reason_in_the_schema_and_a_too_long_one_is_refused(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    too_long = ASK | {"reason": "x" * (MAX_REASON + 1), "reason_kind": "decision"}
    given = ASK | {"reason": "API compatibility undecided", "reason_kind": "decision"}
    emulator.replies += [
        assistant_tool_call("call_long", "ask_human", too_long),
        assistant_tool_call("call_ok", "ask_human", given),
        assistant_text("done"),
    ]
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    (requested,) = await event_log.wait_for("human.requested", run_id=event.runid, timeout_s=60)
    request = requested.payload(HumanRequested)
    assert (request.reason, request.reason_kind) == ("API compatibility undecided", "decision")
    await bus.publish(make_event(keep_v1(event.runid, request.request_id), source="/test", run_id=event.runid))
    await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    # the tool's schema as the model got it: both fields, the bound and the vocabulary
    (ask,) = [t["function"] for t in emulator.requests[0]["tools"] if t["function"]["name"] == "ask_human"]
    props = ask["parameters"]["properties"]
    assert "reason" in ask["description"]
    reason = next(s for s in props["reason"]["anyOf"] if s.get("type") == "string")
    assert reason["maxLength"] == MAX_REASON
    kind = next(s for s in props["reason_kind"]["anyOf"] if s.get("type") == "string")
    assert kind["enum"] == ["missing_knowledge", "decision", "approval", "ambiguity"]
    assert "reason" not in ask["parameters"].get("required", [])
    # the too-long reason: a tool error naming the field, and no question for it
    error = _tool_results(emulator.requests[1])["call_long"]["error"]
    assert error.startswith("invalid arguments for 'ask_human' at reason:")
    assert error.endswith("is too long")
    assert len(event_log.of_type("human.requested", event.runid)) == 1


async def test_an_ask_without_a_reason_carries_none(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [assistant_tool_call("call_1", "ask_human", ASK)]
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    (requested,) = await event_log.wait_for("human.requested", run_id=event.runid, timeout_s=60)
    request = requested.payload(HumanRequested)
    assert (request.reason, request.reason_kind) == (None, None)
    # the checkpoint (written before the question was published) holds the ask as before the fields existed
    got = await (await bus.store(BUCKET_CHECKPOINTS, Checkpoint)).get(event.runid)
    assert got is not None
    assert got.value.pending is not None
    assert not {"reason", "reason_kind"} & got.value.pending.arguments.keys()
