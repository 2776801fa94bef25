"""How a webhook trigger authenticates its sender: one verifier per ``auth.type``, chosen by the trigger's config.

Every verifier is a pydantic model (the ``auth:`` mapping of a trigger) with one method,
:meth:`Verifier.verify`, that raises :class:`~temporality_trigger_gateway.errors.Unauthorized` or returns.
Verifiers that sign the body (``reads_body``) run on the raw bytes, before they are parsed; the others
run on the headers alone, before the body is read, so an unauthenticated sender cannot make the gateway
read a megabyte. Secrets compare in constant time (:func:`hmac.compare_digest`) and are never logged or
echoed. Prefer ``*_env`` (the name of an environment variable, read at load) to a literal secret.

=====================  ============================================================================
``none``               nothing (only when written explicitly)
``basic``              HTTP Basic (Azure DevOps service hooks)
``bearer``             ``Authorization: Bearer <token>``
``header``             a named header carries a shared secret (``X-Api-Key: …``)
``gitlab``             ``X-Gitlab-Token`` (GitLab's secret token)
``hmac_sha256``        a named header carries HMAC-SHA256(secret, raw body), hex or base64, optional prefix
``github``             ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, raw body)>``
``standard_webhooks``  ``webhook-id`` / ``webhook-timestamp`` / ``webhook-signature`` (Standard Webhooks),
                       or Svix's ``svix-id`` / ``svix-timestamp`` / ``svix-signature`` (Clerk, Resend):
                       ±``tolerance_s`` (300), several space-separated signatures (key rotation)
``mindmap``            ``X-Mindmap-Signature: sha256=<hex HMAC>`` over the raw body and ``X-Mindmap-Token``
=====================  ============================================================================
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal, Self, cast

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationInfo, model_validator
from standardwebhooks.webhooks import EmptyWebhookSecretError, Webhook

from temporality_trigger_gateway.errors import Unauthorized

__all__ = [
    "SECRET_NOT_SET",
    "Auth",
    "BasicAuth",
    "BearerAuth",
    "GitHubAuth",
    "GitLabAuth",
    "HeaderAuth",
    "HmacSha256Auth",
    "MindmapAuth",
    "NoAuth",
    "StandardWebhooksAuth",
    "Verifier",
    "hmac_sha256_matches",
    "literal_secret",
    "standard_webhooks_header",
    "standard_webhooks_matches",
]

_EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
_HeaderName = Annotated[str, Field(pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")]


class Verifier(BaseModel, ABC):
    """One ``auth:`` kind. ``verify`` raises :class:`Unauthorized` (401) or returns."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: True when the signature covers the body: verified on the raw bytes, before they are parsed.
    reads_body: ClassVar[bool] = False
    #: True when the signature covers the raw body *only* -- neither a delivery id nor a time -- so one captured
    #: delivery verifies again with any header changed: a source whose event id is such a header dedupes on the
    #: body's digest too (:attr:`.adapters.base.Adapter.id_in_body`, :mod:`.launch`). ``False`` for a verifier
    #: whose credential is the secret itself (a token, a password: replaying it *is* having the credential) and
    #: for Standard Webhooks (it signs ``webhook-id`` and a time).
    signs_body_only: ClassVar[bool] = False
    #: The ``WWW-Authenticate`` challenge of a 401.
    challenge: ClassVar[str] = 'Signature realm="temporality"'

    @abstractmethod
    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        """``headers`` is case-insensitive; ``body`` is empty for a verifier that does not read it."""

    def refuse(self, detail: str) -> Unauthorized:
        return Unauthorized(detail, challenge=self.challenge)

    def _private(self, name: str) -> Any:
        """A private value (the resolved secret, ...) read from the private values' dict: an attribute read of
        a private value goes through pydantic's ``__getattr__`` after a failed ordinary lookup, ~40x a field's,
        and verifiers read one per delivery."""
        return cast(dict[str, Any], self.__pydantic_private__)[name]

    def _secret_value(self, name: str = "_secret") -> str:
        value: str = self._private(name).get_secret_value()
        return value


def literal_secret(verifier: Verifier) -> bool:
    """True when the secret is written in the triggers file instead of named by a ``*_env`` key."""
    return any(getattr(verifier, name, None) is not None for name in ("password", "token", "secret"))


