"""Trigger definitions (TRG-1/2/3), validated with clear errors: from the YAML file or the admin API.

Every mapping forbids unknown keys, so a typo fails at start-up (or is a 422 on save) instead of
silently doing nothing. ``webhook`` triggers are served at ``/hooks/<id>``, ``schedule`` triggers
by JetStream message schedules (:mod:`.schedule`), ``event`` triggers by the gateway's consumer of the
system's own events (:mod:`.events`).

Validation takes a context (``model_validate(..., context=...)``): ``environ`` resolves the auth's
``*_env`` secrets, ``agents`` (a set of agent ids from the run-executor's agent cards, or ``None`` when
unknown) refuses a trigger naming an agent that does not exist. ``input``, ``when`` and a concurrency
``key`` (JMESPath, see :mod:`temporality_trigger_gateway.mapping`) are compiled once here. ``when`` is the
trigger's condition (with an event trigger's exact-match ``filter`` before it: one condition,
:meth:`~_Trigger.filtered`); a delivery it refuses is ``filtered``.

The recipients a run may ask (``human``, SEC-1) come from here and never from the webhook body.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from croniter import croniter  # type: ignore[import-untyped]
from jmespath.parser import ParsedResult
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from temporality_protocol import HumanPolicy, NormalizedEvent, TimeoutPolicy
from temporality_protocol.catalog import BUCKET_DEDUPE, TRIGGERABLE_EVENTS
from temporality_protocol.events import EVENT_MODELS, Escalate, Renotify
from temporality_service.wording import located, message
from temporality_trigger_gateway.adapters import ADAPTERS
from temporality_trigger_gateway.auth import Auth, BasicAuth, NoAuth
from temporality_trigger_gateway.errors import TriggerConfigError
from temporality_trigger_gateway.mapping import (
    MAX_EXPRESSION,
    agent_input,
    check_prompt,
    compile_expression,
    compile_mapping,
    condition_holds,
    evaluate,
    event_document,
    render_prompt,
)

__all__ = [
    "RESERVED_IDS",
    "BasicAuth",
    "Concurrency",
    "Deduplication",
    "EventTrigger",
    "HumanConfig",
    "MissedTicks",
    "NoAuth",
    "RetryPolicy",
    "ScheduleTrigger",
    "TriggerConfig",
    "TriggersFile",
    "WebhookTrigger",
    "field_errors",
    "filter_text",
    "load_triggers",
    "parse_triggers",
    "read_triggers_file",
]

_DAY = 24 * 3600
#: The dedupe bucket's own TTL caps every trigger's ``ttl_days``.
MAX_DEDUPE_TTL_DAYS = int(BUCKET_DEDUPE.ttl_s // _DAY)

_Slug = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
#: An agent-input field name (a key of ``input``).
_InputField = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
_EVENT_FILTER_KEYS = frozenset({"actor_id", "actor_type", "project"})
#: Ids a new trigger cannot take: ``/triggers/preview`` is the preview endpoint (``POST /triggers/preview``).
RESERVED_IDS = frozenset({"preview"})


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- policies
class Deduplication(_Config):
    """How long a delivered source event id is remembered (Azure DevOps retries for ~36 h)."""

    ttl_days: Annotated[int, Field(ge=1)] = MAX_DEDUPE_TTL_DAYS

    @field_validator("ttl_days")
    @classmethod
    def _within_bucket_ttl(cls, value: int) -> int:
        if value > MAX_DEDUPE_TTL_DAYS:
            raise ValueError(f"ttl_days cannot exceed the {BUCKET_DEDUPE.name} bucket's TTL ({MAX_DEDUPE_TTL_DAYS})")
        return value


class RetryPolicy(_Config):
    """What a webhook sender is told when its delivery fails transiently (503 ``bus_unavailable``):
    ``Retry-After`` = ``retry_after_s`` (default: the gateway's ``TEMPORALITY_GATEWAY_RETRY_AFTER_S``). A hint
    only: the gateway retries nothing itself (the delivery is recorded ``failed``, its dedupe claim released:
    the sender's retry or a re-drive is the same event id); schedule and event triggers ignore it (their bus
    messages are redelivered by their consumer); docs/triggers.md says what it does not do."""

    retry_after_s: Annotated[int, Field(ge=1, le=3600)] | None = None


#: The longest key value kept in the concurrency record (it is hashed into the KV key; shown for operators).
MAX_KEY_TEXT = 500


class Concurrency(_Config):
    """Flow control per trigger: at most one active run per concurrency key (issue 7).

    ``key`` is a JMESPath expression over the normalized event (the mapping's document, ``context``
    included), e.g. ``join('/', [payload.repository.id, to_string(payload.pull_request.id)])``; the value
    (a string as is, anything else in its JSON form) names the key, ``null`` means the event has none (it
    is launched without flow control). ``policy`` says what a new event does while a run of its key is
    active: ``queue`` (start after it, in order), ``skip`` (journaled ``trigger.rejected(concurrency_skip)``)
    or ``supersede`` (``run.cancel_requested`` for the older run, reason ``superseded``, and start the
    new one). ``max_queued`` bounds a ``queue``: one more is refused like ``skip``. ``debounce_s``: the
    key's run starts only once no new event of it arrived for that long; the latest event wins (the older
    ones are journaled ``trigger.rejected(debounced)``), then the policy applies."""

    key: Annotated[str, Field(min_length=1)]
    policy: Literal["queue", "skip", "supersede"]
    max_queued: Annotated[int, Field(ge=1, le=100)] = 20
    #: Start a key's run only once no new event of it arrived for this many seconds (the latest wins).
    debounce_s: Annotated[int, Field(ge=1, le=24 * 3600)] | None = None
    _compiled: ParsedResult | None = PrivateAttr(default=None)

    @field_validator("key")
    @classmethod
    def _valid_key(cls, value: str) -> str:
        compile_expression(value, "key")
        return value

    @model_validator(mode="after")
    def _compile_key(self) -> Self:
        self._compiled = compile_expression(self.key, "key")
        return self

    def key_of(self, event: NormalizedEvent, context: Mapping[str, Any]) -> str | None:
        """The event's key value (``None``: it has none); :class:`MappingFailed` when the expression fails."""
        assert self._compiled is not None  # compiled by the validator
        found = evaluate(self._compiled, event_document(event, context), "key", section="concurrency")
        if found is None:
            return None
        text = found if isinstance(found, str) else json.dumps(found, sort_keys=True, separators=(",", ":"))
        return text[:MAX_KEY_TEXT] if text else None


