"""Temporality's trigger-gateway: webhook intake (auth, normalization, dedupe), schedule ticks and the
system's own events (event triggers) → ``run.requested``, over a trigger store every replica watches,
managed through the ``/triggers`` admin API (docs/triggers.md)."""

from temporality_trigger_gateway.api import create_app
from temporality_trigger_gateway.errors import TriggerConfigError
from temporality_trigger_gateway.settings import Settings
from temporality_trigger_gateway.store import TriggerRecord, TriggerRegistry, TriggerStore
from temporality_trigger_gateway.triggers import TriggerConfig, WebhookTrigger, load_triggers, parse_triggers

__all__ = [
    "Settings",
    "TriggerConfig",
    "TriggerConfigError",
    "TriggerRecord",
    "TriggerRegistry",
    "TriggerStore",
    "WebhookTrigger",
    "create_app",
    "load_triggers",
    "parse_triggers",
]
