"""The I/O shell of signed messages (AP-11, PRO-4): nonces claimed in KV, refusals journaled, and the
responder that checks every request before it is read.

:class:`MessageGate` runs :func:`~temporality_agent_collab.signing.verify` on the raw request (subject,
headers, body bytes), then claims the message's nonce in the KV bucket ``agent-nonces``
(``nonce.<agent id>.<nonce>``, created once: a second create -- on this replica or any other -- is a
replay). The bucket's TTL (10 min) outlives every timestamp the window still accepts, so a nonce is
remembered for as long as its message could be replayed; after that the timestamp is stale.

Before all that, the request takes a token of its agent's rate limit (:mod:`temporality_agent_collab.throttle`):
an agent over its limit is refused ``rate_limited`` (with ``retry_after_s``) at once, journaled once per window.

A refused message is journaled (``agent.message_refused``) *before* the refusal is replied, like every
other fact of the registry -- up to ``TEMPORALITY_COLLAB_REFUSALS_JOURNALED`` per agent, reason and window; past
that they are counted and journaled as one total when the window ends (:class:`~.throttle.Throttle`). Its event id is derived from the subject, the signature headers and the
body, so the very same bytes sent again and again are one journaled refusal (JetStream drops the
duplicates within its window) rather than a flood; a changed message is a new refusal. When the event
cannot be published the reply is ``internal_error`` (the message is refused either way).

:class:`SignedResponder` is a :class:`~temporality_bus.Responder` whose :meth:`~SignedResponder.answer`
runs the gate first: a refused request never reaches the model or the handler.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

import structlog
from nats.aio.msg import Msg
from pydantic import BaseModel, ConfigDict, ValidationError

from temporality_agent_collab.external import AllowList
from temporality_agent_collab.registry import SOURCE, utcnow
from temporality_agent_collab.signing import (
    NONCE_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Keyring,
    MessageRefused,
    ReplyKey,
    Signed,
    Verified,
    body_digest,
    verify,
)
from temporality_agent_collab.throttle import Throttle
from temporality_bus import AlreadyExists, Bus, Failure, Responder, Store
from temporality_bus.responder import validation_detail
from temporality_protocol import AgentMessageRefused, AgentRefusal, Envelope, derive_id, make_event
from temporality_protocol.catalog import BUCKET_AGENT_NONCES, subject_agent

__all__ = [
    "MAX_WINDOW_S",
    "MessageGate",
    "NonceSeen",
    "SignedResponder",
    "nonce_key",
    "omit_null",
    "refused_event",
]

log = structlog.get_logger(__name__)

Q = TypeVar("Q", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)

#: The widest timestamp window the nonce bucket's TTL covers (a nonce must outlive its message's window).
MAX_WINDOW_S = BUCKET_AGENT_NONCES.ttl_s / 2


class NonceSeen(BaseModel):
    """KV ``agent-nonces`` / ``nonce.<agent id>.<nonce>``: a nonce used once (expires with the bucket's TTL)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    agent_id: str
    subject: str
    signed_at: datetime
    seen_at: datetime


def nonce_key(agent_id: str, nonce: str) -> str:
    return f"nonce.{agent_id}.{nonce}"


def refused_event(
    refused: MessageRefused,
    subject: str,
    headers: dict[str, str] | None,
    body: bytes,
    *,
    count: int = 1,
    window_s: int | None = None,
    id: str | None = None,
    agent: str | None = None,
) -> Envelope:
    """``agent.message_refused``, its id derived from what was received (the same bytes: the same event); a
    window's total (``count``, ``window_s``) gets the ``id`` given, and ``agent`` ``*`` for many agents' refusals."""
    signed = refused.signed
    digest = body_digest(body)
    got = headers or {}
    received = json.dumps(
        [subject, refused.key_id, *(got.get(h) for h in (TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER)), digest]
    )
    agent_id = agent or refused.agent_id
    data = AgentMessageRefused(
        agent_id=agent_id[:128] if agent_id else None,
        subject=subject[:256],
        reason=refused.reason,
        detail=refused.detail[:4096],
        key_id=refused.key_id[:128] if refused.key_id else None,
        nonce=signed.nonce if signed is not None else None,
        signed_at=signed.signed_at if signed is not None else None,
        body_sha256=digest,
        claimed_agent_id=refused.claimed[:128] if refused.claimed else None,
        count=count,
        window_s=window_s,
    )
    named = data.agent_id if data.agent_id and data.agent_id != "*" else None
    return make_event(
        data,
        source=SOURCE,
        id=id or derive_id("evt", "agent.message_refused", hashlib.sha256(received.encode()).hexdigest()),
        subject=named,
        actor=f"agent:{named}" if named else None,
    )


def rate_limited_event(
    agent: str, subject: str, body: bytes, detail: str, *, count: int = 1, window_s: int | None = None, id: str
) -> Envelope:
    """``agent.message_refused`` (``rate_limited``): the requests of ``agent`` refused over its rate limit."""
    named = agent if agent and agent != "*" else None
    data = AgentMessageRefused(
        agent_id=agent[:128] or None,
        subject=subject[:256],
        reason="rate_limited",
        detail=detail[:4096],
        body_sha256=body_digest(body),
        count=count,
        window_s=window_s,
    )
    return make_event(data, source=SOURCE, id=id, subject=named, actor=f"agent:{named}" if named else None)


class MessageGate:
    """Verifies, claims the nonce, journals refusals. Build with :meth:`open`."""

    def __init__(
        self,
        bus: Bus,
        nonces: Store[NonceSeen],
        keyring: Keyring,
        *,
        window_s: float,
        clock: Callable[[], datetime] = utcnow,
        reply_key: ReplyKey | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        if not 0 < window_s <= MAX_WINDOW_S:
            raise ValueError(f"the timestamp window must be in (0, {MAX_WINDOW_S:g}] s, not {window_s}")
        self._bus = bus
        self._nonces = nonces
        self.keyring = keyring
        self.window_s = window_s
        self._clock = clock
        #: Signs every reply to an external agent (unset: replies go unsigned).
        self.reply_key = reply_key
        #: Each agent's request rate limit and the journal's limit on refusals (``None``: neither).
        self.throttle = throttle

    @classmethod
    async def open(
        cls,
        bus: Bus,
        allow_list: AllowList,
        *,
        window_s: float,
        reply_key: ReplyKey | None = None,
        throttle: Throttle | None = None,
    ) -> MessageGate:
        nonces = await bus.store(BUCKET_AGENT_NONCES, NonceSeen)
        return cls(bus, nonces, allow_list.keyring(), window_s=window_s, reply_key=reply_key, throttle=throttle)

    def over_limit(self, subject: str) -> float:
        """0.0: a request on ``subject`` may go ahead; else its agent is over its rate limit (retry after)."""
        return self.throttle.admit(subject_agent(subject) or "") if self.throttle is not None else 0.0

    async def limited(self, subject: str, body: bytes, retry_after_s: float) -> AgentRefusal:
        """The refusal of a request over its agent's rate limit, counted (and journaled once per window)."""
        assert self.throttle is not None
        agent = subject_agent(subject) or ""
        detail = (
            f"agent {agent!r} sent more requests than its rate limit ({self.throttle.describe()}): "
            f"retry after {retry_after_s:.2f} s"
        )
        first_id = derive_id("evt", "agent.rate_limited", agent, subject, str(time.time_ns()))

        def total(who: str, count: int, window: int, event_id: str) -> Envelope:
            return rate_limited_event(who, subject, body, detail, count=count, window_s=window, id=event_id)

        await self.throttle.limited(
            agent, subject, rate_limited_event(agent, subject, body, detail, id=first_id), total
        )
        return AgentRefusal(
            reason="rate_limited", detail=detail[:4096], retry_after_s=math.ceil(retry_after_s * 1000) / 1000
        )

    async def admit(self, subject: str, msg: Msg, *, pass_unknown: bool = False) -> Verified:
        """Who sent ``msg``, proven and not a replay; else the refusal is journaled and :class:`MessageRefused`
        raised. ``pass_unknown``: an unsigned message from an agent not on the allow-list is let through (the
        registration handler refuses it itself, journaling what it declared)."""
        headers: dict[str, str] | None = msg.headers
        body = bytes(msg.data)
        now = self._clock()
        try:
            verified = verify(self.keyring, subject, headers, body, now=now, window_s=self.window_s)
            if verified.signed is not None:
                await self._claim(subject, verified.signed, now)
        except MessageRefused as refused:
            if pass_unknown and refused.reason == "unknown_agent":
                return Verified(agent_id=refused.agent_id, signed=None)
            await self._journal_refusal(refused, subject, headers, body)
            log.info("agent.message_refused", subject=subject, agent_id=refused.agent_id, reason=refused.reason)
            raise
        return verified

    async def _journal_refusal(
        self, refused: MessageRefused, subject: str, headers: dict[str, str] | None, body: bytes
    ) -> None:
        event = refused_event(refused, subject, headers, body)
        if self.throttle is None:
            await self._bus.publish(event)
            return

        def total(agent: str, count: int, window_s: int, event_id: str) -> Envelope:
            return refused_event(
                refused, subject, headers, body, count=count, window_s=window_s, id=event_id, agent=agent
            )

        await self.throttle.journal("message", refused.agent_id or "", refused.reason, event, total)

    async def _claim(self, subject: str, signed: Signed, now: datetime) -> None:
        """The nonce is the key id's from now on (the signature was verified: the key id is the agent)."""
        agent_id = signed.key_id
        seen = NonceSeen(agent_id=agent_id, subject=subject, signed_at=signed.signed_at, seen_at=now)
        try:
            await self._nonces.create(nonce_key(agent_id, signed.nonce), seen)
        except AlreadyExists:
            raise MessageRefused(
                "replayed_nonce",
                f"nonce {signed.nonce!r} was already used by {agent_id!r}: sign every message afresh",
                agent_id=agent_id,
                signed=signed,
            ) from None


def omit_null(reply: bytes, fields: frozenset[str]) -> bytes:
    """``reply`` (a JSON object) without the top-level ``fields`` that are ``null``.

    The rule of every reply to an external agent (AP-10, PRO-3): a reply is a closed object (``additionalProperties:
    false``), and a property added to a protocol version *after* its first published schema (an additive change,
    the version stays) is left out when it has nothing to say -- never ``null`` -- so an agent validating against
    the version's earlier schema reads every reply that does not concern the new property exactly as before.
    Properties of the version's first schema are always present (``null`` when unset)."""
    if not fields:
        return reply
    try:
        body = json.loads(reply)
    except ValueError:
        return reply
    if not isinstance(body, dict) or not any(body.get(f, 0) is None for f in fields):
        return reply
    kept = {k: v for k, v in body.items() if not (k in fields and v is None)}
    return json.dumps(kept, ensure_ascii=False, separators=(",", ":")).encode()


class SignedResponder(Responder[Q, R]):
    """A responder whose requests pass the :class:`MessageGate` before they are decoded; ``refused`` builds
    the reply to a refused one from the claimed agent id, the refusal and the body as it came (its ids, unverified,
    echoed only so the agent can tell which of its messages was refused)."""

    def __init__(
        self,
        bus: Bus,
        subject: str,
        *,
        gate: MessageGate,
        refused: Callable[[str, AgentRefusal, bytes], R],
        on_error: Callable[[Failure], R],
        pass_unknown: bool = False,
        omit_when_null: Iterable[str] = (),
        on_malformed: Callable[[str, bytes, str], Awaitable[None]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(bus, subject, on_error=on_error, **kwargs)
        self._request_model: type[BaseModel] = kwargs["request_model"]
        #: Awaited (the sender's proven agent id, the body, why) before the ``malformed_request`` reply to a
        #: message that passed the gate but not its schema: the audit trail's record of the refusal.
        self._on_malformed = on_malformed
        self._gate = gate
        self._refused = refused
        self._error_reply = on_error
        self._pass_unknown = pass_unknown
        self._omit_when_null = frozenset(omit_when_null)

    async def answer(self, msg: Msg) -> bytes:
        """The reply, without the reply model's properties added to the protocol version after its first schema
        (``omit_when_null``) when they have nothing to say: see :func:`omit_null`."""
        return omit_null(await self._answer(msg), self._omit_when_null)

    async def _answer(self, msg: Msg) -> bytes:
        retry_after_s = self._gate.over_limit(str(msg.subject))
        if retry_after_s > 0:  # nothing else is done with it: no signature check, no nonce, no record
            refusal = await self._gate.limited(str(msg.subject), bytes(msg.data), retry_after_s)
            agent = subject_agent(str(msg.subject)) or ""
            return self._refused(agent[:64], refusal, bytes(msg.data)).model_dump_json().encode()
        try:  # the subject it came on (an agent's own: the subscription is a pattern), as signed
            verified = await self._gate.admit(str(msg.subject), msg, pass_unknown=self._pass_unknown)
            if self._on_malformed is not None and verified.agent_id:
                await self._journal_malformed(verified.agent_id, bytes(msg.data))
        except MessageRefused as refused:
            refusal = AgentRefusal(reason=refused.reason, detail=refused.detail[:4096])
            return self._refused((refused.agent_id or "")[:64], refusal, bytes(msg.data)).model_dump_json().encode()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the nonce store or the journal failed: nothing was decided, retry
            log.error("agent.gate_failed", subject=self.subject, error=repr(exc), exc_info=True)
            return (
                self._error_reply(Failure("internal", type(exc).__name__, bytes(msg.data))).model_dump_json().encode()
            )
        return await super().answer(msg)

    async def _journal_malformed(self, agent_id: str, raw: bytes) -> None:
        """A body its schema refuses is journaled before the reply says so (the responder's own check, next,
        refuses it ``malformed_request`` with the same words)."""
        assert self._on_malformed is not None
        try:
            self._request_model.model_validate_json(raw)
        except ValidationError as exc:
            await self._on_malformed(agent_id, raw, validation_detail(exc))

    async def _respond(self, msg: Msg, reply: bytes) -> None:
        """The reply with agent-collab's signature headers (when it has a reply key), never the request's own
        headers echoed back (what nats-py's ``Msg.respond`` does)."""
        key = self._gate.reply_key
        headers = key.headers(str(msg.subject), msg.reply, reply, timestamp=int(time.time())) if key else None
        try:
            await self.bus.nc.publish(msg.reply, reply, headers=headers)
        except Exception as exc:  # the requester went away or the connection dropped
            log.warning("responder.reply_failed", subject=self.subject, error=repr(exc))
