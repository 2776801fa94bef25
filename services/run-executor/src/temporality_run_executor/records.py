"""What the run-executor keeps in KV: the run record and its last checkpoint (AP-7)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from temporality_protocol import HumanPolicy, LaunchSource, NormalizedEvent, RunState

__all__ = ["Checkpoint", "Message", "PendingAsk", "RunRecord", "ToolCall"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ToolCall(_Model):
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


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
