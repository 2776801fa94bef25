"""Binding an answer to its request (HUM-4, HUM-6): who may answer, what counts, exactly once.

Flow: compare-and-set ``pending -> answered`` (answer, responder, answered_at, answer_channel,
``answer_published=False``) -> arm a repair timer -> publish ``human.answered`` (deterministic id)
-> compare-and-set ``answer_published=True``. Two racing answers: one CAS wins, the other re-reads
and is refused.

If the process dies or the bus times out between the CAS and the publish, the answer stays bound
but unannounced, and every one of these republishes the *stored* answer (same event id, so
JetStream and the journal keep one copy) and marks it published:

* the repair timer (``…schedule.human.<id>.repair``, ``repair_after_s`` after the answer), handled
  by :class:`~temporality_human_interaction.deadlines.DeadlineHandler`;
* the request's deadline timer, when it fires on an answered but unannounced request;
* any later POST: the same responder sending the identical answer gets 200, any other answer gets
  409 ``already_answered`` (saying by whom and when) after the stored answer is republished.

No second answer ever produces a second ``human.answered``.

Errors (each carries its HTTP status and a stable code)::

    AnswerRefused            -- base: the answer was not bound
    ├── RequestNotFound      -- 404 unknown_request
    ├── NotRecipient         -- 403 not_recipient: only the recipient may answer
    ├── NotPending           -- 409 already_answered / expired / cancelled (says by whom and when)
    └── InvalidAnswer        -- 422 invalid_answer: unknown option, free text not allowed, ...
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, ClassVar

import structlog
from pydantic import BaseModel, ConfigDict, StringConstraints, model_validator

from temporality_bus import Bus, Conflict, TransientError
from temporality_human_interaction.events import answered_event
from temporality_human_interaction.records import HumanRequestRecord, RequestStore, open_store
from temporality_human_interaction.timers import arm_answer_repair
from temporality_protocol import HumanAnswer, HumanRequestState, OptionAnswer, TextAnswer
from temporality_protocol.events import MAX_TEXT

__all__ = [
    "AnswerRefused",
    "AnswerSubmission",
    "InvalidAnswer",
    "NotPending",
    "NotRecipient",
    "RequestNotFound",
    "announce_answer",
    "bind_answer",
    "check_recipient",
    "interpret",
    "refusal_for",
    "unannounced",
]

log = structlog.get_logger(__name__)

_CAS_ATTEMPTS = 8
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


class AnswerRefused(Exception):
    status: ClassVar[int] = 400
    default_code: ClassVar[str] = "answer_refused"

    def __init__(self, detail: str, *, code: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.code = code or self.default_code


class RequestNotFound(AnswerRefused):
    status = 404
    default_code = "unknown_request"


class NotRecipient(AnswerRefused):
    status = 403
    default_code = "not_recipient"


class NotPending(AnswerRefused):
    status = 409
    default_code = "not_pending"

    def __init__(self, detail: str, *, code: str | None = None, record: HumanRequestRecord | None = None) -> None:
        super().__init__(detail, code=code)
        #: The request as it stood when the answer was refused.
        self.record = record


class InvalidAnswer(AnswerRefused):
    status = 422
    default_code = "invalid_answer"


def interpret(record: HumanRequestRecord, submission: AnswerSubmission) -> HumanAnswer:
    """The submission as the machine-readable answer this request accepts (HUM-6), or InvalidAnswer."""
    if submission.option_id is not None:
        option = record.option(submission.option_id)
        if option is None:
            known = ", ".join(o.id for o in record.options) or "none"
            raise InvalidAnswer(f"{submission.option_id!r} is not an option of this request (options: {known})")
        return OptionAnswer(option_id=option.id, label=option.label)
    assert submission.text is not None  # the model guarantees exactly one
    if not record.allow_free_text:
        raise InvalidAnswer("this request takes one of its options, not free text")
    return TextAnswer(value=submission.text)


def check_recipient(record: HumanRequestRecord, responder: str) -> None:
    if record.recipient != responder:
        raise NotRecipient("only the recipient may answer")


def refusal_for(record: HumanRequestRecord) -> NotPending:
    """Why a request that is not pending cannot take an answer, in a sentence for the responder."""
    if record.status is HumanRequestState.ANSWERED:
        when = record.answered_at.isoformat() if record.answered_at else "earlier"
        return NotPending(f"already answered by {record.responder} at {when}", code="already_answered", record=record)
    if record.status is HumanRequestState.EXPIRED:
        return NotPending(
            f"expired at {record.expires_at.isoformat()} without an answer", code="expired", record=record
        )
    return NotPending(f"the request is {record.status.value}", code=record.status.value, record=record)


def unannounced(record: HumanRequestRecord) -> bool:
    """An answer is bound but its ``human.answered`` is not known to be on the bus."""
    return record.status is HumanRequestState.ANSWERED and not record.answer_published


def _is_repost(record: HumanRequestRecord, responder: str, submission: AnswerSubmission) -> bool:
    """The same responder sends the identical answer to a bound but unannounced request."""
    if record.status is not HumanRequestState.ANSWERED or record.answer_published or record.responder != responder:
        return False
    try:
        return interpret(record, submission) == record.answer
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
) -> HumanRequestRecord:
    """Bind ``submission`` from ``responder`` (``user:<id>``) to ``request_id``; returns the answered record.

    Raises :class:`AnswerRefused` subclasses; bus failures propagate (the API answers 503).
    """
    store = await open_store(bus)
    try:
        record, fresh = await _bind(store, request_id, responder, submission, channel, clock or _utcnow)
    except NotPending as refused:
        if refused.record is not None and unannounced(refused.record):
            # Refused, but the answer that was bound first may never have been announced: announce it now.
            with structlog.contextvars.bound_contextvars(request_id=request_id, run_id=refused.record.run_id):
                log.info("answer.republishing", trigger="refused_answer")
                await announce_answer(bus, refused.record, store=store)
        raise
    with structlog.contextvars.bound_contextvars(request_id=request_id, run_id=record.run_id):
        if fresh:
            await _arm_repair(bus, record, repair_after_s)
        return await announce_answer(bus, record, store=store)


async def announce_answer(
    bus: Bus, record: HumanRequestRecord, *, store: RequestStore | None = None
) -> HumanRequestRecord:
    """Publish the bound answer's ``human.answered`` and mark it published; returns the record as marked.

    Idempotent: the event id is derived from the request, so a repeat is deduplicated by JetStream.
    """
    store = store or await open_store(bus)
    channel = record.answer_channel or _DEFAULT_ANSWER_CHANNEL
    result = await bus.publish(answered_event(record, channel=channel))
    log.info("request.answered", responder=record.responder, channel=channel, duplicate=result.duplicate)
    return await _mark_published(store, record.request_id)


async def _arm_repair(bus: Bus, record: HumanRequestRecord, repair_after_s: float) -> None:
    """Arm the timer that announces this answer if the publish below is lost.

    A failure here does not stop the publish; the deadline timer and any later POST still repair.
    """
    assert record.answered_at is not None
    at = record.answered_at + timedelta(seconds=repair_after_s)
    try:
        result = await arm_answer_repair(bus, record.request_id, at)
    except Exception as exc:
        log.warning("answer.repair_timer_failed", error=repr(exc))
        return
    log.info("answer.repair_timer_armed", at=at.isoformat(), duplicate=result.duplicate)


async def _bind(
    store: RequestStore,
    request_id: str,
    responder: str,
    submission: AnswerSubmission,
    channel: str,
    clock: Callable[[], datetime],
) -> tuple[HumanRequestRecord, bool]:
    """The answered record, and whether this call bound it (False: a repost of an unannounced answer)."""
    lost_race = False
    for _ in range(_CAS_ATTEMPTS):
        got = await store.get(request_id)
        if got is None:
            raise RequestNotFound(f"there is no request {request_id}")
        record = got.value
        check_recipient(record, responder)
        # A POST that lost a CAS race is refused outright: of two racing answers exactly one succeeds.
        if not lost_race and _is_repost(record, responder, submission):
            log.info("answer.republishing", request_id=request_id, trigger="same_answer")
            return record, False
        if not record.pending:
            raise refusal_for(record)
        answer = interpret(record, submission)
        answered = record.moved_to(
            HumanRequestState.ANSWERED,
            answer=answer,
            responder=responder,
            answered_at=clock(),
            answer_channel=channel,
            answer_published=False,
        )
        try:
            await store.update(request_id, answered, got.revision)
        except Conflict:
            lost_race = True
            continue
        return answered, True
    raise TransientError(f"request {request_id}: too many concurrent updates while binding an answer")


async def _mark_published(store: RequestStore, request_id: str) -> HumanRequestRecord:
    for _ in range(_CAS_ATTEMPTS):
        got = await store.get(request_id)
        if got is None:  # pragma: no cover - requests are never deleted
            raise TransientError(f"request {request_id} vanished")
        if got.value.answer_published:
            return got.value
        marked = got.value.model_copy(update={"answer_published": True})
        try:
            await store.update(request_id, marked, got.revision)
        except Conflict:
            continue
        return marked
    raise TransientError(f"request {request_id}: too many concurrent updates while marking the answer published")
