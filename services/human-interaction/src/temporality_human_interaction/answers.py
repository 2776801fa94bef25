"""Binding an answer to its request (HUM-4, HUM-6): who may answer, what counts, exactly once.

Flow: compare-and-set ``pending -> answered`` (answer, responder, answered_at, answer_channel,
``answer_published=False``) -> arm a repair timer and publish ``human.answered`` (deterministic id), one
pipelined round trip, the timer's write first, each stored or not on its own (the run entry's inbox mark, best
effort, concurrently) -> compare-and-set ``answer_published=True``. Two racing answers: one CAS wins, the other
re-reads and is refused.

The answer is stored, published and journaled **redacted** (SEC-1, :func:`accepted`): a secret a person pasted into
free text, or into a form's field, is ``[REDACTED:<kind>]`` in the record, in ``human.answered`` and so for the
agent, on every channel (this is the one place every channel's answer is bound).

If the process dies or the bus times out between the CAS and the publish, the answer stays bound
but unannounced, and every one of these republishes the *stored* answer (same event id, so
JetStream and the journal keep one copy) and marks it published:

* the repair timer (``…schedule.human.<id>.repair``, ``repair_after_s`` after the answer), handled
  by :class:`~temporality_human_interaction.deadlines.DeadlineHandler`;
* the request's deadline timer, when it fires on an answered but unannounced request;
* any later answer to the request (any channel), after the stored answer is checked.

One documented behaviour for a repeated answer, whatever its timing (before or after the first one
was announced, racing it or long after): the **same responder sending the identical answer** gets the
bound record back, marked ``already_recorded`` (HTTP 200 ``{"already_recorded": true, ...}``; a chat
adapter says "already recorded"), and nothing new is bound or published (an unannounced answer is
announced); **any other answer** (another value, or another person) is refused: 409
``already_answered`` saying by whom and when (403 ``not_recipient`` for someone who may not answer).

No second answer ever produces a second ``human.answered``.

Errors (each carries its HTTP status and a stable code)::

    AnswerRefused            -- base: the answer was not bound
    ├── RequestNotFound      -- 404 unknown_request
    ├── NotRecipient         -- 403 not_recipient: only the recipient may answer
    ├── NotPending           -- 409 already_answered / expired / cancelled (says by whom and when)
    └── InvalidAnswer        -- 422 invalid_answer: unknown option, free text not allowed, ...
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import structlog
from pydantic import BaseModel, ConfigDict, StringConstraints, model_validator

from temporality_bus import Bus, NotFound, PublishResult, TransientError, Versioned, evolve
from temporality_bus.pipeline import event_write
from temporality_human_interaction.egress import DEFAULT_POLICY, EgressPolicy, SecretUnfit
from temporality_human_interaction.events import RefusedReason, answer_refused_event, answered_event
from temporality_human_interaction.records import (
    MAX_LATE_ANSWERS,
    HumanRequestRecord,
    LateAnswer,
    RecentRecords,
    RequestStore,
    open_store,
)
from temporality_human_interaction.timers import answer_repair_write
from temporality_protocol import HumanAnswer, HumanRequestState, OptionAnswer, TextAnswer, forms
from temporality_protocol.events import MAX_TEXT
from temporality_protocol.redaction import MARKER
from temporality_service import ApiError

if TYPE_CHECKING:
    from temporality_human_interaction.metrics import RequestObserver
    from temporality_human_interaction.mirror import ChannelMirror

__all__ = [
    "AnswerRefused",
    "AnswerSubmission",
    "InvalidAnswer",
    "NotPending",
    "NotRecipient",
    "RequestNotFound",
    "announce_answer",
    "bind_answer",
    "bind_answer_outcome",
    "check_recipient",
    "interpret",
    "refusal_for",
    "timeout_outcome",
    "unannounced",
]

log = structlog.get_logger(__name__)

#: Records bound before ``answer_channel`` was stored took their answer from the web inbox.
_DEFAULT_ANSWER_CHANNEL = "web"
#: How long after binding an answer its repair timer fires (the service passes its setting).
DEFAULT_REPAIR_AFTER_S = 30.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


class AnswerSubmission(BaseModel):
    """What a person sends: exactly one of an option id or free text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    option_id: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    text: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_TEXT)] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> AnswerSubmission:
        if (self.option_id is None) == (self.text is None):
            raise ValueError("give exactly one of option_id or text")
        return self


