"""The audit trail (issue 11, AP-11): which journaled events are critical actions, and how one reads. Pure.

:data:`AUDIT_KINDS` is the one declaration: an event type listed there is in ``GET /audit``; adding a
type is one line (a type only some of whose events count adds its reasons to :data:`AUDIT_REASONS`, or the
data field that must be set to :data:`AUDIT_WHEN_SET`).
Nothing is stored twice: ``/audit`` selects these events from ``events``.

=============================================  ====================  =================================
event                                          kind                  who (``actor``)
=============================================  ====================  =================================
trigger.created/updated/deleted/enabled/       ``trigger_change``    ``changed_by`` (a token name or
disabled                                                             ``file:<path>``)
human.directory.changed                        ``directory_change``  ``changed_by``
run.cancel_requested                           ``cancellation``      ``requested_by``
run.requested with ``launch.rerun_of`` (a      ``run_rerun``         ``launch.requested_by`` (a token
rerun of an accepted delivery: an operator                           name or ``user:<id>``)
started a new run)
human.rejected (``recipient_not_allowed``)     ``permission_refusal`` the CloudEvent actor (SEC-1)
human.answer_refused (``not_recipient``)      ``permission_refusal`` the CloudEvent actor (HUM-7)
human.notification_failed                      ``permission_refusal`` the CloudEvent actor (SEC-1:
(``recipient_not_allowed``)                                          an agent's notify to someone)
agent.registered, agent.registration_refused,  ``agent_registration`` ``requested_by`` (an operator's
agent.lifecycle_changed (``deregistered``,                          decommission, readmission) or
``decommissioned``), agent.readmitted                               the CloudEvent actor
agent.policy_changed (the allow-list grants   ``policy_change``     ``requested_by`` (``file:<path>``
an agent other tools or limits: AP-11)                               of the allow-list)
agent.ask_undeliverable,                       ``agent_refusal``     the CloudEvent actor
agent.reply_undeliverable, agent.message_refused
(unsigned, badly signed, replayed: AP-11),
agent.task.refused (out of order for the task,
a tool not granted: AP-5)
agent.handed_off (AP-6)                        ``handoff``           the CloudEvent actor
bus.dead_lettered                              ``dead_letter``       the CloudEvent actor
api.access_refused (401/403 of any service's   ``access_refusal``    ``token:<name>`` (403) or
token check, a webhook's refused credentials                         ``address:<client>`` (401);
or signature; rate-limited:                                          ``user:<id>`` (a refused sign-in)
:mod:`temporality_service.audit`)                                    or ``unknown-user:<digest>`` (a
                                                                     sign-in's id naming nobody)
bus.permission_refused (the NATS server        ``bus_permission_     ``service:<name>`` (its NATS
refused a service's publish or subscription;   refusal``             user)
rate-limited)
=============================================  ====================  =================================

Never a secret: the events carry none by contract (token *names*, ``inbox_token_set`` flags), and
:func:`redact` replaces the value of any key that looks like a credential anyway.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import ColumnElement, and_, func, not_, or_

from temporality_journal.models import EVENTS_TABLE
from temporality_protocol.redaction import CREDENTIAL_KEY

__all__ = [
    "AUDIT_KINDS",
    "AUDIT_REASONS",
    "AUDIT_WHEN_SET",
    "REDACTED",
    "AuditEntry",
    "actor_matches",
    "audit_entry",
    "audited",
    "redact",
]

#: Every audited event type and its kind (the ``kind`` filter of ``GET /audit``).
AUDIT_KINDS: dict[str, str] = {
    "trigger.created": "trigger_change",
    "trigger.updated": "trigger_change",
    "trigger.deleted": "trigger_change",
    "trigger.enabled": "trigger_change",
    "trigger.disabled": "trigger_change",
    "human.directory.changed": "directory_change",
    "run.cancel_requested": "cancellation",
    "run.requested": "run_rerun",
    "human.rejected": "permission_refusal",
    "human.answer_refused": "permission_refusal",
    "human.notification_failed": "permission_refusal",
    "agent.registered": "agent_registration",
    "agent.registration_refused": "agent_registration",
    "agent.lifecycle_changed": "agent_registration",
    "agent.readmitted": "agent_registration",
    "agent.policy_changed": "policy_change",
    "agent.ask_undeliverable": "agent_refusal",
    "agent.reply_undeliverable": "agent_refusal",
    "agent.message_refused": "agent_refusal",
    "agent.task.refused": "agent_refusal",
    "agent.handed_off": "handoff",
    "bus.dead_lettered": "dead_letter",
    "api.access_refused": "access_refusal",
    "bus.permission_refused": "bus_permission_refusal",
}
#: Types of which only events with one of these ``data.reason`` values are audited.
AUDIT_REASONS: dict[str, frozenset[str]] = {
    "human.rejected": frozenset({"recipient_not_allowed"}),
    "human.answer_refused": frozenset({"not_recipient"}),
    "human.notification_failed": frozenset({"recipient_not_allowed"}),
    "agent.lifecycle_changed": frozenset({"deregistered", "decommissioned"}),
}
#: Types of which only events with a value at this path of ``data`` are audited: a ``run.requested`` is a
#: critical action only when it is a rerun (an operator started a run again); every other run start is not.
AUDIT_WHEN_SET: dict[str, tuple[str, ...]] = {
    "run.requested": ("launch", "rerun_of"),
}
REDACTED = "[redacted]"


def audited(types: list[str] | None = None) -> ColumnElement[bool]:
    """The SQL condition "this row of ``events`` is in the audit trail" (of one of ``types``, default all):
    its type is in :data:`AUDIT_KINDS` and, for the types of :data:`AUDIT_REASONS`, its reason is one of
    theirs. ``GET /audit`` selects by it; retention keeps what it matches (:mod:`.retention`)."""
    t = EVENTS_TABLE.c
    reason = func.coalesce(t.data["reason"].as_string(), "")  # never NULL: NOT (...) must be true or false
    return and_(
        t.type.in_(sorted(AUDIT_KINDS) if types is None else types),
        or_(
            t.type.not_in([*AUDIT_REASONS, *AUDIT_WHEN_SET]),
            *(and_(t.type == name, reason.in_(sorted(allowed))) for name, allowed in AUDIT_REASONS.items()),
            *(and_(t.type == name, t.data[path].as_string().is_not(None)) for name, path in AUDIT_WHEN_SET.items()),
        ),
    )


def actor_matches(actor: str) -> ColumnElement[bool]:
    """The SQL condition "this audited event was done by ``actor``": its ``changed_by``, ``requested_by`` or
    ``launch.requested_by`` (a rerun), or its CloudEvent actor as ``<actor>`` or ``token:<actor>``."""
    t = EVENTS_TABLE.c
    return or_(
        t.actor == actor,
        t.actor == f"token:{actor}",
        t.data["changed_by"].as_string() == actor,
        t.data["requested_by"].as_string() == actor,
        t.data[("launch", "requested_by")].as_string() == actor,
    )


def not_audited() -> ColumnElement[bool]:
    return not_(audited())


_SECRET_KEY = CREDENTIAL_KEY


def redact(value: Any) -> Any:
    """``value`` with every credential-like key's value replaced (recursively); ``*_set`` flags are kept."""
    if isinstance(value, dict):
        return {k: REDACTED if _secret_key(k) and not isinstance(v, bool) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def _secret_key(key: object) -> bool:
    return isinstance(key, str) and not key.endswith("_set") and _SECRET_KEY.search(key) is not None


class AuditEntry(BaseModel):
    """One critical action: what, who, when, on what."""

    id: str = Field(description="The CloudEvent id")
    type: str
    kind: str = Field(description="trigger_change, directory_change, cancellation, permission_refusal, ...")
    time: datetime
    actor: str | None = Field(description="Who: the token name or file that changed it, else the event's actor")
    event_actor: str | None = Field(description="The CloudEvent actor attribute")
    target: str | None = Field(description="What: the trigger, directory entry, run or request concerned")
    run_id: str | None
    summary: str
    stream_seq: int
    details: dict[str, Any] = Field(description="The event's data, credential-like values redacted")


def audit_entry(
    *, id: str, type: str, time: datetime, actor: str | None, run_id: str | None, stream_seq: int, data: dict[str, Any]
) -> AuditEntry:
    """The audit view of one stored event of an :data:`AUDIT_KINDS` type."""
    who = _str(data, "changed_by") or _str(data, "requested_by") or _str(_launch(data), "requested_by") or actor
    target, summary = _describe(type, data, run_id)
    return AuditEntry(
        id=id,
        type=type,
        kind=AUDIT_KINDS.get(type, "other"),
        time=time,
        actor=who,
        event_actor=actor,
        target=target,
        run_id=run_id,
        summary=summary,
        stream_seq=stream_seq,
        details=redact(data),
    )


def _launch(data: dict[str, Any]) -> dict[str, Any]:
    launch = data.get("launch")
    return launch if isinstance(launch, dict) else {}


def _str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and value else None


def _policy_summary(agent: str | None, data: dict[str, Any]) -> str:
    change = data.get("change")
    if change == "listed":
        return f"agent {agent} allowed, tools {data.get('tools_granted') or []}"
    if change == "unlisted":
        return f"agent {agent} no longer allowed"
    granted, revoked = data.get("tools_granted") or [], data.get("tools_revoked") or []
    tools = f"tools granted {granted}, revoked {revoked}" if granted or revoked else "same tools"
    return f"agent {agent} policy changed: {tools}"


def _times(data: dict[str, Any]) -> str:
    """`` (N times in W s)`` of a rate-limited refusal standing for more than one."""
    return f" ({data.get('count')} times in {data.get('window_s')} s)" if data.get("count", 1) != 1 else ""


def _describe(type_: str, data: dict[str, Any], run_id: str | None) -> tuple[str | None, str]:
    reason = _str(data, "reason")
    if type_.startswith("trigger."):
        trigger = _str(data, "trigger_id")
        return trigger, f"trigger {trigger} {type_.removeprefix('trigger.')} (revision {data.get('revision')})"
    if type_ == "human.directory.changed":
        entry = f"{data.get('kind')}:{data.get('entry_id')}"
        return entry, f"{entry} {data.get('action')} (revision {data.get('revision')})"
    if type_ == "run.requested":
        launch = _launch(data)
        original = _str(launch, "rerun_of")
        return original, (
            f"run {original} rerun as run {run_id} (trigger {launch.get('trigger_id')}, delivery "
            f"{launch.get('delivery_id')})"
        )
    if type_ == "run.cancel_requested":
        return run_id, f"cancel of run {run_id} requested: {_str(data, 'reason')}"
    if type_ == "human.rejected":
        return _str(data, "recipient"), f"request to {data.get('recipient')} refused: {reason}"
    if type_ == "human.answer_refused":
        return _str(data, "request_id"), (
            f"answer by {data.get('responder')} on {data.get('channel')} to a question for "
            f"{data.get('recipient')} refused: {reason}"
        )
    if type_ == "human.notification_failed":
        return _str(data, "recipient"), f"notification to {data.get('recipient')} refused: {reason}"
    if type_ == "agent.message_refused":
        agent = _str(data, "agent_id")
        return agent, f"message from agent {agent or '(unknown)'} on {data.get('subject')} refused: {reason}"
    if type_ == "agent.task.refused":
        agent = _str(data, "agent_id")
        return _str(data, "task_id"), (
            f"{data.get('kind') or 'message'} of agent {agent} for task {data.get('task_id')} refused: {reason}"
        )
    if type_ == "agent.handed_off":
        return _str(data, "child_run_id"), (
            f"run {data.get('parent_run_id')} ({data.get('parent_agent')}) handed its task to agent "
            f"{data.get('agent')} as run {data.get('child_run_id')}"
        )
    if type_ == "agent.readmitted":
        agent = _str(data, "agent_id")
        return agent, f"agent {agent} readmitted after decommissioning (incarnation {data.get('incarnation')})"
    if type_ == "agent.policy_changed":
        agent = _str(data, "agent_id")
        return agent, _policy_summary(agent, data)
    if type_ == "agent.ask_undeliverable":
        return _str(data, "request_id"), f"ask to {data.get('to')} undeliverable: {reason}"
    if type_ == "agent.reply_undeliverable":
        return _str(data, "request_id"), f"reply to {data.get('request_id')} undeliverable: {reason}"
    if type_ == "agent.registered":
        agent = _str(data, "agent_id")
        return agent, f"agent {agent} registered (protocol {data.get('protocol_version')})"
    if type_ == "agent.registration_refused":
        agent = _str(data, "agent_id")
        return agent, f"registration of agent {agent} refused: {reason}"
    if type_ == "agent.lifecycle_changed":
        agent = _str(data, "agent_id")
        return agent, f"agent {agent} {reason}: {data.get('from_state')} -> {data.get('to_state')}"
    if type_ == "api.access_refused":
        who = data.get("principal") or data.get("address")
        return _str(data, "path"), (
            f"{data.get('service')}: {data.get('status')} {reason} {data.get('method')} {data.get('path')} "
            f"for {who}{_times(data)}"
        )
    if type_ == "bus.permission_refused":
        queue = f" (queue {data.get('queue')})" if data.get("queue") else ""
        return _str(data, "subject"), (
            f"{data.get('service')}: NATS refused its {data.get('operation')} on {data.get('subject')}{queue}"
            f"{_times(data)}"
        )
    if type_ == "bus.dead_lettered":
        return _str(
            data, "consumer"
        ), f"{data.get('original_type') or 'a message'} dead-lettered by {data.get('consumer')}"
    return run_id, type_