#: How a secret read from an unset environment variable is refused (:func:`_resolve`): the trigger store tells
#: such a trigger's sender that its secret is not configured (:meth:`.store.TriggerRegistry.unserved_webhook`).
SECRET_NOT_SET = "is not set or empty"


def _resolve(literal: SecretStr | None, env: str | None, info: ValidationInfo, names: tuple[str, str]) -> SecretStr:
    """The secret given literally or through an environment variable (exactly one of them)."""
    literal_name, env_name = names
    if (literal is None) == (env is None):
        raise ValueError(f"give exactly one of {env_name} (preferred) or {literal_name}")
    if env is not None:
        environ: Mapping[str, str] = (info.context or {}).get("environ", os.environ)
        value = environ.get(env, "")
        if not value:
            raise ValueError(f"environment variable {env} ({env_name}) {SECRET_NOT_SET}")
        return SecretStr(value)
    assert literal is not None
    if not literal.get_secret_value():
        raise ValueError(f"{literal_name} must not be empty")
    return literal


def _same(given: str | bytes, expected: str | bytes) -> bool:
    a = given.encode() if isinstance(given, str) else given
    b = expected.encode() if isinstance(expected, str) else expected
    return hmac.compare_digest(a, b)


# --------------------------------------------------------------------------- no body
class NoAuth(Verifier):
    """No authentication at all: allowed only when written explicitly (``auth: {type: none}``)."""

    type: Literal["none"]

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        return None


class BasicAuth(Verifier):
    """HTTP Basic, as Azure DevOps service hooks send it. Prefer ``password_env`` to a literal ``password``."""

    challenge: ClassVar[str] = 'Basic realm="temporality"'
    type: Literal["basic"]
    #: No ``:`` (RFC 7617: the user id ends at the first colon, so no sender could send one that has it).
    username: Annotated[str, Field(min_length=1, pattern=r"^[^:]+$")]
    password: SecretStr | None = None
    password_env: _EnvName | None = None
    _secret: SecretStr = PrivateAttr()
    #: The header a sender with these credentials sends (``Basic <base64 of user:password>``), built once.
    _expected: bytes = PrivateAttr()

    @model_validator(mode="after")
    def _resolve_password(self, info: ValidationInfo) -> Self:
        self._secret = _resolve(self.password, self.password_env, info, ("password", "password_env"))
        try:
            credentials = f"{self.username}:{self._secret.get_secret_value()}".encode()
        except UnicodeEncodeError:  # its message would quote a character of the secret
            raise ValueError("the user name or password is not valid UTF-8") from None
        self._expected = b"Basic " + base64.b64encode(credentials)
        return self

    def matches(self, username: str, password: str) -> bool:
        """Constant-time comparison of both parts (no short-circuit on the user name)."""
        return _same(username, self.username) & _same(password, self._secret_value())

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        header = headers.get("authorization")
        if not header:
            raise self.refuse("this trigger requires HTTP Basic credentials")
        # Anything but the header as the sender writes it (one constant-time comparison) is decoded (another
        # spelling of the scheme, padding, spaces) and compared part by part.
        scheme, _, value = header.partition(" ")
        try:
            if _same(header, self._private("_expected")):
                return
            if scheme.lower() != "basic":
                raise ValueError("not basic")
            username, sep, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
        except (ValueError, binascii.Error):  # UnicodeDecodeError is a ValueError
            raise self.refuse("the Authorization header is not valid HTTP Basic") from None
        if not sep or not self.matches(username, password):
            raise self.refuse("wrong user name or password")


