"""The run driver: performs what the run machine (:mod:`.machine`) decides. Runs are state machines in KV,
never coroutines waiting in memory.

``run.requested``  -> create the run once (KV create-if-absent), ``running`` and leased (one record write) ->
                      the cancel marker read -> ``run.created`` + ``run.started`` + the watchdog + the first
                      checkpoint (one batch) -> drive turns.
A turn = one provider call + its tool calls, then a checkpoint (KV, AP-7) + ``run.checkpointed``.
``ask_human``      -> checkpoint with the pending ask -> publish ``human.requested`` ->
                      ``waiting_for_human`` -> the handler returns, the message is acked, nothing stays
                      in memory (RUN-3).
``human.*``        -> ``resuming`` -> the outcome becomes the tool result -> ``running`` -> drive.
                      Several ``ask_human`` calls in one turn (HUM-7): one ``human.requested`` each, one
                      park; each outcome is recorded in the checkpoint, and the one that ends the wait
                      (all in, or the first answer with ``wait_for: first``) resumes the run with them all.
``run.cancel_requested`` -> recorded on the run; a run nobody drives (pending, parked) is cancelled at
                      once, a driven one by its driver at the next turn boundary (``run.cancelled``).
                      A cancel for a run not created yet leaves a marker (bucket ``run-cancel-markers``,
                      TTL 7 days) that its ``run.requested`` adopts: the run is cancelled as it is created.
an external agent's turn (AP-5) -> ``agent.task.offered`` -> ``waiting_for_agent`` on the turn (lease dropped,
                      message acked: no slot held while the agent works), the run's timer at its compute
                      budget left; ``agent.task.acted`` (or the timer) -> the action read from the task's
                      record -> ``resuming`` -> ``running`` -> the action is the turn's provider reply.
``agent.*``        -> the end of a ``waiting_for_agent`` (``ask_agent`` in wait mode: ``resuming`` ->
                      the answer, the timeout or the undeliverable reason becomes the tool result), or a
                      message queued in the checkpoint and framed into the conversation at the next
                      turn boundary (COL-4).
an MCP tool asking for input mid-call (elicitation) -> the server told ``cancel``, the turn parked on a
                      ``human.requested`` (the form as options or free text); the answer -> ``resuming``
                      -> recorded -> ``running`` -> the call made again, answered from the record.
anything for a run that has ended (an answer, an agent message) -> ``run.input_after_end``, acked (not for
                      a redelivery of one the run applied before it ended: its handler died before the ack).

A handler that drives a run holds its lease (in the run record: holder and expiry, taken with
``Store.modify``, renewed at every turn boundary): a second delivery of ``run.requested`` while the first
driver is mid-turn (a NATS failover that lost an ack) finds the live lease and is retried later instead
of calling the provider too; a lease that expired (its driver died) is taken over as recovery. The lease
lasts one consumer ack wait past its last renewal: a dead driver's message is redelivered about then.

Every handler is the same loop (:meth:`Engine._handle`): read the run record and its checkpoint (not for a
``run.requested``: its record almost never exists, and creating it tells), ask
:func:`~temporality_run_executor.machine.decide` what to do with the incoming thing, perform the
effects in order (publish, ``Store.modify`` the record or checkpoint, arm or cancel the watchdog),
then perform the call it asks for (the provider, one tool) and decide on its result, until the machine
has nothing more to do. The driver decides nothing; it only chooses what to read afresh before a
decision (the record and checkpoint at every turn boundary, the record after a provider call: a
cancel or the watchdog may have moved it meanwhile -- but for a final reply, whose end's compare-and-set at the
revision the handler holds is that read: refused, the record is read and the reply decided again).

Tool calls go through the registry (:mod:`.tools`): the card's allow/deny policy, JSON-schema argument
validation (errors go back to the model), and a tool that raises becomes ``tool.failed`` plus a tool
error for the model, never a crashed run.

Every fact is published with a deterministic id *before* the state that records it is committed, so a
crash at any point is repaired by redelivery: the replay republishes the same ids (deduplicated) and
continues from the last checkpoint (AP-8), announcing it with ``run.resumed`` (reason ``recovery``).

Except the run's end: its terminal state is committed *first* (one compare-and-set, which a run already ended by
another handler -- the watchdog, a cancel, a racing driver -- refuses, so the loser publishes nothing), and only
then its terminal event, built from the committed record (the record is its outbox:
:class:`~temporality_run_executor.records.Ending`), with the run's deterministic id, in one pipelined batch with
the watchdog's disarm and the retention's arm; once they are acknowledged, one more compare-and-set marks the event
published on the record (best effort). So a run has one terminal event, and it is the one its record says. A driver
that dies between the end's compare-and-set and that mark leaves a finished record whose event may not be out: the
redelivery of its message (its handler never acked), the watchdog it may not have disarmed, or the dead-letter hook
meets the finished run and publishes the event from the record again, the same id
(:func:`~temporality_run_executor.machine.ending_event`; deduplicated when it did go out, within the events stream's
10-minute duplicate window), disarms the watchdog and marks the record. Once marked, nothing publishes it again: a
copy after the duplicate window would be stored twice.

No run is ever left behind:

* **dead-lettered** (:meth:`Engine.on_dead_letter`, the consumers' dead-letter hook): when the runner
  gives up on the message a run depends on -- deliveries used up by failures, or by a process that
  died every time it handled it (an OOM on one input: the delivery past the limit never runs the
  handler) -- the run fails with ``run.failed`` reason ``infrastructure_error`` before the message goes
  to the DLQ.
* **stalled** (:meth:`Engine.on_watchdog`, :mod:`.watchdog`): a durable timer per active run, re-armed
  at turn boundaries (every half horizon; a firing that meets progress re-arms it from that progress), fails a
  run that sat in ``running``/``resuming`` without progress past its compute limit plus a grace period (reason
  ``stalled``). A run waiting for a person has no watchdog. A handler of a message's first delivery holds its
  arm back until it has worked a third of its lease (:meth:`Engine._defer_arm`), with the deadline it had when
  decided, and drops it -- and the disarm -- when it parks or ends the run first (issue 6: two timer writes fewer
  per park and per resume); a process that dies or freezes meanwhile leaves its message to a redelivery, which
  recovers the run (only a run whose horizon is at least four leases defers: that comes long before the watchdog).

No finished run's checkpoint stays forever (:meth:`Engine.on_retention`, :mod:`.retention`): a durable timer
armed when the run ends removes it after ``checkpoint_retention_s``; the run record stays.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

import nats.errors
import structlog
from pydantic import ValidationError

from temporality_bus import (
    AlreadyExists,
    Bus,
    Conflict,
    Delivery,
    NotFound,
    PayloadTooLarge,
    PermanentError,
    PublishResult,
    Store,
    TransientError,
    Versioned,
)
from temporality_bus.pipeline import Write, event_write
from temporality_bus.tasks import cancel_and_wait
from temporality_protocol import (
    RUN,
    AgentAnswerReceived,
    AgentAskExpired,
    AgentAskUndeliverable,
    AgentMessageReceived,
    AgentReplyUndeliverable,
    AgentTaskActed,
    EncodedEvent,
    Envelope,
    EventData,
    HumanAnswered,
    HumanExpired,
    HumanRejected,
    LaunchSource,
    RunCancelRequested,
    RunRequested,
    RunState,
    encode_event,
    make_event,
    new_id,
)
from temporality_protocol.agent_tasks import turn_wait_id
from temporality_protocol.catalog import BUCKET_CANCEL_MARKERS, BUCKET_CHECKPOINTS, BUCKET_RUNS
from temporality_protocol.redaction import Redactor
from temporality_run_executor.agents import AgentCard, AgentDirectory
from temporality_run_executor.bounds import bounded_tool_result, cut, result_limit
from temporality_run_executor.external import ExternalAgents
from temporality_run_executor.machine import (
    ACTIVE,
    CONVERSATION_TOO_LARGE,
    AdoptCancelMarker,
    Agent,
    AgentActed,
    AgentLooked,
    AgentWorking,
    AnswerElicitation,
    ApplyParked,
    ApplyResult,
    ArmAgentDeadline,
    ArmRetention,
    ArmWatchdog,
    Attempt,
    Boundary,
    CallProvider,
    CallTool,
    CancelRequested,
    CreateCheckpoint,
    CreateRun,
    DeadLettered,
    Decision,
    DeliverMail,
    DisarmWatchdog,
    Effect,
    FlagCancel,
    Incoming,
    Invoke,
    KeepReply,
    LeaseHeld,
    LeaseLost,
    LookForAction,
    MarkCancel,
    MarkPublished,
    Note,
    ProviderFailed,
    ProviderReplied,
    Publish,
    QueueMail,
    RecordOutcome,
    Reject,
    RemoveCheckpoint,
    Requested,
    RetentionFired,
    Retry,
    RetryTool,
    RunMovedOn,
    SaveCheckpoint,
    TakeLease,
    TooLarge,
    ToolBroke,
    ToolElicited,
    ToolOutput,
    ToolRetried,
    ToolReturned,
    Transition,
    WatchdogFired,
    agent_news,
    apply_parked,
    apply_result,
    decide,
    delivered,
    elicitation_answered,
    event_id,
    flagged,
    human_outcome,
    leased,
    merge_mail,
    moved,
    published,
    queued,
    recorded,
    released,
    renewed,
    tool_error,
    turn_cause,
    with_reply,
)
from temporality_run_executor.providers import BudgetSpent, PermanentProviderError, Provider, ProviderError
from temporality_run_executor.records import CancelRequest, Checkpoint, Ending, RunRecord, Usage
from temporality_run_executor.retention import DEFAULT_RETENTION_S, CheckpointRetention, RetentionPayload
from temporality_run_executor.sampling import RunSampler
from temporality_run_executor.tools import (
    BUILTIN_TOOLS,
    ElicitationNeeded,
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
)
from temporality_run_executor.tools import Publish as Publish_
from temporality_run_executor.watchdog import DEFAULT_GRACE_S, REARM_AFTER, RunWatchdog, WatchdogPayload

__all__ = ["ACTIVE", "SOURCE", "Clock", "Engine", "ProviderFactory", "RunMovedOn"]

SOURCE = "/temporality/run-executor"
#: A run id the dead-letter hook fails a never-created run under (a KV key: the run record's).
_VALID_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=-]{0,199}")
#: A handler defers its run's watchdog arm only when the watchdog's horizon is at least this many leases
#: (:meth:`Engine._defer_arm`).
DEFER_HORIZON_LEASES = 4
_T = TypeVar("_T")
#: The longest tool error kept (a tool's own message, or how it broke): far below a tool result's bound.
_MAX_ERROR_BYTES = 16 * 1024
log = structlog.get_logger(__name__)
ProviderFactory = Callable[[AgentCard], Provider]
Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


#: Effects that write to the bus without committing any state: neighbours are performed at once.
_FIRED = (Publish, ArmWatchdog, ArmAgentDeadline, DisarmWatchdog, ArmRetention, Note)
#: Effects that change the run record: neighbours are one compare-and-set.
_RUN_CHANGES = (TakeLease, Transition)
#: Writes of the run's state that grow with its conversation: one the bus refuses as too large fails the run
#: (:class:`~.machine.TooLarge`) instead of its message being dead-lettered.
_STATE_WRITES = (
    SaveCheckpoint,
    CreateCheckpoint,
    KeepReply,
    ApplyResult,
    RecordOutcome,
    ApplyParked,
    QueueMail,
    DeliverMail,
    AnswerElicitation,
)


def _oversize(error: Exception) -> int | None:
    """The size of a write the bus refused as larger than the server's ``max_payload`` (0: unknown), else ``None``."""
    if isinstance(error, PayloadTooLarge):
        return error.size
    return 0 if isinstance(error, nats.errors.MaxPayloadError) else None


