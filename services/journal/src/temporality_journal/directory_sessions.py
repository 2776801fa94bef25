"""A change in the directory ends the console sessions it signed in (issue 9).

A password sign-in's session (:mod:`temporality_journal.passwords`) holds what the directory said at sign-in:
the person's console role and the directory's *fingerprint* of the account (a digest human-interaction makes of
the user id, the ``console_role`` and the password hash; never the hash). An OIDC sign-in whose role came from
the directory (``TEMPORALITY_JOURNAL_OIDC_DIRECTORY_ROLES``) holds that role. :class:`DirectoryCheck`, an ASGI
middleware inside the revocation check, asks human-interaction again (``temporality.rpc.human.console_role``,
whose reply carries the role and the fingerprint) for every request of such a session, and **ends the session**
when

* a password session's fingerprint differs: the role changed, the password was changed, set again or removed,
  or the user was removed from the directory (an unknown user has no fingerprint);
* a directory-role session's role differs (the user removed: no role).

Ending it is what a sign-out does: the session id is recorded as revoked (every replica refuses the cookie from
then on, even if the directory is changed back; :mod:`temporality_journal.revocation`) and the request goes on
as an anonymous one (the API answers 401; the console shows its sign-in). Logged
``signin.directory_changed_session_ended`` (the user id, what changed: ``role``, ``account``).

The answers are cached per user for ``TEMPORALITY_JOURNAL_SESSION_DIRECTORY_CHECK_S`` (2 s; 0: ask at every
request), so a change takes effect at the person's first request after that time at the latest, on every
replica; concurrent requests of one person share one question. Human-interaction not answering: the last
answer is used for up to :data:`STALE_S` (logged ``signin.directory_check_stale``); past that the request is a
503 ``directory_unreachable`` (a session is never admitted unchecked for long). Sessions from an OIDC sign-in
whose role came from the role map, and API tokens, are not the directory's and are not checked.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from temporality_journal.passwords import PasswordChecker
from temporality_journal.revocation import PERSON_KEY, Revocations, mark_ended
from temporality_service import Unavailable

__all__ = ["DIRECTORY_KEY", "STALE_S", "DirectoryCheck", "DirectoryEntry", "DirectorySessions", "directory_mark"]

log = structlog.get_logger(__name__)

#: The key, in the signed-in person's session data, of what the directory said at sign-in.
DIRECTORY_KEY = "dir"
#: How long the last answer stands in when human-interaction does not answer.
STALE_S = 60.0
#: The most people whose answers are cached (the least recently asked go first).
MAX_CACHED = 10_000


@dataclass(frozen=True)
class DirectoryEntry:
    """What the directory says of a user now: the console role and the account's fingerprint (None: no such
    user), and when it was asked (monotonic seconds)."""

    role: str | None
    fingerprint: str | None
    asked_at: float


def directory_mark(by: str, role: str | None, fingerprint: str | None) -> dict[str, Any]:
    """What a session signed in ``by`` ``password`` (or ``role``: an OIDC sign-in with a directory role) holds."""
    return {"by": by, "role": role, "fp": fingerprint}


class DirectorySessions:
    """The directory's answers about signed-in people, cached for ``ttl_s`` (module docstring)."""

    def __init__(
        self, checker: PasswordChecker, ttl_s: float, stale_s: float = STALE_S, clock: Callable[[], float] | None = None
    ) -> None:
        self.checker = checker
        self.ttl_s = ttl_s
        self.stale_s = stale_s
        self.clock = clock or time.monotonic
        self._cache: OrderedDict[str, DirectoryEntry] = OrderedDict()
        self._asking: dict[str, asyncio.Future[DirectoryEntry]] = {}

    def remember(self, user_id: str, role: str | None, fingerprint: str | None) -> None:
        """What a sign-in just learnt from the directory (no need to ask again at once)."""
        self._put(user_id, DirectoryEntry(role, fingerprint, self.clock()))

    def _put(self, user_id: str, entry: DirectoryEntry) -> None:
        self._cache[user_id] = entry
        self._cache.move_to_end(user_id)
        while len(self._cache) > MAX_CACHED:
            self._cache.popitem(last=False)

    async def entry(self, user_id: str) -> DirectoryEntry:
        """The directory's current answer for ``user_id`` (cached); :class:`Unavailable` when human-interaction
        does not answer and no answer younger than ``stale_s`` is known."""
        cached = self._cache.get(user_id)
        if cached is not None and self.clock() - cached.asked_at < self.ttl_s:
            return cached
        asking = self._asking.get(user_id)
        if asking is None:
            asking = asyncio.ensure_future(self._ask(user_id))
            self._asking[user_id] = asking
            asking.add_done_callback(lambda _: self._asking.pop(user_id, None))
        try:
            return await asyncio.shield(asking)
        except Unavailable:
            if cached is not None and self.clock() - cached.asked_at < self.stale_s:
                log.warning("signin.directory_check_stale", user_id=user_id[:200])
                return cached
            raise

    async def _ask(self, user_id: str) -> DirectoryEntry:
        reply = await self.checker.directory_entry(user_id)
        entry = DirectoryEntry(reply.role, reply.fingerprint, self.clock())
        self._put(user_id, entry)
        return entry


