"""The provider seam: something that, given the conversation and tool specs, produces the next turn."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from pydantic import BaseModel, Field

from temporality_run_executor.records import Message, ToolCall, Usage

__all__ = [
    "AssistantTurn",
    "BudgetSpent",
    "PermanentProviderError",
    "Provider",
    "ProviderError",
    "SamplingOptions",
    "ToolSpec",
    "TurnContext",
]


class ToolSpec(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]


class SamplingOptions(BaseModel):
    """How a completion that answers an MCP tool's ``sampling/createMessage`` is asked (:mod:`..sampling`): the
    server's ``maxTokens`` (capped by the run's remaining tokens), ``temperature`` and ``stopSequences``, and the
    model its hints picked among the card's ``provider.sampling_models`` (``None``: the card's model)."""

    max_tokens: int
    temperature: float | None = None
    stop: list[str] = Field(default_factory=list)
    model: str | None = None
    #: The server's model hints as it sent them (``modelPreferences.hints[].name``), whether or not one matched.
    hints: list[str] = Field(default_factory=list)


class TurnContext(BaseModel):
    """What a provider may know of the run besides the conversation: the scripted provider templates from
    it (``run.people``...); model providers read only :attr:`sampling` from it (a model reads the prompt)."""

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
    #: Set when the call answers an MCP tool's sampling request rather than computing a turn: how it is asked
    #: (the OpenAI-compatible provider sends ``max_tokens``, ``temperature``, ``stop`` and the model).
    sampling: SamplingOptions | None = None


class AssistantTurn(BaseModel):
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    #: Tokens this turn cost, as the endpoint reported them (``None``: it reported nothing).
    usage: Usage | None = None
    #: Why the model stopped, as the endpoint said (OpenAI's ``finish_reason``: ``stop``, ``length``,
    #: ``tool_calls``...; ``None``: it did not say).
    finish_reason: str | None = None
    #: The stop sequence that ended the answer, when the endpoint names it (vLLM's ``stop_reason``; OpenAI's
    #: ``finish_reason`` is ``stop`` for a stop sequence and a natural end alike).
    stop_sequence: str | None = None


class ProviderError(Exception):
    """The provider could not produce a turn (network, 5xx, malformed reply). Transient by default."""


class PermanentProviderError(ProviderError):
    """Retrying will not help: the endpoint refused the request itself (4xx other than 408/429), or the
    provider already used up its retries or the run's compute budget on this turn."""


class BudgetSpent(PermanentProviderError):
    """The run's compute budget ran out in the call: its timeout was the budget left and passed, or a retry's wait
    would have passed it. The run fails ``compute_timeout``, not ``provider_error``."""


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
