"""The run machine: what a run does next, decided from plain data -- no I/O, no clock of its own.

Temporal splits a workflow (deterministic decisions) from its activities (side effects); the
run-executor splits the same way. :func:`decide` takes

* the run record and its last checkpoint as the driver read them (``None``: not there),
* the :class:`Agent` (the card and the tools its runs may be offered; ``None``: no such card),
* one :data:`Incoming` thing: a message the executor consumed (:class:`Requested`,
  :class:`HumanOutcome`, :class:`CancelRequested`, :class:`WatchdogFired`, :class:`DeadLettered`), the
  result of a call the machine asked for (:class:`ProviderReplied`, :class:`ProviderFailed`,
  :class:`ToolReturned`), or a step it chained itself (:class:`Boundary`, :class:`Parked`...),
* the time (``now``) and the delivery attempt (:class:`Attempt`),

and returns a :class:`Decision`: the :data:`Effect` s to perform, in order, then
(:attr:`Decision.then`) nothing (the handler is done), another :data:`Incoming` to decide on once the
effects are performed, or a call (:class:`CallProvider`, :class:`CallTool`) whose result is the next
:data:`Incoming`. The driver (:class:`temporality_run_executor.engine.Engine`) reads the state, performs
the effects and calls, and loops; it decides nothing.

The rules the machine keeps:

* **Turn boundaries.** A turn is one provider call plus its tool calls, then a checkpoint
  (:class:`SaveCheckpoint`: one compare-and-set against the checkpoint the turn started from, so two
  drivers never both commit a turn). Whatever comes from outside -- a cancel, a person's answer --
  takes effect only at a boundary (:func:`_boundary`), never in the middle of a turn (COL-4): an answer
  that arrives while its run is still parking is retried until the run is parked, a cancel is recorded
  and applied by the driver at its next boundary.
* **Deterministic ids.** Event ids derive from the run, the event type and the facts (turn, call
  index, request id); request ids from (run, turn, call index). A replay after a crash between the
  provider's reply, a tool's side effect and the checkpoint republishes the same ids (deduplicated):
  no question is asked twice.
* **Facts before state.** Every event is published before the state that records it is committed -- except the
  run's end (:func:`_end`): its terminal state is committed first (a run ends once: a second end is refused), then
  its terminal event, built from the committed record (:func:`ending_event`), then, once acknowledged, marked
  published on the record; until then published again from the record by a redelivery, a timer or the dead-letter
  hook that meets the finished run (:func:`_ended`).
* **Limits exclude waiting.** ``compute_s`` sums the provider and tool time of committed turns; a
  parked run has no watchdog and spends nothing.

* **Agent messages (COL-2..COL-4).** An ``agent.*`` event for the run (:class:`AgentNews`) either ends
  the run's ``waiting_for_agent`` (the ``ask_agent`` call's result, applied like a person's answer) or
  is queued in the checkpoint's ``inbox`` (:class:`QueueMail`) and framed as a user message at the next
  turn boundary (:class:`DeliverMail`, :func:`frame`): never in the middle of a turn, never while the
  run is parked, never dropped. ``ask_agent`` and ``answer_agent`` are decided here, not run by the
  driver: their events are :class:`Emit` plans of the turn, their request ids derived from (run,
  turn, call index).
* **Several questions at once (HUM-7).** The ``ask_human`` calls of one reply are asked together: each
  its own request (ids from run, turn, call index), one ``human.requested`` each, one park (the
  checkpoint's ``pending`` is the first, ``more_pending`` the rest). Each outcome is recorded in the
  checkpoint (:class:`RecordOutcome`, once per request); the one that ends the wait -- every call has an
  outcome (``wait_for: all``, the default), or one is an answer (``wait_for: first``) -- resumes the run,
  and every call gets its tool result in call order (:class:`ApplyParked`), a question not needed any
  more ``not_needed``. The calls must agree on ``wait_for`` (else none is asked); a waiting ``ask_agent``
  or a handoff never shares their turn.
* **MCP elicitation (issue 6).** An MCP tool call that asks for the user's input mid-call
  (:class:`ToolElicited`) parks the turn on a person like ``ask_human`` (the checkpoint's ``pending`` of
  kind ``elicit``, ``elicit`` the call; at most one per turn, never with another waiting call). The
  person's outcome is read against the form (:mod:`.elicitation`) and recorded (:class:`AnswerElicitation`)
  -- or, not fitting, asked again -- and the next boundary makes the call again (:class:`RetryTool`), the
  recorded answers given to the server; its result (:class:`ToolRetried`) completes the turn, or a further
  question parks the run again.
* **Finished runs keep their record, not their checkpoint (issue 11).** Every ending (:func:`_complete`,
  :func:`_fail`, :func:`_cancel`) arms the run's checkpoint retention (:class:`ArmRetention`) once the end
  is committed; its firing (:class:`RetentionFired`) removes the checkpoint of a run still finished
  (:class:`RemoveCheckpoint`). The record stays: a replayed ``run.requested`` is still a duplicate, and a
  late answer, agent message, cancel, watchdog firing or dead letter is decided on it alone (none of those
  paths reads the checkpoint of a finished run). A decision on a finished run whose checkpoint is still
  there arms the retention again (:func:`_retain`): the same deadline, so a driver that died between the
  end and the arm leaves no checkpoint behind once its message comes back (see :mod:`.retention`).
* **External agents park the run (AP-5).** A card whose provider is an external agent has its turns computed
  outside: the driver offers the turn and, the agent not having acted yet (:class:`AgentWorking`), the run
  parks ``waiting_for_agent`` on the turn's wait id (:func:`~temporality_protocol.agent_tasks.turn_wait_id`)
  with its timer at the compute budget left (:class:`ArmAgentDeadline`) -- no driver, no slot, no compute
  counted but the agent's own time. The agent's action (:class:`AgentActed`, from ``agent.task.acted``) or
  the timer makes the driver read the action (:class:`LookForAction` -> :class:`AgentLooked`); the run wakes
  in one compare-and-set guarded by the wait id (a second wake-up finds it moved on), publishes ``run.resumed``
  (``agent_action``) and the action is the turn's provider reply; no action by the deadline (or one after it): ``compute_timeout``.
* **One driver at a time (issue 6).** A handler that drives the run holds its :class:`~.records.Lease`
  (:class:`TakeLease`, renewed at every turn boundary, dropped when the run parks or ends); a
  delivery that finds a live lease held by another handler gives the message back (a lost race)
  instead of driving; an expired one (its driver died) is taken over as recovery.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import ValidationError

from temporality_bus import PermanentError, TransientError, evolve
from temporality_bus.models import evolve_shallow
from temporality_protocol import (
    ASK_TIMEOUT_MAX_S,
    RUN,
    AgentAnswerReceived,
    AgentAsked,
    AgentAskExpired,
    AgentAskUndeliverable,
    AgentHandedOff,
    AgentMessageReceived,
    AgentReplied,
    AgentReplyUndeliverable,
    AgentSummary,
    EventData,
    HandoffDocument,
    HumanAnswered,
    HumanCancelRequested,
    HumanExpired,
    HumanRejected,
    HumanRequested,
    LaunchSource,
    RunCancelled,
    RunCancelRequested,
    RunCheckpointed,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunFailureReason,
    RunInputAfterEnd,
    RunRequested,
    RunResumed,
    RunStarted,
    RunState,
    RunStreamed,
    RunToolCalled,
    RunUsage,
    ToolFailed,
    derive_id,
)
from temporality_protocol.agent_tasks import external_call_id, handoff_ids, task_id_for, turn_wait_id
from temporality_protocol.redaction import Redactor
from temporality_run_executor.agents import AgentCard, Limits, prompt_digest, sandbox_summary
from temporality_run_executor.bounds import MAX_RESULT_BYTES, bounded_reply, bounded_result
from temporality_run_executor.elicitation import MAX_REFUSED, form_problem, read, read_url, render, render_url
from temporality_run_executor.providers.base import AssistantTurn, ToolSpec, TurnContext
from temporality_run_executor.records import (
    AgentMail,
    CancelRequest,
    Checkpoint,
    ElicitAnswer,
    Elicitation,
    Ending,
    KeptReply,
    Lease,
    Message,
    ParkedOutcome,
    PendingAsk,
    ReceivedAsk,
    RunRecord,
    ToolCall,
    Usage,
)
from temporality_run_executor.results import (
    AgentAnsweredResult,
    AgentTimedOutResult,
    AgentUndeliverableResult,
    HumanAnsweredResult,
    HumanNotNeededResult,
    HumanResult,
    human_result,
    tool_content,
)
from temporality_run_executor.retention import RetentionPayload
from temporality_run_executor.streaming import redact_json, report, turn_metrics, turn_request
from temporality_run_executor.tools import (
    ANSWER_AGENT,
    ASK_AGENT,
    ASK_HUMAN,
    COLLAB_TOOLS,
    GET_INPUT,
    HANDOFF_TO_AGENT,
    NOTIFY,
    REPORT_PROGRESS,
    AnswerAgentArgs,
    AskAgentArgs,
    AskHumanArgs,
    HandoffArgs,
    Tool,
    ToolError,
    ToolRegistry,
    WaitFor,
)
from temporality_run_executor.watchdog import WatchdogPayload

__all__ = [
    "ACTIVE",
    "MAX_ELICITATIONS",
    "MAX_HANDOFF_DEPTH",
    "MAX_TEXT",
    "AdoptCancelMarker",
    "Agent",
    "AgentActed",
    "AgentLooked",
    "AgentNews",
    "AgentWorking",
    "AnswerElicitation",
    "ApplyParked",
    "ApplyResult",
    "ArmAgentDeadline",
    "ArmRetention",
    "ArmWatchdog",
    "Ask",
    "Attempt",
    "Boundary",
    "CallProvider",
    "CallTool",
    "CancelRecorded",
    "CancelRequested",
    "CreateCheckpoint",
    "CreateRun",
    "DeadLettered",
    "Decision",
    "DeliverMail",
    "DisarmWatchdog",
    "Effect",
    "Emit",
    "FlagCancel",
    "HumanOutcome",
    "Incoming",
    "Invoke",
    "KeepReply",
    "LeaseHeld",
    "LeaseLost",
    "LookForAction",
    "MarkCancel",
    "MarkPublished",
    "Note",
    "Parked",
    "ProviderFailed",
    "ProviderReplied",
    "Publish",
    "QueueMail",
    "RecordOutcome",
    "Refuse",
    "Reject",
    "RemoveCheckpoint",
    "Requested",
    "RetentionFired",
    "Retry",
    "RetryTool",
    "RunMovedOn",
    "SaveCheckpoint",
    "TakeLease",
    "Then",
    "TooLarge",
    "ToolBroke",
    "ToolElicited",
    "ToolOutput",
    "ToolPlan",
    "ToolRetried",
    "ToolReturned",
    "Transition",
    "TurnInFlight",
    "WatchdogFired",
    "agent_news",
    "apply_parked",
    "apply_result",
    "decide",
    "delivered",
    "drives",
    "elicit_request_id",
    "elicitation_answered",
    "ending_event",
    "flagged",
    "frame",
    "handed_off_to",
    "handoff_ids",
    "human_outcome",
    "initial_checkpoint",
    "kept_reply",
    "leased",
    "merge_mail",
    "moved",
    "new_record",
    "offered_tools",
    "published",
    "queued",
    "recorded",
    "released",
    "renewed",
    "summary",
    "tool_error",
    "wait_for",
    "with_reply",
]

#: States in which a driver is (or should be) working on the run: the watchdog watches these.
ACTIVE = frozenset({RunState.PENDING, RunState.RUNNING, RunState.RESUMING})
#: The tool whose call a pending ask of each kind parks (its result is applied to that call).
_PARKED_TOOL = {"human": ASK_HUMAN, "agent": ASK_AGENT}
#: What the run waits in, per kind of pending ask.
_WAITING = {"human": RunState.WAITING_FOR_HUMAN, "agent": RunState.WAITING_FOR_AGENT}
#: Free text in ``agent.*`` events is cut to this many characters by its sender (COL-9).
MAX_TEXT = 4096


class LeaseHeld(TransientError):
    """Another handler holds a live lease on the run: this delivery does not drive it (retried later; a
    lost race, so giving up on it fails nothing)."""


class LeaseLost(Exception):
    """This handler's lease was taken over (it had expired): another handler drives the run now."""


class RunMovedOn(Exception):
    """Another driver moved the run past what this handler wanted to do (a redelivery racing the
    original, a duplicate answer): this handler's work is stale and it ends quietly."""

    def __init__(self, run_id: str, state: RunState, target: RunState) -> None:
        super().__init__(f"run {run_id} is {state.value}; not moving it to {target.value}")


# --------------------------------------------------------------------------- what the machine knows
@dataclass(frozen=True)
class Agent:
    """An agent card with the tools its runs may be offered (the executor's, plus its MCP servers')."""

    card: AgentCard
    tools: ToolRegistry
    #: The ids of the agent cards this executor knows (hosted and external): the targets ``handoff_to_agent``
    #: accepts (AP-6).
    hosted: frozenset[str] = frozenset()
    #: The most its runs' result (the final reply) may be, in bytes; longer is cut (:func:`~.bounds.result_limit`
    #: of the bus's ``max_payload``).
    result_bytes: int = MAX_RESULT_BYTES

    def offered(self) -> list[Tool]:
        return self.tools.offered(self.card.tools)

    def specs(self) -> list[ToolSpec]:
        return self.tools.specs(self.card.tools)


@dataclass(frozen=True)
class Attempt:
    """The delivery of the message being handled: its stream sequence and how often it was delivered."""

    stream_seq: int = 0
    delivered: int = 1
    max_deliver: int = 8
    #: Who handles it: the holder of the run's lease while this handler drives it.
    driver: str = "driver"
    #: How long a lease lasts past its last renewal (tied to the consumers' ack wait).
    lease_s: float = 30.0

    @property
    def redelivered(self) -> bool:
        """An earlier delivery of this message was not acked: its handler failed, or died (maybe between a run's
        end and its terminal event: :func:`_ended`)."""
        return self.delivered > 1

    @property
    def last(self) -> bool:
        """No redelivery will follow: what fails now fails for good."""
        return self.delivered >= self.max_deliver

    def cause(self, phase: str) -> tuple[str, ...]:
        """Id parts of something done in ``phase`` of this delivery (a watchdog arm, a recovery)."""
        return phase, str(self.stream_seq), str(self.delivered)


# --------------------------------------------------------------------------- incoming
@dataclass(frozen=True)
class Requested:
    """``run.requested``: create the run once, start it (or recover it: it was running)."""

    request: RunRequested
    correlation_id: str
    tenant: str | None = None
    #: The ``run.requested`` event's id (``run.created``'s causation; the default of what the delivery publishes).
    event_id: str = ""
    #: The driver has looked for a cancel that came before the run (:class:`AdoptCancelMarker`).
    marker_checked: bool = False


@dataclass(frozen=True)
class HumanOutcome:
    """A ``human.answered`` / ``human.expired`` / ``human.rejected`` for one of the run's requests."""

    event_type: str
    event_id: str
    run_id: str
    request_id: str
    result: HumanResult
    reason: Literal["answer", "expiry", "rejection"]
    waited_s: float | None = None
    #: An expiry under a ``fail`` timeout policy: the run fails instead of resuming.
    fails_run: bool = False
    #: An expiry under a ``cancel`` timeout policy: human-interaction published ``run.cancel_requested`` for
    #: the run before this outcome, and that cancels it; the run does not resume without an answer.
    cancels_run: bool = False
    #: Who answered (``user:<id>``); ``None`` for an expiry or a rejection.
    sender: str | None = None


@dataclass(frozen=True)
class AgentNews:
    """An ``agent.*`` event for the run (COL-2..COL-4): a message to queue, or the end of its wait."""

    event_type: str
    event_id: str
    run_id: str
    mail: AgentMail
    #: The result it gives a waiting ``ask_agent`` call on ``mail.request_id`` (``None``: only a message).
    result: str | None = None
    reason: Literal["answer", "expiry", "rejection"] = "answer"
    waited_s: float | None = None
    #: An ask to a relay run: the request is in the run's input already (not delivered again).
    relay: bool = False


@dataclass(frozen=True)
class CancelRequested:
    """``run.cancel_requested`` (RUN-2)."""

    run_id: str
    reason: str
    requested_by: str
    event_id: str
    #: The run was unknown and the cancel is left as a marker (:class:`MarkCancel`); decided again once.
    marked: bool = False


@dataclass(frozen=True)
class CancelRecorded:
    """The cancel is on the record: cancel the run now if nobody drives it."""

    requested_by: str


@dataclass(frozen=True)
class Boundary:
    """A turn boundary of the driving handler (run and checkpoint read afresh): start a turn, park or end.

    ``recovery``: the first boundary of a handler that took over a run whose driver died mid-turn. A run of an
    external agent then keeps its queued agent messages for the next boundary: the turn it calls again may
    already have been offered to the agent (the offer's id is the turn's, so a second one with these messages
    would be dropped as a duplicate) or acted on, and a message framed before the turn's action would never be
    in an offer (:func:`temporality_run_executor.external.messages_of` offers those after the last action)."""

    recovery: bool = False


@dataclass(frozen=True)
class Parked:
    """The run just parked: a cancel recorded while it parked applies now (nobody else drives it)."""


@dataclass(frozen=True)
class ProviderReplied:
    turn: int
    reply: AssistantTurn
    #: Seconds since the turn's provider call began (the turn's compute so far).
    elapsed_s: float
    #: Straight from the provider, nothing of it stored and the record not read since the call: the machine first
    #: keeps it on the record (:class:`KeepReply`) when one of its calls may have an effect outside the run
    #: before the turn's checkpoint, then decides on it (the record as that write, or a read, left it).
    raw: bool = False
    #: The reply kept on the record by a driver that died mid-turn, carried out again by the one that took over
    #: (:func:`_boundary`): the model is not asked again.
    replayed: bool = False


@dataclass(frozen=True)
class ProviderFailed:
    turn: int
    error: str
    #: Retrying cannot help (:class:`~temporality_run_executor.providers.PermanentProviderError`).
    permanent: bool
    #: The run's compute budget ran out in the call (:class:`~temporality_run_executor.providers.BudgetSpent`).
    budget_spent: bool = False


@dataclass(frozen=True)
class AgentWorking:
    """The external agent has the turn and has not acted on it yet (the driver offered it): park the run."""

    turn: int
    agent_id: str


@dataclass(frozen=True)
class AgentActed:
    """A wake-up for a run parked on its external agent: ``agent.task.acted`` for ``turn`` of task ``task_id``,
    or (``deadline``) the run's timer at its compute budget's end (:mod:`.watchdog`)."""

    run_id: str
    task_id: str
    turn: int
    event_id: str
    deadline: bool = False


@dataclass(frozen=True)
class AgentLooked:
    """What the task's record held for the parked turn (:class:`LookForAction`): the action as the turn's provider
    reply (the agent's failure, or the task over: :class:`ProviderFailed`), or ``None``: no action yet."""

    turn: int
    outcome: ProviderReplied | ProviderFailed | None
    deadline: bool = False
    #: :attr:`LookForAction.cause`: the causation of the ``run.resumed`` a wake-up publishes.
    cause: str | None = None


@dataclass(frozen=True)
class ToolOutput:
    """What a tool returned (or the tool error it raised, as the model gets it)."""

    content: str