class AnswerRefused(ApiError):
    """The answer was not bound; ``status`` and ``code`` say why on every channel (the web inbox answers
    with them, a chat adapter tells the responder ``detail``)."""

    status = 400
    code = "answer_refused"


class RequestNotFound(AnswerRefused):
    status = 404
    code = "unknown_request"


class NotRecipient(AnswerRefused):
    status = 403
    code = "not_recipient"

    def __init__(self, detail: str, *, record: HumanRequestRecord | None = None) -> None:
        super().__init__(detail)
        #: The request the answer was for (journaled as ``human.answer_refused``).
        self.record = record


class NotPending(AnswerRefused):
    status = 409
    code = "not_pending"

    def __init__(self, detail: str, *, code: str | None = None, record: HumanRequestRecord | None = None) -> None:
        super().__init__(detail, code=code)
        #: The request as it stood when the answer was refused.
        self.record = record


class InvalidAnswer(AnswerRefused):
    status = 422
    code = "invalid_answer"


def interpret(
    record: HumanRequestRecord, submission: AnswerSubmission, egress: EgressPolicy | None = None
) -> HumanAnswer:
    """The submission as the machine-readable answer this request accepts (HUM-6), or InvalidAnswer; redacted by
    ``egress`` (:func:`accepted`)."""
    return accepted(record, submission, egress)[0]


def accepted(
    record: HumanRequestRecord, submission: AnswerSubmission, egress: EgressPolicy | None = None
) -> tuple[HumanAnswer, dict[str, int]]:
    """The answer as it is stored and published (SEC-1), and what was redacted in it per kind.

    Checked first (:func:`_checked`), then redacted by ``egress`` (the default policy without one):
    :meth:`.EgressPolicy.redact_answer`. A form's answer that fits the form only with its secret is InvalidAnswer
    (the person answers without the secret, or declines)."""
    answer, read = _checked(record, submission)
    return _redacted(record, answer, read, egress or DEFAULT_POLICY)


def _checked(record: HumanRequestRecord, submission: AnswerSubmission) -> tuple[HumanAnswer, forms.FormRead | None]:
    """The submission as the answer this request accepts, unredacted, and its form's reading (None without a form).

    A request with a form (``answer_schema``, an MCP elicitation) takes only an answer that fits it, read
    exactly as the run-executor will read it (:func:`temporality_protocol.forms.read`): a number field given
    "soon", a required field left out, a value outside an enum are refused here, before anything is bound,
    with the reason (the field and what is wrong) for the person."""
    answer: HumanAnswer
    if submission.option_id is not None:
        option = record.option(submission.option_id)
        if option is None:
            known = ", ".join(o.id for o in record.options) or "none"
            raise InvalidAnswer(f"{submission.option_id!r} is not an option of this request (options: {known})")
        answer = OptionAnswer(option_id=option.id, label=option.label)
    else:
        assert submission.text is not None  # the model guarantees exactly one
        if not record.allow_free_text:
            raise InvalidAnswer("this request takes one of its options, not free text")
        answer = TextAnswer(value=submission.text)
    read: forms.FormRead | None = None
    if record.answer_schema is not None:
        read = forms.read(record.answer_schema, answer)
        if read.refused is not None:
            raise InvalidAnswer(f"the answer does not fit the form: {read.refused}"[:MAX_TEXT])
        if (hidden := _redacted_choice(record.answer_schema, read.content)) is not None:
            raise InvalidAnswer(
                f"the answer does not fit the form: field {hidden!r}: its values are secrets and were redacted, "
                "so none can be chosen here (decline, or answer the other fields)"
            )
    return answer, read


