"""Agent providers: the deterministic scripted one (demos/tests) and OpenAI-compatible endpoints."""

from temporality_run_executor.providers.base import (
    AssistantTurn,
    PermanentProviderError,
    Provider,
    ProviderError,
    ToolSpec,
)
from temporality_run_executor.providers.openai import OpenAICompatible
from temporality_run_executor.providers.scripted import ScriptedReviewer

__all__ = [
    "AssistantTurn",
    "OpenAICompatible",
    "PermanentProviderError",
    "Provider",
    "ProviderError",
    "ScriptedReviewer",
    "ToolSpec",
]
