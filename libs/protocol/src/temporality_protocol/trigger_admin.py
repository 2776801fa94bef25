"""The answers of the trigger-gateway's admin API (``/triggers...`` and ``/adapters``, TRG-1) as pydantic models: the gateway
declares them as its OpenAPI response bodies, and the journal, which proxies those routes for the console
(``/gateway/triggers...``), declares the same bodies in its own document (``Gateway``-prefixed there: the
journal has a ``TriggerView`` of its own). Here, not in the gateway, so the journal need not import it.

Only documentation and tests validate against them: the gateway builds its answers itself and the journal
forwards the gateway's bytes unchanged.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = [
    "AdapterList",
    "AdapterView",
    "DeliveryPage",
    "DeliveryState",
    "DeliveryView",
    "PreviewAnswer",
    "PreviewFieldError",
    "PreviewIgnored",
    "RedriveAnswer",
    "TriggerList",
    "TriggerView",
]

DeliveryState = Literal["received", "accepted", "rejected", "failed", "queued", "debounced"]


class DeliveryView(BaseModel):
    """A delivery as the deliveries API shows it (documents :meth:`DeliveryRecord.view`: the record's fields
    but ``event``, plus ``has_event``; a test keeps the two in step)."""

    trigger_id: str
    delivery_id: str
    kind: Literal["webhook", "event", "schedule"]
    adapter: str = Field(description="The source adapter, or schedule / event")
    source_event_id: str | None
    source_event_type: str | None
    body_bytes: int
    depth: int
    causation_id: str | None
    correlation_id: str | None
    state: DeliveryState
    reason: str | None = Field(description="rejected / failed: why (duplicate, disabled, filtered ...)")
    detail: str | None
    run_id: str | None
    title: str | None
    received_at: datetime
    updated_at: datetime
    event_omitted: bool = Field(description="The normalized event was too large to keep")
    redrive_of: str | None = Field(description="A re-drive: the delivery it re-runs")
    redriven_as: list[str] = Field(description="The re-drives (and reruns) made of this delivery")
    rerun: int | None = Field(
        description="A rerun: its number among the reruns of the delivery it runs again (redrive_of); its run is new"
    )
    rerun_of: str | None = Field(description="A rerun: the run of the delivery it runs again")
    has_event: bool = Field(description="The normalized event is kept: the delivery can be re-driven")


# ---------------------------------------------------------------- answers (documented: the OpenAPI response bodies)
class TriggerView(BaseModel):
    """One stored trigger as the API shows it (the answer of a read, create, replace, enable and disable)."""

    trigger: dict[str, Any] = Field(
        description="Every field of the trigger, defaults included, as validated (a stored trigger that no longer "
        "validates: its fields as stored, and problem says why). Literal secrets never appear (write_only_set)."
    )
    revision: int = Field(description="The store revision (the ETag); If-Match takes it")
    origin: Literal["file", "api"]
    updated_by: str = Field(description="The token name, or user:<id>, of the last change (file: the triggers file)")
    updated_at: datetime
    served: bool = Field(description="Whether this replica serves this revision")
    problem: str | None = Field(description="Why the stored trigger is not served, if it is not")
    write_only_set: list[str] = Field(description="The literal secrets set (auth.password ...), never returned")


class TriggerList(BaseModel):
    triggers: list[TriggerView]


class DeliveryPage(BaseModel):
    """A page of a trigger's deliveries, newest first."""

    deliveries: list[DeliveryView]
    next_cursor: str | None = Field(description="Pass as cursor for the next page; null: this is the last")


class PreviewIgnored(BaseModel):
    reason: Literal["disabled", "unsupported_event", "filtered", "test_notification"]
    detail: str


class RedriveAnswer(BaseModel):
    """The re-drive's delivery and its outcome, as the webhook answers a delivery (202 when a run starts,
    is queued or debounced; 200 otherwise)."""

    redrive_of: str = Field(description="The delivery re-driven (or rerun)")
    delivery_id: str = Field(description="The re-drive's own delivery")
    rerun: int | None = Field(None, description='A rerun ({"rerun": n}): its number')
    rerun_of: str | None = Field(None, description="A rerun: the run it runs again (run_id is the new run)")
    status: Literal["accepted", "duplicate", "queued", "debounced", "skipped", "ignored"]
    run_id: str | None = None
    superseded_run_id: str | None = None
    position: int | None = None
    active_run_id: str | None = None
    until: datetime | None = None
    reason: str | None = None
    detail: str | None = None


class PreviewFieldError(BaseModel):
    field: str
    message: str


class PreviewAnswer(BaseModel):
    """What the gateway would make of the sample: the normalized event, the agent input, whether a run starts
    (``ok``), or the stage that failed and why (``ok: false``)."""

    ok: bool
    stage: Literal["trigger", "payload", "mapping"] | None = Field(None, description="ok false: what failed")
    errors: list[PreviewFieldError] | None = Field(None, description="ok false: each wrong field")
    matches: bool | None = Field(None, description="Whether the trigger's when filter lets the event through")
    source_event: dict[str, Any] | None = Field(None, description="The source's event id and type")
    event: dict[str, Any] | None = Field(None, description="The normalized event")
    input: Any = Field(None, description="The agent input the trigger's mapping makes of the event")
    run_id: str | None = None
    title: str | None = None
    would_start_run: bool | None = None
    ignored: PreviewIgnored | None = Field(None, description="would_start_run false: why")


class AdapterView(BaseModel):
    """One webhook source (a trigger's ``adapter``), as the gateway serves it."""

    name: str = Field(description="What a webhook trigger's adapter names (azure_devops.pull_request, github, …)")
    description: str = Field(description="One line: what sends it")
    auth_types: list[str] = Field(
        description="The auth.type values that authenticate it besides none (always accepted, unauthenticated), "
        "the recommended first"
    )
    event_types: list[str] | None = Field(
        description="The event types it knows, sorted (what a trigger's events may list); null: any type the "
        "sender names (generic)"
    )


class AdapterList(BaseModel):
    adapters: list[AdapterView]
