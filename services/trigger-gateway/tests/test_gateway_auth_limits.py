"""Failed webhook authentications are limited per client address (SEC-1, :mod:`temporality_trigger_gateway.failures`),
over real HTTP (:class:`HttpServer` on a real port, the test client as the trusted proxy naming each sender's
address in ``X-Forwarded-For``) against the gateway app on the real-nats bus: the limit per address and trigger,
the 429 (``too_many_failures`` + ``Retry-After``, the right credentials too), other addresses and other triggers
unaffected, the window's end (an injected clock), a well-authenticated sender never counted, unknown trigger ids
counted per address, the audit event and the one warning per block."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from gateway_support import (
    BEARER_TOKEN,
    GITLAB_TOKEN,
    PASSWORD,
    basic,
    fixture_bytes,
    fixture_json,
    github_headers,
    journal_of,
    replicas,
    standard_headers,
)
from structlog.testing import capture_logs

from temporality_bus import Bus
from temporality_service import AccessAudit
from temporality_service.server import HttpServer
from temporality_service.settings import ProcessSettings
from temporality_testing.events import EventLog
from temporality_trigger_gateway import Settings, TriggerConfig, create_app
from temporality_trigger_gateway.failures import WebhookFailures

ATTACKER = "203.0.113.7"
OTHER = "198.51.100.2"
WRONG = basic(password="not-" + PASSWORD)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def gateway(
    settings: Settings, bus: Bus, triggers: list[TriggerConfig], failures: WebhookFailures
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway app served on a real port, the test client its trusted proxy, with an access audit (what the
    service runtime puts on the app it serves)."""
    app = create_app(settings, bus, triggers, failures=failures)
    audit = AccessAudit(bus, "trigger-gateway")
    app.state.access_audit = audit
    proxy = ProcessSettings(forwarded_allow_ips="127.0.0.1").forwarded_allow_ips
    server = HttpServer(app, host="127.0.0.1", port=0, forwarded_allow_ips=proxy)
    serving = asyncio.create_task(server.run_until_exit())
    try:
        await asyncio.wait_for(server.listening.wait(), 30)
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            yield client
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)
        await audit.drain()


def _pr() -> bytes:
    """An Azure DevOps pull request event of its own id (a new event each time: never a duplicate)."""
    body = fixture_json("pr-created.json")
    body["id"] = str(uuid.uuid4())
    return json.dumps(body).encode()


async def _hook(
    client: httpx.AsyncClient,
    address: str,
    headers: dict[str, str],
    trigger_id: str = "ado-pr-review",
    body: bytes = b"",
) -> httpx.Response:
    sent = {"Content-Type": "application/json", "X-Forwarded-For": address, **headers}
    return await client.post(f"/hooks/{trigger_id}", content=body or _pr(), headers=sent)


def _assert_limited(response: httpx.Response, retry_after: str | None = None) -> None:
    assert response.status_code == 429, response.text
    assert response.json() == {
        "error": "too_many_failures",
        "detail": f"too many failed webhook authentications from this address; retry in "
        f"{response.headers['Retry-After']} s",
    }
    if retry_after is not None:
        assert response.headers["Retry-After"] == retry_after
    assert "WWW-Authenticate" not in response.headers


# --------------------------------------------------------------------------- per address and trigger
async def test_failed_authentications_get_429_the_right_credentials_too_and_others_are_unaffected(
    bus: Bus, settings: Settings, triggers: list[TriggerConfig]
) -> None:
    clock = Clock()
    failures = WebhookFailures(3, 60, clock=clock)
    async with gateway(settings, bus, triggers, failures) as client:
        for _ in range(3):
            refused = await _hook(client, ATTACKER, WRONG)
            assert refused.status_code == 401
            assert refused.json()["error"] == "unauthorized"
        for headers in (WRONG, basic(), {}):  # the right password too: a 429 must not tell a guess that is right
            _assert_limited(await _hook(client, ATTACKER, headers), retry_after="60")
        assert failures.credentials.failures(f"{ATTACKER} ado-pr-review") == 3  # a refused attempt is not counted again
        # another address, with the right password or a wrong one, is judged as before
        assert (await _hook(client, OTHER, basic())).status_code == 202
        assert (await _hook(client, OTHER, WRONG)).status_code == 401
        # the same address sending to another trigger (one misconfigured hook blocks itself only)
        assert (await _hook(client, ATTACKER, basic(), trigger_id="ado-pr-all")).status_code == 202
        clock.now += 30
        _assert_limited(await _hook(client, ATTACKER, basic()), retry_after="30")
        clock.now += 30.5  # the oldest failures left the window
        assert (await _hook(client, ATTACKER, basic())).status_code == 202
    accepted = await journal_of(bus, "trigger.accepted")
    assert len(accepted) == 3  # OTHER's, ATTACKER's to ado-pr-all, ATTACKER's after the window: none while blocked


