"""The channel adapter ABC: one small interface, one class per transport (HUM-3).

Modelled on python-telegram-bot's ``BaseRequest``: an explicit lifecycle (``initialize`` /
``shutdown``, usable as an async context manager that cleans up when set-up fails), one public
final method (:meth:`ChannelAdapter.deliver`) wrapping the transport-specific
:meth:`ChannelAdapter.do_deliver`, and no transport detail leaking past the adapter.

Errors::

    ChannelError          -- base of everything an adapter raises
    ├── ChannelUnavailable -- the adapter is not initialized / its transport is down: try the next channel
    └── DeliveryFailed     -- the transport refused or failed this delivery: try the next channel, then retry

Contract for implementations: ``do_deliver`` is **idempotent per request id** (a redelivered
``human.requested`` may call it again; use the request id as the transport's transaction id),
renders only the compact question (HUM-5) and never the run's technical context.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar, Self

from temporality_human_interaction.directory import UserProfile
from temporality_human_interaction.records import HumanRequestRecord

__all__ = ["ChannelAdapter", "ChannelError", "ChannelUnavailable", "DeliveryFailed", "DeliveryReceipt"]


class ChannelError(Exception):
    """Base of every adapter error."""


class ChannelUnavailable(ChannelError):
    pass


class DeliveryFailed(ChannelError):
    pass


@dataclass(frozen=True)
class DeliveryReceipt:
    """What the transport says about a delivery; ``reference`` binds replies (event id, message id)."""

    channel: str
    reference: str | None = None


class ChannelAdapter(abc.ABC):
    """One transport to people (Matrix, Telegram, the web inbox, ...)."""

    #: The channel name used in user profiles (``preferred``, ``fallback``, ``channels``).
    name: ClassVar[str]

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
    async def do_deliver(self, request: HumanRequestRecord, profile: UserProfile) -> DeliveryReceipt:
        """Transport-specific delivery. Raise :class:`DeliveryFailed` on a refusal."""

    async def deliver(self, request: HumanRequestRecord, profile: UserProfile) -> DeliveryReceipt:
        """Deliver ``request`` to the person behind ``profile``. Do not override: implement :meth:`do_deliver`."""
        if not self.available:
            raise ChannelUnavailable(f"channel {self.name} is not available")
        try:
            return await self.do_deliver(request, profile)
        except ChannelError:
            raise
        except Exception as exc:
            raise DeliveryFailed(f"channel {self.name} failed to deliver {request.request_id}: {exc!r}") from exc
