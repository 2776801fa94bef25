"""``temporality-human-interaction``: the user directory, channel adapters, the request and deadline
consumers and the web-inbox API, started by the service runtime."""

from __future__ import annotations

import structlog

from temporality_bus import Bus
from temporality_human_interaction.api import create_app
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.channels.matrix import MatrixAdapter
from temporality_human_interaction.channels.telegram import TelegramAdapter
from temporality_human_interaction.deadlines import DeadlineHandler
from temporality_human_interaction.directory import Directory, DirectoryError
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.notifications import NotificationHandler
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import RunEndHandler
from temporality_human_interaction.settings import Settings
from temporality_protocol.catalog import SERVICES
from temporality_service import ConfigError, Runtime, Setup, serve

__all__ = ["SPEC", "build_adapters", "check_channel_settings", "configure", "run"]

SPEC = SERVICES["human-interaction"]
log = structlog.get_logger(__name__)


def check_channel_settings(settings: Settings) -> None:
    """Half-configured channels fail at start-up (exit 2), before anything connects."""
    if settings.matrix_homeserver is None:
        return
    if settings.matrix_user_id is None:
        raise ConfigError("TEMPORALITY_HUMAN_MATRIX_HOMESERVER is set but TEMPORALITY_HUMAN_MATRIX_USER_ID is not")
    if settings.matrix_password is None and settings.matrix_access_token is None:
        raise ConfigError(
            "TEMPORALITY_HUMAN_MATRIX_HOMESERVER is set but neither TEMPORALITY_HUMAN_MATRIX_PASSWORD nor "
            "TEMPORALITY_HUMAN_MATRIX_ACCESS_TOKEN is"
        )


def build_adapters(settings: Settings, bus: Bus) -> list[ChannelAdapter]:
    """The transports to start: the web inbox always, each chat transport only when it is configured."""
    adapters: list[ChannelAdapter] = [WebInboxAdapter()]
    if settings.telegram_token is not None and settings.telegram_enabled:
        adapters.append(
            TelegramAdapter(
                bus,
                token=settings.telegram_token.get_secret_value(),
                base_url=settings.telegram_base_url,
                poll_timeout_s=settings.telegram_poll_timeout_s,
            )
        )
    if settings.matrix_homeserver is not None:
        check_channel_settings(settings)
        assert settings.matrix_user_id is not None
        adapters.append(
            MatrixAdapter(
                bus,
                homeserver=settings.matrix_homeserver,
                user_id=settings.matrix_user_id,
                password=settings.matrix_password.get_secret_value() if settings.matrix_password else None,
                access_token=settings.matrix_access_token.get_secret_value() if settings.matrix_access_token else None,
                sync_timeout_s=settings.matrix_sync_timeout_s,
            )
        )
    return adapters


def configure(settings: Settings) -> Setup[Settings]:
    """Load the user directory and check the channel settings before anything connects (invalid: exit 2)."""
    check_channel_settings(settings)
    try:
        directory = Directory.from_yaml(settings.users_file)
    except DirectoryError as exc:
        raise ConfigError(f"{settings.users_file}: {exc}") from exc
    log.info("directory.loaded", users=len(directory), file=str(settings.users_file))

    async def setup(rt: Runtime[Settings]) -> None:
        adapters: dict[str, ChannelAdapter] = {}
        inbound = AnswerRouter(rt.bus, directory, adapters, repair_after_s=rt.settings.answer_repair_after_s)
        for adapter in build_adapters(rt.settings, rt.bus):
            adapter.attach(inbound)  # every channel hands its answers to the one binding
            adapters[adapter.name] = await rt.resources.enter_async_context(adapter)
        log.info("channels.ready", channels=sorted(n for n, a in adapters.items() if a.available))
        requests = RequestHandler(rt.bus, directory, adapters)
        rt.consumer("human-interaction-requests", handler=requests.handle, max_inflight=rt.settings.max_inflight)
        deadlines = DeadlineHandler(rt.bus, on_outcome=inbound.show_outcome)
        rt.consumer("human-interaction-deadlines", raw_handler=deadlines.handle)
        rt.consumer("human-interaction-runs", handler=RunEndHandler(rt.bus, inbound.show_outcome).handle)
        notifications = NotificationHandler(rt.bus, directory, adapters)
        rt.consumer("human-interaction-notifications", handler=notifications.handle)
        rt.http(create_app(rt.settings, rt.bus, directory, inbound))

    return setup


def run() -> None:
    serve(SPEC, Settings, configure)


if __name__ == "__main__":
    run()
