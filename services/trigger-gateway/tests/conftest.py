"""Fixtures: triggers parsed from YAML, the app over the real-nats ``bus``, an ASGI client."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from gateway_support import ENVIRON, MAX_BODY, PASSWORD, TRIGGERS_YAML, agents_file, load_triggers_yaml, tokens_file
from hypothesis.configuration import set_hypothesis_home_dir

from temporality_bus import Bus, NatsSettings
from temporality_service import ApiAuthSettings
from temporality_trigger_gateway import Settings, TriggerConfig, create_app

# hypothesis keeps a cache (``.hypothesis/``) in the working directory: not in the checkout (it is not ignored)
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "temporality-gateway-hypothesis")


@pytest.fixture
def triggers() -> list[TriggerConfig]:
    return load_triggers_yaml(TRIGGERS_YAML, **ENVIRON)


@pytest.fixture
def settings() -> Settings:
    # intake_timeout_s generous (as for the replicas below): the 5 s default is tested in test_gateway_bus_stall.py
    return Settings(max_body_bytes=MAX_BODY, retry_after_s=7, intake_timeout_s=60)


@pytest.fixture
async def client(bus: Bus, settings: Settings, triggers: list[TriggerConfig]) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, bus, triggers)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as c:
        yield c


#: The triggers file of the in-process replica tests: one webhook and one schedule trigger.
REPLICA_FILE = f"""
triggers:
  - id: file-pr
    name: Seeded from the file
    type: webhook
    adapter: azure_devops.pull_request
    events: [git.pullrequest.created]
    agent: reviewer
    auth: {{type: basic, username: azure, password: {PASSWORD}}}
  - id: file-nightly
    name: Nightly
    type: schedule
    cron: "0 3 * * *"
    agent: reviewer
"""


@pytest.fixture
def gateway_settings(tmp_path: Path, nats_settings: NatsSettings) -> Settings:
    triggers = tmp_path / "triggers.yaml"
    triggers.write_text(REPLICA_FILE, encoding="utf-8")
    agents_file(tmp_path)  # beside the triggers file: found by default
    # intake_timeout_s: the replica tests post dozens of deliveries of one key at once, contending on its state; on
    # a loaded machine one can take longer than the default 5 s bound, which answers it 503 (its handling going on).
    # That bound is tested where it is meant (test_gateway_bus_stall.py); here a slow answer is still the answer.
    return Settings(
        nats=nats_settings,
        port=0,
        triggers_file=triggers,
        api=ApiAuthSettings(tokens_file=tokens_file(tmp_path)),
        intake_timeout_s=60,
    )
