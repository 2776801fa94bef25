"""An OpenAI-compatible chat-completions provider with tool calling.

Works with OpenAI, Azure OpenAI (deployment URL as ``base_url``), vLLM, Ollama and llama.cpp's server:
anything that speaks ``POST {base_url}/chat/completions`` with ``tools``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from temporality_run_executor.providers.base import (
    AssistantTurn,
    PermanentProviderError,
    Provider,
    ProviderError,
    ToolSpec,
)
from temporality_run_executor.records import Message, ToolCall

__all__ = ["OpenAICompatible"]


class OpenAICompatible(Provider):
    def __init__(self, *, base_url: str, model: str, api_key: str | None, timeout_s: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout_s, headers=headers)
        self._model = model

    async def complete(self, messages: list[Message], tools: list[ToolSpec]) -> AssistantTurn:
        body: dict[str, Any] = {"model": self._model, "messages": [_wire(m) for m in messages]}
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
            body["tool_choice"] = "auto"
        try:
            response = await self._client.post("/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise ProviderError(f"chat completion request failed: {exc!r}") from exc
        if response.status_code in (408, 429) or response.status_code >= 500:
            raise ProviderError(f"chat completion endpoint answered {response.status_code}")
        if response.status_code >= 400:
            raise PermanentProviderError(f"chat completion refused ({response.status_code}): {response.text[:500]}")
        try:
            message = response.json()["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ProviderError(f"malformed chat completion: {response.text[:500]}") from exc
        calls = []
        for raw in message.get("tool_calls") or []:
            function = raw.get("function", {})
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except json.JSONDecodeError:
                arguments = {"__unparseable_arguments__": function.get("arguments")}
            if not isinstance(arguments, dict):
                arguments = {"__unparseable_arguments__": function.get("arguments")}
            calls.append(ToolCall(id=str(raw.get("id")), name=str(function.get("name")), arguments=arguments))
        return AssistantTurn(content=message.get("content"), tool_calls=calls)

    async def aclose(self) -> None:
        await self._client.aclose()


def _wire(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in message.tool_calls
        ]
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
        out["name"] = message.name
    return out
