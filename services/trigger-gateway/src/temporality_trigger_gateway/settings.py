"""trigger-gateway settings (``TEMPORALITY_GATEWAY_*``); bad environment fails before connecting."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from temporality_service import HttpServiceSettings
from temporality_service.limits import DEFAULT_FAILURE_WINDOW_S, DEFAULT_MAX_FAILURES_PER_ADDRESS

__all__ = ["Settings"]


class Settings(HttpServiceSettings):
    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_GATEWAY_", extra="ignore")

    #: ``0`` picks a free port (tests, benchmarks); the bound URL is logged (``service.ready``).
    port: int | None = Field(default=8080, ge=0, le=65535)
    #: Seeds the trigger store at start (create-if-absent); the store is the truth afterwards (docs/triggers.md).
    triggers_file: Path = Path("config/triggers.yaml")
    #: The run-executor's agent cards (only ``agents[].id`` is read): a trigger naming another agent is
    #: refused. Unset: ``agents.yaml`` beside the triggers file, and when that is absent agents are not checked.
    agents_file: Path | None = None
    #: Larger webhook bodies are refused with 413, by Content-Length or by the size actually streamed.
    max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    #: Seconds a sender is told to wait (``Retry-After``) when NATS is unavailable (503).
    retry_after_s: int = Field(default=10, ge=1)
    #: A webhook delivery is answered within this many seconds: when the bus stalls longer (a JetStream round
    #: waits up to 10 s), 503 with ``Retry-After``, well within GitHub's and GitLab's 10 s delivery timeout; the
    #: delivery's handling goes on and a retry gets its outcome or a duplicate (docs/operations.md).
    intake_timeout_s: float = Field(default=5.0, gt=0, le=60)
    #: A dedupe claim older than this whose delivery never reported ``run.requested`` published is taken
    #: over by a redelivery, which publishes the same derived ids (the claimant's process died).
    claim_lease_s: float = Field(default=10.0, gt=0, le=300)
    #: Event triggers (TRG-6 anti-loop): the deepest chain of event-trigger launches. ``1``: an event of a run
    #: an event trigger started never fires an event trigger; past it, ``trigger.rejected(loop_limit)``.
    event_max_depth: int = Field(default=1, ge=1, le=20)
    #: How often (seconds) each replica checks that every enabled schedule trigger has its next tick armed, and
    #: arms the ones that have none (a failed arm, a tick dead-lettered): one ``STREAM.INFO`` per check.
    schedule_check_s: float = Field(default=60.0, ge=1, le=3600)
    #: Failed webhook authentications of one trigger from one client address, and deliveries to unknown trigger ids
    #: from one client address, within the window; past it 429 ``too_many_failures`` with ``Retry-After``
    #: (:mod:`temporality_trigger_gateway.failures`). A sender with the right credentials never counts.
    webhook_max_failures: int = Field(default=DEFAULT_MAX_FAILURES_PER_ADDRESS, ge=1, le=1_000_000)
    #: The window of that limit, in seconds (each replica counts its own, in memory).
    webhook_failure_window_s: float = Field(default=DEFAULT_FAILURE_WINDOW_S, gt=0, le=86_400)
