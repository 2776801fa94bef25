"""pytest fixtures: a real nats-server per test, a connected Bus with the layout ensured, and one real
Synapse homeserver per test run (``synapse``, ``matrix_accounts``) for every Matrix test.

Enable with ``pytest_plugins = ["temporality_testing.fixtures"]`` in a conftest (the repository's root
conftest does; it groups the users of each session fixture here by the fixture, so under xdist all
Synapse users run on one worker and the homeserver starts once).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported where used: a pytest process that needs none of them does not pay for them
    from temporality_bus import Bus, NatsSettings
    from temporality_embedded.natsserver import NatsServer
    from temporality_testing.events import EventLog
    from temporality_testing.synapse import MatrixAccount, Synapse


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    from temporality_embedded.natsserver import NatsServer

    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_settings(nats_server: NatsServer) -> NatsSettings:
    from temporality_bus import NatsSettings

    return NatsSettings(url=nats_server.url, ack_wait_s=2.0, drain_timeout_s=2.0)


@pytest.fixture
async def bus(nats_settings: NatsSettings) -> AsyncIterator[Bus]:
    from temporality_bus import Bus
    from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS
    from temporality_testing.timers import TEST_TIMERS_STREAM

    async with Bus.connect(nats_settings, name="test") as b:
        await b.ensure([*ALL_STREAMS, TEST_TIMERS_STREAM], ALL_BUCKETS)
        yield b


def shared_dir() -> Path | None:
    """``../shared`` beside the checkout, where the team's real fixtures live; None on a user's machine."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent.parent / "shared" if parent.name else None
        if candidate and (candidate / "fixtures" / "webhooks").is_dir():
            return candidate
    return None


def require_shared() -> Path:
    found = shared_dir()
    if found is None:
        pytest.skip("../shared/fixtures not present (it exists only on the team's machines); real-payload test skipped")
    return found


@pytest.fixture
async def event_log(bus: Bus) -> AsyncIterator[EventLog]:
    from temporality_testing.events import EventLog

    log = await EventLog(bus.nc).start()
    try:
        yield log
    finally:
        await log.stop()


@pytest.fixture(scope="session")
def synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synapse]:
    """A real Synapse homeserver for the whole test session, shared by every Matrix test (skipped, visibly,
    if it is not installed). A test that needs accounts of its own registers them with fresh localparts."""
    from temporality_testing.synapse import Synapse, synapse_available

    if not synapse_available():
        pytest.skip("matrix-synapse is not installed: the Matrix tests need a real homeserver")
    with Synapse(tmp_path_factory.mktemp("synapse")) as server:
        yield server


@pytest.fixture(scope="session")
def matrix_accounts(synapse: Synapse) -> dict[str, MatrixAccount]:
    """The bot and the people of the Matrix tests (``bot``, ``alice``, ``mallory``, ``bob``), registered once
    per session."""
    return {name: synapse.register(name, f"{name}-password-1") for name in ("bot", "alice", "mallory", "bob")}
