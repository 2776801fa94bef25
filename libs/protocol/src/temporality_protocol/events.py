"""pydantic v2 models for the ``data`` of every event (DC-4). Event names are canonical (OBS-1).

Each model carries its CloudEvents ``type`` as ``EVENT_TYPE``; :data:`EVENT_MODELS` maps every type
to its model. Models ignore unknown fields on read so newer writers do not break older readers
(PRO-3); writers construct them from code, so they never carry unknown fields.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "EVENT_MODELS",
    "Actor",
    "AgentSummary",
    "BusDeadLettered",
    "Collaborator",
    "CollaboratorsQuery",
    "CollaboratorsReply",
    "DeliveryAttempt",
    "EventData",
    "HumanAnswer",
    "HumanAnswered",
    "HumanExpired",
    "HumanNotified",
    "HumanNotifyRequested",
    "HumanOption",
    "HumanPolicy",
    "HumanRejected",
    "HumanRequested",
    "LaunchSource",
    "NormalizedEvent",
    "OptionAnswer",
    "RunCancelRequested",
    "RunCancelled",
    "RunCheckpointed",
    "RunCompleted",
    "RunCreated",
    "RunFailed",
    "RunRequested",
    "RunResumed",
    "RunStarted",
    "RunToolCalled",
    "TextAnswer",
    "TimeoutPolicy",
    "ToolFailed",
    "TriggerAccepted",
    "TriggerChange",
    "TriggerCreated",
    "TriggerDeleted",
    "TriggerDisabled",
    "TriggerEnabled",
    "TriggerReceived",
    "TriggerRejected",
    "TriggerUpdated",
]

#: Free-text payloads in events are cut to this many characters (COL-9 uses the same bound).
MAX_TEXT = 4096


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class EventData(_Model):
    """Base of every event's ``data``."""

    EVENT_TYPE: ClassVar[str]


# --------------------------------------------------------------------------- shared shapes
class Actor(_Model):
    """Who caused an event: a person in the source system, a service, an agent."""

    id: str
    type: Literal["user", "service", "agent", "system"] = "user"
    display_name: str | None = None


class NormalizedEvent(_Model):
    """TRG-4: every source becomes this; agents never see the raw webhook format."""

    id: str = Field(description="The source's own event id (Azure DevOps `id`, GitHub delivery id, ...)")
    type: str = Field(description="Source-qualified event type, e.g. `azure_devops.git.pullrequest.created`")
    source: str = Field(description="Where it came from, e.g. the Azure DevOps collection URL")
    timestamp: datetime
    actor: Actor | None = None
    tenant: str | None = None
    payload: dict[str, Any] = Field(description="The mapped, source-independent data the agent receives")
    metadata: dict[str, str] = Field(default_factory=dict)


class HumanOption(_Model):
    """HUM-6: a structured choice; ``id`` is the machine-readable value that is kept."""

    id: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
    label: Annotated[str, Field(min_length=1, max_length=200)]
    consequence: str | None = Field(default=None, description="What choosing it leads to (HUM-5)")


class TimeoutPolicy(_Model):
    """HUM-8: what happens when nobody answers in time. Part of the trigger/run config, never a channel's."""

    action: Literal["fail", "default"] = "fail"
    default_option: str | None = None

    @model_validator(mode="after")
    def _default_needs_option(self) -> TimeoutPolicy:
        if self.action == "default" and not self.default_option:
            raise ValueError("on_timeout action 'default' needs default_option")
        return self


class HumanPolicy(_Model):
    """Whom a run may ask and how long it may wait (SEC-1, HUM-8). Comes from the trigger, never the event."""

    allowed_recipients: list[str] = Field(default_factory=list)
    default_timeout_s: Annotated[int, Field(gt=0)] = 3600
    max_timeout_s: Annotated[int, Field(gt=0)] = 7 * 24 * 3600
    on_timeout: TimeoutPolicy = Field(default_factory=TimeoutPolicy)


