"""Temporality's JetStream bus: connection, layout, typed KV, consumer runner, timers.

Process concerns (settings groups, logging, signals, ready files) live in ``temporality_service``."""

from temporality_bus.connection import Bus, PublishResult
from temporality_bus.consumer import Consumer, ConsumerObserver, DeadLetterHook, Delivery, Outcome
from temporality_bus.errors import (
    AlreadyExists,
    BusError,
    Conflict,
    Contended,
    NotFound,
    PayloadTooLarge,
    PermanentError,
    StoreError,
    TransientError,
)
from temporality_bus.listing import live_entries, live_keys
from temporality_bus.models import evolve, revalidated
from temporality_bus.pipeline import Pipeline
from temporality_bus.provenance import ForgedEvent, SourceCheck
from temporality_bus.responder import Failure, Request, Responder, written_out
from temporality_bus.settings import NatsSettings
from temporality_bus.store import Modified, Recent, Store, Versioned
from temporality_bus.timers import Timers, fire_time, parse_fired_subject, schedule_at
from temporality_bus.watch import KvWatch, entry_value

__all__ = [
    "AlreadyExists",
    "Bus",
    "BusError",
    "Conflict",
    "Consumer",
    "ConsumerObserver",
    "Contended",
    "DeadLetterHook",
    "Delivery",
    "Failure",
    "ForgedEvent",
    "KvWatch",
    "Modified",
    "NatsSettings",
    "NotFound",
    "Outcome",
    "PayloadTooLarge",
    "PermanentError",
    "Pipeline",
    "PublishResult",
    "Recent",
    "Request",
    "Responder",
    "SourceCheck",
    "Store",
    "StoreError",
    "Timers",
    "TransientError",
    "Versioned",
    "entry_value",
    "evolve",
    "fire_time",
    "live_entries",
    "live_keys",
    "parse_fired_subject",
    "revalidated",
    "schedule_at",
    "written_out",
]