def _redacted(
    record: HumanRequestRecord, answer: HumanAnswer, read: forms.FormRead | None, egress: EgressPolicy
) -> tuple[HumanAnswer, dict[str, int]]:
    """:func:`accepted`'s redaction of the checked ``answer`` (:meth:`.EgressPolicy.redact_answer`)."""
    try:
        return egress.redact_answer(record, answer, read)
    except SecretUnfit as unfit:
        raise InvalidAnswer(
            f"the answer holds a secret ({', '.join(unfit.kinds)}), which is never passed on, and without it it "
            "does not fit the form: answer without the secret, or decline"
        ) from None


def _redacted_choice(schema: dict[str, Any], content: dict[str, Any] | None) -> str | None:
    """The field whose value in ``content`` is one of its choices that the egress policy redacted (a secret
    field's enum, :func:`temporality_protocol.redaction.redact_form`): the agent never offered that value, so
    it is no answer. None when there is none."""
    fields = forms.form_fields(schema)
    for name, value in (content or {}).items():
        prop = fields.get(name)
        if not isinstance(value, str) or prop is None or MARKER.search(value) is None:
            continue
        choices = forms.field_choices(prop) or []
        if any(value == choice for choice, _ in choices):
            return name
    return None


def check_recipient(record: HumanRequestRecord, responder: str, doing: str = "answer") -> None:
    """NotRecipient unless ``responder`` may answer ``record``; ``doing`` is what the 403 says they may not do
    (``answer``, or ``read it`` for a read of the question)."""
    if not record.may_answer(responder):
        who = f"the members of {record.recipient}" if record.members else "the recipient"
        if record.escalated_to is not None:
            raise NotRecipient(f"only {who} or {record.escalated_to} (escalated to) may {doing}", record=record)
        raise NotRecipient(f"only {who} may {doing}", record=record)


def timeout_outcome(record: HumanRequestRecord) -> str:
    """What the run did when nobody answered in time (the timeout policy applied at the deadline)."""
    on_timeout = record.policy.on_timeout
    escalated = f" (it had been escalated to {record.escalated_to})" if record.escalated_to else ""
    if on_timeout.action == "default" and on_timeout.default_option is not None:
        option = record.option(on_timeout.default_option)
        done = f"the run went ahead with the default: “{option.label if option else on_timeout.default_option}”"
    elif on_timeout.action == "cancel":
        done = "the run was cancelled"
    else:
        done = "the run stopped without an answer"
    return done + escalated


def refusal_for(record: HumanRequestRecord) -> NotPending:
    """Why a request that is not pending cannot take an answer, in a sentence for the responder."""
    if record.status is HumanRequestState.ANSWERED:
        when = record.answered_at.isoformat() if record.answered_at else "earlier"
        who = record.responder or "someone"
        if record.responder_name and record.responder_name != record.responder:
            who = f"{record.responder_name} ({record.responder})"
        return NotPending(f"already answered by {who} at {when}", code="already_answered", record=record)
    if record.status is HumanRequestState.EXPIRED:
        return NotPending(
            f"expired at {record.expires_at.isoformat()} without an answer: {timeout_outcome(record)}",
            code="expired",
            record=record,
        )
    return NotPending(f"the request is {record.status.value}", code=record.status.value, record=record)


def unannounced(record: HumanRequestRecord) -> bool:
    """An answer is bound but its ``human.answered`` is not known to be on the bus."""
    return record.status is HumanRequestState.ANSWERED and not record.answer_published


def _is_repost(
    record: HumanRequestRecord, responder: str, submission: AnswerSubmission, egress: EgressPolicy | None = None
) -> bool:
    """The same responder sends the identical answer to an answered request (announced or not): the same answer as
    stored (redacted), or as a version that did not redact answers stored it."""
    if record.status is not HumanRequestState.ANSWERED or record.responder != responder:
        return False
    try:
        raw, read = _checked(record, submission)
        return record.answer in (raw, _redacted(record, raw, read, egress or DEFAULT_POLICY)[0])
    except InvalidAnswer:
        return False


