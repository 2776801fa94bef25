"""Role tokens for the HTTP APIs people and tools call (trigger admin, user directory, run control, journal).

One secret file serves every service (``TEMPORALITY_API_TOKENS_FILE``, a YAML or JSON list)::

    - {name: ci-bot, role: admin, token: "…at least 24 characters…"}
    - {name: on-call, role: operator, token: "…"}
    - {name: dashboard, role: viewer, token: "…"}

Roles are ordered: ``viewer`` < ``operator`` < ``admin``; an endpoint names the lowest role it admits and a
caller with a higher one is let in. A request without a valid ``Authorization: Bearer <token>`` is a 401 with
a ``WWW-Authenticate`` challenge; a valid token whose role is too low is a 403 naming the role needed. Tokens
are compared in constant time and never logged: the log and the journal name the token's ``name``.

The file is **re-read while the services run**: at most once a second (``RELOAD_EVERY_S``), an authentication
looks at the file's modification time, size and inode, and a change is loaded -- a token removed is refused from
then on, a token added admitted, with no restart (``api.tokens_reloaded`` in the log names the tokens added and
removed, never a secret). A file that became unreadable, empty or invalid is **not** taken: the last good set
stays in force and ``api.tokens_file_invalid`` is logged (once per version of the file) -- a broken edit never
opens access, nor locks everyone out. To revoke every token write ``[]``. Write the new file beside the old one
and rename it over (or let Kubernetes update the mounted Secret, which swaps a symlink): a file read while half
written is invalid and waits for the next look.

Wrong tokens are limited per client address (:mod:`temporality_service.limits`): after
``TEMPORALITY_API_MAX_FAILURES_PER_ADDRESS`` (20) wrong tokens within ``TEMPORALITY_API_FAILURE_WINDOW_S`` (300 s)
from one address, every request of that address presenting a token is a ``429 too_many_failures`` with
``Retry-After`` (audited like a refusal) until its oldest failure leaves the window; other addresses, and
requests without ``Authorization``, are not affected.

With no file configured nothing is admitted (every protected endpoint answers 401): there is no anonymous
access but health and metrics. ``temporality up`` writes a file with a fresh admin token and prints it.
:meth:`ApiAuth.install` also puts the app's OpenAPI document (``/openapi.json``) behind the ``viewer`` role and
drops FastAPI's Swagger UI and ReDoc pages (a browser could not send the token for the document they load).

Every 401/403 is told to the app's :class:`~temporality_service.audit.AccessAudit` (``app.state.access_audit``,
which the service runtime sets on the app it serves) before it is answered: the audit trail's
``api.access_refused``, rate-limited, never with the token.

A **vouched principal** stands in for a token when ``TEMPORALITY_API_VOUCH_SECRET_FILE`` is set: a request
without ``Authorization`` whose ``X-Temporality-Vouched-Principal`` carries a fresh assertion signed with that
secret (by the journal, for a person signed in to the console with the provider:
:mod:`temporality_service.vouch`) is that principal, name and role. Without the setting the header is ignored
(and a request with nothing else is a 401 as before); a forged, altered or stale assertion is a 401.

Usage in a FastAPI app::

    ApiAuth.from_settings(settings.api).install(app)   # in configure(): a bad file is a ConfigError

    @app.post("/triggers")
    async def create(who: AsAdmin) -> ...               # who.name goes into logs and audit events
"""

from __future__ import annotations

import hmac
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any

import structlog
import yaml
from fastapi import Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, SecretStr, TypeAdapter, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from temporality_service.audit import audit_refusal
from temporality_service.http import Forbidden, Unauthorized
from temporality_service.limits import (
    DEFAULT_FAILURE_WINDOW_S,
    DEFAULT_MAX_FAILURES_PER_ADDRESS,
    FailureLimiter,
    TooManyFailures,
    client_address,
)
from temporality_service.vouch import PRINCIPAL_HEADER, PrincipalVoucher, VouchSecretError

