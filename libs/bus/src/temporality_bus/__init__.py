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
from temporality_bus.lifecycle import mark_ready, stop_on_signals
from temporality_bus.logs import configure_logging
from temporality_bus.settings import LogSettings, NatsSettings, ProcessSettings
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
    "ProcessSettings",
    "PublishResult",
    "Store",
    "StoreError",
    "TransientError",
    "Versioned",
    "configure_logging",
    "mark_ready",
    "schedule_at",
    "stop_on_signals",
]