def _attempt(delivery: Delivery, max_deliver: int) -> Attempt:
    return Attempt(stream_seq=delivery.stream_seq, delivered=delivery.num_delivered, max_deliver=max_deliver)


@dataclass
class _View:
    """What one handler holds of its run between decisions: the record, the checkpoint (with its revision,
    the base of the turn's compare-and-set), and when the turn in flight began (monotonic)."""

    run_id: str
    run: RunRecord | None = None
    checkpoint: Versioned[Checkpoint] | None = None
    turn_started: float = 0.0
    #: ``run`` is what the store held at this handler's last read or write of it, and no call (provider,
    #: tool) ran since: nobody else had time to change it, so a turn boundary need not read it again.
    run_current: bool = False
    #: ``checkpoint`` is this handler's own last read or write. While a run is driven only its drivers
    #: write the checkpoint, and a racing one is caught by the turn's compare-and-set.
    checkpoint_current: bool = False
    #: This handler's name as a lease holder.
    holder: str = ""
    #: ``run`` was not read again after a call (a final reply's, :meth:`Engine._refresh`): the decision on it is
    #: made on what the handler holds, and its first write of the record is a compare-and-set at ``run_revision``
    #: that proves it current -- or, refused, the record is read and the same step decided again
    #: (:class:`_Unverified`).
    run_unverified: bool = False
    #: The store revision ``run`` was read or written at (0: unknown): the base of the next compare-and-set,
    #: which then needs no read (``Store.modify(known=...)``; a stale one only loses the race and reads).
    run_revision: int = 0
    #: The turn this handler last armed the run's watchdog for, and when (monotonic): an arm less than
    #: :data:`~.watchdog.REARM_AFTER` of its horizon later (the next turns' boundaries) is skipped.
    armed: tuple[int, float] | None = None
    #: This handler may defer its watchdog arms (a message's first delivery, not its last: see
    #: :meth:`Engine._defer_arm`).
    may_defer: bool = False
    #: The watchdog arm decided and not sent yet (its ``since`` set to when it was decided), sent when the handler
    #: has worked :attr:`Engine.watchdog_defer_s` (:attr:`deferral`) or ends with the run still driven, dropped when
    #: the run parks or ends first (its disarm then dropped too: nothing of this handler's was armed).
    deferred: ArmWatchdog | None = None
    deferral: asyncio.TimerHandle | None = None
    #: This handler sent a watchdog arm (or an external agent's deadline) for the run: a disarm must go out.
    watchdog_sent: bool = False
    #: Bus writes that commit no state (events, timers) sent and not yet acknowledged, in the order they were
    #: sent, each with the crash seam it passes once stored: awaited together before the next state is
    #: committed and before the handler returns (:meth:`Engine._settle`), not one by one as they are sent.
    unacked: list[tuple[asyncio.Task[object], str | None]] = field(default_factory=list)

    def known_run(self) -> Versioned[RunRecord] | None:
        return Versioned(self.run, self.run_revision) if self.run is not None and self.run_revision else None

    def hold_run(self, record: Versioned[RunRecord] | None) -> None:
        """``record`` is what the store holds now (just read or written by this handler)."""
        self.run, self.run_revision = (record.value, record.revision) if record is not None else (None, 0)
        self.run_current, self.run_unverified = True, False

    @property
    def ckpt(self) -> Checkpoint | None:
        return self.checkpoint.value if self.checkpoint is not None else None


class _Unverified(Exception):
    """The record a decision was made on without reading it after a call (:attr:`_View.run_unverified`) is not
    what the store holds (its compare-and-set refused, or the decision's change does not apply to it), or the
    decision wants a write other than the record's first: read it and decide the same step again."""


