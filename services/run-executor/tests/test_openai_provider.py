"""The real LLM path: the OpenAI-compatible provider over real HTTP against an endpoint emulator."""

from __future__ import annotations

import json

import pytest
from executor_support import REVIEWER, RunExecutor, run_requested

from temporality_bus import Bus
from temporality_protocol import HumanAnswered, HumanRequested, OptionAnswer, make_event
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.providers import OpenAICompatible, PermanentProviderError, ProviderError, TurnContext
from temporality_run_executor.providers.openai import RetryableProviderError
from temporality_run_executor.records import Message, ToolCall
from temporality_run_executor.tools import BUILTIN_TOOLS, ToolPolicy, ToolRegistry
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, Reply, assistant_text, assistant_tool_call


def _card(emulator: OpenAIEmulator) -> AgentCard:
    provider = ProviderConfig(
        kind="openai", base_url=emulator.base_url, model="test-model", api_key_env="EMU_KEY", retry_backoff_s=0.01
    )
    return REVIEWER.model_copy(update={"provider": provider})


ASK = {
    "recipient": "user:alice",
    "question": "Keep the v1 contract?",
    "context": "The PR changes GET /api/orders/{id}.",
    "options": [{"id": "keep-v1", "label": "Keep v1"}, {"id": "ship-v2", "label": "Ship v2"}],
}