class LaunchSource(_Model):
    kind: Literal["webhook", "event", "schedule", "api"]
    trigger_id: str | None = None
    delivery_id: str | None = None


class OptionAnswer(_Model):
    type: Literal["option"] = "option"
    option_id: str
    label: str | None = None


class TextAnswer(_Model):
    type: Literal["text"] = "text"
    value: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]


HumanAnswer = Annotated[OptionAnswer | TextAnswer, Field(discriminator="type")]


# --------------------------------------------------------------------------- trigger.*
class TriggerReceived(EventData):
    EVENT_TYPE: ClassVar[str] = "trigger.received"
    trigger_id: str
    delivery_id: str
    adapter: str
    source_event_id: str | None = None
    source_event_type: str | None = None
    body_bytes: int


class TriggerAccepted(EventData):
    EVENT_TYPE: ClassVar[str] = "trigger.accepted"
    trigger_id: str
    delivery_id: str
    source_event_id: str
    run_id: str
    agent: str


class TriggerRejected(EventData):
    EVENT_TYPE: ClassVar[str] = "trigger.rejected"
    trigger_id: str
    delivery_id: str
    #: ``invalid_payload``: an authenticated delivery refused with 400/413/422 (never for bad credentials).
    #: ``missed_tick``: a schedule tick handled past its grace, for a trigger whose missed policy is ``skip``.
    reason: Literal["duplicate", "unsupported_event", "disabled", "invalid_payload", "missed_tick"]
    detail: str
    source_event_id: str | None = None
    run_id: str | None = None


class TriggerChange(EventData):
    """Base of the trigger audit events (TRG-1): who changed which trigger to which store revision.

    Published by the trigger-gateway's admin API (``changed_by`` = the API token's name) and when the
    triggers file seeds a trigger (``changed_by`` = ``file:<path>``). Never carries a secret."""

    trigger_id: str
    #: The trigger store's revision after the change (the admin API's ETag).
    revision: int
    changed_by: str
    trigger_type: str | None = None
    agent: str | None = None
    enabled: bool | None = None


class TriggerCreated(TriggerChange):
    EVENT_TYPE: ClassVar[str] = "trigger.created"


class TriggerUpdated(TriggerChange):
    EVENT_TYPE: ClassVar[str] = "trigger.updated"


class TriggerDeleted(TriggerChange):
    EVENT_TYPE: ClassVar[str] = "trigger.deleted"


class TriggerEnabled(TriggerChange):
    EVENT_TYPE: ClassVar[str] = "trigger.enabled"


class TriggerDisabled(TriggerChange):
    EVENT_TYPE: ClassVar[str] = "trigger.disabled"


# --------------------------------------------------------------------------- run.*
class RunRequested(EventData):
    EVENT_TYPE: ClassVar[str] = "run.requested"
    run_id: str
    agent: str
    title: Annotated[str, Field(max_length=200)]
    launch: LaunchSource
    event: NormalizedEvent | None = Field(
        default=None, description="The event that started the run; its payload is omitted when it is the input"
    )
    input: dict[str, Any] = Field(default_factory=dict, description="The mapped data the agent receives (TRG-8)")
    human: HumanPolicy = Field(default_factory=HumanPolicy)
    parent_run_id: str | None = None


class RunCreated(EventData):
    EVENT_TYPE: ClassVar[str] = "run.created"
    run_id: str
    agent: str
    title: str
    launch: LaunchSource


class AgentSummary(_Model):
    """RUN-1: what a run was started with, from its agent card (the prompt itself stays in the card)."""

    provider: str = Field(description="`openai` or `scripted` (deterministic, for demos and tests)")
    model: str | None = None
    skills: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list, description="The tools the run is offered (after allow/deny)")
    mcp_servers: list[str] = Field(default_factory=list)
    max_turns: int
    max_tokens: int | None = None
    max_compute_s: float = Field(description="Compute budget in seconds; waiting for a person never counts")


