"""Fixtures: triggers parsed from YAML, the app over the real-nats ``bus``, an ASGI client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from gateway_support import ENVIRON, MAX_BODY, TRIGGERS_YAML, load_triggers_yaml

from temporality_bus import Bus
from temporality_trigger_gateway import Settings, TriggerConfig, create_app


@pytest.fixture
def triggers() -> list[TriggerConfig]:
    return load_triggers_yaml(TRIGGERS_YAML, **ENVIRON)


@pytest.fixture
def settings() -> Settings:
    return Settings(max_body_bytes=MAX_BODY, retry_after_s=7)


@pytest.fixture
async def client(bus: Bus, settings: Settings, triggers: list[TriggerConfig]) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, bus, triggers)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as c:
        yield c
