"""The provider seam: something that, given the conversation and tool specs, produces the next turn."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from pydantic import BaseModel, Field

from temporality_run_executor.records import Message, ToolCall, Usage

__all__ = ["AssistantTurn", "PermanentProviderError", "Provider", "ProviderError", "ToolSpec", "TurnContext"]


class ToolSpec(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]


class TurnContext(BaseModel):
    """What a provider may know of the run besides the conversation: the scripted provider templates from
    it (``run.people``...); model providers ignore it (a model reads the prompt)."""

    run_id: str
    agent: str
    title: str
    #: Whom the run may ask (the trigger's ``allowed_recipients``).
    people: list[str] = Field(default_factory=list)
    #: The turn being computed (1 for the first).
    turn: int
    #: Agent messages delivered so far, oldest first (``AgentMail`` as JSON: ``kind``, ``request_id``,
    #: ``sender``, ``text``...), as framed into the conversation (COL-4).
    mail: list[dict[str, Any]] = Field(default_factory=list)
    #: Request ids this run received and has not answered yet (``answer_agent`` accepts these).
    asks: list[str] = Field(default_factory=list)
    #: This is a relay run (it answers one ask for a finished run of its agent, COL-6).
    relay: bool = False


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
        self,
        messages: list[Message],
        tools: list[ToolSpec],
        *,
        budget_s: float | None = None,
        context: TurnContext | None = None,
    ) -> AssistantTurn:
        """The next turn. ``budget_s``: the run's remaining compute budget, which bounds the retries;
        ``context``: the run's facts (see :class:`TurnContext`)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections; most providers hold none."""
