"""A stalled bus (a SIGSTOPped nats-server) gets the sender a 503 within the gateway's ``intake_timeout_s``.

An integrator review: with nats-server stopped, the 503 came after 10.0 s -- the JetStream round's timeout, and
GitHub's and GitLab's delivery timeout, so they recorded "timed out" and never saw the 503 or its Retry-After.
The answer now comes after ``intake_timeout_s`` (here 0.5 s); the delivery's handling goes on, so a retry after
the bus is back starts exactly one run (the delivery's claim semantics are unchanged). The server is this test's
own (the ``nats_server`` fixture: one per test), stopped and continued by its pid.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import httpx
import pytest
from gateway_support import MAX_BODY, eventually, fixture_bytes, github_headers, journal, post

from temporality_bus import Bus
from temporality_bus.pipeline import JS_TIMEOUT_S
from temporality_protocol import run_id_for_delivery
from temporality_testing import NatsServer
from temporality_trigger_gateway import Settings, TriggerConfig, create_app

DELIVERY = "7c0e1f52-0b7e-4d2a-9b43-5a1d2f3e4c5b"


@contextmanager
def stopped(server: NatsServer) -> Iterator[None]:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


@pytest.fixture
async def stall_client(bus: Bus, triggers: list[TriggerConfig]) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(max_body_bytes=MAX_BODY, retry_after_s=7, intake_timeout_s=0.5, claim_lease_s=2.0)
    app = create_app(settings, bus, triggers)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as c:
        yield c


async def _deliver(client: httpx.AsyncClient, raw: bytes) -> httpx.Response:
    return await post(client, raw, trigger_id="gh-review", headers=github_headers(raw, "pull_request", DELIVERY))


async def _one_run_after_retries(client: httpx.AsyncClient, bus: Bus, raw: bytes) -> None:
    """Retries of the delivery until one is answered other than 503: its run, then duplicates; one run."""
    run_id = run_id_for_delivery("gh-review", DELIVERY)

    async def retried() -> httpx.Response | None:
        answer = await _deliver(client, raw)
        return answer if answer.status_code != 503 else None

    settled = await eventually(retried, what="a retry answered other than 503")
    assert settled.status_code in (200, 202), settled.text
    assert settled.json()["run_id"] == run_id
    final = await _deliver(client, raw)
    assert final.status_code == 200, final.text
    assert final.json()["status"] == "duplicate"
    assert final.json()["run_id"] == run_id

    async def one_run() -> bool:
        requested = [e for e in await journal(bus) if e.type == "run.requested"]
        return len(requested) == 1 and requested[0].runid == run_id

    await eventually(one_run, what="exactly one run.requested")
    assert [e.runid for e in await journal(bus) if e.type == "run.requested"] == [run_id]


async def test_a_stalled_bus_is_answered_503_early_and_a_retry_starts_one_run(
    stall_client: httpx.AsyncClient, bus: Bus, nats_server: NatsServer
) -> None:
    raw = fixture_bytes("github-pr-opened.json")
    with stopped(nats_server):
        first = await _deliver(stall_client, raw)
        again = await _deliver(stall_client, raw)  # GitHub's redelivery while the bus is still stalled
    for answer in (first, again):
        assert answer.status_code == 503, answer.text
        assert answer.headers["Retry-After"] == "7"
        assert answer.json()["error"] == "bus_unavailable"
    assert "did not answer within 0.5 s" in first.json()["detail"]
    # The bus is back: the first delivery's handling went on; a retry gets its run (or a duplicate of it).
    await _one_run_after_retries(stall_client, bus, raw)


async def test_a_stall_longer_than_the_bus_timeout_still_starts_one_run(
    stall_client: httpx.AsyncClient, bus: Bus, nats_server: NatsServer
) -> None:
    """The bus stays stopped past a JetStream round's own timeout: the handling behind the 503 fails (its claim
    maybe stored, its release not), and a retry once the bus is back still starts the run exactly once (after
    the claim's lease, when the failed claim is taken over)."""
    raw = fixture_bytes("github-pr-opened.json")
    with stopped(nats_server):
        first = await _deliver(stall_client, raw)
        assert first.status_code == 503, first.text
        await asyncio.sleep(JS_TIMEOUT_S + 1)  # the outage outlasts the round behind the 503
    await _one_run_after_retries(stall_client, bus, raw)