__all__ = [
    "ApiAuth",
    "ApiAuthSettings",
    "ApiToken",
    "AsAdmin",
    "AsOperator",
    "AsViewer",
    "Principal",
    "Role",
    "RoleForbidden",
    "TokenFileError",
    "dump_tokens",
    "load_tokens",
    "require",
]

log = structlog.get_logger(__name__)

#: Shorter tokens are refused at start: a guessable secret is a configuration error, not a warning.
MIN_TOKEN_LENGTH = 24
#: How often (seconds, at most) an authentication looks whether the tokens file changed.
RELOAD_EVERY_S = 1.0


class Role(IntEnum):
    """What a caller may do; a higher role includes every lower one."""

    viewer = 1
    operator = 2
    admin = 3

    def __str__(self) -> str:
        return self.name


class ApiToken(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._@:-]+$")
    role: Role
    token: SecretStr = Field(min_length=MIN_TOKEN_LENGTH)

    @field_validator("name")
    @classmethod
    def _not_a_person(cls, value: str) -> str:
        # ``user:<id>`` is how a person the journal vouches for is named (and journaled as actor), and
        # ``unknown-user:<digest>`` how a refused sign-in's unknown id is: a token so named would be taken for that
        # person (or that sign-in attempt) in the journal.
        for prefix, names in (
            ("user:", "people signed in to the console"),
            ("unknown-user:", "refused sign-ins whose typed id names nobody"),
        ):
            if value.lower().startswith(prefix):
                raise ValueError(
                    f"token name {value!r} starts with {prefix!r}, which names {names} in the audit trail;"
                    " name the token something else (e.g. ci-bot)"
                )
        return value

    @field_validator("role", mode="before")
    @classmethod
    def _role_by_name(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return Role[value]
            except KeyError:
                raise ValueError(f"unknown role {value!r}: one of {', '.join(r.name for r in Role)}") from None
        return value


class Principal(BaseModel):
    """Who called: the token's name and role (never the token)."""

    model_config = ConfigDict(frozen=True)

    name: str
    role: Role

    def may(self, role: Role) -> bool:
        return self.role >= role


class RoleForbidden(Forbidden):
    """403 of a known caller: ``principal`` names it (a token's name, ``user:<id>``), never the credential."""

    def __init__(self, detail: str, *, principal: str, code: str | None = None) -> None:
        super().__init__(detail, code=code)
        self.principal = principal


class TokenFileError(ValueError):
    """The tokens file is missing, unreadable or invalid; the message names the entry and field."""


_TOKENS = TypeAdapter(list[ApiToken])


def load_tokens(path: Path) -> list[ApiToken]:
    """Read and validate a tokens file (YAML or JSON list); duplicate names or tokens are refused."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TokenFileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise TokenFileError(f"{path}: not YAML/JSON: {exc}") from exc
    if raw is None:
        raw = []
    try:
        tokens = _TOKENS.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise TokenFileError(f"{path}: entry {where}: {first['msg']}") from None
    _check_unique(tokens, path)
    return tokens


def _check_unique(tokens: Iterable[ApiToken], where: object) -> None:
    names: set[str] = set()
    secrets: set[str] = set()
    for entry in tokens:
        if entry.name in names:
            raise TokenFileError(f"{where}: token name {entry.name!r} appears twice")
        if entry.token.get_secret_value() in secrets:
            raise TokenFileError(f"{where}: token of {entry.name!r} is used by another entry")
        names.add(entry.name)
        secrets.add(entry.token.get_secret_value())


class ApiAuthSettings(BaseSettings):
    """``TEMPORALITY_API_*``: the role tokens every service's HTTP API accepts."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_API_", extra="ignore")

    #: A YAML/JSON list of ``{name, role, token}`` (mount it from a secret). Unset: nothing is admitted.
    tokens_file: Path | None = None
    #: A secret (at least 32 characters) shared with the journal: a principal it vouches for (a person signed
    #: in to the console with the provider, with their role) is admitted like a token. Unset: tokens only.
    vouch_secret_file: Path | None = None
    #: Wrong bearer tokens (role tokens; on human-interaction inbox tokens too) one client address may present
    #: within the window; then 429 ``too_many_failures`` with ``Retry-After`` for that address.
    max_failures_per_address: int = Field(default=DEFAULT_MAX_FAILURES_PER_ADDRESS, ge=1, le=1_000_000)
    #: The window of that limit, in seconds (each replica counts its own).
    failure_window_s: float = Field(default=DEFAULT_FAILURE_WINDOW_S, gt=0, le=86_400)


class ApiAuth:
    """Checks ``Authorization: Bearer`` against the configured tokens; FastAPI dependencies per role."""

    def __init__(
        self,
        tokens: Iterable[ApiToken] = (),
        principals: PrincipalVoucher | None = None,
        *,
        tokens_file: Path | None = None,
        failures: FailureLimiter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``tokens_file``: where ``tokens`` were read from, to re-read on a change (:meth:`from_settings` gives
        it; the file's state must be from before ``tokens`` were read from it)."""
        self._tokens = list(tokens)
        _check_unique(self._tokens, "tokens")
        #: Checks (and, on the journal, signs) vouched principals; None: tokens only.
        self.principals = principals
        self._failures = failures or FailureLimiter()
        self._file = tokens_file
        self._clock = clock
        self._looked_at = clock()
        self._version = _file_version(tokens_file) if tokens_file is not None else None
        self._refused_version: tuple[int, ...] | None = None

    @classmethod
    def from_settings(cls, settings: ApiAuthSettings) -> ApiAuth:
        """Raises :class:`TokenFileError` (a service turns it into ``ConfigError``, exit 2), also for an unusable
        vouch secret file."""
        path = settings.tokens_file
        version = None
        if path is not None:
            try:
                version = _file_version(path)  # before reading: a change meanwhile is seen at the next look
            except OSError:
                pass  # load_tokens says why
        tokens = [] if path is None else load_tokens(path)
        principals = None
        if settings.vouch_secret_file is not None:
            try:
                principals = PrincipalVoucher.from_file(settings.vouch_secret_file)
            except VouchSecretError as exc:
                raise TokenFileError(f"TEMPORALITY_API_VOUCH_SECRET_FILE: {exc}") from None
        auth = cls(
            tokens,
            principals,
            failures=FailureLimiter(settings.max_failures_per_address, settings.failure_window_s),
        )
        auth._file, auth._version = path, version
        return auth

    @property
    def failures(self) -> FailureLimiter:
        """The wrong-token limit per client address (:mod:`temporality_service.limits`); a wrapper that delegates
        to an inner :class:`ApiAuth` (``_inner``: the journal's session check) shares the inner one's."""
        own = self.__dict__.get("_failures")
        if isinstance(own, FailureLimiter):
            return own
        inner = self.__dict__.get("_inner")
        if isinstance(inner, ApiAuth):
            return inner.failures
        self._failures = FailureLimiter()
        return self._failures

    @property
    def configured(self) -> bool:
        self.reload_if_changed()
        return bool(self._tokens)

    def reload_if_changed(self, *, force: bool = False) -> bool:
        """Re-read the tokens file if it changed since it was read (looked at once per :data:`RELOAD_EVERY_S` at
        most, unless ``force``); True when a new set was taken. An unreadable, empty or invalid file keeps the
        last good set (module docstring)."""
        if self._file is None:
            return False
        now = self._clock()
        if not force and now - self._looked_at < RELOAD_EVERY_S:
            return False
        self._looked_at = now
        try:
            version = _file_version(self._file)
            if version == self._version:
                self._refused_version = None  # back as it was read: a later breakage is told again
                return False
            if version == self._refused_version:
                return False  # already said why; the last good set stays
            if not self._file.read_text(encoding="utf-8").strip():
                raise TokenFileError(f"{self._file}: empty (write [] to admit no token)")
            tokens = load_tokens(self._file)
        except (OSError, TokenFileError) as exc:
            problem = (
                str(exc) if isinstance(exc, TokenFileError) else f"{self._file}: cannot read: {exc.strerror or exc}"
            )
            refused = _file_version_or_none(self._file) or (-1,)  # (-1,): not there (said once, too)
            if refused != self._refused_version:
                log.error("api.tokens_file_invalid", problem=problem, kept_tokens=len(self._tokens))
            self._refused_version = refused
            return False
        before = {t.name: t.token.get_secret_value() for t in self._tokens}
        after = {t.name: t.token.get_secret_value() for t in tokens}
        self._tokens, self._version, self._refused_version = tokens, version, None
        log.info(
            "api.tokens_reloaded",
            tokens=len(tokens),
            added=sorted(set(after) - set(before)),
            removed=sorted(set(before) - set(after)),
            changed=sorted(n for n in set(before) & set(after) if before[n] != after[n]),
        )
        return True

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller behind an ``Authorization`` header, or :class:`Unauthorized`."""
        self.reload_if_changed()
        if not authorization:
            raise Unauthorized("this endpoint needs Authorization: Bearer <API token>")
        scheme, _, credential = authorization.partition(" ")
        credential = credential.strip()
        if scheme.lower() != "bearer" or not credential:
            raise Unauthorized("use Authorization: Bearer <API token>")
        given = credential.encode("utf-8", "surrogateescape")
        match: ApiToken | None = None
        for entry in self._tokens:  # every entry compared, in constant time each: no early exit on a hit
            if hmac.compare_digest(given, entry.token.get_secret_value().encode("utf-8")):
                match = entry
        if match is None:
            raise Unauthorized("the API token is not valid", code="invalid_token")
        return Principal(name=match.name, role=match.role)

    def authorize(self, authorization: str | None, role: Role) -> Principal:
        principal = self.authenticate(authorization)
        if not principal.may(role):
            log.info("api.forbidden", principal=principal.name, role=str(principal.role), needed=str(role))
            raise RoleForbidden(
                f"this needs the {role} role; token {principal.name!r} has {principal.role}", principal=principal.name
            )
        return principal

    def admit(self, request: Request, authorization: str | None, role: Role) -> Principal:
        """:meth:`authorize_request`, each refusal (401/403, and the 429 of an address past the wrong-token limit)
        told to the app's access audit (``app.state.access_audit``, when there is one) before it is raised."""
        presented = bool(authorization and authorization.strip())
        address = client_address(request) if presented else None
        try:
            if presented:
                self.failures.check(address)
            return self.authorize_request(request, authorization, role)
        except TooManyFailures as exc:
            audit_refusal(request, status=exc.status, reason=exc.code, role_needed=str(role))
            raise
        except (Unauthorized, Forbidden) as exc:
            if presented and exc.code == "invalid_token":
                self.failures.failed(address)
            principal = exc.principal if isinstance(exc, RoleForbidden) else None
            audit_refusal(request, status=exc.status, reason=exc.code, principal=principal, role_needed=str(role))
            raise

    def authorize_request(self, request: Request, authorization: str | None, role: Role) -> Principal:
        """The :func:`require` dependency's check: the ``Authorization`` header, else a vouched principal (with
        :attr:`principals` configured); a service admitting more (the journal's sign-in session cookie)
        overrides it, with the request to read."""
        assertion = request.headers.get(PRINCIPAL_HEADER)
        if authorization is None and assertion is not None and self.principals is not None:
            return self._vouched(assertion, role)
        return self.authorize(authorization, role)

    def _vouched(self, assertion: str, role: Role) -> Principal:
        assert self.principals is not None
        vouched = self.principals.vouched_principal(assertion)
        if vouched is None or vouched[1] not in Role.__members__:
            log.info("api.vouch_refused")
            raise Unauthorized("the vouched principal is not valid (forged, altered or stale)", code="invalid_vouch")
        principal = Principal(name=vouched[0], role=Role[vouched[1]])
        if not principal.may(role):
            log.info("api.forbidden", principal=principal.name, role=str(principal.role), needed=str(role))
            raise RoleForbidden(
                f"this needs the {role} role; {principal.name} has {principal.role}", principal=principal.name
            )
        return principal

    def install(self, app: FastAPI) -> None:
        """Make this the token set the :data:`AsViewer` / :data:`AsOperator` / :data:`AsAdmin` parameters check, and
        guard the app's OpenAPI document with it (:func:`guard_openapi`)."""
        app.state.api_auth = self
        guard_openapi(app)


def require(role: Role) -> Callable[..., Awaitable[Principal]]:
    """A FastAPI dependency admitting callers with ``role`` or higher (401/403 otherwise).

    It checks the :class:`ApiAuth` installed on the app (``auth.install(app)``): being module-level, the
    ``Annotated`` aliases below resolve under ``from __future__ import annotations`` anywhere.
    """

    async def dependency(request: Request, authorization: Annotated[str | None, Header()] = None) -> Principal:
        auth = getattr(request.app.state, "api_auth", None)
        if not isinstance(auth, ApiAuth):
            raise RuntimeError("ApiAuth.install(app) was not called for this app")
        return auth.admit(request, authorization, role)

    dependency.__name__ = f"require_{role.name}"
    return dependency


#: Endpoint parameters: ``async def list_triggers(who: AsViewer)`` admits viewer, operator and admin.
AsViewer = Annotated[Principal, Depends(require(Role.viewer))]
AsOperator = Annotated[Principal, Depends(require(Role.operator))]
AsAdmin = Annotated[Principal, Depends(require(Role.admin))]


def guard_openapi(app: FastAPI) -> None:
    """No anonymous API description (issue 11: nothing anonymous but health and metrics): the app's
    ``openapi_url`` (``/openapi.json``) answers only a ``viewer`` or higher (401/403 otherwise, audited like any
    refusal), and FastAPI's Swagger UI and ReDoc pages are not served (they load the document from the browser,
    which has no way to send the token). Idempotent."""
    url = app.openapi_url
    dropped = {p for p in (url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url) if p is not None}
    routes = app.router.routes
    position = next((i for i, r in enumerate(routes) if getattr(r, "path", None) == url), len(routes))
    routes[:] = [r for r in routes if getattr(r, "path", None) not in dropped or getattr(r, "guarded", False)]
    app.docs_url = app.redoc_url = None
    if url is None or any(getattr(r, "guarded", False) for r in routes):
        return

    async def openapi(who: AsViewer) -> JSONResponse:
        return JSONResponse(app.openapi())

    app.add_api_route(url, openapi, methods=["GET"], include_in_schema=False)
    route = routes.pop()  # where FastAPI's own was: before any catch-all route added since
    route.guarded = True  # type: ignore[attr-defined]
    routes.insert(min(position, len(routes)), route)


def _file_version(path: Path) -> tuple[int, ...]:
    """What tells a changed tokens file (the file a symlink names: a Kubernetes Secret's update swaps one)."""
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_dev)


def _file_version_or_none(path: Path) -> tuple[int, ...] | None:
    try:
        return _file_version(path)
    except OSError:
        return None


def dump_tokens(tokens: Iterable[ApiToken]) -> str:
    """The file form of ``tokens`` (used by ``temporality up`` to write a fresh admin token)."""
    return json.dumps(
        [{"name": t.name, "role": t.role.name, "token": t.token.get_secret_value()} for t in tokens], indent=2
    )
