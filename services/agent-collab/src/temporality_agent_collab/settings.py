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
    #: Agent Protocol requests one external agent may send a second (per replica), sustained; a request over it is
    #: refused ``rate_limited`` with ``retry_after_s``. 0: no limit.
    agent_rate_per_s: float = Field(default=20.0, ge=0)
    #: Requests an agent may send at once before the rate applies (the bucket's size).
    agent_rate_burst: int = Field(default=100, ge=1)
    #: The window of the journal's limits (seconds): refusals per agent and reason journaled one by one, then a total.
    audit_window_s: int = Field(default=60, ge=1, le=3600)
    #: Refusals of one agent and reason journaled one by one per window; the rest as one total when it ends.
    refusals_journaled: int = Field(default=10, ge=1)
    #: An agent's own lifecycle moves (a heartbeat reporting another working state, a re-registration changing
    #: nothing it is granted) are journaled at most once per this many seconds; the registry stays exact. 0: all.
    lifecycle_coalesce_s: float = Field(default=30.0, ge=0, le=3600)
