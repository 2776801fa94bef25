"""Hostile input against ``POST /auth/password`` over real HTTP (the journal service on a real port, the real
human-interaction checking passwords over a real bus): wrong content types, huge and broken bodies, bytes that
are not UTF-8, missing and mistyped fields. Every answer is a 4xx JSON ``{"error", "detail"}`` naming what was
wrong without echoing the input -- never a 5xx -- nobody is signed in, and the service still signs the right
password in afterwards (and logged no server error)."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from journal_support import ServedJournal, serve_human, serve_journal
from test_journal_password_signin import ALICE_PASSWORD, CONSOLE, password_settings, sign_in, users_file

from temporality_bus import Bus, NatsSettings
from temporality_journal.signin import SESSION_COOKIE

JSON = {**CONSOLE, "Content-Type": "application/json"}
KiB = 1024
MAX_ERROR_BODY = 4 * KiB


@pytest.fixture
async def journal(tmp_path: Path, nats_settings: NatsSettings, bus: Bus) -> AsyncIterator[ServedJournal]:
    (tmp_path / "vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    async with serve_human(tmp_path, nats_settings, tmp_path / "vouch-secret", users=users_file()) as human_url:
        # limits high enough that the sweep's refusals never turn into 429s
        settings = password_settings(
            tmp_path, nats_settings, human_url, password_max_failures=1000, password_max_failures_per_address=100_000
        )
        async with serve_journal(settings, bus) as served:
            yield served


def body(value: Any) -> bytes:
    return json.dumps(value).encode()


#: (what, headers, raw body, the status expected, the error code expected, a word the detail must contain)
CASES: list[tuple[str, dict[str, str], bytes, int, str, str]] = [
    ("no console header", {"Content-Type": "application/json"}, body({"user": "a", "password": "b"}), 403,
     "console_header_missing", "X-Temporality-Console"),
    ("a form post", {**CONSOLE, "Content-Type": "application/x-www-form-urlencoded"}, b"user=alice&password=x", 415,
     "unsupported_media_type", "application/json"),
    ("multipart", {**CONSOLE, "Content-Type": "multipart/form-data; boundary=x"},
     b'--x\r\nContent-Disposition: form-data; name="user"\r\n\r\nalice\r\n--x--\r\n', 415, "unsupported_media_type",
     "application/json"),
    ("text/plain", {**CONSOLE, "Content-Type": "text/plain"}, body({"user": "a", "password": "b"}), 415,
     "unsupported_media_type", "application/json"),
    ("no content type", CONSOLE, body({"user": "a", "password": "b"}), 415, "unsupported_media_type",
     "application/json"),
    ("a garbage content type", {**CONSOLE, "Content-Type": ";;;==,/+json"}, body({"user": "a", "password": "b"}), 415,
     "unsupported_media_type", "application/json"),
    ("a control byte in a header", {**CONSOLE, "Content-Type": "application/json\x01"}, body({"user": "a"}), 400,
     "bad_request", "HTTP"),
    ("a huge body", JSON, body({"user": "alice", "password": "x" * 100_000}), 413, "body_too_large", "limit"),
    ("a huge user id", JSON, body({"user": "u" * 9000, "password": "x"}), 413, "body_too_large", "limit"),
    ("an empty body", JSON, b"", 400, "malformed_json", "JSON"),
    ("not JSON", JSON, b"user=alice", 400, "malformed_json", "JSON"),
    ("not UTF-8", JSON, b'{"user": "\xff\xfe", "password": "x"}', 400, "malformed_json", "UTF-8"),
    ("Latin-1 declared", {**JSON, "Content-Type": "application/json; charset=latin-1"},
     '{"user": "j\xfcrgen", "password": "x"}'.encode("latin-1"), 400, "malformed_json", "UTF-8"),
    ("a lone surrogate", JSON, b'{"user": "\\ud800", "password": "x"}', 400, "malformed_json", "surrogate"),
    ("NaN", JSON, b'{"user": "alice", "password": NaN}', 400, "malformed_json", "JSON"),
    ("deep nesting", JSON, b"[" * 4000 + b"]" * 4000, 400, "malformed_json", "JSON"),
    ("truncated JSON", JSON, b'{"user": "alice", "pass', 400, "malformed_json", "JSON"),
    ("an array", JSON, body([]), 422, "invalid_body", "object"),
    ("a string", JSON, body("alice"), 422, "invalid_body", "object"),
    ("null", JSON, b"null", 422, "invalid_body", "object"),
    ("no password", JSON, body({"user": "alice"}), 422, "invalid_body", "password"),
    ("no user", JSON, body({"password": ALICE_PASSWORD}), 422, "invalid_body", "user"),
    ("an empty object", JSON, body({}), 422, "invalid_body", "user"),
    ("an empty user", JSON, body({"user": "", "password": "x"}), 422, "invalid_body", "user"),
    ("an empty password", JSON, body({"user": "alice", "password": ""}), 422, "invalid_body", "password"),
    ("a number password", JSON, body({"user": "alice", "password": 5}), 422, "invalid_body", "password"),
    ("a list user", JSON, body({"user": ["alice"], "password": "x"}), 422, "invalid_body", "user"),
    ("a null user", JSON, body({"user": None, "password": "x"}), 422, "invalid_body", "user"),
    ("a password too long", JSON, body({"user": "alice", "password": "p" * 1025}), 422, "invalid_body", "password"),
    ("a user too long", JSON, body({"user": "u" * 201, "password": "x"}), 422, "invalid_body", "user"),
    ("an unknown field", JSON, body({"user": "alice", "password": "x", "role": "admin"}), 422, "invalid_body",
     "role"),
    # well-formed but odd: checked like any other, and refused like any wrong password
    ("control characters", JSON, body({"user": "al\x00ice\n", "password": "\x00\x1b[2J"}), 401, "sign_in_refused",
     "wrong password"),
    ("emoji and RTL", JSON, body({"user": "\U0001f600\u202eecila", "password": "\u202e" * 300}), 401,
     "sign_in_refused", "wrong password"),
    ("a BOM", JSON, b"\xef\xbb\xbf" + body({"user": "alice", "password": "nope"}), 401, "sign_in_refused",
     "wrong password"),
    ("JSON with a charset", {**JSON, "Content-Type": "application/json; charset=utf-8"},
     body({"user": "alice", "password": "nope"}), 401, "sign_in_refused", "wrong password"),
]  # fmt: skip


def contract_problems(what: str, answer: httpx.Response, status: int, code: str, word: str, sent: bytes) -> list[str]:
    problems = []
    if answer.status_code != status:
        problems.append(f"{what}: {answer.status_code} (expected {status}): {answer.text[:300]}")
    if not answer.headers.get("content-type", "").startswith("application/json"):
        return [*problems, f"{what}: not JSON: {answer.headers.get('content-type')}"]
    error = answer.json()
    if not (isinstance(error, dict) and isinstance(error.get("error"), str) and isinstance(error.get("detail"), str)):
        return [*problems, f"{what}: not an error body: {answer.text[:300]}"]
    if error["error"] != code:
        problems.append(f"{what}: error {error['error']!r} (expected {code!r})")
    if word.casefold() not in error["detail"].casefold():
        problems.append(f"{what}: the detail does not say {word!r}: {error['detail']!r}")
    if len(answer.content) > MAX_ERROR_BODY or (len(sent) > 64 and sent[:64] in answer.content):
        problems.append(f"{what}: the answer echoes the input ({len(answer.content)} bytes)")
    if SESSION_COOKIE in answer.headers.get("set-cookie", ""):
        problems.append(f"{what}: a session cookie was set")
    return problems


async def test_bad_sign_in_bodies_are_clear_4xx_and_never_5xx(journal: ServedJournal) -> None:
    with structlog.testing.capture_logs() as logs:
        async with httpx.AsyncClient(base_url=journal.url, timeout=30) as client:
            problems: list[str] = []
            for what, headers, raw, status, code, word in CASES:
                answer = await client.post("/auth/password", content=raw, headers=headers)
                problems += contract_problems(what, answer, status, code, word, raw)
            assert not problems, "\n".join(problems)
            assert client.cookies.get(SESSION_COOKIE) is None
            signed_in = await sign_in(client, "alice", ALICE_PASSWORD)  # it still works afterwards
            assert signed_in.status_code == 200, signed_in.text
    errors = [e for e in logs if e.get("log_level") in ("error", "critical") or e["event"] == "http.internal_error"]
    assert errors == []


async def test_broken_transfers_are_refused_and_the_service_goes_on(journal: ServedJournal) -> None:
    host, port = journal.url.removeprefix("http://").rsplit(":", 1)
    head = (
        "POST /auth/password HTTP/1.1\r\nHost: journal\r\nX-Temporality-Console: 1\r\n"
        "Content-Type: application/json\r\nConnection: close\r\n"
    )
    requests = {
        "a Content-Length that is not a number": (head + "Content-Length: 1e3\r\n\r\n{}").encode(),
        "a declared length over the limit": (head + "Content-Length: 99999999\r\n\r\n{").encode(),
        "a chunked body over the limit": (head + "Transfer-Encoding: chunked\r\n\r\n").encode()
        + b"".join(b"1000\r\n" + b"x" * 4096 + b"\r\n" for _ in range(4))
        + b"0\r\n\r\n",
    }
    for what, request in requests.items():
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 30)
        rest = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        status = int(status_line.split()[1])
        assert 400 <= status < 500, (what, status_line, rest[:300])
        assert b'"error"' in rest, (what, rest[:300])
    # a body that breaks off mid-way: the connection closes, nothing answers 5xx later, the service goes on
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write((head + "Content-Length: 100\r\n\r\n" + '{"user": "alice", "pass').encode())
    await writer.drain()
    writer.close()
    async with httpx.AsyncClient(base_url=journal.url, timeout=30) as client:
        assert (await sign_in(client, "alice", ALICE_PASSWORD)).status_code == 200
