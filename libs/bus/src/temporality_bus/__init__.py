"""Temporality's JetStream bus: connection, layout, typed KV, consumer runner, timers."""

from temporality_bus.connection import Bus, PublishResult
from temporality_bus.consumer import Consumer, Delivery
from temporality_bus.errors import (
    AlreadyExists,
    BusError,
    Conflict,
    PermanentError,
    StoreError,
    TransientError,
)
from temporality_bus.lifecycle import stop_on_signals
from temporality_bus.logs import configure_logging
from temporality_bus.settings import LogSettings, NatsSettings
from temporality_bus.store import Store, Versioned
from temporality_bus.timers import schedule_at

__all__ = [
    "AlreadyExists",
    "Bus",
    "BusError",
    "Conflict",
    "Consumer",
    "Delivery",
    "LogSettings",
    "NatsSettings",
    "PermanentError",
    "PublishResult",
    "Store",
    "StoreError",
    "TransientError",
    "Versioned",
    "configure_logging",
    "schedule_at",
    "stop_on_signals",
]
