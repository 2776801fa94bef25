"""run-executor settings (``TEMPORALITY_EXECUTOR_*``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from temporality_protocol.redaction import REDACT_PATTERNS_ENV
from temporality_run_executor.retention import DEFAULT_RETENTION_S, MAX_RETENTION_S
from temporality_run_executor.watchdog import DEFAULT_GRACE_S
from temporality_service import ServiceSettings

__all__ = ["Settings"]


class Settings(ServiceSettings):
    """A worker. ``TEMPORALITY_EXECUTOR_PORT`` (unset: no HTTP server) serves ``/healthz``, ``/readyz`` and
    ``/metrics`` for probes, and the read-only agent cards API (``GET /agents``, role tokens: :mod:`.api`)."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_EXECUTOR_", extra="ignore")

    agents_file: Path = Path("config/agents.yaml")
    #: Messages (runs) handled concurrently by each of this replica's consumers (a waiting run occupies nothing).
    #: A handler spends most of its time waiting on the bus or the provider, so many in flight overlap those
    #: waits and share the bus round trips (``bench/parked_runs.py``: 8 -> 64 about doubled the resume rate).
    max_inflight: int = Field(default=64, ge=1)
    #: Seconds the scripted provider "thinks" per turn, standing in for LLM latency (demos, crash tests).
    scripted_think_s: float = Field(default=0.0, ge=0)
    #: CRASH TESTS ONLY: the scripted provider kills its own process (``os._exit(137)``, as the OOM killer
    #: would) whenever the last message of the conversation contains this text -- one input that takes
    #: the executor down on every attempt. Unset (the default) it never does; other providers ignore it.
    scripted_crash_on: str | None = Field(default=None, min_length=1)
    #: Deliveries of a run's message (``run.requested``, ``human.*``) before it is dead-lettered and the run
    #: failed (``infrastructure_error``); unset: the catalogue's (8).
    max_deliver: int | None = Field(default=None, ge=1)
    #: Seconds past its compute limit (``max_compute_s``) a run may sit in ``running``/``resuming`` without
    #: progress before the watchdog fails it (``stalled``). Keep it above ``ack_wait`` plus the longest
    #: retry backoff (30 s), which re-arm the watchdog on every attempt.
    watchdog_grace_s: float = Field(default=DEFAULT_GRACE_S, gt=0)
    #: Seconds a finished run's checkpoint (its conversation, tool results, mail) stays in KV after the run
    #: ended (completed, failed, cancelled): 3 days, so a run that failed on a Friday evening can still be
    #: looked into on Monday. 0: removed as soon as the run ends. The run record stays whatever this is (a
    #: replayed ``run.requested`` stays a duplicate); see :mod:`.retention`.
    checkpoint_retention_s: float = Field(default=DEFAULT_RETENTION_S, ge=0, le=MAX_RETENTION_S)
    #: Seconds an MCP server's live session may sit without a call before the server is stopped (the next
    #: call starts it again); see :mod:`.mcp_servers`.
    mcp_idle_s: float = Field(default=300.0, gt=0)
    #: Calls in flight at once on one MCP server's session (more wait for a free slot).
    mcp_max_calls: int = Field(default=4, ge=1)
    #: The deployment's own redaction patterns (SEC-1), JSON ``{"<kind>": "<regex>"}``: every ``human.requested``
    #: and ``human.notify_requested`` the executor publishes passes through them and the built-in ones. The
    #: variable human-interaction reads too (``TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS``); unusable: exit 2.
    redact_patterns: str = Field(default="", validation_alias=REDACT_PATTERNS_ENV)
