"""The trigger admin API (TRG-1): ``/triggers`` over the trigger store, with role tokens.

=====================================  ========  ==================================================
``GET /triggers``                      viewer    every stored trigger (secrets never included)
``GET /triggers/{id}``                 viewer    one trigger; ``ETag: "<store revision>"``
``POST /triggers``                     admin     create (201, ``ETag``, ``Location``); 409 if the id exists
``PUT /triggers/{id}``                 admin     replace; ``If-Match`` required: 428 without, 412 stale
``POST /triggers/{id}/enable|disable`` operator  switch; ``If-Match`` honoured when given
``DELETE /triggers/{id}``              admin     delete (204); ``If-Match`` honoured when given
``POST /triggers/preview``             viewer    what a draft would make of a sample delivery; no effect
``GET /triggers/{id}/deliveries``      viewer    its deliveries' processing state, newest first (cursor)
``POST …/deliveries/{d}/redrive``      operator  re-run a rejected or failed delivery; ``{"rerun": n}``: an accepted one, as a new run (:mod:`.redrive`)
``GET /adapters``                      viewer    the webhook sources a trigger's ``adapter`` may name (:func:`adapters_router`)
=====================================  ========  ==================================================

Authentication is :mod:`temporality_service.auth` (``Authorization: Bearer <API token>``): 401 without a
valid token, 403 below the role. A body is validated exactly as the triggers file is (plus the agent ids
of the agent cards file, re-read when it changed: :mod:`.agents`): 422 ``invalid_trigger`` whose ``detail`` and ``errors[].field`` name each field
(``agent``, ``auth.password_env``, ``input.author``, ``cron``, ``filter``...).

Secrets are write-only: a literal ``password``/``token``/``secret`` is stored but never returned (the
response lists it under ``write_only_set``); prefer ``*_env``. A replace whose ``auth`` has the same
``type`` and neither the literal nor its ``*_env`` keeps the stored literal, so a client can send back what
it read. Every change is journaled (``trigger.created|updated|deleted|enabled|disabled``, the token's
name as ``changed_by``, never a secret) after the store took it; the answer waits until this replica
serves the new revision.

An ``event`` trigger that becomes enabled (created enabled, enabled, or replaced into an enabled event
trigger) is stored with ``active_from_seq``, the events stream's last sequence now: it reacts only to
events stored after it (TRG-6). A replace of an already enabled event trigger keeps its activation.
"""

from __future__ import annotations

import base64
import re
import sys
from collections.abc import Awaitable, Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import structlog
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_bus import AlreadyExists, Bus, Conflict, PermanentError, TransientError, Versioned
from temporality_protocol import (
    TriggerChange,
    TriggerCreated,
    TriggerDeleted,
    TriggerDisabled,
    TriggerEnabled,
    TriggerUpdated,
    derive_id,
    make_event,
)
from temporality_protocol.trigger_admin import (
    AdapterList,
    AdapterView,
    DeliveryPage,
    PreviewAnswer,
    RedriveAnswer,
    TriggerList,
    TriggerView,
)
from temporality_service import (
    AsAdmin,
    AsOperator,
    AsViewer,
    NotFound,
    Unavailable,
    Unprocessable,
    parse_json,
    read_body,
)
from temporality_service.http import Conflict as HttpConflict
from temporality_service.http import PreconditionFailed, PreconditionRequired, revision_of
from temporality_service.openapi import component_schemas, if_match, json_body, operation
from temporality_trigger_gateway.adapters import ADAPTERS, Adapter
from temporality_trigger_gateway.agents import refresh_agents
from temporality_trigger_gateway.errors import BusUnavailable
from temporality_trigger_gateway.launch import Launcher
from temporality_trigger_gateway.preview import run_preview
from temporality_trigger_gateway.redrive import MAX_RERUN, NotRedrivable, redrive, rerun
from temporality_trigger_gateway.store import TriggerRecord, TriggerRegistry, TriggerStore, validate_spec
from temporality_trigger_gateway.triggers import EventTrigger, TriggerConfig, field_errors

__all__ = [
    "OPENAPI_SCHEMAS",
    "SECRET_FIELDS",
    "PreconditionFailed",
    "PreconditionRequired",
    "TriggerInvalid",
    "admin_router",
    "public_spec",
]

