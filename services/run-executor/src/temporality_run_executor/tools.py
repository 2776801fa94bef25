"""The tools an agent may call. ``ask_human`` parks the run; the others return at once."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from temporality_protocol import HumanOption
from temporality_run_executor.providers.base import ToolSpec
from temporality_run_executor.records import RunRecord

__all__ = ["ASK_HUMAN", "AskHumanArgs", "ToolError", "execute", "specs"]

ASK_HUMAN = "ask_human"


class AskHumanArgs(BaseModel):
    """HUM-1: ``ask_human(recipient, question, context, options, timeout)``."""

    model_config = ConfigDict(extra="forbid")

    recipient: Annotated[str, Field(pattern=r"^user:[A-Za-z0-9_.-]+$", description="A person: user:<id>")]
    question: Annotated[str, Field(min_length=1, max_length=4096)]
    context: Annotated[str, Field(max_length=4096)] = ""
    options: list[HumanOption] = Field(default_factory=list, max_length=10)
    timeout: Annotated[int, Field(gt=0, description="Seconds to wait; capped by the trigger's policy")] | None = None


class ToolError(Exception):
    """The call cannot be executed; its message goes back to the agent as the tool result."""


_SPECS: dict[str, ToolSpec] = {
    "get_pr_context": ToolSpec(
        name="get_pr_context",
        description="The normalized context of the event that started this run (repository, pull request, "
        "branches, author, reviewers, commits).",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
    ),
    ASK_HUMAN: ToolSpec(
        name=ASK_HUMAN,
        description="Ask a person a compact, self-contained question and wait (durably, at no cost) for the "
        "answer, which comes back as this tool's result. Name a person (user:<id>), never a channel.",
        parameters=AskHumanArgs.model_json_schema(),
    ),
}


def specs(allowed: list[str]) -> list[ToolSpec]:
    return [_SPECS[name] for name in allowed if name in _SPECS]


async def execute(name: str, arguments: dict[str, Any], run: RunRecord) -> str:
    """Run a non-parking tool; raise :class:`ToolError` for a call the agent got wrong."""
    if name == "get_pr_context":
        return json.dumps(run.input, sort_keys=True)
    raise ToolError(f"unknown tool {name!r}")
