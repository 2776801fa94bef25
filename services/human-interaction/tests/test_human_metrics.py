"""human-interaction's own metrics, read from the ``/metrics`` of two real replicas (the service's own
``configure``/``setup`` run by the runtime on a real nats-server; Telegram through the Bot API emulator):

* a delivery the Telegram bot cannot make (the person blocked it) is one ``failed`` attempt on ``telegram``,
  the web inbox's fallback one ``delivered`` attempt;
* an answered and an expired request are each observed once in the wait histogram, across both replicas,
  however often the answer is repeated;
* the requests waiting (and those past their deadline) are the same number on every replica (``max()``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
from human_support import ALICE, requested, service_settings
from pydantic import SecretStr
from replica_support import Samples, replica, samples_of, value_of

from temporality_bus import Bus, NatsSettings
from temporality_human_interaction.__main__ import SPEC
from temporality_human_interaction.inbox import answerers
from temporality_human_interaction.records import HumanRequestRecord, open_store
from temporality_human_interaction.runs import index_request
from temporality_protocol import HumanPolicy, HumanRequested, LaunchSource, RunRequested, make_event, new_id
from temporality_service import metrics
from temporality_testing.telegram_emulator import TelegramEmulator
from temporality_testing.waiting import stays

DAVE_CHAT = 1004
USERS = f"""users:
  alice:
    display_name: Alice Example
    inbox_token: alice-demo-inbox-token-change-me
    preferred: web
    channels: {{web: {{}}}}
  dave:
    display_name: Dave Example
    inbox_token: dave-demo-token
    preferred: telegram
    fallback: [web]
    channels: {{telegram: {{chat_id: {DAVE_CHAT}}}, web: {{}}}}
