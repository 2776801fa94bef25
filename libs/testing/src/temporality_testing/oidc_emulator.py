"""A small OpenID Connect provider over real HTTP, for testing sign-in (the journal's ``/auth/...``).

No Keycloak or Entra ID runs here, and the PyPI test provider (``oidc-provider-mock``) needs Python 3.12;
so the seam is emulated at the wire, with the real formats of the authorization-code flow (RFC 6749, OIDC
Core, PKCE RFC 7636) and keys made by the test (an RSA key per provider, ``joserfc``):

* ``GET /.well-known/openid-configuration``: issuer, endpoints, ``RS256``, ``S256``;
* ``GET /jwks``: the public key;
* ``GET /authorize``: checks ``client_id``, ``redirect_uri`` (registered), ``response_type=code``,
  ``code_challenge_method=S256`` and ``state``; answers a login page with one button per person
  (``Sign in as <login>``), a form posting to ``POST /authorize`` which redirects to
  ``redirect_uri?code=...&state=...`` (``?error=access_denied`` for the "Deny" button);
* ``POST /token``: client secret (HTTP Basic or form), one-time code, the same ``redirect_uri``, the PKCE
  ``code_verifier``; answers ``access_token``, ``id_token`` (RS256: ``iss``, ``sub``, ``aud``, ``exp``,
  ``iat``, ``nonce`` and the person's claims), ``token_type``;
* ``GET /end_session`` (``end_session_endpoint``, OpenID Connect RP-Initiated Logout 1.0): checks the
  ``id_token_hint`` (one of this provider's ID tokens for this client: signature, ``iss``, ``aud``), the
  ``client_id`` when sent and ``post_logout_redirect_uri`` (registered); ends that person's provider session
  and redirects to ``post_logout_redirect_uri`` (with ``state`` when sent), or answers a "Signed out" page.

With ``sso=True`` the provider remembers who signed in (a ``idp_session`` cookie, as real providers do): an
authorization request from that browser is answered at once, without the login page, until the person's
provider session is ended at ``/end_session``. :attr:`OidcEmulator.logouts` keeps every accepted logout.

Fault injection: :attr:`OidcEmulator.tamper` is merged into the next ID tokens' claims (a wrong ``iss``,
``aud`` or ``nonce``), :attr:`OidcEmulator.sign_with_other_key` signs them with a key not in the JWKS.
:attr:`OidcEmulator.authorizations` keeps every authorize request's parameters (a test checks the PKCE
challenge and nonce were sent).

Usage::

    async with OidcEmulator(people={"alice": {"email": "alice", "groups": ["sre"]}}).serve() as idp:
        settings = Settings(oidc_issuer=idp.issuer, oidc_client_id=idp.client_id, ...)
"""

from __future__ import annotations

import base64
import hashlib
import html
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet, RSAKey

from temporality_embedded.processes import free_port
from temporality_testing.asgi import served_asgi

__all__ = ["OidcEmulator"]

Json = dict[str, Any]
_SESSION_COOKIE = "idp_session"


def _error(status: int, error: str, description: str) -> JSONResponse:
    return JSONResponse({"error": error, "error_description": description}, status_code=status)


@dataclass
class _Grant:
    login: str
    client_id: str
    redirect_uri: str
    challenge: str
    nonce: str | None
    issued: float