class RunStarted(EventData):
    EVENT_TYPE: ClassVar[str] = "run.started"
    run_id: str
    agent: str
    role: str
    title: str
    parent_run_id: str | None = None
    agent_card: AgentSummary | None = None


class RunToolCalled(EventData):
    """One tool call the agent made and what it returned (UI-1: reasoning/tool calls)."""

    EVENT_TYPE: ClassVar[str] = "run.tool_called"
    run_id: str
    turn: int
    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result_preview: Annotated[str, Field(max_length=MAX_TEXT)] = ""


class ToolFailed(EventData):
    """A tool the agent called raised instead of returning (a broken tool, an unreachable MCP server).

    The run goes on: the error goes back to the model as the call's tool result. Deterministic id per
    (run, turn, call): a redelivered turn republishes the same fact.
    """

    EVENT_TYPE: ClassVar[str] = "tool.failed"
    run_id: str
    turn: int
    call_id: str
    tool: str
    error: Annotated[str, Field(max_length=MAX_TEXT)]


class RunCheckpointed(EventData):
    """AP-7: a checkpoint was committed after a turn."""

    EVENT_TYPE: ClassVar[str] = "run.checkpointed"
    run_id: str
    checkpoint_id: str
    turn: int


class RunResumed(EventData):
    """AP-8 / RUN-3: the run continues, after an answer, an expiry, or a crash (recovery)."""

    EVENT_TYPE: ClassVar[str] = "run.resumed"
    run_id: str
    reason: Literal["answer", "expiry", "rejection", "recovery"]
    from_turn: int
    request_id: str | None = None
    waited_s: float | None = None


class RunCompleted(EventData):
    EVENT_TYPE: ClassVar[str] = "run.completed"
    run_id: str
    result: Annotated[str, Field(max_length=MAX_TEXT * 4)]
    turns: int


class RunFailed(EventData):
    EVENT_TYPE: ClassVar[str] = "run.failed"
    run_id: str
    reason: str
    error: str


class RunCancelRequested(EventData):
    """A person or service asks to stop a run (RUN-2); the run-executor answers with ``run.cancelled``.

    Idempotent: a run already finished ignores it (the journal keeps the request). Published by the
    journal's console/API (``POST /runs/{run_id}/cancel``, operator role) and by the run-executor's own API.
    """

    EVENT_TYPE: ClassVar[str] = "run.cancel_requested"
    run_id: str
    reason: Annotated[str, Field(min_length=1, max_length=500)]
    #: The API token's name (or service) that asked; never the token.
    requested_by: str


class RunCancelled(EventData):
    EVENT_TYPE: ClassVar[str] = "run.cancelled"
    run_id: str
    reason: str


# --------------------------------------------------------------------------- human.*
class HumanRequested(EventData):
    """HUM-1/HUM-4/OBS-1: a pending interaction bound to a run. The agent names a person, never a channel."""

    EVENT_TYPE: ClassVar[str] = "human.requested"
    request_id: str
    run_id: str
    agent: str
    title: str = Field(description="Which task (HUM-5)")
    recipient: str = Field(description="`user:<id>`; checked against policy.allowed_recipients (SEC-1)")
    question: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
    context: Annotated[str, Field(max_length=MAX_TEXT)] = Field(
        default="", description="Why it arose, what the agent established, what is missing (HUM-5)"
    )
    options: list[HumanOption] = Field(default_factory=list)
    allow_free_text: bool = True
    timeout_s: Annotated[int, Field(gt=0)]
    expires_at: datetime
    policy: HumanPolicy
    turn: int


class DeliveryAttempt(_Model):
    """HUM-2/HUM-3: a channel that was tried for a request and failed (refused, unreachable identity, down)."""

    channel: str
    error: Annotated[str, Field(max_length=MAX_TEXT)]


