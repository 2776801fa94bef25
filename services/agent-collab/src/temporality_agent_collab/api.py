"""agent-collab's operator API (served on ``TEMPORALITY_COLLAB_PORT`` when it is set), role tokens from
``TEMPORALITY_API_TOKENS_FILE`` (:mod:`temporality_service.auth`):

==========================================  ========  ===================================================
route                                       role      does
==========================================  ========  ===================================================
``GET /agents``                             viewer    ``{"agents": [card, ...]}``: the hosted and external agents' cards (``?kind=hosted|external``,
                                                      ``?include_decommissioned=true``); a capability is
                                                      ``verified`` only by a passed conformance round
``POST /agents/{agent_id}/decommission``    operator  takes the agent out of service: ``decommissioned``,
                                                      journaled with ``requested_by``; its later messages
                                                      (a registration too) are refused until readmitted
``POST /agents/{agent_id}/readmit``         operator  lifts that hold (``agent.readmitted``): it may register
                                                      again, as a new incarnation
==========================================  ========  ===================================================

Both POSTs take a JSON body ``{"reason": "..."}`` (at most 500 characters; ``{}`` for none) and are
idempotent: a repeat answers 200 with ``changed: false``. Errors are the runtime's ``{"error", "detail"}``: 404
``unknown_agent`` (never registered), 409 ``already_decommissioned`` (it deregistered itself: nothing
to take out of service), 422 for a bad id or body, 401/403 for the token.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import FastAPI, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_agent_collab.agents import AgentRegistry
from temporality_agent_collab.registry import AgentRecord, AlreadyDecommissioned
from temporality_bus import NotFound as NoRecord
from temporality_protocol import AgentCard
from temporality_protocol.states import AgentLifecycleState
from temporality_service import (
    HTTP_TELEMETRY,
    ApiAuth,
    AsOperator,
    AsViewer,
    ErrorBody,
    NotFound,
    Unprocessable,
    install_error_handlers,
    parse_json,
    read_body,
)
from temporality_service.http import Conflict, summarize_errors
from temporality_service.openapi import add_schemas, component_schemas, json_body, operation

__all__ = ["MAX_BODY_BYTES", "AgentAction", "AgentActionResult", "create_app"]

#: The bodies here are one short reason; the limit is the runtime's usual one.
MAX_BODY_BYTES = 64 * 1024
_AGENT_ID = Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", description="The agent id")


class AgentAction(BaseModel):
    """The body of an operator action (``{}``: no reason given)."""

    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(max_length=500)] = ""


class AgentCards(BaseModel):
    """``GET /agents``: the cards under ``agents``, as the run-executor's ``GET /agents`` has them (an object, so
    a later field -- a page cursor -- changes no client)."""

    agents: list[AgentCard]


class AgentActionResult(BaseModel):
    agent_id: str
    state: AgentLifecycleState
    incarnation: int
    #: This call changed something (``False``: a repeat of what an operator already did).
    changed: bool
    #: The operator holding it out (registrations refused), if any.
    held_by: str | None


def _result(record: AgentRecord, changed: bool) -> AgentActionResult:
    return AgentActionResult(
        agent_id=record.agent_id,
        state=record.state,
        incarnation=record.incarnation,
        changed=changed,
        held_by=record.held_by,
    )


async def _action(request: Request) -> AgentAction:
    parsed = parse_json(await read_body(request, MAX_BODY_BYTES))  # empty or not JSON: 400
    try:
        return AgentAction.model_validate(parsed)
    except ValidationError as exc:
        raise Unprocessable(summarize_errors(exc.errors()), code="invalid_action") from exc


def _unknown(agent_id: str) -> NotFound:
    return NotFound(f"agent {agent_id!r} has never registered here", code="unknown_agent")


def create_app(registry: AgentRegistry, auth: ApiAuth) -> FastAPI:
    """The operator API over ``registry`` (open; the caller owns it), admitting the role tokens of ``auth``."""
    app = FastAPI(
        title="Temporality agent-collab",
        description="Operators and external agents: the registered agents, decommissioning. Every route but "
        "/healthz and /readyz needs Authorization: Bearer <API token> (viewer reads, operator acts).",
        version="0.1.0",
        responses={code: {"model": ErrorBody} for code in (401, 403, 422)},
        telemetry=HTTP_TELEMETRY,
    )
    install_error_handlers(app)
    auth.install(app)
    add_schemas(app, component_schemas(AgentAction=AgentAction))
    # read by _action (400 malformed_json for an empty or non-JSON body, 413 over the limit, 422 invalid_action)
    action_body = operation(body=json_body("AgentAction", description='{"reason": "..."}, or {} for none'))
    action_errors: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 404, 413)}

    @app.get("/agents", summary="The hosted and external agents' cards")
    async def list_agents(
        who: AsViewer,
        include_decommissioned: Annotated[bool, Query(description="Also decommissioned agents")] = False,
        kind: Annotated[
            Literal["all", "hosted", "external"], Query(description="hosted (the run-executor's), external, all")
        ] = "all",
    ) -> AgentCards:
        return AgentCards(agents=await registry.cards(include_decommissioned=include_decommissioned, kind=kind))

    @app.post(
        "/agents/{agent_id}/decommission",
        summary="Take an external agent out of service",
        responses={**action_errors, 409: {"model": ErrorBody}},
        openapi_extra=action_body,
    )
    async def decommission(agent_id: Annotated[str, _AGENT_ID], who: AsOperator, request: Request) -> AgentActionResult:
        action = await _action(request)
        try:
            record, changed = await registry.decommission(agent_id, by=who.name, reason=action.reason)
        except NoRecord:
            raise _unknown(agent_id) from None
        except AlreadyDecommissioned:
            raise Conflict(
                f"agent {agent_id!r} deregistered itself: nothing to take out of service (remove it from the "
                "allow-list to keep it out)",
                code="already_decommissioned",
            ) from None
        return _result(record, changed)

    @app.post(
        "/agents/{agent_id}/readmit",
        summary="Let an agent an operator decommissioned register again",
        responses=action_errors,
        openapi_extra=action_body,
    )
    async def readmit(agent_id: Annotated[str, _AGENT_ID], who: AsOperator, request: Request) -> AgentActionResult:
        action = await _action(request)
        try:
            record, changed = await registry.readmit(agent_id, by=who.name, reason=action.reason)
        except NoRecord:
            raise _unknown(agent_id) from None
        return _result(record, changed)

    return app
