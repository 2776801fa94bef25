"""Who the client is, and how long its body may take, over real HTTP: :class:`HttpServer` on a real port.

* ``X-Forwarded-For`` / ``X-Forwarded-Proto`` are believed only from the proxies named in
  ``TEMPORALITY_FORWARDED_ALLOW_IPS`` (none by default: uvicorn's own default trusts loopback, so any local client
  chose the address the sign-in limits and the audit trail saw).
* A body still incomplete ``TEMPORALITY_HTTP_BODY_TIMEOUT_S`` after the route started reading it is a 408
  ``body_timeout`` and the connection is closed (a slow-loris client trickling bytes is not kept forever).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from pydantic import ValidationError

from temporality_service import install_error_handlers, read_body
from temporality_service.http import DEFAULT_BODY_TIMEOUT_S
from temporality_service.server import BODY_BACKSTOP_GRACE_S, HttpServer
from temporality_service.settings import ProcessSettings

FORGED = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"}


def _app(body_timeout_s: float | None = None) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    if body_timeout_s is not None:
        app.state.body_timeout_s = body_timeout_s

    @app.get("/who")
    async def who(request: Request) -> dict[str, Any]:
        assert request.client is not None
        return {"host": request.client.host, "scheme": request.url.scheme}

    @app.post("/first")
    async def first(request: Request) -> dict[str, int]:  # waits for a first message itself, as the gateway does
        message = await request.receive()
        return {"bytes": len(message.get("body", b""))}

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await read_body(request, 200_000))}

    return app


@asynccontextmanager
async def served(app: FastAPI, **config: Any) -> AsyncIterator[HttpServer]:
    server = HttpServer(app, host="127.0.0.1", port=0, **config)
    serving = asyncio.create_task(server.run_until_exit())
    try:
        await asyncio.wait_for(server.listening.wait(), 30)
        yield server
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)


async def test_by_default_forwarded_headers_are_ignored_even_from_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")  # uvicorn's own variable changes nothing either
    async with served(_app()) as server, httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        answer = await client.get("/who", headers=FORGED)
        assert answer.json() == {"host": "127.0.0.1", "scheme": "http"}  # the TCP peer, as it connected


@pytest.mark.parametrize("proxies", ["127.0.0.1", "10.0.0.5,127.0.0.0/8", "::1, 127.0.0.1"])
async def test_a_named_proxy_s_forwarded_headers_are_believed(proxies: str) -> None:
    async with (
        served(_app(), forwarded_allow_ips=ProcessSettings(forwarded_allow_ips=proxies).forwarded_allow_ips) as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as client,
    ):
        assert (await client.get("/who", headers=FORGED)).json() == {"host": "203.0.113.9", "scheme": "https"}
        # the proxy appends the peer it saw: the client is the last address that is not a trusted proxy
        chained = await client.get("/who", headers={"X-Forwarded-For": "198.51.100.1, 203.0.113.9, 127.0.0.1"})
        assert chained.json()["host"] == "203.0.113.9"
        assert (await client.get("/who")).json()["host"] == "127.0.0.1"  # no header: the proxy itself


async def test_a_proxy_not_named_is_not_believed() -> None:
    async with (
        served(_app(), forwarded_allow_ips="10.0.0.0/8") as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as client,
    ):
        assert (await client.get("/who", headers=FORGED)).json() == {"host": "127.0.0.1", "scheme": "http"}


def test_the_setting_is_a_list_of_addresses_and_networks(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ProcessSettings().forwarded_allow_ips == ""
    monkeypatch.setenv("TEMPORALITY_FORWARDED_ALLOW_IPS", " 10.0.0.5, 10.1.0.0/16 ,,fd00::/8 ")
    assert ProcessSettings().forwarded_allow_ips == "10.0.0.5,10.1.0.0/16,fd00::/8"
    # uvicorn would take these as literals that never match: every client would share the proxy's address
    for wrong, named in [("ingress.local", "ingress.local"), ("*", "*"), ("10.0.0.1/8", "host bits set")]:
        monkeypatch.setenv("TEMPORALITY_FORWARDED_ALLOW_IPS", wrong)
        with pytest.raises(ValidationError, match="TEMPORALITY_FORWARDED_ALLOW_IPS") as refused:
            ProcessSettings()
        assert named in str(refused.value)
    assert ProcessSettings(forwarded_allow_ips="").http_body_timeout_s == DEFAULT_BODY_TIMEOUT_S == 30.0
    monkeypatch.setenv("TEMPORALITY_HTTP_BODY_TIMEOUT_S", "0")
    with pytest.raises(ValidationError):
        ProcessSettings(forwarded_allow_ips="")


def _trickle(port: int, declared: int, every_s: float, give_up_s: float) -> tuple[bytes, float, bool]:
    """A slow-loris client on a raw socket: headers at once, then one body byte every ``every_s`` until the server
    answers; returns the answer, when it began, and whether the server then closed the connection (a reset after
    the answer, for the bytes sent meanwhile, is a close too), all within ``give_up_s``."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=give_up_s) as sock:
        sock.sendall(
            b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(declared).encode() + b"\r\n\r\n"
        )
        sock.settimeout(every_s)
        received, answered_at = b"", time.monotonic()
        while not received and time.monotonic() - started < give_up_s:
            try:
                sock.sendall(b" ")
                received = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:  # closed or reset before any answer
                return b"", time.monotonic() - started, True
            answered_at = time.monotonic()
            if not received:
                return b"", answered_at - started, True
        sock.settimeout(max(0.1, give_up_s - (time.monotonic() - started)))
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            return received, answered_at - started, False
        except OSError:  # a reset: closed
            pass
        return received, answered_at - started, True


