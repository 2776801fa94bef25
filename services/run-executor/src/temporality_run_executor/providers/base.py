"""The provider seam: something that, given the conversation and tool specs, produces the next turn."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from pydantic import BaseModel, Field

from temporality_run_executor.records import Message, ToolCall, Usage

__all__ = ["AssistantTurn", "PermanentProviderError", "Provider", "ProviderError", "ToolSpec"]


class ToolSpec(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]


class AssistantTurn(BaseModel):
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    #: Tokens this turn cost, as the endpoint reported them (``None``: it reported nothing).
    usage: Usage | None = None


class ProviderError(Exception):
    """The provider could not produce a turn (network, 5xx, malformed reply). Transient by default."""


class PermanentProviderError(ProviderError):
    """Retrying will not help: the endpoint refused the request itself (4xx other than 408/429), or the
    provider already used up its retries or the run's compute budget on this turn."""


class Provider(ABC):
    @abstractmethod
    async def complete(
        self, messages: list[Message], tools: list[ToolSpec], *, budget_s: float | None = None
    ) -> AssistantTurn:
        """The next turn. ``budget_s``: the run's remaining compute budget, which bounds the retries."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections; most providers hold none."""