@dataclass(frozen=True)
class ToolBroke:
    """The tool raised something other than :class:`ToolError`: ``tool.failed``, an error for the model."""

    error: str


@dataclass(frozen=True)
class ToolElicited:
    """The tool asked for the user's input mid-call (an MCP elicitation) that no recorded answer fits
    (:class:`~.tools.ElicitationNeeded`): the run parks on a person, then the call is made again."""

    message: str
    requested_schema: dict[str, Any]
    #: Which of the call's elicitations it is (0: its first).
    position: int
    #: URL mode (MCP 2025-11-25): the link the person is asked to open (``requested_schema`` empty).
    url: str | None = None


ToolOutcome = ToolOutput | ToolBroke | ToolElicited


@dataclass(frozen=True)
class Invoke:
    """Run the tool (the driver does, with the call's arguments)."""

    tool: Tool


@dataclass(frozen=True)
class Refuse:
    """The call is not executed; ``content`` (a tool error) goes back to the model."""

    content: str
    #: Counts against ``limits.max_malformed_tool_calls`` (not allowed, arguments not JSON).
    malformed: bool = False
    note: Note | None = None


@dataclass(frozen=True)
class Ask:
    """The call parks the run on a person; its result is their answer, applied at a later boundary."""

    pending: PendingAsk


@dataclass(frozen=True)
class Emit:
    """The call is decided by the machine: ``publish`` (``agent.asked`` async, ``agent.replied``) is its side
    effect, ``content`` its result."""

    content: str
    publish: Publish
    #: ``answer_agent``: the request it answers (marked answered when the turn commits).
    answers: str | None = None
    #: Published right after ``publish`` (a handoff's child ``run.requested``).
    also: tuple[Publish, ...] = ()
    #: ``handoff_to_agent``: the child run; the run completes (handed off) when the turn commits (AP-6).
    handoff: str | None = None
    #: What the call's ``run.tool_called`` shows instead of its arguments (``report_progress``: redacted).
    shown: dict[str, Any] | None = None


ToolPlan = Invoke | Refuse | Ask | Emit


@dataclass(frozen=True)
class TurnInFlight:
    """A turn between the provider's reply and its checkpoint: the plan of each call, the results so far."""

    number: int
    reply: AssistantTurn
    usage: Usage
    plans: tuple[ToolPlan, ...]
    #: The tool messages of the calls handled so far, in call order (parked calls have none yet).
    results: tuple[Message, ...] = ()
    #: An MCP tool call of the turn that asked for the user's input (at most one per turn), and its ask.
    elicited: Elicitation | None = None
    elicit_pending: PendingAsk | None = None
    #: AP-9: the provider reply's ``metrics`` (a hosted run's), published right after the turn's commit with its
    #: ``run.checkpointed`` (no wait of its own) and kept in the checkpoint, so a recovery republishes them.
    metrics: RunStreamed | None = None

    @property
    def calls(self) -> list[ToolCall]:
        return self.reply.tool_calls

    @property
    def pending(self) -> PendingAsk | None:
        return next((plan.pending for plan in self.plans if isinstance(plan, Ask)), self.elicit_pending)

    @property
    def parked(self) -> list[PendingAsk]:
        """Every call of the turn that parks the run, in call order (several ``ask_human``: HUM-7)."""
        return [plan.pending for plan in self.plans if isinstance(plan, Ask)]

    @property
    def malformed(self) -> int:
        return sum(1 for plan in self.plans if isinstance(plan, Refuse) and plan.malformed)


@dataclass(frozen=True)
class ToolReturned:
    turn: TurnInFlight
    index: int
    outcome: ToolOutcome
    #: Seconds since the turn's provider call began.
    elapsed_s: float
    #: Tokens the call's MCP sampling requests cost (the run's model, :mod:`.sampling`).
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class ToolRetried:
    """What the call parked on its elicitation returned when made again with the person's answers."""

    elicitation: Elicitation
    outcome: ToolOutcome
    #: Seconds the call took.
    elapsed_s: float
    #: Tokens the call's MCP sampling requests cost (the run's model, :mod:`.sampling`).
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class WatchdogFired:
    payload: WatchdogPayload
    #: The watchdog's grace beyond the compute limit (for the failure's text).
    grace_s: float


@dataclass(frozen=True)
class RetentionFired:
    """The run's checkpoint retention ended (:mod:`.retention`): remove the checkpoint of a run still finished."""

    payload: RetentionPayload


@dataclass(frozen=True)
class DeadLettered:
    """The consumer runner gives up on a message naming the run (deliveries used up, or a permanent error)."""

    event_type: str
    event_id: str
    #: The ``request_id`` of a ``human.*`` message.
    request_id: str | None
    deliveries: int
    #: ``"<exception type>: <message>"``.
    error: str
    #: The handler lost a compare-and-set to another driver, which is making progress with the run.
    lost_race: bool = False


@dataclass(frozen=True)
class TooLarge:
    """A write of the run's state would not fit in one bus message (the NATS server's ``max_payload``): its
    conversation grew past it (``what="conversation"``), a reply to keep on its record did (``"reply"``), or the
    run record itself did (``"record"``: its result, say, in JSON text where each character may take more bytes)."""

    what: Literal["conversation", "reply", "record"]
    #: The write's size and the most one message may carry, in bytes.
    size: int
    limit: int
    #: The checkpoint that did not fit (``None``: not a checkpoint), for the run's totals.
    checkpoint: Checkpoint | None = None


Incoming = (
    Requested
    | HumanOutcome
    | AgentNews
    | CancelRequested
    | CancelRecorded
    | Boundary
    | Parked
    | ProviderReplied
    | ProviderFailed
    | AgentWorking
    | AgentActed
    | AgentLooked
    | ToolReturned
    | ToolRetried
    | WatchdogFired
    | RetentionFired
    | DeadLettered
    | TooLarge
)


# --------------------------------------------------------------------------- effects
@dataclass(frozen=True)
class Publish:
    """Publish a run event; its id is derived from the run, the event type and ``id_parts``."""

    data: EventData
    id_parts: tuple[str, ...] = ()
    causation: str | None = None
    #: The envelope's ``runid`` when the event belongs to another run's trajectory (a handoff's child run).
    run_id: str | None = None


@dataclass(frozen=True)
class CreateRun:
    """Create the run record if absent, then read it."""

    record: RunRecord


@dataclass(frozen=True)
class CreateCheckpoint:
    """Create the run's checkpoint if absent."""

    checkpoint: Checkpoint


@dataclass(frozen=True)
class SaveCheckpoint:
    """Commit a turn: compare-and-set against the checkpoint the decision was made from, never retried
    (losing it means another driver committed this turn)."""

    checkpoint: Checkpoint


@dataclass(frozen=True)
class KeepReply:
    """Keep the provider's reply for the turn in flight on the run record (:func:`with_reply`, through ``Store.modify``,
    from the record the handler holds: one compare-and-set in place of the record's read after the provider call),
    before any call of the turn can have an effect outside the run."""

    reply: KeptReply


@dataclass(frozen=True)
class ApplyResult:
    """Apply a parked call's result to the checkpoint (:func:`apply_result`, through ``Store.modify``)."""

    request_id: str
    content: str
    #: The key of the agent event that ended the wait (``None``: a person's outcome).
    key: str | None = None


@dataclass(frozen=True)
class AnswerElicitation:
    """The person's outcome for the run's elicitation ``request_id`` (:func:`elicitation_answered`, through
    ``Store.modify``): ``answer`` recorded for the retried call, or (``repark``) the question asked again."""

    request_id: str
    answer: ElicitAnswer | None = None
    repark: PendingAsk | None = None


@dataclass(frozen=True)
class RecordOutcome:
    """HUM-7: record the outcome of one of the turn's several parked calls while the run waits on the rest
    (:func:`recorded`, through ``Store.modify``: a redelivered outcome changes nothing)."""

    outcome: ParkedOutcome


@dataclass(frozen=True)
class ApplyParked:
    """HUM-7: the wait on several parked calls is over: every call gets its tool result, in call order
    (:func:`apply_parked`, through ``Store.modify``). ``request_id``: the outcome that ended the wait."""

    request_id: str


@dataclass(frozen=True)
class QueueMail:
    """Queue an agent message in the checkpoint's inbox (:func:`queued`, through ``Store.modify``)."""

    mail: AgentMail


@dataclass(frozen=True)
class DeliverMail:
    """Frame the inbox into the conversation (:func:`delivered`, through ``Store.modify``)."""


@dataclass(frozen=True)
class TakeLease:
    """Take (or, ``renew``, keep) the run's lease (:func:`leased`, through ``Store.modify``). Held live by
    another handler: :class:`LeaseHeld`; lost while renewing: :class:`LeaseLost`."""

    lease: Lease
    renew: bool = False


@dataclass(frozen=True)
class Transition:
    """Move the run to ``target`` (:func:`moved`, through ``Store.modify``); refused: :class:`RunMovedOn`."""

    target: RunState
    changes: Mapping[str, Any] = field(default_factory=dict)
    #: Only while the run waits on this id (else :class:`RunMovedOn`): a wake-up applied once.
    waiting_on: str | None = None


@dataclass(frozen=True)
class FlagCancel:
    """Record a cancel on the run (:func:`flagged`, through ``Store.modify``)."""

    request: CancelRequest


@dataclass(frozen=True)
class MarkCancel:
    """Leave ``request`` as the cancel marker of a run not created yet (create-if-absent: the first wins),
    then read the run again (its ``run.requested`` may have created it meanwhile)."""

    request: CancelRequest


@dataclass(frozen=True)
class AdoptCancelMarker:
    """Look for the run's cancel marker (a cancel that came before its ``run.requested``) and, if there is
    one, record it on the run (:func:`flagged`, through ``Store.modify``)."""


@dataclass(frozen=True)
class ArmWatchdog:
    """(Re-)arm the run's watchdog at ``turn`` for ``limit_s`` (plus grace); ``cause`` keys the arm. ``since``: the
    moment the deadline counts from (the run's last progress; ``None``: now)."""

    turn: int
    limit_s: float
    cause: tuple[str, ...]
    since: datetime | None = None


@dataclass(frozen=True)
class DisarmWatchdog:
    pass


@dataclass(frozen=True)
class ArmAgentDeadline:
    """Arm the run's timer (in place of its watchdog) at ``deadline``: the compute budget left to a run parking on
    its external agent's action for ``agent_turn`` (``turn``: the checkpoint's); ``cause`` keys the arm."""

    turn: int
    agent_turn: int
    deadline: datetime
    cause: tuple[str, ...]


@dataclass(frozen=True)
class ArmRetention:
    """The run has ended (its terminal state is committed): arm the removal of its checkpoint at its end (the
    record's ``updated_at``) plus the executor's checkpoint retention, one timer per run (:mod:`.retention`)."""


@dataclass(frozen=True)
class MarkPublished:
    """The finished run's terminal event is acknowledged (the fired writes before it are settled first): mark it
    so on the record (:attr:`~.records.Ending.published`, one compare-and-set, best effort), so that nothing
    publishes it again -- a republish after the events stream's duplicate window would be stored twice."""


@dataclass(frozen=True)
class RemoveCheckpoint:
    """Purge the checkpoint of a finished run (its record stays)."""


@dataclass(frozen=True)
class Note:
    """A log line (the machine logs nothing itself)."""

    event: str
    level: Literal["info", "warning"] = "info"
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Retry:
    """Give the message back: redelivered later (a ``TransientError``)."""

    reason: str
    #: Another handler drives the run (:class:`LeaseHeld`): giving up on the message fails nothing.
    lost_race: bool = False


@dataclass(frozen=True)
class Reject:
    """The message can never succeed: dead-lettered (a ``PermanentError``)."""

    reason: str


Effect = (
    Publish
    | CreateRun
    | CreateCheckpoint
    | SaveCheckpoint
    | KeepReply
    | ApplyResult
    | AnswerElicitation
    | RecordOutcome
    | ApplyParked
    | QueueMail
    | DeliverMail
    | TakeLease
    | Transition
    | FlagCancel
    | MarkCancel
    | AdoptCancelMarker
    | ArmWatchdog
    | ArmAgentDeadline
    | DisarmWatchdog
    | ArmRetention
    | MarkPublished
    | RemoveCheckpoint
    | Note
    | Retry
    | Reject
)


@dataclass(frozen=True)
class CallProvider:
    """Ask the provider for turn ``turn``; the reply comes back as :class:`ProviderReplied`."""

    turn: int
    messages: list[Message]
    tools: list[ToolSpec]
    budget_s: float
    context: TurnContext
    #: The causation of what the driver publishes for the turn (an external agent's offer): :func:`turn_cause`.
    cause: str | None = None


@dataclass(frozen=True)
class CallTool:
    """Run the :class:`Invoke` at ``index`` of ``turn``; its outcome comes back as :class:`ToolReturned`."""

    turn: TurnInFlight
    index: int


@dataclass(frozen=True)
class RetryTool:
    """Make the call parked on its elicitation again, with the person's answers (:attr:`Elicitation.answers`);
    its outcome comes back as :class:`ToolRetried`."""

    elicitation: Elicitation
    tool: Tool


@dataclass(frozen=True)
class LookForAction:
    """Read the external agent's action for ``turn`` of the parked run from its task's record; the answer comes
    back as :class:`AgentLooked`. ``deadline``: the timer at the compute budget's end asks; ``cause``: the id of
    the event that woke the run (``agent.task.acted``, or the timer's)."""

    turn: int
    deadline: bool = False
    cause: str | None = None


Then = Incoming | CallProvider | CallTool | RetryTool | LookForAction | None


@dataclass(frozen=True)
class Decision:
    effects: tuple[Effect, ...] = ()
    then: Then = None


def _decision(*effects: Effect, then: Then = None) -> Decision:
    return Decision(effects, then)


# --------------------------------------------------------------------------- decide
#: The built-in redaction patterns alone (the default of :func:`decide`; the executor passes its settings').
BUILTIN_REDACTOR = Redactor()


def decide(
    run: RunRecord | None,
    checkpoint: Checkpoint | None,
    agent: Agent | None,
    incoming: Incoming,
    *,
    now: datetime,
    attempt: Attempt | None = None,
    redactor: Redactor = BUILTIN_REDACTOR,
) -> Decision:
    """What ``incoming`` makes the run do next (see the module docstring). ``redactor``: the executor's
    redaction patterns, which every question a person will read passes through (SEC-1), and every tool call's
    arguments, result and error as the journal shows them (``run.tool_called``, ``tool.failed``)."""
    decision = _caused(
        run,
        checkpoint,
        incoming,
        _decide(run, checkpoint, agent, incoming, now=now, attempt=attempt, redactor=redactor),
    )
    if not any(isinstance(e, Publish) and isinstance(e.data, RunToolCalled | ToolFailed) for e in decision.effects):
        return decision
    return replace(decision, effects=tuple(_journaled(e, redactor) for e in decision.effects))


def event_id(run_id: str, event_type: str, *id_parts: str) -> str:
    """The id of the run's event of ``event_type`` and ``id_parts`` (:class:`Publish`): derived, the same whoever
    publishes it, whenever (the driver's envelopes use it)."""
    return derive_id("evt", run_id, event_type, *id_parts)


def _published_id(run: RunRecord, effect: Publish) -> str:
    return event_id(run.run_id, effect.data.EVENT_TYPE, *effect.id_parts)


def turn_cause(run_id: str, ckpt: Checkpoint | None) -> str:
    """The id of the event the run's next turn follows from (:attr:`~.records.Checkpoint.cause`), for checkpoints
    from before it too: ``run.started`` at turn 0 (``run.created`` with no checkpoint yet), else the last turn's
    ``run.checkpointed``."""
    if ckpt is None:
        return event_id(run_id, RunCreated.EVENT_TYPE)
    if ckpt.cause is not None:
        return ckpt.cause
    if ckpt.turn == 0:
        return event_id(run_id, RunStarted.EVENT_TYPE)
    return event_id(run_id, RunCheckpointed.EVENT_TYPE, str(ckpt.turn))


#: The terminal events: their causation is the record's (:class:`~.records.Ending`), set where the end is decided.
_TERMINAL = (RunCompleted, RunFailed, RunCancelled)


def _caused(run: RunRecord | None, ckpt: Checkpoint | None, incoming: Incoming, decision: Decision) -> Decision:
    """Every event of the decision says what caused it (the envelope's ``causationid``), deterministically -- a
    redelivery, a recovery or a replayed turn publishes the same event with the same causation as the first time.

    An event decided without one follows from the message being handled (its event id: a ``human.*`` outcome, an
    ``agent.*`` event, a cancel, a dead-lettered message, ``run.requested``), or, for what the run does on its own
    (a turn, a park, a timer), from the event its current turn follows from (:func:`turn_cause`). An end decided
    without one (:class:`~.records.Ending`) follows from the last event this decision published before it (the
    last event of the turn that ended the run), else from the same default; it is written with the terminal state,
    so the terminal event republished from the record keeps it."""
    if run is None or not any(isinstance(e, Publish | Transition) for e in decision.effects):
        return decision
    message = getattr(incoming, "event_id", "")
    default = message if isinstance(message, str) and message else turn_cause(run.run_id, ckpt)
    effects: list[Effect] = []
    last: Publish | None = None  # (its id derived only when an end needs it)
    ending: str | None = None
    for effect in decision.effects:
        if isinstance(effect, Transition) and isinstance(end := effect.changes.get("ending"), Ending):
            if end.causation is None:
                ending = _published_id(run, last) if last is not None else default
                changes = {**effect.changes, "ending": evolve_shallow(end, causation=ending)}
                effect = replace(effect, changes=changes)
        elif isinstance(effect, Publish):
            if isinstance(effect.data, _TERMINAL):
                if ending is not None and effect.causation is None:
                    effect = replace(effect, causation=ending)
            else:
                if effect.causation is None and not isinstance(effect.data, RunCreated):  # its request's, or none
                    effect = replace(effect, causation=default)
                if effect.run_id is None:
                    last = effect
        effects.append(effect)
    return replace(decision, effects=tuple(effects))


def _journaled(effect: Effect, redactor: Redactor) -> Effect:
    """A tool call's event as it may leave the process: no secret in its arguments, result or error. The model
    still gets the tool's result as it was (it is the run's own conversation, never journaled)."""
    if not isinstance(effect, Publish):
        return effect
    data = effect.data
    if isinstance(data, RunToolCalled):
        arguments = redact_json(data.arguments, redactor)
        preview = redactor.redact(data.result_preview).text[:4096]
        raw = None if data.raw_arguments is None else redactor.redact(data.raw_arguments).text[:RAW_ARGUMENTS_CHARS]
        return replace(effect, data=evolve(data, arguments=arguments, result_preview=preview, raw_arguments=raw))
    if isinstance(data, ToolFailed):
        return replace(effect, data=evolve(data, error=redactor.redact(data.error).text[:4096]))
    return effect


