"""The journal's HTTP API (JSON): runs by state, one run with whom/where/how long it waits, trajectories.

Every route but ``/healthz``, ``/readyz``, ``/auth/...`` and the console's static files needs
``Authorization: Bearer <API token>`` (:mod:`temporality_service.auth`, ``TEMPORALITY_API_TOKENS_FILE``) or,
with OIDC or password sign-in configured, the session cookie of a signed-in person (:mod:`temporality_journal.signin`; a call that
changes something also needs ``X-Temporality-Console: 1``): reading needs the ``viewer`` role, cancelling a
run ``operator``. No token or an unknown one is a 401 (``WWW-Authenticate: Bearer``), a role too low (or a
signed-in person with none) a 403.

==================================  ======================================================
``GET /healthz``, ``/readyz``       liveness / readiness (the runtime's; ``/readyz`` pings the
                                    database); no token
``GET /whoami``                     the caller's token name and role, or the signed-in person (the
                                    console asks it)
``GET /auth/config``, ``/auth/login``, ``/auth/callback``, ``POST /auth/logout``  OIDC sign-in (optional):
                                    :mod:`temporality_journal.signin`
``POST /auth/password``             a directory account's sign-in (optional): :mod:`temporality_journal.passwords`
``GET /runs``                       runs, newest first; ``state``, ``trigger_id``, ``agent``
                                    (case-insensitive), ``since``/``until`` (created_at), ``q`` (a
                                    substring of the title, or the start of the run id), ``rerun_of``
                                    (the reruns of a run), ``limit``; paged by ``before`` = the previous
                                    page's ``next_before``
``GET /runs/waiting``               UI-1: the runs waiting for a human, the oldest wait first
``GET /runs/{run_id}``              one run; ``waiting`` while it waits for a human (404 unknown);
                                    ``agent_card``: what it was started with (its ``run.started``'s)
``GET /runs/{run_id}/events``       the run's trajectory in stream order (``after`` = stream seq)
``GET /runs/{run_id}/asks``         COL-9: the agent asks the run sent and received
``POST /runs/{run_id}/cancel``      operator: publish ``run.cancel_requested`` (body ``{reason}``, optional);
                                    202, 404 unknown run, 409 already finished
``GET /events?type=&run_id=``       recent events, newest first in commit order (``commit_seq``, the
                                    tail's cursor), paged by ``before`` (``type=bus.dead_lettered``: the
                                    dead-letter view; ``type`` repeats and takes families, ``human.>``);
                                    each with its ``stream_seq`` and ``commit_seq``
``GET /events/stream``              the live tail (SSE), resumable by cursor (``commit_seq``):
                                    :mod:`temporality_journal.tail`; ``audited=true``: only what ``/audit`` lists
``GET /triggers``                   UI-2: per trigger id, its deliveries and runs
``GET /triggers/{id}/deliveries``   one trigger's deliveries, newest first, paged by ``before``
``GET /analytics/human``            OBS-1: how often runs ask humans, how long they wait, what
``GET /asks``                       COL-9: agent asks, newest first; ``state``, ``agent``,
                                    ``saga_id``, ``run_id``, ``since``/``until``, paged by ``before``
``GET /audit``                      operator: the critical actions (:mod:`temporality_journal.audit`)
``/gateway/triggers...``            UI-2: the trigger admin API of the trigger-gateway, proxied (allow-listed;
                                    the gateway checks the token): :mod:`temporality_journal.gateway`
``/human/inbox``, ``/human/requests...``  the web inbox of human-interaction, proxied (allow-listed; the
                                    caller's inbox token, which human-interaction checks):
                                    :mod:`temporality_journal.human`
==================================  ======================================================

``min_seq=<stream sequence>`` on ``GET /runs/{run_id}``, ``/runs/{run_id}/events`` and ``/events`` first waits
(bounded) until the journal has recorded the event stream that far: a NATS subscriber reads its own bus
(:mod:`temporality_journal.catchup`).

Run ids may contain ``/`` (relay runs, ``<target run>/ask/NN``): the run routes take ``{run_id:path}``,
the sub-routes declared before ``/runs/{run_id}``.

Read-only over ``events``, ``runs`` and ``asks``; the trigger and analytics views aggregate
in Python over the rows they select (:mod:`temporality_journal.insights`). The one write is the cancel
request, which goes to the bus (the run-executor decides; the journal records the request and the
``run.cancelled`` that follows like any other event).

Every error is ``{"error": "<code>", "detail": "<sentence>"}``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path as FilePath
from typing import Annotated, Any, Literal

import anyio
import httpx
import structlog
from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import ColumnElement, String, func, literal, not_, or_
from sqlalchemy import select as sa_select
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession
from starlette.responses import Response
from starlette.types import Scope

from temporality_bus import Bus, TransientError
from temporality_bus.tracing import trace_id_of
from temporality_journal.access import SessionAuth
from temporality_journal.audit import AUDIT_KINDS, AuditEntry, actor_matches, audit_entry, audited
from temporality_journal.catchup import WAIT_S, CatchUp
from temporality_journal.database import Database
from temporality_journal.gateway import OPENAPI_SCHEMAS as GATEWAY_SCHEMAS
from temporality_journal.gateway import gateway_router
from temporality_journal.human import human_router
from temporality_journal.insights import (
    HUMAN_TYPES,
    RUN_END_TYPES,
    TRIGGER_CHANGE_TYPES,
    TRIGGER_TYPES,
    DeliveryView,
    EventRow,
    HumanAnalytics,
    RunRow,
    TriggerView,
    decode_cursor,
    deliveries_of,
    encode_cursor,
    human_analytics,
    older_than,
    triggers_of,
)
from temporality_journal.models import EVENTS_TABLE, RUNS_TABLE, AskRecord, EventRecord, RunRecord, as_utc
from temporality_journal.passwords import PasswordSignInBody
from temporality_journal.settings import Settings
from temporality_journal.signin import AuthConfig, SignIn, auth_config
from temporality_journal.tail import SSE_ITEM_SCHEMA, EventStreamResponse, Tail
from temporality_protocol import RUN, AgentSummary, RunCancelRequested, RunStarted, RunState, derive_id, make_event
from temporality_protocol.catalog import EVENTS_STREAM
from temporality_protocol.events import RunUsage
from temporality_protocol.states import AgentAskState
from temporality_service import (
    HTTP_TELEMETRY,
    AccessAudit,
    ApiAuth,
    AsOperator,
    AsViewer,
    ErrorBody,
    NonNegativeInt64,
    NotFound,
    Role,
    Unavailable,
    Unprocessable,
    install_error_handlers,
    parse_json,
    read_body,
)
from temporality_service.audit import RequestContext
from temporality_service.http import Conflict, Unauthorized, summarize_errors
from temporality_service.openapi import add_schemas, component_schemas, json_body, operation

__all__ = [
    "AskList",
    "AskView",
    "AuditList",
    "CancelAccepted",
    "CancelRequest",
    "DeliveryList",
    "EventList",
    "EventView",
    "RunAsks",
    "RunList",
    "RunView",
    "Trajectory",
    "TriggerList",
    "Waiting",
    "WaitingList",
    "WaitingRequest",
    "WhoAmI",
    "create_app",
]

log = structlog.get_logger(__name__)

#: The web console's static files (HTML, JS modules, CSS), shipped in the package: no build step.
CONSOLE_DIR = FilePath(__file__).resolve().parent / "console"
#: The console loads only its own files and talks only to this origin; nothing inline runs.
CONSOLE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
MAX_LIMIT = 1000
MAX_TRAJECTORY = 10_000
MAX_TEXT_PARAM = 200
#: Refuses NUL (no database text holds it) in string query and path parameters.
NO_NUL = r"^[^\x00]*$"
#: An exact event type (``GET /audit``'s filter): ``*`` and ``>`` are NATS subject patterns (a subscriber's filter),
#: which it would otherwise match nothing with, silently (a 200 with no events).
EXACT_TYPE = r"^[^\x00*>]*$"
#: At most this many ``type`` values on /events and /events/stream.
MAX_TYPES = 50
#: The ``type`` filter of /events and /events/stream: repeatable, each an exact type or a family (:func:`_type_filter`).
EventTypeParam = Annotated[
    list[str] | None,
    Query(
        alias="type",
        description="Only events of these types (repeat it: any of them). Each an exact type (run.completed) or a "
        "family in NATS wording: human.> is every type below human (human.answered, human.directory.changed ...), "
        "> alone every type. * (one token) is a 422: write the family with >",
    ),
]


# --------------------------------------------------------------------------- response bodies
class WaitingRequest(BaseModel):
    """One question of a wait (HUM-7: a turn may ask several at once), and what became of it so far."""

    request_id: str
    recipient: str
    question: str
    channel: str | None = Field(description="Where it was delivered (human.notified); null until then")
    since: datetime = Field(
        description="When it was asked (its human.requested, agent.asked, or agent.task.offered for an external "
        "agent's turn)"
    )
    status: Literal["pending", "answered", "expired"] = Field(
        description="pending: nobody answered yet; answered / expired: this question has its outcome while the "
        "run still waits on the others (wait_for: all)"
    )
    responder: str | None = Field(default=None, description="Who answered (answered only)")
    responder_display_name: str | None = Field(
        default=None,
        description="The responder's display name (human.answered's, from human-interaction's directory); null "
        "for an answer without one (an older human-interaction, someone the directory had no name for): show "
        "`responder`",
    )


class Waiting(BaseModel):
    """UI-1: whom the run waits for, on which channel, for what, since when: a person (``waiting_for_human``)
    or an agent (``waiting_for_agent``: ``ask_agent`` in wait mode -- the recipient is the address the model
    wrote, the question its message --, or the run's own external agent working on a turn (AP-5) -- the request
    the turn's wait id ``<task id>.turn-<n>``, the recipient ``agent:<agent id>``, the question the task's
    objective; no channel for either)."""

    request_id: str | None = Field(description="The request it waits on; null while it waits on several (HUM-7)")
    recipient: str | None = Field(description="Whom it waits for (several: the recipients joined with ', ')")
    channel: str | None
    question: str | None = Field(description="What it asked (several: the questions joined with ' | ')")
    since: datetime | None
    waiting_s: float | None
    requests: list[WaitingRequest] = Field(
        default_factory=list,
        description="Each question of the wait with its own recipient, channel and status: one for a single "
        "question, each of a turn's questions while it waits on several (HUM-7)",
    )


class RunView(BaseModel):
    run_id: str
    state: RunState
    agent: str | None
    title: str | None
    trigger_id: str | None
    launch_kind: str | None
    rerun_of: str | None = Field(
        default=None,
        description='A rerun (the trigger-gateway\'s {"rerun": n} on an accepted delivery): the run it runs '
        "again (launch.rerun_of); null for every other run. GET /runs?rerun_of=<run id> lists a run's reruns",
    )
    rerun_requested_by: str | None = Field(
        default=None, description="A rerun: who asked for it (launch.requested_by: a token name or user:<id>)"
    )
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    result: str | None
    error: str | None
    last_event_seq: int | None
    waiting: Waiting | None
    usage: RunUsage | None = Field(
        default=None,
        description="What the whole run used, over all its turns (turns, tool_calls, prompt_tokens, "
        "completion_tokens, total_tokens, samplings): the usage of its run.completed, run.failed or run.cancelled; "
        "null until the run has ended, and for a run whose terminal event has none (an older executor's). Tokens "
        "are the provider's own count (the scripted provider reports 0). The per-turn figures are the run's "
        "run.streamed events of kind metrics (GET /runs/{run_id}/events)",
    )
    projected: bool = Field(
        default=True,
        description="False: no event that makes a run (run.requested, run.started, ...) has been journaled for "
        "this id yet, only others (trigger.*, human.*, agent.* ...); the run is shown from those, state pending",
    )
    agent_card: AgentSummary | None = Field(
        default=None,
        description="RUN-1, only in GET /runs/{run_id}: what the run was started with, its latest run.started's "
        "agent_card (provider, model, skills, tools, MCP servers, limits, the SHA-256 of the system prompt it was "
        "given and its sandbox); null before run.started and in lists",
    )

    @classmethod
    def of(cls, record: RunRecord, now: datetime, several: list[WaitingRequest] | None = None) -> RunView:
        """The view of ``record``; ``several``: the questions of a several-question wait (:func:`_several_waits`)."""
        waiting = None
        if record.state in (RunState.WAITING_FOR_HUMAN, RunState.WAITING_FOR_AGENT):
            since = record.waiting_since
            requests = several or []
            if record.waiting_request_id is not None and since is not None:
                requests = [
                    WaitingRequest(
                        request_id=record.waiting_request_id,
                        recipient=record.waiting_recipient or "",
                        question=record.waiting_question or "",
                        channel=record.waiting_channel,
                        since=since,
                        status="pending",
                    )
                ]
            waiting = Waiting(
                request_id=record.waiting_request_id,
                recipient=record.waiting_recipient,
                channel=record.waiting_channel,
                question=record.waiting_question,
                since=since,
                waiting_s=None if since is None else round(max((now - since).total_seconds(), 0.0), 3),
                requests=requests,
            )
        return cls(
            run_id=record.run_id,
            state=RunState(record.state),
            agent=record.agent,
            title=record.title,
            trigger_id=record.trigger_id,
            launch_kind=record.launch_kind,
            rerun_of=record.rerun_of,
            rerun_requested_by=record.rerun_requested_by,
            created_at=record.created_at,
            updated_at=record.updated_at,
            started_at=record.started_at,
            finished_at=record.finished_at,
            result=record.result,
            error=record.error,
            last_event_seq=record.last_event_seq,
            waiting=waiting,
            usage=_usage_of(record),
        )


def _usage_of(record: RunRecord) -> RunUsage | None:
    """The run's totals (``runs.usage_*``, set together by its terminal event), or None before."""
    if record.usage_turns is None:
        return None
    return RunUsage(
        turns=record.usage_turns,
        tool_calls=record.usage_tool_calls or 0,
        prompt_tokens=record.usage_prompt_tokens or 0,
        completion_tokens=record.usage_completion_tokens or 0,
        total_tokens=record.usage_total_tokens or 0,
        samplings=record.usage_samplings or 0,
    )