log = structlog.get_logger(__name__)

SOURCE = "/temporality/trigger-gateway"
#: The literal secrets an ``auth`` may hold (each has a ``*_env`` twin); never returned.
SECRET_FIELDS = ("password", "token", "secret")
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_DELIVERY = re.compile(r"^dlv-[0-9a-f]{24}$")
#: A trigger body larger than this is refused (413): a trigger is a few hundred bytes, and a KV value is
#: bounded by NATS's max_payload.
MAX_TRIGGER_BYTES = 64 * 1024
T = TypeVar("T")


class TriggerInvalid(Unprocessable):
    code = "invalid_trigger"

    def __init__(self, errors: list[dict[str, str]]) -> None:
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5]) or "invalid trigger"
        if len(errors) > 5:
            detail += f"; and {len(errors) - 5} more"
        super().__init__(detail[:2000], extra={"errors": errors[:50]})


class UnknownTriggerId(NotFound):
    code = "trigger_not_found"


def public_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` without literal secrets (the ``*_env`` names stay)."""
    data = dict(spec)
    auth = data.get("auth")
    if isinstance(auth, dict):
        data["auth"] = {k: v for k, v in auth.items() if k not in SECRET_FIELDS}
    return data


def _write_only_set(spec: Mapping[str, Any]) -> list[str]:
    auth = spec.get("auth")
    if not isinstance(auth, dict):
        return []
    return [f"auth.{name}" for name in SECRET_FIELDS if auth.get(name) is not None]


def _keep_secrets(new: dict[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    """A replace that leaves out a literal secret (it could not read it) keeps the stored one."""
    new_auth, old_auth = new.get("auth"), old.get("auth")
    if not (isinstance(new_auth, dict) and isinstance(old_auth, dict)) or new_auth.get("type") != old_auth.get("type"):
        return new
    merged = dict(new_auth)
    for name in SECRET_FIELDS:
        if merged.get(name) is None and merged.get(f"{name}_env") is None and old_auth.get(name) is not None:
            merged.pop(name, None)
            merged[name] = old_auth[name]
    return {**new, "auth": merged}


def _cursor(text: str | None) -> tuple[datetime, str] | None:
    """A deliveries page cursor (``next_cursor`` of the previous page) -> (received at, delivery id)."""
    if text is None:
        return None
    try:
        stamp, delivery_id = base64.urlsafe_b64decode(text.encode("ascii")).decode("utf-8").split("|", 1)
        at = datetime.fromisoformat(stamp)
    except (ValueError, UnicodeError):
        raise InvalidCursor("cursor is not a next_cursor this API returned") from None
    if at.tzinfo is None or not _DELIVERY.match(delivery_id):
        raise InvalidCursor("cursor is not a next_cursor this API returned")
    return at, delivery_id


def _next_cursor(following: tuple[datetime, str] | None) -> str | None:
    if following is None:
        return None
    return base64.urlsafe_b64encode(f"{following[0].isoformat()}|{following[1]}".encode()).decode("ascii")


class InvalidCursor(Unprocessable):
    code = "invalid_cursor"


class UnknownDelivery(NotFound):
    code = "delivery_not_found"


class TriggerPreview(BaseModel):
    """The body of ``POST /triggers/preview`` (:mod:`.preview` reads it itself; this documents it)."""

    model_config = ConfigDict(extra="forbid")

    trigger: dict[str, Any] | None = Field(None, description="A draft trigger, as for POST /triggers (or trigger_id)")
    trigger_id: str | None = Field(None, pattern=_ID.pattern, description="A stored trigger (or trigger)")
    payload: Any = Field(description="The sample delivery's JSON body (an event trigger's: a CloudEvent)")
    headers: dict[str, str] | None = Field(None, description="The sample's headers, for sources that read them")


class RedriveRequest(BaseModel):
    """The body of ``POST …/deliveries/{d}/redrive`` (optional: empty is a re-drive; :func:`_rerun_number`)."""

    model_config = ConfigDict(extra="forbid")

    rerun: int | None = Field(
        None,
        ge=1,
        le=MAX_RERUN,
        description="Run an accepted delivery's event again as a new run: the rerun's number (1 for the first; the "
        "same number again is the same run). Absent: a re-drive of a rejected or failed delivery",
    )


#: The components the admin API's bodies refer to (``add_schemas`` in :func:`~.api.create_app`).
OPENAPI_SCHEMAS = component_schemas(
    TriggerSpec=TriggerConfig, TriggerPreview=TriggerPreview, RedriveRequest=RedriveRequest
)
_SPEC_BODY = json_body(
    "TriggerSpec",
    description="A trigger, as in the triggers file (422 invalid_trigger names each wrong field); on PUT the id "
    "may be left out (the path's). Literal secrets are write-only.",
)
_IF_MATCH = if_match(required=False, what="the trigger")


def admin_router(
    registry: TriggerRegistry,
    store: TriggerStore,
    bus: Bus,
    *,
    max_body_bytes: int,
    retry_after_s: int,
    launcher: Launcher | None = None,
) -> APIRouter:
    """The ``/triggers`` routes over ``store``; ``registry`` is this replica's live view of it. ``launcher``:
    the launch path the deliveries API reads and re-drives through (``None``: one of its own)."""
    router = APIRouter(prefix="/triggers", tags=["triggers"])
    launch_path = launcher or Launcher(bus, retry_after_s=retry_after_s)

    def validate(spec: Any, *, new: bool = False) -> TriggerConfig:
        if not isinstance(spec, dict):
            raise TriggerInvalid([{"field": "<body>", "message": "a trigger is a JSON object"}])
        refresh_agents(registry)  # a card added to the agent cards file since counts (agents.py)
        try:
            return validate_spec(spec, environ=registry.environ, agents=registry.agents, new=new)
        except ValidationError as exc:
            raise TriggerInvalid(field_errors(exc, spec)) from None

    async def io(call: Awaitable[T]) -> T:
        try:
            return await call
        except (Conflict, AlreadyExists):
            raise
        except (TransientError, PermanentError, OSError, TimeoutError) as exc:
            log.warning("trigger.store_unavailable", error=repr(exc))
            raise Unavailable(
                "the trigger store did not answer; retry later", code="bus_unavailable", retry_after_s=retry_after_s
            ) from exc
        except Exception as exc:
            if type(exc).__module__.startswith("nats"):
                log.warning("trigger.store_unavailable", error=repr(exc))
                raise Unavailable(
                    "the trigger store did not answer; retry later", code="bus_unavailable", retry_after_s=retry_after_s
                ) from exc
            raise

    async def read_spec(request: Request) -> Any:
        return parse_json(await read_body(request, min(max_body_bytes, MAX_TRIGGER_BYTES)))

    async def read_sample(request: Request) -> Any:
        return parse_json(await read_body(request, max_body_bytes))  # a sample delivery may be as large as one

    async def current(trigger_id: str) -> Versioned[TriggerRecord]:
        found = await io(store.get(trigger_id)) if _ID.match(trigger_id) else None
        if found is None:
            raise UnknownTriggerId(f"no trigger with id {trigger_id[:100]!r}")
        return found

    def view(trigger_id: str, found: Versioned[TriggerRecord]) -> dict[str, Any]:
        record = found.value
        served = registry.get(trigger_id)
        refresh_agents(registry)
        try:
            trigger = validate_spec(record.spec, environ=registry.environ, agents=registry.agents)
            shown = trigger.model_dump(mode="json")  # every field, defaults included
            if "auth" in shown:  # as written (``*_env`` names), without literal secrets
                shown["auth"] = public_spec(record.spec)["auth"]
            problem = None
        except ValidationError as exc:
            shown = public_spec(record.spec)
            wrong = field_errors(exc, record.spec)
            problem = "; ".join(f"{e['field']}: {e['message']}" for e in wrong[:5])
            if len(wrong) > 5:
                problem += f"; and {len(wrong) - 5} more"
        return {
            "trigger": shown,
            "revision": found.revision,
            "origin": record.origin,
            "updated_by": record.updated_by,
            "updated_at": record.updated_at.isoformat(),
            "served": served is not None and registry.revisions.get(trigger_id, 0) >= found.revision,
            "problem": problem or registry.problems.get(trigger_id),
            "write_only_set": _write_only_set(record.spec),
        }

    def answer(trigger_id: str, found: Versioned[TriggerRecord], status: int = 200) -> JSONResponse:
        headers = {"ETag": f'"{found.revision}"'}
        if status == 201:
            headers["Location"] = f"/triggers/{trigger_id}"
        return JSONResponse(view(trigger_id, found), status_code=status, headers=headers)

    async def journal(event: TriggerChange, revision: int, principal: str) -> None:
        """Publish the audit event (id derived from trigger id + revision: a retry republishes the same one)."""
        envelope = make_event(
            event,
            source=SOURCE,
            id=derive_id("evt", "trigger", event.trigger_id, str(revision), event.EVENT_TYPE),
            # a person the journal vouched for is already "user:<id>"; a token is named by its name
            actor=principal if principal.startswith("user:") else f"token:{principal}",
            correlation_id=event.trigger_id,
        )
        try:
            await bus.publish(envelope)
        except (TransientError, PermanentError) as exc:
            log.error("trigger.audit_not_journaled", trigger_id=event.trigger_id, revision=revision, error=repr(exc))
            raise Unavailable(
                f"the change was saved (revision {revision}) but could not be journaled; it is logged",
                code="audit_unavailable",
                retry_after_s=retry_after_s,
            ) from exc

    def change(
        kind: type[TriggerChange], trigger: TriggerConfig | None, trigger_id: str, revision: int, by: str
    ) -> TriggerChange:
        return kind(
            trigger_id=trigger_id,
            revision=revision,
            changed_by=by,
            trigger_type=trigger.type if trigger is not None else None,
            agent=trigger.agent if trigger is not None else None,
            enabled=trigger.enabled if trigger is not None else None,
        )

    async def activation(trigger: TriggerConfig, before: TriggerRecord | None) -> int | None:
        """An enabled event trigger reacts to events after this stream sequence (TRG-6): the stream's tail
        now, unless it was already an enabled event trigger (then it keeps reacting from where it did)."""
        if not (isinstance(trigger, EventTrigger) and trigger.enabled):
            return None
        if (
            before is not None
            and not before.deleted
            and before.active_from_seq is not None
            and before.spec.get("type") == "event"
            and before.spec.get("enabled", True) is True
        ):
            return before.active_from_seq
        return await io(store.events_tail())

    async def settled(trigger_id: str, revision: int) -> None:
        """Answer once this replica serves the change (its own watch applied it), bounded."""
        if not await registry.wait_for_revision(trigger_id, revision, timeout_s=5.0):
            log.warning("trigger.change_not_applied_yet", trigger_id=trigger_id, revision=revision)

    # ------------------------------------------------------------------ routes
    @router.get("", summary="List triggers", response_model=TriggerList)
    async def list_triggers(who: AsViewer) -> JSONResponse:
        found = await io(store.all())
        return JSONResponse({"triggers": [view(trigger_id, record) for trigger_id, record in found]})

    @router.post(
        "/preview",
        summary="Preview a trigger on a sample delivery (nothing is started or published)",
        response_model=PreviewAnswer,
        openapi_extra=operation(body=json_body("TriggerPreview")),
    )
    async def preview(request: Request, who: AsViewer) -> JSONResponse:
        refresh_agents(registry)
        return JSONResponse(await run_preview(await read_sample(request), registry, store, io))

    @router.get(
        "/{trigger_id}/deliveries",
        summary="A trigger's deliveries and their processing state, newest first",
        response_model=DeliveryPage,
    )
    async def list_deliveries(
        trigger_id: str,
        who: AsViewer,
        cursor: Annotated[str | None, Query(max_length=200)] = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 50,
    ) -> JSONResponse:
        await current(trigger_id)
        before = _cursor(cursor)
        page, following = await io(launch_path.deliveries.newest(trigger_id, before=before, limit=limit))
        return JSONResponse({"deliveries": [r.view() for r in page], "next_cursor": _next_cursor(following)})

    @router.post(
        "/{trigger_id}/deliveries/{delivery_id}/redrive",
        summary="Re-run a rejected or failed delivery through the launch path (its original event id); "
        'with {"rerun": n}, run an accepted delivery again as a new run',
        response_model=RedriveAnswer,
        openapi_extra=operation(body=json_body("RedriveRequest", required=False)),
        responses={202: {"model": RedriveAnswer, "description": "A run is started, queued or debounced"}},
    )
    async def redrive_delivery(trigger_id: str, delivery_id: str, request: Request, who: AsOperator) -> JSONResponse:
        number = _rerun_number(await read_body(request, min(max_body_bytes, MAX_TRIGGER_BYTES)))
        await current(trigger_id)
        found = await io(launch_path.deliveries.get(trigger_id, delivery_id)) if _DELIVERY.match(delivery_id) else None
        if found is None:
            raise UnknownDelivery(f"trigger {trigger_id!r} has no delivery {delivery_id[:100]!r} (kept 7 days)")
        trigger = registry.get(trigger_id)
        if trigger is None:
            raise NotRedrivable(
                f"trigger {trigger_id!r} is not served here ({registry.problems.get(trigger_id, 'not loaded')})"
            )
        try:
            if number is None:
                answer = await redrive(launch_path, trigger, found)
            else:
                answer = await rerun(launch_path, trigger, found, number, who.name)
        except BusUnavailable as exc:
            raise Unavailable(exc.detail, code="bus_unavailable", retry_after_s=retry_after_s) from exc
        log.info(
            "delivery.redrive_requested" if number is None else "delivery.rerun_requested",
            trigger_id=trigger_id,
            delivery_id=delivery_id,
            principal=who.name,
            rerun=number,
            run_id=answer.get("run_id"),
            status=answer.get("status"),
        )
        status = 202 if answer.get("status") in ("accepted", "queued", "debounced") else 200
        return JSONResponse(answer, status_code=status)

    @router.get("/{trigger_id}", summary="Read a trigger", response_model=TriggerView)
    async def read_trigger(trigger_id: str, who: AsViewer) -> JSONResponse:
        return answer(trigger_id, await current(trigger_id))

    @router.post(
        "",
        status_code=201,
        summary="Create a trigger",
        response_model=TriggerView,
        openapi_extra=operation(body=_SPEC_BODY),
    )
    async def create_trigger(request: Request, who: AsAdmin) -> JSONResponse:
        spec = await read_spec(request)
        trigger = validate(spec, new=True)
        record = TriggerRecord(
            spec=spec,
            origin="api",
            updated_by=who.name,
            updated_at=_now(),
            active_from_seq=await activation(trigger, None),
        )
        existing = await io(store.get_any(trigger.id))
        try:
            if existing is None:
                revision = await io(store.store.create(trigger.id, record))
            elif existing.value.deleted:  # re-create over the tombstone
                revision = await io(store.store.update(trigger.id, record, existing.revision))
            else:
                raise HttpConflict(
                    f"a trigger with id {trigger.id!r} exists; replace it with PUT", code="trigger_exists"
                )
        except (AlreadyExists, Conflict):
            raise HttpConflict(
                f"a trigger with id {trigger.id!r} exists; replace it with PUT", code="trigger_exists"
            ) from None
        await journal(change(TriggerCreated, trigger, trigger.id, revision, who.name), revision, who.name)
        log.info("trigger.created", trigger_id=trigger.id, revision=revision, principal=who.name)
        await settled(trigger.id, revision)
        return answer(trigger.id, Versioned(record, revision), status=201)

    @router.put(
        "/{trigger_id}",
        summary="Replace a trigger (If-Match: its ETag)",
        response_model=TriggerView,
        openapi_extra=operation(body=_SPEC_BODY, headers=[if_match(required=True, what="the trigger")]),
    )
    async def replace_trigger(trigger_id: str, request: Request, who: AsAdmin) -> JSONResponse:
        if_match = request.headers.get("if-match")  # read here, not by FastAPI: 428/412, not a 422
        if if_match is None:
            raise PreconditionRequired('replacing a trigger needs If-Match: "<revision>" (the ETag of a GET)')
        expected = revision_of(if_match, "the trigger")
        spec = await read_spec(request)
        if isinstance(spec, dict):
            if spec.setdefault("id", trigger_id) != trigger_id:
                raise TriggerInvalid([{"field": "id", "message": f"the body's id is not {trigger_id!r} (the path's)"}])
        found = await current(trigger_id)
        if expected is not None and found.revision != expected:
            raise PreconditionFailed(
                f"trigger {trigger_id!r} is at revision {found.revision}, not {expected}: read it again"
            )
        if isinstance(spec, dict):
            spec = _keep_secrets(spec, found.value.spec)
        trigger = validate(spec)
        record = TriggerRecord(
            spec=spec,
            origin="api",
            updated_by=who.name,
            updated_at=_now(),
            active_from_seq=await activation(trigger, found.value),
        )
        try:
            revision = await io(store.store.update(trigger_id, record, found.revision))
        except Conflict:
            raise PreconditionFailed(f"trigger {trigger_id!r} changed meanwhile: read it again") from None
        await journal(change(TriggerUpdated, trigger, trigger_id, revision, who.name), revision, who.name)
        log.info("trigger.updated", trigger_id=trigger_id, revision=revision, principal=who.name)
        await settled(trigger_id, revision)
        return answer(trigger_id, Versioned(record, revision))

    async def switch(trigger_id: str, enabled: bool, who_name: str, if_match: str | None) -> JSONResponse:
        expected = revision_of(if_match, "the trigger")
        found = await current(trigger_id)
        if expected is not None and found.revision != expected:
            raise PreconditionFailed(
                f"trigger {trigger_id!r} is at revision {found.revision}, not {expected}: read it again"
            )
        if found.value.spec.get("enabled", True) is enabled:
            return answer(trigger_id, found)  # already so: nothing written, nothing journaled
        spec = {**found.value.spec, "enabled": enabled}
        trigger = validate(spec)
        record = TriggerRecord(
            spec=spec,
            origin=found.value.origin,
            updated_by=who_name,
            updated_at=_now(),
            active_from_seq=await activation(trigger, found.value) if enabled else found.value.active_from_seq,
        )
        try:
            revision = await io(store.store.update(trigger_id, record, found.revision))
        except Conflict:
            raise PreconditionFailed(f"trigger {trigger_id!r} changed meanwhile: read it again") from None
        kind: type[TriggerChange] = TriggerEnabled if enabled else TriggerDisabled
        await journal(change(kind, trigger, trigger_id, revision, who_name), revision, who_name)
        log.info(kind.EVENT_TYPE, trigger_id=trigger_id, revision=revision, principal=who_name)
        await settled(trigger_id, revision)
        return answer(trigger_id, Versioned(record, revision))

    @router.post(
        "/{trigger_id}/enable",
        summary="Enable a trigger",
        response_model=TriggerView,
        openapi_extra=operation(headers=[_IF_MATCH]),
    )
    async def enable_trigger(trigger_id: str, request: Request, who: AsOperator) -> JSONResponse:
        return await switch(trigger_id, True, who.name, request.headers.get("if-match"))

    @router.post(
        "/{trigger_id}/disable",
        summary="Disable a trigger",
        response_model=TriggerView,
        openapi_extra=operation(headers=[_IF_MATCH]),
    )
    async def disable_trigger(trigger_id: str, request: Request, who: AsOperator) -> JSONResponse:
        return await switch(trigger_id, False, who.name, request.headers.get("if-match"))

    @router.delete(
        "/{trigger_id}", status_code=204, summary="Delete a trigger", openapi_extra=operation(headers=[_IF_MATCH])
    )
    async def delete_trigger(trigger_id: str, request: Request, who: AsAdmin) -> Response:
        expected = revision_of(request.headers.get("if-match"), "the trigger")
        found = await current(trigger_id)
        if expected is not None and found.revision != expected:
            raise PreconditionFailed(
                f"trigger {trigger_id!r} is at revision {found.revision}, not {expected}: read it again"
            )
        tombstone = TriggerRecord(
            spec={"id": trigger_id}, origin=found.value.origin, updated_by=who.name, updated_at=_now(), deleted=True
        )
        try:
            revision = await io(store.store.update(trigger_id, tombstone, found.revision))
        except Conflict:
            raise PreconditionFailed(f"trigger {trigger_id!r} changed meanwhile: read it again") from None
        await journal(change(TriggerDeleted, None, trigger_id, revision, who.name), revision, who.name)
        log.info("trigger.deleted", trigger_id=trigger_id, revision=revision, principal=who.name)
        await settled(trigger_id, revision)
        return Response(status_code=204)

    return router


class InvalidRedrive(Unprocessable):
    code = "invalid_request"


def _rerun_number(raw: bytes) -> int | None:
    """A re-drive's body: empty (or ``{}``) for a re-drive, ``{"rerun": n}`` for rerun ``n`` (:mod:`.redrive`)."""
    if not raw:  # no body at all (whitespace alone is malformed JSON: 400, as on every JSON route)
        return None
    body = parse_json(raw)
    if not isinstance(body, dict) or set(body) - {"rerun"}:
        raise InvalidRedrive('the body is empty (a re-drive) or {"rerun": n} (rerun n of an accepted delivery)')
    number = body.get("rerun")
    if number is None:
        return None
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_RERUN:
        raise InvalidRedrive(
            f"rerun is the rerun's number, 1 to {MAX_RERUN}: 1 for the first rerun of the delivery, 2 for the next; "
            "the same number again is the same run (a retry never starts a second one). A 409 delivery_accepted "
            "names the next number"
        )
    return number


def _now() -> datetime:
    return datetime.now(UTC)


# ------------------------------------------------------------------ the webhook sources (GET /adapters)
#: The order ``auth_types`` lists an adapter's auth types in: the sender's own signature first, then the
#: generic signatures, then shared secrets (a type not listed here comes last, alphabetically). The first is
#: what the console's wizard preselects for the adapter.
AUTH_PREFERENCE: tuple[str, ...] = (
    "github",
    "gitlab",
    "mindmap",
    "standard_webhooks",
    "hmac_sha256",
    "basic",
    "bearer",
    "header",
)


def _auth_order(auth_type: str) -> tuple[int, str]:
    known = AUTH_PREFERENCE.index(auth_type) if auth_type in AUTH_PREFERENCE else len(AUTH_PREFERENCE)
    return known, auth_type


def adapter_description(adapter: Adapter) -> str:
    """The first line of the adapter's module docstring, without its "The ``name`` source:" and requirement ids:
    ``"GitHub repository webhooks (pull requests, issues, …)."``."""
    module = sys.modules.get(type(adapter).__module__)
    first = ((module.__doc__ if module else None) or "").strip().split("\n", 1)[0]
    text = re.sub(r"\s*\(TRG-[^)]*\)", "", first).replace("``", "")
    head, sep, rest = text.partition(": ")
    if sep and head.startswith("The ") and adapter.name in head:
        text = rest
    return text[:1].upper() + text[1:]


def adapter_views() -> list[AdapterView]:
    """Every adapter of :data:`~.adapters.ADAPTERS`, in its order (the Azure DevOps ones first)."""
    return [
        AdapterView(
            name=name,
            description=adapter_description(adapter),
            auth_types=sorted(adapter.auth_types, key=_auth_order),
            event_types=None if adapter.event_types is None else sorted(adapter.event_types),
        )
        for name, adapter in ADAPTERS.items()
    ]


def adapters_router() -> APIRouter:
    """``GET /adapters`` (viewer): the webhook sources this gateway serves -- what the console's trigger wizard
    offers (through the journal's ``/gateway/adapters``)."""
    router = APIRouter(tags=["triggers"])
    listed = AdapterList(adapters=adapter_views()).model_dump(mode="json")

    @router.get(
        "/adapters",
        summary="List the webhook sources (adapters)",
        response_model=AdapterList,
        description="Each adapter a webhook trigger may name: its name, a one-line description, the auth types "
        "that authenticate it (besides none; the recommended first) and the event types it knows (null: any the "
        "sender names). Viewer role, as reading triggers. The same for every replica of a version: it changes "
        "only with the gateway's code.",
    )
    async def list_adapters(who: AsViewer) -> JSONResponse:
        return JSONResponse(listed)

    return router
