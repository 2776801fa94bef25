"""What the run-executor keeps in KV: the run record and its last checkpoint (AP-7)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from temporality_protocol import HumanPolicy, LaunchSource, NormalizedEvent, RunState

__all__ = ["CancelRequest", "Checkpoint", "Message", "PendingAsk", "RunRecord", "ToolCall", "Usage"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Usage(_Model):
    """Tokens, as OpenAI-compatible endpoints report them in a completion's ``usage`` block."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )


class ToolCall(_Model):
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    #: The raw ``arguments`` text when the model sent something that is not a JSON object: the call is
    #: malformed, is not executed, and the model gets a tool error naming it on its next turn.
    invalid_arguments: str | None = None


class Message(_Model):
    """One conversation entry, OpenAI chat shape."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


class PendingAsk(_Model):
    """The ask_human call the run is parked on."""

    request_id: str
    call_id: str
    turn: int
    asked_at: datetime
    #: The validated ask_human arguments, so a crash between checkpoint and publish can re-park.
    arguments: dict[str, Any]


class CancelRequest(_Model):
    """A ``run.cancel_requested`` recorded on the run: whoever drives the run next cancels it (RUN-2)."""

    reason: str
    requested_by: str
    requested_at: datetime
    #: The id of the ``run.cancel_requested`` event (the ``run.cancelled``'s causation).
    event_id: str


class RunRecord(_Model):
    run_id: str
    state: RunState
    agent: str
    title: str
    launch: LaunchSource
    input: dict[str, Any] = Field(default_factory=dict)
    event: NormalizedEvent | None = None
    human: HumanPolicy = Field(default_factory=HumanPolicy)
    parent_run_id: str | None = None
    correlation_id: str
    tenant: str | None = None
    created_at: datetime
    updated_at: datetime
    waiting_request_id: str | None = None
    waiting_since: datetime | None = None
    result: str | None = None
    error: str | None = None
    #: The run's token totals, written when it completes or fails in its agent loop (the protocol's
    #: ``run.completed``/``run.failed`` have no field for them).
    usage: Usage | None = None
    #: Set once a cancel is asked for (the first one wins); the run moves to ``cancelled`` at the next turn
    #: boundary, at once if nobody is driving it (pending, waiting for a person).
    cancel: CancelRequest | None = None


class Checkpoint(_Model):
    checkpoint_id: str
    run_id: str
    turn: int
    saved_at: datetime
    messages: list[Message]
    pending: PendingAsk | None = None
    #: Seconds spent computing (provider + tools) over all committed turns; waiting is excluded.
    compute_s: float = 0.0
    #: Human requests whose outcome is already in ``messages`` (makes a redelivered answer a no-op).
    applied_requests: list[str] = Field(default_factory=list)
    #: Tokens used over all committed turns (the endpoints' ``usage`` blocks, summed).
    usage: Usage = Field(default_factory=Usage)
    #: Malformed tool calls (unparseable arguments, unknown tools) returned to the model so far.
    malformed_tool_calls: int = 0
