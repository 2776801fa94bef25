"""Human requests as stored in KV (``BUCKET_HUMAN_REQUESTS``, keyed by request id) (HUM-4).

A record is written *before* anyone is notified, so an early answer always finds it. Every later
change is a compare-and-set on the KV revision; status moves only along
:data:`temporality_protocol.HUMAN_REQUEST`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from temporality_bus import Bus, Store, evolve
from temporality_protocol import (
    HUMAN_REQUEST,
    Envelope,
    HumanAnswer,
    HumanOption,
    HumanPolicy,
    HumanRequested,
    HumanRequestState,
)
from temporality_protocol.catalog import BUCKET_HUMAN_REQUESTS
from temporality_protocol.events import DeliveryAttempt

__all__ = [
    "REQUEST_ID_PATTERN",
    "HumanRequestRecord",
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


class HumanRequestRecord(BaseModel):
    # Tolerant on read: a newer replica may have written fields this one does not know yet (PRO-3).
    model_config = ConfigDict(extra="ignore", frozen=True)

    request_id: str
    run_id: str
    agent: str
    title: str
    recipient: str
    question: str
    context: str = ""
    options: list[HumanOption] = Field(default_factory=list)
    allow_free_text: bool = True
    status: HumanRequestState = HumanRequestState.PENDING
    channel: str | None = None
    created_at: datetime
    expires_at: datetime
    policy: HumanPolicy
    answer: HumanAnswer | None = None
    responder: str | None = None
    answered_at: datetime | None = None
    #: The channel the answer arrived on, so a repair republishes exactly the ``human.answered`` it lost.
    answer_channel: str | None = None
    answer_published: bool = False
    #: Set once ``human.expired`` is on the bus, so a crash between the CAS and the publish is repaired.
    expiry_published: bool = False
    #: The ``human.requested`` event this record came from: causation of everything published about it.
    requested_event_id: str | None = None
    #: The saga the run belongs to (the incoming event's ``correlationid``).
    correlation_id: str | None = None
    #: Every message that carries this question, one per channel it went out on (HUM-3): an answer on any
    #: of them binds, and once the request is settled each is edited to show the outcome.
    deliveries: list[SentCopy] = Field(default_factory=list)
    #: The channels tried before the one that carried it, and why each failed (``human.notified.failed_attempts``).
    failed_deliveries: list[DeliveryAttempt] = Field(default_factory=list)

    def copy_on(self, channel: str) -> SentCopy | None:
        """The copy ``channel`` carried, if it carried one."""
        return next((c for c in self.deliveries if c.channel == channel), None)

    @classmethod
    def from_requested(cls, event: Envelope, payload: HumanRequested) -> HumanRequestRecord:
        """The record for a ``human.requested`` event; created when the agent asked (the event's time)."""
        return cls(
            request_id=payload.request_id,
            run_id=payload.run_id,
            agent=payload.agent,
            title=payload.title,
            recipient=payload.recipient,
            question=payload.question,
            context=payload.context,
            options=list(payload.options),
            allow_free_text=payload.allow_free_text,
            status=HUMAN_REQUEST.initial,
            created_at=event.time.astimezone(UTC),
            expires_at=payload.expires_at.astimezone(UTC),
            policy=payload.policy,
            requested_event_id=event.id,
            correlation_id=event.correlationid or payload.run_id,
        )

    @property
    def pending(self) -> bool:
        return self.status is HumanRequestState.PENDING

    def option(self, option_id: str) -> HumanOption | None:
        return next((o for o in self.options if o.id == option_id), None)

    def moved_to(self, target: HumanRequestState, **changes: object) -> HumanRequestRecord:
        """A copy in ``target`` (checked against the state machine) with ``changes`` applied (validated)."""
        HUMAN_REQUEST.transition(self.status, target)
        return evolve(self, **changes, status=target)

    def waited_s(self, until: datetime) -> float:
        return max(0.0, round((until - self.created_at).total_seconds(), 3))


RequestStore = Store[HumanRequestRecord]


async def open_store(bus: Bus) -> RequestStore:
    return await bus.store(BUCKET_HUMAN_REQUESTS, HumanRequestRecord)


async def list_pending(store: RequestStore, recipient: str) -> list[HumanRequestRecord]:
    """The recipient's pending requests, newest first.

    Scans every key of the bucket: fine for a demo-sized directory, O(requests) per call. A per-user
    index (a KV key per (recipient, request) or a journal query) should replace it before real load.
    """
    found: list[HumanRequestRecord] = []
    for key in await store.keys():
        got = await store.get(key)
        if got is not None and got.value.recipient == recipient and got.value.pending:
            found.append(got.value)
    found.sort(key=lambda r: (r.created_at, r.request_id), reverse=True)
    return found