def _decide(
    run: RunRecord | None,
    checkpoint: Checkpoint | None,
    agent: Agent | None,
    incoming: Incoming,
    *,
    now: datetime,
    attempt: Attempt | None,
    redactor: Redactor,
) -> Decision:
    attempt = attempt or Attempt()
    match incoming:
        case Requested():
            return _requested(run, checkpoint, agent, incoming, now, attempt)
        case HumanOutcome():
            return _human_outcome(run, checkpoint, agent, incoming, attempt, now)
        case AgentNews():
            return _agent_news(run, checkpoint, agent, incoming, attempt, now)
        case CancelRequested():
            request = CancelRequest(
                reason=incoming.reason,
                requested_by=incoming.requested_by,
                requested_at=now,
                event_id=incoming.event_id,
            )
            if run is None:
                # its run.requested has not come yet (a supersede can overtake it): a marker the run adopts
                if incoming.marked:
                    fields = {"requested_by": incoming.requested_by, "event_id": incoming.event_id}
                    return _decision(Note("run.cancel.marked", fields=fields))
                return _decision(MarkCancel(request), then=replace(incoming, marked=True))
            return _decision(FlagCancel(request), then=CancelRecorded(incoming.requested_by))
        case CancelRecorded():
            return _cancel_recorded(run, checkpoint, incoming, attempt)
        case Boundary(recovery=recovery):
            return _boundary(run, checkpoint, agent, attempt, now, redactor, recovery=recovery)
        case Parked():
            if run is not None and run.cancel is not None:  # asked to stop while parking: nobody else will
                return _decision(*_cancel(run, run.cancel, _totals(checkpoint)))
            return _decision()
        case ProviderReplied():
            return _provider_replied(run, checkpoint, agent, incoming, now, redactor)
        case ProviderFailed():
            return _provider_failed(run, checkpoint, incoming, attempt)
        case AgentWorking():
            return _agent_working(run, checkpoint, agent, incoming, now, attempt)
        case AgentActed():
            return _agent_acted(run, checkpoint, incoming, now, attempt)
        case AgentLooked():
            return _agent_looked(run, checkpoint, agent, incoming, now, attempt)
        case ToolReturned():
            return _tool_returned(run, checkpoint, agent, incoming, now)
        case ToolRetried():
            return _tool_retried(run, checkpoint, agent, incoming, now)
        case WatchdogFired():
            return _watchdog_fired(run, checkpoint, agent, incoming, now, attempt)
        case RetentionFired():
            return _retention_fired(run, checkpoint)
        case DeadLettered():
            return _dead_lettered(run, checkpoint, incoming)
        case TooLarge():
            return _too_large(run, checkpoint, incoming)


def _requested(
    run: RunRecord | None,
    ckpt: Checkpoint | None,
    agent: Agent | None,
    incoming: Requested,
    now: datetime,
    attempt: Attempt,
) -> Decision:
    if run is None:
        if agent is None:  # no such card: created pending, then failed (below)
            return _decision(CreateRun(new_record(incoming, now)), then=incoming)
        # created running, held by this handler: one record write before run.started (started_record)
        return _decision(CreateRun(started_record(incoming, attempt, now)), then=incoming)
    if run.never_started:  # failed by the dead-letter hook before it was created: stays failed, starts nothing
        fields = {"state": run.state.value}
        return _decision(*_ended(run, ckpt, again=True), Note("run.requested.never_started", fields=fields))
    # run.created follows from the run.requested that created the record (a later copy of the request: the same)
    requested = run.requested_event or incoming.event_id or None
    created = Publish(
        RunCreated(run_id=run.run_id, agent=run.agent, title=run.title, launch=run.launch), causation=requested
    )
    if run.state not in (RunState.PENDING, RunState.RUNNING):  # parked, resuming or finished
        return _decision(
            created,
            *_ended(run, ckpt, again=attempt.redelivered),
            Note("run.requested.duplicate", fields={"state": run.state.value}),
        )
    starting = run.state is RunState.PENDING or ckpt is None  # not started yet (running: see started_record)
    if starting and run.state is RunState.RUNNING and _held_by_other(run, attempt, now):  # its creator starts it
        return _decision(created, _lease_held(run))
    if starting and run.cancel is not None:  # asked to stop before it started
        return _decision(created, *_cancel(run, run.cancel, _totals(ckpt)))
    if starting and not incoming.marker_checked:
        # a cancel may have come first (it left a marker): written after the record, read after it too,
        # so a cancel racing this handler either finds the record or leaves a marker this read sees
        return _decision(AdoptCancelMarker(), then=replace(incoming, marker_checked=True))
    if agent is None:
        return _decision(created, *_unknown_agent(run, ckpt))
    card = agent.card
    started = Publish(
        RunStarted(
            run_id=run.run_id,
            agent=card.id,
            role=card.role,
            title=run.title,
            parent_run_id=run.parent_run_id,
            agent_card=summary(agent, run, _given_prompt(ckpt)),
        ),
        causation=event_id(run.run_id, RunCreated.EVENT_TYPE),
    )
    limit_s = card.limits.max_compute_s
    if _held_by_other(run, attempt, now):  # a redelivery while its driver is mid-turn (issue 6)
        return _decision(created, _lease_held(run))
    if run.state is RunState.PENDING:
        return _decision(
            created,
            # with run.created (one round trip): a firing before the checkpoint exists reads turn 0 too
            ArmWatchdog(0, limit_s, attempt.cause("start")),
            CreateCheckpoint(initial_checkpoint(run, agent, now)),
            TakeLease(_lease(attempt, now)),
            Transition(RunState.RUNNING),
            started,
            then=Boundary(),
        )
    if ckpt is None:  # created running (this handler's, or its driver died before the first checkpoint)
        lease = () if _holds(run, attempt) else (TakeLease(_lease(attempt, now)),)
        return _decision(
            *lease,
            created,
            ArmWatchdog(0, limit_s, attempt.cause("start")),
            started,
            # with all three (one round trip): a firing before the checkpoint exists reads turn 0 too
            CreateCheckpoint(initial_checkpoint(run, agent, now)),
            then=Boundary(),
        )
    # running, nobody holds it, and this is its run.requested again: the driver died mid-turn (AP-8)
    return _decision(
        created,
        TakeLease(_lease(attempt, now)),
        ArmWatchdog(ckpt.turn, limit_s, attempt.cause("recovery")),
        Publish(
            RunResumed(run_id=run.run_id, reason="recovery", from_turn=ckpt.turn),
            attempt.cause("recovery"),
        ),
        Note("run.recovering", "warning", {"from_turn": ckpt.turn}),
        *_checkpointed_again(run, ckpt),
        started,
        then=Boundary(recovery=True),
    )


def _human_outcome(
    run: RunRecord | None,
    ckpt: Checkpoint | None,
    agent: Agent | None,
    incoming: HumanOutcome,
    attempt: Attempt,
    now: datetime,
) -> Decision:
    if run is None:
        return _decision(Reject(f"{incoming.event_type} for unknown run {incoming.run_id}"))
    request_id = incoming.request_id
    if run.state in RUN.terminal:  # it ended meanwhile (cancelled, failed...): journaled, never applied
        ended = _ended(run, ckpt, again=attempt.redelivered)
        if ckpt is not None and (
            request_id in ckpt.applied_requests or any(o.request_id == request_id for o in ckpt.outcomes)
        ):  # applied before the run ended: this is a redelivery of it (its handler died before the ack)
            return _decision(*ended, Note("human.outcome.duplicate", fields={"state": run.state.value}))
        what = {"answer": "the answer to", "expiry": "the expiry of", "rejection": "the rejection of"}[incoming.reason]
        return _decision(
            _after_end(
                run, incoming.event_type, incoming.event_id, request_id, incoming.sender, f"{what} {request_id}"
            ),
            *ended,
        )
    if agent is None:
        return _decision(*_unknown_agent(run, ckpt))
    if ckpt is None:
        return _decision(Retry(f"checkpoint of {run.run_id} not found"))
    if request_id in ckpt.dismissed_requests:  # HUM-7: another question of its turn was answered first
        return _decision(Note("human.outcome.not_needed", fields={"request_id": request_id}))
    if ckpt.more_pending and any(p.request_id == request_id for p in ckpt.parked):
        return _several_outcome(run, ckpt, agent, incoming, attempt, now)
    if run.state is RunState.WAITING_FOR_HUMAN:
        if run.waiting_request_id != request_id:
            return _decision(Note("human.outcome.stale", fields={"waiting_for": run.waiting_request_id}))
        if incoming.fails_run:
            error = _no_answer(run, request_id)
            return _decision(*_fail(run, "human_request_expired", error, totals=_totals(ckpt)))
        if incoming.cancels_run:  # its run.cancel_requested (published first) cancels the waiting run
            return _decision(Note("human.outcome.cancels_run", fields={"request_id": request_id}))
        # a plain answer (not an elicitation's) is applied in the same pass: checkpoint, then the record
        applying = None if ckpt.elicit is not None else ApplyResult(request_id, tool_content(incoming.result))
        return _resume(run, ckpt, agent, incoming, attempt, now, wait_id=request_id, applying=applying)
    if run.state is RunState.RESUMING:
        if ckpt.elicit is not None:
            return _apply(run, _elicitation_outcome(run, ckpt, incoming, now), attempt, now)
        return _apply(run, ApplyResult(request_id, tool_content(incoming.result)), attempt, now)
    if run.state is RunState.RUNNING:
        if ckpt.pending is not None and ckpt.pending.request_id == request_id:
            # the turn that asked is committed, the park is not: applied once the run is parked
            return _decision(Retry("the run has not finished parking on this request yet"))
        if request_id not in ckpt.applied_requests:
            return _decision(Note("human.outcome.stale", fields={"state": run.state.value}))
        return _recover_after_resume(run, ckpt, attempt, now)
    return _decision(Note("human.outcome.ignored", fields={"state": run.state.value}))


def wait_for(ckpt: Checkpoint) -> WaitFor:
    """HUM-7: how the run's wait on several parked ``ask_human`` calls ends (``all`` unless the turn said
    ``first``; checkpoints from before read ``all``)."""
    pending = ckpt.pending
    return "first" if pending is not None and pending.arguments.get("wait_for") == "first" else "all"


def _wait_over(ckpt: Checkpoint) -> bool:
    """Whether the outcomes recorded end the wait: every parked call has one, or (``first``) one is an answer."""
    if wait_for(ckpt) == "first" and any(o.reason == "answer" for o in ckpt.outcomes):
        return True
    have = {o.request_id for o in ckpt.outcomes}
    return all(p.request_id in have for p in ckpt.parked)


def _resume(
    run: RunRecord,
    ckpt: Checkpoint,
    agent: Agent,
    incoming: HumanOutcome,
    attempt: Attempt,
    now: datetime,
    *,
    wait_id: str,
    before: tuple[Effect, ...] = (),
    applying: ApplyResult | None = None,
) -> Decision:
    """The wait is over: ``run.resumed`` (id from ``wait_id``), the watchdog armed, the move to ``resuming``
    with this handler's lease (one compare-and-set: :func:`_apply` then finds it fresh and takes it no
    second time); then decided again, so the outcome is applied (:func:`_apply`).

    ``applying`` (a single ``ask_human``'s outcome): applied to the checkpoint first, then ``resuming``, the
    lease and ``running`` in one compare-and-set of the record, and on to the turn boundary -- one write
    less than the move to ``resuming`` before the checkpoint. A driver that dies between the two writes
    leaves the run waiting on the request with the outcome already in its checkpoint: the redelivery
    resumes it the same way, the outcome's apply a no-op (:func:`apply_result`). Until the record's write,
    the run is not leased and whoever moves the record first wins (another delivery of the answer, an
    expiry, a cancel), exactly as when the move to ``resuming`` came first."""
    resumed = RunResumed(
        run_id=run.run_id,
        reason=incoming.reason,
        from_turn=ckpt.turn,
        request_id=incoming.request_id,
        waited_s=incoming.waited_s,
    )
    if applying is not None:
        return _decision(
            *before,
            Publish(resumed, (wait_id,), causation=incoming.event_id),
            ArmWatchdog(ckpt.turn, agent.card.limits.max_compute_s, attempt.cause("resume")),
            applying,
            Transition(RunState.RESUMING),
            TakeLease(_lease(attempt, now)),
            Transition(RunState.RUNNING, {"waiting_request_id": None, "waiting_since": None}),
            then=Boundary(),
        )
    return _decision(
        *before,
        Publish(resumed, (wait_id,), causation=incoming.event_id),
        ArmWatchdog(ckpt.turn, agent.card.limits.max_compute_s, attempt.cause("resume")),
        Transition(RunState.RESUMING),
        TakeLease(_lease(attempt, now)),  # after the move: a parked run is never leased
        then=incoming,
    )


def _apply(
    run: RunRecord, applying: ApplyResult | ApplyParked | AnswerElicitation, attempt: Attempt, now: datetime
) -> Decision:
    """A resuming run takes its lease, gets its tool result(s) (``applying``) and runs on."""
    if _held_by_other(run, attempt, now):
        return _decision(_lease_held(run))
    # taken with the move to resuming a moment ago (:func:`_resume`): not written again
    lease = () if _lease_fresh(run, attempt, now) else (TakeLease(_lease(attempt, now)),)
    return _decision(
        *lease,
        applying,
        Transition(RunState.RUNNING, {"waiting_request_id": None, "waiting_since": None}),
        then=Boundary(),
    )


def _no_answer(run: RunRecord, request_id: str) -> str:
    """``run.failed``'s error for a question that expired with ``fail``; when the trigger's policy was ``default``,
    the question did not offer its default (:meth:`HumanPolicy.for_question`), and the error says so: otherwise an
    operator sees a failure where the trigger promised a default answer."""
    error = f"no answer to {request_id} in time"
    on_timeout = run.human.on_timeout
    if on_timeout.action == "default":
        error += (
            f" (the trigger's timeout default {on_timeout.default_option!r} is not among this question's options, "
            "so the question failed the run at its deadline instead)"
        )
    return error


def _several_outcome(
    run: RunRecord, ckpt: Checkpoint, agent: Agent, incoming: HumanOutcome, attempt: Attempt, now: datetime
) -> Decision:
    """HUM-7: an outcome for one of the turn's several parked ``ask_human`` calls. Recorded in the checkpoint
    (once) while the run stays parked; the one that ends the wait (:func:`_wait_over`) resumes the run, and
    every call gets its result at once. A timeout policy that fails (or cancels) the run does so whatever
    the other questions' state: human-interaction then cancels those on the run's end."""
    request_id = incoming.request_id
    if run.state is RunState.RUNNING:  # the turn that asked is committed, the park is not
        return _decision(Retry("the run has not finished parking on this request yet"))
    if run.state is RunState.WAITING_FOR_HUMAN:
        if incoming.fails_run:
            error = _no_answer(run, request_id)
            return _decision(*_fail(run, "human_request_expired", error, totals=_totals(ckpt)))
        if incoming.cancels_run:  # its run.cancel_requested (published first) cancels the waiting run
            return _decision(Note("human.outcome.cancels_run", fields={"request_id": request_id}))
        if all(o.request_id != request_id for o in ckpt.outcomes):
            outcome = ParkedOutcome(
                request_id=request_id,
                content=tool_content(incoming.result),
                reason=incoming.reason,
                event_id=incoming.event_id,
            )
            return _decision(RecordOutcome(outcome), then=incoming)  # decided again on what the store holds
        if not _wait_over(ckpt):
            have = {o.request_id for o in ckpt.outcomes}
            still = [p.request_id for p in ckpt.parked if p.request_id not in have]
            return _decision(Note("run.still_waiting", fields={"request_id": request_id, "open": still}))
        # one run.resumed per wait, whichever outcome ended it (the id is the wait's first request)
        wait_id = ckpt.parked[0].request_id
        have = {o.request_id for o in ckpt.outcomes}
        unneeded = [p.request_id for p in ckpt.parked if p.request_id not in have]
        withdraw: tuple[Publish, ...] = ()
        if unneeded:  # wait_for=first: the questions still open are withdrawn, not left answerable until the end
            answered = next((o.request_id for o in ckpt.outcomes if o.reason == "answer"), request_id)
            cancel = HumanCancelRequested(run_id=run.run_id, request_ids=unneeded, answered=answered)
            withdraw = (Publish(cancel, (wait_id, "not_needed"), causation=incoming.event_id),)
        return _resume(run, ckpt, agent, incoming, attempt, now, wait_id=wait_id, before=withdraw)
    if run.state is RunState.RESUMING:
        return _apply(run, ApplyParked(request_id), attempt, now)
    return _decision(Note("human.outcome.ignored", fields={"state": run.state.value}))


def _after_end(
    run: RunRecord, event_type: str, event_id: str, request_id: str | None, sender: str | None, what: str
) -> Publish:
    """``run.input_after_end`` for something that reached the run after it ended (one id per input: a
    redelivery is a deduplicated repeat), so the journal shows it came and was not applied."""
    after = RunInputAfterEnd(
        run_id=run.run_id,
        state=run.state.value,
        input_type=event_type,
        input_id=event_id,
        request_id=request_id,
        sender=sender,
        detail=f"run {run.run_id} is {run.state.value}: {what} was not applied"[:MAX_TEXT],
    )
    return Publish(after, (event_id,), causation=event_id)


def _recover_after_resume(run: RunRecord, ckpt: Checkpoint, attempt: Attempt, now: datetime) -> Decision:
    """The outcome is applied and the run running: if nobody holds it, the driver that resumed with it
    died, and this delivery drives the run on."""
    if _held_by_other(run, attempt, now):
        return _decision(_lease_held(run))
    return _decision(
        Note("run.recovering.after_resume", "warning"),
        TakeLease(_lease(attempt, now)),
        *_checkpointed_again(run, ckpt),
        then=Boundary(recovery=True),
    )


def _checkpointed_again(run: RunRecord, ckpt: Checkpoint) -> tuple[Publish, ...]:
    """A recovery republishes the last committed turn's ``run.checkpointed`` (its id is the turn's: a
    deduplicated repeat when it went out): a driver that died between the turn's compare-and-set and that
    publish would otherwise leave the journal without it (found by ``tests/test_crash_matrix.py``)."""
    if ckpt.turn == 0:
        return ()
    # AP-9: the turn's metrics went out after its commit: the same (same id) again
    metrics = (
        () if ckpt.metrics is None or ckpt.metrics.turn != ckpt.turn else (_metrics(ckpt.metrics, ckpt.turn_cause),)
    )
    return (_checkpointed(run, ckpt), *metrics)


def _metrics(streamed: RunStreamed, cause: str | None = None) -> Publish:
    """AP-9: a turn's ``metrics``, its id from (run, turn, ``metrics``); ``cause``: the turn's (:func:`_caused`)."""
    return Publish(streamed, (str(streamed.turn), "metrics"), causation=cause)


def _checkpointed(run: RunRecord, ckpt: Checkpoint) -> Publish:
    """The committed turn's ``run.checkpointed``, caused by what its turn followed from (kept in the checkpoint, so
    a recovery's republish is the same event)."""
    checkpointed = RunCheckpointed(run_id=run.run_id, checkpoint_id=ckpt.checkpoint_id, turn=ckpt.turn)
    return Publish(checkpointed, (str(ckpt.turn),), causation=ckpt.turn_cause)


