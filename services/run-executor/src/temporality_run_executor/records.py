"""What the run-executor keeps in KV: the run record and its last checkpoint (AP-7)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from temporality_protocol import (
    HumanPolicy,
    LaunchSource,
    NormalizedEvent,
    RelayRequest,
    RunState,
    RunStreamed,
    RunUsage,
)

__all__ = [
    "AgentMail",
    "CancelRequest",
    "Checkpoint",
    "ElicitAnswer",
    "Elicitation",
    "Ending",
    "KeptReply",
    "Lease",
    "Message",
    "ParkedOutcome",
    "PendingAsk",
    "ReceivedAsk",
    "RunRecord",
    "ToolCall",
    "Usage",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Usage(_Model):
    """Tokens, as OpenAI-compatible endpoints report them in a completion's ``usage`` block, and the MCP
    sampling requests the run's model answered (each one of the run's model calls, :mod:`.sampling`)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    samplings: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            samplings=self.samplings + other.samplings,
        )


class ToolCall(_Model):
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    #: The raw ``arguments`` text when the model sent something that is not a JSON object: the call is
    #: malformed, is not executed, and the model gets a tool error naming it on its next turn.
    invalid_arguments: str | None = None
    #: Why the call is not made whatever it names (its name or arguments were too long to keep:
    #: :mod:`~temporality_run_executor.bounds`); the model gets it as the call's tool error.
    refused: str | None = None


class Message(_Model):
    """One conversation entry, OpenAI chat shape."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


class PendingAsk(_Model):
    """The call the run is parked on (checkpointed with the turn that made it): ``ask_human``, ``ask_agent``
    in ``wait`` mode, or an MCP tool that asked for the user's input mid-call (``elicit``)."""

    #: What the run waits for: a person (``waiting_for_human``) or an agent's reply (``waiting_for_agent``);
    #: ``elicit``: a person, for an MCP tool's elicitation (the call is retried with the answer).
    #: Checkpoints written before this field existed read as ``human``.
    kind: Literal["human", "agent", "elicit"] = "human"
    request_id: str
    call_id: str
    turn: int
    asked_at: datetime
    #: The validated ask_human arguments (for an agent: the ``agent.asked`` payload; for an elicitation: whom,
    #: the server's message and requested schema, see :mod:`.elicitation`), so a crash between checkpoint
    #: and publish can re-park.
    arguments: dict[str, Any]


class ElicitAnswer(_Model):
    """What an MCP server's elicitation (``elicitation/create``) during a call is answered with: recorded
    once the person answered, and given at once when the retried call asks the same again."""

    message: str
    requested_schema: dict[str, Any]
    action: Literal["accept", "decline", "cancel"]
    #: The form's values (``accept`` only), validated against ``requested_schema``.
    content: dict[str, Any] | None = None
    #: A URL-mode elicitation (MCP 2025-11-25): the link the person was asked to open (``requested_schema``
    #: empty, never ``content``).
    url: str | None = None


class Elicitation(_Model):
    """An MCP tool call that asked for the user's input mid-call: parked on a person (the checkpoint's
    ``pending``, kind ``elicit``) while ``pending`` is set, retried with ``answers`` once it is not."""

    call: ToolCall
    #: The call's index in its turn (its events' ids).
    index: int
    turn: int
    #: The answers to the call's elicitations so far, in the order the server asks them.
    answers: list[ElicitAnswer] = Field(default_factory=list)


class ParkedOutcome(_Model):
    """HUM-7: the outcome of one of a turn's several parked ``ask_human`` calls, recorded while the run still
    waits for the others; the results are applied together when the wait ends."""

    request_id: str
    #: The call's tool result (:func:`~temporality_run_executor.results.tool_content`).
    content: str
    reason: Literal["answer", "expiry", "rejection"]
    #: The ``human.*`` event it came in (recorded once: a redelivered copy changes nothing).
    event_id: str


