"""Human requests as stored in KV (``BUCKET_HUMAN_REQUESTS``, keyed by request id) (HUM-4).

A record is written *before* anyone is notified, so an early answer always finds it. Every later
change is a compare-and-set on the KV revision; status moves only along
:data:`temporality_protocol.HUMAN_REQUEST`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from temporality_bus import Bus, Recent, Store, Versioned, evolve
from temporality_protocol import (
    HUMAN_REQUEST,
    Envelope,
    HumanAnswer,
    HumanOption,
    HumanPolicy,
    HumanRequested,
    HumanRequestState,
    SourceLink,
)
from temporality_protocol.catalog import BUCKET_HUMAN_REQUESTS
from temporality_protocol.events import DeliveryAttempt, HumanAskKind

__all__ = [
    "MAX_LATE_ANSWERS",
    "REQUEST_ID_PATTERN",
    "HumanRequestRecord",
    "LateAnswer",
    "RecentRecords",
    "RequestStore",
    "SentCopy",
    "is_request_id",
    "list_pending",
    "open_store",
]

#: Request ids become a KV key and a subject token: keep them to a safe alphabet (ours are ``hr-<24 hex>``).
REQUEST_ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)


def is_request_id(value: str) -> bool:
    """Whether ``value`` can be a request id (and so a KV key and a subject token)."""
    return _REQUEST_ID.fullmatch(value) is not None


class SentCopy(BaseModel):
    """One copy of the question a transport carried: what it needs to edit that message later.

    ``reference`` is the transport's message id (Telegram ``message_id``, Matrix event id, the request
    id for the web inbox); ``address`` where it lives (Telegram chat id, Matrix room id).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    channel: str
    reference: str
    address: str | None = None
    sent_at: datetime
    #: Whom this copy went to (``user:<id>``): a group request has one copy per member reached.
    recipient: str | None = None
    #: Which send this is (HUM-8 chain): ``""`` the question, ``reask-<n>`` reminder n, ``escalation``.
    tag: str = ""


