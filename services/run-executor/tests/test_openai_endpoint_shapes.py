"""What an OpenAI-compatible endpoint may send or need, over real HTTP against the endpoint emulator.

- a tool call without ``arguments`` (or ``null``) is a call with no arguments, not a malformed one;
- a ``base_url`` with a query (Azure OpenAI's ``?api-version=``) posts to ``<path>/chat/completions`` with the
  query kept;
- a ``base_url`` with ``user:password@`` is refused at card load, naming the card and the field (httpx would
  send it as Basic auth in place of the API key, and the 401 would blame the key).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from temporality_run_executor.__main__ import configure
from temporality_run_executor.providers import OpenAICompatible
from temporality_run_executor.records import Message, ToolCall
from temporality_run_executor.settings import Settings
from temporality_service import ConfigError
from temporality_testing.openai_emulator import OpenAIEmulator, Reply, assistant_text

HI = [Message(role="user", content="hi")]


def _tool_call_reply(function: dict[str, Any]) -> Reply:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": function}],
    }
    body = {
        "id": "chatcmpl-emu",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
    }
    return Reply(200, body)


@pytest.mark.parametrize(
    "function",
    [
        {"name": "get_input"},
        {"name": "get_input", "arguments": None},
        {"name": "get_input", "arguments": ""},
        {"name": "get_input", "arguments": "null"},
    ],
    ids=["missing", "null", "empty", "null-text"],
)
async def test_a_tool_call_without_arguments_is_a_call_with_none(
    emulator: OpenAIEmulator, function: dict[str, Any]
) -> None:
    emulator.replies.append(_tool_call_reply(function))
    provider = OpenAICompatible(base_url=emulator.base_url, model="m", api_key=None, max_retries=0)
    try:
        turn = await provider.complete(HI, [])
    finally:
        await provider.aclose()
    assert turn.tool_calls == [ToolCall(id="c1", name="get_input", arguments={})]


@pytest.mark.parametrize("arguments", ["[1]", "42", "{not json"])
async def test_arguments_that_are_not_an_object_stay_malformed(emulator: OpenAIEmulator, arguments: str) -> None:
    emulator.replies.append(_tool_call_reply({"name": "get_input", "arguments": arguments}))
    provider = OpenAICompatible(base_url=emulator.base_url, model="m", api_key=None, max_retries=0)
    try:
        turn = await provider.complete(HI, [])
    finally:
        await provider.aclose()
    assert turn.tool_calls == [ToolCall(id="c1", name="get_input", invalid_arguments=arguments)]


async def test_a_base_url_query_is_kept_as_the_request_query(emulator: OpenAIEmulator) -> None:
    emulator.replies += [assistant_text("one"), assistant_text("two")]
    base_url = f"{emulator.base_url}/?api-version=2024-10-21&extra=a%20b"
    provider = OpenAICompatible(base_url=base_url, model="m", api_key="sk-azure", max_retries=0)
    try:
        assert (await provider.complete(HI, [])).content == "one"  # the emulator serves only /v1/chat/completions
        assert (await provider.complete(HI, [])).content == "two"
    finally:
        await provider.aclose()
    assert emulator.queries == [{"api-version": "2024-10-21", "extra": "a b"}] * 2
    assert emulator.authorizations == ["Bearer sk-azure"] * 2


async def test_a_base_url_without_a_query_sends_none(emulator: OpenAIEmulator) -> None:
    emulator.replies.append(assistant_text("one"))
    provider = OpenAICompatible(base_url=emulator.base_url, model="m", api_key=None, max_retries=0)
    try:
        await provider.complete(HI, [])
    finally:
        await provider.aclose()
    assert emulator.queries == [{}]


CARD = """
agents:
  - id: azure-coder
    role: Coder
    system_prompt: You write code.
    provider: {{kind: openai, base_url: "{base_url}", model: m, api_key_env: CODER_KEY}}
"""


@pytest.mark.parametrize("userinfo", ["ci:hunter2@", "ci@"])
def test_a_base_url_with_user_info_is_refused_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, userinfo: str
) -> None:
    monkeypatch.setenv("CODER_KEY", "sk-x")
    path = tmp_path / "agents.yaml"
    path.write_text(CARD.format(base_url=f"https://{userinfo}example.openai.azure.com/openai/v1"), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        configure(Settings(agents_file=path))
    text = str(info.value)
    assert "agents[0] (azure-coder): provider.base_url:" in text, text
    assert "must not carry a user name or password" in text
    assert "api_key_env" in text
    assert "hunter2" not in text
