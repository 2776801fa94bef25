"""The channel adapter ABC: one small interface, one class per transport (HUM-3).

Modelled on python-telegram-bot's ``BaseRequest``: an explicit lifecycle, public final methods
wrapping transport-specific ``do_*`` hooks, and no transport detail leaking past the adapter.

Lifecycle::

    adapter = TelegramAdapter(...)          # no I/O
    adapter.attach(inbound)                 # where answers go (before initialize; optional for send-only)
    async with adapter:                     # initialize(): log in, start polling/syncing
        await adapter.deliver(record, profile)    # the question; returns a DeliveryReceipt
        await adapter.update(record, copy)          # edit a sent copy to show the outcome
        await adapter.notify(profile, "text", key=k)  # a plain notification (k: its idempotency key)
                                            # shutdown(): stop polling, close sessions

Outbound: :meth:`ChannelAdapter.deliver` (the question), :meth:`ChannelAdapter.update` (the sent
message edited to show the outcome: answered by whom and what, expired, cancelled) and
:meth:`ChannelAdapter.notify` (plain text). Inbound: a transport that receives a person's answer
(a button, a reaction, a reply) builds an :class:`InboundAnswer` — request id, option id or free
text, and the *channel identity* of who answered (a Telegram user id, a Matrix user id) — and hands
it to :meth:`ChannelAdapter.submit`, which calls the one channel-neutral binding
(:class:`temporality_human_interaction.inbound.AnswerRouter`, over
:func:`~temporality_human_interaction.answers.bind_answer`). The adapter tells the responder the
:class:`InboundResult` (recorded, or refused and why); it never decides who may answer itself.

Errors::

    ChannelError          -- base of everything an adapter raises
    ├── ChannelUnavailable -- the adapter is not initialized / its transport is down: try the next channel
    └── DeliveryFailed     -- the transport refused or failed this delivery: try the next channel, then retry

Egress (HUM-5, SEC-1): :meth:`ChannelAdapter.deliver`, :meth:`ChannelAdapter.update` and
:meth:`ChannelAdapter.notify` hand the ``do_*`` hooks the request / text as the adapter's
:attr:`ChannelAdapter.egress` policy lets it leave on this channel: secrets redacted, each text field
truncated to the channel's limit with a visible marker.

Metrics: :meth:`ChannelAdapter.deliver` reports each attempt (delivered, failed, unavailable) to the
adapter's :attr:`ChannelAdapter.observer` (``temporality_human_deliveries_total``, :mod:`..metrics`); a person
with no identity on the channel is not an attempt.

Contract for implementations: ``do_deliver`` renders only the compact question (HUM-5) and never
the run's technical context; it stores what it needs to bind replies (``channels.refs``) *before*
the message leaves, so an instant answer is never lost. ``do_update`` may be called more than once
for the same outcome (a redelivery, a repair) and must tolerate it.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, Self

from temporality_human_interaction.answers import AnswerRefused, AnswerSubmission
from temporality_human_interaction.directory import UserProfile
from temporality_human_interaction.egress import DEFAULT_POLICY, EgressPolicy
from temporality_human_interaction.records import HumanRequestRecord, SentCopy

if TYPE_CHECKING:
    from temporality_human_interaction.metrics import DeliveryObserver, DeliveryOutcome

__all__ = [
    "AnswerSink",
    "ChannelAdapter",
    "ChannelError",
    "ChannelUnavailable",
    "DeliveryFailed",
    "DeliveryReceipt",
    "InboundAnswer",
    "InboundResult",
]


class ChannelError(Exception):
    """Base of every adapter error."""


class ChannelUnavailable(ChannelError):
    pass


class DeliveryFailed(ChannelError):
    pass


@dataclass(frozen=True)
class DeliveryReceipt:
    """What the transport says about a delivery: ``reference`` (message / event id) and ``address`` (chat /
    room id) are stored in the request record (:class:`SentCopy`) so the message can be edited later."""

    channel: str
    reference: str | None = None
    address: str | None = None


@dataclass(frozen=True)
class InboundAnswer:
    """A person's answer as a transport received it."""

    channel: str
    request_id: str
    #: Who answered, in the channel's own terms (Telegram user id, Matrix user id, the web user id).
    identity: str
    submission: AnswerSubmission


