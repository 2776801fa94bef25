"""Temporality's trigger-gateway: webhook intake (auth, normalization, dedupe) → ``run.requested``."""

from temporality_trigger_gateway.api import create_app
from temporality_trigger_gateway.errors import TriggerConfigError
from temporality_trigger_gateway.settings import Settings
from temporality_trigger_gateway.triggers import TriggerConfig, WebhookTrigger, load_triggers, parse_triggers

__all__ = [
    "Settings",
    "TriggerConfig",
    "TriggerConfigError",
    "WebhookTrigger",
    "create_app",
    "load_triggers",
    "parse_triggers",
]