async def bind_answer(
    bus: Bus,
    *,
    request_id: str,
    responder: str,
    submission: AnswerSubmission,
    channel: str,
    clock: Callable[[], datetime] | None = None,
    repair_after_s: float = DEFAULT_REPAIR_AFTER_S,
    responder_name: str | None = None,
    egress: EgressPolicy | None = None,
) -> HumanRequestRecord:
    """Bind ``submission`` from ``responder`` (``user:<id>``) to ``request_id``; returns the answered record.

    The answer is stored and published redacted by ``egress`` (the default policy without one; :func:`accepted`).
    Raises :class:`AnswerRefused` subclasses; bus failures propagate (the API answers 503).
    """
    record, _ = await bind_answer_outcome(
        bus,
        request_id=request_id,
        responder=responder,
        submission=submission,
        channel=channel,
        clock=clock,
        repair_after_s=repair_after_s,
        responder_name=responder_name,
        egress=egress,
    )
    return record


async def bind_answer_outcome(
    bus: Bus,
    *,
    request_id: str,
    responder: str,
    submission: AnswerSubmission,
    channel: str,
    clock: Callable[[], datetime] | None = None,
    repair_after_s: float = DEFAULT_REPAIR_AFTER_S,
    responder_name: str | None = None,
    egress: EgressPolicy | None = None,
    observer: RequestObserver | None = None,
    mirror: ChannelMirror | None = None,
    recent: RecentRecords | None = None,
) -> tuple[HumanRequestRecord, bool]:
    """:func:`bind_answer`, also saying whether the answer was already recorded (an identical repeat).

    ``observer`` is told the answered request once, by the call whose compare-and-set bound it. ``recent``: the
    records this replica wrote last; the binding's compare-and-set starts from the request's, if it is there
    (no read; a stale one loses the compare-and-set and the record is read). ``mirror``: passed to
    :func:`~.inbox.unindex` (the run entry's mark).

    A refusal for a request that exists (ended, or not this responder's to answer) is journaled as
    ``human.answer_refused`` before it is raised (HUM-7, HUM-9); a free-text answer in it is redacted by
    ``egress``. A bus failure publishing it propagates (503 / "try again"): the retry publishes the same id.
    """
    store = await open_store(bus)
    now = clock or _utcnow
    try:
        known = recent.pop(request_id) if recent is not None else None
        bound, fresh = await _bind(
            store, request_id, responder, submission, channel, now, responder_name, known, egress or DEFAULT_POLICY
        )
    except NotRecipient as refused:
        if refused.record is not None:
            await _journal_refusal(bus, refused.record, responder, submission, channel, refused, now(), egress)
        raise
    except NotPending as refused:
        received_at = now()
        await _record_late(store, request_id, responder, submission, channel, refused, now, egress)
        if refused.record is not None:
            await _journal_refusal(bus, refused.record, responder, submission, channel, refused, received_at, egress)
        if refused.record is not None and unannounced(refused.record):
            # Refused, but the answer that was bound first may never have been announced: announce it now.
            with structlog.contextvars.bound_contextvars(request_id=request_id, run_id=refused.record.run_id):
                log.info("answer.republishing", trigger="refused_answer")
                await announce_answer(bus, refused.record, store=store)
        raise
    record = bound.value
    with structlog.contextvars.bound_contextvars(request_id=request_id, run_id=record.run_id):
        if fresh:
            from temporality_human_interaction.inbox import unindex

            if observer is not None:
                observer.ended(record)
            if record.answer_redactions:
                log.info("answer.redacted", redacted=record.answer_redactions)

            # The repair timer and human.answered in one round trip (the timer's write first), and the run entry's
            # mark concurrently: the caller (the POST's reply) waits for both, so the mark adds no round trip of its
            # own to the wait but is done when this returns; it is best effort (a failure is logged, not raised).
            assert record.answered_at is not None
            announced, _ = await asyncio.gather(
                _announce(bus, record, store, bound, repair_at=record.answered_at + timedelta(seconds=repair_after_s)),
                unindex(bus, record, mirror),  # catches its own errors
                return_exceptions=True,
            )
            if isinstance(announced, BaseException):
                raise announced
            return announced, False
        elif record.answer_published:
            log.info("answer.already_recorded", responder=responder)
            return record, True
        else:
            log.info("answer.republishing", trigger="same_answer")
        # the mark's compare-and-set starts from the record as bound (no read back; a stale one reads again)
        return await announce_answer(bus, record, store=store, known=bound), not fresh