@dataclass(frozen=True)
class InboundResult:
    """What became of an :class:`InboundAnswer`: the bound record, or the refusal to tell the responder."""

    record: HumanRequestRecord | None = None
    refused: AnswerRefused | None = None
    #: The same person had already given this very answer: nothing new was bound (still a success).
    already_recorded: bool = False
    #: Who answered as the directory knows them (``user:<id>``, or ``<channel>:<identity>`` for a stranger): a
    #: refusal says "you already answered" to the person who did (:func:`.render.refusal_text`).
    responder: str | None = None

    @property
    def accepted(self) -> bool:
        return self.refused is None and self.record is not None


#: The channel-neutral inbound side every adapter hands answers to.
AnswerSink = Callable[[InboundAnswer], Awaitable[InboundResult]]


class ChannelAdapter(abc.ABC):
    """One transport to people (Matrix, Telegram, the web inbox, ...)."""

    #: The channel name used in user profiles (``preferred``, ``fallback``, ``channels``).
    name: ClassVar[str]
    _inbound: AnswerSink | None = None
    #: What may leave on this channel (HUM-5, SEC-1): every question, outcome and notification passes through
    #: it in the public methods below, so no implementation can skip it -- but for a channel whose delivery is the
    #: stored record (:attr:`delivered_by_store`: nothing leaves then), whose record is shown through it where it is
    #: read (the web inbox's API). The service sets its configured one.
    egress: EgressPolicy = DEFAULT_POLICY
    #: Told every delivery attempt and its outcome (the service sets its :class:`~..metrics.HumanMetrics`).
    observer: DeliveryObserver | None = None
    #: The web inbox's address people open (``TEMPORALITY_HUMAN_INBOX_URL``): a question cut to fit a chat's
    #: message limit says the whole question is there (:func:`.render.fitted`). None: the cut is just marked.
    inbox_url: str | None = None

    def attach(self, inbound: AnswerSink) -> None:
        """Where this adapter hands the answers it receives; call before :meth:`initialize`."""
        self._inbound = inbound

    async def submit(self, answer: InboundAnswer) -> InboundResult:
        """Hand a received answer to the binding. Without an attached sink nothing can be bound."""
        if self._inbound is None:
            raise ChannelUnavailable(f"channel {self.name} has no inbound side attached")
        return await self._inbound(answer)

    #: Whether this channel's delivery is the stored record itself (the web inbox lists the stored pending
    #: requests: nothing is sent). The intake then records such a delivery in the record it creates instead of a
    #: compare-and-set after it (:meth:`delivers_with_record`); a channel that sends something never does.
    delivered_by_store: ClassVar[bool] = False

    def delivers_with_record(self, profile: UserProfile) -> bool:
        """Whether a delivery to ``profile`` on this channel can be recorded in the record as it is created:
        the channel's delivery is the stored record (:attr:`delivered_by_store`), and it runs and reaches them."""
        return self.delivered_by_store and self.available and self.reaches(profile)

    def reaches(self, profile: UserProfile) -> bool:
        """Whether ``profile`` has an identity on this channel (no identity: unreachable, go to the next one)."""
        return self.name in profile.channels.names()

    async def __aenter__(self) -> Self:
        try:
            await self.initialize()
        except BaseException:
            await self.shutdown()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()

    @abc.abstractmethod
    async def initialize(self) -> None:
        """Open the transport (log in, start syncing). Safe to call twice."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Release everything ``initialize`` acquired. Safe to call twice and after a failed initialize."""

    @property
    @abc.abstractmethod
    def available(self) -> bool:
        """Whether a delivery can be attempted now; an unavailable preferred channel means fallback (HUM-2)."""

    @abc.abstractmethod
    async def do_deliver(
        self, request: HumanRequestRecord, profile: UserProfile, *, banner: str | None = None, tag: str = ""
    ) -> DeliveryReceipt:
        """Transport-specific delivery. Raise :class:`DeliveryFailed` on a refusal.

        ``tag`` names the send (``""`` the question; ``reask-<n>``, ``escalation``: the timeout policy's chain
        sending it again as a new message, HUM-8), so a transport with idempotency keys keeps them apart;
        ``banner`` is a line to show first (why it is sent again)."""

    @abc.abstractmethod
    async def do_update(self, request: HumanRequestRecord, copy: SentCopy, responder_name: str | None) -> None:
        """Edit the sent ``copy`` to show ``request``'s outcome (answered by ``responder_name`` / expired /
        cancelled)."""

    @abc.abstractmethod
    async def do_notify(self, profile: UserProfile, text: str, key: str) -> DeliveryReceipt:
        """Transport-specific plain notification. Raise :class:`DeliveryFailed` on a refusal.

        ``key`` names this notification to this person and is the same when it is sent again (a redelivery
        after a crash between the send and its once-only marker), so a transport with idempotency keys
        (Matrix's transaction id) sends it once."""

    async def deliver(
        self,
        request: HumanRequestRecord,
        profile: UserProfile,
        *,
        banner: str | None = None,
        tag: str = "",
        counted: bool = True,
    ) -> DeliveryReceipt:
        """Deliver ``request`` to the person behind ``profile``. Do not override: implement :meth:`do_deliver`.

        ``counted=False``: the attempt is not told to :attr:`observer`; the caller counts it (:meth:`count`) once
        its outcome holds -- the intake's web inbox delivery, which is made only when the record that carries it is
        created (a failure is tried and counted again by the delivery after the create)."""
        if self.available and not self.reaches(profile):  # not tried, so not an attempt
            raise ChannelUnavailable(f"channel {self.name} has no identity for {profile.display_name}")
        try:
            self._check(profile)
            if not self.delivered_by_store:  # the web inbox sends nothing: its API shows the record through egress
                request, _ = self.egress.for_channel(request, self.name)
            receipt = await self.do_deliver(request, profile, banner=banner, tag=tag)
        except ChannelUnavailable:
            if counted:
                self.count("unavailable", tag=tag)
            raise
        except ChannelError:
            if counted:
                self.count("failed", tag=tag)
            raise
        except Exception as exc:
            if counted:
                self.count("failed", tag=tag)
            raise DeliveryFailed(f"channel {self.name} failed to deliver {request.request_id}: {exc!r}") from exc
        if counted:
            self.count("delivered", tag=tag)
        return receipt

    def count(self, outcome: DeliveryOutcome, *, tag: str = "") -> None:
        """Tell :attr:`observer` one delivery attempt on this channel and its outcome."""
        if self.observer is not None:
            self.observer.delivery(self.name, tag, outcome)

    async def update(self, request: HumanRequestRecord, copy: SentCopy, *, responder_name: str | None = None) -> None:
        """Show ``request``'s outcome on the sent ``copy``. Do not override: implement :meth:`do_update`."""
        if not self.available:
            raise ChannelUnavailable(f"channel {self.name} is not available")
        request, _ = self.egress.for_channel(request, self.name)
        try:
            await self.do_update(request, copy, responder_name)
        except ChannelError:
            raise
        except Exception as exc:
            raise DeliveryFailed(f"channel {self.name} failed to update {request.request_id}: {exc!r}") from exc

    async def notify(self, profile: UserProfile, text: str, *, key: str) -> DeliveryReceipt:
        """Send ``text`` to the person behind ``profile``; ``key`` is the notification's idempotency key (one per
        notification and person). Do not override: implement :meth:`do_notify`."""
        self._check(profile)
        text = self.egress.message_for(self.name, text)
        try:
            return await self.do_notify(profile, text, key)
        except ChannelError:
            raise
        except Exception as exc:
            raise DeliveryFailed(f"channel {self.name} failed to notify: {exc!r}") from exc

    def _check(self, profile: UserProfile) -> None:
        if not self.available:
            raise ChannelUnavailable(f"channel {self.name} is not available")
        if not self.reaches(profile):
            raise ChannelUnavailable(f"channel {self.name} has no identity for {profile.display_name}")