@pytest.mark.parametrize(
    ("trigger_id", "fixture", "wrong"),
    [
        pytest.param("orders-bearer", "generic-order.json", {"Authorization": "Bearer nope"}, id="bearer"),
        pytest.param("gl-review", "gitlab-mr-open.json", {"X-Gitlab-Token": "nope"}, id="gitlab-token"),
        pytest.param("gh-review", "github-pr-opened.json", None, id="github-hmac"),
        pytest.param("orders-signed", "generic-order.json", None, id="standard-webhooks"),
    ],
)
async def test_every_kind_of_credential_counts(
    bus: Bus,
    settings: Settings,
    triggers: list[TriggerConfig],
    trigger_id: str,
    fixture: str,
    wrong: dict[str, str] | None,
) -> None:
    raw = fixture_bytes(fixture)
    right_headers: dict[str, str] = {
        "orders-bearer": {"Authorization": f"Bearer {BEARER_TOKEN}", "Idempotency-Key": "k-1"},
        "gl-review": {"X-Gitlab-Token": GITLAB_TOKEN, "X-Gitlab-Event": "Merge Request Hook", "Idempotency-Key": "k-1"},
        "gh-review": github_headers(raw, "pull_request", "d-1"),
        "orders-signed": standard_headers(raw, "msg_1"),
    }[trigger_id]
    wrong_headers = (
        wrong
        or {
            "gh-review": github_headers(raw, "pull_request", "d-1", secret="wrong"),
            "orders-signed": standard_headers(raw, "msg_1", secret="whsec_" + "d3Jvbmcta2V5LXdyb25nLWtleQ=="),
        }[trigger_id]
    )
    failures = WebhookFailures(2, 300, clock=Clock())
    async with gateway(settings, bus, triggers, failures) as client:
        for _ in range(2):
            assert (await _hook(client, ATTACKER, wrong_headers, trigger_id, raw)).status_code == 401
        _assert_limited(await _hook(client, ATTACKER, right_headers, trigger_id, raw), retry_after="300")
        answer = await _hook(client, OTHER, right_headers, trigger_id, raw)
        assert answer.status_code in (200, 202), answer.text  # the same sender elsewhere: judged as before


async def test_a_sender_with_the_right_credentials_never_counts(
    bus: Bus, settings: Settings, triggers: list[TriggerConfig]
) -> None:
    failures = WebhookFailures(2, 300, clock=Clock())
    async with gateway(settings, bus, triggers, failures) as client:
        body = _pr()
        for _ in range(5):  # a redelivery of one event (a duplicate) authenticates just as well
            assert (await _hook(client, OTHER, basic(), body=body)).status_code in (200, 202)
        for malformed in (b"{not json", b"[]"):  # authenticated, then refused for its body: not an auth failure
            assert (await _hook(client, OTHER, basic(), body=malformed)).status_code in (400, 422)
        assert failures.credentials.failures(f"{OTHER} ado-pr-review") == 0
        assert (await _hook(client, OTHER, WRONG)).status_code == 401  # its first failure: not limited
        assert (await _hook(client, OTHER, basic())).status_code == 202


async def test_an_ipv6_client_is_counted_by_its_64(bus: Bus, settings: Settings, triggers: list[TriggerConfig]) -> None:
    failures = WebhookFailures(2, 300, clock=Clock())
    async with gateway(settings, bus, triggers, failures) as client:
        for host in ("2001:db8:1:2::1", "2001:db8:1:2::2"):  # a fresh address per guess does not help
            assert (await _hook(client, host, WRONG)).status_code == 401
        _assert_limited(await _hook(client, "2001:db8:1:2:ffff::9", basic()))
        assert (await _hook(client, "2001:db8:1:3::1", basic())).status_code == 202  # another /64


