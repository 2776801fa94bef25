"""pydantic v2 models for the ``data`` of every event (DC-4). Event names are canonical (OBS-1).

Each model carries its CloudEvents ``type`` as ``EVENT_TYPE``; :data:`EVENT_MODELS` maps every type
to its model. Models ignore unknown fields on read so newer writers do not break older readers
(PRO-3); writers construct them from code, so they never carry unknown fields.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, get_args
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from temporality_protocol.states import AgentLifecycleState

__all__ = [
    "ASK_TIMEOUT_DEFAULT_S",
    "ASK_TIMEOUT_MAX_S",
    "CONFORMANCE_PROBES",
    "EVENT_MODELS",
    "MAX_REASON",
    "RUN_FAILURE_REASONS",
    "Actor",
    "AgentAnswerReceived",
    "AgentAskExpired",
    "AgentAskUndeliverable",
    "AgentAsked",
    "AgentCapability",
    "AgentCard",
    "AgentConformanceChecked",
    "AgentHandedOff",
    "AgentLifecycleChanged",
    "AgentLimits",
    "AgentMessageReceived",
    "AgentMessageRefused",
    "AgentPolicy",
    "AgentPolicyChanged",
    "AgentReadmitted",
    "AgentRefusal",
    "AgentRegistered",
    "AgentRegistration",
    "AgentRegistrationRefused",
    "AgentReplied",
    "AgentReplyUndeliverable",
    "AgentSummary",
    "AgentTask",
    "AgentTaskActed",
    "AgentTaskCheckpointed",
    "AgentTaskEnded",
    "AgentTaskOffered",
    "AgentTaskRefused",
    "AgentTaskStreamed",
    "AgentTaskTaken",
    "AgentsQuery",
    "AgentsReply",
    "ApiAccessRefused",
    "BusDeadLettered",
    "BusPermissionRefused",
    "Collaborator",
    "CollaboratorsQuery",
    "CollaboratorsReply",
    "ConformanceAnswer",
    "ConformanceAnswers",
    "ConformanceChallenge",
    "ConformanceProbe",
    "ConformanceReply",
    "ConformanceResult",
    "ConsoleRoleQuery",
    "ConsoleRoleReply",
    "DeliveryAttempt",
    "Deregistration",
    "DeregistrationReply",
    "Escalate",
    "EventData",
    "ExternalAgentGrant",
    "HandoffDocument",
    "Heartbeat",
    "HeartbeatAck",
    "HumanAnswer",
    "HumanAnswerRefused",
    "HumanAnswered",
    "HumanAskKind",
    "HumanCancelRequested",
    "HumanDirectoryChanged",
    "HumanEscalated",
    "HumanExpired",
    "HumanNotificationDelivered",
    "HumanNotificationFailed",
    "HumanNotified",
    "HumanNotifyRequested",
    "HumanOption",
    "HumanPolicy",
    "HumanReasked",
    "HumanRejectReason",
    "HumanRejected",
    "HumanRequested",
    "HumanWithdrawReason",
    "HumanWithdrawn",
    "LaunchSource",
    "NormalizedEvent",
    "OptionAnswer",
    "PasswordCheck",
    "PasswordCheckReply",
    "RegistrationReply",
    "RelayRequest",
    "Renotify",
    "RunCancelRequested",
    "RunCancelled",
    "RunCheckpointed",
    "RunCompleted",
    "RunCreated",
    "RunFailed",
    "RunFailureReason",
    "RunInputAfterEnd",
    "RunRequested",
    "RunResumed",
    "RunSampled",
    "RunStarted",
    "RunStreamed",
    "RunToolCalled",
    "RunUsage",
    "SandboxSummary",
    "SourceLink",
    "StoredCheckpoint",
    "TaskAction",
    "TaskActionKind",
    "TaskActionReply",
    "TaskAssignment",
    "TaskCheckpoint",
    "TaskEventKind",
    "TaskHandoff",
    "TaskInput",
    "TaskPoll",
    "TaskPollReply",
    "TaskRefusal",
    "TaskRefusalReason",
    "TaskStreamEvent",
    "TaskToolCall",
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
    "is_web_url",
]

#: Free-text payloads in events are cut to this many characters (COL-9 uses the same bound).
MAX_TEXT = 4096
#: OBS-1: the most characters of ``human.requested.reason`` (the agent's short phrase for why it asks).
MAX_REASON = 200
#: OBS-1: what kind of help an agent asks a person for (``human.requested.reason_kind``), so analytics can count
#: which knowledge is missing and which decisions are delegated:
#:
#: ``missing_knowledge``  a fact only a person knows (a deadline, an owner, whether a system is in use)
#: ``decision``           a choice the agent may not or cannot make itself (which of several ways)
#: ``approval``           permission or sign-off for an action the agent is about to take
#: ``ambiguity``          the task, the input or an instruction is unclear or contradictory
HumanAskKind = Literal["missing_knowledge", "decision", "approval", "ambiguity"]


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


#: A source link is at most this long (a PR's web URL is far shorter; a longer one is not kept).
MAX_LINK = 2048


class SourceLink(_Model):
    """HUM-5: where a person opens what a run is about -- a pull request's, work item's, ... web page.

    Only an absolute ``http(s)`` URL (:func:`is_web_url`); the gateway keeps none when the source's is
    not one (the delivery is still accepted)."""

    href: Annotated[str, Field(min_length=1, max_length=MAX_LINK)]
    label: Annotated[str, Field(max_length=200)] | None = Field(
        default=None, description="A short name for it, e.g. `PR #1842 in repo X`"
    )

    @field_validator("href")
    @classmethod
    def _web_url(cls, value: str) -> str:
        if not is_web_url(value):
            raise ValueError("not an absolute http(s) URL")
        return value


#: Whitespace (``str.isspace``: Unicode's too) or a control character: never part of a link we show.
_UNSAFE_IN_URL = re.compile(r"[\s\x00-\x1f\x7f]")


def is_web_url(value: str) -> bool:
    """An absolute ``http``/``https`` URL with a host and no credentials (``user:pw@``), without
    whitespace or control characters."""
    if len(value) > MAX_LINK or _UNSAFE_IN_URL.search(value) is not None:
        return False
    try:
        parts = urlsplit(value)
        _ = parts.port  # a bad port raises
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and "@" not in parts.netloc


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
    source_link: SourceLink | None = Field(
        default=None, description="The source's web page (the PR, work item, ...) a person opens (HUM-5)"
    )


class HumanOption(_Model):
    """HUM-6: a structured choice; ``id`` is the machine-readable value that is kept."""

    id: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
    label: Annotated[str, Field(min_length=1, max_length=200)]
    consequence: str | None = Field(default=None, description="What choosing it leads to (HUM-5)")


class Renotify(_Model):
    """HUM-8 chain step: ask the recipient again ``max`` times, every ``every_s`` seconds (before the deadline)."""

    every_s: Annotated[int, Field(gt=0, le=30 * 24 * 3600)]
    max: Annotated[int, Field(ge=1, le=20)]


class Escalate(_Model):
    """HUM-8 chain step: ``after_s`` seconds after the previous step, forward the question to ``to`` as well.

    ``to`` comes from the trigger's configuration (never from the agent), so it need not be among
    ``allowed_recipients``; the original recipient may still answer, and so may ``to`` (a group: any member).
    """

    to: Annotated[str, Field(pattern=r"^(user|group):[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64})*$")]
    after_s: Annotated[int, Field(gt=0, le=30 * 24 * 3600)]


class TimeoutPolicy(_Model):
    """HUM-8: what happens when nobody answers in time. Part of the trigger/run config, never a channel's.

    A chain on durable timers: optional reminders (``renotify``), then an optional ``escalate``, both before
    the request's deadline (``expires_at``), then the terminal ``action`` at the deadline: ``fail`` the run,
    resume it with ``default_option``, or ``cancel`` it (``run.cancel_requested``).
    """

    action: Literal["fail", "default", "cancel"] = "fail"
    default_option: str | None = None
    renotify: Renotify | None = None
    escalate: Escalate | None = None

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

    def for_question(self, options: list[HumanOption]) -> HumanPolicy:
        """This policy as it applies to one question: a timeout default (``on_timeout: {action: default,
        default_option: X}``) the question does not offer (other options, free text only) cannot be its answer, so
        that question fails at its deadline instead (reminders and escalation stay). The run-executor writes the
        result into ``human.requested.policy``; human-interaction applies it to the run's trusted policy too.
        Refusing the question instead would leave an agent unable to ask anything but the one question the
        default was written for."""
        on_timeout = self.on_timeout
        if on_timeout.action != "default" or any(o.id == on_timeout.default_option for o in options):
            return self
        fail = on_timeout.model_copy(update={"action": "fail", "default_option": None})
        return self.model_copy(update={"on_timeout": fail})


class LaunchSource(_Model):
    kind: Literal["webhook", "event", "schedule", "api"]
    trigger_id: str | None = None
    delivery_id: str | None = None
    #: How many event-trigger launches led to this run (TRG-6 anti-loop): 0 for a run a webhook, a
    #: schedule or the API started; an event trigger's run is one more than the run whose event fired it.
    depth: Annotated[int, Field(ge=0)] = 0
    #: A rerun (the trigger-gateway's ``POST .../deliveries/{d}/redrive`` with ``{"rerun": n}``): the run whose
    #: delivery an operator ran again as this new run, e.g. after fixing the agent's card.
    rerun_of: str | None = None
    #: A rerun: who asked for it (the API token's name, or ``user:<id>`` for a person the journal vouched for).
    requested_by: str | None = None


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
    #: ``loop_limit``: an event trigger refused an event its own runs caused, or one past the launch depth.
    #: ``concurrency_skip``: a run of the trigger's concurrency key is active and its policy is ``skip``
    #: (or its ``queue`` is full); the detail names the active run.
    #: ``debounced``: a newer event of the same concurrency key arrived within the trigger's debounce window.
    #: ``filtered``: the trigger's condition (``when``, an event trigger's ``filter``) does not match the event.
    #: ``launch_lost``: a queued or debounced delivery whose stored launch (the run it was to start) was gone when
    #: its turn came -- expired from the ``trigger-concurrency`` bucket (7-day TTL) or deleted; no run starts, and
    #: an operator can re-drive the delivery from its record.
    reason: Literal[
        "duplicate",
        "unsupported_event",
        "disabled",
        "invalid_payload",
        "missed_tick",
        "loop_limit",
        "concurrency_skip",
        "debounced",
        "filtered",
        "launch_lost",
    ]
    detail: str
    source_event_id: str | None = None
    run_id: str | None = None
    #: An event trigger's delivery: the launch depth the run would have had (LaunchSource.depth).
    depth: int | None = None


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


#: ``req-`` + hash(operation id) (COL-5); one subject token, so it is a KV key and a timer key too.
_REQUEST_ID = r"^[A-Za-z0-9][A-Za-z0-9_=-]{0,127}$"
AskRequestId = Annotated[str, Field(pattern=_REQUEST_ID)]


class RelayRequest(_Model):
    """``run.requested.relay``: the run answers one ask for a finished run of the same agent (COL-6).

    The run-executor caps the run at ``max_turns`` (below the card's own limit), offers no delegation
    tool, and never cancels it when the asker ends (``abandon``)."""

    request_id: AskRequestId
    asker_run_id: str
    asker_agent: str
    #: The finished run it answers for (also the run's ``parent_run_id``).
    target_run_id: str
    max_turns: Annotated[int, Field(gt=0)] = 6
    may_delegate: Literal[False] = False
    on_asker_end: Literal["abandon"] = "abandon"


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
    #: Set only on a relay run agent-collab requests for an ask to a finished run (COL-6).
    relay: RelayRequest | None = None


class RunCreated(EventData):
    EVENT_TYPE: ClassVar[str] = "run.created"
    run_id: str
    agent: str
    title: str
    launch: LaunchSource


class SandboxSummary(_Model):
    """RUN-1: the sandbox a run's tool processes (its MCP stdio servers) run in, as its agent card sets it.

    Never its pass-through environment variables (names or values) nor its working directory's path."""

    kind: str = Field(
        default="process",
        description="`process`: each tool process is a child process of the run-executor (the only kind there is)",
    )
    network: bool = Field(
        description="False: the tool processes run in a network namespace of their own with no interface "
        "(`unshare --user --map-root-user --net`)"
    )
    working_dir_set: bool = Field(
        default=False, description="True: the card sets their working directory (its path is not shown)"
    )


class AgentSummary(_Model):
    """RUN-1: what a run was started with, from its agent card (the prompt itself stays in the card: its digest
    identifies it; an admin reads it with the run-executor's ``GET /agents/{id}/prompt``)."""

    provider: str = Field(description="`openai` or `scripted` (deterministic, for demos and tests)")
    model: str | None = None
    skills: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list, description="The tools the run is offered (after allow/deny)")
    mcp_servers: list[str] = Field(default_factory=list)
    max_turns: int
    max_tokens: int | None = None
    max_compute_s: float = Field(description="Compute budget in seconds; waiting for a person never counts")
    system_prompt_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="SHA-256 (hex) of the exact system prompt the run was given: the card's system prompt with its "
        "skills' instructions appended (UTF-8). The run-executor's admin-only `GET /agents/{id}/prompt` answers the "
        "same digest for the card's current prompt. Absent from events of older executors",
    )
    sandbox: SandboxSummary | None = Field(
        default=None, description="The card's sandbox (absent from events of older executors)"
    )


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
    #: The arguments as the model wrote them when they were not a JSON object (``arguments`` is then ``{}``):
    #: its first 2,000 characters, redacted like the rest of the event; absent otherwise.
    raw_arguments: Annotated[str, Field(max_length=2000)] | None = None


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