_JOURNALED: frozenset[str] = frozenset({"already_answered", "expired", "cancelled", "not_recipient"})


async def _journal_refusal(
    bus: Bus,
    record: HumanRequestRecord,
    responder: str,
    submission: AnswerSubmission,
    channel: str,
    refused: AnswerRefused,
    received_at: datetime,
    egress: EgressPolicy | None,
) -> None:
    """Publish ``human.answer_refused`` for ``refused`` (deterministic id per request, responder, submission)."""
    if refused.code not in _JOURNALED:
        return
    reason: RefusedReason = refused.code  # type: ignore[assignment]  # checked against _JOURNALED above
    answer: HumanAnswer | None
    try:
        answer = interpret(record, submission, egress)  # redacted: the journal holds no secret either (SEC-1)
    except InvalidAnswer:
        answer = None
    key = f"option:{submission.option_id}" if submission.option_id is not None else f"text:{submission.text}"
    event = answer_refused_event(
        record,
        responder=responder,
        channel=channel,
        reason=reason,
        detail=refused.detail,
        received_at=received_at,
        answer=answer,
        submission_key=key,
    )
    result = await bus.publish(event)
    log.info(
        "answer.refusal_journaled",
        request_id=record.request_id,
        responder=responder,
        reason=reason,
        duplicate=result.duplicate,
    )


async def _record_late(
    store: RequestStore,
    request_id: str,
    responder: str,
    submission: AnswerSubmission,
    channel: str,
    refused: NotPending,
    clock: Callable[[], datetime],
    egress: EgressPolicy | None = None,
) -> None:
    """Keep an answer refused because the request had ended in ``late_answers`` (best effort: never
    changes the refusal; the newest :data:`MAX_LATE_ANSWERS` are kept), redacted like a bound one."""
    record = refused.record
    answer: HumanAnswer | None = None
    if record is not None:
        try:
            answer = interpret(record, submission, egress)
        except InvalidAnswer:
            answer = None
    late = LateAnswer(responder=responder, channel=channel, at=clock(), refused=refused.code, answer=answer)

    def keep(current: HumanRequestRecord) -> HumanRequestRecord | None:
        if current.pending:
            return None
        return evolve(current, late_answers=[*current.late_answers, late][-MAX_LATE_ANSWERS:])

    try:
        await store.modify(request_id, keep)
    except Exception as exc:
        log.warning("answer.late_not_recorded", request_id=request_id, error=repr(exc))
        return
    log.info("answer.late_recorded", request_id=request_id, responder=responder, refused=refused.code)


async def announce_answer(
    bus: Bus,
    record: HumanRequestRecord,
    *,
    store: RequestStore | None = None,
    known: Versioned[HumanRequestRecord] | None = None,
) -> HumanRequestRecord:
    """Publish the bound answer's ``human.answered`` and mark it published; returns the record as marked.

    Idempotent: the event id is derived from the request, so a repeat is deduplicated by JetStream.
    ``known``: the stored record and its revision as the caller just read or wrote it; the mark starts from it
    (``Store.modify(known=...)``: the compare-and-set proves it current, a stale one is read again).
    """
    return await _announce(bus, record, store or await open_store(bus), known)


