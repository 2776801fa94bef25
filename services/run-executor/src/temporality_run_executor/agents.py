"""Agent cards (id, role, system prompt, tools, provider, limits) loaded from YAML.

The card holds the agent's behaviour; a trigger never carries a system prompt (TRG-8).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

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
    timeout_s: float = 60.0


class Limits(_Strict):
    max_turns: Annotated[int, Field(gt=0, le=500)] = 20
    #: Compute budget in seconds: time spent in the provider and in tools. Waiting for a human is not
    #: compute and never counts (RUN-3).
    max_compute_s: Annotated[float, Field(gt=0)] = 900.0


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
