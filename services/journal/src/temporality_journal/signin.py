"""People sign in to the console with an OIDC provider (Keycloak, Entra ID, Google ...) or with their directory
account's password: issue 9.

Both optional: with ``TEMPORALITY_JOURNAL_OIDC_ISSUER`` unset and ``TEMPORALITY_JOURNAL_PASSWORD_SIGNIN`` off the
journal admits API tokens only, as before. The password sign-in (``POST /auth/password``) is
:mod:`temporality_journal.passwords`: human-interaction checks the password and names the directory profile's
``console_role``; the session it leaves is the one described here, the same as the provider's (without
``provider_logout``).

==========================  ========================================================================
``GET /auth/config``        no sign-in needed: ``{"oidc": {"provider", "login"} | null, "password":
                            {"login": "/auth/password"} | null}`` (the console shows "Sign in with
                            <provider>" and the directory account form for what is set)
``POST /auth/password``     ``{"user", "password"}``: a directory account's sign-in
                            (:mod:`temporality_journal.passwords`)
``GET /auth/login``         302 to the provider's authorization endpoint (code flow, PKCE S256, state,
                            nonce); ``?next=#/runs`` is where the console returns to (a ``#/`` hash only)
``GET /auth/callback``      the provider's redirect: code exchanged, ID token checked, session set, 302 to
                            the console; any failure is a 400 ``sign_in_failed`` (nothing is set)
``POST /auth/logout``       ends the session, on every replica (its id recorded as signed out) and in this
                            browser (cookie cleared); needs the console header, like every cookie call that
                            changes something; 200 ``{"provider_logout": URL or null}``: where the browser
                            goes to end the provider's session too
==========================  ========================================================================

Signing out at the provider (RP-initiated logout, OpenID Connect RP-Initiated Logout 1.0): when the provider's
discovery document has an ``end_session_endpoint``, ``provider_logout`` is that endpoint with ``id_token_hint``
(the ID token of the sign-in, kept in the session for this), ``post_logout_redirect_uri`` = ``<redirect base
URL>/console/`` (register it at the provider) and ``client_id``; the console navigates there, and the
provider sends the person back to the console signed out. Without the endpoint (or when discovery fails at
that moment: logged ``signin.provider_logout_unavailable``) it is null and only the journal's session ends.

The provider unreachable: at ``/auth/login`` (discovery) and at ``/auth/callback`` (the token exchange, the
keys) the answer is a 502 ``provider_unreachable`` naming the issuer and the failure, logged
``signin.provider_unreachable``; nothing is set.

The protocol is **Authlib**'s (its Starlette client): discovery from the issuer's
``/.well-known/openid-configuration``, the state and the PKCE verifier kept in the session until the callback,
the ID token's signature checked against the provider's JWKS and its ``iss``, ``aud``, ``exp`` and ``nonce``
validated by the library. Nothing here parses a JWT.

Who the person is: the ID token's ``TEMPORALITY_JOURNAL_OIDC_USER_CLAIM`` (``email`` by default) *is* their
directory user id (name directory users after it, e.g. ``alice@example.org``, or use ``preferred_username``
when the provider's usernames are the directory's ids). A token without that claim signs nobody in (400).

What the person may do -- one rule, least privilege: the values of ``TEMPORALITY_JOURNAL_OIDC_ROLES_CLAIM``
(``groups`` by default; a list or a single string) are looked up in ``TEMPORALITY_JOURNAL_OIDC_ROLE_MAP``
(JSON ``{"temporality-admins": "admin", "sre": "operator"}``) and the highest role found is theirs. No match
(or no claim): **no role** -- the person sees their own inbox and nothing else (every other API route is a 403).
With ``TEMPORALITY_JOURNAL_OIDC_DIRECTORY_ROLES=true``, a person the role map gives no role gets their directory
profile's ``console_role`` instead (asked of human-interaction, ``temporality.rpc.human.console_role``; it not
answering: no role, logged ``signin.directory_role_unavailable``). The role map, when it gives a role, always
wins -- even a lower one: the directory never raises what the provider's groups grant.
The role is decided at sign-in; a change at the provider applies at the next sign-in. A role that came from the
directory (here, or with a password) is checked again at the person's requests: a change of it in the directory
ends the session (:mod:`temporality_journal.directory_sessions`).

The session is Starlette's signed cookie (``temporality_session``: HttpOnly, SameSite=Lax, Secure unless the
redirect base URL is plain http or ``TEMPORALITY_JOURNAL_SESSION_COOKIE_SECURE=false``) signed with
``TEMPORALITY_JOURNAL_SESSION_SECRET_FILE`` (every replica the same key); it holds the person's id, display
name, role, a random session id and an absolute expiry ``TEMPORALITY_JOURNAL_SESSION_MAX_AGE_S`` after sign-in
(8 h), after which it admits nothing. Signing out records the session id as revoked in the journal's database
and clears this browser's cookie: a copy of the cookie taken before is refused from then on, by every replica
(:mod:`temporality_journal.revocation`: one primary-key read per request that carries a session). The journal's API admits it beside bearer tokens (a bearer, when sent, is what counts) --
with one more condition for a request that could change something (any method but GET/HEAD/OPTIONS): it must
carry ``X-Temporality-Console: 1`` (:data:`CSRF_HEADER`), which the console sends and which a page on another
site cannot send without a CORS preflight the journal never grants. Such a request without it is a 403
``console_header_missing``.

A signed-in person's inbox calls (``/human/...``) are forwarded with ``X-Temporality-Vouched-User``, a
short-lived assertion signed with ``TEMPORALITY_INBOX_VOUCH_SECRET_FILE`` (:mod:`temporality_service.vouch`),
which human-interaction checks: no inbox token needed.

Logged: ``signin.succeeded`` (user id, role), ``signin.refused`` (the reason's class and text) and
``signin.signed_out`` (with ``provider_logout``: whether the provider's end-session endpoint was offered);
never a token, code, secret or cookie.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import httpx2
import structlog
from fastapi import APIRouter, FastAPI, Query, Request
from pydantic import BaseModel, Field, ValidationError
from starlette.middleware.sessions import SessionMiddleware
from starlette.responses import RedirectResponse, Response

from temporality_bus import Bus
from temporality_journal.database import Database
from temporality_journal.directory_sessions import (
    DIRECTORY_KEY,
    DirectoryCheck,
    DirectorySessions,
    changed,
    directory_mark,
)
from temporality_journal.passwords import (
    REFUSED,
    AttemptLimits,
    Exhausted,
    PasswordChecker,
    PasswordSignedIn,
    PasswordSignInBody,
    SignInRefused,
    TooManyAttempts,
)
from temporality_journal.revocation import PERSON_KEY, RevocationCheck, Revocations, mark_ended, session_ended
from temporality_journal.settings import Settings
from temporality_service import (
    ApiError,
    ErrorBody,
    Forbidden,
    Principal,
    Role,
    Unavailable,
    Unprocessable,
    Voucher,
    client_address,
    parse_json,
    read_body,
)
from temporality_service.http import summarize_errors

if TYPE_CHECKING:
    from temporality_service import AccessAudit

__all__ = [
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "UNKNOWN_USER",
    "AuthConfig",
    "Person",
    "SignIn",
    "SignInConfigError",
    "SignedOut",
    "role_of",
]

log = structlog.get_logger(__name__)

#: The header the console sends with every call; a cookie-authenticated call that can change something needs it.
CSRF_HEADER = "X-Temporality-Console"
SESSION_COOKIE = "temporality_session"
MIN_SESSION_SECRET = 32
_SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))
_PERSON_KEY = PERSON_KEY
#: The session key of the sign-in's ID token: the ``id_token_hint`` of the provider logout.
_ID_TOKEN_KEY = "idt"
_CLIENT = "oidc"
#: How a typed user id that names nobody in the directory is recorded (with a keyed digest: SignIn.unknown_user).
UNKNOWN_USER = "unknown-user"
#: How long a refused sign-in waits for the directory to say whether the typed id is a user's.
_TYPED_USER_TIMEOUT_S = 2.0
#: Where the console may ask to return to after sign-in: one of its own hash routes, nothing else.
_NEXT_PATTERN = r"^#/[A-Za-z0-9/_.~:@!$&'()*+,;=?%-]{0,200}$"


class SignInConfigError(ValueError):
    """A secret file of the sign-in is missing, unreadable or too short (a configuration error, exit 2)."""


class SignInFailed(ApiError):
    status = 400
    code = "sign_in_failed"


class AuthConfig(BaseModel):
    """What the console needs to offer the sign-in (``GET /auth/config``)."""

    class Oidc(BaseModel):
        provider: str = Field(description="The provider's name, for the button")
        login: str = Field(description="Where the button goes")

    class Password(BaseModel):
        login: str = Field(description="Where the directory account's form posts {user, password} (JSON)")

    oidc: Oidc | None
    password: Password | None = Field(default=None, description="Set: people may sign in with a directory account")


class SignedOut(BaseModel):
    """``POST /auth/logout``: the journal's session has ended."""

    provider_logout: str | None = Field(
        description="Where the browser goes to sign out at the provider too (its end_session_endpoint with "
        "id_token_hint and post_logout_redirect_uri); null: the provider offers none, or nobody was signed in"
    )


