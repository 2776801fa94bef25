"""Failure limits: so many failed attempts within a sliding window, then a 429 with ``Retry-After``.

The window arithmetic is shared by every limit of the project:

* :class:`FailureLimiter` (this module): wrong **bearer tokens** per client address, in the process -- the role
  tokens of every service's API (:class:`~temporality_service.auth.ApiAuth`, ``TEMPORALITY_API_MAX_FAILURES_PER_ADDRESS``
  within ``TEMPORALITY_API_FAILURE_WINDOW_S``) and human-interaction's inbox tokens (the same limiter: a wrong
  token of either kind counts). An address that reached the limit gets ``429 too_many_failures`` with
  ``Retry-After`` for any request presenting a token -- the right one too: otherwise the 429 would only tell a
  guesser which of its guesses were wrong, and the one that is not would still get in -- until its oldest
  failure leaves the window. Callers from other addresses are not affected, and neither is a request without
  a token (a console session, a vouched principal: signed, not guessable).
* The trigger-gateway's failed webhook authentications (``temporality_trigger_gateway.failures``): two limiters of
  its own (``TEMPORALITY_GATEWAY_WEBHOOK_MAX_FAILURES``), per client address and trigger, and per address for
  deliveries to unknown trigger ids; the same 429.
* The journal's password sign-in limits (:class:`temporality_journal.passwords.AttemptLimits`), kept in a NATS
  KV bucket every replica shares, take their counts with :func:`take`.

The address is the request's client (``request.client.host``): the TCP peer, or what a proxy named in
``TEMPORALITY_FORWARDED_ALLOW_IPS`` forwarded (:class:`~temporality_service.server.HttpServer`). Behind a proxy
not so named every client shares the proxy's address, so name it. IPv6 clients are counted per /64 (one host
usually holds a whole /64 and could otherwise take a fresh address for every guess). Each replica counts its
own failures (a limit of N with R replicas lets at most N x R guesses through per window): a 24-character
random token is out of reach of guessing anyway; the limit makes a scan loud and slow, and bounds what a short
legacy inbox token (8-23 characters, :mod:`temporality_human_interaction.directory`) is exposed to.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable

import structlog
from starlette.requests import HTTPConnection

from temporality_service.http import ApiError

__all__ = [
    "DEFAULT_FAILURE_WINDOW_S",
    "DEFAULT_MAX_FAILURES_PER_ADDRESS",
    "Exhausted",
    "FailureLimiter",
    "TooManyFailures",
    "address_key",
    "client_address",
    "recent",
    "take",
]

log = structlog.get_logger(__name__)

DEFAULT_MAX_FAILURES_PER_ADDRESS = 20
DEFAULT_FAILURE_WINDOW_S = 300.0
#: Addresses remembered at most, below the limit and blocked each (a few floats each): past it the oldest goes.
MAX_TRACKED_ADDRESSES = 10_000


class Exhausted(Exception):
    """A limit is reached: no attempt before ``retry_after_s`` seconds."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class TooManyFailures(ApiError):
    """429: this client address presented too many wrong tokens lately."""

    status = 429
    code = "too_many_failures"


def recent(times: list[float], now: float, window_s: float) -> list[float]:
    """The failure times still within the window ending ``now`` (a time far ahead -- another replica's clock --
    counts as now)."""
    return [t for t in times if now - window_s < t <= now + window_s]


def retry_after(times: list[float], now: float, window_s: float, limit: int) -> int | None:
    """Seconds until a key with these failure ``times`` is below ``limit`` again; None: it is below now."""
    kept = sorted(recent(times, now, window_s))
    if len(kept) < limit:
        return None
    return max(1, math.ceil(kept[len(kept) - limit] + window_s - now))


def take(times: list[float], now: float, window_s: float, limit: int) -> list[float]:
    """``times`` (within the window) with ``now`` added; :class:`Exhausted` when ``limit`` is already reached."""
    wait = retry_after(times, now, window_s, limit)
    if wait is not None:
        raise Exhausted(wait)
    return [*sorted(recent(times, now, window_s)), now]


def client_address(request: HTTPConnection) -> str | None:
    """The key a request's failures are counted under: its client address (an IPv6 one as its /64)."""
    if request.client is None:
        return None
    return address_key(request.client.host)


@functools.lru_cache(maxsize=4096)
def address_key(host: str) -> str:
    """:func:`client_address` of a client ``host``; remembered, as the trigger-gateway asks it of every webhook
    delivery (parsing an address costs more than the rest of the limit's check)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host  # a unix socket's or a test client's name
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class FailureLimiter:
    """Failures per client address within a sliding window, in this process (module docstring).

    :meth:`check` before a credential is compared, :meth:`failed` when it was wrong; both synchronous, so nothing
    runs between them in one event loop. ``event`` (``auth.failure_limit_reached``) is logged at ``info`` once
    per block, when the failure that reaches the limit is counted -- never per refused request (the webhook
    endpoint faces the internet); None: the caller logs its own.

    Keys below the limit and keys that reached it are kept apart, at most ``max_addresses`` of each, oldest
    (last failure) first: past it the oldest goes -- expired ones first, as they are the oldest -- in constant
    time, and a flood of new keys only ever pushes out other keys below the limit, never a blocked one."""

    def __init__(
        self,
        max_failures: int = DEFAULT_MAX_FAILURES_PER_ADDRESS,
        window_s: float = DEFAULT_FAILURE_WINDOW_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = MAX_TRACKED_ADDRESSES,
        event: str | None = "auth.failure_limit_reached",
    ) -> None:
        if max_failures < 1 or window_s <= 0:
            raise ValueError("a failure limit needs at least 1 failure and a window longer than 0 s")
        self.max_failures = max_failures
        self.window_s = window_s
        self.clock = clock
        self.max_addresses = max_addresses
        self.event = event
        #: Keys below the limit, and keys that reached it (blocked, or were until their oldest failure left the
        #: window), each oldest (last failure) first.
        self._failures: OrderedDict[str, list[float]] = OrderedDict()
        self._blocked: OrderedDict[str, list[float]] = OrderedDict()

    def check(self, address: str | None) -> None:
        """:class:`TooManyFailures` (with ``Retry-After``) when ``address`` reached the limit."""
        if address is None:
            return
        times = self._blocked.get(address)  # a key below the limit is not blocked
        if not times:
            return
        wait = retry_after(times, self.clock(), self.window_s, self.max_failures)
        if wait is not None:
            raise TooManyFailures(
                f"too many wrong tokens from this address; retry in {wait} s", headers={"Retry-After": str(wait)}
            )

    def failed(self, address: str | None) -> None:
        """Count a wrong credential presented from ``address``."""
        if address is None:
            return
        now = self.clock()
        times = self._blocked.pop(address, None)
        if times is None:
            times = self._failures.pop(address, [])
        times = recent(times, now, self.window_s)
        before = len(times)
        times.append(now)
        times = times[-self.max_failures :]
        tracked = self._blocked if len(times) >= self.max_failures else self._failures
        tracked[address] = times  # (re-)inserted last: oldest first
        while len(tracked) > self.max_addresses:
            tracked.popitem(last=False)
        if before < self.max_failures <= len(times) and self.event is not None:  # a block starts: said once
            wait = retry_after(times, now, self.window_s, self.max_failures)
            log.info(self.event, address=address, failures=self.max_failures, retry_after_s=wait)

    def failures(self, address: str) -> int:
        """How many failures of ``address`` are within the window now."""
        times = self._blocked.get(address) or self._failures.get(address, [])
        return len(recent(times, self.clock(), self.window_s))