class _RenotifyConfig(Renotify):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _EscalateConfig(Escalate):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _TimeoutConfig(TimeoutPolicy):
    """``on_timeout`` as written by hand: a typo anywhere in it (``renotify.evry``) is refused, not ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    renotify: _RenotifyConfig | None = None
    escalate: _EscalateConfig | None = None


class HumanConfig(HumanPolicy):
    """A :class:`temporality_protocol.HumanPolicy` that refuses unknown keys (config is written by hand)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: People (``user:<id>``) and groups (``group:<id>``: any member may be asked, the first answer wins).
    allowed_recipients: list[Annotated[str, Field(pattern=r"^(user|group):\S+$")]] = Field(default_factory=list)
    on_timeout: _TimeoutConfig = Field(default_factory=_TimeoutConfig)

    @model_validator(mode="after")
    def _timeouts_consistent(self) -> Self:
        if self.default_timeout_s > self.max_timeout_s:
            raise ValueError("default_timeout_s must not exceed max_timeout_s")
        return self

    def policy(self) -> HumanPolicy:
        """The plain protocol model, as it goes on the wire."""
        return HumanPolicy.model_validate(self.model_dump())


# --------------------------------------------------------------------------- triggers
class _Trigger(_Config):
    id: _Slug
    name: Annotated[str, Field(min_length=1, max_length=200)]
    enabled: bool = True
    agent: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")]
    tenant: Annotated[str, Field(min_length=1)] | None = None
    deduplication: Deduplication = Field(default_factory=Deduplication)
    #: Whom runs of this trigger may ask and what happens on timeout (SEC-1, HUM-8). Never from the event.
    human: HumanConfig = Field(default_factory=HumanConfig)
    #: Agent-input field -> JMESPath over the normalized event (TRG-8); ``None``: the event's payload.
    input: Annotated[dict[_InputField, str], Field(max_length=100)] | None = None
    #: Static data of the trigger, visible to the mapping as ``context`` and passed to the agent.
    context: Annotated[dict[str, Any], Field(max_length=100)] = Field(default_factory=dict)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    #: At most one active run per concurrency key, and what a new event does meanwhile (issue 7).
    concurrency: Concurrency | None = None
    #: A JMESPath condition over the event's document (the mapping's, ``context`` included), evaluated
    #: after the source match: a delivery for which it is not truthy is ``filtered`` (journaled, no run).
    when: Annotated[str, Field(min_length=1, max_length=MAX_EXPRESSION)] | None = None
    _compiled: dict[str, ParsedResult] | None = PrivateAttr(default=None)
    _when: ParsedResult | None = PrivateAttr(default=None)

    @field_validator("id")
    @classmethod
    def _not_reserved(cls, value: str, info: ValidationInfo) -> str:
        """A new trigger (the file, ``POST /triggers``: context ``new``) cannot take a reserved id; a record
        stored before the id was reserved is still served."""
        if (info.context or {}).get("new") and value in RESERVED_IDS:
            raise ValueError(f"the id {value!r} is reserved (POST /triggers/{value} is the admin API's own route)")
        return value

    @field_validator("agent")
    @classmethod
    def _known_agent(cls, value: str, info: ValidationInfo) -> str:
        agents = (info.context or {}).get("agents")
        if agents is not None and value not in agents:
            known = ", ".join(sorted(agents)) or "none"
            where = getattr(agents, "where", "the agent cards file")  # agents.AgentIds: the file, as read
            raise ValueError(f"unknown agent {value!r} (not in {where}; known: {known})")
        return value

    @field_validator("input")
    @classmethod
    def _valid_mapping(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            compile_mapping(value)  # raises ValueError naming the field
        return value

    @field_validator("when")
    @classmethod
    def _valid_condition(cls, value: str | None) -> str | None:
        if value is not None:
            compile_expression(value, "when")  # raises ValueError naming the field
        return value

    @model_validator(mode="after")
    def _compile_mapping(self) -> Self:
        self._compiled = None if self.input is None else compile_mapping(self.input)
        self._when = None if self.when is None else compile_expression(self.when, "when")
        return self

    def filtered(self, event: NormalizedEvent) -> str | None:
        """Why the trigger's condition refuses ``event`` (``None``: it matches, or there is none);
        :class:`MappingFailed` (section ``when``) when ``when`` cannot be evaluated on it."""
        # The field first: without a condition (most triggers) the compiled one, a private attribute (pydantic
        # finds those after a failed ordinary lookup, ~40x slower than a field), is not read per delivery.
        if self.when is None or self._when is None:
            return None
        if condition_holds(self._when, event_document(event, self.context)):
            return None
        return f"the trigger's condition is false for this event (when: {self.when[:200]})"

    @property
    def compiled_input(self) -> dict[str, ParsedResult] | None:
        """The ``input`` expressions, compiled once at load (``None``: no mapping)."""
        return self._compiled

    def agent_input(self, event: NormalizedEvent) -> dict[str, Any]:
        """What the agent receives for ``event`` (TRG-8): the mapping applied (or the payload), plus the
        rendered ``prompt`` when the trigger has one. :class:`MappingFailed` names a failing expression."""
        mapped = agent_input(event, None if self.input is None else self.compiled_input, self.context)  # (as above)
        prompt: str | None = getattr(self, "prompt", None)
        if prompt is None:
            return mapped
        return {**mapped, "prompt": render_prompt(prompt, mapped)}

    def concurrency_key(self, event: NormalizedEvent) -> str | None:
        """The event's concurrency key value (``None``: no flow control for it); :class:`MappingFailed`."""
        return None if self.concurrency is None else self.concurrency.key_of(event, self.context)


class WebhookTrigger(_Trigger):
    type: Literal["webhook"]
    adapter: str
    events: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    auth: Auth
    #: A task prompt template (``${field}`` over the agent input), rendered into ``input.prompt`` (TRG-3).
    #: The task, never the agent's system prompt (TRG-8): behaviour lives in the agent card.
    prompt: Annotated[str, Field(min_length=1, max_length=8000)] | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_fields_exist(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            check_prompt(value, info.data.get("input"))  # input is declared (and validated) before prompt
        return value

    @field_validator("adapter")
    @classmethod
    def _known_adapter(cls, value: str) -> str:
        if value not in ADAPTERS:
            raise ValueError(f"unknown adapter {value!r}; known: {', '.join(sorted(ADAPTERS))}")
        return value

    @field_validator("events")
    @classmethod
    def _events_supported(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("events lists an event type twice")
        adapter = info.data.get("adapter")
        if adapter is None:
            return value  # the adapter itself is refused
        supported = ADAPTERS[adapter].event_types
        unsupported = sorted(set(value) - supported) if supported is not None else []
        if unsupported:
            raise ValueError(
                f"adapter {adapter} cannot handle {', '.join(unsupported)}; it supports {', '.join(sorted(supported or ()))}"
            )
        return value

    @field_validator("auth")
    @classmethod
    def _auth_fits_the_source(cls, value: Auth, info: ValidationInfo) -> Auth:
        adapter = info.data.get("adapter")
        if adapter is None:
            return value
        allowed = ADAPTERS[adapter].auth_types | {"none"}
        if value.type not in allowed:
            raise ValueError(
                f"auth.type {value.type!r} cannot authenticate {adapter} deliveries; use one of {', '.join(sorted(allowed))}"
            )
        return value


#: An exact-match filter value; numbers and booleans are compared in their JSON text form (TRG-5).
_FilterValue = str | int | float | bool


def filter_text(value: Any) -> str | None:
    """A value as the filter compares it: a string as is, a number or boolean in its JSON form, anything
    else (absent, ``null``, an object, a list) as nothing, which never matches."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    return None


class EventTrigger(_Trigger):
    """Fires on the system's own events (TRG-2/5/6), served by :mod:`.events`.

    ``event_type`` names one type of :data:`~temporality_protocol.catalog.TRIGGERABLE_EVENTS` or a list of
    them. ``filter`` entries must all match the event (exact match; empty: every event of those types):
    ``actor_id`` / ``actor_type`` (the CloudEvent's ``actor``, ``agent:reviewer`` -> ``reviewer`` /
    ``agent``), ``project`` (its ``tenant``) and ``data.<field>[.<field>...]`` (its data; the first field
    must exist in every listed event type). ``allow_self``: the trigger may react to events its own runs
    caused (still bounded by the gateway's maximum launch depth)."""

    type: Literal["event"]
    event_type: Annotated[str, Field(min_length=1)] | Annotated[list[str], Field(min_length=1, max_length=20)]
    filter: Annotated[dict[str, _FilterValue], Field(max_length=20)] = Field(default_factory=dict)
    #: The task prompt template (``${field}`` over the agent input), rendered into ``input.prompt``.
    prompt: Annotated[str, Field(min_length=1, max_length=8000)] | None = None
    allow_self: bool = False

    @field_validator("event_type")
    @classmethod
    def _known_event_types(cls, value: str | list[str]) -> str | list[str]:
        listed = [value] if isinstance(value, str) else value
        if len(set(listed)) != len(listed):
            raise ValueError("event_type lists an event type twice")
        unknown = [t for t in listed if t not in TRIGGERABLE_EVENTS]
        if unknown:
            raise ValueError(
                f"unknown event type(s) {', '.join(repr(t[:80]) for t in unknown[:5])}; an event trigger "
                f"listens to {', '.join(TRIGGERABLE_EVENTS)}"
            )
        return value

    @field_validator("filter")
    @classmethod
    def _known_filter_keys(cls, value: dict[str, _FilterValue], info: ValidationInfo) -> dict[str, _FilterValue]:
        unknown = sorted(k for k in value if k not in _EVENT_FILTER_KEYS and not k.startswith("data."))
        if unknown:
            raise ValueError(
                f"unknown filter key(s) {', '.join(unknown)}; use actor_id, actor_type, project, data.<field>"
            )
        listed = info.data.get("event_type")
        types = [listed] if isinstance(listed, str) else (listed or [])
        for key in value:
            if not key.startswith("data."):
                continue
            path = key.removeprefix("data.").split(".")
            if not all(path):
                raise ValueError(f"filter key {key!r} is not data.<field>[.<field>...]")
            missing = [t for t in types if path[0] not in EVENT_MODELS[t].model_fields]
            if missing:
                raise ValueError(f"unknown filter key {key}: {', '.join(missing)} events have no field {path[0]!r}")
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt_fields_exist(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        fields = info.data.get("input")
        if fields is None and not (info.context or {}).get("stored"):
            # No mapping: the input is the event's data, whose fields each listed type's model declares (a field
            # one of them lacks would stay ``${field}`` in its runs' prompt), plus ``context`` when there is one.
            listed = info.data.get("event_type")
            types = [listed] if isinstance(listed, str) else (listed or [])
            if types:
                common = set.intersection(*(set(EVENT_MODELS[t].model_fields) for t in types))
                fields = dict.fromkeys(common | ({"context"} if info.data.get("context") else set()), "")
        try:
            check_prompt(value, fields)
        except ValueError as exc:
            if info.data.get("input") is None and fields is not None:
                raise ValueError(
                    f"{exc} (without an input mapping the input is the event's data: its fields are "
                    f"{', '.join(sorted(fields)) or 'none'})"
                ) from None
            raise
        return value

    @property
    def event_types(self) -> tuple[str, ...]:
        """The event types it listens to."""
        return (self.event_type,) if isinstance(self.event_type, str) else tuple(self.event_type)

    def matches(self, event: NormalizedEvent) -> bool:
        """Whether the trigger's condition (every ``filter`` entry, then ``when``) holds for ``event``."""
        return self.filtered(event) is None

    def filtered(self, event: NormalizedEvent) -> str | None:
        """Why the condition refuses ``event`` (the normalized CloudEvent, :func:`.events.normalize`):
        ``filter`` is the exact-match shorthand of TRG-5, checked first, then ``when``; ``None``: it matches."""
        for key, expected in self.filter.items():
            if key == "actor_id":
                found: Any = event.actor.id if event.actor is not None else None
            elif key == "actor_type":
                found = event.actor.type if event.actor is not None else None
            elif key == "project":
                found = event.tenant
            else:
                found = event.payload
                for part in key.removeprefix("data.").split("."):
                    found = found.get(part) if isinstance(found, dict) else None
            text = filter_text(found)
            if text != filter_text(expected):
                shown = "nothing" if text is None else repr(text[:100])
                return f"filter {key}: the event has {shown}, not {filter_text(expected)!r}"
        return super().filtered(event)


class MissedTicks(_Config):
    """What a tick handled later than ``grace_s`` after its time does (the gateways or NATS were down):
    ``run_once`` starts its run late (several missed ticks of one trigger make one run: only the next tick
    is ever armed); ``skip`` journals it as ``trigger.rejected`` (reason ``missed_tick``) and starts none."""

    policy: Literal["run_once", "skip"] = "run_once"
    grace_s: Annotated[int, Field(ge=1, le=7 * 24 * 3600)] = 300


class ScheduleTrigger(_Trigger):
    """Fires on a cron schedule (TRG-2) through JetStream message schedules (:mod:`.schedule`)."""

    type: Literal["schedule"]
    cron: Annotated[
        str,
        Field(
            pattern=r"^\S+( \S+){4,5}$",
            description="Five cron fields (minute hour day month weekday), optionally a sixth: seconds",
        ),
    ]
    #: The IANA time zone the cron fields are read in (``Europe/Berlin``); daylight saving handled by croniter.
    timezone: Annotated[str, Field(min_length=1, max_length=64)] = "UTC"
    missed: MissedTicks = Field(default_factory=MissedTicks)
    #: The task prompt template (``${field}`` over the agent input), rendered into ``input.prompt``.
    prompt: Annotated[str, Field(min_length=1, max_length=8000)] | None = None

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        if not croniter.is_valid(value):
            raise ValueError(f"{value!r} is not a valid cron expression (minute hour day month weekday [second])")
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r} (an IANA name such as Europe/Berlin, or UTC)") from None
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt_fields_exist(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            check_prompt(value, info.data.get("input"))
        return value

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)


TriggerConfig = Annotated[WebhookTrigger | EventTrigger | ScheduleTrigger, Field(discriminator="type")]


class TriggersFile(_Config):
    triggers: list[TriggerConfig]

    @model_validator(mode="after")
    def _unique_ids(self) -> Self:
        seen: set[str] = set()
        for trigger in self.triggers:
            if trigger.id in seen:
                raise ValueError(f"trigger id {trigger.id!r} is defined twice")
            seen.add(trigger.id)
        return self


# --------------------------------------------------------------------------- loading
def parse_triggers(
    data: Any,
    *,
    source: str = "<triggers>",
    environ: Mapping[str, str] | None = None,
    agents: frozenset[str] | None = None,
) -> list[TriggerConfig]:
    """Validate already-parsed YAML; :class:`TriggerConfigError` lists every problem with its location.

    ``agents``: the agent ids a trigger may name (``None``: not checked)."""
    if not isinstance(data, dict):
        raise TriggerConfigError(f"{source}: expected a mapping with a 'triggers' list, got {type(data).__name__}")
    context = {"environ": os.environ if environ is None else environ, "agents": agents, "new": True}
    try:
        parsed = TriggersFile.model_validate(data, context=context)
    except ValidationError as exc:
        shape = _file_schema()
        lines = [f"  {_where(located(err), data)}: {message(err, shape)}" for err in exc.errors(include_url=False)]
        raise TriggerConfigError(f"{source}: {exc.error_count()} problem(s)\n" + "\n".join(lines)) from None
    return list(parsed.triggers)


def load_triggers(
    path: Path, *, environ: Mapping[str, str] | None = None, agents: frozenset[str] | None = None
) -> list[TriggerConfig]:
    return parse_triggers(read_triggers_file(path), source=str(path), environ=environ, agents=agents)


def read_triggers_file(path: Path) -> Any:
    """The file's YAML, parsed but not validated (the store seeds itself from the raw mappings)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise TriggerConfigError(f"{path}: cannot read the triggers file: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TriggerConfigError(f"{path}: not valid YAML: {exc}") from None
    return data


@functools.cache
def _trigger_schema() -> dict[str, Any]:
    """The JSON schema of one trigger (:func:`field_errors` names the keys an object allows from it)."""
    return TypeAdapter(TriggerConfig).json_schema()


@functools.cache
def _file_schema() -> dict[str, Any]:
    return TriggersFile.model_json_schema()


def field_errors(exc: ValidationError, spec: Any, schema: Mapping[str, Any] | None = None) -> list[dict[str, str]]:
    """pydantic's errors as ``{field, message}``, each field written as the user wrote it, each message in the
    words of its JSON (:func:`.wording.message`: the allowed keys of an object that got an unknown one, from
    ``schema``, one trigger's by default; never the input)."""
    shape = _trigger_schema() if schema is None else schema
    out: list[dict[str, str]] = []
    for err in exc.errors(include_url=False):
        out.append({"field": _where(located(err), spec), "message": message(err, shape)[:500]})
    return out


def _where(loc: tuple[int | str, ...], data: Any) -> str:
    """``triggers[0] (ado-pr-review).auth.passwrd``: the path through the YAML, without union tags."""
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("id"), str):
                out += f" ({node['id']})"
            continue
        if isinstance(node, dict) and part not in node and node.get("type") == part:
            continue  # pydantic's discriminator tag, not a key the user wrote
        if part == "[key]":
            continue  # pydantic's marker of an invalid mapping key (the key itself is the part before)
        out += f".{part}" if out else part
        node = node.get(part) if isinstance(node, dict) else None
    return out or "<root>"