class ProviderUnreachable(ApiError):
    status = 502
    code = "provider_unreachable"


class SignOutUnrecorded(ApiError):
    status = 503
    code = "sign_out_unrecorded"


@dataclass(frozen=True)
class Person:
    """A person signed in with the provider: their directory user id, display name, role (None: inbox only),
    the session's expiry and id (what a sign-out revokes)."""

    user_id: str
    name: str
    role: Role | None
    expires_at: float
    session_id: str

    @property
    def principal_name(self) -> str:
        """How the API's logs and audit events name them (``user:<id>``, as human-interaction does)."""
        return f"user:{self.user_id}"

    def principal(self) -> Principal | None:
        return None if self.role is None else Principal(name=self.principal_name, role=self.role)


def role_of(values: Any, role_map: dict[str, str]) -> Role | None:
    """The highest role ``role_map`` gives any of ``values`` (the roles claim: a list or one string); None."""
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, Iterable):
        return None
    roles = [Role[role_map[v]] for v in values if isinstance(v, str) and v in role_map]
    return max(roles) if roles else None


def _read_secret(path: Path, what: str, min_length: int = 1) -> str:
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SignInConfigError(f"{what}: {path}: cannot read: {exc.strerror or exc}") from exc
    if len(secret) < min_length:
        raise SignInConfigError(f"{what}: {path}: needs at least {min_length} characters")
    return secret