class RunSampled(EventData):
    """A tool asked the run's own model for a completion mid-call (MCP ``sampling/createMessage``), answered
    through the run's provider; its tokens count in the run's usage and token limit. Deterministic id per
    (run, turn, call, which of the call's samplings): a redelivered turn republishes the same fact."""

    EVENT_TYPE: ClassVar[str] = "run.sampled"
    run_id: str
    turn: int
    call_id: str
    tool: str
    #: Which of the call's sampling requests (0: its first).
    sample: int
    model: str
    prompt_preview: Annotated[str, Field(max_length=MAX_TEXT)] = ""
    result_preview: Annotated[str, Field(max_length=MAX_TEXT)] = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class RunCheckpointed(EventData):
    """AP-7: a checkpoint was committed after a turn."""

    EVENT_TYPE: ClassVar[str] = "run.checkpointed"
    run_id: str
    checkpoint_id: str
    turn: int


class RunResumed(EventData):
    """AP-8 / RUN-3: the run continues, after an answer, an expiry, a crash (recovery), or -- a run whose turn was
    with its external agent (AP-5) -- the agent's action (``agent_action``: ``request_id`` the turn's wait id,
    ``waited_s`` the park's length)."""

    EVENT_TYPE: ClassVar[str] = "run.resumed"
    run_id: str
    reason: Literal["answer", "expiry", "rejection", "recovery", "agent_action"]
    from_turn: int
    request_id: str | None = None
    waited_s: float | None = None


class RunUsage(_Model):
    """What a whole run used, over all its turns, across parks and resumes (on its terminal event).

    Tokens are the provider's own count: an OpenAI-compatible endpoint's ``usage`` blocks, summed (a reply
    without one counts 0); the scripted provider reports none, so its runs show 0 tokens.
    """

    turns: int = Field(default=0, description="Provider calls made (turns), the last one included")
    tool_calls: int = Field(default=0, description="Tool calls the model made (refused and parked ones included)")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    samplings: int = Field(
        default=0,
        description="Model calls made for MCP servers' sampling requests (their tokens are in the totals above); "
        "0 on events from executors before it",
    )


class RunCompleted(EventData):
    EVENT_TYPE: ClassVar[str] = "run.completed"
    run_id: str
    result: Annotated[str, Field(max_length=MAX_TEXT * 4)]
    turns: int
    #: Absent on events from executors before it.
    usage: RunUsage | None = None


#: Why the run-executor fails a run (``run.failed``'s ``reason``): its machine may give no other (typed), and the
#: journal's finished-runs counter labels by them. The event's field stays a string: a reader meets older ones too,
#: and a newer executor's (a reader counts or shows a reason it does not know as it is, or as ``other``).
#: ``output_truncated`` (a final reply cut off at the model's output length limit, ``finish_reason: length``) is
#: newer than the others: executors before it failed such a run ``provider_error``, its ``error`` starting
#: ``output_truncated:``. ``conversation_too_large`` (the run's conversation, or one reply, would not fit in one bus
#: message: the NATS server's ``max_payload``) is newer still: executors before it dead-lettered such a run,
#: ``infrastructure_error``.
RunFailureReason = Literal[
    "compute_timeout",
    "conversation_too_large",
    "human_request_expired",
    "infrastructure_error",
    "malformed_tool_calls",
    "max_turns",
    "output_truncated",
    "provider_error",
    "stalled",
    "token_limit",
    "unknown_agent",
]
RUN_FAILURE_REASONS: tuple[str, ...] = get_args(RunFailureReason)


class RunFailed(EventData):
    EVENT_TYPE: ClassVar[str] = "run.failed"
    run_id: str
    reason: str = Field(
        description="Why (the run-executor gives one of temporality_protocol.RUN_FAILURE_REASONS: compute_timeout, "
        "conversation_too_large, human_request_expired, infrastructure_error, malformed_tool_calls, max_turns, "
        "output_truncated, provider_error, stalled, token_limit, unknown_agent); a string, so a reader accepts a "
        "newer one. output_truncated is newer: before it, a final reply cut off at the output length limit failed "
        "provider_error with an error starting 'output_truncated:'. conversation_too_large is newer still: before "
        "it, a run whose conversation outgrew the bus's max_payload failed infrastructure_error"
    )
    error: str
    usage: RunUsage | None = None


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
    usage: RunUsage | None = None


class RunInputAfterEnd(EventData):
    """An input reached a run that had already ended -- a person's answer (or expiry, rejection) for one of its
    requests, an agent's message or answer: journaled by the run-executor, never applied (nothing vanishes)."""

    EVENT_TYPE: ClassVar[str] = "run.input_after_end"
    run_id: str
    #: The run's terminal state: ``completed``, ``failed`` or ``cancelled``.
    state: str
    #: The CloudEvent that came (``human.answered``, ``agent.message.received``, ...) and its id (the causation).
    input_type: str
    input_id: str
    request_id: str | None = None
    #: Who it came from: ``user:<id>`` for a person, ``agent:<id>`` for an agent, ``agent-collab``.
    sender: str | None = None
    detail: Annotated[str, Field(max_length=MAX_TEXT)]