class RunList(BaseModel):
    runs: list[RunView]
    next_before: str | None = Field(
        default=None, description="Pass as ``before`` for the next (older) page; null on the last page"
    )


class WaitingList(BaseModel):
    runs: list[RunView] = Field(description="Runs in waiting_for_human or waiting_for_agent, the longest waiting first")


class TriggerList(BaseModel):
    triggers: list[TriggerView]


class DeliveryList(BaseModel):
    trigger_id: str
    deliveries: list[DeliveryView]
    next_before: str | None = Field(default=None, description="Pass as ``before`` for the next (older) page")


class EventView(BaseModel):
    id: str
    type: str
    time: datetime
    source: str
    actor: str | None
    run_id: str | None
    subject: str | None
    correlation_id: str | None
    causation_id: str | None
    tenant: str | None
    stream_seq: int = Field(description="Its JetStream stream sequence (the journal's stream order)")
    commit_seq: int = Field(
        description="Its cursor in the journal's commit order: the live tail's SSE id (``after``, ``Last-Event-ID``)"
    )
    recorded_at: datetime
    traceparent: str | None = Field(
        default=None,
        description="The W3C Trace Context ``traceparent`` the event was published with (CloudEvents Distributed "
        "Tracing extension); null when it carried none",
    )
    tracestate: str | None = Field(default=None, description="The W3C ``tracestate`` that came with ``traceparent``")
    trace_id: str | None = Field(
        default=None,
        description="The trace id of ``traceparent`` (32 hex digits): look the trace up by it in the tracing "
        "backend (Jaeger, Tempo, ...); null without a valid ``traceparent``",
    )
    data: dict[str, Any]

    @classmethod
    def of(cls, record: EventRecord) -> EventView:
        view = cls.model_validate(record, from_attributes=True)
        return view.model_copy(update={"trace_id": trace_id_of(record.traceparent)})


class Trajectory(BaseModel):
    run_id: str
    events: list[EventView]
    next_after: int | None = Field(
        default=None,
        description="The run has more events than this page holds: pass this as after for the next page (null: "
        "this page ends the run's events)",
    )


class EventList(BaseModel):
    events: list[EventView]
    next_before: int | None = Field(
        default=None,
        description="Pass as ``before`` for the next (older) page; null: this was the last one. A cursor "
        "(``commit_seq``), stable while events are journaled: a page never repeats or skips an event",
    )