def _agent_news(
    run: RunRecord | None,
    ckpt: Checkpoint | None,
    agent: Agent | None,
    incoming: AgentNews,
    attempt: Attempt,
    now: datetime,
) -> Decision:
    """COL-2..COL-4: the end of the run's wait for this request, or a message for its next turn boundary
    (queued whatever the run is doing: running, resuming, parked on a person or on another request)."""
    mail = incoming.mail
    fields = {"kind": mail.kind, "request_id": mail.request_id}
    if incoming.relay:  # a relay run's request is in its input: it is not delivered twice
        return _decision(Note("agent.message.in_relay_input", fields=fields))
    if run is None:
        return _decision(Reject(f"{incoming.event_type} for unknown run {incoming.run_id}"))
    if run.state in RUN.terminal:  # it ended meanwhile: journaled, never applied
        what = {"ask": "the message", "answer": "the answer to"}.get(mail.kind, f"the {mail.kind} notice of")
        what += "" if mail.kind == "ask" else f" {mail.request_id}"
        ended = _ended(run, ckpt, again=attempt.redelivered)
        if ckpt is not None and (mail.key in ckpt.mail_keys or mail.key == ckpt.resumed_by):
            # queued or applied before the run ended: a redelivery of it (its handler died before the ack)
            return _decision(*ended, Note("agent.message.duplicate", fields={**fields, "state": run.state.value}))
        return _decision(
            Note("agent.message.run_finished", "warning", {**fields, "state": run.state.value}),
            _after_end(run, incoming.event_type, incoming.event_id, mail.request_id, mail.sender, what),
            *ended,
        )
    if ckpt is None:
        return _decision(Retry(f"checkpoint of {run.run_id} not found"))
    request_id = mail.request_id
    # the event that ended the wait, again, while the run is still resuming with it: its resumer died after
    # applying it (found by tests/test_crash_matrix.py) -- this delivery finishes the resume below
    resuming_with_it = run.state is RunState.RESUMING and mail.key == ckpt.resumed_by
    if (mail.key in ckpt.mail_keys or mail.key == ckpt.resumed_by) and not resuming_with_it:
        applied_last = ckpt.applied_requests[-1:] == [request_id]
        if run.state is RunState.RUNNING and mail.key == ckpt.resumed_by and applied_last:
            return _recover_after_resume(run, ckpt, attempt, now)
        return _decision(Note("agent.message.duplicate", fields=fields))
    ends_wait = incoming.result is not None and run.waiting_request_id == request_id
    if ends_wait and run.state is RunState.WAITING_FOR_AGENT:
        if agent is None:
            return _decision(*_unknown_agent(run, ckpt))
        resumed = RunResumed(
            run_id=run.run_id,
            reason=incoming.reason,
            from_turn=ckpt.turn,
            request_id=request_id,
            waited_s=incoming.waited_s,
        )
        return _decision(
            Publish(resumed, (request_id,), causation=incoming.event_id),
            ArmWatchdog(ckpt.turn, agent.card.limits.max_compute_s, attempt.cause("resume")),
            Transition(RunState.RESUMING),
            then=incoming,  # decided again once resuming: the result is applied
        )
    if ends_wait and run.state is RunState.RESUMING and incoming.result is not None:
        if _held_by_other(run, attempt, now):
            return _decision(_lease_held(run))
        return _decision(
            TakeLease(_lease(attempt, now)),
            ApplyResult(request_id, incoming.result, key=mail.key),
            Transition(RunState.RUNNING, {"waiting_request_id": None, "waiting_since": None}),
            then=Boundary(),
        )
    pending = ckpt.pending
    if incoming.result is not None and pending is not None and pending.request_id == request_id:
        # the turn that asked is committed, the park is not: applied once the run is parked
        return _decision(Retry("the run has not finished parking on this request yet"))
    # a message: for the next turn boundary (a late answer, an async one, a question to this run...)
    return _decision(QueueMail(mail), Note("agent.message.queued", fields={**fields, "state": run.state.value}))


def _agent_working(
    run: RunRecord | None,
    ckpt: Checkpoint | None,
    agent: Agent | None,
    incoming: AgentWorking,
    now: datetime,
    attempt: Attempt,
) -> Decision:
    """AP-5: the turn is offered and the external agent works on it: the run parks ``waiting_for_agent`` on the
    turn, its timer at the compute budget left (armed first: once parked, the action may wake it at any moment,
    and the wake-up's watchdog must replace this timer, never the other way round)."""
    if run is None or run.state is not RunState.RUNNING:
        run_id = run.run_id if run is not None else "?"
        detail = f"run {run_id} is no longer running; turn {incoming.turn} not parked"
        return _decision(Note("run.moved_on", "warning", {"detail": detail}))
    if run.cancel is not None:
        return _decision(*_cancel(run, run.cancel, _totals(ckpt)))
    if agent is None:
        return _decision(*_unknown_agent(run, ckpt))
    if ckpt is None:
        return _decision(Retry(f"checkpoint of {run.run_id} not found"))
    left_s = max(agent.card.limits.max_compute_s - ckpt.compute_s, 0.0)
    wait_id = turn_wait_id(task_id_for(run.run_id), incoming.turn)
    fields = {"agent_id": incoming.agent_id, "turn": incoming.turn, "wait_id": wait_id, "budget_left_s": left_s}
    return _decision(
        ArmAgentDeadline(ckpt.turn, incoming.turn, now + timedelta(seconds=left_s), attempt.cause("park")),
        # with the park, one compare-and-set: a driver whose lease was taken over meanwhile parks nothing
        TakeLease(_lease(attempt, now), renew=True),
        Transition(RunState.WAITING_FOR_AGENT, {"waiting_request_id": wait_id, "waiting_since": now}),
        Note("run.parked", fields=fields),
        then=Parked(),
    )


def _agent_acted(
    run: RunRecord | None, ckpt: Checkpoint | None, incoming: AgentActed, now: datetime, attempt: Attempt
) -> Decision:
    """A wake-up for the run parked on its external agent (the action, or the deadline): read the action. The
    action of a turn not committed yet, on a running run, is that turn's own driver's (parking on it, or woken
    by it): given back while the driver lives, and if it died, this delivery drives the run on from its last
    checkpoint (the action is read from the record at the turn's provider call)."""
    fields = {"turn": incoming.turn, "deadline": incoming.deadline}
    if run is None:
        return _decision(Note("agent.task.unknown_run", "warning", fields))
    if run.state in RUN.terminal:
        return _decision(
            *_ended(run, ckpt, again=attempt.redelivered or incoming.deadline),
            Note("agent.task.run_finished", fields={**fields, "state": run.state.value}),
        )
    wait_id = turn_wait_id(incoming.task_id, incoming.turn)
    if run.state is RunState.WAITING_FOR_AGENT and run.waiting_request_id == wait_id:
        if run.cancel is not None:
            return _decision(*_cancel(run, run.cancel, _totals(ckpt)))
        return _decision(then=LookForAction(incoming.turn, deadline=incoming.deadline, cause=incoming.event_id or None))
    ours = incoming.task_id == task_id_for(run.run_id)
    if ours and not incoming.deadline and run.state is RunState.RUNNING and ckpt is not None:
        if ckpt.turn == incoming.turn - 1:  # the turn is not committed: whoever drives it has the action
            if _held_by_other(run, attempt, now):
                return _decision(_lease_held(run))
            return _recover_after_resume(run, ckpt, attempt, now)
    return _decision(Note("agent.task.stale", fields={**fields, "state": run.state.value}))


def _agent_looked(
    run: RunRecord | None,
    ckpt: Checkpoint | None,
    agent: Agent | None,
    incoming: AgentLooked,
    now: datetime,
    attempt: Attempt,
) -> Decision:
    """The parked turn's action (or none): wake the run with it as the turn's provider reply, or fail the run
    ``compute_timeout`` when the budget's end came without one (or the action came after it)."""
    if run is None or ckpt is None:
        return _decision(Retry("the run or its checkpoint vanished while parked"))
    wait_id = turn_wait_id(task_id_for(run.run_id), incoming.turn)
    if run.state is not RunState.WAITING_FOR_AGENT or run.waiting_request_id != wait_id:
        return _decision(Note("agent.task.stale", fields={"turn": incoming.turn, "state": run.state.value}))
    if run.cancel is not None:  # asked to stop while parked: cancelled, as asked
        return _decision(*_cancel(run, run.cancel, _totals(ckpt)))
    if agent is None:
        return _decision(*_unknown_agent(run, ckpt))
    limits = agent.card.limits
    left_s = max(limits.max_compute_s - ckpt.compute_s, 0.0)
    outcome = incoming.outcome
    late = isinstance(outcome, ProviderReplied) and outcome.elapsed_s > left_s
    if outcome is None or late:
        if outcome is None and not incoming.deadline:  # woken early (a stale firing): still parked
            return _decision(Note("agent.task.no_action_yet", fields={"turn": incoming.turn}))
        agent_id = agent.card.provider.agent_id
        error = (
            f"external agent {agent_id} did not act on turn {incoming.turn} within the run's compute budget "
            f"({left_s:g}s of {limits.max_compute_s:g}s left when the turn was offered)"
        )
        return _decision(*_fail(run, "compute_timeout", error, totals=_totals(ckpt)))
    assert outcome is not None
    fields = {"turn": incoming.turn, "deadline": incoming.deadline, "failed": isinstance(outcome, ProviderFailed)}
    waited_s = (now - run.waiting_since).total_seconds() if run.waiting_since is not None else None
    resumed = RunResumed(
        run_id=run.run_id,
        reason="agent_action",
        from_turn=ckpt.turn,
        request_id=wait_id,
        waited_s=max(waited_s, 0.0) if waited_s is not None else None,
    )
    return _decision(
        # one compare-and-set: the wait ended once (a second wake-up finds it moved on), driven by this handler
        Transition(RunState.RESUMING, waiting_on=wait_id),
        TakeLease(_lease(attempt, now)),
        Transition(RunState.RUNNING, {"waiting_request_id": None, "waiting_since": None}),
        # after the move: a wake-up that lost it must not replace the winner's timer, nor say the run resumed (one
        # run.resumed per wait, its id the wait's; lost with a crash right here, the recovery's run.resumed follows)
        ArmWatchdog(ckpt.turn, limits.max_compute_s, attempt.cause("agent-acted")),
        Publish(resumed, ("agent_action", wait_id), causation=incoming.cause),
        Note("run.agent_acted", fields=fields),
        then=outcome,
    )


def _cancel_recorded(
    run: RunRecord | None, ckpt: Checkpoint | None, incoming: CancelRecorded, attempt: Attempt
) -> Decision:
    """RUN-2: a run nobody is driving (pending, parked) is cancelled at once; a driven one by its driver at
    the next turn boundary; a finished one ignores it."""
    if run is None:
        return _decision()
    if run.state in RUN.terminal or run.cancel is None:
        fields = {"state": run.state.value, "requested_by": incoming.requested_by}
        return _decision(*_ended(run, ckpt, again=attempt.redelivered), Note("run.cancel.ignored", fields=fields))
    if run.state in (RunState.PENDING, RunState.WAITING_FOR_HUMAN, RunState.WAITING_FOR_AGENT):
        return _decision(*_cancel(run, run.cancel, _totals(ckpt)))
    fields = {"state": run.state.value, "requested_by": incoming.requested_by}
    return _decision(Note("run.cancel.deferred", fields=fields))


def _boundary(
    run: RunRecord | None,
    ckpt: Checkpoint | None,
    agent: Agent | None,
    attempt: Attempt,
    now: datetime,
    redactor: Redactor,
    *,
    recovery: bool = False,
) -> Decision:
    """A turn boundary: whatever was asked for meanwhile applies now, then park, fail a limit, or start a turn.

    Agent messages queued meanwhile (COL-4) are framed into the conversation here, as user messages,
    before the limits are checked and the next provider call is made; a run about to park keeps them
    queued until it resumes, and a run of an external agent recovering from its driver's death keeps them
    for the boundary after the turn it calls again (:class:`Boundary`). Starting a turn renews the handler's lease.
    """
    if run is None or run.state is not RunState.RUNNING:
        return _decision()
    replay = _replay(run, ckpt, agent)
    if replay is not None and agent is not None and ckpt is not None and not _held_by_other(run, attempt, now):
        # its driver died mid-turn after keeping the reply: the turn is finished from it (its calls made again, the
        # same ids) before anything else -- a cancel or a limit applies at the boundary after it, as for a live turn
        renew = () if _lease_fresh(run, attempt, now) else (TakeLease(_lease(attempt, now), renew=True),)
        fields = {"turn": replay.turn, "calls": len(replay.reply.tool_calls)}
        limit_s = agent.card.limits.max_compute_s
        return _decision(
            *renew,
            ArmWatchdog(ckpt.turn, limit_s, attempt.cause("turn")),
            Note("run.turn.replayed", "warning", fields),
            then=replay,
        )
    if run.cancel is not None:
        return _decision(*_cancel(run, run.cancel, _totals(ckpt)))
    if agent is None:
        return _decision(*_unknown_agent(run, ckpt))
    if ckpt is None:
        return _decision(Retry(f"checkpoint of {run.run_id} not found"))
    if ckpt.pending is not None:
        return _park(run, ckpt, agent, redactor, attempt, now)
    if _held_by_other(run, attempt, now):  # our lease expired mid-turn and another handler took over
        return _decision(Note("run.lease.lost", "warning", {"holder": run.lease.holder if run.lease else None}))
    if ckpt.elicit is not None:  # the person answered the call's elicitation: make the call again
        return _retry(run, ckpt, agent, attempt, now)
    child = handed_off_to(ckpt)
    if child is not None:  # a crash after the handoff's turn was committed: the run still ends, handed off
        return _decision(*_complete(run, _handed_off_result(child), _totals(ckpt)))
    if ckpt.inbox and not (recovery and agent.card.provider.kind == "external"):
        return _decision(DeliverMail(), then=Boundary())
    limits = agent.card.limits
    max_turns = _max_turns(run, agent)
    if ckpt.turn + ckpt.usage.samplings >= max_turns:  # MCP samplings are model calls of the run (.sampling)
        used = f" ({ckpt.turn} turns, {ckpt.usage.samplings} MCP samplings)" if ckpt.usage.samplings else ""
        error = f"the agent used all {max_turns} turns{used}"
        return _decision(*_fail(run, "max_turns", error, totals=_totals(ckpt)))
    if ckpt.compute_s >= limits.max_compute_s:
        error = f"{ckpt.compute_s:.1f}s of compute used; the budget is {limits.max_compute_s:.1f}s"
        return _decision(*_fail(run, "compute_timeout", error, totals=_totals(ckpt)))
    if limits.max_tokens is not None and ckpt.usage.total_tokens >= limits.max_tokens:
        return _decision(*_fail(run, "token_limit", _token_text(ckpt.usage, limits.max_tokens), totals=_totals(ckpt)))
    turn = ckpt.turn + 1
    call = CallProvider(
        turn=turn,
        messages=ckpt.messages,
        tools=[tool.spec for tool in offered_tools(run, agent)],
        budget_s=limits.max_compute_s - ckpt.compute_s,
        context=TurnContext(
            run_id=run.run_id,
            agent=agent.card.id,
            title=run.title,
            people=run.human.allowed_recipients,
            turn=turn,
            mail=[m.model_dump(mode="json") for m in ckpt.mail],
            asks=[r.request_id for r in ckpt.received if not r.answered],
            relay=run.relay is not None,
        ),
        cause=turn_cause(run.run_id, ckpt),
    )
    # the lease is renewed unless this handler took or renewed it a moment ago (most of it left): a turn
    # right after the resume or the start does not write the record again
    renew = () if _lease_fresh(run, attempt, now) else (TakeLease(_lease(attempt, now), renew=True),)
    return _decision(*renew, ArmWatchdog(ckpt.turn, limits.max_compute_s, attempt.cause("turn")), then=call)


def _park(
    run: RunRecord, ckpt: Checkpoint, agent: Agent, redactor: Redactor, attempt: Attempt, now: datetime
) -> Decision:
    """Ask, then wait at zero cost: ``human.requested`` (or ``agent.asked``), the watchdog off,
    ``waiting_for_human`` (or ``waiting_for_agent``) (RUN-3, COL-2). Several ``ask_human`` calls of one turn
    (HUM-7): one ``human.requested`` each, one park; the record names the first request.

    The move renews the parking handler's lease in the same compare-and-set, as an external agent's park does
    (:func:`_agent_working`): a driver whose lease another handler took over meanwhile (it hung past the lease
    mid-turn) parks nothing (:class:`LeaseLost`); the new holder drives the run."""
    pending = ckpt.pending
    assert pending is not None
    waiting = {"waiting_request_id": pending.request_id, "waiting_since": pending.asked_at}
    guard = TakeLease(_lease(attempt, now), renew=True)
    if pending.kind == "agent":
        asked = AgentAsked.model_validate(pending.arguments)
        return _decision(
            Publish(asked, (pending.request_id,)),
            DisarmWatchdog(),
            guard,
            Transition(RunState.WAITING_FOR_AGENT, waiting),
            Note("run.parked", fields={"request_id": pending.request_id, "to": asked.to}),
            then=Parked(),
        )
    if pending.kind == "elicit":
        return _decision(
            Publish(_elicit_requested(run, pending, agent, redactor), (pending.request_id,)),
            DisarmWatchdog(),
            guard,
            Transition(RunState.WAITING_FOR_HUMAN, waiting),
            Note("run.parked", fields={"request_id": pending.request_id, "elicitation": pending.arguments["tool"]}),
            then=Parked(),
        )
    args = AskHumanArgs.model_validate(pending.arguments)
    fields: dict[str, Any] = {"request_id": pending.request_id, "recipient": args.recipient}
    if ckpt.more_pending:
        fields |= {"more": [p.request_id for p in ckpt.more_pending], "wait_for": wait_for(ckpt)}
    return _decision(
        *(Publish(_human_requested(run, p, agent, redactor), (p.request_id,)) for p in ckpt.parked),
        # before the move: once it waits, an answer may resume (and re-arm) it at any moment
        DisarmWatchdog(),
        guard,
        Transition(RunState.WAITING_FOR_HUMAN, waiting),
        Note("run.parked", fields=fields),
        then=Parked(),
    )


def _human_requested(run: RunRecord, pending: PendingAsk, agent: Agent, redactor: Redactor) -> HumanRequested:
    args = AskHumanArgs.model_validate(pending.arguments)
    policy = run.human.for_question(args.options)
    timeout = min(args.timeout or policy.default_timeout_s, policy.max_timeout_s)
    requested = HumanRequested(
        request_id=pending.request_id,
        run_id=run.run_id,
        agent=run.agent,
        agent_display_name=agent.card.display_name,  # the card's, as the run is asking now (None: its id)
        title=run.title,
        recipient=args.recipient,
        question=args.question,
        context=args.context,
        reason=args.reason,  # OBS-1: why the agent asks, for the journal's analytics
        reason_kind=args.reason_kind,
        options=args.options,
        timeout_s=timeout,
        expires_at=pending.asked_at + timedelta(seconds=timeout),
        policy=policy,
        turn=pending.turn,
        source_link=run.event.source_link if run.event else None,  # the platform's, never the model's (HUM-5)
    )
    return redactor.human_requested(requested)  # SEC-1: no secret on the bus or in the journal


def _provider_failed(
    run: RunRecord | None, ckpt: Checkpoint | None, incoming: ProviderFailed, attempt: Attempt
) -> Decision:
    if run is None or ckpt is None:
        return _decision(Retry(incoming.error))
    if run.state is RunState.RUNNING and run.cancel is not None:  # asked to stop (it ended an external wait)
        return _decision(*_cancel(run, run.cancel, _totals(ckpt)))
    if incoming.budget_spent:  # the budget, not the provider, gave out: the limit the card set
        return _decision(*_fail(run, "compute_timeout", incoming.error, totals=_totals(ckpt)))
    if incoming.permanent or attempt.last:
        return _decision(*_fail(run, "provider_error", incoming.error, totals=_totals(ckpt)))
    return _decision(Retry(incoming.error))


