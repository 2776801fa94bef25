"""Channel adapters: one class per transport behind :class:`ChannelAdapter` (HUM-3)."""

from temporality_human_interaction.channels.base import (
    AnswerSink,
    ChannelAdapter,
    ChannelError,
    ChannelUnavailable,
    DeliveryFailed,
    DeliveryReceipt,
    InboundAnswer,
    InboundResult,
)
from temporality_human_interaction.channels.web import WebInboxAdapter

__all__ = [
    "AnswerSink",
    "ChannelAdapter",
    "ChannelError",
    "ChannelUnavailable",
    "DeliveryFailed",
    "DeliveryReceipt",
    "InboundAnswer",
    "InboundResult",
    "WebInboxAdapter",
]
