"""The mapping preview (``POST /triggers/preview``): what a trigger would make of a sample delivery.

Request body::

    {"trigger": {...a draft, as for POST /triggers...}   # or
     "trigger_id": "ado-pr-review",                     # a stored trigger
     "payload": {...the sample body...},
     "headers": {"X-GitHub-Event": "pull_request", ...}} # optional: sources that read headers

Answer (200 whenever the request itself is well formed)::

    {"ok": true, "would_start_run": true, "matches": true, "source_event": {"id", "type"},
     "event": {...the normalized event (TRG-4)...}, "input": {...the agent input (TRG-8)...},
     "run_id": "run-…", "title": "…"}
    {"ok": true, "would_start_run": false, "ignored": {"reason": "unsupported_event", "detail": "…"}, ...}
    (``ignored.reason``: ``disabled``, ``unsupported_event``, ``filtered``, or ``test_notification`` -- the
    sender's own sample, e.g. Azure DevOps' *Test* button: ``event`` is null)
    (an ignored event -- a GitHub ping, a disabled trigger -- is answered so whatever its shape, as live:
    then ``event`` is null when the source cannot normalize it)
    {"ok": true, "would_start_run": false, "matches": false, "ignored": {"reason": "filtered", ...}, ...}

``matches``: whether the trigger's condition (``when``; an event trigger's ``filter`` too) holds for the
sample. The mapping is applied either way, so a draft's input can be checked on a sample it filters.
    {"ok": false, "stage": "trigger" | "payload" | "mapping", "errors": [{"field", "message"}]}

A sample without its source's delivery id header (GitHub's ``X-GitHub-Delivery``, GitLab's
``X-Gitlab-Event-UUID``) is previewed with :data:`PREVIEW_DELIVERY_ID`, and ``source_event.note`` says so.

Nothing is started, published or stored, and the sender's authentication is not checked: the preview
validates a draft as a save would, except that ``*_env`` variables need not be set in the gateway's
environment. ``webhook`` and ``event`` triggers can be previewed; for an ``event`` trigger ``payload`` is
a sample CloudEvent (structured JSON, as on the bus: ``id``, ``source``, ``type``, ``time``, ``data``,
``actor``, ``tenant``, ``runid``...) and ``headers`` are not used. The preview does not check the
trigger's activation or the loop rule (they depend on the journal).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import httpx
from pydantic import ValidationError

from temporality_protocol import Envelope, run_id_for_delivery
from temporality_service import Unprocessable
from temporality_service.wording import listed
from temporality_trigger_gateway.adapters import ADAPTERS, WebhookRequest
from temporality_trigger_gateway.errors import InvalidPayload
from temporality_trigger_gateway.events import normalize, run_title
from temporality_trigger_gateway.mapping import MappingFailed
from temporality_trigger_gateway.store import TriggerRegistry, TriggerStore, validate_spec
from temporality_trigger_gateway.triggers import EventTrigger, WebhookTrigger, field_errors

__all__ = ["run_preview"]

#: The delivery id a sample without its source's delivery id header is previewed with.
PREVIEW_DELIVERY_ID = "00000000-0000-4000-8000-000000000000"
#: Stands in for every ``*_env`` secret in a preview (valid for every verifier, base64 included).
_PLACEHOLDER = "cHJldmlldy1wbGFjZWhvbGRlci1zZWNyZXQ="
_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_KEYS = frozenset({"trigger", "trigger_id", "payload", "headers"})


class _AnyEnviron(Mapping[str, str]):
    """An environment in which every variable is set (the preview does not check secrets)."""

    def __getitem__(self, key: str) -> str:
        return _PLACEHOLDER

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def get(self, key: str, default: Any = None) -> Any:
        return _PLACEHOLDER


def _failed(stage: str, errors: list[dict[str, str]]) -> dict[str, Any]:
    return {"ok": False, "stage": stage, "errors": errors}


async def run_preview(
    body: Any,
    registry: TriggerRegistry,
    store: TriggerStore,
    io: Callable[[Awaitable[Any]], Awaitable[Any]],
) -> dict[str, Any]:
    """The preview's answer for ``body`` (see the module docstring); ``io`` maps bus errors to 503."""
    if not isinstance(body, dict):
        raise Unprocessable("the preview body is a JSON object with trigger or trigger_id, and payload")
    unknown = sorted(set(body) - _KEYS)
    if unknown:
        raise Unprocessable(f"unknown key(s) {listed([k[:40] for k in unknown])}; use {', '.join(sorted(_KEYS))}")
    if ("trigger" in body) == ("trigger_id" in body):
        raise Unprocessable("give exactly one of trigger (a draft) or trigger_id (a stored trigger)")
    if "payload" not in body:
        raise Unprocessable("payload (the sample delivery's JSON body) is required")
    headers = body.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k.isascii() and v.isascii() and 0 < len(k) <= 256
        for k, v in headers.items()
    ):
        raise Unprocessable("headers is an object of ASCII header names to ASCII string values")

    if "trigger_id" in body:
        trigger_id = body["trigger_id"]
        valid_id = isinstance(trigger_id, str) and _ID.fullmatch(trigger_id) is not None
        found = await io(store.get(trigger_id)) if valid_id else None
        if found is None:
            return _failed("trigger", [{"field": "trigger_id", "message": "no stored trigger has this id"}])
        spec: Any = found.value.spec
    else:
        spec = body["trigger"]
    if not isinstance(spec, dict):
        return _failed("trigger", [{"field": "trigger", "message": "a trigger is a JSON object"}])
    try:  # a draft is checked as its creation would be (a reserved id refused)
        trigger = validate_spec(spec, environ=_AnyEnviron(), agents=registry.agents, new="trigger" in body)
    except ValidationError as exc:
        return _failed("trigger", field_errors(exc, spec))
    if isinstance(trigger, EventTrigger):
        return _preview_event(trigger, body["payload"])
    if not isinstance(trigger, WebhookTrigger):
        message = f"only webhook and event triggers can be previewed, not {trigger.type} triggers"
        return _failed("trigger", [{"field": "type", "message": message}])

    payload = body["payload"]
    adapter = ADAPTERS[trigger.adapter]
    sent = httpx.Headers(headers)
    notes: list[str] = []
    id_headers = adapter.delivery_id_headers
    if id_headers and not any(sent.get(h) for h in id_headers):
        # A sample copied from a sender's docs rarely has its delivery id header; the live sender always sends one.
        sent[id_headers[0]] = PREVIEW_DELIVERY_ID
        notes.append(
            f"the sample has no {' or '.join(id_headers)} header: the preview used {PREVIEW_DELIVERY_ID!r}"
            " (a live delivery without one is refused 422)"
        )
    request = WebhookRequest("POST", sent, json.dumps(payload).encode(), payload)
    try:
        source = adapter.identify(request)
    except InvalidPayload as exc:
        return _noted(_payload_failed(exc), notes)
    test = adapter.test_notification(request)
    if test is not None:  # answered before anything else, as live (intake): never a run, whatever the trigger
        sample: dict[str, Any] = {"ok": True, "source_event": source.model_dump(mode="json"), "event": None}
        why = {"reason": "test_notification", "detail": f"{test}: a live delivery is answered 200 ignored"}
        return _noted({**sample, "would_start_run": False, "ignored": why}, notes)
    unsupported = None
    if source.type not in trigger.events:
        unsupported = f"the trigger does not handle {source.type!r} events (its events: {', '.join(trigger.events)})"
    try:
        event = adapter.normalize(request, tenant=trigger.tenant)
    except InvalidPayload as exc:
        if trigger.enabled and unsupported is None:
            return _noted(_payload_failed(exc), notes)
        # Live, an ignored event (a GitHub ping, a disabled trigger) is answered 200 ignored whatever its shape.
        ignored = {"ok": True, "source_event": source.model_dump(mode="json"), "event": None}
        return _noted(_verdict(ignored, enabled=trigger.enabled, unsupported=unsupported, filtered=None), notes)
    try:
        filtered = trigger.filtered(event)
        mapped = trigger.agent_input(event)
    except MappingFailed as exc:
        return _failed("mapping", [{"field": exc.where, "message": str(exc)}])
    answer: dict[str, Any] = {
        "ok": True,
        "matches": filtered is None,
        "source_event": source.model_dump(mode="json"),
        "event": event.model_dump(mode="json"),
        "input": mapped,
        "run_id": run_id_for_delivery(trigger.id, event.id),
        "title": adapter.run_title(event)[:200],
    }
    return _noted(_verdict(answer, enabled=trigger.enabled, unsupported=unsupported, filtered=filtered), notes)


