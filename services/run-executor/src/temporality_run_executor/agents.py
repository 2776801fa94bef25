"""Agent cards (id, role, system prompt, tools, provider, limits) loaded from YAML.

The card holds the agent's behaviour; a trigger never carries a system prompt (TRG-8).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = ["AgentCard", "AgentDirectory", "AgentsFileError", "Limits", "ProviderConfig", "load_agents"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProviderConfig(_Strict):
    #: ``scripted`` is the deterministic demo/test provider; ``openai`` any OpenAI-compatible endpoint.
    kind: Literal["scripted", "openai"]
    #: For ``scripted``: which script (``reviewer``).
    script: str | None = None
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    #: Seconds one request may take (connect, send, wait for the answer) before it counts as failed.
    timeout_s: Annotated[float, Field(gt=0, le=600)] = 60.0
    #: Retries of one turn after a 429, a 408, a 5xx, a connection error or a timeout (0: none). Each waits
    #: ``Retry-After`` when the endpoint sends it, else an exponential backoff with jitter from
    #: ``retry_backoff_s`` up to ``retry_backoff_max_s``; never past the run's remaining compute budget.
    max_retries: Annotated[int, Field(ge=0, le=20)] = 4
    retry_backoff_s: Annotated[float, Field(ge=0, le=60)] = 1.0
    retry_backoff_max_s: Annotated[float, Field(ge=0, le=600)] = 30.0

    @model_validator(mode="after")
    def _backoff_range(self) -> ProviderConfig:
        if self.retry_backoff_max_s < self.retry_backoff_s:
            raise ValueError("retry_backoff_max_s must be at least retry_backoff_s")
        return self


class Limits(_Strict):
    max_turns: Annotated[int, Field(gt=0, le=500)] = 20
    #: Compute budget in seconds: time spent in the provider and in tools. Waiting for a human is not
    #: compute and never counts (RUN-3).
    max_compute_s: Annotated[float, Field(gt=0)] = 900.0
    #: Token budget over the whole run (the endpoint's ``usage.total_tokens``, summed); unset: no limit.
    #: A turn that takes the total past it fails the run (reason ``token_limit``).
    max_tokens: Annotated[int, Field(gt=0)] | None = None
    #: Malformed tool calls (arguments that are not a JSON object, a tool the card does not allow) the
    #: model may make over the run; each goes back to it as a tool error. One more fails the run
    #: (reason ``malformed_tool_calls``).
    max_malformed_tool_calls: Annotated[int, Field(ge=0, le=100)] = 5


class AgentCard(_Strict):
    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    role: str
    description: str = ""
    system_prompt: str
    tools: list[str] = Field(default_factory=lambda: ["get_pr_context", "ask_human"])
    provider: ProviderConfig
    limits: Limits = Field(default_factory=Limits)


class _AgentsFile(_Strict):
    agents: list[AgentCard]


class AgentsFileError(Exception):
    pass


class AgentDirectory:
    def __init__(self, cards: list[AgentCard]) -> None:
        self._cards = {c.id: c for c in cards}
        if len(self._cards) != len(cards):
            raise AgentsFileError("duplicate agent ids")

    def get(self, agent_id: str) -> AgentCard | None:
        return self._cards.get(agent_id)

    def cards(self) -> list[AgentCard]:
        return list(self._cards.values())

    def __len__(self) -> int:
        return len(self._cards)


def load_agents(path: Path) -> AgentDirectory:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        return AgentDirectory(_AgentsFile.model_validate(raw).agents)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise AgentsFileError(f"{path}: {exc}") from exc
