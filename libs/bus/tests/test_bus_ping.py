"""A server that stops answering without closing the connection (a frozen process, a path dropping packets) is
noticed by the client's pings (``TEMPORALITY_NATS_PING_INTERVAL_S`` x ``_MAX_OUTSTANDING_PINGS``), not left to
TCP: the bus reports itself disconnected (``/readyz`` then says so) and reconnects once the server answers again.

The server here is a real nats-server frozen with SIGSTOP and thawed with SIGCONT.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from temporality_bus import Bus, NatsSettings
from temporality_embedded.natsserver import NatsServer
from temporality_testing.waiting import eventually


async def _until(condition: Callable[[], bool], timeout_s: float) -> None:
    async def probe() -> bool:
        return condition()

    await eventually(probe, timeout_s, "the connection's state", interval_s=0.05)


def test_the_defaults_notice_a_silent_server_within_about_a_minute() -> None:
    settings = NatsSettings()
    assert settings.ping_interval_s * settings.max_outstanding_pings <= 60


async def test_a_frozen_server_is_noticed_by_the_pings_and_the_bus_reconnects_when_it_thaws(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        assert server.proc is not None
        settings = NatsSettings(url=server.url, ping_interval_s=0.5, max_outstanding_pings=2, reconnect_wait_s=0.2)
        async with Bus.connect(settings, name="ping-test") as bus:
            assert bus.nc.is_connected
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                # 2 pings of 0.5 s unanswered: lost after ~1.5 s (TCP alone would not tell for minutes)
                await _until(lambda: not bus.nc.is_connected, timeout_s=20)
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            await _until(lambda: bus.nc.is_connected, timeout_s=30)
            await bus.nc.flush(timeout=5)  # and it answers again on the new connection
    finally:
        server.stop()