def _provider_replied(
    run: RunRecord | None,
    ckpt: Checkpoint | None,
    agent: Agent | None,
    incoming: ProviderReplied,
    now: datetime,
    redactor: Redactor = BUILTIN_REDACTOR,
) -> Decision:
    bounded = bounded_reply(incoming.reply)  # what the run keeps of it must fit on the bus (.bounds)
    if bounded is not incoming.reply:
        incoming = replace(incoming, reply=bounded)
    if incoming.raw:
        return _keep(run, agent, incoming)
    if run is not None and run.reply is not None and run.reply.turn == incoming.turn and not incoming.replayed:
        # a reply of this turn is kept already (another driver's, a moment ago): that one is the turn's
        incoming = replace(_kept_replied(run.reply), replayed=False)
    if run is None or run.state is not RunState.RUNNING:
        # the turn took so long that the run moved on meanwhile (the watchdog failed it): drop it
        run_id = run.run_id if run is not None else "?"
        detail = f"run {run_id} is no longer running; turn {incoming.turn} dropped"
        return _decision(Note("run.moved_on", "warning", {"detail": detail}))
    if agent is None:
        return _decision(*_unknown_agent(run, ckpt))
    if ckpt is None:
        return _decision(Retry(f"checkpoint of {run.run_id} not found"))
    reply = incoming.reply
    usage = ckpt.usage + (reply.usage or Usage())
    request_id = turn_request(run, reply.tool_calls)
    # AP-9: a hosted run's turn reports its metrics itself (an external agent streams its own)
    streamed: RunStreamed | None = None
    metrics: tuple[Publish, ...] = ()
    if agent.card.provider.kind != "external":
        streamed = turn_metrics(run, incoming.turn, reply.usage, incoming.elapsed_s, reply.tool_calls, request_id)
        metrics = (_metrics(streamed),)
    max_tokens = agent.card.limits.max_tokens
    if max_tokens is not None and usage.total_tokens > max_tokens:
        totals = _totals(ckpt, turns=incoming.turn, calls=len(reply.tool_calls), usage=usage)
        return _decision(*metrics, *_fail(run, "token_limit", _token_text(usage, max_tokens), totals=totals))
    if not reply.tool_calls:
        totals = _totals(ckpt, turns=incoming.turn, usage=usage)
        if reply.finish_reason == "length":  # a cut-off final reply is not the agent's answer
            return _decision(*metrics, *_fail(run, OUTPUT_TRUNCATED, _truncated_text(agent, reply), totals=totals))
        return _decision(*metrics, *_complete(run, reply.content or "", totals, agent.result_bytes))
    plans = _plan_calls(run, ckpt, agent, incoming.turn, now, reply, (request_id, redactor))
    turn = TurnInFlight(number=incoming.turn, reply=reply, usage=usage, plans=plans, metrics=streamed)
    return _calls_from(run, ckpt, agent, turn, 0, (), incoming.elapsed_s, now)


#: The ``run.failed`` reason of a run whose final reply was cut off at the output length limit. Executors before it
#: failed such a run ``provider_error``, its ``error`` starting ``output_truncated:``; the error now says what was cut
#: off without the prefix (the journal shows a failed run's error as ``<reason>: <error>``, so it still reads
#: ``output_truncated: the final reply ...`` there).
OUTPUT_TRUNCATED: RunFailureReason = "output_truncated"


def _truncated_text(agent: Agent, reply: AssistantTurn) -> str:
    """Why a final reply that ended on the length limit (``finish_reason: length``) fails the run."""
    provider = agent.card.provider
    model = f" of model {provider.model}" if provider.model else ""
    tokens = f" after {reply.usage.completion_tokens} completion tokens" if reply.usage is not None else ""
    return (
        f"the final reply{model} was cut off at the endpoint's output length limit "
        f"(finish_reason 'length'{tokens}), so its partial text is not taken as the result. Raise the model's "
        "output limit (max_tokens) at the endpoint, or ask for a shorter answer in the card's system prompt"
    )


def _keep(run: RunRecord | None, agent: Agent | None, incoming: ProviderReplied) -> Decision:
    """A reply straight from the provider (issue 6, AP-8): kept on the run record before the turn goes on when one of
    its calls may have an effect outside the run before the turn's checkpoint (:func:`_effects_before_commit`), so
    a driver that dies mid-turn leaves the same reply -- the same calls, arguments and ids -- to the one that takes
    over (:func:`_boundary`). That compare-and-set is the record's read after the provider call (the run as it is
    now: failed by the watchdog meanwhile, say); with nothing to keep, the driver reads it. An external agent's
    action is stored by agent-collab already (:mod:`.external`): nothing to keep."""
    fresh = ProviderReplied(incoming.turn, incoming.reply, incoming.elapsed_s)  # (not replace(): a hot path)
    if run is None or agent is None or agent.card.provider.kind == "external":
        return _decision(then=fresh)
    if not _effects_before_commit(agent, incoming.reply):
        return _decision(then=fresh)
    return _decision(KeepReply(kept_reply(incoming)), then=fresh)


def _effects_before_commit(agent: Agent, reply: AssistantTurn) -> bool:
    """Whether a call of ``reply`` may have an effect outside the run before the turn's checkpoint: anything but
    ``ask_human``, a waiting ``ask_agent`` (both asked only once the turn is committed) and a pure tool
    (:attr:`~.tools.Tool.pure`: it only reads)."""
    for call in reply.tool_calls:
        if call.name == ASK_HUMAN or (call.name == ASK_AGENT and call.arguments.get("mode") == "wait"):
            continue
        tool = agent.tools.get(call.name)
        if tool is not None and tool.pure:
            continue
        return True
    return False


def kept_reply(replied: ProviderReplied) -> KeptReply:
    """What the run record keeps of a provider reply (:class:`KeepReply`)."""
    reply = replied.reply
    return KeptReply(
        turn=replied.turn,
        content=reply.content,
        tool_calls=reply.tool_calls,
        usage=reply.usage,
        finish_reason=reply.finish_reason,
        stop_sequence=reply.stop_sequence,
        elapsed_s=replied.elapsed_s,
    )


def _kept_replied(reply: KeptReply) -> ProviderReplied:
    """The kept reply as the turn's provider reply, carried out again (:attr:`ProviderReplied.replayed`)."""
    turn = AssistantTurn(
        content=reply.content,
        tool_calls=reply.tool_calls,
        usage=reply.usage,
        finish_reason=reply.finish_reason,
        stop_sequence=reply.stop_sequence,
    )
    return ProviderReplied(turn=reply.turn, reply=turn, elapsed_s=reply.elapsed_s, replayed=True)


def _replay(run: RunRecord, ckpt: Checkpoint | None, agent: Agent | None) -> ProviderReplied | None:
    """The turn in flight when its driver died, its reply kept on the record (:func:`_keep`): carried out from that
    reply, not asked of the model again. ``None``: no such turn (the checkpoint has moved past it, or is parked or
    retrying an elicitation: then no reply of the next turn can have been kept)."""
    reply = run.reply
    if reply is None or ckpt is None or agent is None or reply.turn != ckpt.turn + 1:
        return None
    if ckpt.pending is not None or ckpt.elicit is not None or agent.card.provider.kind == "external":
        return None
    return _kept_replied(reply)


def _plan_calls(
    run: RunRecord,
    ckpt: Checkpoint,
    agent: Agent,
    turn: int,
    now: datetime,
    reply: AssistantTurn,
    streaming: tuple[str, Redactor] = ("", BUILTIN_REDACTOR),
) -> tuple[ToolPlan, ...]:
    """Each call's plan. ``streaming``: the turn's request id and the redaction patterns (``report_progress``)."""
    plans: list[ToolPlan] = []
    waiting: Literal["human", "agent"] | None = None
    handed = False
    answered: set[str] = set()
    policy = _ask_policy(run, reply.tool_calls)
    cap, people = agent.card.limits.max_human_calls_per_reply, 0
    for index, call in enumerate(reply.tool_calls):
        people += call.name in (ASK_HUMAN, NOTIFY)
        if reply.finish_reason == "length":  # cut off mid-call: its arguments may be partial -- never run it
            where = {"turn": turn, "call_id": call.id, "tool": call.name, "why": "output_truncated"}
            text = (
                "your reply was cut off at the output length limit (finish_reason 'length') while you were making "
                "the calls; none of them was made. Make them again with shorter arguments, or fewer at once"
            )
            plan: ToolPlan = Refuse(
                tool_error(text), malformed=True, note=Note("run.tool_call.malformed", "warning", where)
            )
        elif call.name in (ASK_HUMAN, NOTIFY) and people > cap:  # one reply does not flood people
            where = {"turn": turn, "call_id": call.id, "tool": call.name, "cap": cap}
            text = (
                f"one reply may make at most {cap} ask_human and notify calls (limits.max_human_calls_per_reply); "
                f"this one (number {people} in the reply) was not made. Make it in a later turn if it is still needed"
            )
            plan = Refuse(tool_error(text), note=Note("run.tool_call.over_human_cap", "warning", where))
        elif call.name == HANDOFF_TO_AGENT and (waiting or handed):
            why = "one handoff per turn, never together with a waiting call (ask_human, ask_agent mode=wait)"
            plan = Refuse(tool_error(why))
        elif handed and call.name in (ASK_HUMAN, ASK_AGENT) and call.arguments.get("mode") != "async":
            plan = Refuse(tool_error("this run has handed its task off in this turn: it cannot wait for anything"))
        else:
            plan = _plan_call(run, ckpt, agent, turn, index, call, waiting, policy, answered, now, streaming)
        if isinstance(plan, Ask) and waiting is None:
            waiting = "agent" if plan.pending.kind == "agent" else "human"
        handed = handed or (isinstance(plan, Emit) and plan.handoff is not None)
        if isinstance(plan, Emit) and plan.answers is not None:
            answered.add(plan.answers)
        plans.append(plan)
    return tuple(plans)


def _ask_policy(run: RunRecord, calls: list[ToolCall]) -> WaitFor | str:
    """HUM-7: the continuation policy of the turn's ``ask_human`` calls -- the ``wait_for`` they state (they
    must agree; none stated: ``all``) -- or, as text, why none of them is asked."""
    asks = [call for call in calls if call.name == ASK_HUMAN]
    stated = sorted({str(c.arguments.get("wait_for")) for c in asks if c.arguments.get("wait_for") in ("all", "first")})
    if len(stated) > 1:
        return (
            "the ask_human calls of one reply must agree on wait_for (this one has 'all' and 'first'); "
            "none of them was asked: ask again with one value"
        )
    policy: WaitFor = "first" if stated == ["first"] else "all"
    if policy == "first" and len(asks) > 1 and run.human.on_timeout.action == "cancel":
        return (
            "wait_for='first' is not available to this run: its timeout policy cancels the whole run when a "
            "question expires, and a question that is not needed any more would still expire; none of them was "
            "asked: use wait_for='all', or ask one question at a time"
        )
    return policy


def _plan_call(
    run: RunRecord,
    ckpt: Checkpoint,
    agent: Agent,
    turn: int,
    index: int,
    call: ToolCall,
    waiting: Literal["human", "agent"] | None,
    policy: WaitFor | str,
    answered: set[str],
    now: datetime,
    streaming: tuple[str, Redactor] = ("", BUILTIN_REDACTOR),
) -> ToolPlan:
    """One tool call, checked before anything runs: the card's policy, JSON arguments, the tool's schema.
    ``ask_human`` calls park the run together (HUM-7: each its own request, ``policy`` the turn's
    ``wait_for``, or why they are all refused); a waiting ``ask_agent`` parks it alone (one kind of
    waiting call per turn); ``ask_agent`` and ``answer_agent`` are decided here; anything else is invoked
    by the driver."""
    where = {"turn": turn, "call_id": call.id, "tool": call.name}
    card = agent.card
    if call.refused is not None:  # its name or arguments were too long to keep (.bounds)
        note = Note("run.tool_call.malformed", "warning", {**where, "why": "too_long"})
        return Refuse(tool_error(call.refused), malformed=True, note=note)
    if not call.name:
        offered = ", ".join(t.name for t in offered_tools(run, agent)) or "none"
        note = Note("run.tool_call.malformed", "warning", {**where, "why": "no_name"})
        text = f"a tool call must name its tool (function.name was missing); your tools: {offered}"
        return Refuse(tool_error(text), malformed=True, note=note)
    try:
        tool = agent.tools.resolve(call.name, card.tools, card.id)
        if tool.name in _hidden(run):
            offered = ", ".join(t.name for t in offered_tools(run, agent)) or "none"
            raise ToolError(f"tool {call.name!r} is not allowed for this run of agent {card.id}; its tools: {offered}")
    except ToolError as refused:
        note = Note("run.tool_call.malformed", "warning", {**where, "why": "not_allowed"})
        return Refuse(tool_error(str(refused)), malformed=True, note=note)
    if call.invalid_arguments is not None:
        text = (
            f"the arguments of {call.name!r} are not a JSON object: "
            f"{call.invalid_arguments[:200]!r}; call it again with valid JSON arguments"
        )
        note = Note("run.tool_call.malformed", "warning", {**where, "why": "arguments"})
        return Refuse(tool_error(text), malformed=True, note=note)
    problem = tool.argument_problem(call.arguments)
    if problem is not None:
        return Refuse(tool_error(problem), note=Note("run.tool_call.invalid_arguments", fields=where))
    if tool.name == ASK_AGENT:
        return _plan_ask_agent(run, turn, index, call, waiting is not None, now)
    if tool.name == ANSWER_AGENT:
        return _plan_answer_agent(run, ckpt, turn, index, call, answered)
    if tool.name == HANDOFF_TO_AGENT:
        return _plan_handoff(run, agent, turn, index, call)
    if tool.name == REPORT_PROGRESS:  # AP-9: decided here, published before the turn's checkpoint
        reported = report(run, turn, call, streaming[0] or run.run_id, streaming[1])
        if isinstance(reported, str):
            return Refuse(tool_error(reported))
        return Emit(reported.content, Publish(reported.event, (str(turn), str(index))), shown=reported.arguments)
    if tool.name != ASK_HUMAN:
        return Invoke(tool)
    if waiting == "agent":
        return Refuse(
            tool_error(
                "one kind of waiting call per turn: ask_human cannot share a turn with a waiting ask_agent; "
                "ask again after its answer"
            )
        )
    if policy not in ("all", "first"):
        return Refuse(tool_error(policy))
    try:
        args = AskHumanArgs.model_validate(call.arguments)
    except ValidationError as exc:
        return Refuse(tool_error(f"invalid ask_human arguments: {exc}"))
    pending = PendingAsk(
        request_id=derive_id("hr", run.run_id, str(turn), str(index)),
        call_id=call.id,
        turn=turn,
        asked_at=now,
        # OBS-1's reason fields only when given: an ask without them checkpoints as before they existed
        arguments={**args.model_dump(mode="json", exclude=_unset_reason(args)), "wait_for": policy},
    )
    return Ask(pending)


def _unset_reason(args: AskHumanArgs) -> set[str]:
    return {name for name in ("reason", "reason_kind") if getattr(args, name) is None}


def ask_request_id(run_id: str, turn: int, index: int) -> str:
    """COL-5: ``"req-" + hash(operation id)``, the operation being call ``index`` of ``turn`` of the run --
    the same on every replay of the turn, new for every other call."""
    return derive_id("req", run_id, ASK_AGENT, str(turn), str(index))


def _plan_ask_agent(run: RunRecord, turn: int, index: int, call: ToolCall, asked: bool, now: datetime) -> ToolPlan:
    try:
        args = AskAgentArgs.model_validate(call.arguments)
    except ValidationError as exc:
        return Refuse(tool_error(f"invalid ask_agent arguments: {exc}"))
    if args.mode == "wait" and asked:
        return Refuse(tool_error("one waiting call (ask_human or ask_agent mode=wait) per turn: wait for the first"))
    request_id = ask_request_id(run.run_id, turn, index)
    timeout_s = max(1, min(args.timeout, ASK_TIMEOUT_MAX_S))
    asked_event = AgentAsked(
        request_id=request_id,
        asker_run_id=run.run_id,
        asker_agent=run.agent,
        to=args.to,
        mode=args.mode,
        timeout_s=timeout_s,
        message=args.message[:MAX_TEXT],
        truncated=len(args.message) > MAX_TEXT,
        turn=turn,
    )
    if args.mode == "wait":
        pending = PendingAsk(
            kind="agent",
            request_id=request_id,
            call_id=call.id,
            turn=turn,
            asked_at=now,
            arguments=asked_event.model_dump(mode="json"),
        )
        return Ask(pending)
    content = {
        "status": "sent",
        "request_id": request_id,
        "to": args.to,
        "mode": "async",
        "note": "the answer arrives later as a message with this request id",
        "truncated": asked_event.truncated,
    }
    return Emit(json.dumps(content, sort_keys=True), Publish(asked_event, (request_id,)))


def _plan_answer_agent(
    run: RunRecord, ckpt: Checkpoint, turn: int, index: int, call: ToolCall, answered: set[str]
) -> ToolPlan:
    """COL-3: only a request this run received, once; the reply is ``agent.replied`` (PRO-1: a refusal too)."""
    try:
        args = AnswerAgentArgs.model_validate(call.arguments)
    except ValidationError as exc:
        return Refuse(tool_error(f"invalid answer_agent arguments: {exc}"))
    received = next((r for r in ckpt.received if r.request_id == args.request_id), None)
    if received is None:
        open_ids = ", ".join(r.request_id for r in ckpt.received if not r.answered) or "none"
        return Refuse(
            tool_error(f"this run received no request {args.request_id!r}; requests you may answer: {open_ids}")
        )
    if received.answered or args.request_id in answered:
        return Refuse(tool_error(f"request {args.request_id} is already answered: a request is answered once"))
    outcome: Literal["answer", "refusal"] = "refusal" if args.refuse else "answer"
    replied = AgentReplied(
        request_id=args.request_id,
        replier_run_id=run.run_id,
        replier_agent=run.agent,
        outcome=outcome,
        answer=args.answer[:MAX_TEXT],
        truncated=len(args.answer) > MAX_TEXT,
        turn=turn,
    )
    content = {
        "status": "sent",
        "request_id": args.request_id,
        "outcome": outcome,
        "to": f"agent:{received.asker_agent}",
        "note": "a message tells you if it could not be delivered (e.g. the asker has finished)",
    }
    return Emit(json.dumps(content, sort_keys=True), Publish(replied, (str(turn), str(index))), args.request_id)


def _handed_off_result(child_run_id: str) -> str:
    """The result of a run that handed its task off (``run.completed.result``)."""
    return json.dumps({"status": "handed_off", "child_run_id": child_run_id}, sort_keys=True)


def handed_off_to(ckpt: Checkpoint) -> str | None:
    """The child run when the last committed turn handed the run's task off (AP-6), else ``None``."""
    last = next((m for m in reversed(ckpt.messages) if m.role == "assistant"), None)
    if last is None:
        return None
    calls = {call.id for call in last.tool_calls if call.name == HANDOFF_TO_AGENT}
    if not calls:  # (most turns: no handoff, nothing to look for in the conversation)
        return None
    for message in ckpt.messages:
        if message.role == "tool" and message.tool_call_id in calls:
            try:
                content = json.loads(message.content or "null")
            except ValueError:
                continue
            if isinstance(content, dict) and content.get("status") == "handed_off":
                return str(content["child_run_id"])
    return None


