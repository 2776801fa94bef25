"""``temporality-trigger-gateway``: the triggers file, then the webhook API, started by the service runtime."""

from __future__ import annotations

from temporality_protocol.catalog import SERVICES
from temporality_service import ConfigError, Runtime, Setup, serve
from temporality_trigger_gateway.api import create_app
from temporality_trigger_gateway.errors import TriggerConfigError
from temporality_trigger_gateway.settings import Settings
from temporality_trigger_gateway.triggers import load_triggers

__all__ = ["SPEC", "configure", "run"]

SPEC = SERVICES["trigger-gateway"]


def configure(settings: Settings) -> Setup[Settings]:
    """Read the triggers file before anything connects (an invalid one exits 2)."""
    try:
        triggers = load_triggers(settings.triggers_file)
    except TriggerConfigError as exc:
        raise ConfigError(str(exc)) from exc

    async def setup(rt: Runtime[Settings]) -> None:
        rt.http(create_app(rt.settings, rt.bus, triggers))

    return setup


def run() -> None:
    serve(SPEC, Settings, configure)


if __name__ == "__main__":
    run()