"""


async def _until(
    clients: list[httpx.AsyncClient], condition: Callable[[list[Samples]], bool], what: str, within_s: float = 30
) -> list[Samples]:
    """Scrape every replica until ``condition`` holds for their expositions (bounded)."""
    scraped: list[Samples] = []
    try:
        async with asyncio.timeout(within_s):
            while True:
                scraped = []
                for client in clients:
                    response = await client.get("/metrics")
                    assert response.status_code == 200
                    scraped.append(samples_of(response.text))
                if condition(scraped):
                    return scraped
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"waited {within_s}s for {what}") from None


def _total(scraped: list[Samples], name: str, **labels: str) -> float:
    """The sum over the replicas (counters and histograms)."""
    return sum(value_of(s, name, **labels) for s in scraped)


@pytest.mark.timeout(150)
async def test_deliveries_waits_and_waiting_requests_are_reported_once_across_replicas(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "STATE_REFRESH_S", 0.2)
    async with TelegramEmulator().serve() as emulator, AsyncExitStack() as stack:
        emulator.block(DAVE_CHAT)  # dave blocked the bot: Telegram refuses every message to him
        settings = service_settings(
            tmp_path,
            nats_settings,
            USERS,
            telegram_token=SecretStr(emulator.token),
            telegram_base_url=emulator.base_url,
            telegram_poll_timeout_s=1,
        )
        urls = [await stack.enter_async_context(replica(settings)) for _ in range(2)]
        clients = [await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=10)) for url in urls]

        # before any question, each channel's delivery series exist at 0 on every replica: a first failure is a
        # rise from 0 that the channel-failing alert's increase() sees
        def declared(scraped: list[Samples]) -> bool:
            name = "temporality_human_deliveries_total"
            return all(
                (name, frozenset({"service": SPEC.name, "channel": c, "send": s, "outcome": o}.items())) in samples
                for samples in scraped
                for c in ("telegram", "web")
                for s in ("question", "reminder", "escalation")
                for o in ("delivered", "failed", "unavailable")
            )

        scraped = await _until(clients, declared, "every channel's delivery series at 0")
        assert (
            _total(scraped, "temporality_human_deliveries_total", channel="telegram", send="question", outcome="failed")
            == 0
        )

        run_id = new_id("run")
        policy = HumanPolicy(allowed_recipients=["user:alice", "user:dave"])
        launch = LaunchSource(kind="webhook", trigger_id="ado-pr-review")
        run = RunRequested(run_id=run_id, agent="reviewer", title="Review PR 42", launch=launch, human=policy)
        await bus.publish(make_event(run, source="/temporality/trigger-gateway", run_id=run_id))
        allowed = ("user:alice", "user:dave")
        for_alice = requested(recipient="user:alice", allowed=allowed, run_id=run_id)
        for_dave = requested(recipient="user:dave", allowed=allowed, run_id=run_id)
        for event in (for_alice, for_dave):
            await bus.publish(event)

        # deliveries: dave's question fails on Telegram and falls back to the web inbox; alice's goes to the web
        def delivered(web_count: int) -> Callable[[list[Samples]], bool]:
            def check(scraped: list[Samples]) -> bool:
                name = "temporality_human_deliveries_total"
                failed = _total(scraped, name, channel="telegram", send="question", outcome="failed")
                web = _total(scraped, name, channel="web", send="question", outcome="delivered")
                return failed == 1 and web == web_count

            return check

        await _until(clients, delivered(2), "1 failed Telegram delivery and 2 web ones")
        # published once the run's policy is known here, so it is delivered well before its deadline
        expiring = requested(recipient="user:alice", allowed=allowed, run_id=run_id, expires_in_s=3)
        await bus.publish(expiring)
        scraped = await _until(clients, delivered(3), "the third question delivered on the web")
        assert _total(scraped, "temporality_human_deliveries_total", channel="telegram", outcome="delivered") == 0
        for samples in scraped:  # each replica's adapters run
            assert value_of(samples, "temporality_human_channel_available", channel="telegram") == 1
            assert value_of(samples, "temporality_human_channel_available", channel="web") == 1

        # the short request expires: observed once, by the replica whose compare-and-set expired it
        def expired(scraped: list[Samples]) -> bool:
            return _total(scraped, "temporality_human_wait_seconds_count", outcome="expired") == 1

        scraped = await _until(clients, expired, "the expired request in the wait histogram")
        assert _total(scraped, "temporality_human_wait_seconds_bucket", outcome="expired", le="60.0") == 1

        # alice answers on one replica, then sends the same answer again on the other: one observation
        request_id = str(for_alice.data["request_id"])
        answer = {"option_id": "keep-v1"}
        first = await clients[0].post(f"/requests/{request_id}/answer", json=answer, headers=ALICE)
        assert first.status_code == 200, first.text
        again = await clients[1].post(f"/requests/{request_id}/answer", json=answer, headers=ALICE)
        assert again.status_code == 200, again.text
        assert again.json()["already_recorded"] is True

        def answered(scraped: list[Samples]) -> bool:
            return _total(scraped, "temporality_human_wait_seconds_count", outcome="answered") == 1

        await _until(clients, answered, "the answered request in the wait histogram")

        async def still_once() -> bool:
            scraped = await _until(clients, lambda s: True, "a scrape")
            counts = [
                _total(scraped, "temporality_human_wait_seconds_count", outcome=o) for o in ("answered", "expired")
            ]
            return counts == [1, 1]

        await stays(still_once, settle_s=1.5, what="one observation per ended request")

        # waiting: dave's request only, the same number on both replicas (max(), never sum())
        def waiting(n: int, overdue: int) -> Callable[[list[Samples]], bool]:
            def check(scraped: list[Samples]) -> bool:
                return all(
                    value_of(s, "temporality_human_requests_waiting") == n
                    and value_of(s, "temporality_human_requests_overdue") == overdue
                    for s in scraped
                )

            return check

        await _until(clients, waiting(1, 0), "1 request waiting on each replica, none overdue")

        # a request whose deadline timer was lost stays pending past its deadline: both replicas see it
        lost = requested(recipient="user:alice", allowed=allowed, run_id=run_id, expires_in_s=-120)
        record = HumanRequestRecord.from_requested(lost, lost.payload(HumanRequested))
        await index_request(
            bus, record.run_id, record.request_id, record.expires_at, answerers(record)
        )  # no deadline armed
        await (await open_store(bus)).create(record.request_id, record)
        scraped = await _until(clients, waiting(2, 1), "the overdue request on each replica")
        for samples in scraped:
            # 120 s past its deadline, as of the refresh's clock, read as the refresh began: one that began
            # just before the record was stored reads a few ms less (119.943 in a CI run)
            assert value_of(samples, "temporality_human_requests_overdue_seconds") >= 119
