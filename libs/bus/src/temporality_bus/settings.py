"""The NATS connection settings (pydantic-settings: bad env fails before connecting)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, Literal

import nkeys  # type: ignore[import-untyped]
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from temporality_bus.provenance import SourceCheck
from temporality_protocol.catalog import DLQ_STREAM
from temporality_protocol.jetstream import DOMAIN_PATTERN, api_prefix

__all__ = ["NatsAuth", "NatsCredentialsError", "NatsSettings", "check_creds_file", "check_nkey_seed_file"]

#: How a connection authenticates to NATS (:attr:`NatsSettings.auth`).
NatsAuth = Literal["none", "password", "creds", "nkey"]

_CREDS_JWT = b"BEGIN NATS USER JWT"
_CREDS_SEED = b"BEGIN USER NKEY SEED"


class NatsCredentialsError(ValueError):
    """A credentials or nkey seed file that cannot be used (its content never in the message)."""


def _user_seed(seed: bytes, what: str) -> None:
    """Raise :class:`NatsCredentialsError` unless ``seed`` is a user nkey's seed (``SU...``)."""
    try:
        prefix, _raw = nkeys.decode_seed(bytearray(seed))
    except (nkeys.NkeysError, ValueError, TypeError):
        raise NatsCredentialsError(f"{what} holds no valid nkey seed") from None
    if prefix != nkeys.PREFIX_BYTE_USER:
        raise NatsCredentialsError(f"{what} holds the seed of an nkey that is not a user's (a user's starts with SU)")