class LateAnswer(BaseModel):
    """An answer refused because the request had already ended (answered, expired, cancelled): kept, not applied."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    responder: str
    channel: str
    at: datetime
    #: The refusal's code: ``already_answered``, ``expired`` or ``cancelled``.
    refused: str
    answer: HumanAnswer | None = None


#: The request keeps at most this many late answers (the newest ones).
MAX_LATE_ANSWERS = 20


class HumanRequestRecord(BaseModel):
    # Tolerant on read: a newer replica may have written fields this one does not know yet (PRO-3).
    model_config = ConfigDict(extra="ignore", frozen=True)

    request_id: str
    run_id: str
    agent: str
    #: The asking agent's display name (``human.requested``'s ``agent_display_name``): None, the id is shown.
    agent_display_name: str | None = None
    title: str
    recipient: str
    #: For a ``group:<id>`` recipient: the members (``user:<id>``) asked, fixed when the request was stored;
    #: any of them may answer, the first valid answer wins. Empty for a person.
    members: list[str] = Field(default_factory=list)
    question: str
    context: str = ""
    #: OBS-1: the agent's short phrase for why it asks (``human.requested``'s ``reason``) and what kind of help it
    #: asks for (``reason_kind``): shown to the person with the question (the inbox, the chat messages' ``Why:``
    #: line). None when the agent gave none, and on a record stored before 2026-12-07.
    reason: str | None = None
    reason_kind: HumanAskKind | None = None
    options: list[HumanOption] = Field(default_factory=list)
    allow_free_text: bool = True
    #: A form the answer must fit (``HumanRequested.answer_schema``): a misfit is refused (422) before binding.
    answer_schema: dict[str, Any] | None = None
    status: HumanRequestState = HumanRequestState.PENDING
    channel: str | None = None
    created_at: datetime
    expires_at: datetime
    policy: HumanPolicy
    answer: HumanAnswer | None = None
    responder: str | None = None
    #: The responder's display name when the answer was bound ("already answered by <name>").
    responder_name: str | None = None
    answered_at: datetime | None = None
    #: The channel the answer arrived on, so a repair republishes exactly the ``human.answered`` it lost.
    answer_channel: str | None = None
    answer_published: bool = False
    #: Set once ``human.expired`` is on the bus, so a crash between the CAS and the publish is repaired.
    expiry_published: bool = False
    #: Why the run withdrew it, when it was cancelled so (``cancel_pending``'s ``because``: ``run.completed``,
    #: ``run.failed``, ``run.cancelled``, ``not_needed``) and the run's own reason (``run.failed.reason`` ...):
    #: what ``human.withdrawn`` says, however often it is published. None on a record cancelled before 2026-12-07.
    withdrawn_because: str | None = None
    withdrawn_run_reason: str | None = None
    #: Set once ``human.withdrawn`` is on the bus (after the publish): a redelivery publishes it only while unset.
    withdrawal_published: bool = False
    #: The ``human.requested`` event this record came from: causation of everything published about it.
    requested_event_id: str | None = None
    #: The saga the run belongs to (the incoming event's ``correlationid``).
    correlation_id: str | None = None
    #: The run's tenant (the incoming event's ``tenant``), carried by every event about the request, so an event
    #: trigger's ``project`` filter and a subscriber filtering by tenant see the notification, answer and expiry
    #: too. ``None`` on a record from before 2026-12-07 (its events then carry none, as before).
    tenant: str | None = None
    #: The trace context ``human.requested`` was published in (its ``traceparent`` / ``tracestate``), kept
    #: across the wait: the answer (an HTTP request hours later), the expiry and every event about the
    #: request continue that trace (docs/operations.md#tracing). ``None`` with tracing off.
    traceparent: str | None = None
    tracestate: str | None = None
    #: Every message that carries this question, one per channel it went out on (HUM-3): an answer on any
    #: of them binds, and once the request is settled each is edited to show the outcome.
    deliveries: list[SentCopy] = Field(default_factory=list)
    #: The channels tried before the one that carried it, and why each failed (``human.notified.failed_attempts``).
    failed_deliveries: list[DeliveryAttempt] = Field(default_factory=list)
    #: How many steps of the timeout policy's chain (:func:`.chain.plan`) are done (HUM-8): a firing for an
    #: earlier step is stale and does nothing.
    chain_done: int = 0
    #: The escalation target (``user:<id>`` / ``group:<id>``) once the chain escalated, and the people it
    #: stands for (fixed then, like ``members``): from then on they may answer too.
    escalated_to: str | None = None
    escalation_members: list[str] = Field(default_factory=list)
    #: Answers that came after the request ended (HUM-8: refused with a clear message and recorded here).
    late_answers: list[LateAnswer] = Field(default_factory=list)
    #: What the egress policy redacted at intake, per kind (``{"github_token": 1}``); never the secret (SEC-1).
    redactions: dict[str, int] = Field(default_factory=dict)
    #: What it redacted in the bound answer, per kind: ``answer`` (and ``human.answered``) holds the markers, never
    #: the secret (:func:`.answers.accepted`). Empty when nothing was, and in an answer an older version bound.
    answer_redactions: dict[str, int] = Field(default_factory=dict)
    #: When the request left ``pending`` (answered, expired, cancelled): the retention counts from here.
    ended_at: datetime | None = None
    #: The run's source (the PR, work item ... its launch event named): shown as a link on every channel (HUM-5).
    source_link: SourceLink | None = None
    #: Why the intake gave up before it could store the request (its ``human.requested`` dead-lettered, the error
    #: and the deliveries): the record is then stored ``cancelled`` in its place, asking nobody, so that no later
    #: delivery of the same event asks the question after its run was told (``human.rejected``,
    #: :meth:`.requests.RequestHandler.on_dead_letter`). None for every request that was taken in.
    intake_failed: str | None = None

    def may_answer(self, responder: str) -> bool:
        """Whether ``responder`` (``user:<id>``) is the recipient or, for a group request, one of its members
        (or, once the request escalated, the escalation target or one of its members)."""
        return (
            responder == self.recipient
            or responder in self.members
            or responder == self.escalated_to
            or responder in self.escalation_members
        )

    def asked(self) -> list[str]:
        """The people the question was first put to (``user:<id>``): the recipient or the group's members."""
        return list(self.members) if self.members else [self.recipient]

    def sent(self, recipient: str, tag: str) -> SentCopy | None:
        """The copy of send ``tag`` that went to ``recipient``, if any."""
        return next((c for c in self.deliveries if c.tag == tag and (c.recipient or self.recipient) == recipient), None)

    def reached(self, recipient: str) -> bool:
        """Whether a copy of the question already went to ``recipient`` (``user:<id>``)."""
        return any(
            c.recipient == recipient or (c.recipient is None and recipient == self.recipient) for c in self.deliveries
        )

    def copy_on(self, channel: str) -> SentCopy | None:
        """The copy ``channel`` carried, if it carried one."""
        return next((c for c in self.deliveries if c.channel == channel), None)

    @classmethod
    def from_requested(
        cls, event: Envelope, payload: HumanRequested, members: list[str] | None = None
    ) -> HumanRequestRecord:
        """The record for a ``human.requested`` event; created when the agent asked (the event's time)."""
        return cls(
            members=list(members or []),
            request_id=payload.request_id,
            run_id=payload.run_id,
            agent=payload.agent,
            agent_display_name=payload.agent_display_name,
            title=payload.title,
            recipient=payload.recipient,
            question=payload.question,
            context=payload.context,
            reason=payload.reason,
            reason_kind=payload.reason_kind,
            options=list(payload.options),
            allow_free_text=payload.allow_free_text,
            answer_schema=payload.answer_schema,
            status=HUMAN_REQUEST.initial,
            created_at=event.time.astimezone(UTC),
            expires_at=payload.expires_at.astimezone(UTC),
            policy=payload.policy,
            requested_event_id=event.id,
            correlation_id=event.correlationid or payload.run_id,
            tenant=event.tenant,
            traceparent=event.traceparent,
            tracestate=event.tracestate if event.traceparent else None,
            source_link=payload.source_link,
        )

    @property
    def pending(self) -> bool:
        return self.status is HumanRequestState.PENDING

    def option(self, option_id: str) -> HumanOption | None:
        return next((o for o in self.options if o.id == option_id), None)

    def moved_to(self, target: HumanRequestState, **changes: object) -> HumanRequestRecord:
        """A copy in ``target`` (checked against the state machine) with ``changes`` applied (validated)."""
        HUMAN_REQUEST.transition(self.status, target)
        if target is not HumanRequestState.PENDING and "ended_at" not in changes:
            changes["ended_at"] = datetime.now(UTC)
        return evolve(self, **changes, status=target)

    def waited_s(self, until: datetime) -> float:
        return max(0.0, round((until - self.created_at).total_seconds(), 3))


