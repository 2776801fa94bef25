"""A person's identity, vouched for by one service to another: short-lived signed assertions.

The journal signs people in (OIDC, :mod:`temporality_journal.signin`) and forwards their inbox calls to
human-interaction, which must not believe a user id in a header anyone could send. Both read the same secret
(``TEMPORALITY_INBOX_VOUCH_SECRET_FILE``, at least :data:`MIN_SECRET_LENGTH` characters, mounted from a
secret); the journal sends ``X-Temporality-Vouched-User: <assertion>``, an HMAC-SHA256-signed, timestamped
``user id`` (itsdangerous' ``TimestampSigner``, salted for this one use), and human-interaction admits the
assertion only within :data:`MAX_AGE_S` seconds of its signing. Without the secret configured on both sides,
nothing is vouched for: the header is refused, and the inbox takes inbox tokens only.

The assertion names the person and nothing else (no role: the inbox shows a person only their own questions).
It is never logged.

**A principal for the other APIs.** The console's trigger wizard calls the trigger-gateway's admin API through
the journal's ``/gateway/`` proxy; a person signed in with the provider has no API token to pass on. With
``TEMPORALITY_API_VOUCH_SECRET_FILE`` (:class:`temporality_service.auth.ApiAuthSettings`) set on the journal and
on the API's service, the journal sends ``X-Temporality-Vouched-Principal: <assertion>`` instead: the person's
principal (``user:<id>``) and the role the journal gave them at sign-in, signed with that secret under a salt of
its own (:class:`PrincipalVoucher`), so an inbox assertion is never taken for a principal and vice versa. The
API admits it like a token of that name and role (:meth:`temporality_service.auth.ApiAuth.authorize_request`),
within :data:`MAX_AGE_S` seconds.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Self

from itsdangerous import BadSignature, TimestampSigner

__all__ = [
    "MAX_AGE_S",
    "MIN_SECRET_LENGTH",
    "PRINCIPAL_HEADER",
    "VOUCH_HEADER",
    "PrincipalVoucher",
    "VouchSecretError",
    "Voucher",
]

#: The request header that carries the assertion.
VOUCH_HEADER = "X-Temporality-Vouched-User"
#: An assertion older than this is refused (it is made per forwarded request: seconds are plenty).
MAX_AGE_S = 60
MIN_SECRET_LENGTH = 32
_SALT = "temporality.inbox.vouched-user"
#: The request header that carries a vouched principal (:class:`PrincipalVoucher`).
PRINCIPAL_HEADER = "X-Temporality-Vouched-Principal"
_PRINCIPAL_SALT = "temporality.api.vouched-principal"


class VouchSecretError(ValueError):
    """The vouch secret file is missing, unreadable or too short."""


class Voucher:
    """Signs (:meth:`vouch`) and checks (:meth:`vouched`) assertions with one shared secret."""

    #: What the signatures are for: an assertion signed for one purpose never verifies for another.
    SALT = _SALT

    def __init__(self, secret: str) -> None:
        if len(secret) < MIN_SECRET_LENGTH:
            raise VouchSecretError(f"the vouch secret needs at least {MIN_SECRET_LENGTH} characters")
        self._signer = TimestampSigner(secret, salt=self.SALT, digest_method=hashlib.sha256)

    @classmethod
    def from_file(cls, path: Path) -> Self:
        try:
            secret = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise VouchSecretError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        try:
            return cls(secret)
        except VouchSecretError as exc:
            raise VouchSecretError(f"{path}: {exc}") from None

    def vouch(self, user_id: str) -> str:
        """An assertion that ``user_id`` is signed in, valid for :data:`MAX_AGE_S` seconds."""
        return self._signer.sign(user_id).decode("ascii")

    def vouched(self, assertion: str, max_age_s: int = MAX_AGE_S) -> str | None:
        """The user id of a valid, fresh assertion; None for anything else (forged, altered, expired)."""
        try:
            return self._signer.unsign(assertion, max_age=max_age_s).decode("utf-8")
        except (BadSignature, UnicodeDecodeError):
            return None


class PrincipalVoucher(Voucher):
    """Signs and checks a principal (name and role name) for another service's API: the journal vouches for a
    person signed in with the provider to the trigger-gateway (``TEMPORALITY_API_VOUCH_SECRET_FILE``)."""

    SALT = _PRINCIPAL_SALT

    def vouch_principal(self, name: str, role: str) -> str:
        """An assertion that the caller is ``name`` with ``role``, valid for :data:`MAX_AGE_S` seconds."""
        return self.vouch(json.dumps({"name": name, "role": role}, separators=(",", ":")))

    def vouched_principal(self, assertion: str, max_age_s: int = MAX_AGE_S) -> tuple[str, str] | None:
        """(name, role name) of a valid, fresh assertion; None for anything else."""
        payload = self.vouched(assertion, max_age_s)
        if payload is None:
            return None
        try:
            parsed = json.loads(payload)
        except ValueError:
            return None
        name, role = (parsed.get("name"), parsed.get("role")) if isinstance(parsed, dict) else (None, None)
        return (name, role) if isinstance(name, str) and name and isinstance(role, str) else None
