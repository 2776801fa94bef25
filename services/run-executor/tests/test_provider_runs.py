"""Provider behaviour seen from a run (real nats-server, the emulator over real HTTP): retries inside a
turn, refusals that fail the run, token accounting and the token limit, malformed tool calls."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from executor_support import REVIEWER, RunExecutor, run_record, run_requested

from temporality_bus import Bus
from temporality_protocol import (
    HumanAnswered,
    HumanRequested,
    OptionAnswer,
    RunCompleted,
    RunFailed,
    RunState,
    RunUsage,
    make_event,
)
from temporality_protocol.catalog import BUCKET_CHECKPOINTS
from temporality_run_executor.agents import AgentCard, Limits, ProviderConfig
from temporality_run_executor.records import Checkpoint, RunRecord, Usage
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import (
    OpenAIEmulator,
    assistant_text,
    assistant_tool_call,
    error_reply,
    malformed_tool_call,
    rate_limited,
    usage,
)

SECRET = "sk-run-secret-456"


@pytest.fixture
async def emulator(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[OpenAIEmulator]:
    monkeypatch.setenv("EMU_KEY", SECRET)
    async with OpenAIEmulator().serve() as emu:
        yield emu


def _card(emulator: OpenAIEmulator, limits: Limits | None = None, max_retries: int = 4) -> AgentCard:
    provider = ProviderConfig(
        kind="openai",
        base_url=emulator.base_url,
        model="test-model",
        api_key_env="EMU_KEY",
        max_retries=max_retries,
        retry_backoff_s=0.01,
        retry_backoff_max_s=0.05,
    )
    return REVIEWER.model_copy(update={"provider": provider, "limits": limits or Limits()})


async def _finished_record(bus: Bus, run_id: str | None, timeout_s: float = 10.0) -> RunRecord:
    """The run record once it is terminal (the event is published before the record is committed)."""
    assert run_id is not None
    return await run_record(
        bus, run_id, lambda r: r.state in (RunState.COMPLETED, RunState.FAILED), timeout_s=timeout_s
    )


async def test_rate_limits_and_5xx_are_retried_within_the_turn_and_tokens_are_totalled(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [
        rate_limited(retry_after="0"),
        error_reply(503, "overloaded"),
        assistant_tool_call("call_ctx", "get_input", {}, usage=usage(100, 10)),
        rate_limited(),
        assistant_text("Review done.", usage=usage(150, 20)),
    ]
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid)
    assert completed.data["result"] == "Review done."
    assert len(emulator.requests) == 5
    assert not event_log.of_type("run.failed", event.runid)
    # the run's totals: on run.completed and in the record (two turns, one tool call, both usage blocks)
    totals = RunUsage(turns=2, tool_calls=1, prompt_tokens=250, completion_tokens=30, total_tokens=280)
    assert completed.payload(RunCompleted).usage == totals
    record = await _finished_record(bus, event.runid)
    assert record.usage == totals
    ckpt = await (await bus.store(BUCKET_CHECKPOINTS, Checkpoint)).get(str(event.runid))
    assert ckpt is not None
    assert ckpt.value.usage == Usage(prompt_tokens=100, completion_tokens=10, total_tokens=110)  # committed turns


async def test_retries_used_up_fail_the_run_naming_the_status(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [error_reply(500, "upstream exploded")] * 3
    await executor(cards=[_card(emulator, max_retries=2)])
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid)
    assert failed.data["reason"] == "provider_error"
    assert "500: upstream exploded" in failed.data["error"]
    assert "gave up after 3 attempt(s)" in failed.data["error"]
    assert len(emulator.requests) == 3


@pytest.mark.parametrize(
    ("status", "message"),
    [(404, "The model `test-model` does not exist"), (401, f"Incorrect API key provided: {SECRET}")],
)
async def test_a_refusal_fails_the_run_with_status_and_message_never_the_key(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator, status: int, message: str
) -> None:
    emulator.replies.append(error_reply(status, message, kind="invalid_request_error"))
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid)
    assert failed.data["reason"] == "provider_error"
    assert f"({status})" in failed.data["error"]
    assert message.replace(SECRET, "[redacted]") in failed.data["error"]
    assert SECRET not in failed.data["error"]
    record = await _finished_record(bus, event.runid)
    assert record.error is not None
    assert SECRET not in record.error
    assert len(emulator.requests) == 1


async def test_passing_the_token_limit_fails_the_run(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [
        assistant_tool_call("call_ctx", "get_input", {}, usage=usage(50, 10)),  # 60: within 100
        assistant_text("a long review", usage=usage(70, 30)),  # 160: past it
    ]
    await executor(cards=[_card(emulator, Limits(max_tokens=100))])
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid)
    assert failed.data["reason"] == "token_limit"
    assert "160 tokens used" in failed.data["error"]
    assert "limit is 100" in failed.data["error"]
    assert not event_log.of_type("run.completed", event.runid)
    record = await _finished_record(bus, event.runid)
    assert record.usage is not None
    assert record.usage.total_tokens == 160
    # the failing turn counts: it was made and its tokens were spent, though it never committed
    totals = RunUsage(turns=2, tool_calls=1, prompt_tokens=120, completion_tokens=40, total_tokens=160)
    assert failed.payload(RunFailed).usage == totals == record.usage


async def test_the_run_totals_survive_a_park_and_resume(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    """Turns, tool calls and tokens before the park (in the checkpoint) and after the resume (another
    handler, reading the checkpoint back from KV) add up on run.completed."""
    ask = {"recipient": "user:alice", "question": "Keep v1?", "options": [{"id": "keep-v1", "label": "Keep v1"}]}
    emulator.replies += [
        assistant_tool_call("call_ctx", "get_input", {}, usage=usage(100, 10)),
        assistant_tool_call("call_ask", "ask_human", ask, usage=usage(120, 15)),
        assistant_text("Keeping v1.", usage=usage(200, 30)),
    ]
    await executor(cards=[_card(emulator)])
    event = run_requested()
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    (requested,) = await event_log.wait_for("human.requested", run_id=run_id)
    parked = await run_record(bus, run_id, RunState.WAITING_FOR_HUMAN, timeout_s=10.0)
    assert parked.usage is None  # written when the run ends
    ckpt = await (await bus.store(BUCKET_CHECKPOINTS, Checkpoint)).get(run_id)
    assert ckpt is not None
    assert (ckpt.value.turn, ckpt.value.tool_calls, ckpt.value.usage.total_tokens) == (2, 2, 245)
    answered = HumanAnswered(
        request_id=requested.payload(HumanRequested).request_id,
        run_id=run_id,
        recipient="user:alice",
        responder="user:alice",
        answer=OptionAnswer(option_id="keep-v1"),
        channel="web",
        waited_s=3.0,
    )
    await bus.publish(make_event(answered, source="/test", run_id=run_id))
    (completed,) = await event_log.wait_for("run.completed", run_id=run_id)
    assert completed.data["result"] == "Keeping v1."
    totals = RunUsage(turns=3, tool_calls=2, prompt_tokens=420, completion_tokens=55, total_tokens=475)
    assert completed.payload(RunCompleted).usage == totals
    assert (await _finished_record(bus, run_id)).usage == totals
    assert len(emulator.requests) == 3


async def test_malformed_tool_calls_go_back_to_the_model_as_tool_errors(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [
        malformed_tool_call("call_bad_json", "get_input", '{"oops": '),
        assistant_tool_call("call_unknown", "delete_repository", {"name": "orders"}),
        assistant_text("Recovered."),
    ]
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid)
    assert completed.data["result"] == "Recovered."
    assert len(emulator.requests) == 3
    second = emulator.requests[1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["arguments"] == '{"oops": '  # what the model sent
    error = json.loads(second[-1]["content"])["error"]
    assert "not a JSON object" in error
    assert second[-1]["tool_call_id"] == "call_bad_json"
    third = emulator.requests[2]["messages"]
    assert json.loads(third[-1]["content"])["error"].startswith("no tool named 'delete_repository'; your tools: ")
    called = [e.data["tool"] for e in event_log.of_type("run.tool_called", event.runid)]
    assert called == ["get_input", "delete_repository"]


async def test_too_many_malformed_tool_calls_fail_the_run(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [malformed_tool_call(f"call_{i}", "get_input", "nope") for i in range(3)]
    await executor(cards=[_card(emulator, Limits(max_malformed_tool_calls=1))])
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid)
    assert failed.data["reason"] == "malformed_tool_calls"
    assert len(emulator.requests) == 2  # the first went back to the model; the second was one too many