# --------------------------------------------------------------------------- human.*
class HumanRequested(EventData):
    """HUM-1/HUM-4/OBS-1: a pending interaction bound to a run. The agent names a person, never a channel."""

    EVENT_TYPE: ClassVar[str] = "human.requested"
    request_id: str
    run_id: str
    agent: str
    agent_display_name: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None,
        description="The asking agent's display name (its card's display_name), shown to the person with `agent`; "
        "None (and on events from executors before it): the person sees the agent's id",
    )
    title: str = Field(description="Which task (HUM-5)")
    recipient: str = Field(description="`user:<id>`; checked against policy.allowed_recipients (SEC-1)")
    question: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
    context: Annotated[str, Field(max_length=MAX_TEXT)] = Field(
        default="", description="Why it arose, what the agent established, what is missing (HUM-5)"
    )
    reason: Annotated[str, Field(min_length=1, max_length=MAX_REASON)] | None = Field(
        default=None,
        description="OBS-1: the agent's short phrase for why it asks (ask_human's `reason`, e.g. 'release date "
        "unknown'), for analytics; None when the agent gave none (and on events from executors before it)",
    )
    reason_kind: HumanAskKind | None = Field(
        default=None,
        description="OBS-1: what kind of help it asks for (ask_human's `reason_kind`): missing_knowledge (a fact "
        "only a person knows), decision (a choice the agent may not make itself), approval (sign-off for an "
        "action), ambiguity (the task or input is unclear); None when the agent gave none (and on older events)",
    )
    options: list[HumanOption] = Field(default_factory=list)
    allow_free_text: bool = True
    timeout_s: Annotated[int, Field(gt=0)]
    expires_at: datetime
    policy: HumanPolicy
    turn: int
    source_link: SourceLink | None = Field(
        default=None, description="The run's source (its launch event's link), set by the platform, never the agent"
    )
    answer_schema: dict[str, Any] | None = Field(
        default=None,
        description=(
            "A form the answer must fit (an MCP elicitation's requested schema: a flat object of primitive "
            "fields, JSON Schema 2020-12), read as temporality_protocol.forms.read reads it; human-interaction "
            "refuses an answer that does not fit before it is recorded. None: any option or text is taken"
        ),
    )


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
    redacted: dict[str, int] = Field(
        default_factory=dict,
        description="What the egress policy redacted before the question left, per kind (counts, never a secret)",
    )
    truncated: list[str] = Field(
        default_factory=list, description="The text fields `channel` showed truncated (`context`, `question`, ...)"
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


class HumanCancelRequested(EventData):
    """HUM-7: the run no longer needs these requests of its own: it asked several questions in one turn with
    ``wait_for: first`` and another was answered first. human-interaction cancels those still pending, as at
    the run's end (their messages show it, a late answer is refused), and only those of this ``run_id``."""

    EVENT_TYPE: ClassVar[str] = "human.cancel_requested"
    run_id: str
    request_ids: Annotated[list[str], Field(min_length=1, max_length=64)]
    reason: Literal["not_needed"] = "not_needed"
    answered: str | None = Field(default=None, description="The request whose answer made these not needed")


#: Why human-interaction refused a request (``human.rejected``'s ``reason``): the recipient is not allowed (SEC-1),
#: unknown, or no channel reaches them; the request is invalid (an id another run uses, data that does not read);
#: or human-interaction gave its intake up (``intake_failed``: every delivery of the ``human.requested`` failed, e.g.
#: ~80 s of failed bus writes, before the question was stored -- nobody was asked). A reader older than a value
#: refuses the event: a new value needs its readers (the run-executor) upgraded first.
HumanRejectReason = Literal[
    "recipient_not_allowed", "unknown_recipient", "no_channel", "invalid_request", "intake_failed"
]


class HumanRejected(EventData):
    """The request could not be delivered: recipient not allowed (SEC-1), unknown, no channel, an invalid request,
    or an intake human-interaction gave up on (``intake_failed``)."""

    EVENT_TYPE: ClassVar[str] = "human.rejected"
    request_id: str
    run_id: str
    recipient: str
    reason: HumanRejectReason
    detail: str


class HumanAnswered(EventData):
    EVENT_TYPE: ClassVar[str] = "human.answered"
    request_id: str
    run_id: str
    recipient: str
    responder: str
    responder_display_name: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None,
        description="The responder's display name in human-interaction's user directory when the answer was bound; "
        "None for someone not in it (and on events from services before it): show `responder`",
    )
    answer: HumanAnswer
    channel: str
    waited_s: float
    redacted: dict[str, int] = Field(
        default_factory=dict,
        description="What the egress policy redacted from the answer before it was stored and published, per kind "
        "(counts, never a secret; `answer` holds the markers)",
    )


class HumanAnswerRefused(EventData):
    """HUM-7/HUM-9: an answer that was recorded and refused, never applied: it came after the request ended
    (``already_answered`` by someone else or with another value, ``expired``, ``cancelled``) or from someone
    who may not answer (``not_recipient``). ``answer`` is what was refused (an option, or the free text after
    the egress policy's redaction); ``None`` when it named no option of the request."""

    EVENT_TYPE: ClassVar[str] = "human.answer_refused"
    request_id: str
    run_id: str
    recipient: str
    responder: str = Field(description="`user:<id>`, or `<channel>:<identity>` for someone not in the directory")
    channel: str
    reason: Literal["already_answered", "expired", "cancelled", "not_recipient"]
    detail: Annotated[str, Field(max_length=500)] = ""
    received_at: datetime
    answer: HumanAnswer | None = None


class HumanExpired(EventData):
    EVENT_TYPE: ClassVar[str] = "human.expired"
    request_id: str
    run_id: str
    recipient: str
    #: The timeout policy's terminal step (HUM-8); ``cancel``: human-interaction asked to cancel the run
    #: (``run.cancel_requested``, published before this event).
    action: Literal["fail", "default", "cancel"]
    default_answer: OptionAnswer | None = None
    waited_s: float


#: Why human-interaction withdrew a question still open (``human.withdrawn``'s ``reason``): its run ended
#: (``run.completed`` / ``run.failed`` / ``run.cancelled``: a run that timed out is ``run_failed``, its
#: ``run_reason`` says ``compute_timeout`` or ``stalled``), or the run no longer needed it (``not_needed``,
#: ``human.cancel_requested``: another question of a ``wait_for: first`` turn was answered first, HUM-7).
HumanWithdrawReason = Literal["run_completed", "run_failed", "run_cancelled", "not_needed"]


class HumanWithdrawn(EventData):
    """HUM-7/OBS-1: a question still open that human-interaction withdrew because its run ended or no longer
    needs it: from now on nobody can answer it (a late answer is refused ``cancelled``), and the messages that
    carried it say so. One per request (its id is derived from the request id), published before the consumer's
    ack and recorded on the request, so a redelivery or a restart of human-interaction never makes two. Questions
    withdrawn before this event existed (before 2026-12-07) have none: the journal reads them from the run's end."""

    EVENT_TYPE: ClassVar[str] = "human.withdrawn"
    request_id: str
    run_id: str
    recipient: str = Field(description="`user:<id>` or `group:<id>`, as the agent named it")
    channel: str | None = Field(
        default=None, description="The channel that carried the question; None: it was never delivered"
    )
    reason: HumanWithdrawReason
    run_reason: Annotated[str, Field(max_length=500)] | None = Field(
        default=None,
        description="The run's own reason when it ended (run.failed's / run.cancelled's `reason`, e.g. "
        "`compute_timeout`); None for a completed run, a withdrawal (not_needed), or when it was not known",
    )
    asked_at: datetime = Field(description="When the agent asked (the human.requested's time)")
    withdrawn_at: datetime = Field(description="When human-interaction withdrew it")
    waited_s: float = Field(description="How long it was open: withdrawn_at - asked_at, in seconds")


class HumanReasked(EventData):
    """HUM-8: the timeout policy's ``renotify`` step sent the question again (reminder ``attempt`` of ``of``)."""

    EVENT_TYPE: ClassVar[str] = "human.reasked"
    request_id: str
    run_id: str
    recipient: str
    attempt: Annotated[int, Field(ge=1)]
    of: Annotated[int, Field(ge=1)]
    #: The channels that carried the reminder (one per person reached, in order).
    channels: list[str] = Field(default_factory=list)
    failed_attempts: list[DeliveryAttempt] = Field(default_factory=list)


class HumanEscalated(EventData):
    """HUM-8: the timeout policy's ``escalate`` step forwarded the question from ``recipient`` to ``to``.

    From then on both may answer (a group ``to``: any of its members); the first valid answer wins.
    """

    EVENT_TYPE: ClassVar[str] = "human.escalated"
    request_id: str
    run_id: str
    recipient: str = Field(description="Who was asked first (the request's recipient)")
    to: str = Field(description="`user:<id>` or `group:<id>` from the trigger's timeout policy")
    #: The people the question was forwarded to (``user:<id>``: the target, or the group's members).
    members: list[str] = Field(default_factory=list)
    channels: list[str] = Field(default_factory=list)
    failed_attempts: list[DeliveryAttempt] = Field(default_factory=list)


class HumanDirectoryChanged(EventData):
    """Audit (HUM-2, AP-11): a user profile or group of the directory was created, replaced or deleted.

    Published by human-interaction's directory API (``changed_by`` = the API token's name, ``role`` its
    role) and when the users file seeds an entry (``changed_by`` = ``file:<path>``). ``after`` is the
    entry as the API shows it (``inbox_token_set`` instead of any token): never a secret."""

    EVENT_TYPE: ClassVar[str] = "human.directory.changed"
    kind: Literal["user", "group"]
    entry_id: str
    action: Literal["created", "updated", "deleted"]
    #: The directory store's revision after the change (the API's ETag).
    revision: int
    changed_by: str
    role: str | None = None
    #: The top-level fields that differ from the previous version (``inbox_token`` when the token changed).
    changed_fields: list[str] = Field(default_factory=list)
    after: dict[str, Any] | None = None


# --------------------------------------------------------------------------- human.notification_* (HUM-9)
class HumanNotificationDelivered(EventData):
    """HUM-2/HUM-9: an agent's notification (``human.notify_requested``) reached one person, on ``channel``.

    One per person told: the recipient, or each member of a ``group:<id>`` recipient (``person``). Published
    before the once-only marker (``notify.<id>`` in ``human-channels``) is claimed, with one id per
    (notification, person): a redelivered notification is one event."""

    EVENT_TYPE: ClassVar[str] = "human.notification_delivered"
    notification_id: str
    run_id: str
    recipient: str = Field(description="`user:<id>` or `group:<id>`, as the agent named it")
    person: str = Field(description="`user:<id>` told: the recipient, or the group's member")
    channel: str
    fallback_from: str | None = Field(default=None, description="The preferred channel, when another carried it")
    failed_attempts: list[DeliveryAttempt] = Field(
        default_factory=list, description="Channels tried before `channel` on this delivery, in order, and why"
    )
    delivery: Annotated[int, Field(ge=1)] = Field(
        default=1, description="Which delivery of the notification got through (>1: every channel failed before)"
    )
    redacted: dict[str, int] = Field(
        default_factory=dict,
        description="What the egress policy redacted from the message, per kind (counts, never a secret)",
    )
    truncated: bool = Field(default=False, description="Whether `channel` showed the message truncated")