#: A handoff chain longer than this is refused (each child's ``launch.depth`` is one more than its parent's).
MAX_HANDOFF_DEPTH = 8


def _plan_handoff(run: RunRecord, agent: Agent, turn: int, index: int, call: ToolCall) -> ToolPlan:
    """AP-6: hand the run's task to another agent card (hosted, or external: the child is then offered to its
    agent). ``agent.handed_off`` decides it; the child's ``run.requested``
    (same saga, parent this run, the document as its input, this run's human policy -- never wider) follows;
    the run completes when the turn commits."""
    try:
        args = HandoffArgs.model_validate(call.arguments)
    except ValidationError as exc:
        return Refuse(tool_error(f"invalid handoff_to_agent arguments: {exc}"))
    if args.agent not in agent.hosted:
        known = ", ".join(sorted(agent.hosted)) or "none"
        return Refuse(tool_error(f"no agent {args.agent!r} to hand off to; the agents you may hand off to: {known}"))
    if run.launch.depth >= MAX_HANDOFF_DEPTH:
        return Refuse(tool_error(f"this task was handed on {run.launch.depth} times already: finish it here"))
    # from the call's place in the run (turn, index), never the model's own call id: the same child on every replay
    # of the turn. Spelled as an external agent's call id, which agent-collab tells the agent its child from.
    handoff_id, child_run_id = handoff_ids(run.run_id, external_call_id(turn, index))
    document = HandoffDocument(**args.model_dump(exclude={"agent"}))
    handed = AgentHandedOff(
        handoff_id=handoff_id,
        parent_run_id=run.run_id,
        parent_agent=run.agent,
        child_run_id=child_run_id,
        agent=args.agent,
        document=document,
        turn=turn,
        call_id=call.id,
    )
    child = RunRequested(
        run_id=child_run_id,
        agent=args.agent,
        title=f"Handoff from {run.agent}: {' '.join(args.objective.split())}"[:200],
        launch=LaunchSource(kind="event", depth=run.launch.depth + 1),
        input={
            "handoff": {
                "handoff_id": handoff_id,
                "from_agent": run.agent,
                "from_run_id": run.run_id,
                **document.model_dump(mode="json"),
            }
        },
        human=run.human,
        parent_run_id=run.run_id,
    )
    content = {
        "status": "handed_off",
        "handoff_id": handoff_id,
        "child_run_id": child_run_id,
        "agent": args.agent,
        "note": "the task is now with that agent's run; this run ends after this turn",
    }
    return Emit(
        json.dumps(content, sort_keys=True),
        Publish(handed, (handoff_id,)),
        also=(
            Publish(
                child, (handoff_id,), causation=event_id(run.run_id, handed.EVENT_TYPE, handoff_id), run_id=child_run_id
            ),
        ),
        handoff=child_run_id,
    )


# --------------------------------------------------------------------------- MCP elicitation (issue 6)
#: Elicitations one call may make (each a question to a person) before it fails as a tool error.
MAX_ELICITATIONS = 10


def elicit_request_id(run_id: str, elicitation: Elicitation, asked: ToolElicited, attempt: int) -> str:
    """The human request of an elicitation: from the run, the call (turn, index), which of its elicitations it
    is, what it asks (a different question at the same place is another request) and the attempt (an answer
    that did not fit is asked again) -- the same on every replay."""
    schema = json.dumps(asked.requested_schema, sort_keys=True)
    parts = (str(elicitation.turn), str(elicitation.index), str(asked.position), str(attempt), asked.message, schema)
    link = () if asked.url is None else (asked.url,)  # forms keep the ids they had before URL mode
    return derive_id("hr", run_id, "elicit", *parts, *link)


def _elicit_refusal(run: RunRecord, turn: TurnInFlight, asked: ToolElicited) -> str | None:
    """Why a call's elicitation cannot park this turn (the call then fails as a tool error), or ``None``."""
    what = "the tool asked for the user's input mid-call"
    if turn.parked:
        return f"{what}, but this reply already waits (ask_human, ask_agent mode=wait): call it again on its own"
    if any(isinstance(plan, Emit) and plan.handoff is not None for plan in turn.plans):
        return f"{what}, but this run hands its task off in this reply"
    if turn.elicited is not None:
        return f"{what}, but another tool of this reply already waits for the user's input: call it again after"
    return _elicit_problem(run, asked)


def _elicit_problem(run: RunRecord, asked: ToolElicited) -> str | None:
    what = "the tool asked for the user's input mid-call"
    if not run.human.allowed_recipients:
        return f"{what}, and this run may ask nobody (its trigger allows no recipients)"
    if asked.url is not None:
        if not asked.url.startswith(("https://", "http://")):
            return f"{what} to open a link that is not http(s): {asked.url[:200]}"
    else:
        problem = form_problem(asked.requested_schema)
        if problem is not None:
            return f"{what} with a form that cannot be asked: {problem}"
    if asked.position >= MAX_ELICITATIONS:
        return f"{what} more than {MAX_ELICITATIONS} times in one call"
    return None


def _elicit_pending(
    run: RunRecord, elicitation: Elicitation, asked: ToolElicited, attempt: int, refused: str | None, now: datetime
) -> PendingAsk:
    """The ask a call's elicitation parks the run on: the run's person (its first allowed recipient)."""
    return PendingAsk(
        kind="elicit",
        request_id=elicit_request_id(run.run_id, elicitation, asked, attempt),
        call_id=elicitation.call.id,
        turn=elicitation.turn,
        asked_at=now,
        arguments={
            "recipient": run.human.allowed_recipients[0],
            "tool": elicitation.call.name,
            "message": asked.message,
            "requested_schema": asked.requested_schema,
            "url": asked.url,
            "position": asked.position,
            "attempt": attempt,
            "refused": refused,
        },
    )


def _elicit_requested(run: RunRecord, pending: PendingAsk, agent: Agent, redactor: Redactor) -> HumanRequested:
    """``human.requested`` for an elicitation: the form rendered as options or free text (:mod:`.elicitation`)."""
    args = pending.arguments
    url = args.get("url")
    if url:  # URL mode: the link in the question, done or decline
        form = render_url(str(args["message"]), str(url))
    else:
        form = render(str(args["message"]), dict(args["requested_schema"]), refused=args.get("refused"))
    policy = run.human.for_question(form.options)
    timeout = min(policy.default_timeout_s, policy.max_timeout_s)
    requested = HumanRequested(
        request_id=pending.request_id,
        run_id=run.run_id,
        agent=run.agent,
        agent_display_name=agent.card.display_name,  # the card's, as the run is asking now (None: its id)
        title=run.title,
        recipient=str(args["recipient"]),
        question=form.question,
        context=f"The tool {args['tool']} asks during a call.\n{form.context}"[:MAX_TEXT],
        options=form.options,
        allow_free_text=form.allow_free_text,
        timeout_s=timeout,
        expires_at=pending.asked_at + timedelta(seconds=timeout),
        policy=policy,
        turn=pending.turn,
        source_link=run.event.source_link if run.event else None,
        # a form's schema: human-interaction refuses a misfit at the channel (a link has no form)
        # (nor a form that asks for a secret: it is declined only)
        answer_schema=None if url or form.declines_only else dict(args["requested_schema"]),
    )
    return redactor.human_requested(requested)  # SEC-1: no secret on the bus or in the journal


def _elicitation_outcome(run: RunRecord, ckpt: Checkpoint, incoming: HumanOutcome, now: datetime) -> AnswerElicitation:
    """What the person's outcome tells the server: ``accept`` with the form's values, ``decline`` (the person
    chose it), ``cancel`` (no answer in time, a rejected request, or too many answers that did not fit); an
    answer that does not fit the form is asked again, saying why."""
    request_id = incoming.request_id
    pending = ckpt.pending
    if pending is None or pending.kind != "elicit" or pending.request_id != request_id:
        return AnswerElicitation(request_id)  # applied already (a redelivery): nothing to do
    args = pending.arguments
    message, schema = str(args["message"]), dict(args["requested_schema"])
    url = str(args["url"]) if args.get("url") else None
    result = incoming.result
    if not isinstance(result, HumanAnsweredResult):
        return AnswerElicitation(
            request_id, ElicitAnswer(message=message, requested_schema=schema, action="cancel", url=url)
        )
    if url is not None:  # URL mode: the person opened the link and is done there, or declined
        action = read_url(result.answer)
        return AnswerElicitation(request_id, ElicitAnswer(message=message, requested_schema={}, action=action, url=url))
    got = read(schema, result.answer)
    if got.action is not None:
        answer = ElicitAnswer(message=message, requested_schema=schema, action=got.action, content=got.content)
        return AnswerElicitation(request_id, answer)
    attempt = int(args.get("attempt") or 0) + 1
    if attempt >= MAX_REFUSED:
        return AnswerElicitation(request_id, ElicitAnswer(message=message, requested_schema=schema, action="cancel"))
    assert ckpt.elicit is not None
    asked = ToolElicited(message, schema, int(args.get("position") or 0))
    return AnswerElicitation(request_id, repark=_elicit_pending(run, ckpt.elicit, asked, attempt, got.refused, now))


def _retry(run: RunRecord, ckpt: Checkpoint, agent: Agent, attempt: Attempt, now: datetime) -> Decision:
    """Make the call parked on its elicitation again, now that its answers are recorded."""
    elicitation = ckpt.elicit
    assert elicitation is not None
    tool = agent.tools.get(elicitation.call.name)
    if tool is None or tool.implementation is None:  # the card lost the tool meanwhile (a restart with a new card)
        content = tool_error(f"the tool {elicitation.call.name!r} is not available any more")
        return _retried(run, ckpt, elicitation, content, 0.0, (), now)
    return _decision(
        TakeLease(_lease(attempt, now), renew=True),
        ArmWatchdog(ckpt.turn, agent.card.limits.max_compute_s, attempt.cause("elicit")),
        then=RetryTool(elicitation, tool),
    )


def _tool_retried(
    run: RunRecord | None, ckpt: Checkpoint | None, agent: Agent | None, incoming: ToolRetried, now: datetime
) -> Decision:
    """The retried call's outcome: its tool message (the turn is complete), or another elicitation to ask."""
    if run is None or run.state is not RunState.RUNNING or ckpt is None or ckpt.elicit != incoming.elicitation:
        return _decision(Note("run.moved_on", "warning", {"detail": "the retried call's run moved on; dropped"}))
    elicitation, outcome = incoming.elicitation, incoming.outcome
    call = elicitation.call
    effects: list[Effect] = []
    if isinstance(outcome, ToolElicited):
        problem = _elicit_problem(run, outcome)
        if problem is None:
            kept = evolve_shallow(elicitation, answers=elicitation.answers[: outcome.position])
            pending = _elicit_pending(run, kept, outcome, 0, None, now)
            saved = evolve_shallow(
                ckpt,
                pending=pending,
                elicit=kept,
                compute_s=ckpt.compute_s + incoming.elapsed_s,
                usage=ckpt.usage + incoming.usage,
                saved_at=now,
            )
            fields = {"turn": elicitation.turn, "call_id": call.id, "tool": call.name, "request_id": pending.request_id}
            return Decision((Note("run.tool_call.elicited", fields=fields), SaveCheckpoint(saved)), Boundary())
        content = tool_error(problem)
    elif isinstance(outcome, ToolBroke):
        fields = {"turn": elicitation.turn, "call_id": call.id, "tool": call.name, "error": outcome.error}
        failed = ToolFailed(
            run_id=run.run_id, turn=elicitation.turn, call_id=call.id, tool=call.name, error=outcome.error[:4096]
        )
        effects += [
            Note("tool.failed", "warning", fields),
            Publish(failed, (str(elicitation.turn), str(elicitation.index))),
        ]
        content = tool_error(f"the tool {call.name!r} failed: {outcome.error}")
    else:
        content = outcome.content
    return _retried(run, ckpt, elicitation, content, incoming.elapsed_s, tuple(effects), now, incoming.usage)


def _retried(
    run: RunRecord,
    ckpt: Checkpoint,
    elicitation: Elicitation,
    content: str,
    elapsed_s: float,
    effects: tuple[Effect, ...],
    now: datetime,
    usage: Usage | None = None,
) -> Decision:
    saved = evolve_shallow(
        ckpt,
        messages=[*ckpt.messages, _tool_message(elicitation.call, content)],
        elicit=None,
        compute_s=ckpt.compute_s + elapsed_s,
        usage=ckpt.usage + usage if usage is not None else ckpt.usage,
        saved_at=now,
    )
    called = _tool_called(run, elicitation.turn, elicitation.index, elicitation.call, content)
    return Decision((*effects, called, SaveCheckpoint(saved)), Boundary())


def _tool_returned(
    run: RunRecord | None, ckpt: Checkpoint | None, agent: Agent | None, incoming: ToolReturned, now: datetime
) -> Decision:
    if run is None or agent is None or ckpt is None:
        return _decision(Retry("the run or its checkpoint vanished mid-turn"))
    turn, index = incoming.turn, incoming.index
    call = turn.calls[index]
    effects: list[Effect] = []
    outcome = incoming.outcome
    turn = replace(turn, usage=turn.usage + incoming.usage)  # what its sampling requests cost
    if isinstance(outcome, ToolElicited):
        refused = _elicit_refusal(run, turn, outcome)
        if refused is None:
            elicitation = Elicitation(call=call, index=index, turn=turn.number)
            pending = _elicit_pending(run, elicitation, outcome, 0, None, now)
            turn = replace(turn, elicited=elicitation, elicit_pending=pending)
            fields = {"turn": turn.number, "call_id": call.id, "tool": call.name, "request_id": pending.request_id}
            note = Note("run.tool_call.elicited", fields=fields)
            return _calls_from(run, ckpt, agent, turn, index + 1, (note,), incoming.elapsed_s, now)
        outcome = ToolOutput(tool_error(refused))
    if isinstance(outcome, ToolBroke):
        fields = {"turn": turn.number, "call_id": call.id, "tool": call.name, "error": outcome.error}
        effects += [
            Note("tool.failed", "warning", fields),
            Publish(
                ToolFailed(
                    run_id=run.run_id, turn=turn.number, call_id=call.id, tool=call.name, error=outcome.error[:4096]
                ),
                (str(turn.number), str(index)),
            ),
        ]
        content = tool_error(f"the tool {call.name!r} failed: {outcome.error}")
    else:
        content = outcome.content
    effects.append(_tool_called(run, turn.number, index, call, content))
    turn = replace(turn, results=(*turn.results, _tool_message(call, content)))
    return _calls_from(run, ckpt, agent, turn, index + 1, tuple(effects), incoming.elapsed_s, now)


def _calls_from(
    run: RunRecord,
    ckpt: Checkpoint,
    agent: Agent,
    turn: TurnInFlight,
    start: int,
    effects: tuple[Effect, ...],
    elapsed_s: float,
    now: datetime,
) -> Decision:
    """The turn's calls from ``start`` on, in order: refusals answered at once, the next invocation handed
    to the driver; when none is left, the turn's checkpoint."""
    done = list(effects)
    for index in range(start, len(turn.plans)):
        plan, call = turn.plans[index], turn.calls[index]
        if isinstance(plan, Ask):
            continue  # its result is the person's answer, applied when it comes
        if isinstance(plan, Invoke):
            return Decision(tuple(done), CallTool(turn, index))
        if isinstance(plan, Emit):
            done += [plan.publish, *plan.also]
        elif plan.note is not None:
            done.append(plan.note)
        shown = (
            call
            if not isinstance(plan, Emit) or plan.shown is None
            else call.model_copy(update={"arguments": plan.shown})
        )
        done.append(_tool_called(run, turn.number, index, shown, plan.content))
        turn = replace(turn, results=(*turn.results, _tool_message(call, plan.content)))
    return _commit(run, ckpt, agent, turn, tuple(done), elapsed_s, now)


def _commit(
    run: RunRecord,
    ckpt: Checkpoint,
    agent: Agent,
    turn: TurnInFlight,
    effects: tuple[Effect, ...],
    elapsed_s: float,
    now: datetime,
) -> Decision:
    limits = agent.card.limits
    cause = turn_cause(run.run_id, ckpt)  # what this turn followed from: its events' causation
    metrics = () if turn.metrics is None else (_metrics(turn.metrics, cause),)  # AP-9 (see TurnInFlight.metrics)
    malformed = ckpt.malformed_tool_calls + turn.malformed
    if malformed > limits.max_malformed_tool_calls:
        error = (
            f"{malformed} malformed tool calls (unparseable arguments or unknown tools); the card allows "
            f"{limits.max_malformed_tool_calls}"
        )
        totals = _totals(ckpt, turns=turn.number, calls=len(turn.calls), usage=turn.usage)
        return Decision((*effects, *metrics, *_fail(run, "malformed_tool_calls", error, totals=totals)))
    assistant = Message(role="assistant", content=turn.reply.content, tool_calls=turn.reply.tool_calls)
    answered = {plan.answers for plan in turn.plans if isinstance(plan, Emit) and plan.answers is not None}
    received = [evolve_shallow(r, answered=True) if r.request_id in answered else r for r in ckpt.received]
    saved = evolve_shallow(
        ckpt,
        checkpoint_id=derive_id("ckpt", run.run_id, str(turn.number)),
        turn=turn.number,
        saved_at=now,
        messages=[*ckpt.messages, assistant, *turn.results],
        pending=turn.pending,
        more_pending=turn.parked[1:],
        outcomes=[],
        compute_s=ckpt.compute_s + elapsed_s,
        usage=turn.usage,
        tool_calls=ckpt.tool_calls + len(turn.calls),
        malformed_tool_calls=malformed,
        received=received,
        elicit=turn.elicited,
        metrics=turn.metrics,
        # the next turn (or the park) follows from this turn's run.checkpointed
        cause=event_id(run.run_id, RunCheckpointed.EVENT_TYPE, str(turn.number)),
        turn_cause=cause,
    )
    committed = (*effects, SaveCheckpoint(saved), _checkpointed(run, saved), *metrics)
    handoff = next((p.handoff for p in turn.plans if isinstance(p, Emit) and p.handoff is not None), None)
    if handoff is not None:  # AP-6: the task is the child's now; this run ends with this turn
        return Decision((*committed, *_complete(run, _handed_off_result(handoff), _totals(saved))))
    return Decision(committed, Boundary())


