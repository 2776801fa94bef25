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

__all__ = ["KEEP_ALIVE_S", "HttpServer", "JsonErrorHttpToolsProtocol", "bind_tcp"]

#: How long an idle keep-alive connection stays open: longer than the idle timeout of the clients and proxies
#: in front (see the module docstring), so they, never this server, close it.
KEEP_ALIVE_S = 75

_BAD_REQUEST = json.dumps(
    {
        "error": "bad_request",
        "detail": "the request is not valid HTTP/1.1 (a malformed request line or header, a raw non-ASCII byte "
        "in the path, or a URL or header over the size limit)",
    }
).encode()


class JsonErrorHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol whose answer to an unparseable request is our JSON 400."""

    def send_400_response(self, msg: str) -> None:
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.extend(
            [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(_BAD_REQUEST)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
            ]
        )
        self.transport.write(b"".join(head) + _BAD_REQUEST)
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

    def __init__(self, app: Any, *, host: str, port: int, forwarded_allow_ips: str = "", **config: Any) -> None:
        self.socket = bind_tcp(host, port)
        self.host: str = self.socket.getsockname()[0]
        self.port: int = self.socket.getsockname()[1]
        super().__init__(
            Config(
                app,
                http=JsonErrorHttpToolsProtocol,
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
