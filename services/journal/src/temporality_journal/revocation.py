"""Signing out ends the session on the server too: every replica refuses a copy of the signed-out cookie.

The sign-in session is a signed cookie (:mod:`temporality_journal.signin`); on its own, clearing it at sign-out
ends it only in the browser that signed out, and a copy taken before would stay valid until its absolute
expiry. So each sign-in gets a random session id (``sid``, 192 bits, in the signed cookie), and
``POST /auth/logout`` (and a new sign-in in a browser that was signed in already) records that id in the
journal's database (table ``revoked_sessions``, migration ``0005_revoked``) *before* it answers. :class:`RevocationCheck`, an ASGI middleware just inside Starlette's
session middleware, looks the id of every request that carries a signed-in session up in that table -- one
primary-key read, no cache, so a sign-out counts on every replica sharing the database from the moment
the logout is answered -- and, when it was revoked, empties the session: the request goes on as an anonymous
one (a 401 ``session_ended`` from the API, "your session ended; sign in again"; the auth routes as for nobody)
and the answer clears the cookie.

A request without a session cookie (API tokens, health checks, the provider's redirects) costs nothing.
A database that cannot be read refuses the cookie's request with a 503 ``session_check_failed`` (it never
admits a session it could not check); a sign-out that cannot be recorded is a 503 ``sign_out_unrecorded``
and leaves the session as it was, so the person can retry.

A row is kept until the session would have expired anyway; each sign-out deletes the rows past that point
(indexed by ``expires_at``), so the table holds at most the sessions signed out in the last
``TEMPORALITY_JOURNAL_SESSION_MAX_AGE_S``. Cookies from before this revision carry no id: they admit nothing
(the person signs in once more). The table is no part of the read model: ``temporality-journal rebuild``
keeps it (:data:`temporality_journal.database.KEPT_BY_REBUILD`).

Logged: ``signin.revoked_session_refused`` (the user id) when a revoked session comes back, and
``signin.session_check_failed`` (the error's class) when the database fails the check; never the id.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import structlog
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from temporality_journal.database import Database
from temporality_journal.models import REVOKED_SESSIONS_TABLE

__all__ = ["PERSON_KEY", "RevocationCheck", "Revocations", "mark_ended", "session_ended", "session_id_of"]

log = structlog.get_logger(__name__)

#: The session key of the signed-in person (a dict with ``sid``, the session id).
PERSON_KEY = "person"
#: The ASGI scope key :func:`mark_ended` sets.
_ENDED = "temporality.session_ended"
_TABLE = REVOKED_SESSIONS_TABLE


def session_id_of(session: Any) -> str | None:
    """The session id of a signed-in person's session (the ``session`` of an ASGI scope), else None."""
    person = session.get(PERSON_KEY) if isinstance(session, dict) else None
    sid = person.get("sid") if isinstance(person, dict) else None
    return sid if isinstance(sid, str) and sid else None


class Revocations:
    """The ``revoked_sessions`` table: record a sign-out, ask whether a session was signed out."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._insert = postgresql_insert if database.dialect == "postgresql" else sqlite_insert

    async def revoke(self, session_id: str, expires_at: float) -> None:
        """Record ``session_id`` as signed out (idempotent) until ``expires_at`` (epoch seconds), and delete the
        records of sessions that have expired since (they admit nothing anyway)."""
        now = datetime.now(UTC)
        expires = datetime.fromtimestamp(expires_at, UTC)
        async with self.database.engine.begin() as conn:
            await conn.execute(
                self._insert(_TABLE)
                .values(session_id=session_id, expires_at=expires, revoked_at=now)
                .on_conflict_do_nothing(index_elements=["session_id"])
            )
            await conn.execute(delete(_TABLE).where(_TABLE.c.expires_at < now))

    async def revoked(self, session_id: str) -> bool:
        """Whether ``session_id`` was signed out (one primary-key read)."""
        async with self.database.engine.connect() as conn:
            row = (await conn.execute(select(_TABLE.c.session_id).where(_TABLE.c.session_id == session_id))).first()
        return row is not None


class RevocationCheck:
    """ASGI middleware (inside the session middleware): a signed-out session admits nothing (module docstring)."""

    def __init__(self, app: ASGIApp, revocations: Revocations) -> None:
        self.app = app
        self.revocations = revocations

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session = scope.get("session") if scope["type"] == "http" else None
        session_id = session_id_of(session)
        if session_id is not None:
            try:
                revoked = await self.revocations.revoked(session_id)
            except Exception as exc:  # never admit a session that could not be checked
                log.warning("signin.session_check_failed", error=type(exc).__name__)
                refusal = JSONResponse(
                    {
                        "error": "session_check_failed",
                        "detail": "the journal could not check your sign-in session (its database did not "
                        "answer); retry in a moment",
                    },
                    status_code=503,
                    headers={"Retry-After": "5"},
                )
                await refusal(scope, receive, send)
                return
            if revoked:
                person = session[PERSON_KEY]  # type: ignore[index]  # session_id_of found it a dict
                log.info("signin.revoked_session_refused", user_id=str(person.get("id"))[:200])
                session.clear()  # type: ignore[union-attr]  # anonymous from here; the answer clears the cookie
                mark_ended(scope)
        await self.app(scope, receive, send)


def mark_ended(scope: Scope) -> None:
    """Note on the request that it came with a session that has just been ended (signed out elsewhere, or by a
    change in the directory): the API's 401 then says so (:func:`session_ended`)."""
    scope[_ENDED] = True


def session_ended(scope: Scope) -> bool:
    """Whether the request came with a session that was ended (:func:`mark_ended`)."""
    return bool(scope.get(_ENDED))
