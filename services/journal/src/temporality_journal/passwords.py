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
503 ``attempt_limits_unavailable``          the shared attempt limits could not be read (NATS)
422 ``invalid_body``                        not ``{user, password}`` strings (1-200, 1-1024 chars)
==========================================  ==========================================================

Each refused sign-in (401) is in the audit trail as ``api.access_refused`` (reason ``password_refused``, the
principal ``user:<id typed>``, the client address), rate-limited like every refusal
(:class:`~temporality_journal.access.AccessAudit`); logged ``signin.password_refused`` and
``signin.password_rate_limited``; never a password.

The limits are shared by every replica: the failures are kept in the NATS KV bucket ``journal-signin-failures``
(the journal owns it; TTL one day, the longest window), one key per user id (case-folded) and one per address,
each named by a SHA-256 digest (no user id or address in clear), each holding the times of its failures within
the window; a failure is added with compare-and-set, so two replicas counting at once lose neither. Two
attempts checked at the same moment on two replicas may both pass the check before either failure is counted:
the limit may be overshot by the number of attempts in flight, never more. The bucket unreadable: 503
``attempt_limits_unavailable`` (nobody is checked without the limits); a failure that cannot be recorded is
logged ``signin.attempt_unrecorded``. The times are wall-clock (every replica's clock in the same NTP time).
The client address is the TCP peer's: behind a proxy every person shares the proxy's address, so set
``..._MAX_FAILURES_PER_ADDRESS`` with that in mind.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Callable

import nats.errors
import structlog
from pydantic import BaseModel, ConfigDict, Field

from temporality_bus import Bus, Store, TransientError
from temporality_protocol import ConsoleRoleQuery, ConsoleRoleReply, PasswordCheck, PasswordCheckReply
from temporality_protocol.catalog import BUCKET_SIGNIN_FAILURES, RPC_HUMAN_CONSOLE_ROLE, RPC_HUMAN_VERIFY_PASSWORD
from temporality_service import ApiError, Unavailable

__all__ = [
    "CHECK_TIMEOUT_S",
    "AttemptLimits",
    "Failures",
    "PasswordChecker",
    "PasswordSignInBody",
    "PasswordSignedIn",
    "SignInRefused",
    "TooManyAttempts",
    "limit_key",
]

log = structlog.get_logger(__name__)

#: How long the journal waits for human-interaction's answer (Argon2 takes a fraction of a second).
CHECK_TIMEOUT_S = 10.0
#: What a NATS KV read or write that failed raises.
_BUS_ERRORS = (nats.errors.Error, TransientError, TimeoutError, OSError)
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


class Failures(BaseModel):
    """One key of the ``journal-signin-failures`` bucket: the times (epoch seconds) of its recent failures."""

    times: list[float] = Field(default_factory=list)


def limit_key(kind: str, value: str) -> str:
    """The bucket key of a user id (case-folded) or an address: a digest, so any characters fit and no user id
    or address is stored in clear."""
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:40]
    return f"{kind}.{digest}"


def _recent(times: list[float], now: float, window_s: float) -> list[float]:
    return [t for t in times if now - window_s < t <= now + window_s]  # a clock far ahead counts as now


class AttemptLimits:
    """Failed sign-ins per user id and per client address within a sliding window, in the NATS KV bucket
    ``journal-signin-failures`` that every replica shares (module docstring)."""

    def __init__(
        self,
        bus: Bus,
        max_per_user: int,
        max_per_address: int,
        window_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.max_per_user = max_per_user
        self.max_per_address = max_per_address
        self.window_s = window_s
        self.clock = clock
        self._store: Store[Failures] | None = None

    async def _failures(self) -> Store[Failures]:
        if self._store is None:
            self._store = await self.bus.store(BUCKET_SIGNIN_FAILURES, Failures)
        return self._store

    def _keys(self, user: str, address: str | None) -> list[tuple[str, int]]:
        keys = [(limit_key("user", user.casefold()), self.max_per_user)]
        if address is not None:
            keys.append((limit_key("address", address), self.max_per_address))
        return keys

    async def retry_after(self, user: str, address: str | None) -> int | None:
        """Seconds until ``user`` from ``address`` may try again; None: now. :class:`Unavailable` when the
        bucket cannot be read (nobody is checked then: the limits are never skipped)."""
        try:
            store = await self._failures()
            found = await asyncio.gather(*(store.get(key) for key, _ in self._keys(user, address)))
        except _BUS_ERRORS as exc:
            log.warning("signin.attempt_limits_unavailable", error=type(exc).__name__)
            raise Unavailable(
                "the journal could not read its sign-in attempt limits (NATS did not answer); nobody was "
                "signed in: retry in a moment",
                code="attempt_limits_unavailable",
                retry_after_s=5,
            ) from None
        now = self.clock()
        waits = []
        for (_, limit), versioned in zip(self._keys(user, address), found, strict=True):
            times = sorted(_recent(versioned.value.times, now, self.window_s)) if versioned is not None else []
            if len(times) >= limit:
                waits.append(times[len(times) - limit] + self.window_s - now)
        return max(1, math.ceil(max(waits))) if waits else None

    async def failed(self, user: str, address: str | None) -> None:
        """Count a failure for ``user`` and ``address`` (compare-and-set: no replica's failure is lost); logged
        and dropped when the bucket cannot be written."""
        now = self.clock()
        try:
            store = await self._failures()
            for key, limit in self._keys(user, address):

                def add(current: Failures, limit: int = limit) -> Failures:
                    times = sorted([*_recent(current.times, now, self.window_s), now])
                    return Failures(times=times[-limit:])

                await store.modify(key, add, create=Failures, validated=True)
        except _BUS_ERRORS as exc:
            log.warning("signin.attempt_unrecorded", error=type(exc).__name__)

    async def succeeded(self, user: str) -> None:
        """A success clears the user's failures (not the address's)."""
        try:
            await (await self._failures()).purge(limit_key("user", user.casefold()))
        except _BUS_ERRORS as exc:
            log.warning("signin.attempts_not_cleared", error=type(exc).__name__)


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
        return (await self.directory_entry(user)).role

    async def directory_entry(self, user: str) -> ConsoleRoleReply:
        """The directory's role and account fingerprint of ``user``; :class:`Unavailable` on no answer."""
        request = ConsoleRoleQuery(user_id=user).model_dump_json().encode()
        try:
            raw = await self.bus.request(RPC_HUMAN_CONSOLE_ROLE, request, self.timeout_s)
            reply = ConsoleRoleReply.model_validate_json(raw)
        except (nats.errors.Error, TimeoutError, OSError, ValueError) as exc:
            raise self._unavailable(f"it did not answer: {type(exc).__name__}") from None
        if reply.error is not None:
            raise self._unavailable(reply.error[:200])
        return reply

    @staticmethod
    def _unavailable(why: str) -> Unavailable:
        return Unavailable(
            "human-interaction, which checks directory passwords, could not check yours "
            f"({why}); nobody was signed in: retry in a moment, or tell the operators if it persists",
            code="directory_unreachable",
            retry_after_s=5,
        )