RequestStore = Store[HumanRequestRecord]


class RecentRecords(Recent[Versioned[HumanRequestRecord]]):
    """The records this replica last wrote, with their revisions (the newest ``size``): a compare-and-set on one
    of them (the answer's binding) may start from it instead of reading it (``Store.modify(known=...)``).

    Only ever the base of a compare-and-set: a stale one (another replica or timer wrote the record since) loses
    it and the record is read, so what it holds never decides anything -- it saves the read when it is current.
    :meth:`pop` takes an entry out: the caller writes the record, which makes the entry stale anyway."""


async def open_store(bus: Bus) -> RequestStore:
    return await bus.store(BUCKET_HUMAN_REQUESTS, HumanRequestRecord)


async def list_pending(store: RequestStore, recipient: str) -> list[HumanRequestRecord]:
    """The recipient's pending requests (those of the groups they were asked as a member of too), newest first.

    Scans every key of the bucket, O(requests) per call: the web inbox reads the per-recipient index
    instead (:func:`temporality_human_interaction.inbox.list_inbox`); this stays as the reference the
    index is checked against in tests.
    """
    found: list[HumanRequestRecord] = []
    for key in await store.keys():
        got = await store.get(key)
        if got is not None and got.value.may_answer(recipient) and got.value.pending:
            found.append(got.value)
    found.sort(key=lambda r: (r.created_at, r.request_id), reverse=True)
    return found