def _watchdog_fired(
    run: RunRecord | None,
    ckpt: Checkpoint | None,
    agent: Agent | None,
    incoming: WatchdogFired,
    now: datetime,
    attempt: Attempt,
) -> Decision:
    """See :mod:`.watchdog`: decided from the record, never from the firing alone."""
    if run is None:
        return _decision(Note("watchdog.unknown_run"))
    payload = incoming.payload
    turn = ckpt.turn if ckpt is not None else 0
    limits = agent.card.limits if agent is not None else Limits()
    if payload.agent_turn is not None:  # the compute deadline of a run parked on its external agent
        if run.state in ACTIVE:  # woken (or never parked: its driver died first): a watchdog from now on
            fields = {"agent_turn": payload.agent_turn, "state": run.state.value}
            return _decision(
                ArmWatchdog(turn, limits.max_compute_s, attempt.cause("agent-deadline")),
                Note("watchdog.agent_deadline_on_driven_run", fields=fields),
            )
        deadline = AgentActed(run.run_id, task_id_for(run.run_id), payload.agent_turn, "", deadline=True)
        # its first firing on a finished run republishes the terminal event like any watchdog's (:func:`_ended`)
        return _agent_acted(run, ckpt, deadline, now, attempt)
    if run.state not in ACTIVE:  # waiting for a person, or finished (its end's publish may have been cut off)
        return _decision(*_ended(run, ckpt, again=True), Note("watchdog.ignored", fields={"state": run.state.value}))
    if turn != payload.turn:
        # progress since the arm, and nobody armed it again (a driver re-arms only every half horizon, or it
        # died): watch on from that progress (the checkpoint's save), not from now
        fields = {"armed_turn": payload.turn, "turn": turn, "state": run.state.value}
        since = ckpt.saved_at if ckpt is not None else None
        return _decision(
            ArmWatchdog(turn, limits.max_compute_s, attempt.cause("progress"), since=since),
            Note("watchdog.progressed", "warning", fields),
        )
    if run.cancel is not None:  # stalled, but asked to stop: cancelled, as asked
        return _decision(*_cancel(run, run.cancel, _totals(ckpt)))
    idle_s = (now - payload.armed_at).total_seconds()
    error = (
        f"no progress in {run.state.value} at turn {turn} for {idle_s:.0f}s: longer than the compute "
        f"limit ({limits.max_compute_s:g}s) plus the watchdog's grace ({incoming.grace_s:g}s)"
    )
    return _decision(*_fail(run, "stalled", error, totals=_totals(ckpt)))


def _dead_lettered(run: RunRecord | None, ckpt: Checkpoint | None, incoming: DeadLettered) -> Decision:
    """A run whose message is given up on fails visibly (``infrastructure_error``); one asked to stop is
    cancelled; a run the message does not drive is left alone."""
    if incoming.lost_race:
        return _decision()
    if run is None:
        return _decision(Note("run.dead_letter.unknown_run", fields={"ce_type": incoming.event_type}))
    if not drives(run, ckpt, incoming.event_type, incoming.request_id):
        fields = {"state": run.state.value, "ce_type": incoming.event_type}
        return _decision(*_ended(run, ckpt, again=True), Note("run.dead_letter.not_its_driver", fields=fields))
    if run.cancel is not None:  # it was to stop anyway: what it was asked for, not a failure
        return _decision(*_cancel(run, run.cancel, _totals(ckpt)))
    error = (
        f"{incoming.event_type} {incoming.event_id} dead-lettered after {incoming.deliveries} deliveries: "
        f"{incoming.error}"
    )
    return _decision(*_fail(run, "infrastructure_error", error, causation=incoming.event_id, totals=_totals(ckpt)))


#: The ``run.failed`` reason of a run whose state would not fit in one bus message (:class:`TooLarge`). Executors
#: before it dead-lettered such a run (``infrastructure_error``, "... bytes exceed the server's max_payload").
CONVERSATION_TOO_LARGE: RunFailureReason = "conversation_too_large"


def _too_large(run: RunRecord | None, ckpt: Checkpoint | None, incoming: TooLarge) -> Decision:
    """The run cannot keep its state on the bus any more: it fails, saying how big it got and what the bus carries
    (a finished or unknown run: the write is refused as before, a permanent error)."""
    if incoming.what == "reply":
        error = f"the model's reply is {incoming.size} bytes"
    elif incoming.what == "record":
        error = f"the run's record (with its result) is {incoming.size} bytes"
    else:
        saved = incoming.checkpoint or ckpt
        messages = f" ({len(saved.messages)} messages)" if saved is not None else ""
        error = f"the conversation is {incoming.size} bytes{messages}"
    advice = (
        "Ask the agent for a shorter final reply, or raise max_payload"
        if incoming.what == "record"
        else "Make the run's tools return less (each result is cut to 64 KiB already), give it fewer turns, or raise "
        "max_payload"
    )
    error += (
        f"; the bus carries at most {incoming.limit} (the NATS server's max_payload), so the run cannot keep it. "
        + advice
    )
    if run is None or run.state in RUN.terminal:
        return _decision(Reject(error))
    return _decision(*_fail(run, CONVERSATION_TOO_LARGE, error, totals=_totals(incoming.checkpoint or ckpt)))


def _retention_fired(run: RunRecord | None, ckpt: Checkpoint | None) -> Decision:
    """See :mod:`.retention`: the checkpoint goes only when the record says the run is finished."""
    if run is None:
        return _decision(Note("retention.unknown_run", "warning"))
    if run.state not in RUN.terminal:  # never armed before the end is committed: a run id used twice?
        return _decision(Note("retention.run_not_finished", "warning", {"state": run.state.value}))
    if ckpt is None:  # a redelivered firing, or a second arm's: removed already
        return _decision(Note("retention.already_removed", fields={"state": run.state.value}))
    fields = {"state": run.state.value, "turn": ckpt.turn}
    return _decision(RemoveCheckpoint(), Note("run.checkpoint.removed", fields=fields))


def _retain(run: RunRecord, ckpt: Checkpoint | None) -> tuple[Effect, ...]:
    """A decision on a finished run whose checkpoint is still there arms its retention again (the same
    deadline, one timer per run): the handler that ended it may have died before it armed it."""
    return (ArmRetention(),) if run.state in RUN.terminal and ckpt is not None else ()


def drives(run: RunRecord, ckpt: Checkpoint | None, event_type: str, request_id: str | None) -> bool:
    """Whether a message of ``event_type`` is the one ``run`` depends on to move on (so losing it strands it).

    ``run.requested`` drives a run that is pending, or running and never resumed; a ``human.*``
    outcome (or an ``agent.*`` one ending a wait) drives the run waiting on (or resuming with) its
    request, or running on the strength of it (its request is the last one applied). Finished and
    waiting runs depend on no other message; a queued agent message drives nothing.
    """
    if run.state in RUN.terminal or event_type == RunCancelRequested.EVENT_TYPE:
        return False  # a cancel request drives nothing: the run goes on without it
    request = request_id if event_type.startswith(("human.", "agent.")) else None
    if run.state in (RunState.WAITING_FOR_HUMAN, RunState.WAITING_FOR_AGENT, RunState.RESUMING):
        parked = {p.request_id for p in ckpt.parked} if ckpt is not None else set()
        return request is not None and (run.waiting_request_id == request or request in parked)
    if run.state is RunState.PENDING:
        return request is None
    if run.state is RunState.RUNNING:
        applied = ckpt.applied_requests if ckpt is not None else []
        if request is None:
            return not applied
        return bool(applied) and applied[-1] == request
    return False


# --------------------------------------------------------------------------- endings
def _totals(
    ckpt: Checkpoint | None, *, turns: int | None = None, calls: int = 0, usage: Usage | None = None
) -> RunUsage:
    """What the run used, for its terminal event and record: the committed turns' totals (``ckpt``: they
    survive parks, resumes and recoveries), plus an uncommitted last turn's (``turns``, ``calls``, ``usage``)."""
    tokens = usage if usage is not None else (ckpt.usage if ckpt is not None else Usage())
    return RunUsage(
        turns=turns if turns is not None else (ckpt.turn if ckpt is not None else 0),
        tool_calls=(ckpt.tool_calls if ckpt is not None else 0) + calls,
        prompt_tokens=tokens.prompt_tokens,
        completion_tokens=tokens.completion_tokens,
        total_tokens=tokens.total_tokens,
        samplings=tokens.samplings,
    )


def _complete(run: RunRecord, result: str, totals: RunUsage, limit: int = MAX_RESULT_BYTES) -> tuple[Effect, ...]:
    note = Note("run.completed", fields={"turns": totals.turns, "total_tokens": totals.total_tokens})
    kept = bounded_result(result, limit)  # the record and its event must fit on the bus (.bounds)
    if kept is not result:
        note = Note("run.completed", "warning", {**note.fields, "result_cut_from_bytes": len(result.encode())})
    return _end(run, RunState.COMPLETED, {"result": kept, "usage": totals, "ending": Ending()}, note)


def _cancel(run: RunRecord, cancel: CancelRequest, totals: RunUsage) -> tuple[Effect, ...]:
    """The record cancelled (one end per run), then ``run.cancelled`` (one id per run: a repeat is deduplicated),
    then its watchdog. Pending human requests are human-interaction's to cancel (it consumes ``run.cancelled``)."""
    changes = {"waiting_request_id": None, "usage": totals, "ending": Ending(causation=cancel.event_id)}
    note = Note("run.cancelled", fields={"reason": cancel.reason, "requested_by": cancel.requested_by})
    return _end(run, RunState.CANCELLED, changes, note)


def _fail(
    run: RunRecord, reason: RunFailureReason, error: str, *, totals: RunUsage, causation: str | None = None
) -> tuple[Effect, ...]:
    # one id per run, whatever the reason: a run fails once, and a repeat is deduplicated
    changes = {"error": f"{reason}: {error}", "usage": totals, "ending": Ending(reason=reason, causation=causation)}
    return _end(run, RunState.FAILED, changes, Note("run.failed", "warning", {"reason": reason, "error": error}))


def _end(run: RunRecord, target: RunState, changes: dict[str, Any], note: Note) -> tuple[Effect, ...]:
    """An end of the run: the record moved to ``target`` first -- one compare-and-set, which a run already ended
    (by a racing watchdog, cancel or driver) refuses (:class:`RunMovedOn`: this handler publishes nothing) --
    with what its terminal event is built from (:class:`~.records.Ending`), then that event, built from the
    record as committed (:func:`ending_event`: one per run, and the one the record says), the watchdog off and
    the checkpoint's retention (one pipelined batch: the three sent together, their acknowledgements awaited
    together), then, once they are acknowledged, the event marked published on the record (:class:`MarkPublished`).
    A driver that dies between the compare-and-set and that mark leaves the event to the redelivery of its
    message (or the watchdog still armed, or the dead-letter hook): see :func:`_ended`."""
    announced = ending_event(evolve_shallow(run, state=target, **changes))
    assert announced is not None
    return (Transition(target, changes), announced, DisarmWatchdog(), ArmRetention(), MarkPublished(), note)


def ending_event(run: RunRecord) -> Publish | None:
    """The terminal event of a finished ``run``, from its record alone (its ``result``, ``error``, ``usage``,
    ``cancel`` and :class:`~.records.Ending`): the same data and id whoever builds it, whenever. ``None``: the
    run has not ended, or ended before records held their ending (its event went out before the record)."""
    ending = run.ending
    if ending is None or run.state not in RUN.terminal:
        return None
    totals = run.usage or RunUsage()
    data: EventData
    if run.state is RunState.COMPLETED:
        data = RunCompleted(run_id=run.run_id, result=(run.result or "")[:16384], turns=totals.turns, usage=totals)
    elif run.state is RunState.CANCELLED:
        cancel = run.cancel
        reason = f"{cancel.reason} (requested by {cancel.requested_by})" if cancel is not None else "cancelled"
        data = RunCancelled(run_id=run.run_id, reason=reason[:4096], usage=totals)
    else:
        failure = ending.reason or "infrastructure_error"
        error = (run.error or "").removeprefix(f"{failure}: ")
        data = RunFailed(run_id=run.run_id, reason=failure, error=error[:4096], usage=totals)
    return Publish(data, causation=ending.causation)


def _ended(run: RunRecord, ckpt: Checkpoint | None, *, again: bool) -> tuple[Effect, ...]:
    """A decision on a finished run: its checkpoint retention armed again (:func:`_retain`); and, when the handler
    that ended it may have died between the end's compare-and-set and the event's acknowledgement (``again``: this
    delivery is a redelivery, the watchdog -- disarmed in the same batch as the event -- or an external agent's
    deadline fired, or a message is dead-lettered) and the record does not say the event went out
    (:attr:`~.records.Ending.published`), what the end did after its compare-and-set: the terminal event published
    again with the same id and data (:func:`ending_event`; deduplicated when it did go out, within the events
    stream's 10-minute duplicate window), the watchdog off (else it fires ``max_compute_s`` + grace later, past that
    window), the retention, and the event marked published once acknowledged."""
    ending = run.ending
    announced = ending_event(run) if again and ending is not None and not ending.published else None
    if announced is None:
        return _retain(run, ckpt)
    return (announced, DisarmWatchdog(), *_retain(run, ckpt), MarkPublished())


def published(run: RunRecord) -> RunRecord | None:
    """``run`` with its terminal event marked published (:class:`MarkPublished`); ``None`` when there is nothing to
    mark (not finished, finished before records held their ending, or marked already). ``updated_at`` is kept: it is
    the run's end, which its retention is armed from."""
    ending = run.ending
    if ending is None or ending.published or run.state not in RUN.terminal:
        return None
    return evolve_shallow(run, ending=evolve_shallow(ending, published=True))


def _unknown_agent(run: RunRecord, ckpt: Checkpoint | None) -> tuple[Effect, ...]:
    return _fail(run, "unknown_agent", f"no agent card named {run.agent!r}", totals=_totals(ckpt))


# --------------------------------------------------------------------------- pure state changes
def new_record(incoming: Requested, now: datetime) -> RunRecord:
    """The record a ``run.requested`` creates (pending)."""
    req = incoming.request
    return RunRecord(
        run_id=req.run_id,
        state=RUN.initial,
        agent=req.agent,
        title=req.title,
        launch=req.launch,
        input=req.input,
        event=req.event,
        human=req.human,
        parent_run_id=req.parent_run_id,
        relay=req.relay,
        collab=True,
        correlation_id=incoming.correlation_id,
        tenant=incoming.tenant,
        created_at=now,
        updated_at=now,
        requested_event=incoming.event_id or None,
    )


def started_record(incoming: Requested, attempt: Attempt, now: datetime) -> RunRecord:
    """The record a ``run.requested`` of a known agent creates: ``running``, held by the handler creating it.

    One record write before ``run.started`` (issue 11: pending, then running with the lease, were two, with a
    round trip between). The start's facts (``run.created``, ``run.started``, the watchdog at turn 0) and its
    first checkpoint follow the marker read in one batch; until that checkpoint exists the run counts as not
    started (:func:`_requested`: a redelivery looks for the cancel marker again and starts it the same way,
    taking the lease once its driver's lapses; a cancel recorded on it meanwhile cancels it, never started).
    """
    record = new_record(incoming, now)
    held = leased(record, _lease(attempt, now), now)
    assert held is not None, "a pending run is active: the lease is taken"
    running = moved(held, RunState.RUNNING, {}, now)
    assert running is not None
    return running


def initial_checkpoint(run: RunRecord, agent: Agent, now: datetime) -> Checkpoint:
    """Turn 0: the card's instructions and the task (whom the run may ask, how to read its input)."""
    askable = ", ".join(run.human.allowed_recipients) or "nobody"
    task = "\n".join(
        [
            f"Task: {' '.join(run.title.split())}",  # one line: a title cannot forge the lines below
            f"Launched by: {_launched_by(run)}",
            f"People you may ask: {askable}",
        ]
    )
    if any(tool.name == GET_INPUT for tool in agent.offered()):
        task += f"\nCall {GET_INPUT} for the data this run was started with."
    else:  # no tool to read it with: the input is part of the first message
        task += f"\nThe data this run was started with:\n{json.dumps(run.input, sort_keys=True)}"
    messages = [Message(role="system", content=agent.card.instructions()), Message(role="user", content=task)]
    asks = _relay_asks(run)
    messages += [Message(role="user", content=frame(mail)) for mail in asks]
    return Checkpoint(
        checkpoint_id=derive_id("ckpt", run.run_id, "0"),
        run_id=run.run_id,
        turn=0,
        saved_at=now,
        messages=messages,
        mail=asks,
        mail_keys=[mail.key for mail in asks],
        received=[_received(mail) for mail in asks],
        cause=event_id(run.run_id, RunStarted.EVENT_TYPE),
    )


def _launched_by(run: RunRecord) -> str:
    """Who started the run, as its first message says: a trigger by id, another agent's handoff, a relay's ask."""
    launch = run.launch
    if run.relay is not None:
        relay = run.relay
        return (
            f"agent-collab, to answer agent:{relay.asker_agent}'s question {relay.request_id} "
            f"(run {relay.asker_run_id}) for your earlier run {relay.target_run_id}"
        )
    handoff = run.input.get("handoff")
    if isinstance(handoff, dict) and run.parent_run_id is not None and launch.trigger_id is None:
        return f"a handoff from agent {handoff.get('from_agent') or '?'} (run {run.parent_run_id})"
    if launch.trigger_id is not None:
        return f"{launch.kind} trigger {launch.trigger_id}"
    parent = f" (parent run {run.parent_run_id})" if run.parent_run_id else ""
    return f"{launch.kind}{parent}"