class HumanNotificationFailed(EventData):
    """HUM-9: an agent's notification that human-interaction gave up (its message is dead-lettered too, with
    ``bus.dead_lettered``): the recipient may not be told by this run (``recipient_not_allowed``, SEC-1), is not
    in the directory (``unknown_recipient``), no channel carried it on any delivery (``no_channel``), or the
    service failed otherwise (``failed``). ``unreached``: the people not told (a group's members told before
    are in ``human.notification_delivered``). One per notification."""

    EVENT_TYPE: ClassVar[str] = "human.notification_failed"
    notification_id: str
    run_id: str
    recipient: str
    reason: Literal["recipient_not_allowed", "unknown_recipient", "no_channel", "failed"]
    detail: Annotated[str, Field(max_length=MAX_TEXT)] = ""
    unreached: list[str] = Field(default_factory=list)
    failed_attempts: list[DeliveryAttempt] = Field(
        default_factory=list,
        description="The last delivery's attempts, in order (a group's: `error` starts with `user:<id>:`)",
    )
    deliveries: Annotated[int, Field(ge=1)] = 1


# --------------------------------------------------------------------------- api.*
class ApiAccessRefused(EventData):
    """An HTTP API refused a caller's credentials (401) or role (403), or the trigger-gateway a webhook
    delivery's credentials or signature (401): for the audit trail.

    Rate-limited by the service that refused (one event per caller and window, ``count`` = the refusals it
    stands for), so a scanner cannot flood the journal. Never the credential: for a 403 the token's *name*
    (``principal``), for a 401 only the address it came from and why.
    """

    EVENT_TYPE: ClassVar[str] = "api.access_refused"
    service: str = Field(description="The service that refused (journal, trigger-gateway, ...)")
    status: Literal[401, 403]
    #: unauthorized (no / malformed credentials), invalid_token, invalid_vouch, forbidden (role too low);
    #: a webhook's bad_credentials (its header credentials) or bad_signature (its body signature)
    reason: Annotated[str, Field(max_length=64)]
    method: Annotated[str, Field(max_length=16)]
    path: Annotated[str, Field(max_length=200, description="The request path, cut at 200 characters")]
    address: str | None = Field(default=None, description="The client address (host) it came from")
    principal: str | None = Field(default=None, description="A 403's token name; never the token")
    role_needed: str | None = None
    count: Annotated[int, Field(ge=1)] = Field(default=1, description="Refusals from this caller in the window")
    first_at: datetime
    window_s: Annotated[int, Field(gt=0)]


# --------------------------------------------------------------------------- bus.*
class BusPermissionRefused(EventData):
    """The NATS server refused a service's publish or subscription (a permissions violation: the service
    tried what its NATS user may not, SEC-1): for the audit trail.

    Published by the refused service itself, on its own connection (its user may send this type), rate-limited
    like :class:`ApiAccessRefused`: one event per (operation, subject) and window, ``count`` = the refusals it
    stands for; past ``max`` distinct subjects in a window, one event with ``subject`` ``*`` counts the rest.
    """

    EVENT_TYPE: ClassVar[str] = "bus.permission_refused"
    service: str = Field(description="The service whose NATS user was refused")
    operation: Literal["publish", "subscribe"]
    subject: Annotated[str, Field(max_length=200, description="The subject refused, cut at 200 characters")]
    queue: str | None = Field(default=None, description="A refused subscription's queue group")
    count: Annotated[int, Field(ge=1)] = Field(default=1, description="Refusals of this subject in the window")
    first_at: datetime
    window_s: Annotated[int, Field(gt=0)]


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
    original_id: str | None = Field(
        default=None,
        description="The message's event id: from its envelope, or, when it is no valid CloudEvent, the `id` string"
        " its JSON claims (unvalidated, at most 200 characters); null when it has none",
    )
    original_type: str | None = Field(
        default=None, description="The message's event type, read the same way as `original_id`"
    )


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
    #: How this run came into the saga, when not by its own launch: ``handoff`` (AP-6, another run handed its
    #: task to it); ``None`` otherwise.
    relation: Literal["handoff"] | None = None
    #: The run that handed its task to this one (``relation: handoff``).
    parent_run_id: str | None = None


class CollaboratorsReply(_Model):
    run_id: str
    saga_id: str | None = None
    protocol_version: str | None = None
    collaborators: list[Collaborator] = Field(default_factory=list)
    error: str | None = None


class PasswordCheck(_Model):
    """Issue 9: the journal asks human-interaction, the only holder of the directory's password hashes, whether
    ``password`` signs ``user_id`` in to the console. The password is never logged (``repr`` hides it)."""

    user_id: Annotated[str, Field(min_length=1, max_length=200, description="The directory user id typed")]
    password: Annotated[
        str,
        Field(
            min_length=1,
            max_length=1024,
            repr=False,
            description="The password typed (never logged, never stored)",
            json_schema_extra={"format": "password", "writeOnly": True},
        ),
    ]
    protocol_versions: list[str] = Field(default_factory=lambda: ["1.0"])


#: What a directory account's console sign-in depends on, as one opaque value (issue 9): a digest of the user id,
#: the ``console_role`` and the password hash (never the hash itself), which changes when any of them changes.
#: The journal keeps it in the session of a password sign-in and ends the session when the directory's differs
#: (null in a reply: no such user).
DirectoryFingerprint = Annotated[
    str, Field(min_length=1, max_length=128, description="Digest of the user's console role and password hash")
]


class PasswordCheckReply(_Model):
    """``ok``: the password is the user's, who is then named with their display name and console role (null: no
    role, inbox only). Not ``ok`` without ``error``: refused -- unknown user, no password, wrong password alike
    (the reply never says which). ``error``: the check could not be made (malformed request, no common
    protocol version, an internal failure)."""

    ok: bool
    user_id: str | None = None
    display_name: str | None = None
    role: Literal["viewer", "operator", "admin"] | None = None
    fingerprint: DirectoryFingerprint | None = None
    protocol_version: str | None = None
    error: str | None = None


class ConsoleRoleQuery(_Model):
    """Issue 9: the journal asks human-interaction for the console role of a person who signed in with the OIDC
    provider when the provider's groups give them none (``TEMPORALITY_JOURNAL_OIDC_DIRECTORY_ROLES``)."""

    user_id: Annotated[str, Field(min_length=1, max_length=200, description="The directory user id")]
    protocol_versions: list[str] = Field(default_factory=lambda: ["1.0"])


class ConsoleRoleReply(_Model):
    """The directory profile's ``console_role`` (null: no such user, or no role); ``error``: not checked."""

    user_id: str
    role: Literal["viewer", "operator", "admin"] | None = None
    fingerprint: DirectoryFingerprint | None = None
    protocol_version: str | None = None
    error: str | None = None


# --------------------------------------------------------------------------- agent.* (COL-2..COL-9, PRO-1)
#: ``ask_agent``'s timeout when the model gives none, and the most it may ask for (COL-2).
ASK_TIMEOUT_DEFAULT_S = 300
ASK_TIMEOUT_MAX_S = 3600
AskText = Annotated[str, Field(max_length=MAX_TEXT)]


class AgentAsked(EventData):
    """``ask_agent`` was called (run-executor). ``to`` is what the model wrote: agent-collab resolves it."""

    EVENT_TYPE: ClassVar[str] = "agent.asked"
    request_id: AskRequestId
    asker_run_id: str
    asker_agent: str
    to: Annotated[str, Field(min_length=1, max_length=200)]
    mode: Literal["async", "wait"] = "async"
    timeout_s: Annotated[int, Field(gt=0, le=ASK_TIMEOUT_MAX_S)] = ASK_TIMEOUT_DEFAULT_S
    message: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
    #: The model's message was longer than 4096 characters and was cut (COL-9).
    truncated: bool = False
    turn: Annotated[int, Field(ge=0)] = 0


class AgentMessageReceived(EventData):
    """agent-collab routed an ask: the recipient run gets it at its next turn boundary (COL-4)."""

    EVENT_TYPE: ClassVar[str] = "agent.message.received"
    request_id: AskRequestId
    asker_run_id: str
    asker_agent: str
    to: str
    #: The run the address resolved to inside the asker's saga (COL-6, COL-7).
    resolved_run_id: str
    resolved_agent: str | None = None
    #: Who gets it and must answer: ``resolved_run_id``, or the relay run when ``relay``.
    recipient_run_id: str
    mode: Literal["async", "wait"]
    timeout_s: int
    #: Wait mode only: when the asker stops waiting (the request stays open after it, COL-2).
    expires_at: datetime | None = None
    message: AskText
    truncated: bool = False
    relay: bool = False
    relay_run: str | None = None


class AgentReplied(EventData):
    """``answer_agent`` was called (run-executor): an answer, or a refusal (PRO-1), to a request it received."""

    EVENT_TYPE: ClassVar[str] = "agent.replied"
    request_id: AskRequestId
    replier_run_id: str
    replier_agent: str
    outcome: Literal["answer", "refusal"] = "answer"
    #: The answer, or why it refuses.
    answer: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
    truncated: bool = False
    turn: Annotated[int, Field(ge=0)] = 0


HandoffItem = Annotated[str, Field(max_length=MAX_TEXT)]
HandoffList = Annotated[list[HandoffItem], Field(max_length=50)]


class HandoffDocument(_Model):
    """AP-6: what a run hands to another agent -- self-contained, so the child needs nothing else."""

    objective: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
    current_status: HandoffItem = ""
    completed_steps: HandoffList = Field(default_factory=list)
    remaining_steps: HandoffList = Field(default_factory=list)
    artifacts: HandoffList = Field(default_factory=list)
    memory_links: HandoffList = Field(default_factory=list)
    open_questions: HandoffList = Field(default_factory=list)
    constraints: HandoffList = Field(default_factory=list)
    acceptance_criteria: HandoffList = Field(default_factory=list)