@dataclass
class OidcEmulator:
    """An OIDC provider for one client; ``people`` maps a login to the claims of their ID token."""

    people: dict[str, Json]
    client_id: str = "temporality-console"
    client_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    #: Redirect URIs the client registered; empty: any (the test does not know the journal's port yet).
    redirect_uris: list[str] = field(default_factory=list)
    tamper: Json = field(default_factory=dict)
    sign_with_other_key: bool = False
    authorizations: list[Json] = field(default_factory=list)
    #: Post-logout redirect URIs the client registered; empty: any.
    post_logout_redirect_uris: list[str] = field(default_factory=list)
    #: Remember who signed in (a provider session cookie) and skip the login page for them.
    sso: bool = False
    logouts: list[Json] = field(default_factory=list)
    port: int = 0
    _key: RSAKey = field(default_factory=lambda: RSAKey.generate_key(2048, parameters={"kid": "test-1"}))
    _other_key: RSAKey = field(default_factory=lambda: RSAKey.generate_key(2048, parameters={"kid": "test-1"}))
    _pending: dict[str, Json] = field(default_factory=dict)
    _codes: dict[str, _Grant] = field(default_factory=dict)
    _sessions: dict[str, str] = field(default_factory=dict)  # provider session id -> login

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ the provider
    def app(self) -> FastAPI:
        app = FastAPI(title="OIDC provider emulator")

        @app.get("/.well-known/openid-configuration")
        async def discovery() -> Json:
            return {
                "issuer": self.issuer,
                "authorization_endpoint": f"{self.issuer}/authorize",
                "token_endpoint": f"{self.issuer}/token",
                "jwks_uri": f"{self.issuer}/jwks",
                "end_session_endpoint": f"{self.issuer}/end_session",
                "response_types_supported": ["code"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
                "scopes_supported": ["openid", "email", "profile"],
            }

        @app.get("/jwks")
        async def jwks() -> Json:
            return dict(KeySet([self._key]).as_dict(private=False))

        @app.get("/authorize")
        async def authorize(request: Request) -> Response:
            params = dict(request.query_params)
            self.authorizations.append(params)
            if params.get("client_id") != self.client_id:
                return _error(400, "invalid_client", "unknown client_id")
            redirect_uri = params.get("redirect_uri", "")
            if self.redirect_uris and redirect_uri not in self.redirect_uris:
                return _error(400, "invalid_request", "redirect_uri is not registered")
            if params.get("response_type") != "code":
                return _error(400, "unsupported_response_type", "only code")
            if params.get("code_challenge_method") != "S256" or not params.get("code_challenge"):
                return _error(400, "invalid_request", "PKCE with S256 is required")
            if "openid" not in params.get("scope", "").split():
                return _error(400, "invalid_scope", "openid is required")
            remembered = self._sessions.get(request.cookies.get(_SESSION_COOKIE, "")) if self.sso else None
            if remembered is not None:  # signed in here before: no login page
                return RedirectResponse(self._grant(params, remembered), status_code=302)
            pending = secrets.token_urlsafe(12)
            self._pending[pending] = params
            buttons = "".join(
                f'<button type="submit" name="login" value="{html.escape(login)}">Sign in as {html.escape(login)}'
                "</button>"
                for login in self.people
            )
            page = (
                "<!doctype html><html><head><title>Test provider</title></head><body><h1>Test provider</h1>"
                f'<form method="post" action="/authorize"><input type="hidden" name="pending" value="{pending}">'
                f'{buttons}<button type="submit" name="login" value="">Deny</button></form></body></html>'
            )
            return HTMLResponse(page)

        @app.post("/authorize")
        async def approve(request: Request) -> Response:
            form = await request.form()
            params = self._pending.pop(str(form.get("pending")), None)
            if params is None:
                return _error(400, "invalid_request", "no such authorization request")
            login = str(form.get("login") or "")
            if login not in self.people:
                denied = {"state": params.get("state", ""), "error": "access_denied"}
                return RedirectResponse(f"{params['redirect_uri']}?{urlencode(denied)}", status_code=302)
            response = RedirectResponse(self._grant(params, login), status_code=302)
            if self.sso:
                session = secrets.token_urlsafe(16)
                self._sessions[session] = login
                response.set_cookie(_SESSION_COOKIE, session, httponly=True, samesite="lax")
            return response

        @app.get("/end_session")
        async def end_session(request: Request) -> Response:
            params = dict(request.query_params)
            try:
                claims = jwt.decode(params.get("id_token_hint", ""), self._key).claims
            except (JoseError, ValueError):
                return _error(400, "invalid_request", "id_token_hint is not an ID token of this provider")
            if claims.get("iss") != self.issuer or claims.get("aud") != self.client_id:
                return _error(400, "invalid_request", "id_token_hint was not issued here for this client")
            if params.get("client_id", self.client_id) != self.client_id:
                return _error(400, "invalid_request", "client_id differs from the id_token_hint's audience")
            redirect = params.get("post_logout_redirect_uri")
            if (
                redirect is not None
                and self.post_logout_redirect_uris
                and redirect not in self.post_logout_redirect_uris
            ):
                return _error(400, "invalid_request", "post_logout_redirect_uri is not registered")
            login = str(claims.get("sub", "")).removeprefix("sub-")
            for session in [sid for sid, who in self._sessions.items() if who == login]:
                del self._sessions[session]
            self.logouts.append({**params, "login": login})
            if redirect is None:
                response: Response = HTMLResponse("<!doctype html><title>Signed out</title><h1>Signed out</h1>")
            else:
                back = {"state": params["state"]} if "state" in params else {}
                response = RedirectResponse(redirect + (f"?{urlencode(back)}" if back else ""), status_code=302)
            response.delete_cookie(_SESSION_COOKIE)
            return response

        @app.post("/token")
        async def token(request: Request) -> Response:
            form = await request.form()
            client_id, secret = form.get("client_id"), form.get("client_secret")
            basic = request.headers.get("authorization", "")
            if basic.lower().startswith("basic "):
                decoded = base64.b64decode(basic[6:]).decode()
                client_id, _, secret = decoded.partition(":")
            if client_id != self.client_id or not secrets.compare_digest(str(secret or ""), self.client_secret):
                return _error(401, "invalid_client", "client authentication failed")
            if form.get("grant_type") != "authorization_code":
                return _error(400, "unsupported_grant_type", "only authorization_code")
            grant = self._codes.pop(str(form.get("code")), None)  # one use
            if grant is None or time.time() - grant.issued > 60:
                return _error(400, "invalid_grant", "unknown, used or expired code")
            if form.get("redirect_uri") != grant.redirect_uri:
                return _error(400, "invalid_grant", "redirect_uri differs from the authorization request")
            verifier = str(form.get("code_verifier") or "")
            challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
            if not verifier or challenge != grant.challenge:
                return _error(400, "invalid_grant", "PKCE verification failed")
            now = int(time.time())
            claims: Json = {
                "iss": self.issuer,
                "sub": f"sub-{grant.login}",
                "aud": self.client_id,
                "iat": now,
                "exp": now + 300,
                **({"nonce": grant.nonce} if grant.nonce else {}),
                **self.people[grant.login],
                **self.tamper,
            }
            key = self._other_key if self.sign_with_other_key else self._key
            id_token = jwt.encode({"alg": "RS256", "kid": "test-1"}, claims, key)
            return JSONResponse(
                {
                    "access_token": secrets.token_urlsafe(24),
                    "token_type": "Bearer",
                    "expires_in": 300,
                    "id_token": id_token,
                    "scope": "openid email profile",
                },
                headers={"Cache-Control": "no-store"},
            )

        return app

    def _grant(self, params: Json, login: str) -> str:
        """A one-time code for ``login`` on the authorization request ``params``: the redirect back."""
        code = secrets.token_urlsafe(24)
        self._codes[code] = _Grant(
            login=login,
            client_id=params["client_id"],
            redirect_uri=params["redirect_uri"],
            challenge=params["code_challenge"],
            nonce=params.get("nonce"),
            issued=time.time(),
        )
        return f"{params['redirect_uri']}?{urlencode({'state': params.get('state', ''), 'code': code})}"

    def signed_in_here(self) -> list[str]:
        """Who holds a provider session (``sso``)."""
        return sorted(set(self._sessions.values()))

    # ------------------------------------------------------------------ lifecycle
    @asynccontextmanager
    async def serve(self) -> AsyncIterator[OidcEmulator]:
        self.port = self.port or free_port()  # a port set before: the provider comes up where it was expected
        async with served_asgi(self.app(), self.port, lifespan="off"):
            yield self