async def _announce(
    bus: Bus,
    record: HumanRequestRecord,
    store: RequestStore,
    known: Versioned[HumanRequestRecord] | None,
    *,
    repair_at: datetime | None = None,
) -> HumanRequestRecord:
    """Publish ``human.answered`` and mark it published (:func:`announce_answer`); with ``repair_at``, the answer's
    repair timer (due then) is armed in the same pipelined round trip, its write sent first.

    The two writes of that round are stored independently: the event can be stored while the timer's write failed,
    or the other way round. A failed timer is logged as ``answer.repair_timer_failed`` and the publish goes on: the
    answer is then announced and marked with no repair timer, so should the mark fail, the request's deadline timer
    or any later answer is what announces it again (same event id). A failed publish raises (a 503 / "try again"),
    with the timer armed or not (not: the deadline timer or a later answer announces the bound answer).
    """
    channel = record.answer_channel or _DEFAULT_ANSWER_CHANNEL
    event = answered_event(record, channel=channel)
    if repair_at is None:
        result = await bus.publish(event)
    else:
        timer, published = await bus.pipeline.send(
            [answer_repair_write(bus, record.request_id, repair_at), event_write(event)]
        )
        if isinstance(timer, PublishResult):
            log.info("answer.repair_timer_armed", at=repair_at.isoformat(), duplicate=timer.duplicate)
        else:
            log.warning("answer.repair_timer_failed", error=repr(timer))
        if not isinstance(published, PublishResult):
            raise published
        result = published
    log.info("request.answered", responder=record.responder, channel=channel, duplicate=result.duplicate)
    return await _mark_published(store, record.request_id, known)


async def _bind(
    store: RequestStore,
    request_id: str,
    responder: str,
    submission: AnswerSubmission,
    channel: str,
    clock: Callable[[], datetime],
    responder_name: str | None = None,
    known: Versioned[HumanRequestRecord] | None = None,
    egress: EgressPolicy = DEFAULT_POLICY,
) -> tuple[Versioned[HumanRequestRecord], bool]:
    """The answered record (with its revision), and whether this call bound it (False: the identical answer was
    already bound).

    One :meth:`~temporality_bus.Store.modify`: of two racing answers one compare-and-set wins; the
    other's ``bind`` runs again on the winner's record: an identical answer from the same responder is
    then a repeat (already recorded), anything else is refused. ``known``: the record as this replica last
    wrote it; only a binding is ever written from it, by a compare-and-set on its revision (a stale one loses
    it); a refusal or a repeat is decided on the record as read (``Store.modify``). The answer is stored redacted
    by ``egress`` (:func:`accepted`), what was redacted counted in ``answer_redactions``.
    """
    repost = False

    def bind(record: HumanRequestRecord) -> HumanRequestRecord | None:
        nonlocal repost
        repost = False  # of this attempt: an earlier one may have run on a record that was not current
        check_recipient(record, responder)
        if _is_repost(record, responder, submission, egress):
            repost = True
            return None
        if not record.pending:
            raise refusal_for(record)
        answer, redacted = accepted(record, submission, egress)
        return record.moved_to(
            HumanRequestState.ANSWERED,
            answer=answer,
            answer_redactions=redacted,
            responder=responder,
            responder_name=responder_name,
            answered_at=clock(),
            answer_channel=channel,
            answer_published=False,
        )

    try:
        result = await store.modify(request_id, bind, known=known)
    except NotFound:
        raise RequestNotFound(f"there is no request {request_id}") from None
    return result, result.changed and not repost


async def _mark_published(
    store: RequestStore, request_id: str, known: Versioned[HumanRequestRecord] | None = None
) -> HumanRequestRecord:
    try:
        marked = await store.modify(
            request_id, lambda r: None if r.answer_published else evolve(r, answer_published=True), known=known
        )
    except NotFound:  # pragma: no cover - requests are never deleted
        raise TransientError(f"request {request_id} vanished") from None
    return marked.value
