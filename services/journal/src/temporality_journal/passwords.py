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
                                            that user id from that client address (5), or ten times
                                            as many for that user id from any addresses (50), or
                                            ``..._MAX_FAILURES_PER_ADDRESS`` from that client address
                                            (20), within ``..._WINDOW_S`` (900 s): refused before
                                            anything is checked, until the oldest failure leaves the
                                            window; a success clears the user's at that address
503 ``directory_unreachable``               human-interaction did not answer (or could not check):
                                            nobody is signed in; ``Retry-After``
503 ``attempt_limits_unavailable``          the shared attempt limits could not be read (NATS)
422 ``invalid_body``                        not ``{user, password}`` strings (1-200, 1-1024 chars)
==========================================  ==========================================================

Each refused sign-in (401) is in the audit trail as ``api.access_refused`` (reason ``password_refused``, the
client address), rate-limited like every refusal (:class:`~temporality_service.AccessAudit`); logged
``signin.password_refused`` and ``signin.password_rate_limited``; never a password. Who it names
(``principal``, the log lines' ``user``) is what was typed only when that names a user of the directory (a wrong
password for a real user: ``user:<id>``; the journal asks human-interaction, ``temporality.rpc.human.console_role``,
after the refusal). Anything else -- people type their password into the user id field -- is never recorded:
it is ``unknown-user:<digest>``, the first 12 hex digits of an HMAC-SHA256 of the typed text keyed with a key
derived from the session secret (every replica the same), so repeated probes of one string group together
without revealing it (:meth:`temporality_journal.signin.SignIn.typed_user`). Human-interaction not answering
that question: ``unknown-user:<digest>`` too.

Why three limits: wrong passwords for ``alice`` typed by someone somewhere must not lock alice out everywhere (the
hard block is per user id *and* address: from her own address she still signs in), yet guesses spread over many
addresses stay bounded (the user id's limit across addresses, ten times the first: 50 guesses per 15 minutes
with the defaults -- reached, alice waits too, as anyone would rather than have her password guessed), and one
address trying many user ids is stopped by the address's limit.

