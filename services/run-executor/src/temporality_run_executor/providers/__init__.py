"""Agent providers: the scripted one (deterministic, for demos and tests) and OpenAI-compatible endpoints."""

from temporality_run_executor.providers.base import (
    AssistantTurn,
    BudgetSpent,
    PermanentProviderError,
    Provider,
    ProviderError,
    SamplingOptions,
    ToolSpec,
    TurnContext,
)
from temporality_run_executor.providers.openai import OpenAICompatible
from temporality_run_executor.providers.scripted import ScriptedProvider

__all__ = [
    "AssistantTurn",
    "BudgetSpent",
    "OpenAICompatible",
    "PermanentProviderError",
    "Provider",
    "ProviderError",
    "SamplingOptions",
    "ScriptedProvider",
    "ToolSpec",
    "TurnContext",
]