class AgentMail(_Model):
    """An ``agent.*`` event for the run, queued in its checkpoint until the next turn boundary (COL-4)."""

    #: What identifies the event once: a redelivered copy is not queued again.
    key: str
    kind: Literal["ask", "answer", "expired", "undeliverable", "reply_undeliverable"]
    request_id: str
    #: Who it comes from: ``agent:<id>`` for an ask or an answer, ``agent-collab`` for the others.
    sender: str
    sender_run_id: str | None = None
    mode: Literal["async", "wait"] | None = None
    #: The question, the answer (or refusal), or the sentence saying why it went nowhere.
    text: str
    truncated: bool = False
    #: ``answer``: ``answer`` or ``refusal``; ``undeliverable``/``reply_undeliverable``: the reason.
    outcome: str | None = None
    #: An answer that came after its wait had expired (by the async path, COL-2).
    late: bool = False
    #: Wait-mode asks: when the asker stops waiting.
    expires_at: datetime | None = None


class ReceivedAsk(_Model):
    """A request this run received (delivered to it, or in a relay run's input): ``answer_agent`` may
    answer it once (COL-3)."""

    request_id: str
    asker_run_id: str
    asker_agent: str
    mode: Literal["async", "wait"] = "async"
    answered: bool = False


class Lease(_Model):
    """Which handler drives the run now (issue 6: no run executed twice at once): taken when a handler
    starts driving, renewed at every turn boundary, dropped when the run parks or ends."""

    holder: str
    expires_at: datetime


class CancelRequest(_Model):
    """A ``run.cancel_requested`` recorded on the run: whoever drives the run next cancels it (RUN-2)."""

    reason: str
    requested_by: str
    requested_at: datetime
    #: The id of the ``run.cancel_requested`` event (the ``run.cancelled``'s causation).
    event_id: str


class Ending(_Model):
    """How the run ended, written in the same compare-and-set as its terminal state: the record is the outbox of
    its terminal event (``run.completed`` / ``run.failed`` / ``run.cancelled``, by the state), which is built from
    the record alone -- its ``result`` / ``error`` / ``usage`` / ``cancel`` and this
    (:func:`~temporality_run_executor.machine.ending_event`) -- and published only after that compare-and-set, so it
    is the one the record says. A handler that died in between leaves it to the redelivery (or the watchdog) to
    publish again, the same id, until :attr:`published` says it went out. Records that ended before it existed have
    none (their event went out first)."""

    #: ``run.failed``: its reason (the record's ``error`` is ``"<reason>: <error>"``).
    reason: str | None = None
    #: The terminal event's causation: the cancel's event id, a dead-lettered message's id.
    causation: str | None = None
    #: The terminal event was acknowledged by the stream (one more compare-and-set after its publish, best effort):
    #: from then on nothing publishes it again. Until then a redelivery, the watchdog or the dead-letter hook meeting
    #: the finished run does (the same id: deduplicated within the events stream's duplicate window, 10 minutes).
    published: bool = False


class KeptReply(_Model):
    """The provider's reply for the run's turn in flight (the checkpoint's turn plus one), kept on the run record
    before any of its calls can have an effect outside the run (a ``notify``, an ``agent.asked``, an MCP call...):
    a driver that dies before the turn's checkpoint leaves it to the one that takes over, which carries the turn
    out from it -- the same calls, the same ids -- instead of asking the model again (issue 6: a model need not
    answer the same twice). Written in the compare-and-set that stands in for the record's read after the provider
    call; a turn whose calls have no such effect keeps none. Dropped when the run parks or ends."""

    turn: int
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str | None = None
    stop_sequence: str | None = None
    #: Seconds the provider call took (the turn's compute so far).
    elapsed_s: float = 0.0


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
    #: What the whole run used (turns, tool calls, tokens), written when it ends -- the same totals as its
    #: terminal event's ``usage``. Records from before read their tokens only (the rest 0).
    usage: RunUsage | None = None
    #: Set once a cancel is asked for (the first one wins); the run moves to ``cancelled`` at the next turn
    #: boundary, at once if nobody is driving it (pending, waiting for a person).
    cancel: CancelRequest | None = None
    #: A relay run answering one ask for a finished run (COL-6): its turn budget, no delegation.
    relay: RelayRequest | None = None
    #: The run speaks agent collaboration (COL-9): records written before it existed read ``False`` and
    #: their runs are offered none of its tools.
    collab: bool = False
    #: The driver holding the run (``None``: nobody drives it, or a record from before leases).
    lease: Lease | None = None
    #: Set with the terminal state (:class:`Ending`): what its terminal event is built from.
    ending: Ending | None = None
    #: The provider's reply for the turn in flight, kept before its calls' effects (:class:`KeptReply`); records
    #: from before it read ``None``.
    reply: KeptReply | None = None
    #: The id of the ``run.requested`` event that created the record: ``run.created``'s causation, the same
    #: whichever copy of the request comes later (records from before it read ``None``: the request at hand's).
    requested_event: str | None = None
    #: Written by the dead-letter hook for a ``run.requested`` given up on before it created the run (its data
    #: unreadable, say): the record is created already ``failed`` (``infrastructure_error``), so the run never
    #: started and no ``run.created`` went out for it. A later copy of the request (``temporality dlq redrive``, a
    #: slower replica's last delivery) finds it finished and starts nothing, publishes no ``run.created``.
    never_started: bool = False


