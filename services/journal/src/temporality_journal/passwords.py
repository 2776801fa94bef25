"""Sign-in with a directory account's password (issue 9): ``POST /auth/password``.

Optional: ``TEMPORALITY_JOURNAL_PASSWORD_SIGNIN=true`` (with ``TEMPORALITY_JOURNAL_SESSION_SECRET_FILE``). The
journal never sees a password hash: it asks human-interaction, which alone holds them (the directory's
``password_hash``, Argon2id), over NATS request/reply (``temporality.rpc.human.verify_password``, which only the
journal's NATS user may send). A yes comes with the person's display name and the directory profile's
``console_role``; the journal then issues the same signed session cookie as an OIDC sign-in
(:mod:`temporality_journal.signin`: same expiry, same sign-out and revocation, same inbox vouching), with that
role -- no role: the person's own inbox only.

``POST /auth/password`` takes JSON ``{"user": "<directory user id>", "password": "..."}`` and, like every
cookie call that changes something, the console header ``X-Temporality-Console: 1`` (403
``console_header_missing`` without: a page on another site cannot sign a browser in behind its back).

==========================================  ==========================================================
answer                                      when
==========================================  ==========================================================
200 ``{user, name, role, next}``            signed in (the cookie is set; ``next``: ``#/runs``, or
                                            ``#/inbox`` without a role)
401 ``sign_in_refused``                     an unknown user, a user without a password, a wrong
                                            password: one message for all (no user enumeration);
                                            human-interaction checks an unknown user's password
                                            against a dummy hash, so the time does not tell either
429 ``too_many_attempts`` + ``Retry-After`` ``TEMPORALITY_JOURNAL_PASSWORD_MAX_FAILURES`` failures for
                                            that user id (5), or ``..._MAX_FAILURES_PER_ADDRESS`` from
                                            that client address (20), within ``..._WINDOW_S`` (900 s):
                                            refused before anything is checked, until the oldest
                                            failure leaves the window; a success clears the user's
503 ``directory_unreachable``               human-interaction did not answer (or could not check):
                                            nobody is signed in; ``Retry-After``
422 ``invalid_body``                        not ``{user, password}`` strings (1-200, 1-1024 chars)
==========================================  ==========================================================

Each refused sign-in (401) is in the audit trail as ``api.access_refused`` (reason ``password_refused``, the
principal ``user:<id typed>``, the client address), rate-limited like every refusal
(:class:`~temporality_journal.access.AccessAudit`); logged ``signin.password_refused`` and
``signin.password_rate_limited``; never a password.

The limits are per replica (in memory, at most :data:`MAX_TRACKED` keys): N replicas allow N times the
attempts. The client address is the TCP peer's: behind a proxy every person shares the proxy's address, so set
``..._MAX_FAILURES_PER_ADDRESS`` with that in mind.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import nats.errors
import structlog
from pydantic import BaseModel, ConfigDict, Field

from temporality_bus import Bus
from temporality_protocol import ConsoleRoleQuery, ConsoleRoleReply, PasswordCheck, PasswordCheckReply
from temporality_protocol.catalog import RPC_HUMAN_CONSOLE_ROLE, RPC_HUMAN_VERIFY_PASSWORD
from temporality_service import ApiError, Unavailable

__all__ = [
    "CHECK_TIMEOUT_S",
    "MAX_TRACKED",
    "AttemptLimits",
    "PasswordChecker",
    "PasswordSignInBody",
    "PasswordSignedIn",
    "SignInRefused",
    "TooManyAttempts",
]

log = structlog.get_logger(__name__)

#: How long the journal waits for human-interaction's answer (Argon2 takes a fraction of a second).
CHECK_TIMEOUT_S = 10.0
#: The most keys (user ids and addresses) the limits track; the oldest are forgotten past it.
MAX_TRACKED = 10_000
REFUSED = "unknown user or wrong password"


class SignInRefused(ApiError):
    status = 401
    code = "sign_in_refused"


class TooManyAttempts(ApiError):
    status = 429
    code = "too_many_attempts"


class PasswordSignInBody(BaseModel):
    """``POST /auth/password``."""

    model_config = ConfigDict(extra="forbid")

    user: str = Field(min_length=1, max_length=200, description="Your directory user id")
    password: str = Field(
        min_length=1,
        max_length=1024,
        repr=False,
        description="Your console password",
        json_schema_extra={"format": "password", "writeOnly": True},
    )


class PasswordSignedIn(BaseModel):
    """``POST /auth/password``: signed in; the session cookie is set."""

    user: str
    name: str
    role: str | None = Field(description="viewer, operator or admin; null: only your inbox")
    next: str = Field(description="Where the console goes: #/runs, or #/inbox without a role")


@dataclass
class AttemptLimits:
    """Failed sign-ins per key (``user:<id>``, ``address:<ip>``) within a sliding window (module docstring)."""

    max_per_user: int
    max_per_address: int
    window_s: float
    clock: Callable[[], float] = time.monotonic
    _failures: dict[str, deque[float]] = field(default_factory=dict)

    def _recent(self, key: str, now: float) -> deque[float] | None:
        times = self._failures.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        return times

    def retry_after(self, user: str, address: str | None) -> int | None:
        """Seconds until ``user`` from ``address`` may try again; None: now."""
        now = self.clock()
        waits = []
        for key, limit in self._keys(user, address):
            times = self._recent(key, now)
            if times is not None and len(times) >= limit:
                waits.append(times[len(times) - limit] + self.window_s - now)
        return max(1, math.ceil(max(waits))) if waits else None

    def failed(self, user: str, address: str | None) -> None:
        now = self.clock()
        for key, limit in self._keys(user, address):
            times = self._recent(key, now) or self._failures.setdefault(key, deque())
            times.append(now)
            while len(times) > limit:
                times.popleft()
            self._failures[key] = self._failures.pop(key)  # the most recently failed last
        while len(self._failures) > MAX_TRACKED:
            del self._failures[next(iter(self._failures))]

    def succeeded(self, user: str) -> None:
        self._failures.pop(f"user:{user.casefold()}", None)

    def _keys(self, user: str, address: str | None) -> list[tuple[str, int]]:
        keys = [(f"user:{user.casefold()}", self.max_per_user)]
        if address is not None:
            keys.append((f"address:{address}", self.max_per_address))
        return keys


class PasswordChecker:
    """Asks human-interaction whether a password signs a user in (``temporality.rpc.human.verify_password``), and
    a user's console role (``temporality.rpc.human.console_role``, for an OIDC sign-in: :mod:`.signin`)."""

    def __init__(self, bus: Bus, timeout_s: float = CHECK_TIMEOUT_S) -> None:
        self.bus = bus
        self.timeout_s = timeout_s

    async def check(self, user: str, password: str) -> PasswordCheckReply:
        """Its reply (``ok`` or refused); :class:`Unavailable` when it does not answer or cannot check."""
        request = PasswordCheck(user_id=user, password=password).model_dump_json().encode()
        try:
            raw = await self.bus.request(RPC_HUMAN_VERIFY_PASSWORD, request, self.timeout_s)
            reply = PasswordCheckReply.model_validate_json(raw)
        except (nats.errors.Error, TimeoutError, OSError, ValueError) as exc:
            log.warning("signin.directory_unreachable", error=type(exc).__name__)
            raise self._unavailable(f"it did not answer: {type(exc).__name__}") from None
        if reply.error is not None:
            log.warning("signin.directory_check_failed", error=reply.error[:200])
            raise self._unavailable(reply.error[:200])
        return reply

    async def console_role(self, user: str) -> str | None:
        """The directory profile's ``console_role`` (None: no such user, or none); raises on no answer."""
        request = ConsoleRoleQuery(user_id=user).model_dump_json().encode()
        try:
            raw = await self.bus.request(RPC_HUMAN_CONSOLE_ROLE, request, self.timeout_s)
            reply = ConsoleRoleReply.model_validate_json(raw)
        except (nats.errors.Error, TimeoutError, OSError, ValueError) as exc:
            raise self._unavailable(f"it did not answer: {type(exc).__name__}") from None
        if reply.error is not None:
            raise self._unavailable(reply.error[:200])
        return reply.role

    @staticmethod
    def _unavailable(why: str) -> Unavailable:
        return Unavailable(
            "human-interaction, which checks directory passwords, could not check yours "
            f"({why}); nobody was signed in: retry in a moment, or tell the operators if it persists",
            code="directory_unreachable",
            retry_after_s=5,
        )
