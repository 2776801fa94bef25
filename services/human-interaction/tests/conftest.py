"""Fixtures for human-interaction tests: the shipped directory, the web adapter, the handlers under real
consumers, and an API client over ASGI. The Matrix tests' ``synapse`` and ``matrix_accounts`` come from
``temporality_testing.fixtures`` (one homeserver per test run, shared with tests/test_e2e_matrix.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from directory_support import TOKENS
from human_support import USERS_FILE, TelegramDesk, running, telegram_and_web, telegram_first

from temporality_bus import Bus, Consumer
from temporality_human_interaction.api import create_app
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.deadlines import DeadlineHandler
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.settings import Settings
from temporality_protocol.catalog import CONSUMERS
from temporality_service import ApiAuth


@pytest.fixture
def directory() -> Directory:
    return Directory.from_yaml(USERS_FILE)


@pytest.fixture
async def adapters() -> AsyncIterator[dict[str, ChannelAdapter]]:
    async with WebInboxAdapter() as web:
        yield {web.name: web}


@pytest.fixture
def handler(bus: Bus, directory: Directory, adapters: dict[str, ChannelAdapter]) -> RequestHandler:
    return RequestHandler(bus, directory, adapters)


def deadlines_consumer(bus: Bus) -> Consumer:
    return Consumer(
        bus, CONSUMERS["human-interaction-deadlines"], raw_handler=DeadlineHandler(bus).handle, fetch_timeout_s=0.2
    )


@pytest.fixture
async def consumers(bus: Bus, handler: RequestHandler) -> AsyncIterator[None]:
    """Both handlers running under real durable consumers, as the service runs them."""
    requests = Consumer(bus, CONSUMERS["human-interaction-requests"], handler=handler.handle, fetch_timeout_s=0.2)
    async with running(requests, deadlines_consumer(bus)):
        yield


@pytest.fixture
async def deadline_consumer(bus: Bus) -> AsyncIterator[None]:
    """Only the timers' handler under its real durable consumer (the journal stream may come and go)."""
    async with running(deadlines_consumer(bus)):
        yield


@pytest.fixture
def settings() -> Settings:
    return Settings(bus_timeout_s=2.0)


@pytest.fixture
async def client(settings: Settings, bus: Bus, directory: Directory) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, bus, directory, auth=ApiAuth(TOKENS))  # the role tokens: its /openapi.json
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://human.test") as c:
        yield c


@pytest.fixture
async def telegram(bus: Bus) -> AsyncIterator[TelegramDesk]:
    """alice on Telegram first (the Bot API emulator) with a web inbox too (:func:`human_support.telegram_and_web`)."""
    async with telegram_and_web(bus, telegram_first()) as desk:
        yield desk