class HumanNotified(EventData):
    EVENT_TYPE: ClassVar[str] = "human.notified"
    request_id: str
    run_id: str
    recipient: str
    channel: str
    fallback_from: str | None = None
    failed_attempts: list[DeliveryAttempt] = Field(
        default_factory=list, description="Channels tried before `channel`, in order, and why each failed"
    )


class HumanNotifyRequested(EventData):
    """The agent's ``notify`` tool: tell a person something, no answer expected (the run does not wait).

    Like ``human.requested`` it names a person, never a channel, and carries the trigger's policy so the
    deliverer checks the recipient (SEC-1) itself.
    """

    EVENT_TYPE: ClassVar[str] = "human.notify_requested"
    notification_id: str
    run_id: str
    agent: str
    title: str
    recipient: str = Field(description="`user:<id>`; checked against policy.allowed_recipients (SEC-1)")
    message: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
    policy: HumanPolicy
    turn: int


class HumanRejected(EventData):
    """The request could not be delivered: recipient not allowed (SEC-1), unknown, or no channel."""

    EVENT_TYPE: ClassVar[str] = "human.rejected"
    request_id: str
    run_id: str
    recipient: str
    reason: Literal["recipient_not_allowed", "unknown_recipient", "no_channel", "invalid_request"]
    detail: str


class HumanAnswered(EventData):
    EVENT_TYPE: ClassVar[str] = "human.answered"
    request_id: str
    run_id: str
    recipient: str
    responder: str
    answer: HumanAnswer
    channel: str
    waited_s: float


class HumanExpired(EventData):
    EVENT_TYPE: ClassVar[str] = "human.expired"
    request_id: str
    run_id: str
    recipient: str
    action: Literal["fail", "default"]
    default_answer: OptionAnswer | None = None
    waited_s: float


# --------------------------------------------------------------------------- bus.*
class BusDeadLettered(EventData):
    """A message no handler could ever process was terminated and copied to the dead-letter stream."""

    EVENT_TYPE: ClassVar[str] = "bus.dead_lettered"
    consumer: str
    stream: str
    subject: str
    stream_seq: int
    deliveries: int
    error: Annotated[str, Field(max_length=MAX_TEXT)]
    dlq_subject: str
    original_id: str | None = None
    original_type: str | None = None


# --------------------------------------------------------------------------- collaboration (request/reply)
class CollaboratorsQuery(_Model):
    """COL-1 request on the get_collaborators subject."""

    run_id: str
    protocol_versions: list[str] = Field(default_factory=lambda: ["1.0"])


class Collaborator(_Model):
    id: str = Field(description="`agent:<agent_id>`, `human:<user_id>` or `run:<run_id>`")
    kind: Literal["agent", "human", "run"]
    role: str | None = None
    task: Annotated[str, Field(max_length=200)] | None = None
    status: str
    run_id: str | None = None


class CollaboratorsReply(_Model):
    run_id: str
    saga_id: str | None = None
    protocol_version: str | None = None
    collaborators: list[Collaborator] = Field(default_factory=list)
    error: str | None = None


EVENT_MODELS: dict[str, type[EventData]] = {
    m.EVENT_TYPE: m
    for m in (
        TriggerReceived,
        TriggerAccepted,
        TriggerRejected,
        TriggerCreated,
        TriggerUpdated,
        TriggerDeleted,
        TriggerEnabled,
        TriggerDisabled,
        RunRequested,
        RunCreated,
        RunStarted,
        RunToolCalled,
        ToolFailed,
        RunCheckpointed,
        RunResumed,
        RunCompleted,
        RunFailed,
        RunCancelRequested,
        RunCancelled,
        HumanRequested,
        HumanNotified,
        HumanNotifyRequested,
        HumanRejected,
        HumanAnswered,
        HumanExpired,
        BusDeadLettered,
    )
}