class SignIn:
    """OIDC sign-in and the session it leaves (module docstring); :meth:`install` it on the journal's app."""

    def __init__(
        self, settings: Settings, client_secret: str | None, session_secret: str, voucher: Voucher | None
    ) -> None:
        self.settings = settings
        self.voucher = voucher
        self._session_secret = session_secret
        #: The key of :meth:`typed_user`'s digests (derived: the session secret itself signs nothing else here).
        self._probe_key = hmac.new(session_secret.encode(), b"temporality-journal unknown-user v1", "sha256").digest()
        #: The sign-outs, set by :meth:`install` (the database is opened after the settings are read).
        self.revocations: Revocations | None = None
        #: The password check (human-interaction over the bus) and where refusals are audited: :meth:`install`.
        self.passwords: PasswordChecker | None = None
        self.audit: AccessAudit | None = None
        #: The directory's answers about the people it signed in (password, directory roles): :meth:`install`.
        self.directory: DirectorySessions | None = None
        #: The attempt limits of the password sign-in, shared by the replicas over the bus: :meth:`install`.
        self.limits: AttemptLimits | None = None
        self.oauth: Any = None
        self.secure = settings.session_cookie_secure if settings.session_cookie_secure is not None else True
        if settings.oidc_issuer is not None:
            assert client_secret is not None
            self._oidc(settings, client_secret)

    def _oidc(self, settings: Settings, client_secret: str) -> None:
        assert settings.oidc_redirect_base_url is not None
        issuer = str(settings.oidc_issuer).rstrip("/")
        self.redirect_uri = str(settings.oidc_redirect_base_url).rstrip("/") + "/auth/callback"
        #: Where the provider sends the person after signing them out (register it at the provider).
        self.post_logout_redirect_uri = str(settings.oidc_redirect_base_url).rstrip("/") + "/console/"
        secure = settings.session_cookie_secure
        self.secure = secure if secure is not None else str(settings.oidc_redirect_base_url).startswith("https:")
        # authlib (and joserfc, cryptography) only when sign-in is configured: a tenth of the journal's start-up
        from authlib.integrations.starlette_client import OAuth

        self.oauth = OAuth()
        self.oauth.register(
            _CLIENT,
            client_id=settings.oidc_client_id,
            client_secret=client_secret,
            server_metadata_url=f"{issuer}/.well-known/openid-configuration",
            client_kwargs={"scope": settings.oidc_scopes, "code_challenge_method": "S256", "timeout": 10.0},
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> SignIn | None:
        """None without ``TEMPORALITY_JOURNAL_OIDC_ISSUER`` and ``TEMPORALITY_JOURNAL_PASSWORD_SIGNIN``; raises
        :class:`SignInConfigError` on a bad file."""
        if settings.oidc_issuer is None and not settings.password_signin:
            return None
        assert settings.session_secret_file is not None  # Settings checks the set is complete
        client_secret = None
        if settings.oidc_issuer is not None:
            assert settings.oidc_client_secret_file is not None
            client_secret = _read_secret(
                settings.oidc_client_secret_file, "TEMPORALITY_JOURNAL_OIDC_CLIENT_SECRET_FILE"
            )
        session_secret = _read_secret(
            settings.session_secret_file, "TEMPORALITY_JOURNAL_SESSION_SECRET_FILE", MIN_SESSION_SECRET
        )
        voucher = None
        if settings.inbox_vouch_secret_file is not None:
            try:
                voucher = Voucher.from_file(settings.inbox_vouch_secret_file)
            except ValueError as exc:
                raise SignInConfigError(f"TEMPORALITY_INBOX_VOUCH_SECRET_FILE: {exc}") from exc
        return cls(settings, client_secret, session_secret, voucher)

    # ------------------------------------------------------------------ the session
    def session_check(self, request: Request) -> Callable[[], Awaitable[bool]] | None:
        """For a long request admitted by its sign-in session (the live tail), a check to run again while it lasts:
        whether the session still holds -- not past its expiry, not signed out (on any replica), and still backed
        by the directory (the checks every other request passes through its middleware). None when the request
        was not admitted by a session (an API token: nothing here ends it)."""
        if request.headers.get("authorization") is not None:
            return None
        person = self.person(request)
        if person is None:
            return None
        data = request.session.get(_PERSON_KEY)
        mark = data.get(DIRECTORY_KEY) if isinstance(data, dict) else None

        async def holds() -> bool:
            if time.time() >= person.expires_at:
                log.info("signin.stream_session_expired", user_id=person.user_id[:200])
                return False
            try:
                assert self.revocations is not None  # install() set it
                if await self.revocations.revoked(person.session_id):
                    log.info("signin.stream_session_signed_out", user_id=person.user_id[:200])
                    return False
                if self.directory is not None and isinstance(mark, dict):
                    what = changed(mark, await self.directory.entry(person.user_id))
                    if what is not None:
                        log.info("signin.stream_session_directory_changed", user_id=person.user_id[:200], changed=what)
                        return False
            except Exception as exc:  # never keep serving a session that could not be checked
                log.warning("signin.stream_session_check_failed", error=type(exc).__name__)
                return False
            return True

        return holds

    async def _end(self, person: Person, what: str) -> None:
        """Record ``person``'s session as ended (every replica refuses it from now); 503 when it cannot be."""
        assert self.revocations is not None  # install() set it
        try:
            await self.revocations.revoke(person.session_id, person.expires_at)
        except Exception as exc:
            log.warning("signin.sign_out_unrecorded", user_id=person.user_id, error=type(exc).__name__)
            raise SignOutUnrecorded(
                f"{what} (the journal's database did not answer); you are still signed in as before: retry in a moment"
            ) from None

    def person(self, request: Request) -> Person | None:
        """The person the request's session cookie signs in, while it has not expired; else None. (A signed-out
        session never gets here: :class:`~temporality_journal.revocation.RevocationCheck` empties it first.)"""
        if "session" not in request.scope:
            return None
        data = request.session.get(_PERSON_KEY)
        if not isinstance(data, dict):
            return None
        try:
            expires_at = float(data["exp"])
            role = data.get("role")
            person = Person(
                user_id=str(data["id"]),
                name=str(data.get("name") or data["id"]),
                role=Role[role] if isinstance(role, str) else None,
                expires_at=expires_at,
                session_id=str(data["sid"]),  # a cookie from before session ids admits nothing: sign in again
            )
        except (KeyError, TypeError, ValueError):
            return None
        return person if time.time() < person.expires_at else None

    def ended(self, request: Request) -> bool:
        """Whether the request came with a session that has ended: signed out (on another tab or device), ended by
        a change in the directory (both noted by their middleware), or past its expiry -- whose data this clears,
        so the answer drops the cookie and the next request is one without a session."""
        if session_ended(request.scope):
            return True
        if "session" not in request.scope or not isinstance(request.session.get(_PERSON_KEY), dict):
            return False
        if self.person(request) is not None:
            return False
        request.session.clear()
        mark_ended(request.scope)  # asked again for the same request: still ended
        return True

    @staticmethod
    def check_csrf(request: Request, what: str = "a signed-in call that changes something") -> None:
        """A cookie-authenticated request that can change something must carry :data:`CSRF_HEADER`; ``what``
        names the call in the 403."""
        if request.method not in _SAFE_METHODS and request.headers.get(CSRF_HEADER) != "1":
            raise Forbidden(
                f"{what} needs the header {CSRF_HEADER}: 1 (the console sends it)", code="console_header_missing"
            )

    def install(
        self, app: FastAPI, database: Database, bus: Bus | None = None, audit: AccessAudit | None = None
    ) -> None:
        """The session middleware, the revocation check inside it (sign-outs recorded in ``database``) and the
        ``/auth/...`` routes; passwords are checked over ``bus``, refused ones go to ``audit``."""
        self.revocations = Revocations(database)
        if self.settings.password_signin or self.settings.oidc_directory_roles:
            assert bus is not None, "password sign-in and directory roles ask human-interaction over the bus"
            self.passwords = PasswordChecker(bus)
            self.limits = AttemptLimits(
                bus,
                self.settings.password_max_failures,
                self.settings.password_max_failures_per_address,
                self.settings.password_window_s,
                key_secret=hmac.new(
                    self._session_secret.encode(), b"temporality-journal signin-limits v1", "sha256"
                ).digest(),
            )
        self.audit = audit
        if self.passwords is not None:  # a change in the directory ends the sessions it signed in
            self.directory = DirectorySessions(self.passwords, self.settings.session_directory_check_s)
            app.add_middleware(DirectoryCheck, sessions=self.directory, revocations=self.revocations)  # innermost
        app.add_middleware(RevocationCheck, revocations=self.revocations)  # added first: runs inside the session's
        app.add_middleware(
            SessionMiddleware,
            secret_key=self._session_secret,
            session_cookie=SESSION_COOKIE,
            max_age=self.settings.session_max_age_s,
            path="/",
            same_site="lax",
            https_only=self.secure,
        )
        app.include_router(self.router())

    def _unreachable(self, step: str, exc: Exception) -> ProviderUnreachable:
        issuer = str(self.settings.oidc_issuer)
        log.warning("signin.provider_unreachable", step=step, issuer=issuer, error=type(exc).__name__)
        what = "its discovery document" if step == "login" else "its token endpoint or keys"
        return ProviderUnreachable(
            f"the sign-in provider {issuer} did not answer ({what}: {type(exc).__name__}: {str(exc)[:200]}); "
            "retry later, or tell the operators if it persists"
        )

    async def provider_logout(self, id_token: str) -> str | None:
        """The provider's end-session URL for this sign-in (RP-initiated logout), or None when it has none."""
        client = self.oauth.create_client(_CLIENT)
        try:
            metadata = await client.load_server_metadata()
        except Exception as exc:  # the journal's session is over either way
            log.warning("signin.provider_logout_unavailable", error=type(exc).__name__)
            return None
        endpoint = metadata.get("end_session_endpoint")
        if not isinstance(endpoint, str) or not endpoint.startswith(("https://", "http://")):
            return None
        return _with_query(
            endpoint,
            {
                "id_token_hint": id_token,
                "post_logout_redirect_uri": self.post_logout_redirect_uri,
                "client_id": str(self.settings.oidc_client_id),
            },
        )

    def unknown_user(self, typed: str) -> str:
        """How a typed user id that names nobody in the directory is recorded: ``unknown-user:<12 hex digits>``, a
        keyed digest (HMAC-SHA256) of it -- one string, one name, on every replica; the text is not recoverable."""
        digest = hmac.new(self._probe_key, typed.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
        return f"{UNKNOWN_USER}:{digest[:12]}"

    async def typed_user(self, typed: str) -> str:
        """Who a refused or rate-limited password sign-in names in the logs and the audit trail: ``user:<id>`` when
        ``typed`` is a user of the directory, else :meth:`unknown_user` (also when the directory does not answer):
        what people type there may be their password."""
        assert self.passwords is not None  # install() set it
        try:
            found = await self.passwords.directory_entry(typed, timeout_s=_TYPED_USER_TIMEOUT_S)
        except Unavailable:
            return self.unknown_user(typed)
        return f"user:{typed}" if found.fingerprint is not None else self.unknown_user(typed)

    async def _directory_role(self, user_id: str) -> Role | None:
        """The directory profile's console role of ``user_id`` (an OIDC sign-in the role map gives none); None when
        there is none or human-interaction does not answer (least privilege: the inbox only; logged)."""
        assert self.passwords is not None  # install() set it
        try:
            found = await self.passwords.directory_entry(user_id)
        except Unavailable:
            log.warning("signin.directory_role_unavailable", user_id=user_id)
            return None
        if self.directory is not None:
            self.directory.remember(user_id, found.role, found.fingerprint)
        return None if found.role is None else Role[found.role]

    async def _start_session(
        self, request: Request, user_id: str, name: str, role: Role | None, directory: dict[str, Any] | None = None
    ) -> None:
        """Sign ``user_id`` in, in this browser: the session cookie of the module docstring. A session this
        browser had ends first, on every replica (or the sign-in does not happen: 503). ``directory``: what the
        directory said, when it signed the person in or gave the role
        (:func:`~temporality_journal.directory_sessions.directory_mark`): a change there ends the session."""
        before = self.person(request)
        if before is not None:
            await self._end(before, "the session this sign-in replaces could not be ended")
        request.session.clear()  # nothing from before the sign-in survives it
        request.session[_PERSON_KEY] = {
            "id": user_id,
            "name": name[:200],
            "role": None if role is None else role.name,
            "exp": time.time() + self.settings.session_max_age_s,
            "sid": secrets.token_urlsafe(24),  # what a sign-out revokes (temporality_journal.revocation)
        }
        if directory is not None:  # checked at every request (temporality_journal.directory_sessions)
            request.session[_PERSON_KEY][DIRECTORY_KEY] = directory

    # ------------------------------------------------------------------ the routes
    def router(self) -> APIRouter:
        router = APIRouter(tags=["sign-in"])
        if self.oauth is not None:
            self._oidc_routes(router)
        if self.settings.password_signin:
            self._password_route(router)
        self._logout_route(router)
        return router

    def _password_route(self, router: APIRouter) -> None:
        @router.post(
            "/auth/password",
            response_model=PasswordSignedIn,
            responses={code: {"model": ErrorBody} for code in (400, 401, 403, 413, 415, 422, 429, 503)},
            openapi_extra={
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PasswordSignInBody"}}},
                }
            },
            description=f"Sign in with a directory account (needs {CSRF_HEADER}: 1): human-interaction checks the "
            "password; the session cookie is set with the profile's console role (none: the inbox only). "
            "401 sign_in_refused for any unknown user or wrong password alike; 429 too_many_attempts with "
            "Retry-After; 503 directory_unreachable.",
        )
        async def password_sign_in(request: Request) -> PasswordSignedIn:
            self.check_csrf(request, "signing in")
            check_json_content_type(request)
            raw = parse_json(await read_body(request, 8192))
            if not isinstance(raw, dict):
                raise Unprocessable(
                    'the body must be a JSON object {"user": "<directory user id>", "password": "..."}, not '
                    + _JSON_KINDS.get(type(raw), "that"),
                    code="invalid_body",
                )
            try:
                body = PasswordSignInBody.model_validate(raw)
            except ValidationError as exc:
                raise Unprocessable(summarize_errors(exc.errors()), code="invalid_body") from None
            address = client_address(request)  # an IPv6 client by its /64, as every failure limit counts
            assert self.passwords is not None  # install() set it
            assert self.limits is not None
            try:
                attempt = await self.limits.reserve(body.user, address)
            except Exhausted as full:
                wait = full.retry_after_s
                who = await self.typed_user(body.user)
                log.info("signin.password_rate_limited", user=who, address=address, retry_after_s=wait)
                raise TooManyAttempts(
                    f"too many failed sign-ins; retry in {wait} s", headers={"Retry-After": str(wait)}
                ) from None
            try:
                reply = await self.passwords.check(body.user, body.password)
            except BaseException:  # nothing was decided (human-interaction did not answer): not a failure
                await asyncio.shield(self.limits.release(attempt))
                raise
            if not reply.ok:  # the attempt stays counted: that is the failure
                who = await self.typed_user(body.user)  # never the typed text unless it names a directory user
                log.info("signin.password_refused", user=who, address=address)
                if self.audit is not None:
                    self.audit.refused_here(status=401, reason="password_refused", principal=who)
                raise SignInRefused(REFUSED)
            await self.limits.succeeded(attempt)
            user_id = reply.user_id or body.user
            role = None if reply.role is None else Role[reply.role]
            if self.directory is not None:
                self.directory.remember(user_id, reply.role, reply.fingerprint)
            mark = directory_mark("password", reply.role, reply.fingerprint)
            await self._start_session(request, user_id, reply.display_name or user_id, role, mark)
            log.info("signin.succeeded", user_id=user_id, role=reply.role, method="password")
            return PasswordSignedIn(
                user=user_id,
                name=(reply.display_name or user_id)[:200],
                role=reply.role,
                next="#/runs" if role is not None else "#/inbox",
            )

    def _oidc_routes(self, router: APIRouter) -> None:
        client = self.oauth.create_client(_CLIENT)
        settings = self.settings

        @router.get("/auth/login", include_in_schema=True, description="Start the sign-in (302 to the provider).")
        async def login(
            request: Request, next: Annotated[str, Query(pattern=_NEXT_PATTERN, max_length=202)] = "#/runs"
        ) -> Response:
            try:
                redirect: Response = await client.authorize_redirect(request, self.redirect_uri)
            except Exception as exc:  # discovery failed: the provider is down or the issuer is wrong
                raise self._unreachable("login", exc) from None
            request.session["next"] = next  # a session already there stays until the callback replaces it
            return redirect

        from authlib.common.errors import AuthlibBaseError
        from joserfc.errors import JoseError

        @router.get("/auth/callback", description="The provider's redirect back (code flow).")
        async def callback(request: Request) -> Response:
            try:
                token = await client.authorize_access_token(request)
            except (httpx.HTTPError, httpx2.HTTPError) as exc:  # the token endpoint or keys: the provider went away
                raise self._unreachable("callback", exc) from None
            except (AuthlibBaseError, JoseError) as exc:
                log.info("signin.refused", reason=type(exc).__name__, detail=str(exc)[:200])
                raise SignInFailed(f"the sign-in was refused: {str(exc)[:200] or type(exc).__name__}") from None
            claims = token.get("userinfo")
            if not claims:
                log.info("signin.refused", reason="no_id_token")
                raise SignInFailed("the provider sent no ID token (is the openid scope requested?)")
            user_id = claims.get(settings.oidc_user_claim)
            if not isinstance(user_id, str) or not user_id.strip():
                log.info("signin.refused", reason="no_user_claim", claim=settings.oidc_user_claim)
                raise SignInFailed(
                    f"the ID token has no {settings.oidc_user_claim!r} claim to identify you by "
                    "(TEMPORALITY_JOURNAL_OIDC_USER_CLAIM)"
                )
            role = role_of(claims.get(settings.oidc_roles_claim), dict(settings.oidc_role_map))
            mark = None
            if role is None and settings.oidc_directory_roles:
                role = await self._directory_role(user_id.strip())
                if role is not None:  # the directory's: a change there ends the session
                    mark = directory_mark("role", role.name, None)
            next_hash = request.session.get("next") or "#/runs"
            await self._start_session(request, user_id.strip(), str(claims.get("name") or user_id), role, mark)
            id_token = token.get("id_token")
            if isinstance(id_token, str) and len(id_token) <= 3000:  # the cookie stays under the 4 KB browsers keep
                request.session[_ID_TOKEN_KEY] = id_token
            log.info("signin.succeeded", user_id=user_id.strip(), role=None if role is None else role.name)
            if role is None:
                next_hash = "#/inbox"
            return RedirectResponse(f"/console/{next_hash}", status_code=302)

    def _logout_route(self, router: APIRouter) -> None:

        @router.post(
            "/auth/logout",
            response_model=SignedOut,
            description=f"End the session (needs {CSRF_HEADER}: 1); ``provider_logout``: where the browser goes "
            "to end the provider's session too.",
        )
        async def logout(request: Request) -> SignedOut:
            person = self.person(request)
            id_token = request.session.get(_ID_TOKEN_KEY) if person is not None else None
            if person is not None:
                self.check_csrf(request)
                # recorded before the answer: from here every replica refuses a copy of the cookie
                await self._end(person, "the sign-out could not be recorded")
            request.session.clear()  # the middleware then expires the cookie
            provider_logout = None
            if isinstance(id_token, str) and self.oauth is not None:
                provider_logout = await self.provider_logout(id_token)
            if person is not None:
                log.info("signin.signed_out", user_id=person.user_id, provider_logout=provider_logout is not None)
            return SignedOut(provider_logout=provider_logout)


#: What a JSON body that is not an object is, in JSON's words.
_JSON_KINDS: dict[type, str] = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}


