"""The provider seam: something that, given the conversation and tool specs, produces the next turn."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from pydantic import BaseModel, Field

from temporality_run_executor.records import Message, ToolCall

__all__ = ["AssistantTurn", "PermanentProviderError", "Provider", "ProviderError", "ToolSpec"]


class ToolSpec(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]


class AssistantTurn(BaseModel):
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ProviderError(Exception):
    """The provider could not produce a turn (network, 5xx, malformed reply). Transient by default."""


class PermanentProviderError(ProviderError):
    """The endpoint refused the request itself (4xx other than 408/429): retrying will not help."""


class Provider(ABC):
    @abstractmethod
    async def complete(self, messages: list[Message], tools: list[ToolSpec]) -> AssistantTurn: ...

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections; most providers hold none."""