class AskView(BaseModel):
    """COL-9: one agent ask -- who asked whom, what became of it, and why it went nowhere."""

    request_id: str
    state: AgentAskState = Field(
        description="AGENT_ASK: asked, delivered, expired, answered, refused, reply_undeliverable, undeliverable"
    )
    saga_id: str | None = Field(description="The events' correlation id")
    asker_run_id: str | None
    asker_agent: str | None
    to: str | None = Field(description="The address as the asking model wrote it")
    resolved_run_id: str | None = Field(description="The run the address resolved to in the asker's saga")
    resolved_agent: str | None
    recipient_run_id: str | None = Field(description="Who got the ask: the resolved run, or the relay run")
    relay: bool
    relay_run: str | None
    mode: str | None = Field(description="async or wait")
    timeout_s: int | None
    expires_at: datetime | None
    message: str | None
    truncated: bool
    replier_run_id: str | None
    replier_agent: str | None
    outcome: str | None = Field(description="answer or refusal, once a reply is known")
    answer: str | None = Field(description="The answer, or why the replier refused")
    late: bool = Field(description="The answer came after the wait had expired")
    waited_s: float | None
    reason: str | None = Field(description="Why it went nowhere (undeliverable, reply_undeliverable)")
    detail: str | None
    asked_at: datetime
    delivered_at: datetime | None
    expired_at: datetime | None
    replied_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime

    @classmethod
    def of(cls, record: AskRecord) -> AskView:
        return cls(
            request_id=record.request_id,
            state=AgentAskState(record.state),
            saga_id=record.correlation_id,
            asker_run_id=record.asker_run_id,
            asker_agent=record.asker_agent,
            to=record.to_address,
            resolved_run_id=record.resolved_run_id,
            resolved_agent=record.resolved_agent,
            recipient_run_id=record.recipient_run_id,
            relay=bool(record.relay),
            relay_run=record.relay_run,
            mode=record.mode,
            timeout_s=record.timeout_s,
            expires_at=record.expires_at,
            message=record.message,
            truncated=bool(record.truncated),
            replier_run_id=record.replier_run_id,
            replier_agent=record.replier_agent,
            outcome=record.outcome,
            answer=record.answer,
            late=bool(record.late),
            waited_s=record.waited_s,
            reason=record.reason,
            detail=record.detail,
            asked_at=record.asked_at,
            delivered_at=record.delivered_at,
            expired_at=record.expired_at,
            replied_at=record.replied_at,
            finished_at=record.finished_at,
            updated_at=record.updated_at,
        )


class RunAsks(BaseModel):
    run_id: str
    sent: list[AskView] = Field(description="Asks this run sent, oldest first")
    received: list[AskView] = Field(
        description="Asks this run received, or that a relay answered on its behalf, oldest first"
    )


class AskList(BaseModel):
    asks: list[AskView]
    next_before: str | None = Field(default=None, description="Pass as ``before`` for the next (older) page")


class AuditList(BaseModel):
    entries: list[AuditEntry]
    next_before: str | None = Field(default=None, description="Pass as ``before`` for the next (older) page")


class WhoAmI(BaseModel):
    name: str = Field(description="The API token's name (never the token), or the signed-in person's name")
    role: str | None = Field(
        description="viewer, operator or admin; null: a signed-in person with no role (inbox only)"
    )
    kind: str = Field(default="token", description="token (an API token) or person (signed in with the provider)")
    user: str | None = Field(default=None, description="The signed-in person's directory user id (kind person)")
    expires_at: datetime | None = Field(default=None, description="When the sign-in session ends (kind person)")


#: An error body in a response that is not JSON when it succeeds (the live tail).
_ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}


#: The reason of a cancel whose request gives none (``curl -X POST …/cancel`` with no body).
NO_REASON = "no reason given"


