"""``temporality-human-interaction``: the user directory, channel adapters, the request and deadline
consumers and the web-inbox API, started by the service runtime."""

from __future__ import annotations

import structlog

from temporality_human_interaction.api import create_app
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.deadlines import DeadlineHandler
from temporality_human_interaction.directory import Directory, DirectoryError
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.settings import Settings
from temporality_protocol.catalog import SERVICES
from temporality_service import ConfigError, Runtime, Setup, serve

__all__ = ["SPEC", "build_adapters", "configure", "run"]

SPEC = SERVICES["human-interaction"]
log = structlog.get_logger(__name__)


def build_adapters() -> list[ChannelAdapter]:
    """The transports this build ships. Matrix and Telegram join here when their adapters exist."""
    return [WebInboxAdapter()]


def configure(settings: Settings) -> Setup[Settings]:
    """Load the user directory before anything connects (an invalid one exits 2)."""
    try:
        directory = Directory.from_yaml(settings.users_file)
    except DirectoryError as exc:
        raise ConfigError(f"{settings.users_file}: {exc}") from exc
    log.info("directory.loaded", users=len(directory), file=str(settings.users_file))

    async def setup(rt: Runtime[Settings]) -> None:
        adapters: dict[str, ChannelAdapter] = {}
        for adapter in build_adapters():
            adapters[adapter.name] = await rt.resources.enter_async_context(adapter)
        log.info("channels.ready", channels=sorted(n for n, a in adapters.items() if a.available))
        requests = RequestHandler(rt.bus, directory, adapters)
        rt.consumer("human-interaction-requests", handler=requests.handle, max_inflight=rt.settings.max_inflight)
        rt.consumer("human-interaction-deadlines", raw_handler=DeadlineHandler(rt.bus).handle)
        rt.http(create_app(rt.settings, rt.bus, directory))

    return setup


def run() -> None:
    serve(SPEC, Settings, configure)


if __name__ == "__main__":
    run()
