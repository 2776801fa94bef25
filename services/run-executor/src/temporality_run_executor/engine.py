"""The durable run engine: runs are state machines in KV, never coroutines waiting in memory.

``run.requested``  -> create the run once (KV create-if-absent) -> ``running`` -> drive turns.
A turn = one provider call + its tool calls, then a checkpoint (KV, AP-7) + ``run.checkpointed``.
``ask_human``      -> checkpoint with the pending ask -> publish ``human.requested`` ->
                      ``waiting_for_human`` -> the handler returns, the message is acked, nothing stays
                      in memory (RUN-3).
``human.*``        -> ``resuming`` -> the outcome becomes the tool result -> ``running`` -> drive.

``run.cancel_requested`` -> recorded on the run; a run nobody drives (pending, parked) is cancelled at
                      once, a driven one by its driver at the next turn boundary (``run.cancelled``).

Tool calls go through the registry (:mod:`.tools`): the card's allow/deny policy, JSON-schema argument
validation (errors go back to the model), and a tool that raises becomes ``tool.failed`` plus a tool
error for the model, never a crashed run.

Every fact is published with a deterministic id *before* the state that records it is committed, so a
crash at any point is repaired by redelivery: the replay republishes the same ids (deduplicated) and
continues from the last checkpoint (AP-8), announcing it with ``run.resumed`` (reason ``recovery``).

No run is ever left behind:

* **dead-lettered** (:meth:`Engine.on_dead_letter`, the consumers' dead-letter hook): when the runner
  gives up on the message a run depends on -- deliveries used up by failures, or by a process that
  died every time it handled it (an OOM on one input: the delivery past the limit never runs the
  handler) -- the run fails with ``run.failed`` reason ``infrastructure_error`` before the message goes
  to the DLQ.
* **stalled** (:meth:`Engine.on_watchdog`, :mod:`.watchdog`): a durable timer per active run, re-armed
  every turn, fails a run that sat in ``running``/``resuming`` without progress past its compute limit
  plus a grace period (reason ``stalled``). A run waiting for a person has no watchdog.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import structlog
from pydantic import ValidationError

from temporality_bus import (
    AlreadyExists,
    Bus,
    Conflict,
    Delivery,
    NotFound,
    PermanentError,
    Store,
    TransientError,
    Versioned,
    evolve,
)
from temporality_protocol import (
    RUN,
    AgentSummary,
    Envelope,
    EventData,
    HumanAnswered,
    HumanExpired,
    HumanRejected,
    HumanRequested,
    RunCancelled,
    RunCancelRequested,
    RunCheckpointed,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunRequested,
    RunResumed,
    RunStarted,
    RunState,
    RunToolCalled,
    ToolFailed,
    derive_id,
    make_event,
)
from temporality_protocol.catalog import BUCKET_CHECKPOINTS, BUCKET_RUNS
from temporality_run_executor.agents import AgentCard, AgentDirectory, Limits
from temporality_run_executor.providers import PermanentProviderError, Provider, ProviderError, TurnContext
from temporality_run_executor.records import (
    CancelRequest,
    Checkpoint,
    Message,
    PendingAsk,
    RunRecord,
    ToolCall,
    Usage,
)
from temporality_run_executor.tools import (
    ASK_HUMAN,
    BUILTIN_TOOLS,
    GET_INPUT,
    AskHumanArgs,
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
)
from temporality_run_executor.watchdog import DEFAULT_GRACE_S, RunWatchdog, WatchdogPayload

__all__ = ["ACTIVE", "SOURCE", "Engine", "ProviderFactory", "RunMovedOn"]

SOURCE = "/temporality/run-executor"
log = structlog.get_logger(__name__)
ProviderFactory = Callable[[AgentCard], Provider]
Handler = Callable[[Envelope, Delivery], Awaitable[None]]
#: States in which a driver is (or should be) working on the run: the watchdog watches these.
ACTIVE = frozenset({RunState.PENDING, RunState.RUNNING, RunState.RESUMING})


def _now() -> datetime:
    return datetime.now(UTC)


def _tool_error(message: str) -> str:
    return json.dumps({"error": message})


def _token_text(usage: Usage, max_tokens: int) -> str:
    return (
        f"{usage.total_tokens} tokens used ({usage.prompt_tokens} prompt, {usage.completion_tokens} completion); "
        f"the card's limit is {max_tokens}"
    )


def _attempt(delivery: Delivery) -> tuple[str, str]:
    """The delivery attempt, as id parts: the message and how many times it was delivered."""
    return str(delivery.stream_seq), str(delivery.num_delivered)


class RunMovedOn(Exception):
    """Another driver moved the run past what this handler wanted to do (a redelivery racing the
    original, a duplicate answer): this handler's work is stale and it ends quietly."""

    def __init__(self, run_id: str, state: RunState, target: RunState) -> None:
        super().__init__(f"run {run_id} is {state.value}; not moving it to {target.value}")


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
        watchdog_grace_s: float = DEFAULT_GRACE_S,
        tools: ToolRegistry | None = None,
        card_tools: Mapping[str, list[Tool]] | None = None,
    ) -> None:
        self.bus = bus
        self.tools = tools if tools is not None else ToolRegistry(BUILTIN_TOOLS)
        #: Tools only some cards have (their MCP servers'), by agent id.
        self._registries = {agent: self.tools.with_tools(extra) for agent, extra in (card_tools or {}).items()}
        self.runs = runs
        self.checkpoints = checkpoints
        self.agents = agents
        self.provider_for = provider_for
        self.max_deliver = max_deliver
        self.watchdog = RunWatchdog(bus, grace_s=watchdog_grace_s)

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
    ) -> Engine:
        return cls(
            bus,
            await bus.store(BUCKET_RUNS, RunRecord),
            await bus.store(BUCKET_CHECKPOINTS, Checkpoint),
            agents,
            provider_for,
            max_deliver=max_deliver,
            watchdog_grace_s=watchdog_grace_s,
            tools=tools,
            card_tools=card_tools,
        )

    def registry(self, card: AgentCard) -> ToolRegistry:
        """The tools ``card`` can be offered: the executor's, plus its MCP servers'."""
        return self._registries.get(card.id, self.tools)

    # ------------------------------------------------------------------ handlers
    async def on_run_requested(self, event: Envelope, delivery: Delivery) -> None:
        await self._guarded(self._on_run_requested, event, delivery)

    async def on_human_event(self, event: Envelope, delivery: Delivery) -> None:
        await self._guarded(self._on_human_event, event, delivery)

    async def _guarded(self, handler: Handler, event: Envelope, delivery: Delivery) -> None:
        """Work another driver made stale ends quietly; anything else goes to the consumer runner, which
        retries it and, when it gives up, calls :meth:`on_dead_letter` (that fails the run)."""
        try:
            await handler(event, delivery)
        except RunMovedOn as moved:
            log.warning("run.moved_on", detail=str(moved))

    async def on_dead_letter(self, message: Envelope | bytes, delivery: Delivery, error: BaseException) -> None:
        """The dead-letter hook of both run consumers: a run whose message is given up on fails visibly.

        Whatever the reason (failures used up the deliveries, a process died every time it handled the
        message so the delivery past the limit never ran the handler, a permanent error), the run the
        message drives moves to ``failed`` with ``run.failed`` reason ``infrastructure_error``: published
        first, with the run's deterministic failure id (a repeat is deduplicated), then committed. A run
        already finished, one waiting for a person, or one another message drives (a stale duplicate,
        an answer to an older request) is left alone. Idempotent: the consumer runs it again whenever
        the dead-lettering has to be retried.
        """
        if isinstance(message, bytes):
            return  # not an envelope: it names no run
        if isinstance(error, Conflict):
            return  # it lost a compare-and-set to another driver, which is making progress with the run
        run_id = message.runid or message.data.get("run_id")
        if not isinstance(run_id, str):
            return
        with structlog.contextvars.bound_contextvars(run_id=run_id):
            current = await self.runs.get(run_id)
            if current is None:
                log.info("run.dead_letter.unknown_run", ce_type=message.type)
                return
            run = current.value
            if not await self._driven_by(run, message):
                log.info("run.dead_letter.not_its_driver", state=run.state.value, ce_type=message.type)
                return
            error_text = f"{message.type} {message.id} dead-lettered after {delivery.num_delivered} deliveries"
            try:
                if run.cancel is not None:  # it was to stop anyway: what it was asked for, not a failure
                    await self._cancel(run, run.cancel)
                    return
                await self._fail(
                    run,
                    "infrastructure_error",
                    f"{error_text}: {type(error).__name__}: {error}",
                    causation=message.id,
                )
            except RunMovedOn as moved:  # it finished meanwhile
                log.info("run.moved_on", detail=str(moved))

    async def _driven_by(self, run: RunRecord, event: Envelope) -> bool:
        """Whether ``event`` is the message ``run`` depends on to move on (so losing it strands the run).

        ``run.requested`` drives a run that is pending, or running and never resumed; a ``human.*``
        outcome drives the run waiting on (or resuming with) its request, or running on the strength of
        it (its request is the last one applied). Finished and waiting runs depend on no message.
        """
        if run.state in RUN.terminal or event.type == RunCancelRequested.EVENT_TYPE:
            return False  # a cancel request drives nothing: the run goes on without it
        request_id = event.data.get("request_id") if event.type.startswith("human.") else None
        if run.state in (RunState.WAITING_FOR_HUMAN, RunState.RESUMING):
            return request_id is not None and run.waiting_request_id == request_id
        if run.state is RunState.PENDING:
            return request_id is None
        if run.state is RunState.RUNNING:
            ckpt = await self.checkpoints.get(run.run_id)
            applied = ckpt.value.applied_requests if ckpt is not None else []
            if request_id is None:
                return not applied
            return bool(applied) and applied[-1] == request_id
        return False

    async def on_watchdog(self, data: bytes, delivery: Delivery) -> None:
        """A run's watchdog fired (the raw handler of ``run-executor-watchdog``); see :mod:`.watchdog`."""
        try:
            payload = WatchdogPayload.model_validate_json(data)
        except ValidationError as exc:
            raise PermanentError(f"unreadable watchdog payload: {exc}") from exc
        with structlog.contextvars.bound_contextvars(run_id=payload.run_id):
            current = await self.runs.get(payload.run_id)
            if current is None:
                log.info("watchdog.unknown_run")
                return
            run = current.value
            if run.state not in ACTIVE:
                log.info("watchdog.ignored", state=run.state.value)  # waiting for a person, or finished
                return
            ckpt = await self.checkpoints.get(run.run_id)
            turn = ckpt.value.turn if ckpt is not None else 0
            card = self.agents.get(run.agent)
            limits = card.limits if card is not None else Limits()
            if turn != payload.turn:
                # progress since the arm, and nobody armed it again (the driver died right after): watch on
                await self.watchdog.arm(
                    run.run_id, turn=turn, limit_s=limits.max_compute_s, cause=("progress", *_attempt(delivery))
                )
                log.warning("watchdog.progressed", armed_turn=payload.turn, turn=turn, state=run.state.value)
                return
            idle_s = (_now() - payload.armed_at).total_seconds()
            try:
                if run.cancel is not None:  # stalled, but asked to stop: cancelled, as asked
                    await self._cancel(run, run.cancel)
                    return
                await self._fail(
                    run,
                    "stalled",
                    f"no progress in {run.state.value} at turn {turn} for {idle_s:.0f}s: longer than the compute "
                    f"limit ({limits.max_compute_s:g}s) plus the watchdog's grace ({self.watchdog.grace_s:g}s)",
                )
            except RunMovedOn as moved:  # it moved on meanwhile after all
                log.info("run.moved_on", detail=str(moved))

    async def _on_run_requested(self, event: Envelope, delivery: Delivery) -> None:
        req = event.payload(RunRequested)
        structlog.contextvars.bind_contextvars(run_id=req.run_id)
        current = await self.runs.get(req.run_id)
        if current is None:
            now = _now()
            record = RunRecord(
                run_id=req.run_id,
                state=RUN.initial,
                agent=req.agent,
                title=req.title,
                launch=req.launch,
                input=req.input,
                event=req.event,
                human=req.human,
                parent_run_id=req.parent_run_id,
                correlation_id=event.correlationid or req.run_id,
                tenant=event.tenant,
                created_at=now,
                updated_at=now,
            )
            try:
                await self.runs.create(req.run_id, record)
                log.info("run.created", agent=req.agent)
            except AlreadyExists:
                log.info("run.exists")
            current = await self._get(req.run_id)
        run = current.value
        await self._emit(run, RunCreated(run_id=run.run_id, agent=run.agent, title=run.title, launch=run.launch))
        if run.state not in (RunState.PENDING, RunState.RUNNING):
            log.info("run.requested.duplicate", state=run.state.value)  # parked, resuming or finished
            return
        card = self.agents.get(run.agent)
        if card is None:
            await self._fail(run, "unknown_agent", f"no agent card named {run.agent!r}")
            return
        if run.state is RunState.PENDING:
            try:
                await self.checkpoints.create(run.run_id, self._initial_checkpoint(run, card))
            except AlreadyExists:
                pass
            await self._arm(run.run_id, card, 0, "start", delivery)
            run = await self._transition(run.run_id, RunState.RUNNING)
        else:
            ckpt = await self._checkpoint(run.run_id)
            await self._arm(run.run_id, card, ckpt.value.turn, "recovery", delivery)
            await self._emit(
                run,
                RunResumed(run_id=run.run_id, reason="recovery", from_turn=ckpt.value.turn),
                "recovery",
                str(delivery.stream_seq),
                str(delivery.num_delivered),
            )
            log.warning("run.recovering", from_turn=ckpt.value.turn)
        await self._emit(
            run,
            RunStarted(
                run_id=run.run_id,
                agent=card.id,
                role=card.role,
                title=run.title,
                parent_run_id=run.parent_run_id,
                agent_card=self._summary(card),
            ),
        )
        await self._drive(run.run_id, card, delivery)

    async def _on_human_event(self, event: Envelope, delivery: Delivery) -> None:
        data = event.payload()
        if isinstance(data, RunCancelRequested):
            await self._on_cancel_requested(event, data)
            return
        outcome: dict[str, Any]
        reason: Literal["answer", "expiry", "rejection"]
        waited: float | None = None
        if isinstance(data, HumanAnswered):
            reason = "answer"
            waited = data.waited_s
            outcome = {
                "request_id": data.request_id,
                "status": "answered",
                "responder": data.responder,
                "channel": data.channel,
                "answer": data.answer.model_dump(mode="json"),
            }
        elif isinstance(data, HumanExpired):
            reason = "expiry"
            waited = data.waited_s
            outcome = {
                "request_id": data.request_id,
                "status": "expired",
                "note": "nobody answered in time; the timeout policy's default applies",
                "answer": data.default_answer.model_dump(mode="json") if data.default_answer else None,
            }
        elif isinstance(data, HumanRejected):
            reason = "rejection"
            outcome = {"request_id": data.request_id, "status": "rejected", "error": f"{data.reason}: {data.detail}"}
        else:
            raise PermanentError(f"run-executor does not handle {event.type}")
        request_id = data.request_id
        structlog.contextvars.bind_contextvars(run_id=data.run_id, request_id=request_id)

        current = await self.runs.get(data.run_id)
        if current is None:
            raise PermanentError(f"{event.type} for unknown run {data.run_id}")
        run = current.value
        card = self.agents.get(run.agent)
        if card is None:
            await self._fail(run, "unknown_agent", f"no agent card named {run.agent!r}")
            return
        ckpt = (await self._checkpoint(run.run_id)).value

        if run.state is RunState.WAITING_FOR_HUMAN:
            if run.waiting_request_id != request_id:
                log.info("human.outcome.stale", waiting_for=run.waiting_request_id)
                return
            if isinstance(data, HumanExpired) and data.action == "fail":
                await self._fail(run, "human_request_expired", f"no answer to {request_id} in time")
                return
            await self._emit(
                run,
                RunResumed(
                    run_id=run.run_id, reason=reason, from_turn=ckpt.turn, request_id=request_id, waited_s=waited
                ),
                request_id,
                causation=event.id,
            )
            await self._arm(run.run_id, card, ckpt.turn, "resume", delivery)
            run = await self._transition(run.run_id, RunState.RESUMING)
        if run.state is RunState.RESUMING:
            await self._apply_outcome(run.run_id, request_id, outcome)
            run = await self._transition(run.run_id, RunState.RUNNING, waiting_request_id=None, waiting_since=None)
        elif run.state is RunState.RUNNING:
            fresh = (await self._checkpoint(run.run_id)).value
            if fresh.pending is not None and fresh.pending.request_id == request_id:
                raise TransientError("the run has not finished parking on this request yet")
            if request_id not in fresh.applied_requests:
                log.info("human.outcome.stale", state=run.state.value)
                return
            log.warning("run.recovering.after_resume")
        else:
            log.info("human.outcome.ignored", state=run.state.value)
            return
        await self._drive(run.run_id, card, delivery)

    async def _on_cancel_requested(self, event: Envelope, data: RunCancelRequested) -> None:
        """RUN-2: record the cancel on the run, then cancel it at once if nobody is driving it (pending,
        waiting for a person); a run being driven is cancelled by its driver at the next turn boundary. A
        finished run ignores it; a second cancel changes nothing (the first one's reason stands)."""
        structlog.contextvars.bind_contextvars(run_id=data.run_id)
        current = await self.runs.get(data.run_id)
        if current is None:
            raise PermanentError(f"run.cancel_requested for unknown run {data.run_id}")
        request = CancelRequest(
            reason=data.reason, requested_by=data.requested_by, requested_at=_now(), event_id=event.id
        )

        def flag(run: RunRecord) -> RunRecord | None:
            if run.state in RUN.terminal or run.cancel is not None:
                return None
            return evolve(run, cancel=request, updated_at=_now())

        try:
            run = (await self.runs.modify(data.run_id, flag)).value
        except NotFound:
            raise TransientError(f"run {data.run_id} vanished") from None
        if run.state in RUN.terminal:
            log.info("run.cancel.ignored", state=run.state.value, requested_by=data.requested_by)
            return
        assert run.cancel is not None
        if run.state in (RunState.PENDING, RunState.WAITING_FOR_HUMAN, RunState.WAITING_FOR_AGENT):
            try:
                await self._cancel(run, run.cancel)
            except RunMovedOn as moved:  # an answer resumed it meanwhile: its driver sees the flag
                log.info("run.moved_on", detail=str(moved))
            return
        log.info("run.cancel.deferred", state=run.state.value, requested_by=data.requested_by)

    # ------------------------------------------------------------------ the loop
    async def _drive(self, run_id: str, card: AgentCard, delivery: Delivery) -> None:
        provider = self.provider_for(card)
        tools = self.registry(card).specs(card.tools)
        while True:
            run = (await self._get(run_id)).value
            if run.state is not RunState.RUNNING:
                return
            if run.cancel is not None:  # a turn boundary: the cancel asked for meanwhile applies now
                await self._cancel(run, run.cancel)
                return
            versioned = await self._checkpoint(run_id)
            ckpt = versioned.value
            if ckpt.pending is not None:
                await self._park(run, ckpt)
                return
            if ckpt.turn >= card.limits.max_turns:
                await self._fail(
                    run, "max_turns", f"the agent used all {card.limits.max_turns} turns", usage=ckpt.usage
                )
                return
            if ckpt.compute_s >= card.limits.max_compute_s:
                await self._fail(
                    run,
                    "compute_timeout",
                    f"{ckpt.compute_s:.1f}s of compute used; the budget is {card.limits.max_compute_s:.1f}s",
                    usage=ckpt.usage,
                )
                return
            max_tokens = card.limits.max_tokens
            if max_tokens is not None and ckpt.usage.total_tokens >= max_tokens:
                await self._fail(run, "token_limit", _token_text(ckpt.usage, max_tokens), usage=ckpt.usage)
                return
            await self._arm(run_id, card, ckpt.turn, "turn", delivery)
            turn = ckpt.turn + 1
            started = time.monotonic()
            try:
                reply = await provider.complete(
                    ckpt.messages,
                    tools,
                    budget_s=card.limits.max_compute_s - ckpt.compute_s,
                    context=TurnContext(
                        run_id=run_id,
                        agent=card.id,
                        title=run.title,
                        people=run.human.allowed_recipients,
                        turn=turn,
                    ),
                )
            except ProviderError as exc:
                if isinstance(exc, PermanentProviderError) or delivery.num_delivered >= self.max_deliver:
                    await self._fail(run, "provider_error", str(exc), usage=ckpt.usage)
                    return
                raise
            usage = ckpt.usage + (reply.usage or Usage())
            if (await self._get(run_id)).value.state is not RunState.RUNNING:
                # the turn took so long that the run moved on meanwhile (the watchdog failed it): drop it
                log.warning("run.moved_on", detail=f"run {run_id} is no longer running; turn {turn} dropped")
                return
            if max_tokens is not None and usage.total_tokens > max_tokens:
                await self._fail(run, "token_limit", _token_text(usage, max_tokens), usage=usage)
                return
            if not reply.tool_calls:
                await self._complete(run, reply.content or "", turn, usage=usage)
                return
            malformed = ckpt.malformed_tool_calls
            messages = [*ckpt.messages, Message(role="assistant", content=reply.content, tool_calls=reply.tool_calls)]
            pending: PendingAsk | None = None
            for index, call in enumerate(reply.tool_calls):
                result, asked, malformed_call = await self._call_tool(run, card, turn, index, call, pending)
                malformed += malformed_call
                if asked is not None:
                    pending = asked
                    continue  # its result is the person's answer, applied when it comes
                messages.append(Message(role="tool", tool_call_id=call.id, name=call.name, content=result))
                await self._emit(
                    run,
                    RunToolCalled(
                        run_id=run_id,
                        turn=turn,
                        call_id=call.id,
                        tool=call.name,
                        arguments=call.arguments,
                        result_preview=result[:4096],
                    ),
                    str(turn),
                    str(index),
                )
            if malformed > card.limits.max_malformed_tool_calls:
                await self._fail(
                    run,
                    "malformed_tool_calls",
                    f"{malformed} malformed tool calls (unparseable arguments or unknown tools); the card allows "
                    f"{card.limits.max_malformed_tool_calls}",
                    usage=usage,
                )
                return
            saved = evolve(
                ckpt,
                checkpoint_id=derive_id("ckpt", run_id, str(turn)),
                turn=turn,
                saved_at=_now(),
                messages=messages,
                pending=pending,
                compute_s=ckpt.compute_s + (time.monotonic() - started),
                usage=usage,
                malformed_tool_calls=malformed,
            )
            # One compare-and-set, never retried: losing it means another driver committed this turn.
            await self.checkpoints.update(run_id, saved, versioned.revision)
            await self._emit(
                run, RunCheckpointed(run_id=run_id, checkpoint_id=saved.checkpoint_id, turn=turn), str(turn)
            )

    async def _call_tool(
        self, run: RunRecord, card: AgentCard, turn: int, index: int, call: ToolCall, pending: PendingAsk | None
    ) -> tuple[str, PendingAsk | None, int]:
        """One tool call of a turn, through the registry: (the result for the model, the ask it parks on,
        1 if the call was malformed). A call the card does not allow, arguments that are not JSON or do not
        fit the tool's schema, and a tool that raises all come back to the model as tool errors; a tool
        that raises is also published as ``tool.failed``. The bus failing (``TransientError``) propagates."""
        try:
            tool = self.registry(card).resolve(call.name, card.tools, card.id)
        except ToolError as refused:
            log.warning("run.tool_call.malformed", turn=turn, call_id=call.id, tool=call.name, why="not_allowed")
            return _tool_error(str(refused)), None, 1
        if call.invalid_arguments is not None:
            log.warning("run.tool_call.malformed", turn=turn, call_id=call.id, tool=call.name, why="arguments")
            text = (
                f"the arguments of {call.name!r} are not a JSON object: "
                f"{call.invalid_arguments[:200]!r}; call it again with valid JSON arguments"
            )
            return _tool_error(text), None, 1
        problem = tool.argument_problem(call.arguments)
        if problem is not None:
            log.info("run.tool_call.invalid_arguments", turn=turn, call_id=call.id, tool=call.name)
            return _tool_error(problem), None, 0
        if tool.name == ASK_HUMAN:
            if pending is not None:
                return _tool_error("one ask_human per turn: ask again after the first answer"), None, 0
            try:
                args = AskHumanArgs.model_validate(call.arguments)
            except ValidationError as exc:
                return _tool_error(f"invalid ask_human arguments: {exc}"), None, 0
            asked = PendingAsk(
                request_id=derive_id("hr", run.run_id, str(turn), str(index)),
                call_id=call.id,
                turn=turn,
                asked_at=_now(),
                arguments=args.model_dump(mode="json"),
            )
            return "", asked, 0

        async def publish(data: EventData, id_parts: tuple[str, ...]) -> None:
            await self._emit(run, data, *id_parts)

        ctx = ToolContext(run=run, turn=turn, index=index, call_id=call.id, publish=publish)
        try:
            return await tool.invoke(call.arguments, ctx), None, 0
        except ToolError as exc:
            return _tool_error(str(exc)), None, 0
        except (TransientError, Conflict):
            raise  # the bus, not the tool: redelivered
        except Exception as exc:  # the tool broke: say so, and let the model carry on without it
            error = f"{type(exc).__name__}: {exc}"
            log.warning("tool.failed", turn=turn, call_id=call.id, tool=tool.name, error=error)
            await self._emit(
                run,
                ToolFailed(run_id=run.run_id, turn=turn, call_id=call.id, tool=tool.name, error=error[:4096]),
                str(turn),
                str(index),
            )
            return _tool_error(f"the tool {tool.name!r} failed: {error}"), None, 0

    async def _park(self, run: RunRecord, ckpt: Checkpoint) -> None:
        assert ckpt.pending is not None
        pending = ckpt.pending
        args = AskHumanArgs.model_validate(pending.arguments)
        policy = run.human
        timeout = min(args.timeout or policy.default_timeout_s, policy.max_timeout_s)
        await self._emit(
            run,
            HumanRequested(
                request_id=pending.request_id,
                run_id=run.run_id,
                agent=run.agent,
                title=run.title,
                recipient=args.recipient,
                question=args.question,
                context=args.context,
                options=args.options,
                timeout_s=timeout,
                expires_at=pending.asked_at + timedelta(seconds=timeout),
                policy=policy,
                turn=pending.turn,
            ),
            pending.request_id,
        )
        # before the move: once it waits, an answer may resume (and re-arm) it at any moment
        await self.watchdog.disarm(run.run_id)
        parked = await self._transition(
            run.run_id,
            RunState.WAITING_FOR_HUMAN,
            waiting_request_id=pending.request_id,
            waiting_since=pending.asked_at,
        )
        log.info("run.parked", request_id=pending.request_id, recipient=args.recipient)
        if parked.cancel is not None:  # asked to stop while it was parking: nobody else will drive it now
            await self._cancel(parked, parked.cancel)

    async def _apply_outcome(self, run_id: str, request_id: str, outcome: dict[str, Any]) -> None:
        def apply(ckpt: Checkpoint) -> Checkpoint | None:
            if request_id in ckpt.applied_requests:
                return None
            if ckpt.pending is None or ckpt.pending.request_id != request_id:
                raise PermanentError(f"run {run_id} is not waiting on {request_id}")
            message = Message(
                role="tool",
                tool_call_id=ckpt.pending.call_id,
                name=ASK_HUMAN,
                content=json.dumps(outcome, sort_keys=True),
            )
            return evolve(
                ckpt,
                messages=[*ckpt.messages, message],
                pending=None,
                applied_requests=[*ckpt.applied_requests, request_id],
                saved_at=_now(),
            )

        try:
            await self.checkpoints.modify(run_id, apply)
        except NotFound:
            raise TransientError(f"checkpoint of {run_id} not found") from None

    # ------------------------------------------------------------------ outcomes
    async def _complete(self, run: RunRecord, result: str, turns: int, *, usage: Usage) -> None:
        await self._emit(run, RunCompleted(run_id=run.run_id, result=result[:16384], turns=turns))
        await self._transition(run.run_id, RunState.COMPLETED, result=result, usage=usage)
        await self.watchdog.disarm(run.run_id)
        log.info("run.completed", turns=turns, total_tokens=usage.total_tokens)

    async def _cancel(self, run: RunRecord, cancel: CancelRequest) -> None:
        """Move the run to ``cancelled``: ``run.cancelled`` first (one id per run: a repeat is deduplicated),
        then the record, then its watchdog. Pending human requests are human-interaction's to cancel (it
        consumes ``run.cancelled``); an outcome arriving later finds a finished run and is ignored."""
        reason = f"{cancel.reason} (requested by {cancel.requested_by})"
        await self._emit(run, RunCancelled(run_id=run.run_id, reason=reason[:4096]), causation=cancel.event_id)
        await self._transition(run.run_id, RunState.CANCELLED, waiting_request_id=None)
        await self.watchdog.disarm(run.run_id)
        log.info("run.cancelled", reason=cancel.reason, requested_by=cancel.requested_by)

    async def _fail(
        self, run: RunRecord, reason: str, error: str, *, causation: str | None = None, usage: Usage | None = None
    ) -> None:
        # one id per run, whatever the reason: a run fails once, and a repeat is deduplicated
        await self._emit(run, RunFailed(run_id=run.run_id, reason=reason, error=error[:4096]), causation=causation)
        changes: dict[str, Any] = {"usage": usage} if usage is not None else {}
        await self._transition(run.run_id, RunState.FAILED, error=f"{reason}: {error}", **changes)
        await self.watchdog.disarm(run.run_id)
        log.warning("run.failed", reason=reason, error=error)

    # ------------------------------------------------------------------ plumbing
    async def _arm(self, run_id: str, card: AgentCard, turn: int, phase: str, delivery: Delivery) -> None:
        """(Re-)arm the run's watchdog before a driver works on it: at ``turn``, for ``card``'s compute limit."""
        await self.watchdog.arm(
            run_id, turn=turn, limit_s=card.limits.max_compute_s, cause=(phase, *_attempt(delivery))
        )

    def _summary(self, card: AgentCard) -> AgentSummary:
        """RUN-1: the card's facts a run exposes in ``run.started`` (the journal keeps them with the run)."""
        return AgentSummary(
            provider=card.provider.kind,
            model=card.provider.model if card.provider.kind == "openai" else None,
            skills=[skill.name for skill in card.skills],
            tools=[tool.name for tool in self.registry(card).offered(card.tools)],
            mcp_servers=[server.name for server in card.mcp_servers],
            max_turns=card.limits.max_turns,
            max_tokens=card.limits.max_tokens,
            max_compute_s=card.limits.max_compute_s,
        )

    def _initial_checkpoint(self, run: RunRecord, card: AgentCard) -> Checkpoint:
        askable = ", ".join(run.human.allowed_recipients) or "nobody"
        task = "\n".join(
            [
                f"Task: {' '.join(run.title.split())}",  # one line: a title cannot forge the lines below
                f"Launched by: {run.launch.kind} trigger {run.launch.trigger_id or '-'}",
                f"People you may ask: {askable}",
            ]
        )
        if any(tool.name == GET_INPUT for tool in self.registry(card).offered(card.tools)):
            task += f"\nCall {GET_INPUT} for the data this run was started with."
        else:  # no tool to read it with: the input is part of the first message
            task += f"\nThe data this run was started with:\n{json.dumps(run.input, sort_keys=True)}"
        return Checkpoint(
            checkpoint_id=derive_id("ckpt", run.run_id, "0"),
            run_id=run.run_id,
            turn=0,
            saved_at=_now(),
            messages=[Message(role="system", content=card.instructions()), Message(role="user", content=task)],
        )

    async def _get(self, run_id: str) -> Versioned[RunRecord]:
        current = await self.runs.get(run_id)
        if current is None:
            raise TransientError(f"run {run_id} vanished")
        return current

    async def _checkpoint(self, run_id: str) -> Versioned[Checkpoint]:
        current = await self.checkpoints.get(run_id)
        if current is None:
            raise TransientError(f"checkpoint of {run_id} not found")
        return current

    async def _transition(self, run_id: str, target: RunState, **changes: Any) -> RunRecord:
        """Compare-and-set the run to ``target``; the state machine refuses illegal moves.

        Already in ``target``: only ``changes`` are applied. A move the state machine refuses means
        another driver got there first (e.g. a redelivery racing the original): :class:`RunMovedOn`,
        which the handlers treat as done.
        """

        def move(run: RunRecord) -> RunRecord | None:
            state = run.state
            if state is target and (not changes or state in RUN.terminal):
                return None  # a finished run's record is never rewritten
            if state is not target and not RUN.allowed(state, target):
                raise RunMovedOn(run_id, state, target)
            return evolve(run, state=target, updated_at=_now(), **changes)

        try:
            result = await self.runs.modify(run_id, move)
        except NotFound:
            raise TransientError(f"run {run_id} vanished") from None
        if result.changed:
            log.info("run.state", state=target.value)
        return result.value

    async def _emit(self, run: RunRecord, data: EventData, *id_parts: str, causation: str | None = None) -> None:
        await self.bus.publish(
            make_event(
                data,
                source=SOURCE,
                id=derive_id("evt", run.run_id, data.EVENT_TYPE, *id_parts),
                run_id=run.run_id,
                correlation_id=run.correlation_id,
                causation_id=causation,
                actor=f"agent:{run.agent}",
                tenant=run.tenant,
            )
        )