class UnsupportedMediaType(ApiError):
    status = 415
    code = "unsupported_media_type"


def check_json_content_type(request: Request) -> None:
    """The sign-in takes JSON only (``application/json`` or ``application/<x>+json``, UTF-8): a form another site
    posts, or a body without a content type, is a 415 naming what to send."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        shown = media[:60].encode("ascii", "replace").decode() if media.isprintable() else "unreadable"
        raise UnsupportedMediaType(
            f"send the sign-in as JSON {{user, password}} with Content-Type: application/json (got "
            f"{shown or 'no content type'})"
        )


def _with_query(url: str, params: dict[str, str]) -> str:
    """``url`` with ``params`` added to the query it may already have."""
    parts = urlsplit(url)
    query = urlencode([*parse_qsl(parts.query, keep_blank_values=True), *params.items()])
    return urlunsplit(parts._replace(query=query))


def auth_config(signin: SignIn | None) -> AuthConfig:
    if signin is None:
        return AuthConfig(oidc=None, password=None)
    oidc = None
    if signin.oauth is not None:
        oidc = AuthConfig.Oidc(provider=signin.settings.oidc_provider_name, login="/auth/login")
    password = AuthConfig.Password(login="/auth/password") if signin.settings.password_signin else None
    return AuthConfig(oidc=oidc, password=password)