def changed(mark: dict[str, Any], entry: DirectoryEntry) -> str | None:
    """What changed since the session was signed in (``role``, ``account``), or None."""
    # (a role without a fingerprint: a human-interaction from before fingerprints, during an upgrade -- the role
    # is all it can tell)
    unfingerprinted = entry.fingerprint is None and entry.role is not None
    if mark.get("by") == "password" and mark.get("fp") is not None and not unfingerprinted:
        if mark.get("fp") != entry.fingerprint:
            return "account" if entry.role == mark.get("role") else "role"
    if mark.get("role") != entry.role:
        return "role"
    return None


class DirectoryCheck:
    """ASGI middleware (inside the revocation check): a session the directory no longer backs ends (module
    docstring)."""

    def __init__(self, app: ASGIApp, sessions: DirectorySessions, revocations: Revocations) -> None:
        self.app = app
        self.sessions = sessions
        self.revocations = revocations

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session = scope.get("session") if scope["type"] == "http" else None
        person = session.get(PERSON_KEY) if isinstance(session, dict) else None
        mark = person.get(DIRECTORY_KEY) if isinstance(person, dict) else None
        if isinstance(mark, dict) and isinstance(person, dict) and isinstance(session, dict):
            user_id = str(person.get("id"))
            try:
                entry = await self.sessions.entry(user_id)
            except Unavailable:
                refusal = JSONResponse(
                    {
                        "error": "directory_unreachable",
                        "detail": "the journal could not check your sign-in with the user directory "
                        "(human-interaction did not answer); retry in a moment",
                    },
                    status_code=503,
                    headers={"Retry-After": "5"},
                )
                await refusal(scope, receive, send)
                return
            what = changed(mark, entry)
            if what is not None:
                await self._end(person, user_id, what)
                session.clear()  # anonymous from here; the answer clears the cookie
                mark_ended(scope)  # the API's 401 says the session ended, not that nobody signed in
        await self.app(scope, receive, send)

    async def _end(self, person: dict[str, Any], user_id: str, what: str) -> None:
        sid, expires = person.get("sid"), person.get("exp")
        if isinstance(sid, str) and isinstance(expires, int | float):
            try:  # recorded, so the cookie stays refused even if the directory is changed back
                await self.revocations.revoke(sid, float(expires))
            except Exception as exc:  # this request is anonymous anyway, and the next is checked again
                log.warning("signin.sign_out_unrecorded", user_id=user_id[:200], error=type(exc).__name__)
        log.info("signin.directory_changed_session_ended", user_id=user_id[:200], changed=what)