def _cancelled_meanwhile() -> None:
    """Raise ``CancelledError`` when the running task was cancelled during a wait that returned anyway.

    A bus request can swallow one cancellation that lands just as its reply does (``asyncio.wait_for`` on
    Python 3.11; see ``temporality_bus.tasks``). ``asyncio.gather`` remembers it was cancelled and raises regardless;
    a wait awaited directly (the driver's single read or batch, no gather) must check, or a cancelled handler
    would go on to its next decision (a provider call, say)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class Engine:
    def __init__(
        self,
        bus: Bus,
        runs: Store[RunRecord],
        checkpoints: Store[Checkpoint],
        agents: AgentDirectory,
        provider_for: ProviderFactory,
        *,
        max_deliver: int,
        markers: Store[CancelRequest],
        watchdog_grace_s: float = DEFAULT_GRACE_S,
        tools: ToolRegistry | None = None,
        card_tools: Mapping[str, list[Tool]] | None = None,
        clock: Clock = _now,
        lease_s: float | None = None,
        checkpoint_retention_s: float = DEFAULT_RETENTION_S,
        redactor: Redactor | None = None,
        watchdog_defer_s: float | None = None,
    ) -> None:
        self.bus = bus
        self.tools = tools if tools is not None else ToolRegistry(BUILTIN_TOOLS)
        #: Tools only some cards have (their MCP servers'), by agent id.
        self._registries = {agent: self.tools.with_tools(extra) for agent, extra in (card_tools or {}).items()}
        self.runs = runs
        self.checkpoints = checkpoints
        #: Cancels for runs not created yet (key: run id; the bucket's TTL bounds how long one waits).
        self.markers = markers
        self.agents = agents
        #: :meth:`agent`'s, by card name, with the directory each was built from.
        self._agents: dict[str, tuple[AgentDirectory, Agent]] = {}
        self.provider_for = provider_for
        self.max_deliver = max_deliver
        self.watchdog = RunWatchdog(bus, grace_s=watchdog_grace_s)
        #: Removes finished runs' checkpoints after ``checkpoint_retention_s`` (:mod:`.retention`).
        self.retention = CheckpointRetention(bus, retention_s=checkpoint_retention_s)
        self.clock = clock
        #: The deployment's redaction patterns (SEC-1, from the settings): every question and notification a
        #: person will read passes through them before it is published.
        self.redactor = redactor if redactor is not None else Redactor()
        #: How long a handler's lease on a run lasts past its last renewal: one ack wait, after which a
        #: dead driver's message comes back (a live one's never does: the runner extends it).
        self.lease_s = lease_s if lease_s is not None else bus.settings.ack_wait_s
        #: How long a handler works on a run before the watchdog arm it decided is sent (:meth:`_defer_arm`;
        #: 0: at once). A third of the lease by default: when its keeper first renews it.
        self.watchdog_defer_s = watchdog_defer_s if watchdog_defer_s is not None else self.lease_s / 3
        #: This engine's name in lease holders (``<name>/<handler>``).
        self.name = new_id("drv")
        #: TEST SEAM, for the crash-injection tests only (``tests/test_crash_matrix.py``); never set in the
        #: service. Awaited at each named point of the driver (:meth:`_seam`), so a test can stop the
        #: "process" exactly there: ``effect:<Effect>`` (``effect:Transition:<state>``) after an effect is
        #: committed, ``published:<event type>`` after an event is stored, ``provider_replied`` /
        #: ``tool_returned`` after a call came back (its result not stored yet), ``decided:<Incoming>`` once the
        #: machine decided on a step (before any of its effects; ``decided:ProviderReplied:raw`` on a reply straight
        #: from the provider, before it is kept), ``handled:<Incoming>`` when a handler is done (before its message
        #: is acked).
        self.crash_point: Callable[[str], Awaitable[None]] | None = None
        #: Runs whose card's provider is an external agent (AP-5): their turns go to the agent instead.
        self.external = ExternalAgents(bus, self._emit)

    @classmethod
    async def open(
        cls,
        bus: Bus,
        agents: AgentDirectory,
        provider_for: ProviderFactory,
        *,
        max_deliver: int,
        watchdog_grace_s: float = DEFAULT_GRACE_S,
        tools: ToolRegistry | None = None,
        card_tools: Mapping[str, list[Tool]] | None = None,
        clock: Clock = _now,
        lease_s: float | None = None,
        checkpoint_retention_s: float = DEFAULT_RETENTION_S,
        redactor: Redactor | None = None,
        watchdog_defer_s: float | None = None,
    ) -> Engine:
        await bus.pipeline.open()  # the fired writes' batches (:meth:`_fire`) leave at once from the first one
        return cls(
            bus,
            await bus.store(BUCKET_RUNS, RunRecord),
            await bus.store(BUCKET_CHECKPOINTS, Checkpoint),
            agents,
            provider_for,
            max_deliver=max_deliver,
            markers=await bus.store(BUCKET_CANCEL_MARKERS, CancelRequest),
            watchdog_grace_s=watchdog_grace_s,
            tools=tools,
            card_tools=card_tools,
            clock=clock,
            lease_s=lease_s,
            checkpoint_retention_s=checkpoint_retention_s,
            redactor=redactor,
            watchdog_defer_s=watchdog_defer_s,
        )

    def set_card_tools(self, card_id: str, tools: list[Tool]) -> None:
        """The card's extra tools are ``tools`` from now on (its MCP server listed after the start): its next decision
        offers and resolves them."""
        self._registries[card_id] = self.tools.with_tools(tools)
        self._agents.pop(card_id, None)

    def registry(self, card: AgentCard) -> ToolRegistry:
        """The tools ``card`` can be offered: the executor's, plus its MCP servers'."""
        return self._registries.get(card.id, self.tools)

    def agent(self, name: str) -> Agent | None:
        """The card ``name`` with its tools (``None``: no such card): built once per card of the directory (at every
        decision before: the set of every card's id with it), again when the directory or the card is another."""
        card = self.agents.get(name)
        if card is None:
            return None
        known = self._agents.get(name)
        if known is not None and known[0] is self.agents and known[1].card is card:
            return known[1]
        agent = Agent(
            card,
            self.registry(card),
            hosted=frozenset(c.id for c in self.agents.cards()),
            result_bytes=result_limit(self.bus.nc.max_payload),  # the record holding it must fit on the bus
        )
        self._agents[name] = (self.agents, agent)
        return agent

    # ------------------------------------------------------------------ handlers
    async def on_run_requested(self, event: Envelope, delivery: Delivery) -> None:
        req = event.payload(RunRequested)
        structlog.contextvars.bind_contextvars(run_id=req.run_id)
        incoming = Requested(
            request=req, correlation_id=event.correlationid or req.run_id, tenant=event.tenant, event_id=event.id
        )
        await self._handle(req.run_id, incoming, _attempt(delivery, self.max_deliver))

    async def on_human_event(self, event: Envelope, delivery: Delivery) -> None:
        """The ``run-executor-human`` consumer: the outcomes of the runs' human requests, and cancels."""
        data = event.payload()
        incoming: Incoming
        if isinstance(data, RunCancelRequested):
            structlog.contextvars.bind_contextvars(run_id=data.run_id)
            incoming = CancelRequested(
                run_id=data.run_id, reason=data.reason, requested_by=data.requested_by, event_id=event.id
            )
        elif isinstance(data, HumanAnswered | HumanExpired | HumanRejected):
            structlog.contextvars.bind_contextvars(run_id=data.run_id, request_id=data.request_id)
            incoming = human_outcome(event.type, event.id, data)
        else:
            raise PermanentError(f"run-executor does not handle {event.type}")
        await self._handle(data.run_id, incoming, _attempt(delivery, self.max_deliver))

    async def on_agent_event(self, event: Envelope, delivery: Delivery) -> None:
        """The ``run-executor-agents`` consumer: agent-collab's ``agent.*`` events for the runs (COL-2..COL-4)."""
        data = event.payload()
        if isinstance(data, AgentTaskActed):  # an external agent acted: wake its run parked on the turn (AP-5)
            acted = AgentActed(run_id=data.run_id, task_id=data.task_id, turn=data.turn, event_id=event.id)
            with structlog.contextvars.bound_contextvars(run_id=data.run_id, task_id=data.task_id, turn=data.turn):
                await self._handle(data.run_id, acted, _attempt(delivery, self.max_deliver))
            return
        if not isinstance(
            data,
            AgentMessageReceived
            | AgentAnswerReceived
            | AgentAskExpired
            | AgentAskUndeliverable
            | AgentReplyUndeliverable,
        ):
            raise PermanentError(f"run-executor does not handle {event.type}")
        incoming = agent_news(event.type, event.id, data)
        with structlog.contextvars.bound_contextvars(run_id=incoming.run_id, request_id=data.request_id):
            await self._handle(incoming.run_id, incoming, _attempt(delivery, self.max_deliver))

    async def on_dead_letter(self, message: Envelope | bytes, delivery: Delivery, error: BaseException) -> None:
        """The dead-letter hook of both run consumers: a run whose message is given up on fails visibly.

        Whatever the reason (failures used up the deliveries, a process died every time it handled the
        message so the delivery past the limit never ran the handler, a permanent error), the run the
        message drives moves to ``failed`` with ``run.failed`` reason ``infrastructure_error``: committed
        first, then published with the run's deterministic failure id (a repeat is deduplicated). A run
        already finished, one waiting for a person, or one another message drives (a stale duplicate,
        an answer to an older request) is left alone (:func:`~temporality_run_executor.machine.drives`), but for
        a finished run's terminal event, published again from its record while the record does not mark it
        published (its ender may have died before the publish: :func:`~temporality_run_executor.machine._ended`).
        Idempotent: the consumer runs it again whenever the dead-lettering has to be retried.
        """
        if isinstance(message, bytes):
            return  # not an envelope: it names no run
        run_id = message.runid or message.data.get("run_id")
        if not isinstance(run_id, str):
            return
        request_id = message.data.get("request_id")
        task_id, turn = message.data.get("task_id"), message.data.get("turn")
        if message.type == AgentTaskActed.EVENT_TYPE and isinstance(task_id, str) and isinstance(turn, int):
            request_id = turn_wait_id(task_id, turn)  # what a run parked on that action waits on
        incoming = DeadLettered(
            event_type=message.type,
            event_id=message.id,
            request_id=request_id if isinstance(request_id, str) else None,
            deliveries=delivery.num_delivered,
            error=f"{type(error).__name__}: {error}",
            lost_race=isinstance(error, Conflict | LeaseHeld),
        )
        with structlog.contextvars.bound_contextvars(run_id=run_id):
            await self._handle(run_id, incoming, _attempt(delivery, self.max_deliver))
            if message.type == RunRequested.EVENT_TYPE and not incoming.lost_race:
                await self._fail_never_created(message, incoming, _attempt(delivery, self.max_deliver))

    async def _fail_never_created(self, message: Envelope, incoming: DeadLettered, attempt: Attempt) -> None:
        """A ``run.requested`` given up on before it created the run (its data invalid, say): the journal shows the
        run ``pending`` from the request alone, so without this it stayed pending for ever.

        The run store decides, as for any run: the hook creates the run's record already ``failed``
        (``infrastructure_error``, :attr:`~.records.RunRecord.never_started`) with the same create-if-absent the
        request's handler uses (:class:`~.machine.CreateRun`), and only when that create wins is ``run.failed``
        published -- from the record, by the machine, as every end is (:func:`~.machine._ended`: the record is its
        outbox, marked published once acknowledged; a retried hook publishes it again until then). When the create
        loses, the request's handler made the record first (the last delivery still running on another replica, say)
        and the machine decided above: nothing is published here. A later copy of the request (``temporality dlq
        redrive``, that slower replica) then finds the record finished and starts nothing (:func:`~.machine._requested`).

        The event has the run's standard failure id (``event_id(run_id, "run.failed")``): one record per run id, so
        the hook's failure and a failure of the run itself cannot both exist -- whichever record the create let in
        is the only one that ends, once."""
        run_id = message.runid
        if not isinstance(run_id, str) or not _VALID_RUN_ID.fullmatch(run_id):
            return
        error = (
            f"{incoming.event_type} {incoming.event_id} dead-lettered after {incoming.deliveries} deliveries before "
            f"the run was created: {incoming.error}"
        )
        error = cut(error, 2_000)
        data = message.data if isinstance(message.data, dict) else {}
        try:
            launch = LaunchSource.model_validate(data.get("launch"))
        except ValidationError:
            launch = LaunchSource(kind="api")
        now = self.clock()
        record = RunRecord(
            run_id=run_id,
            state=RunState.FAILED,
            agent=data["agent"] if isinstance(data.get("agent"), str) else "",
            title=data["title"] if isinstance(data.get("title"), str) else "",
            launch=launch,
            correlation_id=message.correlationid or run_id,
            tenant=message.tenant,
            created_at=now,
            updated_at=now,
            error=f"infrastructure_error: {error}",
            ending=Ending(reason="infrastructure_error", causation=message.id),
            requested_event=message.id,
            never_started=True,
        )
        try:
            await self.runs.create(run_id, record, validated=True)
        except AlreadyExists:
            return  # made first (by the request's handler, or this hook before): the machine decided above
        log.warning("run.dead_letter.never_created_failed", error=error)
        # the end of the record just written, published by the machine as for any finished run (_ended)
        await self._handle(run_id, incoming, attempt)

    async def on_watchdog(self, data: bytes, delivery: Delivery) -> None:
        """A run's watchdog fired (the raw handler of ``run-executor-watchdog``); see :mod:`.watchdog`."""
        try:
            payload = WatchdogPayload.model_validate_json(data)
        except ValidationError as exc:
            raise PermanentError(f"unreadable watchdog payload: {exc}") from exc
        with structlog.contextvars.bound_contextvars(run_id=payload.run_id):
            incoming = WatchdogFired(payload=payload, grace_s=self.watchdog.grace_s)
            await self._handle(payload.run_id, incoming, _attempt(delivery, self.max_deliver))

    async def on_retention(self, data: bytes, delivery: Delivery) -> None:
        """A finished run's checkpoint retention ended (the raw handler of ``run-executor-retention``); see
        :mod:`.retention`."""
        try:
            payload = RetentionPayload.model_validate_json(data)
        except ValidationError as exc:
            raise PermanentError(f"unreadable retention payload: {exc}") from exc
        with structlog.contextvars.bound_contextvars(run_id=payload.run_id):
            await self._handle(payload.run_id, RetentionFired(payload), _attempt(delivery, self.max_deliver))

    # ------------------------------------------------------------------ the loop
    async def _handle(self, run_id: str, incoming: Incoming, attempt: Attempt) -> None:
        """Decide, perform, repeat, until the machine has nothing more to do.

        Work another driver made stale (:class:`RunMovedOn`) ends quietly; anything else goes to the
        consumer runner, which retries it and, when it gives up, calls :meth:`on_dead_letter`.
        """
        attempt = replace(attempt, driver=f"{self.name}/{new_id('h')}", lease_s=self.lease_s)
        view = _View(run_id, holder=attempt.driver, may_defer=not attempt.redelivered and not attempt.last)
        try:
            try:
                await self._drive(view, incoming, attempt)
            except LeaseHeld:
                # another handler holds the run: if it is alive it renews its lease (then we give the
                # message back); if it died, its lease runs out and this delivery recovers the run now
                # rather than spending the deliveries left on retries
                if not await self._lease_lapses(view.run_id):
                    raise
                await self._drive(view, incoming, attempt)
            await self._seam("handled", type(incoming).__name__)
        except RunMovedOn as moved_on:
            self._drop_deferred(view)  # another handler drives or ended the run: its watchdog is that one's
            log.warning("run.moved_on", detail=str(moved_on))
        except LeaseLost as lost:
            self._drop_deferred(view)
            log.warning("run.lease.lost", detail=str(lost))
        finally:
            if view.deferred is not None:  # failed with the run driven: armed as it would have been at once
                self._send_deferred(view)
            await self._abandon(view)  # a handler that failed: what it sent is left to the redelivery
            await self._release(view, attempt.driver)

    async def _drive(self, view: _View, incoming: Incoming, attempt: Attempt) -> None:
        view.checkpoint, view.checkpoint_current = None, False
        if isinstance(incoming, Requested) and not incoming.marker_checked:
            # A run's first message: its record almost never exists yet, so nothing is read first. The machine
            # decides on "no record" -- to create it -- and the create itself tells: written (a new run: one
            # round trip fewer before run.started), or the record exists and is read then, with the checkpoint
            # when the run is past pending (CreateRun's effect), before anything else is decided.
            view.run, view.run_revision, view.run_current = None, 0, False
        else:
            # both read at once (one round trip): the checkpoint is wanted whenever the run is past pending (its read
            # a task sent alongside the record's, which is awaited as it is: one task, no gather)
            reading = asyncio.ensure_future(self.checkpoints.get(view.run_id))
            try:
                record = await self.runs.get(view.run_id)
            except BaseException:  # (cancelled too: as a gather's children are)
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)  # no read outlives its handler
                raise
            checkpoint = await reading
            _cancelled_meanwhile()
            view.hold_run(record)
            if view.run is not None and view.run.state is not RunState.PENDING:  # a pending run has none yet
                view.checkpoint, view.checkpoint_current = checkpoint, True
        step: Incoming | None = incoming
        while step is not None:
            await self._refresh(view, step)
            # a run.requested's card before its record exists: a known agent's run is created running
            name = (
                view.run.agent if view.run is not None else step.request.agent if isinstance(step, Requested) else None
            )
            agent = self.agent(name) if name is not None else None
            decision = decide(
                view.run, view.ckpt, agent, step, now=self.clock(), attempt=attempt, redactor=self.redactor
            )
            if self.crash_point is not None:  # (a reply straight from the provider: ``decided:ProviderReplied:raw``)
                raw = ("raw",) if isinstance(step, ProviderReplied) and step.raw else ()
                await self._seam("decided", type(step).__name__, *raw)
            try:
                step = await self._perform(view, agent, decision)
            except _Unverified:
                # the record moved while the call ran (a cancel recorded, the watchdog, another driver): what the
                # read after the call would have shown, decided on now (the events fired before are the same ids)
                await self._read_run(view)
        self._send_deferred(view)  # the handler is done with a run still driven (e.g. the watchdog's re-arm)
        await self._settle(view)  # everything sent is stored before the message is acked

    async def _lease_lapses(self, run_id: str) -> bool:
        """Watch another handler's lease on the run until it expires (``True``: decide again) or is renewed,
        taken or dropped (``False`` for a renewal: its holder is alive, the message goes back; ``True``
        otherwise). Bounded by one lease length (plus a little); polls, like the router's catch-up waits."""
        first = await self.runs.get(run_id)
        lease = first.value.lease if first is not None else None
        if lease is None:
            return True
        deadline = time.monotonic() + self.lease_s + 1.0
        while time.monotonic() < deadline:
            if self.clock() >= lease.expires_at:
                return True
            await asyncio.sleep(min(0.1, self.lease_s / 10))
            now = await self.runs.get(run_id)
            seen = now.value.lease if now is not None else None
            if seen != lease:
                alive = seen is not None and seen.holder == lease.holder
                return not alive
        return False

    async def _release(self, view: _View, holder: str) -> None:
        """A handler that stops while it holds the run's lease (it failed, or gave its message back) lets go
        of it, so the redelivery drives at once; only a driver that died leaves its lease to expire."""
        run = view.run
        if run is None or run.lease is None or run.lease.holder != holder:
            return
        try:
            await self.runs.modify(view.run_id, lambda r: released(r, holder), known=view.known_run(), validated=True)
        except Exception as exc:  # the bus is failing: the lease expires on its own
            log.warning("run.lease.release_failed", error=f"{type(exc).__name__}: {exc}")

    async def _refresh(self, view: _View, step: Incoming) -> None:
        """Read afresh what the decision on ``step`` must see and this handler does not hold current: at a
        turn boundary the record (a cancel recorded meanwhile) and the checkpoint; after the provider the
        record (the watchdog may have failed the run while the turn ran; a cancel ended an external agent's turn)."""
        reads: list[Awaitable[None]] = []
        if isinstance(step, ProviderReplied) and step.raw:
            pass  # the machine keeps the reply on the record first (KeepReply: that write is the read), or asks again
        elif self._final(view, step):
            view.run_unverified = True  # the end's compare-and-set is the read (see :meth:`_final`)
        elif (
            isinstance(step, Boundary | ProviderReplied | ProviderFailed | AgentWorking | AgentLooked)
            and not view.run_current
        ):
            reads.append(self._read_run(view))
        if isinstance(step, Boundary) and not view.checkpoint_current:
            reads.append(self._read_checkpoint(view))
        if len(reads) == 1:  # most often (the record after a call): awaited as it is, no task, no gather
            await reads[0]
            _cancelled_meanwhile()
        elif reads:
            await asyncio.gather(*reads)

    def _final(self, view: _View, step: Incoming) -> bool:
        """Whether the record need not be read after the provider call whose reply ``step`` is: a hosted agent's
        last reply (no tool calls), whose decision runs nothing outside the run before its first write, the end's
        compare-and-set on the record. That write, at the revision the handler holds, proves the record unchanged
        since (then the decision was made on what is stored, as after a read), or is refused and the step is
        decided again on a fresh read (:class:`_Unverified`): one read and one round trip less per run's end (issue
        6). The turn's ``run.streamed`` is fired before that write, as after a read: on a run that moved on meanwhile
        (the watchdog failed it) it still goes out -- the metrics of a call that was made -- where a read would
        have dropped them."""
        if not isinstance(step, ProviderReplied) or view.run_current or view.run is None or not view.run_revision:
            return False
        if step.reply.tool_calls or step.replayed:
            return False
        agent = self.agent(view.run.agent)
        return agent is not None and agent.card.provider.kind != "external"

    async def _verified_change(self, view: _View, effects: Sequence[Effect]) -> None:
        """:meth:`_change_run` on a record not read since the call (:attr:`_View.run_unverified`): one
        compare-and-set at the held revision, without :meth:`Store.modify`'s read and retry -- any refusal raises
        :class:`_Unverified` and the step is decided again on the record as it is."""
        run = view.run
        assert run is not None
        now = self.clock()
        current = run
        try:
            for effect in effects:
                if isinstance(effect, TakeLease):
                    nxt = leased(current, effect.lease, now)
                else:
                    assert isinstance(effect, Transition)
                    nxt = moved(current, effect.target, effect.changes, now, waiting_on=effect.waiting_on)
                current = nxt if nxt is not None else current
        except (LeaseHeld, RunMovedOn):
            raise _Unverified from None
        if current is run:
            raise _Unverified
        try:
            revision = await self.runs.update(view.run_id, current, view.run_revision, validated=True)
        except Conflict:
            raise _Unverified from None
        moves = [e.target for e in effects if isinstance(e, Transition)]
        if moves:
            log.info("run.state", state=moves[-1].value)
        view.hold_run(Versioned(current, revision))

    async def _read_run(self, view: _View) -> None:
        """The record afresh. From what the handler holds (its last read or write of it, e.g. the move to
        ``running`` before a provider call), unless the store holds another since: the same one read, the
        stored record neither decoded nor validated again when it is still that one (:meth:`Store.current`)."""
        known = view.known_run()
        current = await (self.runs.current(view.run_id, known) if known is not None else self.runs.get(view.run_id))
        if current is None:
            raise TransientError(f"run {view.run_id} vanished")
        view.hold_run(current)

    async def _read_checkpoint(self, view: _View) -> None:
        view.checkpoint, view.checkpoint_current = await self.checkpoints.get(view.run_id), True

    async def _perform(self, view: _View, agent: Agent | None, decision: Decision) -> Incoming | None:
        """The decision's effects in order, then its call, whose result is the next incoming.

        Two kinds of neighbours are performed together, each group in one round trip and all of it done
        before the next effect begins (so the order that crash-exactness rests on -- a fact stored before
        the state that records it, the state committed before the message is acked -- is kept):

        * consecutive bus writes that commit no state -- events (:class:`Publish`) and the run's timers
          (:class:`ArmWatchdog`, :class:`DisarmWatchdog`, :class:`ArmRetention`) -- concurrently;
        * consecutive changes of the run record (:class:`TakeLease`, :class:`Transition`) as one
          compare-and-set (:meth:`_change_run`): both or neither are written.
        """
        effects = decision.effects
        i = 0
        while i < len(effects):
            j = i + 1
            if isinstance(effects[i], _FIRED):
                while j < len(effects) and isinstance(effects[j], _FIRED):
                    j += 1
                self._fire(view, effects[i:j])
                i = j
                continue  # acknowledged later, together (their seams pass then: :meth:`_settle`)
            if not self._overlaps(view, effects[i]):
                await self._settle(view)  # a fact is stored before the state that records it is committed
            elif view.unacked:
                await asyncio.sleep(0)  # the fired writes' task sends first: run.resumed leaves before the checkpoint
            if isinstance(effects[i], _RUN_CHANGES):
                while j < len(effects) and isinstance(effects[j], _RUN_CHANGES):
                    j += 1
                try:
                    if view.run_unverified:
                        await self._verified_change(view, effects[i:j])
                    else:
                        await self._change_run(view, effects[i:j])
                except (PermanentError, nats.errors.MaxPayloadError) as exc:
                    too_large = self._record_too_large(effects[i:j], exc)
                    if too_large is None:
                        raise
                    return too_large  # the run fails, saying so (as a state write too large, below)
            elif view.run_unverified:
                raise _Unverified  # a write before the record's: decided on the record as it is
            else:
                try:
                    await self._effect(view, effects[i])
                except (PermanentError, nats.errors.MaxPayloadError) as exc:
                    too_large = self._too_large(view, effects[i], exc)
                    if too_large is None:
                        raise
                    return too_large  # the run fails, saying so (the decision's other effects are not made)
            if self.crash_point is not None:
                for effect in effects[i:j]:
                    target = (effect.target.value,) if isinstance(effect, Transition) else ()
                    await self._seam("effect", type(effect).__name__, *target)
            i = j
        then = decision.then
        if isinstance(then, CallProvider | CallTool | RetryTool):
            await self._on_the_wire(view)
        if isinstance(then, CallProvider):
            assert agent is not None
            view.run_current = False
            replied = await self._leased(view, self._call_provider(view, agent, then))
            await self._seam("provider_replied")
            return replied
        if isinstance(then, CallTool):
            view.run_current = False
            returned = await self._leased(view, self._call_tool(view, then))
            await self._seam("tool_returned")
            return returned
        if isinstance(then, RetryTool):
            view.run_current = False
            retried = await self._leased(view, self._retry_tool(view, then))
            await self._seam("tool_retried")
            return retried
        if isinstance(then, ProviderReplied) and then.replayed:  # a kept reply carried out: its provider time counts
            view.turn_started = time.monotonic() - then.elapsed_s
        if isinstance(then, LookForAction):  # a parked run: nobody else drives it, its record stays current
            assert agent is not None
            assert view.run is not None
            looked = replace(await self.external.look(view.run, agent, then), cause=then.cause)
            # at the budget's end the run may fail: decided on its record read afresh (a cancel recorded meanwhile);
            # a wake-up needs no read (its compare-and-set is guarded by the wait)
            view.run_current = not then.deadline
            if isinstance(looked.outcome, ProviderReplied):  # the turn's compute so far: the agent's time
                view.turn_started = time.monotonic() - looked.outcome.elapsed_s
            await self._seam("agent_looked")
            return looked
        return then

    def _too_large(self, view: _View, effect: Effect, error: Exception) -> TooLarge | None:
        """What a write of the run's state that the bus refused as larger than its ``max_payload`` (read from the
        connection) means for the run; ``None``: another failure, or not such a write."""
        if not isinstance(effect, _STATE_WRITES):
            return None
        size = _oversize(error)
        if size is None:
            return None
        saved = effect.checkpoint if isinstance(effect, SaveCheckpoint | CreateCheckpoint) else None
        if not size and saved is not None:
            size = len(saved.model_dump_json().encode())
        what: Literal["conversation", "reply"] = "reply" if isinstance(effect, KeepReply) else "conversation"
        log.error("run.too_large", what=what, size=size, max_payload=self.bus.nc.max_payload)
        return TooLarge(what=what, size=size, limit=self.bus.nc.max_payload, checkpoint=saved)

    def _record_too_large(self, effects: Sequence[Effect], error: Exception) -> TooLarge | None:
        """What a change of the run record that the bus refused as larger than its ``max_payload`` means: the run
        fails ``conversation_too_large`` -- unless that failure is what did not fit (then ``None``: the error
        stands, as for any other write)."""
        size = _oversize(error)
        if size is None:
            return None
        for effect in effects:
            ending = effect.changes.get("ending") if isinstance(effect, Transition) else None
            if isinstance(ending, Ending) and ending.reason == CONVERSATION_TOO_LARGE:
                return None
        log.error("run.too_large", what="record", size=size, max_payload=self.bus.nc.max_payload)
        return TooLarge(what="record", size=size, limit=self.bus.nc.max_payload)

    @staticmethod
    def _overlaps(view: _View, effect: Effect) -> bool:
        """Whether ``effect`` may be written while the writes sent before it are still unacknowledged. Two
        checkpoint writes that record none of those writes, whose run record (which does record them) moves
        on only after they are acknowledged -- so until then any redelivery decides the same again and sends
        them again (the same ids), the checkpoint write then a no-op. One round trip for both instead of one
        after the other:

        * a person's answer applied to the checkpoint of a run whose record still says it waits for it
          (``run.resumed`` and the watchdog sent before it);
        * a run's first checkpoint (``run.created``, the watchdog at turn 0 and ``run.started`` sent before it; a
          watchdog firing before the checkpoint exists reads turn 0 too). A new run's record is created
          ``running`` with its handler's lease (:func:`~.machine.started_record`), and until its checkpoint
          exists a redelivery starts it again the same way (the same ids); once it exists, a redelivery recovers
          the run and sends them again. Turn 1's commit waits for all of them (issue 11: ``run.started`` leaves
          with ``run.created``, two sequential round trips after the message instead of four). A record created
          ``pending`` (an unknown card; an executor before 6 December) moves to ``running`` after all three.
        """
        if isinstance(effect, CreateCheckpoint):  # a run's first: pending, or created running (not started yet)
            return view.run is not None and view.run.state in (RunState.PENDING, RunState.RUNNING)
        if isinstance(effect, KeepReply):  # records none of them (a recovery sends them again, the same ids)
            return True
        return (
            isinstance(effect, ApplyResult)
            and view.run is not None
            and view.run.state is RunState.WAITING_FOR_HUMAN
            and view.run.waiting_request_id == effect.request_id
        )

    async def _seam(self, *point: str) -> None:
        """The test seam (:attr:`crash_point`) at ``point``; nothing at all in the service."""
        if self.crash_point is not None:
            await self.crash_point(":".join(point))

    async def _leased(self, view: _View, call: Awaitable[_T]) -> _T:
        """``call`` (a provider or tool call), the handler's lease on the run kept fresh meanwhile: renewed
        every third of its duration, as the consumer runner extends the message's ack wait. A turn longer
        than the lease never lets a redelivery take over a live driver; a dead driver's lease runs out
        about when its message comes back."""
        run = view.run
        if run is None or run.lease is None or run.lease.holder != view.holder:
            return await call
        # The keeper's task starts at the first renewal (a third of the lease in), not with the call: most calls
        # (a scripted turn, a quick tool) are over long before, and a task per call, cancelled and awaited, cost
        # more CPU than the call. The renewals come when they came (every third of the lease from the call's start).
        keeper: list[asyncio.Task[None]] = []
        run_id, holder = view.run_id, view.holder
        timer = asyncio.get_running_loop().call_later(
            self.lease_s / 3, lambda: keeper.append(asyncio.create_task(self._keep_lease(run_id, holder)))
        )
        try:
            return await call
        finally:
            timer.cancel()
            if keeper:
                await cancel_and_wait(keeper[0])  # a renewal's request can drop one cancellation (bus.tasks)

    def _expiry(self) -> datetime:
        return self.clock() + timedelta(seconds=self.lease_s)

    async def _keep_lease(self, run_id: str, holder: str) -> None:
        """Renew ``holder``'s lease now, then every third of its duration (started a third of it into a call)."""
        while True:
            try:
                await self.runs.modify(
                    run_id, functools.partial(renewed, holder=holder, expires_at=self._expiry()), validated=True
                )
            except Exception as exc:  # the bus is failing: the next boundary (or the expiry) settles it
                log.warning("run.lease.renew_failed", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self.lease_s / 3)  # an interval, not a deadline (like the runner's in_progress)

    def _fire(self, view: _View, effects: Sequence[Effect]) -> None:
        """Bus writes that commit no state (events, timers): sent at once, in order, their acknowledgements
        awaited later and together (:meth:`_settle`), so a provider or tool call, a read, or the next writes
        go on meanwhile (see :meth:`_perform`)."""
        writes: list[tuple[Write, bool]] = []
        seams: list[str | None] = []
        for effect in effects:
            if isinstance(effect, Note):
                getattr(log, effect.level)(effect.event, **effect.fields)
                continue
            if isinstance(effect, ArmWatchdog):
                armed = view.armed
                horizon_s = effect.limit_s + self.watchdog.grace_s
                if armed is not None and time.monotonic() - armed[1] < horizon_s * REARM_AFTER:
                    continue  # this handler armed it less than half a horizon ago (see .watchdog: re-arming)
                view.armed = (effect.turn, time.monotonic())
                if self._defer_arm(view, effect):
                    continue
                view.watchdog_sent = True
            elif isinstance(effect, DisarmWatchdog) and view.deferred is not None and not view.watchdog_sent:
                # parked or ended before this handler's arm went out: nothing of its was armed, nothing to disarm
                self._drop_deferred(view)
                view.armed = None
                continue
            elif isinstance(effect, ArmAgentDeadline | DisarmWatchdog):
                self._drop_deferred(view)  # (the deadline replaces the watchdog)
                view.watchdog_sent = isinstance(effect, ArmAgentDeadline)
                view.armed = None  # the watchdog is replaced or off: the next arm is never skipped
            seam = f"published:{effect.data.EVENT_TYPE}" if isinstance(effect, Publish) else None
            if seam is None and self.crash_point is not None:
                seam = f"effect:{type(effect).__name__}"
            writes.append((self._write(view, effect), isinstance(effect, DisarmWatchdog)))
            seams.append(seam)
        if writes:
            # one batch (:meth:`Pipeline.send`: one buffer, one acknowledgement wait); a task starts in creation
            # order and sends before its first wait: the writes leave in this order, after earlier batches
            sent = asyncio.create_task(self._send(writes))
            view.unacked.extend((sent, seam) for seam in seams)

    def _defer_arm(self, view: _View, effect: ArmWatchdog) -> bool:
        """Hold the watchdog arm ``effect`` back (``True``) instead of sending it now (issue 6: two timer writes per
        park and two per resume, the arm and the disarm, for a run whose handler parks or ends it in milliseconds).

        Held only by a handler of a message's first delivery (not its last) that has not armed the run's watchdog
        itself: that message stays unacknowledged while the handler works, so if the process dies the message comes
        back (after the ack wait, the lease lapsed) and its redelivery arms at once; if its deliveries are used up,
        the dead-letter hook fails the run. What only the watchdog catches -- a live handler stuck in a provider or
        tool call, its lease and ack wait kept fresh -- is caught all the same: the arm goes out once the handler
        has worked :attr:`watchdog_defer_s` (a third of the lease: when a call's lease keeper first renews it), with
        the deadline it had when decided (``since``), so it fires when an arm sent at once would have. A process
        that freezes or dies with its arm held back (SIGSTOP, a VM paused, an OOM kill: no arm, no renewal, no
        in-progress ack) has its message redelivered one ack wait later and its run taken over once its lease
        lapses -- recovered, where the watchdog would have failed it: so only a run whose watchdog horizon
        (``max_compute_s`` + grace) is at least :data:`DEFER_HORIZON_LEASES` leases defers (the defaults: 1,200 s
        against 30 s), and that recovery comes long before the watchdog would have fired. A handler
        that ends with the run still driven (a firing's re-arm, a failure) sends it before it returns
        (:meth:`_send_deferred`); one that parks or ends the run first drops it, and its disarm with it. A
        watchdog left armed by an earlier handler (a disarm that failed: best effort) is met by its firing, which
        ignores a waiting or finished run and watches a driven one on from its progress (:mod:`.watchdog`)."""
        if not view.may_defer or self.watchdog_defer_s <= 0 or view.watchdog_sent:
            return False
        if effect.limit_s + self.watchdog.grace_s < DEFER_HORIZON_LEASES * self.lease_s:
            return False  # a tight budget: a frozen or dead process's run would wait for its redelivery past it
        since = effect.since if effect.since is not None else self.clock()
        view.deferred = replace(effect, since=since)
        if view.deferral is None:
            view.deferral = asyncio.get_running_loop().call_later(self.watchdog_defer_s, self._send_deferred, view)
        return True

    def _send_deferred(self, view: _View) -> None:
        """Send the watchdog arm :meth:`_defer_arm` held back, if any (its acknowledgement awaited with the other
        fired writes, :meth:`_settle`)."""
        arm, view.deferred = view.deferred, None
        if view.deferral is not None:
            view.deferral.cancel()
            view.deferral = None
        if arm is None:
            return
        view.watchdog_sent = True
        seam = "effect:ArmWatchdog" if self.crash_point is not None else None
        view.unacked.append((asyncio.ensure_future(self._send([(self._write(view, arm), False)])), seam))

    @staticmethod
    def _drop_deferred(view: _View) -> None:
        view.deferred = None
        if view.deferral is not None:
            view.deferral.cancel()
            view.deferral = None

    async def _send(self, writes: Sequence[tuple[Write, bool]]) -> None:
        """Bus writes that commit no state, pipelined; the first failure raised, except for the best-effort
        ones (``True``: a watchdog's disarm, whose leftover timer fires on a run that is no longer driven and
        changes nothing -- on a finished run once its end's event is marked published, which the mark after this
        batch does)."""
        outcomes = await self.bus.pipeline.send([write for write, _ in writes])
        for (write, best_effort), outcome in zip(writes, outcomes, strict=True):
            if isinstance(outcome, PublishResult):
                continue
            if not best_effort:
                raise outcome
            log.warning("watchdog.disarm_failed", subject=write.subject, error=str(outcome))

    def _write(self, view: _View, effect: Effect) -> Write:
        """The bus write of a fired effect, its arguments taken now (the run as the handler holds it now)."""
        run_id, run = view.run_id, view.run
        match effect:
            case Publish():
                assert run is not None
                return event_write(
                    self._encoded(run, effect.data, *effect.id_parts, causation=effect.causation, run_id=effect.run_id)
                )
            case ArmWatchdog():
                return self.watchdog.arm_write(
                    run_id, turn=effect.turn, limit_s=effect.limit_s, cause=effect.cause, since=effect.since
                )[1]
            case ArmAgentDeadline():
                return self.watchdog.arm_until_write(
                    run_id, turn=effect.turn, agent_turn=effect.agent_turn, deadline=effect.deadline, cause=effect.cause
                )[1]
            case DisarmWatchdog():
                return self.watchdog.disarm_write(run_id)
            case ArmRetention():
                assert run is not None
                assert run.state in RUN.terminal, "a retention is armed for a finished run only"
                return self.retention.arm_write(run_id, run.updated_at)[1]
        raise AssertionError(f"{type(effect).__name__} is not a bus write that commits no state")

    async def _settle(self, view: _View) -> None:
        """Wait for every write :meth:`_fire` sent (one wait for all of them); the first failure is raised
        (the others are waited for all the same). The crash seams of the writes pass here, once stored."""
        if not view.unacked:
            return
        sent, view.unacked = view.unacked, []
        tasks = list(dict.fromkeys(task for task, _ in sent))  # one per batch (a batch's writes share it)
        if len(tasks) == 1:  # the usual case: awaited itself (its failure raised), no gather
            await tasks[0]
            _cancelled_meanwhile()
        else:
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
        if self.crash_point is not None:
            for _, seam in sent:
                if seam is not None:
                    await self._seam(seam)

    @staticmethod
    async def _on_the_wire(view: _View) -> None:
        """Before a provider or tool call: let the writes :meth:`_fire` sent reach the socket (their tasks, then
        the client's flusher, run at the next turns of the loop), without waiting for their acknowledgements.
        A call that takes the process down (an input that kills the executor every time it is handled) then
        still leaves the facts published before it (``run.started``, a recovery's ``run.resumed``) on the
        server, as when each was awaited; their acknowledgements are still awaited before the next commit."""
        if view.unacked:
            for _ in range(3):  # the writes' tasks, the flusher woken by them, and one turn to spare
                await asyncio.sleep(0)

    @staticmethod
    async def _abandon(view: _View) -> None:
        """A handler that stops with writes unacknowledged (it failed): let them finish, outcomes ignored (the
        redelivery sends them again, deduplicated), so no task outlives its handler."""
        if view.unacked:
            sent, view.unacked = view.unacked, []
            await asyncio.gather(*(task for task, _ in sent), return_exceptions=True)

    async def _change_run(self, view: _View, effects: Sequence[Effect]) -> None:
        """Consecutive changes of the run record (lease, state) as one compare-and-set: each applied in turn
        to the value the previous one left (``None``: that one changes nothing), so what is written is
        what writing them one by one would leave, and a change that refuses (:class:`LeaseHeld`,
        :class:`RunMovedOn`) aborts the lot, nothing written."""
        if len(effects) == 1:
            await self._effect(view, effects[0])
            return
        now = self.clock()
        moves = [e.target for e in effects if isinstance(e, Transition)]

        def change(run: RunRecord) -> RunRecord | None:
            current = run
            for effect in effects:
                if isinstance(effect, TakeLease):
                    try:
                        nxt = leased(current, effect.lease, now)
                    except LeaseHeld as held:
                        if effect.renew:
                            raise LeaseLost(str(held)) from None
                        raise
                else:
                    assert isinstance(effect, Transition)
                    nxt = moved(current, effect.target, effect.changes, now, waiting_on=effect.waiting_on)
                current = nxt if nxt is not None else current
            return None if current is run else current

        try:
            result = await self.runs.modify(view.run_id, change, known=view.known_run(), validated=True)
        except NotFound:
            raise TransientError(f"run {view.run_id} vanished") from None
        if result.changed and moves:
            log.info("run.state", state=moves[-1].value)
        view.hold_run(result)

    async def _effect(self, view: _View, effect: Effect) -> None:
        run_id = view.run_id
        match effect:
            case Publish():
                await self._send([(self._write(view, effect), False)])
            case Transition():
                view.hold_run(
                    await self._move(run_id, effect.target, view.known_run(), effect.changes, effect.waiting_on)
                )
            case ArmWatchdog() | ArmAgentDeadline() | DisarmWatchdog() | ArmRetention():
                # (:meth:`_fire` sends these; here for completeness)
                await self._send([(self._write(view, effect), isinstance(effect, DisarmWatchdog))])
            case RemoveCheckpoint():
                await self.checkpoints.purge(run_id)
                view.checkpoint, view.checkpoint_current = None, True
            case SaveCheckpoint():
                view.checkpoint, view.checkpoint_current = await self._save_checkpoint(view, effect.checkpoint), True
            case KeepReply():
                holder = view.holder
                try:
                    keeping = await self.runs.modify(
                        run_id, lambda r: with_reply(r, effect.reply, holder), known=view.known_run(), validated=True
                    )
                except NotFound:
                    raise TransientError(f"run {run_id} vanished") from None
                view.hold_run(keeping)
            case QueueMail():
                queue = await self._modify_checkpoint(view, lambda c: queued(c, effect.mail))
                view.checkpoint, view.checkpoint_current = Versioned(queue.value, queue.revision), True
            case DeliverMail():
                mail = await self._modify_checkpoint(view, lambda c: delivered(c, self.clock()))
                view.checkpoint, view.checkpoint_current = Versioned(mail.value, mail.revision), True
            case MarkPublished():  # the end's event acknowledged (the fired writes settled before this effect)
                # Not best effort: a record left unmarked would republish its event on any later redelivery, past
                # the stream's duplicate window. A failure fails the handler; its redelivery (within the backoff,
                # inside the window) republishes the event, deduplicated, and marks it.
                view.hold_run(await self.runs.modify(run_id, published, known=view.known_run(), validated=True))
            case TakeLease():
                try:
                    taken = await self.runs.modify(
                        run_id, lambda r: leased(r, effect.lease, self.clock()), known=view.known_run(), validated=True
                    )
                except NotFound:
                    raise TransientError(f"run {run_id} vanished") from None
                except LeaseHeld as held:
                    if effect.renew:
                        raise LeaseLost(str(held)) from None
                    raise
                view.hold_run(taken)
            case ApplyResult():
                applied = await self._modify_checkpoint(
                    view, lambda c: apply_result(c, effect.request_id, effect.content, self.clock(), effect.key)
                )
                view.checkpoint, view.checkpoint_current = Versioned(applied.value, applied.revision), True
            case AnswerElicitation():
                answered = await self._modify_checkpoint(view, lambda c: elicitation_answered(c, effect, self.clock()))
                view.checkpoint, view.checkpoint_current = Versioned(answered.value, answered.revision), True
            case RecordOutcome():
                kept = await self._modify_checkpoint(view, lambda c: recorded(c, effect.outcome))
                view.checkpoint, view.checkpoint_current = Versioned(kept.value, kept.revision), True
            case ApplyParked():
                parked = await self._modify_checkpoint(view, lambda c: apply_parked(c, effect.request_id, self.clock()))
                view.checkpoint, view.checkpoint_current = Versioned(parked.value, parked.revision), True
            case CreateCheckpoint():
                try:
                    revision = await self.checkpoints.create(run_id, effect.checkpoint, validated=True)
                    view.checkpoint, view.checkpoint_current = Versioned(effect.checkpoint, revision), True
                except AlreadyExists:
                    await self._read_checkpoint(view)
            case CreateRun():
                try:
                    revision = await self.runs.create(run_id, effect.record, validated=True)
                    log.info("run.created", agent=effect.record.agent)
                    view.hold_run(Versioned(effect.record, revision))  # what was just written: no read
                    view.checkpoint, view.checkpoint_current = None, True  # a new run has none yet
                except AlreadyExists:
                    log.info("run.exists")
                    await self._read_run(view)
                    assert view.run is not None
                    if view.run.state is not RunState.PENDING:  # another driver got further with it
                        await self._read_checkpoint(view)
            case FlagCancel():
                try:
                    flag = await self.runs.modify(
                        run_id,
                        lambda r: flagged(r, effect.request, self.clock()),
                        known=view.known_run(),
                        validated=True,
                    )
                except NotFound:
                    raise TransientError(f"run {run_id} vanished") from None
                view.hold_run(flag)
            case MarkCancel():
                try:
                    await self.markers.create(run_id, effect.request)
                    log.info("run.cancel.marker_written", requested_by=effect.request.requested_by)
                except AlreadyExists:
                    log.info("run.cancel.marker_exists")
                view.hold_run(await self.runs.get(run_id))  # after the marker: see Requested's adoption
            case AdoptCancelMarker():
                marker = await self.markers.get(run_id)
                if marker is not None:
                    request = marker.value
                    try:
                        flag = await self.runs.modify(
                            run_id, lambda r: flagged(r, request, self.clock()), known=view.known_run(), validated=True
                        )
                    except NotFound:
                        raise TransientError(f"run {run_id} vanished") from None
                    view.hold_run(flag)
                    log.info("run.cancel.marker_adopted", requested_by=request.requested_by)
            case Note():
                getattr(log, effect.level)(effect.event, **effect.fields)
            case Retry():
                raise LeaseHeld(effect.reason) if effect.lost_race else TransientError(effect.reason)
            case Reject():
                raise PermanentError(effect.reason)

    async def _call_provider(
        self, view: _View, agent: Agent, call: CallProvider
    ) -> ProviderReplied | ProviderFailed | AgentWorking:
        if agent.card.provider.kind == "external" and view.run is not None:  # an external agent's turn (AP-5)
            view.turn_started = time.monotonic()
            outcome = await self.external.complete(view.run, agent, call)
            if isinstance(outcome, ProviderReplied):  # an action already stored: the turn's compute is the agent's
                view.turn_started = time.monotonic() - outcome.elapsed_s
            return outcome
        provider = self.provider_for(agent.card)
        view.turn_started = time.monotonic()
        try:
            reply = await provider.complete(call.messages, call.tools, budget_s=call.budget_s, context=call.context)
        except ProviderError as exc:
            return ProviderFailed(
                turn=call.turn,
                error=str(exc),
                permanent=isinstance(exc, PermanentProviderError),
                budget_spent=isinstance(exc, BudgetSpent),
            )
        return ProviderReplied(turn=call.turn, reply=reply, elapsed_s=time.monotonic() - view.turn_started, raw=True)

    async def _call_tool(self, view: _View, call: CallTool) -> ToolReturned:
        """One tool call of a turn. :class:`ToolError` comes back to the model as a tool error; any other
        exception is the tool breaking (``tool.failed``); the bus failing (``TransientError``) propagates."""
        assert view.run is not None
        run = view.run
        plan = call.turn.plans[call.index]
        assert isinstance(plan, Invoke)
        tool_call = call.turn.calls[call.index]
        turn = call.turn.number
        cause = turn_cause(run.run_id, view.ckpt)  # what the turn follows from (the machine's events' causation too)

        async def publish(data: EventData, id_parts: tuple[str, ...]) -> None:
            await self._emit(run, data, *id_parts, causation=cause)

        sampler = self._sampler(view, turn, call.index, tool_call.id, tool_call.name, call.turn.usage, publish)
        ctx = ToolContext(
            run=run,
            turn=turn,
            index=call.index,
            call_id=tool_call.id,
            publish=publish,
            request=self.bus.request,
            redactor=self.redactor,
            sample=sampler,
        )
        outcome = await self._invoke(plan.tool, tool_call.arguments, ctx)
        return ToolReturned(
            turn=call.turn,
            index=call.index,
            outcome=outcome,
            elapsed_s=time.monotonic() - view.turn_started,
            usage=sampler.usage if sampler is not None else Usage(),
        )

    def _sampler(
        self, view: _View, turn: int, index: int, call_id: str, tool: str, used: Usage, publish: Publish_
    ) -> RunSampler | None:
        """The run's own model for the call's MCP sampling requests (:mod:`.sampling`); none for an external
        agent's run."""
        agent = self.agent(view.run.agent) if view.run is not None else None
        if view.run is None or agent is None or agent.card.provider.kind == "external":
            return None
        card = agent.card
        compute_s = view.ckpt.compute_s if view.ckpt is not None else 0.0
        return RunSampler(
            provider=self.provider_for(card),
            card=card,
            run=view.run,
            turn=turn,
            index=index,
            call_id=call_id,
            tool=tool,
            used=used,
            max_turns=card.limits.max_turns,
            budget_s=max(card.limits.max_compute_s - compute_s, 0.0),
            publish=publish,
            redactor=self.redactor,
        )

    async def _retry_tool(self, view: _View, retry: RetryTool) -> ToolRetried:
        """The call that parked the run on its elicitation, made again with the person's answers."""
        assert view.run is not None
        run = view.run
        elicitation = retry.elicitation
        cause = turn_cause(run.run_id, view.ckpt)  # the run.resumed of the elicitation's wait

        async def publish(data: EventData, id_parts: tuple[str, ...]) -> None:
            await self._emit(run, data, *id_parts, causation=cause)

        used = view.ckpt.usage if view.ckpt is not None else Usage()
        sampler = self._sampler(
            view, elicitation.turn, elicitation.index, elicitation.call.id, elicitation.call.name, used, publish
        )
        ctx = ToolContext(
            run=run,
            turn=elicitation.turn,
            index=elicitation.index,
            call_id=elicitation.call.id,
            publish=publish,
            request=self.bus.request,
            redactor=self.redactor,
            elicited=tuple(elicitation.answers),
            sample=sampler,
        )
        started = time.monotonic()
        outcome = await self._invoke(retry.tool, elicitation.call.arguments, ctx)
        return ToolRetried(
            elicitation=elicitation,
            outcome=outcome,
            elapsed_s=time.monotonic() - started,
            usage=sampler.usage if sampler is not None else Usage(),
        )

    @staticmethod
    async def _invoke(tool: Tool, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput | ToolBroke | ToolElicited:
        try:  # what enters the conversation is bounded (.bounds): a long result is cut, the model told
            return ToolOutput(bounded_tool_result(await tool.invoke(arguments, ctx)))
        except ToolError as exc:
            return ToolOutput(tool_error(cut(str(exc), _MAX_ERROR_BYTES)))
        except ElicitationNeeded as asked:  # the run parks on a person; the call is made again with the answer
            return ToolElicited(asked.message, asked.requested_schema, asked.position, asked.url)
        except (TransientError, Conflict):
            raise  # the bus, not the tool: redelivered
        except Exception as exc:  # the tool broke: say so, and let the model carry on without it
            return ToolBroke(cut(f"{type(exc).__name__}: {exc}", _MAX_ERROR_BYTES))

    # ------------------------------------------------------------------ plumbing
    async def _save_checkpoint(self, view: _View, saved: Checkpoint) -> Versioned[Checkpoint]:
        """Commit a turn: one compare-and-set against the checkpoint the turn started from. Losing it to mail
        queued meanwhile (:func:`~temporality_run_executor.machine.merge_mail`) keeps that mail and tries
        again; losing it to anything else means another driver committed this turn (``Conflict``)."""
        base = view.checkpoint
        assert base is not None
        revision = base.revision
        while True:
            try:
                return Versioned(saved, await self.checkpoints.update(view.run_id, saved, revision, validated=True))
            except Conflict:
                fresh = await self.checkpoints.get(view.run_id)
                merged = merge_mail(saved, base.value, fresh.value) if fresh is not None else None
                if fresh is None or merged is None:
                    raise
                saved, revision = merged, fresh.revision

    async def _modify_checkpoint(
        self, view: _View, fn: Callable[[Checkpoint], Checkpoint | None]
    ) -> Versioned[Checkpoint]:
        try:
            return await self.checkpoints.modify(view.run_id, fn, known=view.checkpoint, validated=True)
        except NotFound:
            raise TransientError(f"checkpoint of {view.run_id} not found") from None

    async def _transition(self, run_id: str, target: RunState, **changes: Any) -> RunRecord:
        """Compare-and-set the run to ``target`` (:func:`~temporality_run_executor.machine.moved`).

        Already in ``target``: only ``changes`` are applied. A move the state machine refuses means
        another driver got there first (e.g. a redelivery racing the original): :class:`RunMovedOn`,
        which the handlers treat as done.
        """
        return (await self._move(run_id, target, None, changes)).value

    async def _move(
        self,
        run_id: str,
        target: RunState,
        known: Versioned[RunRecord] | None,
        changes: Mapping[str, Any],
        waiting_on: str | None = None,
    ) -> Versioned[RunRecord]:
        """:meth:`_transition` from what the handler holds (``known``: no read when it is current)."""
        try:
            result = await self.runs.modify(
                run_id,
                lambda run: moved(run, target, changes, self.clock(), waiting_on=waiting_on),
                known=known,
                validated=True,
            )
        except NotFound:
            raise TransientError(f"run {run_id} vanished") from None
        if result.changed:
            log.info("run.state", state=target.value)
        return result

    async def _emit(
        self, run: RunRecord, data: EventData, *id_parts: str, causation: str | None = None, run_id: str | None = None
    ) -> None:
        await self.bus.publish(self._event(run, data, *id_parts, causation=causation, run_id=run_id))

    @staticmethod
    def _encoded(
        run: RunRecord, data: EventData, *id_parts: str, causation: str | None = None, run_id: str | None = None
    ) -> EncodedEvent:
        """:meth:`_event` for an event that is only sent (a fired :class:`Publish`): the same bytes on the wire
        (``encode_event``: the data serialized once from its model, no :class:`Envelope` built, its data dumped
        to a dict and that encoded again)."""
        return encode_event(data, **Engine._attributes(run, data, id_parts, causation, run_id))

    @staticmethod
    def _event(
        run: RunRecord, data: EventData, *id_parts: str, causation: str | None = None, run_id: str | None = None
    ) -> Envelope:
        """The run's event ``data``, its id derived from the run, the type and ``id_parts``."""
        return make_event(data, **Engine._attributes(run, data, id_parts, causation, run_id))

    @staticmethod
    def _attributes(
        run: RunRecord, data: EventData, id_parts: tuple[str, ...], causation: str | None, run_id: str | None
    ) -> dict[str, Any]:
        """The CloudEvent attributes of the run's event ``data`` (:meth:`_event`, :meth:`_encoded`)."""
        return {
            "source": SOURCE,
            "id": event_id(run.run_id, data.EVENT_TYPE, *id_parts),
            "run_id": run_id or run.run_id,
            "correlation_id": run.correlation_id,
            "causation_id": causation,
            "actor": f"agent:{run.agent}",
            "tenant": run.tenant,
        }