async def test_a_body_trickled_byte_by_byte_is_a_408_and_the_connection_is_closed() -> None:
    async with served(_app(body_timeout_s=1.5)) as server:
        answer, after_s, closed = await asyncio.to_thread(_trickle, server.port, 100_000, 0.25, 20)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer[:300]
        assert b"connection: close" in head.lower()
        refused = json.loads(body)
        assert refused["error"] == "body_timeout"
        assert "1.5 s" in refused["detail"]
        assert "TEMPORALITY_HTTP_BODY_TIMEOUT_S" in refused["detail"]
        assert closed, "the server kept the slow client's connection open"
        assert 1.4 <= after_s < 15, after_s
        # a body sent at once is unaffected
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            assert (await client.post("/echo", content=b"x" * 100_000)).json() == {"bytes": 100_000}


def _trickle_head(port: int, every_s: float, give_up_s: float) -> tuple[bytes, float, bool]:
    """A slow-loris client that trickles the request line and headers themselves, one byte every ``every_s``."""
    head = b"GET /who HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Padding: " + b"a" * 10_000 + b"\r\n\r\n"
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=give_up_s) as sock:
        sock.settimeout(every_s)
        received, answered_at = b"", time.monotonic()
        for byte in head:
            if time.monotonic() - started > give_up_s:
                break
            try:
                sock.sendall(bytes([byte]))
                received = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return b"", time.monotonic() - started, True
            answered_at = time.monotonic()
            break
        sock.settimeout(5)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            return received, answered_at - started, False
        except OSError:
            pass
        return received, answered_at - started, True


async def test_headers_trickled_byte_by_byte_are_a_408_and_the_connection_is_closed() -> None:
    async with served(_app(), head_timeout_s=1.5) as server:
        answer, after_s, closed = await asyncio.to_thread(_trickle_head, server.port, 0.25, 20)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer[:300]
        assert json.loads(body)["error"] == "head_timeout"
        assert closed, "the server kept the slow client's connection open"
        assert 1.4 <= after_s < 15, after_s
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:  # a real client is unaffected
            assert (await client.get("/who")).status_code == 200
            assert (await client.get("/who")).status_code == 200  # and its keep-alive connection too


async def test_a_route_waiting_for_a_body_without_read_body_is_bounded_too() -> None:
    """The server's backstop, a few seconds after read_body's deadline: headers, then not a byte of the body."""
    async with served(_app(), body_timeout_s=0.5) as server:

        def silent() -> tuple[bytes, float]:
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
                sock.sendall(b"POST /first HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n")
                received = b""
                while chunk := sock.recv(65536):
                    received += chunk
                return received, time.monotonic() - started

        answer, after_s = await asyncio.to_thread(silent)  # returns once the server closed the connection
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer[:300]
        assert json.loads(body)["error"] == "body_timeout"
        assert 0.5 + BODY_BACKSTOP_GRACE_S - 0.1 <= after_s < 20, after_s
