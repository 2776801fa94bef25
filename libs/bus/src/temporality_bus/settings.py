"""The NATS connection settings (pydantic-settings: bad env fails before connecting)."""

from __future__ import annotations

import ssl
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from temporality_bus.provenance import SourceCheck
from temporality_protocol.catalog import DLQ_STREAM
from temporality_protocol.jetstream import DOMAIN_PATTERN, api_prefix

__all__ = ["NatsSettings"]


class NatsSettings(BaseSettings):
    """``TEMPORALITY_NATS_*``."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_NATS_", extra="ignore")

    url: str = Field(default="nats://127.0.0.1:4222", description="Comma-separated server URLs")
    #: The service's own NATS user (SEC-1: each service has its own, with the permissions its catalogue
    #: entry implies, see ``temporality_protocol.permissions``). Unset: connect without authentication.
    user: str | None = None
    password: SecretStr | None = None
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

    @field_validator("jetstream_domain", mode="before")
    @classmethod
    def _no_domain_when_empty(cls, value: object) -> object:
        return None if value == "" else value  # compose's ${TEMPORALITY_NATS_JETSTREAM_DOMAIN:-}: unset

    @model_validator(mode="after")
    def _tls_pairs(self) -> NatsSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("TEMPORALITY_NATS_TLS_CERT_FILE and _TLS_KEY_FILE go together")
        if self.password is not None and self.user is None:
            raise ValueError("TEMPORALITY_NATS_PASSWORD needs TEMPORALITY_NATS_USER")
        return self

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
