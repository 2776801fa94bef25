"""Trigger definitions (TRG-1/2/3) loaded from YAML and validated with clear errors.

Every mapping forbids unknown keys, so a typo fails at start-up instead of silently doing nothing.
Only ``webhook`` triggers are served by this version; ``event`` and ``schedule`` triggers are
validated and loaded, and the gateway logs them as not served yet.

The recipients a run may ask (``human``, SEC-1) come from here and never from the webhook body.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from temporality_protocol import HumanPolicy, TimeoutPolicy
from temporality_protocol.catalog import BUCKET_DEDUPE
from temporality_trigger_gateway.adapters import ADAPTERS
from temporality_trigger_gateway.auth import Auth, BasicAuth, NoAuth
from temporality_trigger_gateway.errors import TriggerConfigError

__all__ = [
    "BasicAuth",
    "Deduplication",
    "EventTrigger",
    "HumanConfig",
    "NoAuth",
    "ScheduleTrigger",
    "TriggerConfig",
    "TriggersFile",
    "WebhookTrigger",
    "load_triggers",
    "parse_triggers",
]

_DAY = 24 * 3600
#: The dedupe bucket's own TTL caps every trigger's ``ttl_days``.
MAX_DEDUPE_TTL_DAYS = int(BUCKET_DEDUPE.ttl_s // _DAY)

_Slug = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
_EVENT_FILTER_KEYS = frozenset({"actor_id", "actor_type", "project"})


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


class _TimeoutConfig(TimeoutPolicy):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HumanConfig(HumanPolicy):
    """A :class:`temporality_protocol.HumanPolicy` that refuses unknown keys (config is written by hand)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allowed_recipients: list[Annotated[str, Field(pattern=r"^user:\S+$")]] = Field(default_factory=list)
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


class WebhookTrigger(_Trigger):
    type: Literal["webhook"]
    adapter: str
    events: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    auth: Auth

    @field_validator("adapter")
    @classmethod
    def _known_adapter(cls, value: str) -> str:
        if value not in ADAPTERS:
            raise ValueError(f"unknown adapter {value!r}; known: {', '.join(sorted(ADAPTERS))}")
        return value

    @model_validator(mode="after")
    def _events_supported(self) -> Self:
        if len(set(self.events)) != len(self.events):
            raise ValueError("events lists an event type twice")
        supported = ADAPTERS[self.adapter].event_types
        unsupported = sorted(set(self.events) - supported) if supported is not None else []
        if unsupported:
            raise ValueError(
                f"adapter {self.adapter} cannot handle {', '.join(unsupported)}; it supports {', '.join(sorted(supported or ()))}"
            )
        return self

    @model_validator(mode="after")
    def _auth_fits_the_source(self) -> Self:
        allowed = ADAPTERS[self.adapter].auth_types | {"none"}
        if self.auth.type not in allowed:
            raise ValueError(
                f"auth.type {self.auth.type!r} cannot authenticate {self.adapter} deliveries; "
                f"use one of {', '.join(sorted(allowed))}"
            )
        return self


class EventTrigger(_Trigger):
    """Fires on the system's own journal events (TRG-5/6). Loaded and validated; not served yet."""

    type: Literal["event"]
    event_type: Annotated[str, Field(min_length=1)]
    filter: dict[str, str] = Field(default_factory=dict)
    prompt: str | None = None

    @field_validator("filter")
    @classmethod
    def _known_filter_keys(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(k for k in value if k not in _EVENT_FILTER_KEYS and not k.startswith("data."))
        if unknown:
            raise ValueError(
                f"unknown filter key(s) {', '.join(unknown)}; use actor_id, actor_type, project, data.<field>"
            )
        return value


class ScheduleTrigger(_Trigger):
    """Fires on a cron schedule (TRG-2). Loaded and validated; not served yet."""

    type: Literal["schedule"]
    cron: Annotated[str, Field(pattern=r"^\S+( \S+){4}$", description="Five cron fields")]
    prompt: str | None = None


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
    data: Any, *, source: str = "<triggers>", environ: Mapping[str, str] | None = None
) -> list[TriggerConfig]:
    """Validate already-parsed YAML; :class:`TriggerConfigError` lists every problem with its location."""
    if not isinstance(data, dict):
        raise TriggerConfigError(f"{source}: expected a mapping with a 'triggers' list, got {type(data).__name__}")
    context = {"environ": os.environ if environ is None else environ}
    try:
        parsed = TriggersFile.model_validate(data, context=context)
    except ValidationError as exc:
        lines = [f"  {_where(err['loc'], data)}: {err['msg']}" for err in exc.errors(include_url=False)]
        raise TriggerConfigError(f"{source}: {exc.error_count()} problem(s)\n" + "\n".join(lines)) from None
    return list(parsed.triggers)


def load_triggers(path: Path, *, environ: Mapping[str, str] | None = None) -> list[TriggerConfig]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise TriggerConfigError(f"{path}: cannot read the triggers file: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TriggerConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_triggers(data, source=str(path), environ=environ)


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
        out += f".{part}" if out else part
        node = node.get(part) if isinstance(node, dict) else None
    return out or "<root>"