class AgentHandedOff(EventData):
    """AP-6: a run handed its task to another agent (run-executor). This one event decides the handoff: the
    child's ``run.requested`` (same saga, ``parent_run_id`` the handing run) follows from it with an id derived
    from ``handoff_id``; the handing run then completes."""

    EVENT_TYPE: ClassVar[str] = "agent.handed_off"
    #: ``derive_id("ho", parent run, tool call id)``: a retried or replayed call is the same handoff.
    handoff_id: AskRequestId
    parent_run_id: str
    parent_agent: str
    child_run_id: str
    #: The target agent (a hosted agent card).
    agent: str
    document: HandoffDocument
    turn: Annotated[int, Field(ge=0)] = 0
    call_id: str = ""


class AgentAnswerReceived(EventData):
    """agent-collab routed a reply back: the asker gets it (resumes, in wait mode) at its next turn boundary."""

    EVENT_TYPE: ClassVar[str] = "agent.answer.received"
    request_id: AskRequestId
    asker_run_id: str
    replier_run_id: str
    replier_agent: str
    outcome: Literal["answer", "refusal"]
    answer: AskText
    truncated: bool = False
    mode: Literal["async", "wait"]
    #: The wait had already expired (``agent.ask_expired``): it arrives by the async path (COL-2).
    late: bool = False
    relay: bool = False
    relay_run: str | None = None
    waited_s: float


class AgentAskExpired(EventData):
    """A ``wait`` ask got no reply within ``timeout_s``: the asker resumes; the request stays open (COL-2)."""

    EVENT_TYPE: ClassVar[str] = "agent.ask_expired"
    request_id: AskRequestId
    asker_run_id: str
    recipient_run_id: str
    timeout_s: int
    waited_s: float


class AgentAskUndeliverable(EventData):
    """Terminal: the ask reaches nobody (COL-6, COL-7); ``detail`` is what the asker's tool result shows."""

    EVENT_TYPE: ClassVar[str] = "agent.ask_undeliverable"
    request_id: AskRequestId
    asker_run_id: str
    to: str
    #: ``unknown_addressee``: no such agent or run in the asker's saga (a foreign one is never told apart).
    #: ``routing_failed``: agent-collab gave the ask up (unreadable, or every delivery spent): dead-lettered.
    reason: Literal[
        "invalid_address", "unknown_addressee", "self_addressed", "asker_unknown", "relay_failed", "routing_failed"
    ]
    detail: Annotated[str, Field(max_length=MAX_TEXT)]


class AgentReplyUndeliverable(EventData):
    """An ``agent.replied`` that reaches no asker: journaled, refused or with nowhere to go (COL-3)."""

    EVENT_TYPE: ClassVar[str] = "agent.reply_undeliverable"
    request_id: AskRequestId
    replier_run_id: str
    asker_run_id: str | None = None
    reason: Literal["unknown_request", "not_received", "already_answered", "asker_finished", "request_closed"]
    detail: Annotated[str, Field(max_length=MAX_TEXT)]


# --------------------------------------------------------------------------- the Agent Protocol (AP-2..AP-4, PRO-2, PRO-3)
#: An external agent's id: one subject token, so it is a KV key and a timer key too.
ExternalAgentId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")]
_VersionText = Annotated[str, Field(min_length=1, max_length=16)]
_Name = Annotated[str, Field(min_length=1, max_length=128)]
_Token = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:/-]+$")]
#: The states an agent may report in a heartbeat (``temporality_protocol.states.AGENT_REPORTABLE``).
ReportedAgentState = Literal["idle", "busy", "waiting_approval", "paused", "resuming", "completed", "failed"]
#: Why agent-collab refused a request of the Agent Protocol.
AgentRefusalReason = Literal[
    "malformed_request",  # not valid for the request's schema (the detail says where)
    "unknown_agent",  # not on agent-collab's allow-list of external agents
    "no_common_version",  # none of the versions the agent speaks is one agent-collab allows it (PRO-3)
    "not_registered",  # a heartbeat or deregistration from an agent with no live registration
    "version_mismatch",  # a heartbeat or deregistration in another version than the negotiated one
    "illegal_transition",  # a heartbeat reporting a state the lifecycle does not allow from the current one
    "internal_error",  # agent-collab failed (logged); retry later
    # signed messages (AP-11, PRO-4): journaled as agent.message_refused
    "unsigned",  # no Temporality-Signature from an agent whose messages must be signed
    "bad_signature",  # the signature does not verify (wrong key, changed body/subject/headers) or is unreadable
    "unknown_key",  # Temporality-Key-Id names no public key agent-collab knows
    "key_mismatch",  # signed with one agent's key, the body speaks for another agent
    "stale_timestamp",  # Temporality-Timestamp outside the accepted window around agent-collab's clock
    "replayed_nonce",  # a Temporality-Nonce this agent already used within the window
    "subject_mismatch",  # sent on another agent's subject (temporality.rpc.agents.<agent id>.*) than the signer's
    "decommissioned",  # a registration of an agent an operator decommissioned (until an operator readmits it)
    "no_round_open",  # conformance answers for a round that is not open (never started, or already closed)
    "rate_limited",  # more requests than the agent's rate limit allows: retry after ``retry_after_s`` seconds
]
#: The refusals of :class:`AgentMessageRefused`: a message that did not prove who sent it (AP-11).
AgentMessageRefusalReason = Literal[
    "unsigned",
    "bad_signature",
    "unknown_key",
    "unknown_agent",
    "key_mismatch",
    "stale_timestamp",
    "replayed_nonce",
    "subject_mismatch",
    "rate_limited",  # a summary: the agent's requests over its rate limit in a window (``count``), not one each
]