class CancelRequest(BaseModel):
    """The body of ``POST /runs/{run_id}/cancel``."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        pattern=NO_NUL,
        description=f"Why (kept in the journal); left out, or the body empty: {NO_REASON!r}",
    )


class CancelAccepted(BaseModel):
    status: str = Field(description="cancel_requested")
    run_id: str
    event_id: str = Field(description="The id of the run.cancel_requested event published")
    requested_by: str = Field(description="The API token's name")


#: The 401 of ``/whoami`` without any credential when no sign-in is configured (the token check's own words).
NO_CREDENTIAL = "this endpoint needs Authorization: Bearer <API token>"


#: The 503 of a read with ``min_seq`` (:mod:`temporality_journal.catchup`).
_BEHIND = (
    f"journal_behind: with min_seq, the journal had not recorded the stream up to it within {WAIT_S:g} s; the body "
    "has min_seq and recorded_seq (the highest stream sequence recorded), Retry-After the seconds to wait"
)


def _run_not_found(run_id: str) -> NotFound:
    return NotFound(f"no run {run_id[:200]!r} in the journal", code="run_not_found")


async def _caught_up(
    request: Request,
    min_seq: Annotated[
        NonNegativeInt64 | None,
        Query(
            description="Read your bus writes: first wait (at most a few seconds) until the journal has recorded the "
            "event stream up to this JetStream stream sequence (a NATS subscriber's msg.metadata.sequence.stream), "
            "then answer; 503 journal_behind (Retry-After, recorded_seq) if it has not by then"
        ),
    ] = None,
) -> int | None:
    """The journal's mark once it reached ``min_seq`` (None without ``min_seq``: no wait); the app's
    :class:`~temporality_journal.catchup.CatchUp` waits."""
    if min_seq is None:
        return None
    catch_up: CatchUp = request.app.state.catch_up
    return await catch_up.wait(min_seq)


#: ``min_seq`` on a read (declare it after the caller's role, so a refused caller never waits).
CaughtUp = Annotated[int | None, Depends(_caught_up)]


# --------------------------------------------------------------------------- app
#: The kinds of the audit trail a viewer reads anyway elsewhere -- the definitions and their changes in /triggers,
#: a run's cancel request and rerun in its timeline -- and the console's live pages follow (Triggers, a run).
VIEWER_READS_KINDS = frozenset(
    {
        "trigger_change",
        "cancellation",
        "run_rerun",
        # about runs, which the run timelines show a viewer anyway: a question's refusals, agents' refusals and
        # hand-offs; and the dead letters (the runbook's ``GET /events?type=bus.dead_lettered``)
        "permission_refusal",
        "agent_refusal",
        "handoff",
        "dead_letter",
    }
)
#: The audited event types only an operator reads (``GET /audit``; left out of a viewer's ``/events`` and
#: ``/events/stream``): refused access with its addresses and token names, directory changes, agent
#: registrations and policies, NATS permissions violations.
OPERATOR_ONLY_TYPES = sorted(t for t, kind in AUDIT_KINDS.items() if kind not in VIEWER_READS_KINDS)


def create_app(
    settings: Settings,
    database: Database,
    bus: Bus,
    auth: ApiAuth,
    tail: Tail | None = None,
    gateway: httpx.AsyncClient | None = None,
    human: httpx.AsyncClient | None = None,
    access: AccessAudit | None = None,
    signin: SignIn | None = None,
    catch_up: CatchUp | None = None,
) -> FastAPI:
    """The journal API over ``database`` and ``bus`` (already open; the caller owns their lifecycles),
    admitting the role tokens of ``auth``; ``tail`` feeds ``/events/stream`` (default: one that only polls);
    ``gateway`` (open, the caller's: :func:`temporality_journal.gateway.gateway_client`) serves the
    ``/gateway/`` proxy to the trigger admin API (None: those routes answer 503); ``human`` likewise the
    ``/human/`` proxy to human-interaction's web inbox (:func:`temporality_journal.human.human_client`).
    Every 401/403 of the token check goes to ``access`` (default: one publishing on ``bus``), the audit trail's
    ``api.access_refused`` (:mod:`temporality_service.audit`). With ``signin`` (OIDC or passwords configured),
    people sign in at ``/auth/login`` or ``/auth/password`` and their session cookie is admitted beside the tokens
    (:mod:`temporality_journal.signin`). ``catch_up`` serves ``min_seq`` on the run and event reads (default: one over
    ``database`` woken by ``tail``'s changes: :mod:`temporality_journal.catchup`)."""
    tail = tail or Tail(database)
    app = FastAPI(
        title="Temporality journal",
        description="Every event, the runs they move, and the trajectories (read model). Every route but "
        "/healthz and /readyz needs Authorization: Bearer <API token> (viewer reads, operator cancels).",
        version="0.1.0",
        responses={code: {"model": ErrorBody} for code in (401, 403, 422)},
        telemetry=HTTP_TELEMETRY,
    )
    app.state.settings = settings
    app.state.database = database
    install_error_handlers(app)
    add_schemas(
        app,
        component_schemas(CancelRequest=CancelRequest, PasswordSignInBody=PasswordSignInBody) | GATEWAY_SCHEMAS,
    )
    refusals = access or AccessAudit(bus, "journal")  # refusals into the audit trail, as every service's
    app.state.access_audit = refusals
    audited_auth = SessionAuth(auth, signin)  # tokens, and sign-in sessions beside them
    audited_auth.install(app)
    app.add_middleware(RequestContext)  # the password sign-in's refusals are decided away from the request
    if signin is not None:
        signin.install(app, database, bus, refusals)

    @app.api_route("/console", methods=["GET", "HEAD"], include_in_schema=False)
    async def console_slash(request: Request) -> RedirectResponse:
        # Starlette's own slash redirect writes an absolute URL from the Host header (a request with
        # ``Host: evil.example`` was sent to http://evil.example/console/). "console/" is relative to this very
        # path, so it also keeps whatever prefix a proxy serves the journal under (/ops/console -> /ops/console/).
        query = request.url.query
        return RedirectResponse("console/" + (f"?{query}" if query else ""), status_code=307)

    app.mount("/console", _ConsoleFiles(directory=CONSOLE_DIR, html=True), name="console")
    app.include_router(gateway_router(settings, gateway, signin, auth.principals))
    app.include_router(human_router(settings, human, database, signin))

    @app.get("/", include_in_schema=False)
    async def home() -> RedirectResponse:
        return RedirectResponse("console/", status_code=307)  # relative: keeps a proxy's prefix

    async def events_stream_last() -> int | None:
        info = await bus.js.stream_info(EVENTS_STREAM.name)
        return info.state.last_seq if info.state is not None else None

    # min_seq (:data:`CaughtUp`); one beyond the events stream's last sequence is refused, not waited for
    app.state.catch_up = catch_up or CatchUp(database, tail.changes, stream_last=events_stream_last)

    @app.get("/auth/config", response_model=AuthConfig, description="How to sign in (no sign-in needed).")
    async def sign_in_config() -> AuthConfig:
        return auth_config(signin)

    @app.get(
        "/whoami",
        response_model=WhoAmI,
        description="Who calls: the API token's name and role, or the person signed in (role null: inbox only). "
        "401 without a credential (not audited: the console asks at every load); a refused token or an ended "
        "session (401 session_ended) is audited like any refusal.",
    )
    async def whoami(request: Request, authorization: Annotated[str | None, Header()] = None) -> WhoAmI:
        person = signin.person(request) if signin is not None and authorization is None else None
        if person is not None:
            return WhoAmI(
                name=person.name,
                role=None if person.role is None else str(person.role),
                kind="person",
                user=person.user_id,
                expires_at=datetime.fromtimestamp(person.expires_at, UTC),
            )
        if authorization is None and (signin is None or not signin.ended(request)):
            # the console's "is anyone signed in?" at every load: no credential was refused, nothing is audited
            raise audited_auth.unauthenticated(request) if signin is not None else Unauthorized(NO_CREDENTIAL)
        who = audited_auth.admit(request, authorization, Role.viewer)  # a bad token or an ended session: audited
        return WhoAmI(name=who.name, role=str(who.role))

    @app.get(
        "/runs",
        response_model=RunList,
        description="Runs, newest first (by created_at, then run id). Filters combine with AND; page with "
        "``before`` = the previous page's ``next_before``.",
    )
    async def list_runs(
        who: AsViewer,
        state: Annotated[RunState | None, Query(description="Only runs in this state")] = None,
        trigger_id: Annotated[str | None, _text("Only runs launched by this trigger (case-insensitive)")] = None,
        agent: Annotated[str | None, _text("Only runs of this agent (case-insensitive)")] = None,
        since: Annotated[datetime | None, Query(description="Only runs created at or after (ISO 8601)")] = None,
        until: Annotated[datetime | None, Query(description="Only runs created before (ISO 8601)")] = None,
        q: Annotated[
            str | None, _text("Case-insensitive substring of the title, or the start of the run id (a pasted id)")
        ] = None,
        rerun_of: Annotated[str | None, _text("Only the reruns of this run (their rerun_of)")] = None,
        before: Annotated[str | None, _text("Opaque cursor: the next_before of the previous page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="At most this many runs")] = 100,
    ) -> RunList:
        conditions = _run_filters(database, agent=agent, trigger_id=trigger_id, since=since, until=until)
        if state is not None:
            conditions.append(col(RunRecord.state) == state.value)
        if rerun_of is not None:
            conditions.append(col(RunRecord.rerun_of) == rerun_of)
        if q:
            conditions.append(
                or_(
                    # case-insensitive beyond ASCII ("ЮНИКОД" finds "юникод"): SQLite's LIKE folds ASCII only
                    database.contains_folded(col(RunRecord.title), q),
                    col(RunRecord.run_id).startswith(q.strip(), autoescape=True),
                )
            )
        conditions += older_than(before, col(RunRecord.created_at), col(RunRecord.run_id))
        query = (
            select(RunRecord)
            .where(*conditions)
            .order_by(col(RunRecord.created_at).desc(), col(RunRecord.run_id).desc())
            .limit(limit + 1)
        )
        async with database.sessions() as session:
            records = list((await session.exec(query)).all())
            more = len(records) > limit
            records = records[:limit]
            several = await _several_waits(session, records)
        now = datetime.now(UTC)
        next_before = encode_cursor(records[-1].created_at, records[-1].run_id) if more else None
        return RunList(runs=[RunView.of(r, now, several.get(r.run_id)) for r in records], next_before=next_before)

    # Declared before /runs/{run_id}, which would otherwise take "waiting" for a run id.
    @app.get(
        "/runs/waiting",
        response_model=WaitingList,
        description="UI-1: the runs waiting for a human or for an agent (``ask_agent`` in wait mode, or the run's "
        "own external agent working on a turn), the oldest wait first; each with ``waiting`` (whom, which channel, what question, since when, waiting "
        "seconds).",
    )
    async def waiting_runs(
        who: AsViewer,
        agent: Annotated[str | None, _text("Only runs of this agent (case-insensitive)")] = None,
        trigger_id: Annotated[str | None, _text("Only runs launched by this trigger (case-insensitive)")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="At most this many runs")] = 100,
    ) -> WaitingList:
        conditions = _run_filters(database, agent=agent, trigger_id=trigger_id, since=None, until=None)
        query = (
            select(RunRecord)
            .where(
                col(RunRecord.state).in_([RunState.WAITING_FOR_HUMAN.value, RunState.WAITING_FOR_AGENT.value]),
                *conditions,
            )
            .order_by(col(RunRecord.waiting_since).asc(), col(RunRecord.run_id).asc())
            .limit(limit)
        )
        async with database.sessions() as session:
            records = (await session.exec(query)).all()
            several = await _several_waits(session, records)
        now = datetime.now(UTC)
        return WaitingList(runs=[RunView.of(r, now, several.get(r.run_id)) for r in records])

    # Run ids may contain "/" (relay runs: "<target run>/ask/NN"), hence ``{run_id:path}``; the sub-routes
    # come first, so "/runs/a/ask/01/events" is the trajectory of "a/ask/01", and "/runs/{run_id:path}" last.
    @app.get(
        "/runs/{run_id:path}/events",
        response_model=Trajectory,
        responses={404: {"model": ErrorBody}, 503: {"model": ErrorBody, "description": _BEHIND}},
        description="The run's trajectory in stream order, paged by ``after`` (a stream sequence). ``min_seq``: "
        "first wait until the journal has recorded the stream that far (a subscriber that saw the run's "
        "run.completed at that sequence gets it in the trajectory).",
    )
    async def run_events(
        run_id: Annotated[str, Path(max_length=MAX_TEXT_PARAM, pattern=NO_NUL)],
        who: AsViewer,
        recorded: CaughtUp,
        after: Annotated[NonNegativeInt64, Query(description="Only events after this stream sequence")] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_TRAJECTORY)] = MAX_TRAJECTORY,
    ) -> Trajectory:
        query = (
            select(EventRecord)
            .where(col(EventRecord.run_id) == run_id, col(EventRecord.stream_seq) > after)
            .order_by(col(EventRecord.stream_seq), col(EventRecord.time), col(EventRecord.id))
            .limit(limit + 1)
        )
        async with database.sessions() as session:
            records = list((await session.exec(query)).all())
            if not records and not await _run_known(session, run_id):
                raise _run_not_found(run_id)
        more = len(records) > limit
        records = records[:limit]
        return Trajectory(
            run_id=run_id,
            events=[EventView.of(r) for r in records],
            next_after=records[-1].stream_seq if more else None,
        )

    @app.post(
        "/runs/{run_id:path}/cancel",
        status_code=202,
        response_model=CancelAccepted,
        responses={code: {"model": ErrorBody} for code in (400, 404, 409, 413, 503)},
        # read by the handler itself: no body is no reason, a non-JSON one a 400, a wrong one a 422 invalid_cancel
        openapi_extra=operation(body=json_body("CancelRequest", required=False)),
        description="Operator: ask the run-executor to stop the run (publishes run.cancel_requested with "
        "requested_by = the token's name). 202 once the request is durably on the bus; the run becomes "
        "cancelled when the executor acts on it. 404 for a run the journal does not know, 409 for a finished run.",
    )
    async def cancel_run(
        run_id: Annotated[str, Path(max_length=MAX_TEXT_PARAM, pattern=NO_NUL)], who: AsOperator, request: Request
    ) -> CancelAccepted:
        raw = await read_body(request, settings.max_body_bytes)
        parsed = parse_json(raw) if raw else {}  # no body: no reason given (whitespace alone is malformed JSON)
        try:
            body = CancelRequest.model_validate(parsed)
        except ValidationError as exc:
            raise Unprocessable(summarize_errors(exc.errors()), code="invalid_cancel") from exc
        async with database.sessions() as session:
            record = await session.get(RunRecord, run_id)
        if record is None:
            raise _run_not_found(run_id)
        if RunState(record.state) in RUN.terminal:
            raise Conflict(f"run {run_id!r} is already {record.state}: nothing to cancel", code="run_finished")
        data = RunCancelRequested(run_id=run_id, reason=body.reason or NO_REASON, requested_by=who.name)
        event = make_event(
            data,
            source="/temporality/journal",
            # The same person asking again for the same reason is the same fact (JetStream dedupes it).
            id=derive_id("evt", RunCancelRequested.EVENT_TYPE, run_id, who.name, data.reason),
            run_id=run_id,
            actor=f"token:{who.name}",
        )
        try:
            await bus.publish(event)
        except TransientError as exc:
            log.warning("cancel.bus_unavailable", run_id=run_id, error=repr(exc))
            raise Unavailable(
                "the message bus did not take the request; try again", code="bus_unavailable", retry_after_s=5
            ) from exc
        log.info("run.cancel_requested", run_id=run_id, requested_by=who.name, ce_id=event.id)
        return CancelAccepted(status="cancel_requested", run_id=run_id, event_id=event.id, requested_by=who.name)

    @app.get(
        "/runs/{run_id:path}/asks",
        response_model=RunAsks,
        responses={404: {"model": ErrorBody}},
        description="COL-9: the agent asks this run sent (``sent``: it is the asker) and received (``received``: "
        "it is the recipient, or the finished run a relay answered for), each oldest first. 404 for a run the "
        "journal knows nothing of.",
    )
    async def run_asks(
        run_id: Annotated[str, Path(max_length=MAX_TEXT_PARAM, pattern=NO_NUL)],
        who: AsViewer,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="At most this many of each")] = MAX_LIMIT,
    ) -> RunAsks:
        order = (col(AskRecord.asked_at), col(AskRecord.request_id))
        async with database.sessions() as session:
            sent = (
                await session.exec(
                    select(AskRecord).where(col(AskRecord.asker_run_id) == run_id).order_by(*order).limit(limit)
                )
            ).all()
            received = (
                await session.exec(
                    select(AskRecord)
                    .where(
                        or_(col(AskRecord.recipient_run_id) == run_id, col(AskRecord.resolved_run_id) == run_id),
                        or_(col(AskRecord.asker_run_id).is_(None), col(AskRecord.asker_run_id) != run_id),
                    )
                    .order_by(*order)
                    .limit(limit)
                )
            ).all()
            if not sent and not received and not await _run_known(session, run_id):
                raise _run_not_found(run_id)
        return RunAsks(run_id=run_id, sent=[AskView.of(a) for a in sent], received=[AskView.of(a) for a in received])

    @app.get(
        "/runs/{run_id:path}",
        response_model=RunView,
        responses={404: {"model": ErrorBody}, 503: {"model": ErrorBody, "description": _BEHIND}},
        description="One run. A run the journal knows only from events that make no run row yet (a trigger's "
        "acceptance, a notification, an agent message to a relay run ...) is answered from those events with "
        "``projected: false`` (state pending); 404 only for an id no journaled event names. ``min_seq``: first "
        "wait until the journal has recorded the stream that far.",
    )
    async def get_run(
        run_id: Annotated[str, Path(max_length=MAX_TEXT_PARAM, pattern=NO_NUL)], who: AsViewer, recorded: CaughtUp
    ) -> RunView:
        async with database.sessions() as session:
            record = await session.get(RunRecord, run_id)
            known = await _run_from_events(session, run_id) if record is None else None
            several = await _several_waits(session, [] if record is None else [record])
            card = await _agent_card(session, run_id) if record is not None else None
        if record is not None:
            view = RunView.of(record, datetime.now(UTC), several.get(run_id))
            return view if card is None else view.model_copy(update={"agent_card": card})
        if known is None:
            raise _run_not_found(run_id)
        return known

    @app.get(
        "/asks",
        response_model=AskList,
        description="COL-9: agent asks, newest first (by asked_at, then request id): who asked whom (``to`` as "
        "written, ``resolved_*`` as resolved), the state (AGENT_ASK), the relay run, the answer or refusal, and "
        "why it went nowhere (``reason``, ``detail``). Filters combine with AND; page with ``before`` = the "
        "previous page's ``next_before``.",
    )
    async def list_asks(
        who: AsViewer,
        state: Annotated[AgentAskState | None, Query(description="Only asks in this state")] = None,
        agent: Annotated[str | None, _text("Only asks this agent sent or that resolved to it")] = None,
        saga_id: Annotated[str | None, _text("Only asks of this saga (the events' correlation id)")] = None,
        run_id: Annotated[str | None, _text("Only asks this run sent, received or answered through a relay")] = None,
        since: Annotated[datetime | None, Query(description="Only asks asked at or after (ISO 8601)")] = None,
        until: Annotated[datetime | None, Query(description="Only asks asked before (ISO 8601)")] = None,
        before: Annotated[str | None, _text("Opaque cursor: the next_before of the previous page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="At most this many asks")] = 100,
    ) -> AskList:
        since, until = _utc(since, "since"), _utc(until, "until")
        if since is not None and until is not None and since > until:
            raise Unprocessable("query.since: must not be after until")
        conditions: list[ColumnElement[bool]] = []
        if state is not None:
            conditions.append(col(AskRecord.state) == state.value)
        if agent is not None:
            conditions.append(or_(col(AskRecord.asker_agent) == agent, col(AskRecord.resolved_agent) == agent))
        if saga_id is not None:
            conditions.append(col(AskRecord.correlation_id) == saga_id)
        if run_id is not None:
            conditions.append(
                or_(
                    col(AskRecord.asker_run_id) == run_id,
                    col(AskRecord.recipient_run_id) == run_id,
                    col(AskRecord.resolved_run_id) == run_id,
                )
            )
        if since is not None:
            conditions.append(col(AskRecord.asked_at) >= since)
        if until is not None:
            conditions.append(col(AskRecord.asked_at) < until)
        conditions += older_than(before, col(AskRecord.asked_at), col(AskRecord.request_id))
        query = (
            select(AskRecord)
            .where(*conditions)
            .order_by(col(AskRecord.asked_at).desc(), col(AskRecord.request_id).desc())
            .limit(limit + 1)
        )
        async with database.sessions() as session:
            records = list((await session.exec(query)).all())
        more = len(records) > limit
        records = records[:limit]
        next_before = encode_cursor(records[-1].asked_at, records[-1].request_id) if more else None
        return AskList(asks=[AskView.of(a) for a in records], next_before=next_before)

    @app.get(
        "/events",
        response_model=EventList,
        responses={503: {"model": ErrorBody, "description": _BEHIND}},
        description="The journaled events, newest first in the journal's commit order (``commit_seq``, the "
        "live tail's cursor), not by stream sequence: an event JetStream redelivered late is where it was "
        "committed. Page with ``before`` = ``next_before``; to follow live from a page, open "
        "``/events/stream`` with ``after`` = the first item's ``commit_seq``. Filters combine with AND. A viewer "
        "gets no event of the audit trail about who may do what (refused access, directory changes, agent "
        "registrations and policies, NATS permission refusals: operator only, GET /audit): they are left out. "
        "``type`` repeats (any of them) and takes families (``human.>``). ``min_seq``: first wait until the journal "
        "has recorded the stream that far.",
    )
    async def list_events(
        who: AsViewer,
        recorded: CaughtUp,
        type_: EventTypeParam = None,
        run_id: Annotated[str | None, _text("Only this run's events")] = None,
        before: Annotated[
            NonNegativeInt64 | None,
            Query(
                description="Only events committed before this cursor (``commit_seq``: the next_before of the "
                "previous page)"
            ),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    ) -> EventList:
        types = _type_filter(type_)
        query = select(EventRecord)
        if not who.may(Role.operator):  # who may do what is the operator's (GET /audit): OPERATOR_ONLY_TYPES
            query = query.where(not_(audited(OPERATOR_ONLY_TYPES)))
        if types is not None:
            query = query.where(types)
        if run_id is not None:
            query = query.where(col(EventRecord.run_id) == run_id)
        if before is not None:
            query = query.where(col(EventRecord.commit_seq) < before)
        query = query.order_by(col(EventRecord.commit_seq).desc()).limit(limit + 1)
        async with database.sessions() as session:
            records = list((await session.exec(query)).all())
        more = len(records) > limit
        records = records[:limit]
        return EventList(
            events=[EventView.of(r) for r in records], next_before=records[-1].commit_seq if more else None
        )

    @app.get(
        "/events/stream",
        response_class=EventStreamResponse,
        responses={
            200: {
                "description": "text/event-stream of journaled events",
                "content": {"text/event-stream": {"itemSchema": SSE_ITEM_SCHEMA}},
            },
            # refusals come before the stream starts: JSON, as everywhere
            **{
                code: {"description": "Refused", "content": {"application/json": {"schema": _ERROR_REF}}}
                for code in (401, 403, 422)
            },
        },
        description="A live tail over Server-Sent Events: each event's ``id`` is its cursor (``commit_seq``: "
        "opaque, increasing; the journal's commit order, not the stream sequence), ``event`` its "
        "CloudEvent type, ``data`` the JSON of a ``GET /events`` item. Every journaled event is sent exactly "
        "once, in commit order, also across reconnects and with several journal replicas. Starts after "
        "``Last-Event-ID`` (a reconnect), else after the cursor ``after`` (0: from the beginning), else from "
        "now; the first line is the comment ``: tail after <cursor>``. Filters combine with AND. See "
        "docs/journal.md. A viewer's stream leaves out the events of the audit trail (operator only: "
        "``audited=true`` is a 403 for a viewer). A stream opened with a sign-in session ends (the comment "
        "``: session ended``) once the session is signed out, expires or is ended by the directory.",
    )
    async def stream_events(
        who: AsViewer,
        request: Request,
        resume: Annotated[int | None, Depends(_last_event_id)],
        run_id: Annotated[str | None, _text("Only this run's events")] = None,
        type_: EventTypeParam = None,
        after: Annotated[
            NonNegativeInt64 | None,
            Query(description="Start after this cursor (an SSE id, a ``commit_seq``; 0: from the start)"),
        ] = None,
        audited_only: Annotated[
            bool,
            Query(
                alias="audited",
                description="Only the events the audit trail lists (``GET /audit``: trigger and directory changes, "
                "cancel requests, reruns, refusals ...): the console's Audit page reads its new entries when one "
                "arrives",
            ),
        ] = False,
    ) -> EventStreamResponse:
        gone = anyio.Event()
        operator = who.may(Role.operator)
        if audited_only and not operator:  # the audit trail's tail, as GET /audit: a 403, audited like any
            audited_auth.admit(request, request.headers.get("authorization"), Role.operator)
        # a viewer's tail leaves the audit trail's events out (but trigger changes, cancel requests, reruns)
        where = [audited()] if audited_only else [] if operator else [not_(audited(OPERATOR_ONLY_TYPES))]
        types = _type_filter(type_)
        if types is not None:
            where.append(types)
        # a sign-in session is checked again while the stream lasts: signed out or expired, it ends
        still_admitted = signin.session_check(request) if signin is not None else None

        async def events() -> AsyncIterator[bytes]:
            log.info("tail.opened", principal=who.name, run_id=run_id, type=type_, audited=audited_only)
            try:
                async for message in tail.stream(
                    after=resume if resume is not None else after,
                    run_id=run_id,
                    type_=None,  # in ``where``: several types and families
                    render=lambda row: EventView.of(row).model_dump(mode="json"),
                    gone=gone,
                    where=where,
                    still_admitted=still_admitted,
                ):
                    yield message
            finally:
                log.info("tail.closed", principal=who.name, client_gone=gone.is_set())

        return EventStreamResponse(events(), gone)

    @app.get(
        "/audit",
        response_model=AuditList,
        responses={403: {"model": ErrorBody}},
        description="Operator: the audit trail of critical actions, newest first (by time, then event id): "
        "trigger changes, directory (user/group) changes, cancel requests, refused human requests "
        "(recipient_not_allowed), reruns of accepted deliveries (run.requested with launch.rerun_of: who asked), "
        "undeliverable agent asks and replies, dead letters, refused API access and "
        "webhook credentials (every service's), NATS permissions violations. Each with who (``actor``), "
        "what (``type``, ``kind``, ``target``, ``summary``) and when; ``details`` is the event's data with "
        "credential-like values redacted. Filters combine with AND; page with ``before`` = ``next_before``.",
    )
    async def audit(
        who: AsOperator,
        type_: Annotated[
            str | None,
            Query(
                alias="type",
                max_length=MAX_TEXT_PARAM,
                pattern=EXACT_TYPE,
                description="Only this audited event type (exact: no * or >)",
            ),
        ] = None,
        kind: Annotated[str | None, _text("Only this kind (trigger_change, cancellation, ...)")] = None,
        actor: Annotated[str | None, _text("Only actions by this token name / file (or CloudEvent actor)")] = None,
        since: Annotated[datetime | None, Query(description="Only actions at or after (ISO 8601)")] = None,
        until: Annotated[datetime | None, Query(description="Only actions before (ISO 8601)")] = None,
        before: Annotated[str | None, _text("Opaque cursor: the next_before of the previous page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="At most this many entries")] = 100,
    ) -> AuditList:
        t = EVENTS_TABLE.c
        conditions = _audit_conditions(type_=type_, kind=kind, actor=actor, since=since, until=until)
        conditions += older_than(before, t.time, t.id)
        query = (
            sa_select(t.id, t.type, t.time, t.actor, t.run_id, t.stream_seq, t.data)
            .where(*conditions)
            .order_by(t.time.desc(), t.id.desc())
            .limit(limit + 1)
        )
        async with database.sessions() as session:
            rows = (await (await session.connection()).execute(query)).all()
        more = len(rows) > limit
        entries = [
            audit_entry(
                id=i,
                type=ty,
                time=as_utc(tm),
                actor=a,
                run_id=r,
                stream_seq=seq,
                data=d if isinstance(d, dict) else {},
            )
            for i, ty, tm, a, r, seq, d in rows[:limit]
        ]
        log.debug("audit.read", principal=who.name, entries=len(entries))
        next_before = encode_cursor(entries[-1].time, entries[-1].id) if more else None
        return AuditList(entries=entries, next_before=next_before)

    @app.get(
        "/triggers",
        response_model=TriggerList,
        description="UI-2, what the journal knows from events: per trigger id (seen in a trigger.* event or on "
        "a run), its deliveries (received, accepted, rejected by reason, the last one's time), its last run and "
        "its runs (completed, failed, cancelled, needed a human); its source (adapter) and event types from its "
        "deliveries; its type, agent and enabled flag from the trigger API's audit events (trigger.created, "
        ".updated, .enabled, .disabled, .deleted; the agent else from trigger.accepted). The trigger API holds "
        "the definitions; this is what the journal saw.",
    )
    async def list_triggers(who: AsViewer) -> TriggerList:
        async with database.sessions() as session:
            events = await _event_rows(session, col(EventRecord.type).in_(TRIGGER_TYPES + TRIGGER_CHANGE_TYPES))
            runs = await _run_rows(session, [col(RunRecord.trigger_id).is_not(None)])
            asked = set(
                (
                    await session.exec(
                        select(EventRecord.run_id)
                        .where(col(EventRecord.type) == "human.requested", col(EventRecord.run_id).is_not(None))
                        .distinct()
                    )
                ).all()
            )
        return TriggerList(triggers=triggers_of(events, runs, {a for a in asked if a is not None}))

    @app.get(
        "/triggers/{trigger_id}/deliveries",
        response_model=DeliveryList,
        description="One trigger's deliveries, newest first: delivery id, the source's event type, outcome "
        "(accepted / rejected / received), reason, run id, time. An unknown trigger has none (200, empty).",
    )
    async def trigger_deliveries(
        who: AsViewer,
        trigger_id: Annotated[str, Path(max_length=MAX_TEXT_PARAM, pattern=NO_NUL)],
        before: Annotated[str | None, _text("Opaque cursor: the next_before of the previous page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="At most this many deliveries")] = 100,
    ) -> DeliveryList:
        cursor = decode_cursor(before) if before is not None else None
        data = EVENTS_TABLE.c.data
        async with database.sessions() as session:
            events = await _event_rows(
                session, col(EventRecord.type).in_(TRIGGER_TYPES), data["trigger_id"].as_string() == trigger_id
            )
        deliveries = deliveries_of(events)
        if cursor is not None:
            deliveries = [d for d in deliveries if (d.time, d.delivery_id) < (cursor.time, cursor.key)]
        page = deliveries[:limit]
        more = len(deliveries) > limit
        return DeliveryList(
            trigger_id=trigger_id,
            deliveries=page,
            next_before=encode_cursor(page[-1].time, page[-1].delivery_id) if more else None,
        )

    @app.get(
        "/analytics/human",
        response_model=HumanAnalytics,
        description="OBS-1 over the runs created in [since, until) (optionally one agent's / one trigger's) "
        "and all their human requests: how many runs asked a human, requests answered / expired / rejected / "
        "pending, the wait-time distribution of answered requests (nearest-rank percentiles; histogram "
        "buckets by exclusive upper bound in seconds, the last open), the most frequent questions, and the "
        "same counts per agent, per trigger and per stage (`by_stage`: the turn of its run each question was asked in, with the runs that reached "
        "that turn and the share of them that asked there). Why agents ask (ask_human's optional reason and "
        "reason_kind): `by_reason_kind` (missing_knowledge, decision, approval, ambiguity; null: not given) and "
        "`top_reasons`; which decisions are delegated: each of `top_questions` names its options with how often "
        "a person chose each (human.answered, joined by request_id), the timeout default took it, and free-text "
        "answers.",
    )
    async def human_stats(
        who: AsViewer,
        since: Annotated[datetime | None, Query(description="Runs created at or after (ISO 8601)")] = None,
        until: Annotated[datetime | None, Query(description="Runs created before (ISO 8601)")] = None,
        agent: Annotated[str | None, _text("Only runs of this agent (case-insensitive)")] = None,
        trigger_id: Annotated[str | None, _text("Only runs launched by this trigger (case-insensitive)")] = None,
        top: Annotated[
            int, Query(ge=1, le=100, description="How many of the most frequent questions (and of top_reasons)")
        ] = 10,
    ) -> HumanAnalytics:
        conditions = _run_filters(database, agent=agent, trigger_id=trigger_id, since=since, until=until)
        run_ids = select(RunRecord.run_id).where(*conditions)
        async with database.sessions() as session:
            runs = await _run_rows(session, conditions)
            events = await _event_rows(
                session,
                col(EventRecord.type).in_((*HUMAN_TYPES, *RUN_END_TYPES)),
                col(EventRecord.run_id).in_(run_ids),
            )
        return human_analytics(
            runs,
            events,
            since=_utc(since, "since"),
            until=_utc(until, "until"),
            top=top,
        )

    return app


class _ConsoleFiles(StaticFiles):
    """The console's static files with a strict Content-Security-Policy (no data in them: no token needed)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(CONSOLE_HEADERS)
        return response


async def _last_event_id(
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", description="Resume after this id (sent by EventSource)")
    ] = None,
) -> int | None:
    """The cursor an SSE client resumes after; 422 for anything but a non-negative int64."""
    if last_event_id is None or not last_event_id.strip():
        return None
    value = last_event_id.strip()
    if not value.isascii() or not value.isdigit() or len(value) > 19 or int(value) > 2**63 - 1:
        raise Unprocessable(
            "header.Last-Event-ID: must be an id this stream sent (a cursor)", code="invalid_last_event_id"
        )
    return int(value)


def _text(description: str) -> Any:
    """A bounded string query parameter without NUL."""
    return Query(description=description, max_length=MAX_TEXT_PARAM, pattern=NO_NUL)


def _type_filter(types: Sequence[str] | None) -> ColumnElement[bool] | None:
    """The condition of ``type=`` on /events and /events/stream (None: every type): any of ``types``, each an exact
    event type or a family in NATS wording -- ``human.>`` every type below ``human`` (one token or more, as a NATS
    filter ``temporality.events.human.>``), ``>`` alone every type. 422 for ``*`` (a NATS one-token wildcard: an
    event type has one or more tokens below its family, so ``human.*`` would miss ``human.directory.changed``), a
    ``>`` anywhere but as the last token, an empty token in a family, NUL, a value over 200 characters or more than
    :data:`MAX_TYPES` of them."""
    if not types:
        return None
    if len(types) > MAX_TYPES:
        raise Unprocessable(f"query.type: at most {MAX_TYPES} types or families, {len(types)} given")
    exact: list[str] = []
    families: list[str] = []
    for value in types:
        shown = repr(value[:64]) + ("…" if len(value) > 64 else "")
        if len(value) > MAX_TEXT_PARAM or "\x00" in value:
            raise Unprocessable(f"query.type: {shown} is too long or holds NUL (at most {MAX_TEXT_PARAM} characters)")
        if value == ">":
            return None  # every type, as the NATS filter temporality.events.>
        if "*" in value:
            raise Unprocessable(
                f"query.type: {shown}: * is not supported (on NATS it matches one token only, so human.* misses "
                "human.directory.changed); write the family as human.> (every type below human), or list the types"
            )
        if value.endswith(".>"):
            family = value[:-2]
            if ">" in family or not family or any(not token for token in family.split(".")):
                raise Unprocessable(
                    f"query.type: {shown} is no family: write it as <token>[.<token>...].>, e.g. human.>"
                )
            families.append(family)
        elif ">" in value:
            raise Unprocessable(f"query.type: {shown}: > is a family's last token only, as in human.>")
        else:
            exact.append(value)
    column = col(EventRecord.type)
    conditions: list[ColumnElement[bool]] = []
    if len(exact) == 1:
        conditions.append(column == exact[0])  # one exact type: the query it always was
    elif exact:
        conditions.append(column.in_(sorted(set(exact))))
    conditions += [column.startswith(f"{family}.", autoescape=True) for family in sorted(set(families))]
    return conditions[0] if len(conditions) == 1 else or_(*conditions)


def _audit_conditions(
    *, type_: str | None, kind: str | None, actor: str | None, since: datetime | None, until: datetime | None
) -> list[ColumnElement[bool]]:
    """The conditions on ``events`` of ``GET /audit`` and its live tail: audited, of ``type_`` / ``kind``, by
    ``actor``, in [``since``, ``until``) (event time); 422 for an unknown type or kind or an empty time range."""
    types = sorted(AUDIT_KINDS)
    if type_ is not None:
        if type_ not in AUDIT_KINDS:
            raise Unprocessable(f"query.type: not an audited event type; one of {', '.join(types)}")
        types = [type_]
    if kind is not None:
        kinds = sorted(set(AUDIT_KINDS.values()))
        if kind not in kinds:
            raise Unprocessable(f"query.kind: unknown kind; one of {', '.join(kinds)}")
        types = [t for t in types if AUDIT_KINDS[t] == kind]
    since, until = _utc(since, "since"), _utc(until, "until")
    if since is not None and until is not None and since > until:
        raise Unprocessable("query.since: must not be after until")
    t = EVENTS_TABLE.c
    conditions: list[ColumnElement[bool]] = [audited(types)]
    if actor is not None:
        conditions.append(actor_matches(actor))
    if since is not None:
        conditions.append(t.time >= since)
    if until is not None:
        conditions.append(t.time < until)
    return conditions


def _run_filters(
    database: Database,
    *,
    agent: str | None,
    trigger_id: str | None,
    since: datetime | None,
    until: datetime | None,
) -> list[ColumnElement[bool]]:
    since, until = _utc(since, "since"), _utc(until, "until")
    if since is not None and until is not None and since > until:
        raise Unprocessable("query.since: must not be after until")
    conditions: list[ColumnElement[bool]] = []
    # both case-insensitive, beyond ASCII: "Reviewer" finds reviewer's runs, "ADO-PR-REVIEW" ado-pr-review's
    # (no index on either column to lose)
    if agent is not None:
        conditions.append(_folded_equal(database, col(RunRecord.agent), agent))
    if trigger_id is not None:
        conditions.append(_folded_equal(database, col(RunRecord.trigger_id), trigger_id))
    if since is not None:
        conditions.append(col(RunRecord.created_at) >= since)
    if until is not None:
        conditions.append(col(RunRecord.created_at) < until)
    return conditions


def _folded_equal(database: Database, column: Any, value: str) -> ColumnElement[bool]:
    return database.folded(column) == database.folded(literal(value, String()))


def _utc(value: datetime | None, name: str) -> datetime | None:
    """``value`` in UTC (naive: taken as UTC); 422 when it has no UTC equivalent (year 1 or 9999 at an offset)."""
    if value is None:
        return None
    try:
        return as_utc(value)
    except OverflowError:
        raise Unprocessable(f"query.{name}: out of the representable range in UTC") from None


async def _run_known(session: AsyncSession, run_id: str) -> bool:
    """Whether the journal has a row or any event of ``run_id``."""
    if await session.get(RunRecord, run_id) is not None:
        return True
    return (await session.exec(select(EventRecord.id).where(EventRecord.run_id == run_id).limit(1))).first() is not None


#: The events that say what became of a question (:func:`_several_waits`).
_QUESTION_TYPES = ("human.requested", "human.notified", "human.answered", "human.expired")


async def _several_waits(session: AsyncSession, records: Sequence[RunRecord]) -> dict[str, list[WaitingRequest]]:
    """Per run of ``records`` that waits on several questions at once (HUM-7: ``waiting_request_id`` null), each
    question of the turn it is parked on, from the run's ``human.*`` events: the questions of the latest turn that
    asked (``human.requested``'s ``turn``), each with its channel and its outcome so far. One query for them all."""
    ids = [r.run_id for r in records if r.state == RunState.WAITING_FOR_HUMAN and r.waiting_request_id is None]
    if not ids:
        return {}
    t = EVENTS_TABLE.c
    query = (
        sa_select(t.run_id, t.type, t.time, t.data)
        .where(t.run_id.in_(ids), t.type.in_(_QUESTION_TYPES))
        .order_by(t.run_id, t.stream_seq)
    )
    rows = (await (await session.connection()).execute(query)).all()
    asked: dict[str, dict[str, tuple[int, WaitingRequest]]] = {}
    outcomes: dict[tuple[str, str], dict[str, Any]] = {}
    for run_id, kind, time, data in rows:
        request_id = data.get("request_id")
        if not isinstance(request_id, str):
            continue
        if kind == "human.requested":
            turn = data.get("turn")
            asked.setdefault(run_id, {}).setdefault(
                request_id,
                (
                    turn if isinstance(turn, int) else -1,
                    WaitingRequest(
                        request_id=request_id,
                        recipient=str(data.get("recipient", "")),
                        question=str(data.get("question", "")),
                        channel=None,
                        since=as_utc(time),
                        status="pending",
                    ),
                ),
            )
        else:
            outcomes.setdefault((run_id, request_id), {})[kind] = data
    several: dict[str, list[WaitingRequest]] = {}
    for run_id, questions in asked.items():
        latest = max(turn for turn, _ in questions.values())
        shown = []
        for turn, request in questions.values():
            if turn != latest:
                continue
            facts = outcomes.get((run_id, request.request_id), {})
            notified, answered = facts.get("human.notified"), facts.get("human.answered")
            update: dict[str, Any] = {}
            if notified is not None and isinstance(notified.get("channel"), str):
                update["channel"] = notified["channel"]
            if answered is not None:
                responder, name = answered.get("responder"), answered.get("responder_display_name")
                update |= {
                    "status": "answered",
                    "responder": responder if isinstance(responder, str) else None,
                    "responder_display_name": name if isinstance(name, str) and name else None,
                }
                if isinstance(answered.get("channel"), str):
                    update["channel"] = answered["channel"]
            elif "human.expired" in facts:
                update["status"] = "expired"
            shown.append(request.model_copy(update=update))
        several[run_id] = sorted(shown, key=lambda r: (r.since, r.request_id))
    return several


async def _agent_card(session: AsyncSession, run_id: str) -> AgentSummary | None:
    """RUN-1: the agent card summary of the run's latest ``run.started`` (``None``: none, or one without it)."""
    t = EVENTS_TABLE.c
    data = (
        await (await session.connection()).execute(
            sa_select(t.data)
            .where(t.run_id == run_id, t.type == RunStarted.EVENT_TYPE)
            .order_by(t.stream_seq.desc())
            .limit(1)
        )
    ).scalar()
    card = data.get("agent_card") if isinstance(data, dict) else None
    try:
        return AgentSummary.model_validate(card) if isinstance(card, dict) else None
    except ValidationError:  # a malformed card (the recorder keeps what it could not read too): not shown
        return None


#: How many of an event-only run's events :func:`_run_from_events` reads (oldest first) for its facts.
_EVENT_ONLY_SCAN = 50


async def _run_from_events(session: AsyncSession, run_id: str) -> RunView | None:
    """What the events of a run without a row say about it (``projected: false``), or None without any."""
    t = EVENTS_TABLE.c
    bounds = (
        await (await session.connection()).execute(
            sa_select(func.min(t.time), func.max(t.time), func.max(t.stream_seq)).where(t.run_id == run_id)
        )
    ).one()
    if bounds[0] is None:
        return None
    rows = (
        await (await session.connection()).execute(
            sa_select(t.data).where(t.run_id == run_id).order_by(t.stream_seq).limit(_EVENT_ONLY_SCAN)
        )
    ).all()
    found: dict[str, str] = {}
    for (data,) in rows:
        if not isinstance(data, dict):
            continue
        raw_launch = data.get("launch")
        launch: dict[str, Any] = raw_launch if isinstance(raw_launch, dict) else {}
        for key, value in (
            ("agent", data.get("agent")),
            ("agent", data.get("resolved_agent") if data.get("recipient_run_id") == run_id else None),
            ("title", data.get("title")),
            ("trigger_id", data.get("trigger_id") or launch.get("trigger_id")),
            ("launch_kind", launch.get("kind")),
            ("rerun_of", launch.get("rerun_of")),
            ("rerun_requested_by", launch.get("requested_by")),
        ):
            if isinstance(value, str) and value and key not in found:
                found[key] = value
    return RunView(
        run_id=run_id,
        state=RUN.initial,
        agent=found.get("agent"),
        title=found.get("title"),
        trigger_id=found.get("trigger_id"),
        launch_kind=found.get("launch_kind"),
        rerun_of=found.get("rerun_of"),
        rerun_requested_by=found.get("rerun_requested_by"),
        created_at=as_utc(bounds[0]),
        updated_at=as_utc(bounds[1]),
        started_at=None,
        finished_at=None,
        result=None,
        error=None,
        last_event_seq=bounds[2],
        waiting=None,
        projected=False,
    )


async def _event_rows(session: AsyncSession, *conditions: ColumnElement[bool]) -> list[EventRow]:
    t = EVENTS_TABLE.c
    query = sa_select(t.type, t.time, t.run_id, t.data).where(*conditions).order_by(t.stream_seq)
    rows = (await (await session.connection()).execute(query)).all()
    return [EventRow(type=t, time=as_utc(tm), run_id=r, data=d if isinstance(d, dict) else {}) for t, tm, r, d in rows]


async def _run_rows(session: AsyncSession, conditions: list[ColumnElement[bool]]) -> list[RunRow]:
    t = RUNS_TABLE.c
    query = sa_select(t.run_id, t.state, t.agent, t.trigger_id, t.created_at).where(*conditions)
    rows = (await (await session.connection()).execute(query)).all()
    return [RunRow(run_id=i, state=str(s), agent=a, trigger_id=t, created_at=as_utc(c)) for i, s, a, t, c in rows]