class Checkpoint(_Model):
    checkpoint_id: str
    run_id: str
    turn: int
    saved_at: datetime
    messages: list[Message]
    #: The call the run is parked on; with several ``ask_human`` calls in one turn (HUM-7), the first of them.
    pending: PendingAsk | None = None
    #: HUM-7: the turn's other parked ``ask_human`` calls, in call order (checkpoints from before read ``[]``).
    more_pending: list[PendingAsk] = Field(default_factory=list)
    #: HUM-7: outcomes already in for the parked calls while the run waits on the rest.
    outcomes: list[ParkedOutcome] = Field(default_factory=list)
    #: HUM-7: requests of a ``wait_for: first`` turn that were not needed (another was answered first).
    dismissed_requests: list[str] = Field(default_factory=list)
    #: Seconds spent computing (provider + tools) over all committed turns; waiting is excluded.
    compute_s: float = 0.0
    #: Human requests whose outcome is already in ``messages`` (makes a redelivered answer a no-op).
    applied_requests: list[str] = Field(default_factory=list)
    #: Tokens used over all committed turns (the endpoints' ``usage`` blocks, summed).
    usage: Usage = Field(default_factory=Usage)
    #: Tool calls the model made over all committed turns (checkpoints from before it read 0).
    tool_calls: int = 0
    #: Malformed tool calls (unparseable arguments, unknown tools) returned to the model so far.
    malformed_tool_calls: int = 0
    #: Agent messages not delivered yet: framed as user messages at the next turn boundary (COL-4).
    inbox: list[AgentMail] = Field(default_factory=list)
    #: Agent messages already delivered into ``messages`` (what a scripted agent reacts to).
    mail: list[AgentMail] = Field(default_factory=list)
    #: Keys of every agent message queued so far (a redelivered event is a no-op).
    mail_keys: list[str] = Field(default_factory=list)
    #: Requests this run received and may answer with ``answer_agent``.
    received: list[ReceivedAsk] = Field(default_factory=list)
    #: The key of the agent event whose result ended the run's last wait for an agent.
    resumed_by: str | None = None
    #: An MCP tool call waiting for (``pending`` set) or retried with (``pending`` unset) a person's answers
    #: to its elicitations; its tool message is added when the retried call returns.
    elicit: Elicitation | None = None
    #: AP-9: the last committed turn's ``metrics`` (a hosted run's), published right after the commit: a
    #: recovery republishes them (the same id), so a driver killed in between loses none.
    metrics: RunStreamed | None = None
    #: The id of the event the run's next turn follows from -- the causation of its events (and of a park's
    #: ``human.requested`` / ``agent.asked``): ``run.started`` for the first turn, the last committed turn's
    #: ``run.checkpointed``, or the ``run.resumed`` of the wait that ended since. Checkpoints from before it read
    #: ``None`` (:func:`~temporality_run_executor.machine.turn_cause` derives one).
    cause: str | None = None
    #: The causation of the committed turn ``turn``'s own events: its ``run.checkpointed`` and ``metrics``, which a
    #: recovery republishes from this checkpoint (the same id, the same causation).
    turn_cause: str | None = None

    @property
    def parked(self) -> list[PendingAsk]:
        """Every call the run is parked on, in call order (``[]``: none)."""
        return [] if self.pending is None else [self.pending, *self.more_pending]