class BearerAuth(Verifier):
    """``Authorization: Bearer <token>``, the token compared in constant time."""

    challenge: ClassVar[str] = 'Bearer realm="temporality"'
    type: Literal["bearer"]
    token: SecretStr | None = None
    token_env: _EnvName | None = None
    _secret: SecretStr = PrivateAttr()

    @model_validator(mode="after")
    def _resolve_token(self, info: ValidationInfo) -> Self:
        self._secret = _resolve(self.token, self.token_env, info, ("token", "token_env"))
        return self

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        scheme, _, value = (headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise self.refuse("this trigger requires an Authorization: Bearer token")
        if not _same(value.strip(), self._secret_value()):
            raise self.refuse("wrong bearer token")


class _SharedSecret(Verifier):
    secret: SecretStr | None = None
    secret_env: _EnvName | None = None
    _secret: SecretStr = PrivateAttr()

    @model_validator(mode="after")
    def _resolve_secret(self, info: ValidationInfo) -> Self:
        self._secret = _resolve(self.secret, self.secret_env, info, ("secret", "secret_env"))
        self._check_secret(self._secret.get_secret_value())
        return self

    def _check_secret(self, secret: str) -> None:
        return None


class HeaderAuth(_SharedSecret):
    """A named header carries the shared secret itself (e.g. ``X-Api-Key``)."""

    type: Literal["header"]
    header: _HeaderName

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        given = headers.get(self.header)
        if not given:
            raise self.refuse(f"this trigger requires the {self.header} header")
        if not _same(given, self._secret_value()):
            raise self.refuse(f"wrong {self.header}")


class GitLabAuth(_SharedSecret):
    """GitLab's "secret token", sent verbatim in ``X-Gitlab-Token``."""

    type: Literal["gitlab"]

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        given = headers.get("x-gitlab-token")
        if not given:
            raise self.refuse("this trigger requires the X-Gitlab-Token header")
        if not _same(given, self._secret_value()):
            raise self.refuse("wrong X-Gitlab-Token")


# --------------------------------------------------------------------------- signed bodies
def hmac_sha256_matches(
    secret: bytes, body: bytes, given: str, *, prefix: str = "", encoding: Literal["hex", "base64"] = "hex"
) -> bool:
    """``given`` is ``prefix`` + the hex (case-insensitive) or base64 HMAC-SHA256 of the raw ``body``."""
    if not given.startswith(prefix):
        return False
    digest = hmac.new(secret, body, hashlib.sha256).digest()
    value = given[len(prefix) :].strip()
    if encoding == "hex":
        return _same(value.lower(), digest.hex())
    try:
        decoded = base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(decoded, digest)


class HmacSha256Auth(_SharedSecret):
    """A named header carries HMAC-SHA256(secret, raw body), hex or base64, after an optional ``prefix``."""

    reads_body: ClassVar[bool] = True
    signs_body_only: ClassVar[bool] = True
    type: Literal["hmac_sha256"]
    header: _HeaderName
    prefix: str = ""
    encoding: Literal["hex", "base64"] = "hex"

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        given = headers.get(self.header)
        if not given:
            raise self.refuse(f"this trigger requires the {self.header} signature header")
        secret = self._secret_value().encode()
        if not hmac_sha256_matches(secret, body, given, prefix=self.prefix, encoding=self.encoding):
            raise self.refuse(f"the {self.header} signature does not match the body")


class GitHubAuth(_SharedSecret):
    """GitHub's ``X-Hub-Signature-256: sha256=<hex>`` over the raw body (never the older SHA-1 header)."""

    reads_body: ClassVar[bool] = True
    signs_body_only: ClassVar[bool] = True
    type: Literal["github"]

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        given = headers.get("x-hub-signature-256")
        if not given:
            raise self.refuse("this trigger requires the X-Hub-Signature-256 header (set a secret on the hook)")
        if not hmac_sha256_matches(self._secret_value().encode(), body, given, prefix="sha256="):
            raise self.refuse("the X-Hub-Signature-256 signature does not match the body")


#: Standard Webhooks' default tolerance between ``webhook-timestamp`` and now.
STANDARD_WEBHOOKS_TOLERANCE_S = 300


def standard_webhooks_header(headers: Mapping[str, str], name: str) -> str | None:
    """The Standard Webhooks header ``webhook-<name>``, else Svix's ``svix-<name>`` (Clerk, Resend and other
    Svix-based senders send those, with the same meaning; Svix's own libraries read either)."""
    return headers.get(f"webhook-{name}") or headers.get(f"svix-{name}")


def standard_webhooks_matches(
    secret: str, headers: Mapping[str, str], body: bytes, *, now: datetime, tolerance_s: int
) -> str | None:
    """``None`` when the delivery is signed by ``secret`` within the tolerance, else why not.

    The signed content and its encoding are the ``standardwebhooks`` package's (:meth:`Webhook.sign`);
    the clock is ours, so a published test vector can be checked at its own time."""
    family = "webhook" if headers.get("webhook-signature") else "svix"  # Svix (Clerk, Resend) names them svix-*
    msg_id = standard_webhooks_header(headers, "id")
    stamp = standard_webhooks_header(headers, "timestamp")
    signatures = headers.get(f"{family}-signature")
    if not (msg_id and stamp and signatures):
        return (
            "this trigger requires the webhook-id, webhook-timestamp and webhook-signature headers"
            " (or Svix's svix-id, svix-timestamp and svix-signature)"
        )
    if not (stamp.isascii() and stamp.isdigit()):
        return f"{family}-timestamp is not a Unix time in seconds"
    # Compared as a number before it becomes a datetime: a time far off (year 10000 and on, or more digits than
    # int() reads) is refused as any stale one, not an error. Twelve digits are past year 33000.
    now_s = now.timestamp()
    if len(stamp) > 12 or abs(int(stamp) - now_s) > tolerance_s:
        return f"{family}-timestamp is more than {tolerance_s} s away from now (replay, or a clock off)"
    sent = datetime.fromtimestamp(int(stamp), tz=UTC)
    try:
        expected = Webhook(secret).sign(msg_id=msg_id, timestamp=sent, data=body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, binascii.Error, EmptyWebhookSecretError):
        return "the body cannot be verified (not UTF-8)"
    expected_sig = expected.partition(",")[2].encode()
    matched = False
    for versioned in signatures.split():  # several during a key rotation
        version, _, signature = versioned.partition(",")
        if version == "v1":
            matched |= hmac.compare_digest(signature.encode(), expected_sig)
    return None if matched else f"no {family}-signature matches the body"


class StandardWebhooksAuth(_SharedSecret):
    """Standard Webhooks (Svix and others): ``secret`` is the ``whsec_…`` base64 key."""

    reads_body: ClassVar[bool] = True
    type: Literal["standard_webhooks"]
    tolerance_s: Annotated[int, Field(ge=1, le=3600)] = STANDARD_WEBHOOKS_TOLERANCE_S

    def _check_secret(self, secret: str) -> None:
        try:
            Webhook(secret)
        except (ValueError, binascii.Error, EmptyWebhookSecretError):
            raise ValueError("the standard_webhooks secret must be base64 (optionally prefixed whsec_)") from None

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        problem = standard_webhooks_matches(
            self._secret_value(), headers, body, now=datetime.now(UTC), tolerance_s=self.tolerance_s
        )
        if problem is not None:
            raise self.refuse(problem)


class MindmapAuth(_SharedSecret):
    """``mindmap.test_case`` (TRG-3): ``X-Mindmap-Signature: sha256=<hex HMAC-SHA256(secret, raw body)>`` *and*
    the trigger's own token in ``X-Mindmap-Token`` (so a leaked signing key of one map cannot start another
    trigger's runs). ``secret``/``secret_env`` sign; ``token``/``token_env`` identify the trigger."""

    reads_body: ClassVar[bool] = True
    signs_body_only: ClassVar[bool] = True
    type: Literal["mindmap"]
    token: SecretStr | None = None
    token_env: _EnvName | None = None
    _token: SecretStr = PrivateAttr()

    @model_validator(mode="after")
    def _resolve_token(self, info: ValidationInfo) -> Self:
        self._token = _resolve(self.token, self.token_env, info, ("token", "token_env"))
        return self

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        token = headers.get("x-mindmap-token")
        if not token:
            raise self.refuse("this trigger requires the X-Mindmap-Token header")
        signature = headers.get("x-mindmap-signature")
        if not signature:
            raise self.refuse("this trigger requires the X-Mindmap-Signature header")
        good_token = _same(token, self._secret_value("_token"))
        good_signature = hmac_sha256_matches(self._secret_value().encode(), body, signature, prefix="sha256=")
        if not good_token:
            raise self.refuse("wrong X-Mindmap-Token")
        if not good_signature:
            raise self.refuse("the X-Mindmap-Signature signature does not match the body")


Auth = Annotated[
    NoAuth
    | BasicAuth
    | BearerAuth
    | HeaderAuth
    | GitLabAuth
    | HmacSha256Auth
    | GitHubAuth
    | StandardWebhooksAuth
    | MindmapAuth,
    Field(discriminator="type"),
]