def _payload_failed(exc: InvalidPayload) -> dict[str, Any]:
    errors = [
        {"field": ".".join(str(p) for p in e.get("loc", ())) or "<body>", "message": str(e.get("msg", ""))[:500]}
        for e in exc.errors[:50]
    ]
    return _failed("payload", errors or [{"field": "<body>", "message": exc.detail}])


def _noted(answer: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """``answer`` saying what the preview supplied that a live delivery carries itself: ``source_event.note``
    (the answer's documented shape has no other place for it)."""
    source_event = answer.get("source_event")
    if not notes or not isinstance(source_event, dict):
        return answer
    return {**answer, "source_event": {**source_event, "note": "; ".join(notes)}}


def _verdict(answer: dict[str, Any], *, enabled: bool, unsupported: str | None, filtered: str | None) -> dict[str, Any]:
    """``answer`` with ``would_start_run``, and ``ignored`` saying why not (in the order the gateway decides)."""
    if not enabled:
        ignored = {"reason": "disabled", "detail": "the trigger is disabled"}
    elif unsupported is not None:
        ignored = {"reason": "unsupported_event", "detail": unsupported}
    elif filtered is not None:
        ignored = {"reason": "filtered", "detail": filtered}
    else:
        return {**answer, "would_start_run": True}
    return {**answer, "would_start_run": False, "ignored": ignored}


@functools.cache
def _envelope_schema() -> dict[str, Any]:
    """A CloudEvent's JSON schema: an unknown key of a sample is named with the keys it may have."""
    return Envelope.model_json_schema()


def _preview_event(trigger: EventTrigger, sample: Any) -> dict[str, Any]:
    """An event trigger's preview: ``payload`` is a sample CloudEvent (structured JSON, as on the bus)."""
    if not isinstance(sample, dict):
        return _failed("payload", [{"field": "<body>", "message": "an event trigger's sample is a CloudEvent object"}])
    try:
        envelope = Envelope.model_validate(sample)
    except ValidationError as exc:
        return _failed("payload", field_errors(exc, sample, _envelope_schema()))
    event = normalize(envelope, tenant=trigger.tenant)
    try:
        filtered = trigger.filtered(event)
        mapped = trigger.agent_input(event)
    except MappingFailed as exc:
        return _failed("mapping", [{"field": exc.where, "message": str(exc)}])
    answer: dict[str, Any] = {
        "ok": True,
        "matches": filtered is None,
        "source_event": {"id": envelope.id, "type": envelope.type},
        "event": event.model_dump(mode="json"),
        "input": mapped,
        "run_id": run_id_for_delivery(trigger.id, envelope.id),
        "title": run_title(trigger, event),
    }
    unsupported = None
    if envelope.type not in trigger.event_types:
        listed = ", ".join(trigger.event_types)
        unsupported = f"the trigger does not listen to {envelope.type!r} (its event_type: {listed})"
    return _verdict(answer, enabled=trigger.enabled, unsupported=unsupported, filtered=filtered)