async def test_guesses_sent_at_once_at_a_body_signed_trigger_are_counted_before_each_is_verified(
    bus: Bus, settings: Settings, triggers: list[TriggerConfig]
) -> None:
    """A body-signed trigger reads the body after the first check: guesses whose bodies arrive together all
    passed it, so the check is made again once the body is read -- at most the limit of them is verified."""
    failures = WebhookFailures(2, 300, clock=Clock())
    raw = fixture_bytes("github-pr-opened.json")
    release = asyncio.Event()

    async def held_body() -> AsyncIterator[bytes]:  # streamed (chunked): the gateway waits for it past the check
        yield raw[:10]
        await release.wait()
        yield raw[10:]

    async def guess(client: httpx.AsyncClient, n: int) -> int:
        headers = {
            "Content-Type": "application/json",
            "X-Forwarded-For": ATTACKER,
            **github_headers(raw, "pull_request", f"d-{n}", secret=f"guess-{n}"),
        }
        return (await client.post("/hooks/gh-review", content=held_body(), headers=headers)).status_code

    async with gateway(settings, bus, triggers, failures) as client:
        sent = [asyncio.create_task(guess(client, n)) for n in range(6)]
        await asyncio.sleep(0.5)  # (a guess not yet past the first check by then is checked once, as usual)
        release.set()
        statuses = sorted(await asyncio.gather(*sent))
    assert statuses == [401, 401, 429, 429, 429, 429]


# --------------------------------------------------------------------------- unknown trigger ids, per address
async def test_unknown_ids_count_per_address_and_then_no_answer_tells_an_existing_id(
    bus: Bus, settings: Settings, triggers: list[TriggerConfig]
) -> None:
    """Trigger-id enumeration: past the limit every delivery of the address that does not authenticate is 429
    with one body, whether the id exists or not; one that authenticates goes through (it had the credentials)."""
    clock = Clock()
    failures = WebhookFailures(2, 60, clock=clock)
    async with gateway(settings, bus, triggers, failures) as client:
        for guess in ("ado", "review"):
            answer = await _hook(client, ATTACKER, {}, trigger_id=guess)
            assert answer.status_code == 404
            assert answer.json()["error"] == "unknown_trigger"
        unknown = await _hook(client, ATTACKER, {}, trigger_id="pr-review")
        existing = await _hook(client, ATTACKER, {}, trigger_id="ado-pr-review")
        wrong = await _hook(client, ATTACKER, WRONG, trigger_id="gl-review")
        for answer in (unknown, existing, wrong):
            _assert_limited(answer, retry_after="60")
        assert unknown.content == existing.content == wrong.content
        assert (await _hook(client, ATTACKER, basic())).status_code == 202  # authenticated: not an enumeration
        assert (await _hook(client, OTHER, {}, trigger_id="pr-review")).status_code == 404  # another address
        clock.now += 60.5
        assert (await _hook(client, ATTACKER, {}, trigger_id="pr-review")).status_code == 404