async def test_wire_format_of_requests_and_tool_calls(
    emulator: OpenAIEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator.replies.append(assistant_tool_call("call_1", "ask_human", ASK, content="I need a decision."))
    provider = OpenAICompatible(base_url=emulator.base_url, model="m", api_key="sk-test")
    try:
        turn = await provider.complete(
            [
                Message(role="system", content="sys"),
                Message(role="assistant", tool_calls=[ToolCall(id="c0", name="get_input", arguments={})]),
                Message(role="tool", tool_call_id="c0", name="get_input", content="{}"),
            ],
            ToolRegistry(BUILTIN_TOOLS).specs(ToolPolicy(allow=["get_input", "ask_human"])),
        )
    finally:
        await provider.aclose()
    assert turn.content == "I need a decision."
    assert turn.tool_calls == [ToolCall(id="call_1", name="ask_human", arguments=ASK)]
    sent = emulator.requests[0]
    assert sent["model"] == "m"
    assert [t["function"]["name"] for t in sent["tools"]] == ["get_input", "ask_human"]
    assert sent["tools"][1]["function"]["parameters"]["properties"]["recipient"]
    assert sent["messages"][1]["tool_calls"][0]["function"] == {"name": "get_input", "arguments": "{}"}
    assert sent["messages"][2] == {"role": "tool", "content": "{}", "tool_call_id": "c0", "name": "get_input"}


@pytest.mark.parametrize(("status", "retried"), [(500, True), (429, True), (408, True), (400, False)])
async def test_error_statuses_classify(emulator: OpenAIEmulator, status: int, retried: bool) -> None:
    emulator.replies.append(Reply(status, {"error": {"message": "nope"}}))
    provider = OpenAICompatible(base_url=emulator.base_url, model="m", api_key=None, max_retries=0)
    try:
        with pytest.raises(PermanentProviderError, match=rf"{status}\)?: nope") as info:
            await provider.complete([Message(role="user", content="hi")], [])
    finally:
        await provider.aclose()
    # retryable errors are retried (none left here: max_retries=0) and say so; the rest are refusals
    assert ("gave up after 1 attempt" in str(info.value)) == retried
    assert isinstance(info.value.__cause__, RetryableProviderError) == retried


async def test_malformed_completion_is_a_provider_error(emulator: OpenAIEmulator) -> None:
    emulator.replies.append(Reply(200, {"choices": []}))
    provider = OpenAICompatible(base_url=emulator.base_url, model="m", api_key=None, max_retries=0)
    try:
        with pytest.raises(ProviderError, match="malformed"):
            await provider.complete([Message(role="user", content="hi")], [])
    finally:
        await provider.aclose()


async def test_tool_arguments_nested_past_the_parsers_depth_go_back_to_the_model(emulator: OpenAIEmulator) -> None:
    nested = "[" * 50_000 + "]" * 50_000
    call = {"id": "call_1", "type": "function", "function": {"name": "notify", "arguments": nested}}
    emulator.replies.append(Reply(200, {"choices": [{"message": {"role": "assistant", "tool_calls": [call]}}]}))
    provider = OpenAICompatible(base_url=emulator.base_url, model="m", api_key=None, max_retries=0)
    try:
        turn = await provider.complete([Message(role="user", content="hi")], [])
    finally:
        await provider.aclose()
    assert [(c.name, c.arguments, c.invalid_arguments) for c in turn.tool_calls] == [("notify", {}, nested)]


async def test_a_model_driven_run_parks_on_ask_human_and_gets_the_answer_as_tool_result(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [
        assistant_tool_call("call_ctx", "get_input", {}),
        Reply(503, {"error": {"message": "overloaded"}}),  # transient: the turn is retried
        assistant_tool_call("call_ask", "ask_human", ASK),
        assistant_text("Review done. Decision: keep v1."),
    ]
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    (req,) = await event_log.wait_for("human.requested", run_id=event.runid)
    request = req.payload(HumanRequested)
    assert request.question == "Keep the v1 contract?"
    answered = HumanAnswered(
        request_id=request.request_id,
        run_id=request.run_id,
        recipient="user:alice",
        responder="user:alice",
        answer=OptionAnswer(option_id="keep-v1", label="Keep v1"),
        channel="web",
        waited_s=1,
    )
    await bus.publish(make_event(answered, source="/test", run_id=request.run_id))
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid)
    assert completed.data["result"] == "Review done. Decision: keep v1."
    # the model saw the PR context and then the human's answer as the ask_human tool result
    assert len(emulator.requests) == 4
    final_messages = emulator.requests[-1]["messages"]
    tool_results = {m["tool_call_id"]: m for m in final_messages if m["role"] == "tool"}
    assert json.loads(tool_results["call_ctx"]["content"])["pull_request"]["id"] == 42
    answer = json.loads(tool_results["call_ask"]["content"])
    assert answer["status"] == "answered"
    assert answer["answer"]["option_id"] == "keep-v1"
    assert answer["responder"] == "user:alice"


async def test_a_refusing_endpoint_fails_the_run_without_retrying(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies.append(Reply(401, {"error": {"message": "bad key"}}))
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid)
    assert failed.data["reason"] == "provider_error"
    assert "401" in failed.data["error"]
    assert len(emulator.requests) == 1


async def test_invalid_ask_human_arguments_go_back_to_the_model(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [
        assistant_tool_call("call_bad", "ask_human", {"recipient": "#general", "question": "?"}),
        assistant_text("Could not ask; finishing without a decision."),
    ]
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=event.runid)
    tool_msg = next(m for m in emulator.requests[1]["messages"] if m["role"] == "tool")
    # checked against the tool's JSON schema; the error says where and why
    error = json.loads(tool_msg["content"])["error"]
    assert "invalid arguments for 'ask_human' at recipient" in error
    assert "does not match" in error
    assert not event_log.of_type("human.requested", event.runid)


def _calls_reply(*calls: dict[str, object]) -> Reply:
    message = {"role": "assistant", "content": None, "tool_calls": list(calls)}
    return Reply(200, {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})


def _raw(name: str, call_id: object = None) -> dict[str, object]:
    raw: dict[str, object] = {"type": "function", "function": {"name": name, "arguments": "{}"}}
    return raw if call_id is None else {"id": call_id, **raw}


async def test_tool_calls_without_an_id_or_with_a_repeated_one_get_their_place_in_the_run(
    emulator: OpenAIEmulator,
) -> None:
    """A call the endpoint sent without an id (or an empty, non-string or repeated one) gets ``call-<turn>-<index>``,
    never the text ``None``: each tool result answers one call, and a replayed turn keeps the same ids."""
    emulator.replies.append(
        _calls_reply(_raw("get_input"), _raw("get_input", "dup"), _raw("get_input", "dup"), _raw("get_input", 7))
    )
    provider = OpenAICompatible(base_url=emulator.base_url, model="m", api_key=None)
    context = TurnContext(run_id="run-1", agent="reviewer", title="t", turn=3)
    try:
        turn = await provider.complete([Message(role="user", content="go")], [], context=context)
    finally:
        await provider.aclose()
    assert [c.id for c in turn.tool_calls] == ["call-3-0", "dup", "call-3-2", "call-3-3"]


async def test_a_run_answers_a_tool_call_without_an_id_under_the_id_it_was_given(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [_calls_reply(_raw("get_input"), _raw("get_input", "")), assistant_text("Done.")]
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=event.runid)
    await event_log.caught_up()
    called = [e.data["call_id"] for e in event_log.of_type("run.tool_called", event.runid)]
    assert called == ["call-1-0", "call-1-1"]
    sent = emulator.requests[1]["messages"]
    (assistant,) = [m for m in sent if m["role"] == "assistant"]
    assert [c["id"] for c in assistant["tool_calls"]] == ["call-1-0", "call-1-1"]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ["call-1-0", "call-1-1"]