The limits are shared by every replica: the failures are kept in the NATS KV bucket ``journal-signin-failures``
(the journal owns it; TTL one day, the longest window), one key per user id (case-folded), one per user id and
address, and one per address, each named by a keyed digest (no user id or address in clear), each holding the
times of its failures within the window (the window arithmetic is :mod:`temporality_service.limits`', which
also limits wrong API tokens). Every attempt is counted *before* its password is checked, with a compare-and-set that refuses a
full key, so attempts at the same moment on any number of replicas never pass the limit: exactly the limit's
number are checked, the rest are 429. A success takes its count back (and clears the user's); an attempt nothing
decided (human-interaction did not answer) is taken back too; a wrong password's stays: that is the failure. The bucket unreadable: 503
``attempt_limits_unavailable`` (nobody is checked without the limits); a failure that cannot be recorded is
logged ``signin.attempt_unrecorded``. The times are wall-clock (every replica's clock in the same NTP time).
The client address is the TCP peer's: behind a proxy every person shares the proxy's address, so set
``..._MAX_FAILURES_PER_ADDRESS`` with that in mind.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass

import nats.errors
import structlog
from pydantic import BaseModel, ConfigDict, Field

from temporality_bus import Bus, NotFound, Store, TransientError
from temporality_protocol import ConsoleRoleQuery, ConsoleRoleReply, PasswordCheck, PasswordCheckReply
from temporality_protocol.catalog import BUCKET_SIGNIN_FAILURES, RPC_HUMAN_CONSOLE_ROLE, RPC_HUMAN_VERIFY_PASSWORD
from temporality_service import ApiError, Unavailable
from temporality_service.limits import Exhausted, take

__all__ = [
    "CHECK_TIMEOUT_S",
    "Attempt",
    "AttemptLimits",
    "Exhausted",
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
#: The user id's limit across addresses is this many times its limit per address (``..._PASSWORD_MAX_FAILURES``).
ACROSS_ADDRESSES = 10
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


def limit_key(kind: str, value: str, secret: bytes) -> str:
    """The bucket key of a user id (case-folded) or an address: an HMAC-SHA256 digest keyed with ``secret`` (the
    same on every replica), so any characters fit and neither the text typed as a user id -- sometimes a password
    typed into the wrong field -- nor an address can be recovered from the bucket by trying guesses."""
    digest = hmac.new(secret, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:40]
    return f"{kind}.{digest}"


@dataclass(frozen=True)
class Attempt:
    """A sign-in attempt counted by :meth:`AttemptLimits.reserve`: ``at`` is the time it was counted under."""

    user: str
    address: str | None
    at: float


class AttemptLimits:
    """Failed sign-ins per user id and client address, per user id across addresses and per client address within
    a sliding window, in the NATS KV bucket ``journal-signin-failures`` that every replica shares (module
    docstring).

    ``max_per_user``: a user id's failures from one address (the hard block: someone else's guesses do not lock
    the person out of their own address); ``max_per_user_anywhere``: the user id's from every address together
    (default :data:`ACROSS_ADDRESSES` times ``max_per_user``); ``max_per_address``: an address's for any user ids.
    """

    def __init__(
        self,
        bus: Bus,
        max_per_user: int,
        max_per_address: int,
        window_s: float,
        clock: Callable[[], float] = time.time,
        *,
        key_secret: bytes,
        max_per_user_anywhere: int | None = None,
    ) -> None:
        self.bus = bus
        self.key_secret = key_secret
        self.max_per_user = max_per_user
        self.max_per_user_anywhere = max_per_user_anywhere or ACROSS_ADDRESSES * max_per_user
        self.max_per_address = max_per_address
        self.window_s = window_s
        self.clock = clock
        self._store: Store[Failures] | None = None

    async def _failures(self) -> Store[Failures]:
        if self._store is None:
            self._store = await self.bus.store(BUCKET_SIGNIN_FAILURES, Failures)
        return self._store

    def _user_at(self, user: str, address: str | None) -> str:
        # "\n" is in neither a user id (the body's string may hold one, but the pair is then still one of a kind)
        # nor an address; no address (no TCP peer known): one shared "-"
        return limit_key("user-at", f"{user.casefold()}\n{address or '-'}", self.key_secret)

    def _keys(self, user: str, address: str | None) -> list[tuple[str, int]]:
        keys = [
            (self._user_at(user, address), self.max_per_user),
            (limit_key("user", user.casefold(), self.key_secret), self.max_per_user_anywhere),
        ]
        if address is not None:
            keys.append((limit_key("address", address, self.key_secret), self.max_per_address))
        return keys

    async def reserve(self, user: str, address: str | None) -> Attempt:
        """Count this attempt against ``user``'s and ``address``'s limits *before* the password is checked:
        :class:`Exhausted` (with the seconds to wait) when either limit is reached, :class:`Unavailable` when the
        bucket cannot be read or written (nobody is checked then: the limits are never skipped).

        Each count is a compare-and-set that refuses a full key, so attempts on any number of replicas at once
        never pass the limit. The reservation *is* the failure: :meth:`succeeded` takes it back (and clears the
        user's failures at that address), :meth:`release` takes it back when nothing was decided; one never taken
        back (a wrong password, or the journal stopping meanwhile) stays counted."""
        now = self.clock()
        attempt = Attempt(user=user, address=address, at=now)
        try:
            store = await self._failures()
            taken: list[str] = []
            try:
                for key, limit in self._keys(user, address):
                    await store.modify(key, self._taking(now, limit), create=Failures, validated=True)
                    taken.append(key)
            except Exhausted:
                for key in taken:  # the other limit's count, taken back: this attempt was never made
                    with contextlib.suppress(NotFound):
                        await store.modify(key, self._giving_back(now))
                raise
        except _BUS_ERRORS as exc:
            log.warning("signin.attempt_limits_unavailable", error=type(exc).__name__)
            raise Unavailable(
                "the journal could not read its sign-in attempt limits (NATS did not answer); nobody was "
                "signed in: retry in a moment",
                code="attempt_limits_unavailable",
                retry_after_s=5,
            ) from None
        return attempt

    def _taking(self, now: float, limit: int) -> Callable[[Failures], Failures]:
        def taking(current: Failures) -> Failures:
            return Failures(times=take(current.times, now, self.window_s, limit))

        return taking

    @staticmethod
    def _giving_back(at: float) -> Callable[[Failures], Failures | None]:
        def give_back(current: Failures) -> Failures | None:
            if at not in current.times:
                return None  # already gone (out of the window, or cleared by a success)
            times = list(current.times)
            times.remove(at)
            return Failures(times=times)

        return give_back

    async def succeeded(self, attempt: Attempt) -> None:
        """A success clears the user's failures at that address and takes the attempt back from the user id's
        count across addresses and from the address's (the failures others made elsewhere stay counted: a guesser
        spread over many addresses is not let off by the person signing in meanwhile)."""
        try:
            store = await self._failures()
            keys = self._keys(attempt.user, attempt.address)
            await store.purge(keys[0][0])
            for key, _ in keys[1:]:
                with contextlib.suppress(NotFound):  # expired meanwhile: nothing to take back
                    await store.modify(key, self._giving_back(attempt.at))
        except _BUS_ERRORS as exc:
            log.warning("signin.attempts_not_cleared", error=type(exc).__name__)

    async def release(self, attempt: Attempt) -> None:
        """Take the attempt back from both counts: nothing was decided (human-interaction did not answer)."""
        try:
            store = await self._failures()
            for key, _ in self._keys(attempt.user, attempt.address):
                with contextlib.suppress(NotFound):
                    await store.modify(key, self._giving_back(attempt.at))
        except _BUS_ERRORS as exc:
            log.warning("signin.attempt_not_released", error=type(exc).__name__)


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

    async def directory_entry(self, user: str, timeout_s: float | None = None) -> ConsoleRoleReply:
        """The directory's role and account fingerprint of ``user`` (no fingerprint: no such user);
        :class:`Unavailable` on no answer within ``timeout_s`` (default :attr:`timeout_s`)."""
        request = ConsoleRoleQuery(user_id=user).model_dump_json().encode()
        try:
            raw = await self.bus.request(RPC_HUMAN_CONSOLE_ROLE, request, timeout_s or self.timeout_s)
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
