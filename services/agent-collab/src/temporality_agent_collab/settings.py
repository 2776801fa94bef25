"""agent-collab's settings: ``TEMPORALITY_COLLAB_*`` plus the shared NATS, log and process settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from temporality_service import ServiceSettings

__all__ = ["Settings"]


class Settings(ServiceSettings):
    """A worker. ``TEMPORALITY_COLLAB_PORT`` (unset: none) serves ``/healthz`` and ``/readyz`` for probes and the
    operator API (``/agents``, role tokens from ``TEMPORALITY_API_TOKENS_FILE``)."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_COLLAB_", extra="ignore")

    #: Events the projector handles concurrently (CAS keeps concurrent updates of one saga correct).
    max_inflight: int = Field(default=8, ge=1)
    #: The allow-list of external agents (AP-3); unset: ``config/external-agents.yaml`` if it exists, else none.
    external_agents_file: Path | None = None
    #: An external agent goes offline this long after its heartbeat interval passed without one (AP-4).
    heartbeat_grace_s: float = Field(default=2.0, ge=0)
    #: A signed message is accepted only if its ``Temporality-Timestamp`` is at most this far from our clock
    #: (AP-11); at most 300 s, half the TTL of the nonce bucket that catches replays within the window.
    signature_window_s: float = Field(default=120.0, gt=0, le=300)
    #: How long a registered agent has to answer the probes of a conformance round (PRO-2); the deadline is a
    #: durable timer (whole seconds), a later answer is ``late``.
    conformance_timeout_s: float = Field(default=10.0, gt=0, le=300)
    #: agent-collab's own Ed25519 private key (PEM, PKCS#8, unencrypted): every reply to an external agent is
    #: signed with it (AP-11); unset: replies go unsigned. Agents check them with its public key.
    reply_key_file: Path | None = None
    #: The key id agent-collab's signed replies carry (``Temporality-Key-Id``).
    reply_key_id: str = Field(default="agent-collab", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