def _read(path: Path, setting: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise NatsCredentialsError(f"{setting} {path}: cannot read it ({exc.strerror or exc})") from None


def check_creds_file(path: Path, setting: str = "TEMPORALITY_NATS_CREDS_FILE") -> None:
    """Raise :class:`NatsCredentialsError` unless ``path`` is a NATS credentials file nats-py can use: a user JWT
    (``-----BEGIN NATS USER JWT-----`` and the JWT on the next line) and a user nkey seed (``-----BEGIN USER NKEY
    SEED-----`` and the seed on the next line), as ``nsc generate creds`` writes it. (nats-py itself would wait
    forever for a JWT line a file does not have.)"""
    lines = _read(path, setting).splitlines()
    what = f"{setting} {path}"
    found: dict[bytes, bytes] = {}
    for index, line in enumerate(lines):
        for marker in (_CREDS_JWT, _CREDS_SEED):
            if marker in line and index + 1 < len(lines):
                found.setdefault(marker, lines[index + 1].strip())
    jwt = found.get(_CREDS_JWT, b"")
    if jwt.count(b".") != 2:
        raise NatsCredentialsError(
            f"{what}: not a NATS credentials file (no user JWT after -----BEGIN NATS USER JWT-----)"
        )
    if _CREDS_SEED not in found:
        raise NatsCredentialsError(f"{what}: not a NATS credentials file (no -----BEGIN USER NKEY SEED----- block)")
    _user_seed(found[_CREDS_SEED], what)


def check_nkey_seed_file(path: Path, setting: str = "TEMPORALITY_NATS_NKEY_SEED_FILE") -> None:
    """Raise :class:`NatsCredentialsError` unless ``path`` holds a user nkey's seed (``SU...``, as ``nk -gen user``
    writes it; surrounding white space is ignored, as nats-py does)."""
    _user_seed(_read(path, setting).strip(), f"{setting} {path}")


class NatsSettings(BaseSettings):
    """``TEMPORALITY_NATS_*``."""

    #: hide_input_in_errors: a refused setting's error (logged as settings.invalid) never shows the password
    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_NATS_", extra="ignore", hide_input_in_errors=True)

    url: str = Field(default="nats://127.0.0.1:4222", description="Comma-separated server URLs")
    #: The service's own NATS user (SEC-1: each service has its own, with the permissions its catalogue
    #: entry implies, see ``temporality_protocol.permissions``). Unset: connect without authentication.
    user: str | None = None
    password: SecretStr | None = None
    #: Instead of a user and password: a NATS credentials file (``.creds``, the user's JWT and nkey seed, as
    #: ``nsc generate creds`` writes it) for a server in operator (JWT) mode -- a corporate NATS whose accounts
    #: an operator manages. nats-py reads it at every (re)connect, so a rotated file is used from the next one.
    creds_file: Path | None = None
    #: Instead of a user and password: a file holding a user nkey's seed (``SU...``) for a server whose
    #: ``authorization`` lists that user by its public nkey (``U...``): the client proves it holds the key by
    #: signing the server's nonce; no secret crosses the wire.
    nkey_seed_file: Path | None = None
    #: TLS to NATS: the CA that signed the server's certificate (set: the connection must be TLS and the
    #: server's certificate must verify against it, host name included).
    tls_ca_file: Path | None = None
    #: A client certificate and key, for servers that require mutual TLS (``verify: true``).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    connect_timeout_s: float = 5.0
    max_reconnect_attempts: int = -1  # forever
    reconnect_wait_s: float = 1.0
    #: Well below Kubernetes' 30 s grace period (see notes: the drain gotcha).
    drain_timeout_s: float = 10.0
    #: How often the client pings the server, and how many pings may go unanswered before the connection is
    #: taken as lost (then ``/readyz`` says ``disconnected`` and the client reconnects). nats-py's defaults
    #: (120 s, 2) noticed a server that stopped answering without closing the connection (a frozen process, a
    #: network path dropping packets) only after ~4-6 minutes; 20 s and 3 take about a minute.
    ping_interval_s: float = Field(default=20.0, gt=0)
    max_outstanding_pings: int = Field(default=3, ge=1)
    #: How long a consumer waits for an ack before redelivering; in-progress pings extend it.
    ack_wait_s: float = 30.0
    #: Copies of every stream and KV bucket the services create (``Bus.ensure``): 1 on a single server,
    #: 3 on a 3-node JetStream cluster (a node can fail without losing an accepted event). An existing
    #: stream is scaled to this at its owner's next start (the shared streams: the journal's; a bucket: its
    #: owner's, ``ServiceSpec.streams`` / ``buckets``). Consumers follow their stream. Set it on every service.
    stream_replicas: int = Field(default=1, ge=1, le=5)
    #: How long the events stream keeps an event (days; 0: forever). The journal's database keeps the
    #: history for people; the stream only has to outlive any consumer's lag and the rebuild you want to be
    #: able to do. Only the stream's owner, the journal, applies it (it creates and updates the shared
    #: streams at start; the other services may only read their info).
    events_max_age_days: float = Field(default=0, ge=0)
    #: How long the dead-letter stream keeps a dead letter (days; 0: forever), for an operator to look into and
    #: re-drive; ``bus.dead_lettered`` in the journal keeps the record. Applied by the stream's owner, the journal.
    dlq_max_age_days: float = Field(default=DLQ_STREAM.max_age_s / (24 * 3600), ge=0)
    #: How every consumer checks an event's claimed sender against the catalogue's senders of its type
    #: (SEC-1, AP-11): ``strict`` (the source must be a sending service's), ``claimed`` (only a source or
    #: ``service:`` actor naming a catalogue service is checked: for tests that publish as no service) or
    #: ``off``; a forged event is dead-lettered, never handled (:mod:`temporality_bus.provenance`).
    source_check: SourceCheck = "strict"
    #: The JetStream domain the streams and buckets live in (``jetstream { domain: hub }`` of the server that
    #: holds them; a service on a leaf node reaches the hub's JetStream through it). Unset: the JetStream of the
    #: server the service is connected to (``$JS.API``). Set: every API request goes to ``$JS.<domain>.API``
    #: and every KV write to ``$JS.<domain>.API.$KV...`` (:mod:`temporality_protocol.jetstream`); the NATS
    #: permissions must be generated for it (``temporality nats-authorization --jetstream-domain``).
    jetstream_domain: str | None = Field(default=None, pattern=f"^{DOMAIN_PATTERN.pattern}$")

    @field_validator("jetstream_domain", "creds_file", "nkey_seed_file", mode="before")
    @classmethod
    def _none_when_empty(cls, value: object) -> object:
        return None if value == "" else value  # compose's ${TEMPORALITY_NATS_JETSTREAM_DOMAIN:-}: unset

    @model_validator(mode="after")
    def _tls_pairs(self) -> NatsSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("TEMPORALITY_NATS_TLS_CERT_FILE and _TLS_KEY_FILE go together")
        if self.password is not None and self.user is None:
            raise ValueError("TEMPORALITY_NATS_PASSWORD needs TEMPORALITY_NATS_USER")
        ways = [
            name
            for name, given in (
                ("TEMPORALITY_NATS_USER/_PASSWORD", self.user is not None),
                ("TEMPORALITY_NATS_CREDS_FILE", self.creds_file is not None),
                ("TEMPORALITY_NATS_NKEY_SEED_FILE", self.nkey_seed_file is not None),
            )
            if given
        ]
        if len(ways) > 1:
            raise ValueError(
                f"{', '.join(ways[:-1])} and {ways[-1]} are {'both' if len(ways) == 2 else 'all'} set: they are "
                "different ways to authenticate to NATS, set only one (a credentials file for a server in "
                "operator/JWT mode, an nkey seed file for a user listed by its public nkey, a user and password "
                "otherwise)"
            )
        if self.creds_file is not None:
            check_creds_file(self.creds_file)
        if self.nkey_seed_file is not None:
            check_nkey_seed_file(self.nkey_seed_file)
        return self

    @property
    def auth(self) -> NatsAuth:
        """How the connection authenticates: a user and password, a credentials file, an nkey seed file, or not."""
        if self.creds_file is not None:
            return "creds"
        if self.nkey_seed_file is not None:
            return "nkey"
        return "password" if self.user is not None else "none"

    def auth_options(self) -> dict[str, Any]:
        """nats-py's ``connect()`` arguments for :attr:`auth` (every connection of the services and tools takes them
        from here: :meth:`temporality_bus.Bus.connect`)."""
        if self.creds_file is not None:
            return {"user_credentials": str(self.creds_file)}
        if self.nkey_seed_file is not None:
            return {"nkeys_seed": str(self.nkey_seed_file)}
        return {
            "user": self.user,
            "password": self.password.get_secret_value() if self.password is not None else None,
        }

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for the connection, or ``None`` for plain TCP (no TLS setting given)."""
        if self.tls_ca_file is None and self.tls_cert_file is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca_file)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.tls_cert_file is not None and self.tls_key_file is not None:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        return context

    @property
    def js_api_prefix(self) -> str:
        """Where this deployment's JetStream API is: ``$JS.API``, or ``$JS.<domain>.API`` with a domain."""
        return api_prefix(self.jetstream_domain)

    @property
    def servers(self) -> list[str]:
        return [u.strip() for u in self.url.split(",") if u.strip()]
