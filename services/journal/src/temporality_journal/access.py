"""The journal's token check with the console's sign-in beside it: :class:`SessionAuth`.

It wraps the journal's :class:`~temporality_service.ApiAuth` (the ``AsViewer`` / ``AsOperator`` dependencies call
it): a request without ``Authorization`` may be admitted by its sign-in session instead
(:mod:`temporality_journal.signin`: the person's role, the console header on a call that changes something).

Its refusals go into the audit trail as every service's do (``api.access_refused``, rate-limited, never the token):
:class:`temporality_service.audit.AccessAudit`, through :meth:`temporality_service.ApiAuth.admit`; a person's
refusal names them (``user:<id>``, :class:`~temporality_service.RoleForbidden`).

A request with neither ``Authorization`` nor a live session is a 401 ``unauthorized`` ("not signed in: sign in to
the console, or send Authorization: Bearer <API token>"); one whose session *ended* -- signed out on another tab
or device (a copy of the cookie), ended by a change in the directory, or past its expiry -- is a 401
``session_ended`` ("your session ended ...; sign in again"), so the console can say what to do.
"""

from __future__ import annotations

from fastapi import Request

from temporality_journal.signin import SignIn
from temporality_service import ApiAuth, Principal, Role, RoleForbidden
from temporality_service.http import Forbidden, Unauthorized

__all__ = ["NOT_SIGNED_IN", "SESSION_ENDED", "SessionAuth"]

#: The 401s' details when sign-in is configured: no credential at all, and a session that ended.
NOT_SIGNED_IN = "not signed in: sign in to the console, or send Authorization: Bearer <API token>"
SESSION_ENDED = "your session ended (signed out, expired, or changed in the directory); sign in again"


class SessionAuth(ApiAuth):
    """The journal's token check; with ``signin``, a request without ``Authorization`` may be admitted by its
    sign-in session instead."""

    def __init__(self, inner: ApiAuth, signin: SignIn | None = None) -> None:
        self._inner = inner  # no super().__init__: it delegates
        self._signin = signin
        self.principals = None  # the journal signs vouched principals for the others; it admits none itself

    def authorize_request(self, request: Request, authorization: str | None, role: Role) -> Principal:
        person = self._signin.person(request) if self._signin is not None and authorization is None else None
        if person is None:
            if self._signin is not None and authorization is None:
                raise self.unauthenticated(request)
            return self.authorize(authorization, role)
        principal = person.principal()
        try:
            SignIn.check_csrf(request)
        except Forbidden as exc:
            raise RoleForbidden(exc.detail, principal=person.principal_name, code=exc.code) from None
        if principal is None or not principal.may(role):
            has = "no role (only your inbox)" if principal is None else f"the {principal.role} role"
            raise RoleForbidden(
                f"this needs the {role} role; you ({person.user_id}) have {has}", principal=person.principal_name
            )
        return principal

    def unauthenticated(self, request: Request) -> Unauthorized:
        """The 401 of a request with neither a token nor a live session (sign-in configured): one whose session
        ended says so -- the person signs in again -- apart from one that never had any."""
        assert self._signin is not None
        if self._signin.ended(request):
            return Unauthorized(SESSION_ENDED, code="session_ended")
        return Unauthorized(NOT_SIGNED_IN)

    @property
    def configured(self) -> bool:
        return self._inner.configured

    def authenticate(self, authorization: str | None) -> Principal:
        return self._inner.authenticate(authorization)

    def authorize(self, authorization: str | None, role: Role) -> Principal:
        return self._inner.authorize(authorization, role)