class _AgentRequest(BaseModel):
    """What an external agent sends: unknown fields are ignored, never fatal (PRO-3)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class _AgentReply(BaseModel):
    """What agent-collab answers: closed (``additionalProperties: false``) -- exactly the shape of the
    negotiated version, so a field a newer version adds arrives only to an agent that negotiated it.

    :attr:`_ADDED_TO_1_0`: optional fields added to protocol 1.0 after its first schema (additive changes), left
    out of a reply while unset, so an agent validating against that first, closed schema never sees them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    _ADDED_TO_1_0: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _without_unset_additions(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in self._ADDED_TO_1_0:
            if data.get(name) is None:
                data.pop(name, None)
        return data


class AgentRegistration(_AgentRequest):
    """AP-3: an external agent asks to join, on ``temporality.rpc.agents.<agent id>.register``.

    ``protocol_version`` is the version it prefers (mandatory, AP-10) and ``protocol_versions`` every
    other one it speaks: the highest version common to these and to those agent-collab allows it is
    chosen, none is an explicit refusal (``no_common_version``, journaled). Registering again is
    idempotent: the same declaration from a registered agent changes nothing.
    """

    agent_id: ExternalAgentId
    protocol_version: _VersionText
    protocol_versions: list[_VersionText] = Field(default_factory=list, max_length=16)
    provider: _Name
    model: _Name
    capabilities: list[_Token] = Field(
        default_factory=list, max_length=64, description="What it says it can do (PRO-2): declared, not verified"
    )
    supported_tools: list[_Token] = Field(default_factory=list, max_length=128)
    max_context_size: Annotated[int, Field(gt=0, le=2**31)] = Field(description="Tokens of context it handles")

    def declared_versions(self) -> list[str]:
        """Every version it declares, its preferred one first."""
        return list(dict.fromkeys([self.protocol_version, *self.protocol_versions]))


class AgentRefusal(_AgentReply):
    """An explicit refusal (PRO-3): a machine-readable reason and a sentence for people."""

    reason: AgentRefusalReason
    detail: Annotated[str, Field(max_length=MAX_TEXT)]
    #: ``rate_limited``: seconds until a request will be taken again. Added to protocol 1.0 after its first schema
    #: (additive): left out of every other refusal, never ``null``.
    retry_after_s: Annotated[float, Field(ge=0)] | None = None

    _ADDED_TO_1_0 = ("retry_after_s",)


class AgentLimits(_AgentReply):
    """The limits the agent works within (its security policy, AP-3, AP-11)."""

    #: The smaller of what the agent declared and what the allow-list grants.
    max_context_size: int
    max_concurrent_tasks: int


class AgentPolicy(_AgentReply):
    """What a registered agent may do: the tools of its ``supported_tools`` it is allowed to use, its limits."""

    allowed_tools: list[str]
    limits: AgentLimits


class RegistrationReply(_AgentReply):
    """The answer to an :class:`AgentRegistration`: its configuration and security policy, or a refusal."""

    agent_id: str
    outcome: Literal["registered", "refused"]
    #: The negotiated version: every later request of this registration speaks it.
    protocol_version: str | None = None
    #: The versions agent-collab would speak with this agent (also on a ``no_common_version`` refusal).
    supported_versions: list[str] = Field(default_factory=list)
    state: AgentLifecycleState | None = None
    #: Registrations of one agent id since its last decommissioning count as one incarnation.
    incarnation: int | None = None
    #: Send a heartbeat at least this often.
    heartbeat_interval_s: float | None = None
    #: No heartbeat for this long after the last one (or the registration): ``offline`` (AP-4).
    offline_after_s: float | None = None
    policy: AgentPolicy | None = None
    refusal: AgentRefusal | None = None
    #: An open conformance round (PRO-2): answer its probes on ``temporality.rpc.agents.<agent id>.conformance``.
    conformance: ConformanceChallenge | None = None


class Heartbeat(_AgentRequest):
    """AP-4: a registered agent is alive, on ``temporality.rpc.agents.<agent id>.heartbeat``, at least every
    ``heartbeat_interval_s``; ``current_state`` moves its lifecycle (checked against the state machine)."""

    agent_id: ExternalAgentId
    timestamp: datetime = Field(description="When the agent sent it (its clock; informative)")
    current_state: ReportedAgentState
    active_run_id: Annotated[str, Field(max_length=200)] | None = None
    resource_usage: dict[Annotated[str, Field(max_length=64)], float] = Field(
        default_factory=dict, max_length=32, description="Free-form gauges, e.g. `cpu`, `memory_mb`, `tokens`"
    )
    #: The negotiated version (the registration reply's ``protocol_version``).
    protocol_version: _VersionText


class HeartbeatAck(_AgentReply):
    """The answer to a :class:`Heartbeat`: accepted (the lifecycle state after it), or refused."""

    agent_id: str
    accepted: bool
    state: AgentLifecycleState | None = None
    protocol_version: str | None = None
    #: The next heartbeat must arrive before this, or the agent goes ``offline``.
    offline_at: datetime | None = None
    refusal: AgentRefusal | None = None
    #: The conformance round still open, repeated on every ack until it is answered or its deadline passes.
    conformance: ConformanceChallenge | None = None


class Deregistration(_AgentRequest):
    """An agent leaves for good (``decommissioned``), on ``temporality.rpc.agents.<agent id>.deregister``."""

    agent_id: ExternalAgentId
    protocol_version: _VersionText
    reason: Annotated[str, Field(max_length=500)] = ""


class DeregistrationReply(_AgentReply):
    agent_id: str
    outcome: Literal["decommissioned", "refused"]
    state: AgentLifecycleState | None = None
    refusal: AgentRefusal | None = None


class AgentsQuery(_AgentRequest):
    """PRO-2 discovery, on ``temporality.rpc.agents.<agent id>.list``: the hosted and the registered agents' cards."""

    protocol_versions: list[str] = Field(default_factory=lambda: ["1.0"])
    #: Include decommissioned agents (default: only agents with a live registration).
    include_decommissioned: bool = False
    #: ``hosted`` (the run-executor's agents), ``external`` (registered over the protocol) or ``all``.
    kind: Literal["all", "hosted", "external"] = "all"


# --------------------------------------------------------------------------- conformance (PRO-2)
#: The capabilities the protocol can check, and what a correct answer to a probe of each is: a declared
#: capability with a probe is verified by a conformance round; one without stays unverified (``no_probe``).
CONFORMANCE_PROBES: dict[str, str] = {
    "echo": "the challenge, verbatim",
    "reverse": "the challenge's characters in reverse order",
}


class ConformanceProbe(_AgentReply):
    """One probe of a conformance round: answer ``challenge`` as ``capability`` says (CONFORMANCE_PROBES)."""

    probe_id: str
    capability: str
    challenge: str
    #: What a correct answer is, for people (the rule is ``CONFORMANCE_PROBES``).
    expects: str


class ConformanceChallenge(_AgentReply):
    """An open conformance round: answer every probe before ``deadline`` on ``temporality.rpc.agents.<agent id>.conformance``."""

    round: int
    deadline: datetime
    probes: list[ConformanceProbe]


class ConformanceAnswer(_AgentRequest):
    probe_id: Annotated[str, Field(min_length=1, max_length=128)]
    answer: Annotated[str, Field(max_length=MAX_TEXT)]


class ConformanceAnswers(_AgentRequest):
    """PRO-2: a registered agent answers the probes of its open conformance round (signed like every request)."""

    agent_id: ExternalAgentId
    #: The negotiated version.
    protocol_version: _VersionText
    round: Annotated[int, Field(gt=0)]
    answers: list[ConformanceAnswer] = Field(default_factory=list, max_length=64)


class ConformanceResult(_AgentReply):
    """What one probe of a round found out about one declared capability."""

    capability: str
    verified: bool
    #: ``verified``; ``wrong_answer``; ``unanswered`` (answers came, not for this probe); ``late`` (answers came
    #: after the deadline); ``timeout`` (no answers before the deadline's timer fired).
    outcome: Literal["verified", "wrong_answer", "unanswered", "late", "timeout"]
    detail: Annotated[str, Field(max_length=MAX_TEXT)] = ""


class AgentCapability(_AgentReply):
    """A declared capability (PRO-2: declared is not proven). ``verified`` is true only once the agent has
    answered its probe correctly in a conformance round of this incarnation and declaration."""

    name: str
    verified: bool = False
    #: ``unverified``: never checked; ``no_probe``: the protocol has no check for it (stays unverified);
    #: ``pending``: a round is open; ``verified`` / ``failed``: the last round's verdict.
    status: Literal["unverified", "no_probe", "pending", "verified", "failed"] = "unverified"
    #: How it was checked: the probe's name (the capability itself: ``echo`` ...), ``None`` without one.
    probe: str | None = None
    #: The conformance round that decided it and when.
    round: int | None = None
    checked_at: datetime | None = None
    #: Why it failed (``wrong_answer`` ...): the round's outcome for it.
    outcome: str | None = None


class AgentCard(_AgentReply):
    """One agent as discovery shows it: ``kind: hosted`` (run by the run-executor, as its last
    ``run.started`` showed it) or ``external`` (registered over the Agent Protocol)."""

    agent_id: str
    kind: Literal["hosted", "external"] = "external"
    provider: str
    model: str | None = None
    #: External agents: their lifecycle state; ``None`` for hosted ones (they exist only as runs).
    state: AgentLifecycleState | None = None
    protocol_version: str | None = None
    capabilities: list[AgentCapability] = Field(default_factory=list)
    supported_tools: list[str] = Field(default_factory=list)
    #: External: the tools granted of those it supports; hosted: the tools its runs are offered.
    allowed_tools: list[str] = Field(default_factory=list)
    max_context_size: int | None = None
    registered_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    active_run_id: str | None = None
    #: Hosted: the card's role and skills, and the run whose ``run.started`` this card is from.
    role: str | None = None
    skills: list[str] = Field(default_factory=list)
    last_run_id: str | None = None
    last_started_at: datetime | None = None


class AgentsReply(_AgentReply):
    protocol_version: str | None = None
    agents: list[AgentCard] = Field(default_factory=list)
    error: str | None = None
    #: Set when the query was refused for its signature (AP-11): the machine-readable reason.
    refusal: AgentRefusal | None = None


class ConformanceReply(_AgentReply):
    """The answer to :class:`ConformanceAnswers`: the round's verdict per capability, or a refusal."""

    agent_id: str
    accepted: bool
    round: int | None = None
    results: list[ConformanceResult] = Field(default_factory=list)
    capabilities: list[AgentCapability] = Field(default_factory=list)
    refusal: AgentRefusal | None = None


class AgentRegistered(EventData):
    """agent-collab accepted a registration (AP-3): what the agent declared and the policy it got."""

    EVENT_TYPE: ClassVar[str] = "agent.registered"
    agent_id: str
    incarnation: int
    #: Which registration of the incarnation (a changed declaration is a new one).
    registration: int
    protocol_version: str
    provider: str
    model: str
    capabilities: list[str] = Field(default_factory=list)
    supported_tools: list[str] = Field(default_factory=list)
    allowed_tools: list[str] = Field(default_factory=list)
    max_context_size: int
    heartbeat_interval_s: float


class AgentRegistrationRefused(EventData):
    """agent-collab refused a registration, explicitly and observably (AP-3, PRO-3)."""

    EVENT_TYPE: ClassVar[str] = "agent.registration_refused"
    agent_id: str
    reason: Literal["unknown_agent", "no_common_version", "decommissioned"]
    detail: Annotated[str, Field(max_length=MAX_TEXT)]
    declared_versions: list[str] = Field(default_factory=list)
    supported_versions: list[str] = Field(default_factory=list)
    provider: str | None = None
    model: str | None = None
    #: Refusals of this agent id (the subject's) this event stands for: after the first in a window the others
    #: are counted, and one event with their total follows when the window (``window_s``) ends.
    count: Annotated[int, Field(ge=1)] = 1
    window_s: Annotated[int, Field(gt=0)] | None = None


class AgentMessageRefused(EventData):
    """agent-collab refused a message of the Agent Protocol that did not prove who sent it (AP-11, PRO-4):
    unsigned, badly signed, an unknown key, a stale timestamp, a replayed nonce, or sent on another agent's
    subject than the signer's (``subject_mismatch``). ``agent_id`` is who the
    message *claimed* to be (its ``Temporality-Key-Id``, else its body's ``agent_id``): unverified -- except for
    ``subject_mismatch``, where it is the agent whose subject it came on (NATS permissions say who may send
    there) and ``claimed_agent_id`` the one it claimed to be, and ``rate_limited``, a summary of the requests
    refused on that agent's subjects for exceeding its rate limit (``count`` of them in the window ``window_s``).
    Refusals are rate-limited per agent and window like access refusals: after the first in a window the others
    are counted, and one event with their total (``count``) follows when the window ends."""

    EVENT_TYPE: ClassVar[str] = "agent.message_refused"
    agent_id: Annotated[str, Field(max_length=128)] | None = None
    #: The RPC subject it came on (``temporality.rpc.agents.<agent id>.heartbeat``, ...).
    subject: Annotated[str, Field(max_length=256)]
    reason: AgentMessageRefusalReason
    detail: Annotated[str, Field(max_length=MAX_TEXT)]
    key_id: Annotated[str, Field(max_length=128)] | None = None
    nonce: Annotated[str, Field(max_length=128)] | None = None
    #: Its ``Temporality-Timestamp``, when it had a readable one.
    signed_at: datetime | None = None
    #: SHA-256 (hex) of the body as received: which message, without storing it (of a summary: its first).
    body_sha256: Annotated[str, Field(min_length=64, max_length=64)]
    #: ``subject_mismatch``: who the message claimed to be (its key id, else its body's ``agent_id``).
    claimed_agent_id: Annotated[str, Field(max_length=128)] | None = None
    #: Refusals this event stands for (1, or a window's total).
    count: Annotated[int, Field(ge=1)] = 1
    window_s: Annotated[int, Field(gt=0)] | None = None


class AgentLifecycleChanged(EventData):
    """One move of an external agent's lifecycle (AP-2), in the order of ``seq`` within its incarnation."""

    EVENT_TYPE: ClassVar[str] = "agent.lifecycle_changed"
    agent_id: str
    incarnation: int
    #: 1 for the first move of the incarnation (``created`` -> ``registered``), then +1 per move.
    seq: Annotated[int, Field(gt=0)]
    from_state: AgentLifecycleState
    to_state: AgentLifecycleState
    #: ``decommissioned``: an operator took it out of service (``requested_by``); ``deregistered``: it left.
    reason: Literal[
        "registered", "re_registered", "heartbeat", "heartbeat_missed", "came_back", "deregistered", "decommissioned"
    ]
    detail: Annotated[str, Field(max_length=500)] = ""
    active_run_id: str | None = None
    #: Who moved it, when a person did (the API token's name): the operator of a ``decommissioned``.
    requested_by: str | None = None


class ExternalAgentGrant(BaseModel):
    """What the operator's allow-list grants one external agent (``TEMPORALITY_COLLAB_EXTERNAL_AGENTS_FILE``), as
    ``agent.policy_changed`` reports it: never the key itself, its SHA-256."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    allowed_tools: list[str] = Field(default_factory=list)
    protocol_versions: list[str] = Field(default_factory=list)
    #: ``None``: what the agent declares.
    max_context_size: int | None = None
    max_concurrent_tasks: int
    #: The interval it must heartbeat at (its own, else the list's).
    heartbeat_interval_s: float
    #: SHA-256 (hex) of its public key as configured; ``None``: no key.
    public_key_sha256: Annotated[str, Field(min_length=64, max_length=64)] | None = None
    allow_unsigned: bool = False


class AgentPolicyChanged(EventData):
    """The allow-list agent-collab started with grants an external agent something else than the one it last
    started with (AP-11's "policy change", audited): the agent was ``listed`` (or first seen), ``changed`` or
    ``unlisted``. Published once per change by the first replica to start with it (the id comes from the agent and
    both grants), before the new grant is recorded; it takes effect for the agent's tool calls from that start on."""

    EVENT_TYPE: ClassVar[str] = "agent.policy_changed"
    agent_id: str
    change: Literal["listed", "changed", "unlisted"]
    #: The grant before (``None``: not listed, or agent-collab had recorded none).
    before: ExternalAgentGrant | None = None
    #: The grant now (``None``: no longer listed: every registration and tool call is refused).
    after: ExternalAgentGrant | None = None
    tools_granted: list[str] = Field(default_factory=list)
    tools_revoked: list[str] = Field(default_factory=list)
    #: Where the change came from: ``file:<path>`` of the allow-list.
    requested_by: str


class AgentConformanceChecked(EventData):
    """A conformance round of an external agent ended (PRO-2): each probed capability verified or not."""

    EVENT_TYPE: ClassVar[str] = "agent.conformance_checked"
    agent_id: str
    incarnation: int
    round: int
    #: Every probe answered correctly and in time.
    passed: bool
    results: list[ConformanceResult]
    started_at: datetime
    deadline: datetime
    #: When the answers arrived (``None``: none came, the deadline's timer ended the round).
    answered_at: datetime | None = None


class AgentReadmitted(EventData):
    """An operator lifted the hold an operator decommissioning put on an external agent: it may register
    again (a new incarnation). The decommissioned incarnation stays decommissioned."""

    EVENT_TYPE: ClassVar[str] = "agent.readmitted"
    agent_id: str
    #: The incarnation an operator had decommissioned.
    incarnation: int
    requested_by: str
    reason: Annotated[str, Field(max_length=500)] = ""


# --------------------------------------------------------------------------- external agents' tasks (AP-5, AP-7..AP-9)
_TaskId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")]
_ActionId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]
_SessionId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
#: What an external agent may send for a task: one action closes a turn (``tool_calls``, ``result``,
#: ``failure``); ``checkpoint`` (AP-7) and ``event`` (AP-9) may come any time while it holds the task.
TaskActionKind = Literal["tool_calls", "result", "failure", "handoff", "checkpoint", "event"]
#: The streaming events of AP-9.
TaskEventKind = Literal["progress", "log", "warning", "partial_result", "metrics"]
#: Why agent-collab refused a task message (journaled as ``agent.task.refused``).
TaskRefusalReason = Literal[
    "malformed_request",
    "not_registered",  # no live registration (or offline: heartbeat first)
    "version_mismatch",
    "unknown_task",  # no such task for this agent (never assigned, or another agent's)
    "not_taken",  # an action for a task the agent has not taken (polled) yet
    "wrong_turn",  # an action for another turn than the one open
    "turn_closed",  # the turn already has another action
    "task_ended",  # the task (its run) has ended
    "tool_not_allowed",  # a tool call outside the agent's granted tools
    "internal_error",
    "unsigned",
    "bad_signature",
    "unknown_key",
    "unknown_agent",
    "key_mismatch",
    "stale_timestamp",
    "replayed_nonce",
    "subject_mismatch",
    "rate_limited",  # more requests than the agent's rate limit allows: retry after ``retry_after_s`` seconds
]


class TaskRefusal(_AgentReply):
    """An explicit refusal of a task message: a machine-readable reason and a sentence for people."""

    reason: TaskRefusalReason
    detail: Annotated[str, Field(max_length=MAX_TEXT)]
    #: ``rate_limited``: seconds until a request will be taken again (added to 1.0: left out of other refusals).
    retry_after_s: Annotated[float, Field(ge=0)] | None = None

    _ADDED_TO_1_0 = ("retry_after_s",)


class AgentTask(_AgentReply):
    """AP-5: what an external agent is asked to do for a run."""

    run_id: str
    task_id: str
    objective: str
    #: The run's facts: ``input`` (the data it was started with), ``people`` (whom it may ask), ``instructions``
    #: (the agent card's prompt), ``launched_by``.
    context: dict[str, Any]
    #: ``tools`` (what it may call: the card's offer within its granted tools), ``max_turns``, ``max_compute_s``.
    constraints: dict[str, Any]
    acceptance_criteria: list[str]
    #: Seconds the agent has, over all its turns, before the run fails (waiting for a person never counts).
    timeout_s: float
    priority: Literal["low", "normal", "high"]


class TaskInput(_AgentReply):
    """The outcome of one tool call of the agent's last action (an ``ask_human`` answer, ...)."""

    tool_call_id: str
    tool: str
    content: str


class TaskToolCall(_AgentRequest):
    """One tool call of a ``tool_calls`` action, by the tool's name (``ask_human``, ``notify``, ...)."""

    name: _Token
    arguments: dict[str, Any] = Field(default_factory=dict)


class TaskHandoff(HandoffDocument):
    """AP-6: a ``handoff`` action -- the agent hands its whole task to another agent card (hosted or external) with
    the handoff document. The run carries it out as the ``handoff_to_agent`` tool (so the card must offer that
    tool and the agent must be granted it): one ``agent.handed_off``, the child's ``run.requested`` in the same
    saga, and the run completes, handed off. A target the run cannot hand off to comes back as the next turn's
    input (a tool error), like any refused tool call. The document's fields are :class:`HandoffDocument`'s (what
    an external agent sends is read like any of its requests: unknown fields ignored, PRO-3)."""

    #: The agent card to hand the task to.
    agent: Annotated[str, Field(min_length=1, max_length=128)]


class TaskCheckpoint(_AgentRequest):
    """AP-7: the agent's state, stored by the platform (one per task, the last wins) and handed back on
    recovery (AP-8). ``checkpoint_id`` and ``timestamp`` are set by agent-collab when the agent leaves them out."""

    checkpoint_id: _ActionId | None = None
    run_id: str | None = None
    timestamp: datetime | None = None
    execution_state: dict[str, Any] = Field(default_factory=dict)
    memory_snapshot: dict[str, Any] = Field(default_factory=dict)
    artifact_references: list[Annotated[str, Field(max_length=1024)]] = Field(default_factory=list, max_length=64)


class StoredCheckpoint(_AgentReply):
    """AP-7, as stored and handed back: every field set."""

    checkpoint_id: str
    run_id: str
    task_id: str
    turn: int
    timestamp: datetime
    execution_state: dict[str, Any]
    memory_snapshot: dict[str, Any]
    artifact_references: list[str]


class TaskStreamEvent(_AgentRequest):
    """AP-9: a progress report, log line, warning, partial result or metrics, journaled as ``agent.task.streamed``."""

    kind: TaskEventKind
    message: Annotated[str, Field(max_length=MAX_TEXT)] = ""
    data: dict[str, Any] = Field(default_factory=dict)
    #: The request it belongs to (e.g. the ``ask_human`` in flight); default: the task id.
    request_id: Annotated[str, Field(max_length=128)] | None = None


class TaskPoll(_AgentRequest):
    """An agent asks for its tasks, on ``temporality.rpc.agents.<agent id>.tasks`` (after each heartbeat, say).

    ``session_id`` names the agent *process* (a fresh one at every start): a task held under another session
    is being *resumed* (AP-8) -- journaled, and the run publishes ``run.resumed``."""

    agent_id: ExternalAgentId
    protocol_version: _VersionText
    session_id: _SessionId


class TaskAssignment(_AgentReply):
    """One task the agent holds, as it stands."""

    task: AgentTask
    #: Where the task's dialogue is (``offered``, ``working``, ``acted``); ``cancelled``: its run was cancelled --
    #: stop working on it (handed over once, in the next poll after the cancel; actions on it are refused).
    state: str
    #: The turn open now; act on it with ``turn`` = this.
    turn: int
    #: The outcomes of the last action's tool calls (empty on turn 1).
    inputs: list[TaskInput]
    #: This turn already has the agent's action (sent before a crash): wait for the next turn.
    acted: bool
    #: The last checkpoint stored for the task (AP-7), for a resume (AP-8).
    checkpoint: StoredCheckpoint | None = None
    #: Taken under another session before: the agent resumes it (check the context is still current).
    resumed: bool = False
    messages: list[str] | None = Field(
        default=None,
        description=(
            "Agent messages (COL-4) delivered to the run at this turn's boundary, each as the run's conversation has "
            "it: the fixed framing (type, request id, sender; what to do) then the other agent's text; an ask among "
            "them is answered with an answer_agent tool call. Sent only when there are some: an additive change of "
            "protocol 1.0"
        ),
    )
    #: ``messages`` only when there are some: every other assignment keeps its 1.0 shape.
    _ADDED_TO_1_0 = ("messages",)


class TaskPollReply(_AgentReply):
    agent_id: str
    accepted: bool
    tasks: list[TaskAssignment] = Field(default_factory=list)
    refusal: TaskRefusal | None = None


class TaskAction(_AgentRequest):
    """An agent's message for a task, on ``temporality.rpc.agents.<agent id>.act``.

    ``action_id`` is the agent's own, stable id of this action (e.g. ``<task>:<turn>:act``): the same action
    sent again (a retry after a lost reply, after a crash) is answered ``duplicate: true`` and changes nothing.
    """

    agent_id: ExternalAgentId
    protocol_version: _VersionText
    task_id: _TaskId
    #: The turn it acts on (the assignment's ``turn``).
    turn: Annotated[int, Field(gt=0)]
    action_id: _ActionId
    kind: TaskActionKind
    #: ``tool_calls``: the calls, run by the platform in order; their outcomes come back as the next turn's inputs.
    calls: list[TaskToolCall] = Field(default_factory=list, max_length=16)
    #: ``result``: the task's final answer.
    result: Annotated[str, Field(max_length=MAX_TEXT * 4)] | None = None
    #: ``failure``: why it gives up.
    error: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    #: ``handoff`` (AP-6): the target agent card and the handoff document; the run ends, handed off.
    handoff: TaskHandoff | None = None
    checkpoint: TaskCheckpoint | None = None
    event: TaskStreamEvent | None = None

    @model_validator(mode="after")
    def _fits_kind(self) -> TaskAction:
        needs = {"tool_calls": bool(self.calls), "result": self.result is not None, "failure": self.error is not None}
        needs |= {"handoff": self.handoff is not None}
        needs |= {"checkpoint": self.checkpoint is not None, "event": self.event is not None}
        if not needs[self.kind]:
            field = {"tool_calls": "calls", "result": "result", "failure": "error"}.get(self.kind, self.kind)
            raise ValueError(f"a {self.kind} action needs {field}")
        return self


class TaskActionReply(_AgentReply):
    agent_id: str
    task_id: str
    accepted: bool
    #: The same action was already accepted: nothing changed.
    duplicate: bool = False
    state: str | None = None
    checkpoint_id: str | None = None
    refusal: TaskRefusal | None = None
    child_run_id: str | None = Field(
        default=None,
        description=(
            "An accepted handoff action (AP-6): the run id of the child its run hands the task to, derived as the "
            "run-executor derives it (the same on a duplicate). Sent only in the reply to a handoff: every other "
            "reply is without the property (an additive change of protocol 1.0)"
        ),
    )
    #: ``child_run_id`` only when there is one: the replies to every other action keep their 1.0 shape.
    _ADDED_TO_1_0 = ("child_run_id",)


class AgentTaskOffered(EventData):
    """The run-executor offers an external agent a turn of a run's task (AP-5): the task on the first turn,
    the outcomes of the agent's last tool calls on the next."""

    EVENT_TYPE: ClassVar[str] = "agent.task.offered"
    run_id: str
    task_id: str
    agent_id: str
    turn: int
    task: AgentTask
    inputs: list[TaskInput] = Field(default_factory=list)
    #: Agent messages delivered to the run at this turn's boundary (COL-4), framed as the run's conversation has
    #: them: the agent gets them with the turn (``TaskAssignment.messages``).
    messages: list[str] = Field(default_factory=list)


class AgentTaskTaken(EventData):
    """The agent took the task (polled it): first, or again after a crash or restart (``resumed``, AP-8)."""

    EVENT_TYPE: ClassVar[str] = "agent.task.taken"
    run_id: str
    task_id: str
    agent_id: str
    turn: int
    #: Takes of the task so far (1: the first).
    take: int
    session_id: str
    resumed: bool
    checkpoint_id: str | None = None


class AgentTaskActed(EventData):
    """The agent's action for a turn (tool calls, a result or a failure): the run carries it out."""

    EVENT_TYPE: ClassVar[str] = "agent.task.acted"
    run_id: str
    task_id: str
    agent_id: str
    turn: int
    action_id: str
    kind: Literal["tool_calls", "result", "failure", "handoff"]
    #: The tools it calls (``handoff``: ``handoff_to_agent``).
    tools: list[str] = Field(default_factory=list)
    detail: Annotated[str, Field(max_length=MAX_TEXT)] = ""


class AgentTaskCheckpointed(EventData):
    """AP-7: agent-collab stored the agent's checkpoint for the task (the state itself is in KV)."""

    EVENT_TYPE: ClassVar[str] = "agent.task.checkpointed"
    run_id: str
    task_id: str
    agent_id: str
    turn: int
    checkpoint_id: str
    artifact_references: list[str] = Field(default_factory=list)
    size_bytes: int


class AgentTaskStreamed(EventData):
    """AP-9: a streaming event of an external agent's task, with the saga's correlation id and its request id."""

    EVENT_TYPE: ClassVar[str] = "agent.task.streamed"
    run_id: str
    task_id: str
    agent_id: str
    turn: int
    kind: TaskEventKind
    correlation_id: str
    request_id: str
    message: Annotated[str, Field(max_length=MAX_TEXT)] = ""
    data: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------------------- hosted runs' streaming events (AP-9)
class RunStreamed(EventData):
    """AP-9 for a run the run-executor computes itself (a hosted run): a progress report, log line, warning or
    partial result the agent sent with its ``report_progress`` tool, or the turn's ``metrics`` (tokens, the
    provider's latency, tool calls) the executor reports after each provider reply.

    The payload is :class:`AgentTaskStreamed`'s -- the same ``kind`` vocabulary (:data:`TaskEventKind`) and the
    same ``run_id, turn, correlation_id, request_id, message, data`` -- without the task and agent fields only an
    external agent's task has. Its own type, not ``agent.task.streamed``: each event type has one sender
    (the run-executor here, agent-collab there), so a consumer can tell who vouches for it (SEC-1). Deterministic
    id per (run, turn, call index), ``metrics`` per (run, turn): a replayed turn republishes the same ids."""

    EVENT_TYPE: ClassVar[str] = "run.streamed"
    run_id: str
    #: The agent card the run executes.
    agent: str
    turn: int
    kind: TaskEventKind
    #: The run's saga.
    correlation_id: str
    #: The request the turn works on: the one it answers (``answer_agent``, a relay run's), the one the agent
    #: named, else the run's own id (as an external agent's task id stands for its run).
    request_id: Annotated[str, Field(max_length=128)]
    message: Annotated[str, Field(max_length=MAX_TEXT)] = ""
    data: dict[str, Any] = Field(default_factory=dict)
    #: The ``report_progress`` call that sent it (``None``: the executor's own ``metrics``).
    call_id: str | None = None
    #: ``message`` was cut at :data:`MAX_TEXT` characters.
    truncated: bool = False


class AgentTaskEnded(EventData):
    """The task ended with its run (AP-5): completed, failed or cancelled. A cancelled task is handed to the agent
    once more (``state: cancelled`` in its next task poll) so it stops working on it; an action after the end is
    refused ``task_ended``."""

    EVENT_TYPE: ClassVar[str] = "agent.task.ended"
    run_id: str
    task_id: str
    agent_id: str
    #: The turn it was at.
    turn: int
    state: Literal["completed", "failed", "cancelled"]
    #: The run's event that ended it (``run.completed``, ``run.failed``, ``run.cancelled``).
    cause: str
    #: Whether the agent had taken it (a task never taken has nobody to tell).
    taken: bool


class AgentTaskRefused(EventData):
    """agent-collab refused an agent's task message that was out of order for the task's dialogue (AP-5, PRO-5)."""

    EVENT_TYPE: ClassVar[str] = "agent.task.refused"
    agent_id: str
    task_id: str | None = None
    run_id: str | None = None
    turn: int | None = None
    action_id: str | None = None
    kind: str | None = None
    reason: TaskRefusalReason
    detail: Annotated[str, Field(max_length=MAX_TEXT)]


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
        RunSampled,
        RunStreamed,
        RunCheckpointed,
        RunResumed,
        RunCompleted,
        RunFailed,
        RunCancelRequested,
        RunCancelled,
        RunInputAfterEnd,
        HumanRequested,
        HumanNotified,
        HumanNotifyRequested,
        HumanCancelRequested,
        HumanRejected,
        HumanAnswered,
        HumanAnswerRefused,
        HumanExpired,
        HumanWithdrawn,
        HumanReasked,
        HumanEscalated,
        HumanDirectoryChanged,
        HumanNotificationDelivered,
        HumanNotificationFailed,
        AgentAsked,
        AgentMessageReceived,
        AgentReplied,
        AgentHandedOff,
        AgentAnswerReceived,
        AgentAskExpired,
        AgentAskUndeliverable,
        AgentReplyUndeliverable,
        AgentRegistered,
        AgentRegistrationRefused,
        AgentMessageRefused,
        AgentLifecycleChanged,
        AgentReadmitted,
        AgentPolicyChanged,
        AgentConformanceChecked,
        AgentTaskOffered,
        AgentTaskTaken,
        AgentTaskActed,
        AgentTaskCheckpointed,
        AgentTaskStreamed,
        AgentTaskEnded,
        AgentTaskRefused,
        ApiAccessRefused,
        BusPermissionRefused,
        BusDeadLettered,
    )
}