async def test_past_the_unknown_id_limit_a_body_refused_before_its_signature_is_429_too(
    bus: Bus, settings: Settings, triggers: list[TriggerConfig]
) -> None:
    """A body-signed trigger reads the body before it checks the signature: past the unknown-id limit, a body too
    large for an existing trigger gets the 429 a non-existent id gets, not a 413 that would tell them apart."""
    failures = WebhookFailures(2, 60, clock=Clock())
    big = b"{" + b" " * (settings.max_body_bytes + 10) + b"}"

    async def oversized(client: httpx.AsyncClient, address: str, trigger_id: str) -> httpx.Response:
        headers = {**github_headers(big, "pull_request", "d-big", secret="guess"), "Content-Type": "application/json"}
        return await _hook(client, address, headers, trigger_id=trigger_id, body=big)

    async def streamed(client: httpx.AsyncClient, trigger_id: str) -> httpx.Response:
        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: refused as the bytes come in
            for _ in range(4):
                yield big[: len(big) // 3]

        headers = {"Content-Type": "application/json", "X-Forwarded-For": ATTACKER}
        return await client.post(f"/hooks/{trigger_id}", content=chunks(), headers=headers)

    async with gateway(settings, bus, triggers, failures) as client:
        assert (await oversized(client, ATTACKER, "gh-review")).status_code == 413  # not blocked: the usual 413
        for guess in ("gh", "review"):
            assert (await _hook(client, ATTACKER, {}, trigger_id=guess)).status_code == 404
        existing = await oversized(client, ATTACKER, "gh-review")
        unknown = await oversized(client, ATTACKER, "gh-reviews")
        chunked = await streamed(client, "gh-review")
        for answer in (existing, unknown, chunked):
            _assert_limited(answer, retry_after="60")
        assert existing.content == unknown.content == chunked.content
        assert (await oversized(client, OTHER, "gh-review")).status_code == 413  # another address


# --------------------------------------------------------------------------- audit and log
async def test_the_429_is_audited_and_the_block_is_warned_once(
    bus: Bus, event_log: EventLog, settings: Settings, triggers: list[TriggerConfig]
) -> None:
    failures = WebhookFailures(2, 120, clock=Clock())
    with capture_logs() as logs:
        async with gateway(settings, bus, triggers, failures) as client:
            for _ in range(2):
                assert (await _hook(client, ATTACKER, WRONG)).status_code == 401
            for _ in range(4):
                assert (await _hook(client, ATTACKER, basic())).status_code == 429
            events = await event_log.wait_for(
                "api.access_refused", where=lambda e: e.data["reason"] == "too_many_failures"
            )
    (limited,) = events  # four refusals of one caller, path and reason in one audit window: one first event
    assert limited.actor == f"address:{ATTACKER}"
    assert {k: limited.data[k] for k in ("service", "method", "path", "address", "count")} == {
        "service": "trigger-gateway",
        "method": "POST",
        "path": "/hooks/ado-pr-review",
        "address": ATTACKER,
        "count": 1,
    }
    bad = await event_log.wait_for("api.access_refused", where=lambda e: e.data["reason"] == "bad_credentials")
    assert bad[0].data["address"] == ATTACKER
    assert PASSWORD not in json.dumps([e.data for e in event_log.of_type("api.access_refused")])
    warned = [entry for entry in logs if entry["event"] == "webhook.failure_limit_reached"]
    assert warned == [
        {
            "event": "webhook.failure_limit_reached",
            "log_level": "warning",
            "address": ATTACKER,
            "trigger_id": "ado-pr-review",
            "counted": "failed authentications",
            "failures": 2,
            "window_s": 120,
        }
    ]
    assert not [entry for entry in logs if entry["event"] == "auth.failure_limit_reached"]  # nor per refusal


# --------------------------------------------------------------------------- settings, through the service
def test_the_settings_and_their_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (Settings().webhook_max_failures, Settings().webhook_failure_window_s) == (20, 300)
    monkeypatch.setenv("TEMPORALITY_GATEWAY_WEBHOOK_MAX_FAILURES", "5")
    monkeypatch.setenv("TEMPORALITY_GATEWAY_WEBHOOK_FAILURE_WINDOW_S", "60")
    assert (Settings().webhook_max_failures, Settings().webhook_failure_window_s) == (5, 60)
    monkeypatch.setenv("TEMPORALITY_GATEWAY_WEBHOOK_MAX_FAILURES", "0")
    with pytest.raises(ValueError, match="webhook_max_failures"):
        Settings()


async def test_the_service_applies_its_settings(gateway_settings: Settings) -> None:
    """The whole service (runtime, server, audit): the limit its settings name, the TCP peer as the address."""
    settings = gateway_settings.model_copy(update={"webhook_max_failures": 2, "webhook_failure_window_s": 30.0})
    async with replicas(settings, count=1) as (client,):
        sent: dict[str, Any] = {"Content-Type": "application/json"}
        for _ in range(2):
            answer = await client.post("/hooks/file-pr", content=_pr(), headers={**sent, **WRONG})
            assert answer.status_code == 401
        started = time.monotonic()
        limited = await client.post("/hooks/file-pr", content=_pr(), headers={**sent, **basic()})
        _assert_limited(limited)
        assert 1 <= int(limited.headers["Retry-After"]) <= 30 - int(time.monotonic() - started) + 1
