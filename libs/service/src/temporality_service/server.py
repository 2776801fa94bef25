"""The HTTP server every service runs: uvicorn on a socket we bind, without its own signal handling.

* The listening socket is created with ``IPPROTO_TCP``: asyncio sets ``TCP_NODELAY`` on accepted
  connections only for such sockets (``socket.socket(AF_INET, SOCK_STREAM)`` has ``proto == 0``), and
  without it a keep-alive response waits for the client's delayed ACK (~40 ms). Measured with wrk on
  the gateway: 574 req/s without, 874 with, ~1,050 with uvloop + httptools as well.
* ``httptools`` is the parser (uvicorn's fastest); its plain-text 400 for a request that is not HTTP
  (a raw non-ASCII byte in the path, a broken request line) is replaced by the JSON error contract.
* Signals belong to the service runtime: uvicorn's ``capture_signals`` is a no-op; the runtime sets
  ``should_exit``. ``started`` is an event, not a flag to poll.
* An idle keep-alive connection is kept :data:`KEEP_ALIVE_S` (75 s), not uvicorn's 5 s. A server that closes
  an idle connection first races the client's next request on it: the request is lost with a reset
  (``httpx.ReadError``, a load balancer's 502), and a POST is not retried. The server must therefore keep
  connections longer than any client or proxy in front keeps them idle (AWS ALB 60 s, nginx 60 s upstream
  keep-alive, httpx 5 s): the usual advice for a backend behind a load balancer. A shutdown still closes idle
  connections at once.
* Forwarded headers (``X-Forwarded-For``, ``X-Forwarded-Proto``) are believed only from the proxies named in
  ``forwarded_allow_ips`` (``TEMPORALITY_FORWARDED_ALLOW_IPS``); none by default, whatever uvicorn's own default
  (``127.0.0.1`` and its ``FORWARDED_ALLOW_IPS`` variable): otherwise any local client could choose the address
  the sign-in limits and the audit trail see, by sending the header itself.
* A request's line and headers must arrive within :data:`HEAD_TIMEOUT_S` of their first byte, its body within
  ``TEMPORALITY_HTTP_BODY_TIMEOUT_S`` (:func:`~temporality_service.http.read_body`): a slow-loris client is
  answered 408 and disconnected instead of holding a connection forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Iterator
from typing import Any

from uvicorn import Config, Server
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from temporality_service.http import DEFAULT_BODY_TIMEOUT_S

__all__ = ["HEAD_TIMEOUT_S", "KEEP_ALIVE_S", "HttpServer", "JsonErrorHttpToolsProtocol", "bind_tcp"]

#: How long an idle keep-alive connection stays open: longer than the idle timeout of the clients and proxies
#: in front (see the module docstring), so they, never this server, close it.
KEEP_ALIVE_S = 75
#: How long a request's line and headers may take from their first byte (they come in one packet from any real
#: client): past it, a 408 ``head_timeout`` and the connection closed.
HEAD_TIMEOUT_S = 30.0
#: The protocol's backstop of the body deadline comes this long after read_body's own (which answers first).
BODY_BACKSTOP_GRACE_S = 5.0

_BAD_REQUEST = json.dumps(
    {
        "error": "bad_request",
        "detail": "the request is not valid HTTP/1.1 (a malformed request line or header, a raw non-ASCII byte "
        "in the path, or a URL or header over the size limit)",
    }
).encode()


_BODY_TIMEOUT = json.dumps(
    {
        "error": "body_timeout",
        "detail": "the request body was not complete in time; send it at once (the limit is "
        "TEMPORALITY_HTTP_BODY_TIMEOUT_S)",
    }
).encode()
_HEAD_TIMEOUT = json.dumps(
    {
        "error": "head_timeout",
        "detail": "the request line and headers did not arrive in time; send them at once",
    }
).encode()


class JsonErrorHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol whose answer to an unparseable request is our JSON 400, and which bounds how long
    a request's line and headers may take (:attr:`head_timeout_s` from its first byte; a new connection that sends
    nothing is closed after :data:`KEEP_ALIVE_S`, as an idle keep-alive one is): uvicorn has no such limit, and a
    client trickling its headers byte by byte held a connection forever (slow-loris). The body has its own
    deadline (:func:`~temporality_service.http.read_body`)."""

    head_timeout_s: float = HEAD_TIMEOUT_S
    #: The backstop of the body's deadline: :func:`~temporality_service.http.read_body` answers a slow body at its
    #: deadline; this catches a route that waits for a body without it (the trigger-gateway reads a webhook's first
    #: message itself), a few seconds later, and a body nobody reads (a GET with one, after its answer).
    body_backstop_s: float = DEFAULT_BODY_TIMEOUT_S + BODY_BACKSTOP_GRACE_S
    _head_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None

    def _arm_head_timer(self, delay_s: float) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(delay_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.headers is None:  # not a byte of a request yet: an idle new connection, closed quietly
            self.transport.close()
            return
        self._send_error(b"408 Request Timeout", _HEAD_TIMEOUT)

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_started:
            self._send_error(b"408 Request Timeout", _BODY_TIMEOUT)  # the app then sees a disconnect
        else:
            self.transport.close()

    def _disarm_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer(KEEP_ALIVE_S)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        self._disarm_body_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head_timer(self.head_timeout_s)

    def on_headers_complete(self) -> None:
        self._disarm_head_timer()
        super().on_headers_complete()
        if any(
            (name == b"content-length" and value.strip() not in (b"", b"0")) or name == b"transfer-encoding"
            for name, value in self.headers
        ):
            self._disarm_body_timer()
            self._body_timer = self.loop.call_later(self.body_backstop_s, self._body_timed_out)

    def on_message_complete(self) -> None:
        self._disarm_body_timer()
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        self._send_error(b"400 Bad Request", _BAD_REQUEST)

    def _send_error(self, status: bytes, body: bytes) -> None:
        head = [b"HTTP/1.1 " + status + b"\r\n"]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.extend(
            [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
            ]
        )
        self.transport.write(b"".join(head) + body)
        self.transport.close()


def bind_tcp(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on (host, port) with ``IPPROTO_TCP`` (so accepted sockets get
    ``TCP_NODELAY``) and ``SO_REUSEADDR`` (a restart does not wait for TIME_WAIT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class HttpServer(Server):
    """uvicorn serving ``app`` on a socket bound by :func:`bind_tcp`; ``started`` is set once it accepts."""

    def __init__(
        self,
        app: Any,
        *,
        host: str,
        port: int,
        forwarded_allow_ips: str = "",
        head_timeout_s: float = HEAD_TIMEOUT_S,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
        **config: Any,
    ) -> None:
        self.socket = bind_tcp(host, port)
        self.host: str = self.socket.getsockname()[0]
        self.port: int = self.socket.getsockname()[1]
        super().__init__(
            Config(
                app,
                http=type(
                    "HttpToolsProtocol",
                    (JsonErrorHttpToolsProtocol,),
                    {"head_timeout_s": head_timeout_s, "body_backstop_s": body_timeout_s + BODY_BACKSTOP_GRACE_S},
                ),
                log_config=None,
                access_log=False,
                lifespan="off",
                server_header=False,
                # no trusted proxy: the middleware is left out and the TCP peer is the client
                proxy_headers=bool(forwarded_allow_ips.strip()),
                forwarded_allow_ips=forwarded_allow_ips.strip() or "",
                **{"timeout_keep_alive": KEEP_ALIVE_S, **config},
            )
        )
        self.listening = asyncio.Event()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the service runtime owns SIGTERM/SIGINT and sets should_exit

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.listening.set()

    async def run_until_exit(self) -> None:
        """Serve until ``should_exit``; a server that could not start raises instead of exiting the process."""
        try:
            await self.serve(sockets=[self.socket])
        except SystemExit as exc:  # uvicorn exits when startup fails
            raise RuntimeError(f"the HTTP server failed to start (exit {exc.code})") from exc
        finally:
            self.socket.close()
