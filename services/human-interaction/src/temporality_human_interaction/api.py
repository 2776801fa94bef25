"""The HTTP API: the web inbox, answer binding and the directory API (:mod:`.directory_api`).

Every error is JSON ``{"error": "<code>", "detail": "<sentence>"}``. A person is identified by
``Authorization: Bearer <inbox token>`` (their profile's ``inbox_token``), never by a user id in
the request -- except one the journal vouches for: a person signed in to the console (OIDC) comes with
``X-Temporality-Vouched-User``, an assertion of their user id signed with the secret the two services share
(``TEMPORALITY_INBOX_VOUCH_SECRET_FILE``, :mod:`temporality_service.vouch`; valid 60 s, the user must be in
the directory); without that secret here, every such header is a 401. Every NATS call runs under ``settings.bus_timeout_s``; a bus that does not answer in
time (or refuses) is a 503, never a hung request.

=========================================  ==================================================
``GET /healthz``, ``GET /readyz``          liveness / readiness (the service runtime's)
``GET /inbox``                             the caller's pending requests, newest first (each with its
                                           form, ``answer_schema`` and ``form``, when it asks for one)
``GET /requests/{request_id}``             one request (only its recipient may read it)
``POST /requests/{request_id}/answer``     ``{"option_id": ...}`` or ``{"text": ...}``
``/directory/users``, ``/directory/groups``  the directory API (role tokens, see :mod:`.directory_api`)
=========================================  ==================================================

The inbox routes authenticate a person by inbox token against the live directory (an API change
applies as soon as this replica's watch has it); the directory routes take API role tokens.

Wrong inbox tokens count against the client address with wrong role tokens (one limiter: the app's
:class:`~temporality_service.ApiAuth`'s, ``TEMPORALITY_API_MAX_FAILURES_PER_ADDRESS`` within
``TEMPORALITY_API_FAILURE_WINDOW_S``, :mod:`temporality_service.limits`): past the limit, a request of that address
presenting an inbox token is a ``429 too_many_failures`` with ``Retry-After``, audited as reason
``too_many_failures``; other addresses and vouched-for people are not affected.

Answering: 200 with the request; the identical answer again from the same person is also 200, with
``"already_recorded": true`` (whenever it arrives); anything else on an answered request is 409
``already_answered``; 403 ``not_recipient``, 404 ``unknown_request``, 409 ``expired`` / ``cancelled``,
422 ``invalid_answer`` (an option it does not have, text where it takes options, or an answer that does not
fit its form, ``answer_schema``: the detail names the field).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import nats.errors
import structlog
from fastapi import Depends, FastAPI, Header, Request
from pydantic import BaseModel, Field, ValidationError

from temporality_bus import Bus, TransientError
from temporality_human_interaction.answers import AnswerSubmission, RequestNotFound, check_recipient
from temporality_human_interaction.channels import AnswerSink, InboundAnswer
from temporality_human_interaction.channels.render import if_nobody_answers
from temporality_human_interaction.directory import Directory, recipient_for, user_id_of
from temporality_human_interaction.directory_api import OPENAPI_SCHEMAS as DIRECTORY_SCHEMAS
from temporality_human_interaction.directory_api import directory_router
from temporality_human_interaction.egress import DEFAULT_POLICY, EgressPolicy
from temporality_human_interaction.events import responder_display_name
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.inbox import list_inbox
from temporality_human_interaction.mirror import ChannelMirror
from temporality_human_interaction.records import HumanRequestRecord, is_request_id, open_store
from temporality_human_interaction.settings import Settings
from temporality_human_interaction.store import DirectoryStore
from temporality_human_interaction.validation import summary
from temporality_protocol import HumanAnswer, HumanOption, HumanRequestState, SourceLink
from temporality_protocol.events import HumanAskKind
from temporality_protocol.forms import field_choices, form_fields
from temporality_service import (
    HTTP_TELEMETRY,
    VOUCH_HEADER,
    ApiAuth,
    ErrorBody,
    TooManyFailures,
    Unauthorized,
    Unavailable,
    Unprocessable,
    Voucher,
    client_address,
    install_error_handlers,
    parse_json,
    read_body,
)
from temporality_service.audit import audit_refusal
from temporality_service.openapi import add_schemas, component_schemas, json_body, operation

__all__ = ["AtDeadline", "FormChoice", "FormField", "InboxItem", "InboxView", "RequestView", "create_app"]

log = structlog.get_logger(__name__)

#: Answers bound through this API arrive on the web channel.
WEB_CHANNEL = "web"


class FormChoice(BaseModel):
    """One value of a closed form field, with its label."""

    value: Any
    label: str


class FormField(BaseModel):
    """One field of a request's form (``answer_schema``), as a front end renders it: name, JSON type, whether
    it is required, its title and description, and its closed set of values when it has one."""

    name: str
    type: str | None = None
    required: bool = False
    title: str | None = None
    description: str | None = None
    #: The values the field takes (an enum, a boolean's yes/no, ``oneOf`` consts); None: free input.
    choices: list[FormChoice] | None = None

    @classmethod
    def all_of(cls, schema: dict[str, Any]) -> list[FormField]:
        required = schema.get("required")
        needed = {str(n) for n in required} if isinstance(required, list) else set()
        fields: list[FormField] = []
        for name, prop in form_fields(schema).items():
            kind, title, description = prop.get("type"), prop.get("title"), prop.get("description")
            choices = field_choices(prop)
            fields.append(
                cls(
                    name=name,
                    type=kind if isinstance(kind, str) else None,
                    required=name in needed,
                    title=title if isinstance(title, str) else None,
                    description=description if isinstance(description, str) else None,
                    choices=None if choices is None else [FormChoice(value=v, label=label) for v, label in choices],
                )
            )
        return fields


class AtDeadline(BaseModel):
    """What happens at the request's deadline (``expires_at``) when nobody answered: its policy's ``on_timeout``
    as it applies to this question (a default option the question does not have is ``fail``)."""

    action: Literal["default", "fail", "cancel"] = Field(
        description="default: the run goes ahead with default_option; fail: the run stops without an answer; "
        "cancel: the run is cancelled."
    )
    default_option: str | None = Field(
        default=None, description="The option taken at the deadline (its id, one of options) when action is default."
    )
    text: str = Field(
        description="The sentence the Telegram and Matrix messages end with, deadline included: "
        "'No answer by 2026-12-07 12:38 UTC → I go with “Keep v1”.'"
    )

    @classmethod
    def of(cls, record: HumanRequestRecord) -> AtDeadline:
        on_timeout = record.policy.on_timeout
        text = if_nobody_answers(record)
        if on_timeout.action == "default" and on_timeout.default_option is not None:
            return cls(action="default", default_option=on_timeout.default_option, text=text)
        return cls(action="cancel" if on_timeout.action == "cancel" else "fail", text=text)


class InboxItem(BaseModel):
    id: str
    run_id: str
    title: str
    question: str
    context: str
    reason: str | None = Field(
        default=None,
        description="OBS-1: why the agent asks, in its own short phrase (ask_human's `reason`, at most 200 "
        "characters, redacted), shown to the person with the question; null when the agent gave none.",
    )
    reason_kind: HumanAskKind | None = Field(
        default=None,
        description="OBS-1: what kind of help it asks for (ask_human's `reason_kind`): missing_knowledge, decision, "
        "approval or ambiguity; null when the agent gave none.",
    )
    options: list[HumanOption]
    allow_free_text: bool
    channel: str | None
    created_at: datetime
    expires_at: datetime
    at_deadline: AtDeadline = Field(description="What happens at expires_at when nobody answered (HUM-5).")
    waiting_s: float
    #: The run's source to open (the PR's web page ...), when its launch event had one (HUM-5).
    source_link: SourceLink | None = None
    #: The form a text answer must fit (``human.requested``'s ``answer_schema``, an MCP elicitation's requested
    #: schema, JSON Schema 2020-12), as stored; None: any answer the options / free text allow.
    answer_schema: dict[str, Any] | None = None
    #: The same form's fields, ready to render (empty without a form). The answer is still one text: one
    #: field takes the whole text, several are ``name: value`` lines or a JSON object
    #: (``temporality_protocol.forms``); a misfit is a 422 ``invalid_answer`` naming the field.
    form: list[FormField] = Field(default_factory=list)

    @classmethod
    def of(cls, record: HumanRequestRecord, now: datetime) -> InboxItem:
        return cls(**_common(record, now))


class RequestView(InboxItem):
    agent: str
    #: The asking agent's display name (its card's); None: show ``agent``.
    agent_display_name: str | None = None
    recipient: str
    status: HumanRequestState
    answer: HumanAnswer | None
    responder: str | None
    #: The responder's directory display name (``human.answered``'s); None: show ``responder``.
    responder_display_name: str | None = None
    answered_at: datetime | None
    #: True when this POST repeated the answer the same person had already given (idempotent 200).
    already_recorded: bool = False

    @classmethod
    def of(cls, record: HumanRequestRecord, now: datetime, *, already_recorded: bool = False) -> RequestView:
        return cls(
            already_recorded=already_recorded,
            **_common(record, now),
            agent=record.agent,
            agent_display_name=record.agent_display_name,
            recipient=record.recipient,
            status=record.status,
            answer=record.answer,
            responder=record.responder,
            responder_display_name=responder_display_name(record),
            answered_at=record.answered_at,
        )


class InboxView(BaseModel):
    user: str
    requests: list[InboxItem]


def _common(record: HumanRequestRecord, now: datetime) -> dict[str, Any]:
    until = record.answered_at if record.answered_at is not None else now
    if record.status is HumanRequestState.EXPIRED:
        until = record.expires_at
    return {
        "id": record.request_id,
        "run_id": record.run_id,
        "title": record.title,
        "question": record.question,
        "context": record.context,
        "reason": record.reason,
        "reason_kind": record.reason_kind,
        "options": record.options,
        "allow_free_text": record.allow_free_text,
        "channel": record.channel,
        "created_at": record.created_at,
        "expires_at": record.expires_at,
        "at_deadline": AtDeadline.of(record),
        "waiting_s": record.waited_s(until),
        "source_link": record.source_link,
        "answer_schema": record.answer_schema,
        "form": FormField.all_of(record.answer_schema) if record.answer_schema is not None else [],
    }


async def _caller(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    vouched: Annotated[str | None, Header(alias=VOUCH_HEADER)] = None,
) -> str:
    """The caller's ``user:<id>`` from ``Authorization: Bearer <inbox token>``, or from the journal's
    assertion (``X-Temporality-Vouched-User``) when the journal and this service share the vouch secret.
    A refusal (401) goes to the audit trail too (``api.access_refused``, reason ``inbox_token`` or ``inbox_vouch``,
    rate-limited apart from the role-token API's; never the token)."""
    try:
        return _identified(request, authorization, vouched)
    except TooManyFailures as exc:
        audit_refusal(request, status=exc.status, reason=exc.code, channel="inbox")
        raise
    except Unauthorized:
        reason = "inbox_vouch" if authorization is None and vouched is not None else "inbox_token"
        audit_refusal(request, status=401, reason=reason, channel="inbox")
        raise


def _identified(request: Request, authorization: str | None, vouched: str | None) -> str:
    """:func:`_caller`'s check."""
    directory: Directory = request.app.state.directory
    if authorization is None and vouched is not None:
        voucher: Voucher | None = request.app.state.voucher
        user_id = None if voucher is None else voucher.vouched(vouched)
        if user_id is None:
            log.info("inbox.vouch_refused", configured=voucher is not None)
            raise Unauthorized("the vouched-for sign-in is not valid (forged, expired, or vouching not configured)")
        if directory.get(user_id) is None:
            raise Unauthorized(f"you are signed in as {user_id[:200]!r}, who is not in the user directory")
        return recipient_for(user_id)
    if authorization is None:
        raise Unauthorized("send Authorization: Bearer <your inbox token>")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("the Authorization header must be: Bearer <inbox token>")
    failures = request.app.state.api_auth.failures  # the role tokens' limiter: one count per address
    address = client_address(request)
    failures.check(address)  # past the limit: 429 before the token is compared, the right one too
    user_id = directory.user_for_token(token.strip())
    if user_id is None:
        failures.failed(address)
        raise Unauthorized("the inbox token is not valid")
    return recipient_for(user_id)


#: The authenticated person (``user:<id>``), for endpoints that take it.
Caller = Annotated[str, Depends(_caller)]


def create_app(
    settings: Settings,
    bus: Bus,
    directory: Directory,
    inbound: AnswerSink | None = None,
    *,
    store: DirectoryStore | None = None,
    auth: ApiAuth | None = None,
    egress: EgressPolicy | None = None,
    voucher: Voucher | None = None,
    mirror: ChannelMirror | None = None,
) -> FastAPI:
    """The API over an already-connected ``bus`` (the caller owns its lifetime).

    With a directory ``store`` (which ``directory`` is the watched view of), the ``/directory`` routes are
    served, checked against ``auth``'s role tokens (none: every directory call is a 401).

    Answers go to ``inbound``, the same channel-neutral binding every chat adapter uses (the service
    passes its :class:`~temporality_human_interaction.inbound.AnswerRouter`, which also edits the
    question's copies on the other channels); without one, a router with no chat adapters.

    What the inbox routes show passes through ``egress`` for the ``web`` channel (HUM-5, SEC-1): the stored
    request is already redacted; each text field is truncated to the web inbox's limit.

    ``GET /inbox`` lists the caller's requests from ``mirror`` (the replica's mirror of ``human-channels``, once it
    has caught up with the bucket: :func:`~.inbox.list_inbox`); without one, from a listing of the bucket.
    """
    policy = egress or DEFAULT_POLICY
    sink: AnswerSink = inbound or AnswerRouter(
        bus, directory, repair_after_s=settings.answer_repair_after_s, egress=policy
    )

    def shown(record: HumanRequestRecord) -> HumanRequestRecord:
        return policy.for_channel(record, WEB_CHANNEL)[0]

    app = FastAPI(
        title="Temporality human-interaction",
        version="0.1.0",
        responses={code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 412, 413, 422, 428, 503)},
        telemetry=HTTP_TELEMETRY,
    )
    app.state.directory = directory
    app.state.voucher = voucher
    install_error_handlers(app)
    (auth or ApiAuth()).install(app)
    if store is not None:
        app.include_router(
            directory_router(
                directory,
                store,
                bus,
                max_body_bytes=settings.max_body_bytes,
                retry_after_s=max(1, int(settings.bus_timeout_s)),
            )
        )
        add_schemas(app, DIRECTORY_SCHEMAS)
    add_schemas(app, component_schemas(AnswerSubmission=AnswerSubmission))  # read by answer() itself

    @asynccontextmanager
    async def bus_call(what: str) -> AsyncIterator[None]:
        """Bound every NATS interaction in time and turn bus failures into 503."""
        try:
            async with asyncio.timeout(settings.bus_timeout_s):
                yield
        except (TimeoutError, TransientError, nats.errors.Error) as exc:
            log.warning("api.bus_unavailable", during=what, error=repr(exc))
            raise Unavailable(
                f"the message bus did not answer while {what}; try again",
                code="bus_unavailable",
                retry_after_s=max(1, int(settings.bus_timeout_s)),
            ) from exc

    @app.get("/inbox")
    async def inbox(user: Caller) -> InboxView:
        async with bus_call("listing the inbox"):
            store = await open_store(bus)
            pending = await list_inbox(bus, store, user, mirror)  # the run entries naming them (inbox.py), no scan
        now = datetime.now(UTC)
        return InboxView(user=user, requests=[InboxItem.of(shown(r), now) for r in pending])

    @app.get("/requests/{request_id}")
    async def get_request(request_id: str, user: Caller) -> RequestView:
        _known_shape(request_id)
        async with bus_call("reading the request"):
            store = await open_store(bus)
            got = await store.get(request_id)
        if got is None:
            raise RequestNotFound(f"there is no request {request_id}")
        check_recipient(got.value, user, "read it")
        return RequestView.of(shown(got.value), datetime.now(UTC))

    @app.post(
        "/requests/{request_id}/answer",
        openapi_extra=operation(body=json_body("AnswerSubmission", description='{"option_id": ...} or {"text": ...}')),
    )
    async def answer(request_id: str, user: Caller, request: Request) -> RequestView:
        _known_shape(request_id)
        parsed = parse_json(await read_body(request, settings.max_body_bytes))
        try:
            submission = AnswerSubmission.model_validate(parsed)
        except ValidationError as exc:
            raise Unprocessable(summary(exc), code="invalid_answer") from exc
        user_id = user_id_of(user)
        assert user_id is not None  # _caller returns recipient_for(<a directory user id>)
        async with bus_call("binding the answer"):
            result = await sink(InboundAnswer(WEB_CHANNEL, request_id, user_id, submission))
        if result.refused is not None:
            raise result.refused
        assert result.record is not None
        return RequestView.of(shown(result.record), datetime.now(UTC), already_recorded=result.already_recorded)

    return app


def _known_shape(request_id: str) -> None:
    """An id that cannot be a request id (nor a KV key) names no request: 404, never a bus error."""
    if not is_request_id(request_id):
        raise RequestNotFound("there is no request with that id (ids are 1-128 characters of A-Z a-z 0-9 _ -)")
