"""Channel adapters: one class per transport behind :class:`ChannelAdapter` (HUM-3)."""

from temporality_human_interaction.channels.base import (
    ChannelAdapter,
    ChannelError,
    ChannelUnavailable,
    DeliveryFailed,
    DeliveryReceipt,
)
from temporality_human_interaction.channels.web import WebInboxAdapter

__all__ = [
    "ChannelAdapter",
    "ChannelError",
    "ChannelUnavailable",
    "DeliveryFailed",
    "DeliveryReceipt",
    "WebInboxAdapter",
]
