"""Role tokens over real HTTP (:class:`HttpServer` on a real port): wrong tokens are limited per client address
(429 + ``Retry-After``, others unaffected, the proxy setting respected), and the tokens file is re-read while
the server runs (a removed token is refused without a restart; a broken file never opens access)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.requests import HTTPConnection
from structlog.testing import capture_logs

from temporality_service import ApiAuth, ApiAuthSettings, FailureLimiter, client_address, install_error_handlers
from temporality_service.auth import AsViewer
from temporality_service.limits import Exhausted, TooManyFailures, take
from temporality_service.server import HttpServer
from temporality_service.settings import ProcessSettings
from temporality_testing.waiting import eventually

ADMIN = "a" * 24 + "-admin"
VIEWER = "v" * 24 + "-viewer"
WRONG = "w" * 30


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _app(auth: ApiAuth) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    auth.install(app)

    @app.get("/read")
    async def read(who: AsViewer) -> dict[str, str]:
        return {"name": who.name}

    return app


@asynccontextmanager
async def served(app: FastAPI, **config: Any) -> AsyncIterator[httpx.AsyncClient]:
    server = HttpServer(app, host="127.0.0.1", port=0, **config)
    serving = asyncio.create_task(server.run_until_exit())
    try:
        await asyncio.wait_for(server.listening.wait(), 30)
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            yield client
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)


def _bearer(token: str, forwarded_for: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"}
    if forwarded_for is not None:
        headers["X-Forwarded-For"] = forwarded_for
    return headers


def _write(path: Path, text: str) -> None:
    """As an operator should: the new file beside the old one, renamed over it."""
    new = path.with_suffix(".new")
    new.write_text(text, encoding="utf-8")
    os.replace(new, path)


async def _until(condition: Callable[[], Awaitable[bool]], within_s: float = 20.0) -> None:
    await eventually(condition, within_s, "the tokens file to be looked at again")


# --------------------------------------------------------------------------- the failure limit
async def test_wrong_tokens_from_one_address_get_429_and_other_addresses_are_unaffected(tmp_path: Path) -> None:
    clock = Clock()
    auth = ApiAuth.from_settings(ApiAuthSettings(tokens_file=_tokens(tmp_path)))
    auth._failures = FailureLimiter(3, 60, clock=clock)
    proxy = ProcessSettings(forwarded_allow_ips="127.0.0.1").forwarded_allow_ips  # the test client is the proxy
    async with served(_app(auth), forwarded_allow_ips=proxy) as client:
        attacker, other = "203.0.113.7", "198.51.100.2"
        for _ in range(3):
            wrong = await client.get("/read", headers=_bearer(WRONG, attacker))
            assert wrong.status_code == 401
            assert wrong.json()["error"] == "invalid_token"
        for token in (WRONG, VIEWER):  # the right token too: a 429 must not tell a guess that is right
            limited = await client.get("/read", headers=_bearer(token, attacker))
            assert limited.status_code == 429
            assert limited.json()["error"] == "too_many_failures"
            assert limited.headers["Retry-After"] == "60"
        assert auth.failures.failures(attacker) == 3  # a refused attempt is not counted again
        # someone else, with a right token or a wrong one, is judged as before
        assert (await client.get("/read", headers=_bearer(VIEWER, other))).json() == {"name": "board"}
        assert (await client.get("/read", headers=_bearer(WRONG, other))).status_code == 401
        # a request without a token is not a guess: the usual 401
        assert (await client.get("/read", headers={"X-Forwarded-For": attacker})).status_code == 401
        clock.now += 30
        assert (await client.get("/read", headers=_bearer(VIEWER, attacker))).headers["Retry-After"] == "30"
        clock.now += 30.5  # the oldest failures left the window
        assert (await client.get("/read", headers=_bearer(VIEWER, attacker))).status_code == 200


async def test_without_a_trusted_proxy_the_forwarded_address_is_not_what_is_counted(tmp_path: Path) -> None:
    auth = ApiAuth.from_settings(ApiAuthSettings(tokens_file=_tokens(tmp_path), max_failures_per_address=2))
    async with served(_app(auth)) as client:
        for fake in ("203.0.113.1", "203.0.113.2"):  # a forged header changes nothing: both from 127.0.0.1
            assert (await client.get("/read", headers=_bearer(WRONG, fake))).status_code == 401
        answer = await client.get("/read", headers=_bearer(VIEWER, "203.0.113.3"))
        assert answer.status_code == 429
        assert 1 <= int(answer.headers["Retry-After"]) <= 300
    assert auth.failures.max_failures == 2
    assert auth.failures.window_s == 300


def test_the_settings_and_their_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (ApiAuthSettings().max_failures_per_address, ApiAuthSettings().failure_window_s) == (20, 300)
    monkeypatch.setenv("TEMPORALITY_API_MAX_FAILURES_PER_ADDRESS", "5")
    monkeypatch.setenv("TEMPORALITY_API_FAILURE_WINDOW_S", "60")
    assert (ApiAuthSettings().max_failures_per_address, ApiAuthSettings().failure_window_s) == (5, 60)
    monkeypatch.setenv("TEMPORALITY_API_MAX_FAILURES_PER_ADDRESS", "0")
    with pytest.raises(ValueError, match="max_failures_per_address"):
        ApiAuthSettings()


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("203.0.113.9", "203.0.113.9"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),  # the same /64: the same client
        ("::ffff:192.0.2.1", "192.0.2.1"),
        ("testclient", "testclient"),
    ],
)
def test_the_client_key_is_the_address_an_ipv6_one_by_its_64(host: str, key: str) -> None:
    scope = {"type": "http", "client": (host, 1234), "headers": [], "path": "/", "query_string": b""}
    assert client_address(HTTPConnection(scope)) == key


def test_the_limiter_forgets_old_addresses_past_its_size() -> None:
    clock = Clock()
    limiter = FailureLimiter(2, 10, clock=clock, max_addresses=3)
    for n in range(3):
        limiter.failed(f"10.0.0.{n}")
    clock.now += 11  # those three expired
    limiter.failed("10.0.0.9")
    limiter.failed("10.0.0.8")
    limiter.failed("10.0.0.7")
    limiter.failed("10.0.0.6")  # a fourth live one: the oldest goes
    assert [a for a in ("10.0.0.0", "10.0.0.9", "10.0.0.8", "10.0.0.7", "10.0.0.6") if limiter.failures(a)] == [
        "10.0.0.8",
        "10.0.0.7",
        "10.0.0.6",
    ]


async def test_the_limit_is_logged_once_per_block_not_per_refused_request(tmp_path: Path) -> None:
    clock = Clock()
    auth = ApiAuth.from_settings(ApiAuthSettings(tokens_file=_tokens(tmp_path)))
    auth._failures = FailureLimiter(2, 60, clock=clock)
    proxy = ProcessSettings(forwarded_allow_ips="127.0.0.1").forwarded_allow_ips
    attacker = "203.0.113.7"
    with capture_logs() as logs:
        async with served(_app(auth), forwarded_allow_ips=proxy) as client:
            statuses = [(await client.get("/read", headers=_bearer(WRONG, attacker))).status_code for _ in range(6)]
            clock.now += 60.5  # the block is over: the next one is logged again
            statuses += [(await client.get("/read", headers=_bearer(WRONG, attacker))).status_code for _ in range(4)]
    assert statuses == [401, 401, 429, 429, 429, 429, 401, 401, 429, 429]
    logged = [entry for entry in logs if entry["event"] == "auth.failure_limit_reached"]
    assert logged == 2 * [
        {
            "event": "auth.failure_limit_reached",
            "log_level": "info",
            "address": attacker,
            "failures": 2,
            "retry_after_s": 60,
        }
    ]


def test_new_keys_past_the_size_push_out_the_oldest_never_a_blocked_one() -> None:
    clock = Clock()
    limiter = FailureLimiter(2, 10, clock=clock, max_addresses=3)
    for _ in range(2):
        limiter.failed("10.0.0.1")  # blocked
    limiter.failed("10.0.0.2")  # one failure: below the limit
    for n in range(100):  # a flood of new keys, one failure each
        clock.now += 0.01
        limiter.failed(f"10.1.0.{n}")
    with pytest.raises(TooManyFailures):
        limiter.check("10.0.0.1")  # still blocked
    assert limiter.failures("10.0.0.1") == 2
    assert [a for a in ("10.0.0.2", "10.1.0.96", "10.1.0.97", "10.1.0.98", "10.1.0.99") if limiter.failures(a)] == [
        "10.1.0.97",
        "10.1.0.98",
        "10.1.0.99",
    ]
    for n in range(2, 5):  # blocked keys are bounded too: past the size the oldest block goes
        for _ in range(2):
            limiter.failed(f"10.0.0.{n}")
    assert [a for a in (f"10.0.0.{n}" for n in range(1, 5)) if limiter.failures(a)] == [
        "10.0.0.2",
        "10.0.0.3",
        "10.0.0.4",
    ]


def test_take_counts_until_the_limit_then_says_how_long_to_wait() -> None:
    times = take([], 100.0, 60, 2)
    times = take(times, 110.0, 60, 2)
    with pytest.raises(Exhausted) as full:
        take(times, 120.0, 60, 2)
    assert full.value.retry_after_s == 40
    assert take(times, 160.5, 60, 2) == [110.0, 160.5]


# --------------------------------------------------------------------------- the tokens file, re-read
def _tokens(tmp_path: Path, *entries: tuple[str, str, str]) -> Path:
    path = tmp_path / "tokens.yaml"
    rows = entries or (("root", "admin", ADMIN), ("board", "viewer", VIEWER))
    path.write_text("".join(f"- {{name: {n}, role: {r}, token: {t}}}\n" for n, r, t in rows), encoding="utf-8")
    return path


async def test_a_token_removed_from_the_file_is_refused_without_a_restart(tmp_path: Path) -> None:
    path = _tokens(tmp_path)
    # (every wrong token below is a failure of 127.0.0.1: a limit it does not reach)
    auth = ApiAuth.from_settings(ApiAuthSettings(tokens_file=path, max_failures_per_address=100_000))
    async with served(_app(auth)) as client:

        async def status(token: str) -> int:
            return (await client.get("/read", headers=_bearer(token))).status_code

        assert await status(VIEWER) == 200
        added = "n" * 24 + "-new"
        with capture_logs() as logs:
            _write(
                path, f"- {{name: root, role: admin, token: {ADMIN}}}\n- {{name: ci, role: viewer, token: {added}}}\n"
            )
            await _until(lambda: _is(status(VIEWER), 401))
        assert await status(added) == 200
        assert await status(ADMIN) == 200
        reloaded = [e for e in logs if e["event"] == "api.tokens_reloaded"]
        assert reloaded == [
            {
                "event": "api.tokens_reloaded",
                "log_level": "info",
                "tokens": 2,
                "added": ["ci"],
                "removed": ["board"],
                "changed": [],
            }
        ]
        assert all(VIEWER not in str(e) and added not in str(e) for e in logs)  # never a secret

        # broken edits keep the last good set, each said once; nothing is opened, nobody locked out
        for broken, problem in [
            ("- {name: ci, role: viewer, token: short}\n", "at least 24"),
            ("- [unclosed\n", "not YAML"),
            ("", "empty"),
        ]:
            with capture_logs() as logs:
                _write(path, broken)
                await _until(lambda: _said(status(ADMIN), logs, "api.tokens_file_invalid"))
                for _ in range(3):  # looked at again: not said again
                    await asyncio.sleep(RELOAD_GAP)
                    assert await status(added) == 200
                    assert await status(ADMIN) == 200
                    assert await status("short") == 401
            said = [e for e in logs if e["event"] == "api.tokens_file_invalid"]
            assert len(said) == 1, said
            assert problem in said[0]["problem"]
            assert said[0]["log_level"] == "error"
            assert said[0]["kept_tokens"] == 2
        with capture_logs() as logs:
            path.unlink()
            await _until(lambda: _said(status(ADMIN), logs, "api.tokens_file_invalid"))
        assert "cannot read" in next(e for e in logs if e["event"] == "api.tokens_file_invalid")["problem"]
        assert await status(ADMIN) == 200

        _write(path, "[]\n")  # revoke every token
        await _until(lambda: _is(status(ADMIN), 401))
        assert await status(added) == 401


RELOAD_GAP = 1.2


async def _is(answer: Awaitable[int], expected: int) -> bool:
    return await answer == expected


async def _said(request: Awaitable[int], logs: list[MutableMapping[str, Any]], event: str) -> bool:
    """Whether ``event`` was logged, after a request (an authentication is what looks at the file)."""
    await request
    return any(e["event"] == event for e in logs)


async def test_an_in_place_edit_is_seen_too(tmp_path: Path) -> None:
    path = _tokens(tmp_path)
    auth = ApiAuth.from_settings(ApiAuthSettings(tokens_file=path))
    async with served(_app(auth)) as client:
        assert (await client.get("/read", headers=_bearer(VIEWER))).status_code == 200
        path.write_text(f"- {{name: root, role: admin, token: {ADMIN}}}\n", encoding="utf-8")  # no rename

        async def revoked() -> bool:
            return (await client.get("/read", headers=_bearer(VIEWER))).status_code == 401

        await _until(revoked)
        assert (await client.get("/read", headers=_bearer(ADMIN))).status_code == 200


def test_tokens_given_without_a_file_are_never_reloaded() -> None:
    auth = ApiAuth()
    assert not auth.reload_if_changed(force=True)
    assert not auth.configured