def _relay_asks(run: RunRecord) -> list[AgentMail]:
    """A relay run's request (COL-6): in its input's ``incoming_asks``, delivered with its first turn."""
    relay = run.relay
    if relay is None:
        return []
    items = run.input.get("incoming_asks")
    found = [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []
    item = next((i for i in found if i.get("request_id") == relay.request_id), {})
    mode = "wait" if item.get("mode") == "wait" else "async"
    text = item.get("message") if isinstance(item.get("message"), str) else run.input.get("instructions")
    mail = AgentMail(
        key=f"relay:{relay.request_id}",
        kind="ask",
        request_id=relay.request_id,
        sender=f"agent:{relay.asker_agent}",
        sender_run_id=relay.asker_run_id,
        mode=mode,
        text=str(text or "(no message)")[:MAX_TEXT],
        truncated=bool(item.get("truncated", False)),
        expires_at=_when(item.get("expires_at")),  # when agent-collab gives the wait's deadline
    )
    return [mail]


def _when(value: Any) -> datetime | None:
    """An ISO 8601 time with its offset, or ``None`` (absent, not a string, unreadable, naive)."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def _received(mail: AgentMail) -> ReceivedAsk:
    asker = mail.sender.removeprefix("agent:")
    return ReceivedAsk(
        request_id=mail.request_id, asker_run_id=mail.sender_run_id or "", asker_agent=asker, mode=mail.mode or "async"
    )


def _given_prompt(ckpt: Checkpoint | None) -> str | None:
    """The system prompt a run that has a checkpoint was given (its first message), or ``None``."""
    first = ckpt.messages[0] if ckpt is not None and ckpt.messages else None
    return first.content if first is not None and first.role == "system" else None


def summary(agent: Agent, run: RunRecord | None = None, prompt: str | None = None) -> AgentSummary:
    """RUN-1: the card's facts a run exposes in ``run.started`` (the journal keeps them with the run).

    ``prompt``: the system prompt the run was given (its checkpoint's first message), when it has one; else the
    card's (:meth:`AgentCard.instructions`, what :func:`initial_checkpoint` gives it). Only its digest is told."""
    card = agent.card
    return AgentSummary(
        provider=card.provider.kind,
        model=card.provider.model if card.provider.kind == "openai" else None,
        skills=[skill.name for skill in card.skills],
        tools=[tool.name for tool in (offered_tools(run, agent) if run is not None else agent.offered())],
        mcp_servers=[server.name for server in card.mcp_servers],
        max_turns=_max_turns(run, agent) if run is not None else card.limits.max_turns,
        max_tokens=card.limits.max_tokens,
        max_compute_s=card.limits.max_compute_s,
        system_prompt_sha256=prompt_digest(card.instructions() if prompt is None else prompt),
        sandbox=sandbox_summary(card.sandbox),
    )


def moved(
    run: RunRecord, target: RunState, changes: Mapping[str, Any], now: datetime, *, waiting_on: str | None = None
) -> RunRecord | None:
    """``run`` in ``target`` with ``changes`` (``None``: nothing to write), through the state machine.

    Already in ``target``: only ``changes`` are applied. A finished run is never moved again (only its
    ``ending.published`` mark is set, by :func:`published`): a second end (any terminal ``target``) means another handler ended it first (:class:`RunMovedOn`, its event is that one's). A move
    the state machine refuses means another driver got there first: :class:`RunMovedOn`; so does a run that
    does not wait on ``waiting_on`` (when given: the wait another wake-up ended already).
    """
    state = run.state
    if waiting_on is not None and run.waiting_request_id != waiting_on:
        raise RunMovedOn(run.run_id, state, target)
    if target not in ACTIVE and run.lease is not None:  # parked or finished: nobody drives it any more
        changes = {"lease": None, **changes}
    if target not in ACTIVE and run.reply is not None:  # its turn is committed (parked) or over: not needed
        changes = {"reply": None, **changes}
    if state in RUN.terminal and target in RUN.terminal:  # a run ends once: a second end is another's, stale
        raise RunMovedOn(run.run_id, state, target)
    if state is target and not changes:
        return None
    if state is not target and not RUN.allowed(state, target):
        raise RunMovedOn(run.run_id, state, target)
    return evolve_shallow(run, state=target, updated_at=now, **changes)


def flagged(run: RunRecord, request: CancelRequest, now: datetime) -> RunRecord | None:
    """``run`` with the cancel recorded; ``None`` when finished or already asked to stop (the first wins)."""
    if run.state in RUN.terminal or run.cancel is not None:
        return None
    return evolve_shallow(run, cancel=request, updated_at=now)


def apply_result(
    ckpt: Checkpoint, request_id: str, content: str, now: datetime, key: str | None = None
) -> Checkpoint | None:
    """The checkpoint with the result of the parked call ``request_id`` as its tool message; ``None`` when
    already applied (a redelivered outcome is a no-op). Waiting on another request: ``PermanentError``.
    ``key``: the agent event that ended the wait (remembered, so its redelivery is known)."""
    if request_id in ckpt.applied_requests:
        return None
    pending = ckpt.pending
    if pending is None or pending.request_id != request_id:
        raise PermanentError(f"run {ckpt.run_id} is not waiting on {request_id}")
    message = Message(role="tool", tool_call_id=pending.call_id, name=_PARKED_TOOL[pending.kind], content=content)
    return evolve_shallow(
        ckpt,
        messages=[*ckpt.messages, message],
        pending=None,
        applied_requests=[*ckpt.applied_requests, request_id],
        resumed_by=key if key is not None else ckpt.resumed_by,
        saved_at=now,
        cause=_resumed_id(ckpt.run_id, request_id),
    )


def elicitation_answered(ckpt: Checkpoint, answering: AnswerElicitation, now: datetime) -> Checkpoint | None:
    """The checkpoint with the person's outcome of its elicitation request: the answer recorded for the call's
    retry (``pending`` cleared), or the question asked again (``pending`` the new ask); ``None`` when already
    applied (a redelivered outcome is a no-op). Waiting on another request: ``PermanentError``."""
    request_id = answering.request_id
    if request_id in ckpt.applied_requests:
        return None
    pending, elicitation = ckpt.pending, ckpt.elicit
    if pending is None or pending.request_id != request_id or elicitation is None:
        raise PermanentError(f"run {ckpt.run_id} is not waiting on {request_id}")
    if answering.answer is not None:
        position = int(pending.arguments.get("position") or 0)
        elicitation = evolve_shallow(elicitation, answers=[*elicitation.answers[:position], answering.answer])
    return evolve_shallow(
        ckpt,
        pending=answering.repark,
        elicit=elicitation,
        applied_requests=[*ckpt.applied_requests, request_id],
        saved_at=now,
        cause=_resumed_id(ckpt.run_id, request_id),
    )


def _resumed_id(run_id: str, wait_id: str) -> str:
    """The id of the ``run.resumed`` that ended the wait on ``wait_id`` (:func:`_resume`, :func:`_agent_news`): what
    the resumed turn follows from."""
    return event_id(run_id, RunResumed.EVENT_TYPE, wait_id)


def recorded(ckpt: Checkpoint, outcome: ParkedOutcome) -> Checkpoint | None:
    """HUM-7: the checkpoint with ``outcome`` recorded for its parked call; ``None`` when one is recorded for
    that request already (a redelivered event changes nothing) or the run no longer waits on it."""
    if all(p.request_id != outcome.request_id for p in ckpt.parked) or not ckpt.more_pending:
        return None
    if any(o.request_id == outcome.request_id for o in ckpt.outcomes):
        return None
    return evolve_shallow(ckpt, outcomes=[*ckpt.outcomes, outcome])


def apply_parked(ckpt: Checkpoint, request_id: str, now: datetime) -> Checkpoint | None:
    """HUM-7: the checkpoint with a tool message for every parked ``ask_human`` call of the turn, in call order:
    its recorded outcome, or (``wait_for: first``, another was answered first) ``not_needed``; ``None`` when
    already applied. ``request_id`` (the outcome that ended the wait) is the last of ``applied_requests``.
    The wait not over yet: ``PermanentError``."""
    parked = ckpt.parked
    if not ckpt.more_pending:
        return None
    if not _wait_over(ckpt):
        raise PermanentError(f"run {ckpt.run_id} still waits on some of {[p.request_id for p in parked]}")
    have = {o.request_id: o for o in ckpt.outcomes}
    winner = next((o.request_id for o in ckpt.outcomes if o.reason == "answer"), request_id)
    messages: list[Message] = []
    dismissed: list[str] = []
    for pending in parked:
        outcome = have.get(pending.request_id)
        if outcome is None:
            content = tool_content(HumanNotNeededResult(request_id=pending.request_id, answered=winner))
            dismissed.append(pending.request_id)
        else:
            content = outcome.content
        messages.append(Message(role="tool", tool_call_id=pending.call_id, name=ASK_HUMAN, content=content))
    applied = [o.request_id for o in ckpt.outcomes if o.request_id != request_id]
    applied += [request_id] if request_id in have else []
    return evolve_shallow(
        ckpt,
        messages=[*ckpt.messages, *messages],
        pending=None,
        more_pending=[],
        outcomes=[],
        applied_requests=[*ckpt.applied_requests, *applied],
        dismissed_requests=[*ckpt.dismissed_requests, *dismissed],
        saved_at=now,
        cause=_resumed_id(ckpt.run_id, parked[0].request_id),  # one run.resumed per wait, the id its first request's
    )


def queued(ckpt: Checkpoint, mail: AgentMail) -> Checkpoint | None:
    """The checkpoint with ``mail`` in its inbox; ``None`` when already there or delivered (redelivery), or
    an ask for a request it already received (COL-4: delivered once)."""
    if mail.key in ckpt.mail_keys:
        return None
    if mail.kind == "ask" and (
        any(r.request_id == mail.request_id for r in ckpt.received)
        or any(m.kind == "ask" and m.request_id == mail.request_id for m in ckpt.inbox)
    ):
        return None
    return evolve_shallow(ckpt, inbox=[*ckpt.inbox, mail], mail_keys=[*ckpt.mail_keys, mail.key])


def delivered(ckpt: Checkpoint, now: datetime) -> Checkpoint | None:
    """The checkpoint with its inbox framed into the conversation as user messages (COL-4), the asks among
    them answerable with ``answer_agent``; ``None`` when the inbox is empty."""
    if not ckpt.inbox:
        return None
    known = {r.request_id for r in ckpt.received}
    asks = [m for m in ckpt.inbox if m.kind == "ask" and m.request_id not in known]
    return evolve_shallow(
        ckpt,
        messages=[*ckpt.messages, *(Message(role="user", content=frame(m)) for m in ckpt.inbox)],
        mail=[*ckpt.mail, *ckpt.inbox],
        inbox=[],
        received=[*ckpt.received, *(_received(m) for m in asks)],
        saved_at=now,
    )


def merge_mail(saved: Checkpoint, base: Checkpoint, fresh: Checkpoint) -> Checkpoint | None:
    """A turn's checkpoint ``saved`` (made from ``base``) when the store holds ``fresh``: if all that changed
    since ``base`` is mail queued meanwhile, ``saved`` with that mail too; else ``None`` (another driver
    committed: the turn is lost)."""
    if evolve_shallow(fresh, inbox=base.inbox, mail_keys=base.mail_keys) != base:
        return None
    have = set(saved.mail_keys)  # the base's, and what an earlier merge added
    new = [m for m in fresh.inbox if m.key not in have]
    keys = [k for k in fresh.mail_keys if k not in have]
    return evolve_shallow(saved, inbox=[*saved.inbox, *new], mail_keys=[*saved.mail_keys, *keys])


def leased(run: RunRecord, lease: Lease, now: datetime) -> RunRecord | None:
    """``run`` held by ``lease``'s holder until its expiry. Held live by another: :class:`LeaseHeld`. A finished
    or parked run is not taken (``None``: nothing to write)."""
    current = run.lease
    if current is not None and current.holder != lease.holder and current.expires_at > now:
        raise LeaseHeld(f"run {run.run_id} is driven by {current.holder} until {current.expires_at.isoformat()}")
    if run.state not in ACTIVE:
        return None
    return evolve_shallow(run, lease=lease)


def with_reply(run: RunRecord, reply: KeptReply, holder: str) -> RunRecord | None:
    """``run`` keeping ``reply`` for its turn in flight (:class:`KeepReply`); ``None`` (nothing to write) when the
    run is no longer running, or a reply of that turn is kept already (the first one is the turn's: the machine goes
    on from it). Held by another handler (it took over: this one hung past its lease): :class:`LeaseLost`."""
    if run.state is not RunState.RUNNING:
        return None
    if run.lease is not None and run.lease.holder != holder:
        raise LeaseLost(f"run {run.run_id} is driven by {run.lease.holder} now")
    if run.reply is not None and run.reply.turn == reply.turn:
        return None
    return evolve_shallow(run, reply=reply)


def released(run: RunRecord, holder: str) -> RunRecord | None:
    """``run`` without ``holder``'s lease (its handler stops driving: it failed, or gave the message back);
    ``None`` when ``holder`` does not hold it."""
    if run.lease is None or run.lease.holder != holder:
        return None
    return evolve_shallow(run, lease=None)


def renewed(run: RunRecord, holder: str, expires_at: datetime) -> RunRecord | None:
    """``run`` with ``holder``'s lease extended to ``expires_at``; ``None`` when it no longer holds it."""
    if run.lease is None or run.lease.holder != holder or run.state not in ACTIVE:
        return None
    return evolve_shallow(run, lease=Lease(holder=holder, expires_at=expires_at))


def frame(mail: AgentMail) -> str:
    """COL-4: the fixed framing of an agent message as the model reads it -- a header (type, request id,
    sender), what to do with it, then the text (the other agent's words, verbatim)."""
    sender = mail.sender + (f" (run {mail.sender_run_id})" if mail.sender_run_id else "")
    kind = {"answer": "refusal" if mail.outcome == "refusal" else "answer"}.get(mail.kind, mail.kind)
    head = f"[agent message] type: {kind} | request_id: {mail.request_id} | from: {sender}"
    if mail.mode is not None and mail.kind == "ask":
        head += f" | mode: {mail.mode}"
    lines = [head]
    if mail.kind == "ask" and mail.mode == "wait":
        until = f" (until {mail.expires_at.isoformat()})" if mail.expires_at is not None else ""
        lines.append(
            f"The asker is waiting for your answer{until}: answer it in your next tool batch with "
            f'answer_agent(request_id="{mail.request_id}", answer=...), or refuse it with refuse=true and the reason.'
        )
    elif mail.kind == "ask":
        lines.append(
            f'Answer it with answer_agent(request_id="{mail.request_id}", answer=...) when you can, '
            "or refuse it with refuse=true and the reason."
        )
    elif mail.kind == "answer":
        late = " It came after your wait had timed out." if mail.late else ""
        lines.append(f"The {kind} to your ask_agent request {mail.request_id}.{late}")
    elif mail.kind == "expired":
        lines.append(f"Your wait for request {mail.request_id} timed out; the answer may still arrive.")
    elif mail.kind == "undeliverable":
        lines.append(f"Your ask_agent request {mail.request_id} reached nobody ({mail.outcome}).")
    else:
        lines.append(f"Your answer to request {mail.request_id} was not delivered ({mail.outcome}).")
    if mail.truncated:
        lines.append("(The text was cut at 4096 characters.)")
    lines += ["---", mail.text]
    return "\n".join(lines)


def agent_news(
    event_type: str,
    event_id: str,
    data: AgentMessageReceived
    | AgentAnswerReceived
    | AgentAskExpired
    | AgentAskUndeliverable
    | AgentReplyUndeliverable,
) -> AgentNews:
    """The incoming an ``agent.*`` event for one of the run-executor's runs is."""
    rid = data.request_id
    if isinstance(data, AgentMessageReceived):
        mail = AgentMail(
            key=event_id,
            kind="ask",
            request_id=rid,
            sender=f"agent:{data.asker_agent}",
            sender_run_id=data.asker_run_id,
            mode=data.mode,
            text=data.message,
            truncated=data.truncated,
            expires_at=data.expires_at,
        )
        return AgentNews(event_type, event_id, data.recipient_run_id, mail, relay=data.relay)
    if isinstance(data, AgentAnswerReceived):
        mail = AgentMail(
            key=event_id,
            kind="answer",
            request_id=rid,
            sender=f"agent:{data.replier_agent}",
            sender_run_id=data.replier_run_id,
            mode=data.mode,
            text=data.answer,
            truncated=data.truncated,
            outcome=data.outcome,
            late=data.late,
        )
        answered = AgentAnsweredResult(
            request_id=rid,
            outcome=data.outcome,
            replier=f"agent:{data.replier_agent}",
            replier_run_id=data.replier_run_id,
            answer=data.answer,
            truncated=data.truncated,
        )
        return AgentNews(event_type, event_id, data.asker_run_id, mail, tool_content(answered), waited_s=data.waited_s)
    if isinstance(data, AgentAskExpired):
        text = f"no answer within {data.timeout_s}s"
        mail = AgentMail(
            key=event_id, kind="expired", request_id=rid, sender="agent-collab", sender_run_id=None, text=text
        )
        result = tool_content(AgentTimedOutResult(request_id=rid, timeout_s=data.timeout_s))
        return AgentNews(event_type, event_id, data.asker_run_id, mail, result, "expiry", data.waited_s)
    if isinstance(data, AgentAskUndeliverable):
        mail = AgentMail(
            key=event_id,
            kind="undeliverable",
            request_id=rid,
            sender="agent-collab",
            text=data.detail,
            outcome=data.reason,
        )
        result = tool_content(AgentUndeliverableResult(request_id=rid, reason=data.reason, error=data.detail))
        return AgentNews(event_type, event_id, data.asker_run_id, mail, result, "rejection")
    mail = AgentMail(
        key=event_id,
        kind="reply_undeliverable",
        request_id=rid,
        sender="agent-collab",
        text=data.detail,
        outcome=data.reason,
    )
    return AgentNews(event_type, event_id, data.replier_run_id, mail)


def human_outcome(event_type: str, event_id: str, data: HumanAnswered | HumanExpired | HumanRejected) -> HumanOutcome:
    """The incoming a ``human.*`` outcome event is."""
    reason: Literal["answer", "expiry", "rejection"]
    waited: float | None = None
    fails = cancels = False
    if isinstance(data, HumanAnswered):
        reason, waited = "answer", data.waited_s
    elif isinstance(data, HumanExpired):
        reason, waited = "expiry", data.waited_s
        fails, cancels = data.action == "fail", data.action == "cancel"
    else:
        reason = "rejection"
    return HumanOutcome(
        event_type=event_type,
        event_id=event_id,
        run_id=data.run_id,
        request_id=data.request_id,
        result=human_result(data),
        reason=reason,
        waited_s=waited,
        fails_run=fails,
        cancels_run=cancels,
        sender=data.responder if isinstance(data, HumanAnswered) else None,
    )


# --------------------------------------------------------------------------- helpers
def _hidden(run: RunRecord) -> frozenset[str]:
    """Tools the card allows that this run is not offered: the collaboration tools to a run from before
    them (COL-9), delegation to a relay run (COL-6)."""
    if not run.collab:
        return COLLAB_TOOLS
    if run.relay is not None:
        return frozenset({ASK_AGENT, HANDOFF_TO_AGENT})
    return frozenset()


def offered_tools(run: RunRecord, agent: Agent) -> list[Tool]:
    """The tools ``run`` is offered: the card's (COL-8: its allow/deny list governs them all), less
    :func:`_hidden`."""
    hidden = _hidden(run)
    return [tool for tool in agent.offered() if tool.name not in hidden]


def _max_turns(run: RunRecord, agent: Agent) -> int:
    limit = agent.card.limits.max_turns
    return min(limit, run.relay.max_turns) if run.relay is not None else limit


def _lease(attempt: Attempt, now: datetime) -> Lease:
    return Lease(holder=attempt.driver, expires_at=now + timedelta(seconds=attempt.lease_s))


def _lease_fresh(run: RunRecord, attempt: Attempt, now: datetime) -> bool:
    """This handler holds the run's lease with more than two thirds of it left (renewing it would change
    next to nothing: the driver's keeper renews it every third during a call)."""
    lease = run.lease
    left = timedelta(seconds=attempt.lease_s * 2 / 3)
    return lease is not None and lease.holder == attempt.driver and lease.expires_at - now > left


def _holds(run: RunRecord, attempt: Attempt) -> bool:
    """This handler holds the run's lease (it created the run running: :func:`started_record`)."""
    return run.lease is not None and run.lease.holder == attempt.driver


def _held_by_other(run: RunRecord, attempt: Attempt, now: datetime) -> bool:
    lease = run.lease
    return lease is not None and lease.holder != attempt.driver and lease.expires_at > now


def _lease_held(run: RunRecord) -> Retry:
    lease = run.lease
    holder = lease.holder if lease is not None else "?"
    return Retry(f"run {run.run_id} is driven by {holder}; retried later", lost_race=True)


#: The most characters of a tool call's arguments journaled as written when they are not a JSON object.
RAW_ARGUMENTS_CHARS = 2000


def _tool_called(run: RunRecord, turn: int, index: int, call: ToolCall, content: str) -> Publish:
    called = RunToolCalled(
        run_id=run.run_id,
        turn=turn,
        call_id=call.id,
        tool=call.name,
        arguments=call.arguments,
        result_preview=content[:4096],
        # not a JSON object: the text itself, for who reads the journal (result_preview cuts it at 200)
        raw_arguments=None if call.invalid_arguments is None else call.invalid_arguments[:RAW_ARGUMENTS_CHARS],
    )
    return Publish(called, (str(turn), str(index)))


def _tool_message(call: ToolCall, content: str) -> Message:
    return Message(role="tool", tool_call_id=call.id, name=call.name, content=content)


def tool_error(message: str) -> str:
    """A tool result telling the model what went wrong: ``{"error": message}``."""
    return json.dumps({"error": message})


def _token_text(usage: Usage, max_tokens: int) -> str:
    return (
        f"{usage.total_tokens} tokens used ({usage.prompt_tokens} prompt, {usage.completion_tokens} completion); "
        f"the card's limit is {max_tokens}"
    )
