"""Read-only aggregations over the journal's events and runs: triggers (UI-2) and human analytics (OBS-1).

Pure: each function takes rows the API already read and returns response bodies; no I/O, no clock.
Everything is computed from the stored events and the ``runs`` projection (no extra columns).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import ColumnElement, and_, or_

from temporality_journal.models import as_utc
from temporality_protocol import RunState
from temporality_service import Unprocessable

__all__ = [
    "HUMAN_TYPES",
    "IGNORED_REASONS",
    "RUN_ENDED",
    "RUN_END_TYPES",
    "TRIGGER_CHANGE_TYPES",
    "TRIGGER_TYPES",
    "WAIT_BUCKETS_S",
    "Cursor",
    "DeliveryView",
    "EventRow",
    "HumanAnalytics",
    "OptionChoice",
    "ReasonCount",
    "ReasonKindBreakdown",
    "RunRow",
    "StageBreakdown",
    "TriggerView",
    "decode_cursor",
    "deliveries_of",
    "encode_cursor",
    "human_analytics",
    "older_than",
    "question_shape",
    "triggers_of",
]

TRIGGER_TYPES = ("trigger.received", "trigger.accepted", "trigger.rejected")
#: The trigger admin API's audit events: what a trigger is (type, agent, enabled) as of its last change.
TRIGGER_CHANGE_TYPES = ("trigger.created", "trigger.updated", "trigger.enabled", "trigger.disabled", "trigger.deleted")
HUMAN_TYPES = (
    "human.requested",
    "human.answered",
    "human.expired",
    "human.rejected",
    "human.withdrawn",  # OBS-1: a question still open that its run's end (or HUM-7) withdrew (since 2026-12-07)
    "human.reasked",
    "human.escalated",
)
#: A run's terminal events: the turns it made (``usage.turns``; ``run.completed`` also has ``turns``), for
#: the runs that reached each stage (``StageBreakdown.runs_reached``).
RUN_END_TYPES = ("run.completed", "run.failed", "run.cancelled")
#: Steps of a question's timeout policy (HUM-8), counted beside its outcome, never one.
POLICY_STEPS = frozenset({"human.reasked", "human.escalated"})
#: The trigger.rejected reasons the gateway answers HTTP 200 ``ignored`` for (a ping, an event type the trigger
#: does not list, a disabled trigger, its condition false): the trigger does not take them, nothing failed.
IGNORED_REASONS = frozenset({"unsupported_event", "disabled", "filtered"})
#: The run states after which a question still open was withdrawn: human-interaction cancels a run's open
#: questions when it ends and publishes ``human.withdrawn`` (the outcome then, like any other); a question of a
#: run that ended before that event existed (2026-12-07) has none, and is read as withdrawn from the run's end.
RUN_ENDED = frozenset({RunState.COMPLETED.value, RunState.FAILED.value, RunState.CANCELLED.value})
#: Upper bounds (seconds, exclusive) of the wait-time histogram's buckets; the last bucket is open.
WAIT_BUCKETS_S: tuple[float, ...] = (60, 300, 900, 3600, 4 * 3600, 24 * 3600)
MAX_QUESTION = 200
#: The most characters of a reason kept (human.requested.reason's bound; an older or foreign event may be longer).
MAX_REASON = 200


# --------------------------------------------------------------------------- cursors
@dataclass(frozen=True)
class Cursor:
    """A position in a newest-first listing: strictly older than (``time``, ``key``)."""

    time: datetime
    key: str


def encode_cursor(time: datetime, key: str) -> str:
    raw = f"{as_utc(time).isoformat()}|{key}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(token: str, name: str = "before") -> Cursor:
    """The position ``token`` encodes; 422 ``invalid_cursor`` for anything :func:`encode_cursor` did not make."""
    bad = Unprocessable(f"query.{name}: not a cursor this API returned", code="invalid_cursor")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("utf-8")
        stamp, key = raw.split("|", 1)
        time = datetime.fromisoformat(stamp)
        if time.tzinfo is None or not key or "\x00" in key:
            raise ValueError(token)
        return Cursor(as_utc(time), key)
    except (ValueError, OverflowError, binascii.Error, UnicodeDecodeError):
        raise bad from None


def older_than(before: str | None, time_column: Any, key_column: Any) -> list[ColumnElement[bool]]:
    """The keyset condition of a newest-first page (ordered by ``time_column``, then ``key_column``,
    both descending): rows strictly older than the cursor ``before``; none for the first page."""
    if before is None:
        return []
    cursor = decode_cursor(before)
    return [or_(time_column < cursor.time, and_(time_column == cursor.time, key_column < cursor.key))]


# --------------------------------------------------------------------------- rows read by the API
@dataclass(frozen=True)
class EventRow:
    type: str
    time: datetime
    run_id: str | None
    data: dict[str, Any]


@dataclass(frozen=True)
class RunRow:
    run_id: str
    state: str
    agent: str | None
    trigger_id: str | None
    created_at: datetime


def _turns(data: dict[str, Any]) -> int | None:
    """The turns a terminal event counts: ``usage.turns``, else ``run.completed``'s own ``turns``; None when it has
    neither (an executor before the count)."""
    usage = data.get("usage")
    for value in (usage.get("turns") if isinstance(usage, dict) else None, data.get("turns")):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and value else None


# --------------------------------------------------------------------------- triggers (UI-2)
class LastRun(BaseModel):
    run_id: str
    state: RunState
    created_at: datetime


class TriggerView(BaseModel):
    trigger_id: str
    source: str | None = Field(default=None, description="The adapter of its newest delivery (trigger.received)")
    event_types: list[str] = Field(
        default_factory=list, description="The source event types its deliveries carried, sorted"
    )
    trigger_type: str | None = Field(default=None, description="webhook, cron, ... (from its last trigger.* change)")
    agent: str | None = Field(
        default=None, description="Its agent: from its last trigger.* change, else its newest trigger.accepted"
    )
    enabled: bool | None = Field(
        default=None, description="As of its last trigger.* change; null when the journal saw none"
    )
    deleted: bool = Field(default=False, description="Its last change was trigger.deleted")
    deliveries_received: int = Field(description="Distinct deliveries journaled as trigger.received")
    deliveries_accepted: int = Field(description="Distinct deliveries that started a run (trigger.accepted)")
    deliveries_rejected: int = Field(
        description="Distinct deliveries refused (trigger.rejected with a reason not in deliveries_ignored: "
        "duplicate, invalid_payload, concurrency_skip, ...)"
    )
    rejected_by_reason: dict[str, int] = Field(description="Refused deliveries per reason (duplicate, debounced, ...)")
    deliveries_ignored: int = Field(
        default=0,
        description="Distinct deliveries the gateway answered 200 ignored (trigger.rejected with reason "
        "unsupported_event, disabled or filtered): not failures, the trigger does not take them",
    )
    ignored_by_reason: dict[str, int] = Field(default_factory=dict, description="Ignored deliveries per reason")
    last_delivery_at: datetime | None = Field(description="Time of the newest trigger.* event of this trigger")
    last_run: LastRun | None = Field(description="The newest run launched by this trigger")
    runs_total: int
    runs_completed: int = Field(description="Successful runs")
    runs_failed: int
    runs_cancelled: int
    runs_needed_human: int = Field(description="Runs that asked a human at least once (human.requested)")


@dataclass
class _TriggerAcc:
    source: str | None = None
    event_types: set[str] = field(default_factory=set)
    trigger_type: str | None = None
    agent: str | None = None
    accepted_agent: str | None = None
    enabled: bool | None = None
    deleted: bool = False
    received: set[str] = field(default_factory=set)
    accepted: set[str] = field(default_factory=set)
    rejected: dict[str, str] = field(default_factory=dict)
    last_at: datetime | None = None
    runs: list[RunRow] = field(default_factory=list)


def triggers_of(events: Iterable[EventRow], runs: Iterable[RunRow], asked: set[str]) -> list[TriggerView]:
    """One view per trigger id seen in a trigger.* event or on a run; ``asked``: runs with a human.requested.

    ``events`` in stream order: the last change event and the newest delivery win."""
    acc: dict[str, _TriggerAcc] = {}
    for ev in events:
        trigger_id, delivery_id = _str(ev.data, "trigger_id"), _str(ev.data, "delivery_id")
        if trigger_id is None:
            continue
        if ev.type in TRIGGER_CHANGE_TYPES:
            c = acc.setdefault(trigger_id, _TriggerAcc())
            c.trigger_type = _str(ev.data, "trigger_type") or c.trigger_type
            c.agent = _str(ev.data, "agent") or c.agent
            enabled = ev.data.get("enabled")
            if isinstance(enabled, bool):
                c.enabled = enabled
            if ev.type in ("trigger.enabled", "trigger.disabled"):
                c.enabled = ev.type == "trigger.enabled"
            c.deleted = ev.type == "trigger.deleted"
            continue
        if delivery_id is None:
            continue
        a = acc.setdefault(trigger_id, _TriggerAcc())
        a.last_at = ev.time if a.last_at is None else max(a.last_at, ev.time)
        if ev.type == "trigger.received":
            a.received.add(delivery_id)
            a.source = _str(ev.data, "adapter") or a.source
            if (event_type := _str(ev.data, "source_event_type")) is not None:
                a.event_types.add(event_type)
        elif ev.type == "trigger.accepted":
            a.accepted.add(delivery_id)
            a.accepted_agent = _str(ev.data, "agent") or a.accepted_agent
        elif ev.type == "trigger.rejected":
            a.rejected[delivery_id] = _str(ev.data, "reason") or "unknown"
    for run in runs:
        if run.trigger_id is not None:
            acc.setdefault(run.trigger_id, _TriggerAcc()).runs.append(run)
    views = []
    for trigger_id, a in sorted(acc.items()):
        newest = max(a.runs, key=lambda r: (r.created_at, r.run_id), default=None)
        states = Counter(r.state for r in a.runs)
        views.append(
            TriggerView(
                trigger_id=trigger_id,
                source=a.source,
                event_types=sorted(a.event_types),
                trigger_type=a.trigger_type,
                agent=a.agent or a.accepted_agent,
                enabled=a.enabled,
                deleted=a.deleted,
                deliveries_received=len(a.received),
                deliveries_accepted=len(a.accepted),
                deliveries_rejected=sum(1 for r in a.rejected.values() if r not in IGNORED_REASONS),
                rejected_by_reason=dict(
                    sorted(Counter(r for r in a.rejected.values() if r not in IGNORED_REASONS).items())
                ),
                deliveries_ignored=sum(1 for r in a.rejected.values() if r in IGNORED_REASONS),
                ignored_by_reason=dict(sorted(Counter(r for r in a.rejected.values() if r in IGNORED_REASONS).items())),
                last_delivery_at=a.last_at,
                last_run=None
                if newest is None
                else LastRun(run_id=newest.run_id, state=RunState(newest.state), created_at=newest.created_at),
                runs_total=len(a.runs),
                runs_completed=states[RunState.COMPLETED.value],
                runs_failed=states[RunState.FAILED.value],
                runs_cancelled=states[RunState.CANCELLED.value],
                runs_needed_human=sum(1 for r in a.runs if r.run_id in asked),
            )
        )
    return views


class DeliveryView(BaseModel):
    delivery_id: str
    event_type: str | None = Field(description="The source's event type (from trigger.received)")
    outcome: str = Field(
        description="accepted; ignored (trigger.rejected with a reason in IGNORED_REASONS: the gateway answered "
        "200 ignored); rejected (any other trigger.rejected); or received (no decision journaled yet)"
    )
    reason: str | None = Field(description="Why it was ignored or rejected")
    run_id: str | None
    time: datetime = Field(description="When the delivery was first journaled")


def deliveries_of(events: Iterable[EventRow]) -> list[DeliveryView]:
    """One trigger's deliveries, newest first (by first event time, then delivery id)."""
    by_id: dict[str, dict[str, Any]] = {}
    for ev in events:
        delivery_id = _str(ev.data, "delivery_id")
        if delivery_id is None:
            continue
        d = by_id.setdefault(
            delivery_id, {"event_type": None, "outcome": "received", "reason": None, "run_id": None, "time": ev.time}
        )
        d["time"] = min(d["time"], ev.time)
        if ev.type == "trigger.received":
            d["event_type"] = _str(ev.data, "source_event_type")
        elif ev.type == "trigger.accepted":
            d["outcome"], d["reason"] = "accepted", None
            d["run_id"] = _str(ev.data, "run_id") or ev.run_id
        elif ev.type == "trigger.rejected" and d["outcome"] != "accepted":
            why = _str(ev.data, "reason")
            d["outcome"], d["reason"] = "ignored" if why in IGNORED_REASONS else "rejected", why
            d["run_id"] = d["run_id"] or _str(ev.data, "run_id")
    views = [DeliveryView(delivery_id=k, **v) for k, v in by_id.items()]
    views.sort(key=lambda v: (v.time, v.delivery_id), reverse=True)
    return views


# --------------------------------------------------------------------------- human analytics (OBS-1)
class WaitBucket(BaseModel):
    lt_s: float | None = Field(description="Exclusive upper bound in seconds; null: the open last bucket")
    count: int


class WaitStats(BaseModel):
    count: int
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None
    histogram: list[WaitBucket]


class OptionChoice(BaseModel):
    """OBS-1 "which decisions are delegated": how one option of a group of questions was chosen."""

    option_id: str = Field(description="The option's id (the machine value a run gets)")
    label: str | None = Field(
        description="Its label as most recently offered (else as the answer named it; null: neither said)"
    )
    offered: int = Field(description="Requests of the group that offered it")
    chosen: int = Field(description="human.answered events (joined by request_id) that chose it: a person's choice")
    defaulted: int = Field(
        default=0, description="Requests the timeout policy answered with it (human.expired action default)"
    )
    share: float | None = Field(description="chosen / the group's answers (null: none answered)")


class QuestionCount(BaseModel):
    """One group of "most delegated questions" (OBS-1): the questions one agent asked for one trigger's runs that
    have the same :func:`question_shape` -- the same decision asked about different pull requests, ids or
    links is one row."""

    question: str = Field(
        description=f"A representative question of the group, as asked (clipped to {MAX_QUESTION} characters): "
        "its most frequent text, ties to the most recently asked"
    )
    count: int = Field(description="Requests in the group")
    shape: str = Field(
        default="",
        description="The group's question shape: the text casefolded, whitespace collapsed, URLs as <url>, e-mail "
        "addresses as <email>, quoted strings as <text>, hex strings (7+ characters, a digit among them) as <hex>, "
        "words mixing letters and digits as <id>, numbers as <n> (1.2.3 and 1,000 one number); several masks "
        "joined by - _ . : / # as one <id>",
    )
    agent: str | None = Field(default=None, description="The agent of the group's runs (null: none known)")
    trigger_id: str | None = Field(default=None, description="The trigger of the group's runs (null: none)")
    share: float = Field(default=0.0, description="count / all the requests of the runs analysed")
    distinct: int = Field(default=1, description="How many different question texts the group holds")
    reason: str | None = Field(
        default=None,
        description="The group's most frequent reason (human.requested.reason, ties to the most recently asked); "
        "null: none of its requests gave one (an agent or executor before the field)",
    )
    reason_kind: str | None = Field(
        default=None, description="The group's most frequent reason_kind (ties: the smallest); null: none given"
    )
    answered: int = Field(default=0, description="Requests of the group a person answered (human.answered)")
    choices: list[OptionChoice] = Field(
        default_factory=list,
        description="Which options were chosen: every option the group's requests offered (by id) and any an answer "
        "chose, most chosen first, then in the order offered",
    )
    free_text: int = Field(default=0, description="Answers given as free text instead of an option")


class HumanCounts(BaseModel):
    runs_total: int
    runs_asked: int = Field(description="Runs with at least one human.requested")
    asked_share: float | None = Field(description="runs_asked / runs_total (null without runs)")
    requests_total: int
    answered: int
    expired: int
    rejected: int
    withdrawn: int = Field(
        default=0,
        description="Requests human-interaction withdrew: a human.withdrawn journaled (the run ended with them open, "
        "or no longer needed them, HUM-7); for history before that event, requests with no outcome journaled whose "
        "run ended (completed, failed, cancelled). Each request counts once",
    )
    pending: int = Field(
        description="Requests with no answer, expiry, rejection or withdrawal journaled, of a run not ended"
    )
    escalated: int = Field(
        default=0, description="Requests the timeout policy escalated (human.escalated) to someone else"
    )
    reminders: int = Field(default=0, description="Reminders the timeout policy sent (human.reasked), all requests")


class Breakdown(HumanCounts):
    key: str | None = Field(description="The agent or trigger id (null: runs without one)")
    runs_completed: int = Field(default=0, description="Of runs_total, the runs that completed")
    runs_failed: int = Field(default=0, description="Of runs_total, the runs that failed")
    runs_cancelled: int = Field(default=0, description="Of runs_total, the runs that were cancelled")


class StageBreakdown(HumanCounts):
    """The requests asked at one stage of their runs: the agent's turn (``human.requested.turn``)."""

    turn: int | None = Field(
        description="The run's model turn the question was asked in (1: the first reply of the model; the turns "
        "count on across parks and resumes); null: a request journaled without one"
    )
    wait_p50_s: float | None = Field(description="Median wait of this stage's answered requests (nearest rank)")
    runs_total: int = Field(description="All the runs analysed (the same on every stage: asked_share's base)")
    runs_asked: int = Field(description="Runs that asked at least one question at this turn")
    runs_reached: int | None = Field(
        default=None,
        description="Runs known to have reached this turn: an ended run by the turns its terminal event counts "
        "(run.completed / run.failed / run.cancelled), a run still going (or ended by an executor that did not "
        "count) by the latest turn it asked a question in -- a lower bound for it; null on the unknown-turn row",
    )
    reached_share: float | None = Field(
        default=None,
        description="runs_asked / runs_reached: of the runs that got this far, the share that needed a person here",
    )


class ReasonKindBreakdown(HumanCounts):
    """The requests of one ``reason_kind`` (OBS-1: which knowledge is missing, which decisions are delegated)."""

    reason_kind: str | None = Field(
        description="missing_knowledge, decision, approval, ambiguity (ask_human's reason_kind); null: not given "
        "(the agent gave none, or its executor predates the field)"
    )
    wait_p50_s: float | None = Field(description="Median wait of its answered requests (nearest rank)")
    runs_asked: int = Field(description="Runs that asked at least one question of this kind")


class ReasonCount(BaseModel):
    """One group of the reasons agents gave (``human.requested.reason``) with the same :func:`question_shape` and
    kind: e.g. "release date unknown" asked about different releases is one row."""

    reason: str = Field(description="A representative reason: its most frequent text, ties to the most recent")
    shape: str = Field(description="The reasons' shape (question_shape of the text)")
    reason_kind: str | None = Field(description="Their reason_kind (null: not given)")
    count: int = Field(description="Requests that gave it")
    share: float = Field(description="count / all the requests of the runs analysed")
    answered: int
    expired: int
    wait_p50_s: float | None = Field(description="Median wait of its answered requests (nearest rank)")


class HumanAnalytics(HumanCounts):
    since: datetime | None
    until: datetime | None
    wait: WaitStats = Field(description="Wait times of answered requests")
    top_questions: list[QuestionCount]
    by_agent: list[Breakdown]
    by_trigger: list[Breakdown]
    by_stage: list[StageBreakdown] = Field(
        default_factory=list,
        description="The same counts per stage, the turn of its run a question was asked in, ascending: "
        "runs_asked / asked_share are the runs (of all runs_total) that asked at that turn",
    )
    by_reason_kind: list[ReasonKindBreakdown] = Field(
        default_factory=list,
        description="The same counts per reason_kind the agents gave (OBS-1), most requests first, not given last",
    )
    top_reasons: list[ReasonCount] = Field(
        default_factory=list,
        description="The most frequent reasons agents gave (grouped by shape and kind), most requests first",
    )


#: A URL, without the punctuation that ends the sentence around it ("… see https://x/pr/9?").
_URL = re.compile(r"\b(?:[a-z][a-z0-9+.-]*://|www\.)[^\s<>\"'`]*[^\s<>\"'`.,;:!?)\]]", re.IGNORECASE)
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
#: Quoted strings: straight double quotes, backticks, typographic double and single quotes (U+201C..U+201D,
#: U+2018..U+2019, U+201E..U+201C), guillemets, and straight single quotes (a ' after a letter is an apostrophe:
#: "don't" is kept).
_QUOTED = re.compile(
    r'"[^"\n]*"|`[^`\n]*`|\u201c[^\u201d\n]*\u201d|\u2018[^\u2019\n]*\u2019|\u00ab[^\u00bb\n]*\u00bb'
    r"|\u201e[^\u201c\u201d\n]*[\u201c\u201d]|(?<!\w)'[^'\n]*'(?!\w)"
)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)+")
_WORD = re.compile(r"[^\W_]+")
_HEX = re.compile(r"(?:0x)?[0-9a-f]{7,}", re.IGNORECASE)
_MASKS = re.compile(r"<(?:n|id|hex)>(?:[-_.:/#]+<(?:n|id|hex)>)+")
_SPACE = re.compile(r"\s+")


def _mask_word(match: re.Match[str]) -> str:
    word = match.group()
    if word.isdecimal():
        return "<n>"
    if not any(c.isdecimal() for c in word):
        return word
    return "<hex>" if _HEX.fullmatch(word) else "<id>"


def question_shape(question: str) -> str:
    """The shape of a question (OBS-1's "most delegated questions" group by it): what stays when the parts that
    differ from one ask of the same decision to the next are masked -- URLs ``<url>``, e-mail addresses
    ``<email>``, quoted strings ``<text>``, hex strings of 7+ characters with a digit ``<hex>``, words mixing
    letters and digits ``<id>``, numbers ``<n>`` (``1.2.3``, ``1,000`` one number), masks joined by ``- _ . : / #``
    one ``<id>`` (a UUID) -- casefolded, whitespace collapsed, clipped to :data:`MAX_QUESTION`.
    Deterministic: the same text always gives the same shape."""
    text = _URL.sub("\x00url\x01", question)
    text = _EMAIL.sub("\x00email\x01", text)
    text = _QUOTED.sub("\x00text\x01", text)
    text = _NUMBER.sub("\x00n\x01", text)
    text = _WORD.sub(_mask_word, text)
    text = text.replace("\x00", "<").replace("\x01", ">")
    text = _MASKS.sub("<id>", text)
    return _SPACE.sub(" ", text).strip().casefold()[:MAX_QUESTION]


@dataclass
class _Request:
    run_id: str
    question: str
    asked_at: datetime
    turn: int | None = None
    outcome: str = "pending"
    waited_s: float | None = None
    escalated: bool = False
    reminders: int = 0
    shape: str = ""
    reason: str | None = None
    reason_kind: str | None = None
    #: The options it offered, (id, label), in order.
    offered: tuple[tuple[str, str | None], ...] = ()
    #: A person's answer (human.answered): the option id chosen, or "" for free text; None: not answered.
    chosen: str | None = None
    chosen_label: str | None = None
    #: The option the timeout policy answered with (human.expired action default).
    defaulted: str | None = None


def _percentile(ordered: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of an ascending sequence."""
    if not ordered:
        return None
    rank = max(math.ceil(p / 100 * len(ordered)), 1)
    return round(ordered[rank - 1], 3)


def _wait_stats(waits: Iterable[float]) -> WaitStats:
    ordered = sorted(waits)
    counts = [0] * (len(WAIT_BUCKETS_S) + 1)
    for w in ordered:
        counts[next((i for i, bound in enumerate(WAIT_BUCKETS_S) if w < bound), len(WAIT_BUCKETS_S))] += 1
    bounds: list[float | None] = [*WAIT_BUCKETS_S, None]
    return WaitStats(
        count=len(ordered),
        p50_s=_percentile(ordered, 50),
        p90_s=_percentile(ordered, 90),
        p99_s=_percentile(ordered, 99),
        max_s=round(ordered[-1], 3) if ordered else None,
        histogram=[WaitBucket(lt_s=b, count=c) for b, c in zip(bounds, counts, strict=True)],
    )


def _counts(runs: Sequence[RunRow], requests: Sequence[_Request]) -> dict[str, Any]:
    asked = {r.run_id for r in requests}
    outcomes = Counter(r.outcome for r in requests)
    return {
        "runs_total": len(runs),
        "runs_asked": sum(1 for r in runs if r.run_id in asked),
        "asked_share": round(sum(1 for r in runs if r.run_id in asked) / len(runs), 4) if runs else None,
        "requests_total": len(requests),
        "answered": outcomes["answered"],
        "expired": outcomes["expired"],
        "rejected": outcomes["rejected"],
        "withdrawn": outcomes["withdrawn"],
        "pending": outcomes["pending"],
        "escalated": sum(1 for r in requests if r.escalated),
        "reminders": sum(r.reminders for r in requests),
    }


def human_analytics(
    runs: Sequence[RunRow],
    events: Iterable[EventRow],
    *,
    since: datetime | None,
    until: datetime | None,
    top: int,
) -> HumanAnalytics:
    """OBS-1 over ``runs`` (already filtered) and their human.* ``events`` (with their terminal run events,
    :data:`RUN_END_TYPES`, for the runs that reached each stage)."""
    requests: dict[str, _Request] = {}
    outcomes: list[tuple[EventRow, str]] = []
    steps: list[tuple[str, str]] = []
    turns_of: dict[str, int] = {}  # run id -> the turns its terminal event counts
    for ev in events:
        if ev.type in RUN_END_TYPES:
            if ev.run_id is not None and (turns := _turns(ev.data)) is not None:
                turns_of[ev.run_id] = turns
            continue
        request_id = _str(ev.data, "request_id")
        if request_id is None or ev.run_id is None:
            continue
        if ev.type == "human.requested":
            turn = ev.data.get("turn")
            if request_id not in requests:
                question = _str(ev.data, "question") or ""
                reason = _str(ev.data, "reason")
                requests[request_id] = _Request(
                    ev.run_id,
                    question[:MAX_QUESTION],
                    ev.time,
                    turn if isinstance(turn, int) and not isinstance(turn, bool) else None,
                    shape=question_shape(question),
                    reason=reason[:MAX_REASON] if reason is not None else None,
                    reason_kind=_str(ev.data, "reason_kind"),
                    offered=_offered(ev.data.get("options")),
                )
        elif ev.type in POLICY_STEPS:
            steps.append((ev.type, request_id))
        else:
            outcomes.append((ev, request_id))
    for kind, request_id in steps:  # (each event once: the journal stores an event id once)
        if (req := requests.get(request_id)) is not None:
            if kind == "human.escalated":
                req.escalated = True
            else:
                req.reminders += 1
    for ev, request_id in sorted(outcomes, key=lambda o: o[0].time):
        req = requests.get(request_id)
        if req is None or req.outcome != "pending":
            continue  # the first outcome journaled decides
        req.outcome = ev.type.removeprefix("human.")
        _note_choice(req, ev)
        waited = ev.data.get("waited_s")
        if isinstance(waited, int | float) and not isinstance(waited, bool) and math.isfinite(waited):
            req.waited_s = max(float(waited), 0.0)
        else:
            req.waited_s = max((ev.time - req.asked_at).total_seconds(), 0.0)
    run_by_id = {r.run_id: r for r in runs}
    for req in requests.values():
        run = run_by_id.get(req.run_id)
        if req.outcome == "pending" and run is not None and run.state in RUN_ENDED:
            # the run ended with it open and no human.withdrawn says so (journaled before the event existed):
            # withdrawn with the run, never answered -- counted once either way (one outcome per request)
            req.outcome = "withdrawn"
    reqs = list(requests.values())

    def breakdown(key_of: str) -> list[Breakdown]:
        keys = sorted({getattr(r, key_of) for r in runs}, key=lambda k: (k is None, k or ""))
        rows = []
        for key in keys:
            key_runs = [r for r in runs if getattr(r, key_of) == key]
            ids = {r.run_id for r in key_runs}
            ended = {
                state: sum(1 for r in key_runs if r.state == state) for state in ("completed", "failed", "cancelled")
            }
            rows.append(
                Breakdown(
                    key=key,
                    runs_completed=ended["completed"],
                    runs_failed=ended["failed"],
                    runs_cancelled=ended["cancelled"],
                    **_counts(key_runs, [q for q in reqs if q.run_id in ids]),
                )
            )
        return rows

    def by_stage() -> list[StageBreakdown]:
        known = [q for q in reqs if q.run_id in run_by_id]
        turns = sorted({q.turn for q in known}, key=lambda t: (t is None, t or 0))
        rows = []
        reached_turn = dict(turns_of)  # run id -> the highest turn it is known to have reached
        for q in known:
            if q.turn is not None and q.turn > reached_turn.get(q.run_id, 0):
                reached_turn[q.run_id] = q.turn
        for turn in turns:
            asked = [q for q in known if q.turn == turn]
            answered = sorted(q.waited_s for q in asked if q.outcome == "answered" and q.waited_s is not None)
            counts = _counts(runs, asked)
            reached = None if turn is None else sum(1 for r in runs if reached_turn.get(r.run_id, 0) >= turn)
            share = round(counts["runs_asked"] / reached, 4) if reached else None
            rows.append(
                StageBreakdown(
                    turn=turn, wait_p50_s=_percentile(answered, 50), runs_reached=reached, reached_share=share, **counts
                )
            )
        return rows

    return HumanAnalytics(
        since=since,
        until=until,
        **_counts(runs, reqs),
        wait=_wait_stats(q.waited_s for q in reqs if q.outcome == "answered" and q.waited_s is not None),
        top_questions=_top_questions(reqs, run_by_id, top),
        by_agent=breakdown("agent"),
        by_trigger=breakdown("trigger_id"),
        by_stage=by_stage(),
        by_reason_kind=_by_reason_kind(runs, reqs),
        top_reasons=_top_reasons(reqs, run_by_id, top),
    )


def _offered(options: Any) -> tuple[tuple[str, str | None], ...]:
    """A human.requested's options as (id, label), skipping anything that is not one."""
    if not isinstance(options, list):
        return ()
    return tuple(
        (o["id"], _str(o, "label")) for o in options if isinstance(o, dict) and isinstance(o.get("id"), str) and o["id"]
    )


def _note_choice(req: _Request, ev: EventRow) -> None:
    """What the outcome ``ev`` chose: a person's option or free text (human.answered), or the timeout policy's
    default option (human.expired action default)."""
    if ev.type == "human.answered":
        answer = ev.data.get("answer")
        if isinstance(answer, dict) and answer.get("type") == "option" and (option := _str(answer, "option_id")):
            req.chosen, req.chosen_label = option, _str(answer, "label")
        elif isinstance(answer, dict) and answer.get("type") == "text":
            req.chosen = ""
    elif ev.type == "human.expired" and ev.data.get("action") == "default":
        default = ev.data.get("default_answer")
        if isinstance(default, dict) and (option := _str(default, "option_id")):
            req.defaulted = option


def _choices(members: Sequence[_Request]) -> list[OptionChoice]:
    """Every option the group offered (labels as most recently offered) and any an answer chose, with how often a
    person chose it: most chosen first, then in the order first offered."""
    order: dict[str, int] = {}
    labels: dict[str, str | None] = {}
    offered: Counter[str] = Counter()
    for q in sorted(members, key=lambda q: q.asked_at):
        for option_id, label in q.offered:
            order.setdefault(option_id, len(order))
            labels[option_id] = label or labels.get(option_id)
            offered[option_id] += 1
    chosen: Counter[str] = Counter(q.chosen for q in members if q.chosen)
    defaulted: Counter[str] = Counter(q.defaulted for q in members if q.defaulted)
    for q in members:  # an option no request offered (an answer naming another id): after the offered ones
        for picked in (q.chosen, q.defaulted):
            if picked:
                order.setdefault(picked, len(order) + 1_000_000)
                labels.setdefault(picked, q.chosen_label if picked == q.chosen else None)
    answered = sum(1 for q in members if q.chosen is not None)
    ids = sorted(order, key=lambda i: (-chosen[i], order[i], i))
    return [
        OptionChoice(
            option_id=i,
            label=labels.get(i),
            offered=offered[i],
            chosen=chosen[i],
            defaulted=defaulted[i],
            share=round(chosen[i] / answered, 4) if answered else None,
        )
        for i in ids
    ]


def _most_frequent(values: Iterable[tuple[str | None, datetime]]) -> str | None:
    """The most frequent non-null value, ties to the most recent, then the smallest."""
    counts: Counter[str] = Counter()
    latest: dict[str, datetime] = {}
    for value, at in values:
        if value is not None:
            counts[value] += 1
            latest[value] = max(latest.get(value, at), at)
    return min(counts, key=lambda v: (-counts[v], -latest[v].timestamp(), v), default=None)


def _by_reason_kind(runs: Sequence[RunRow], reqs: Sequence[_Request]) -> list[ReasonKindBreakdown]:
    known = {r.run_id for r in runs}
    asked = [q for q in reqs if q.run_id in known]
    kinds = Counter(q.reason_kind for q in asked)
    rows = []
    for kind in sorted(kinds, key=lambda k: (k is None, -kinds[k], k or "")):
        members = [q for q in asked if q.reason_kind == kind]
        answered = sorted(q.waited_s for q in members if q.outcome == "answered" and q.waited_s is not None)
        rows.append(
            ReasonKindBreakdown(reason_kind=kind, wait_p50_s=_percentile(answered, 50), **_counts(runs, members))
        )
    return rows


def _top_reasons(reqs: Sequence[_Request], run_by_id: dict[str, RunRow], top: int) -> list[ReasonCount]:
    """The ``top`` biggest groups of the reasons given, by (:func:`question_shape` of the reason, kind): count
    descending, then shape and kind ascending (not given last)."""
    known = [q for q in reqs if q.run_id in run_by_id]
    groups: dict[tuple[str, str | None], list[_Request]] = {}
    for q in known:
        if q.reason is not None:
            groups.setdefault((question_shape(q.reason), q.reason_kind), []).append(q)
    total = len(known)
    rows = []
    ordered = sorted(groups.items(), key=lambda g: (-len(g[1]), g[0][0], g[0][1] is None, g[0][1] or ""))
    for (shape, kind), members in ordered[:top]:
        answered = sorted(q.waited_s for q in members if q.outcome == "answered" and q.waited_s is not None)
        rows.append(
            ReasonCount(
                reason=_most_frequent((q.reason, q.asked_at) for q in members) or "",
                shape=shape,
                reason_kind=kind,
                count=len(members),
                share=round(len(members) / total, 4) if total else 0.0,
                answered=sum(1 for q in members if q.outcome == "answered"),
                expired=sum(1 for q in members if q.outcome == "expired"),
                wait_p50_s=_percentile(answered, 50),
            )
        )
    return rows


def _top_questions(reqs: Sequence[_Request], run_by_id: dict[str, RunRow], top: int) -> list[QuestionCount]:
    """The ``top`` biggest groups of questions by (trigger, agent, :func:`question_shape`): count descending, then
    shape, agent and trigger ascending (none last); each with its most frequent text (ties: the most recently
    asked, then the smallest) as the example."""
    groups: dict[tuple[str | None, str | None, str], list[_Request]] = {}
    for q in reqs:
        if (run := run_by_id.get(q.run_id)) is not None:
            groups.setdefault((run.trigger_id, run.agent, q.shape), []).append(q)
    total = sum(len(g) for g in groups.values())

    def order(item: tuple[tuple[str | None, str | None, str], list[_Request]]) -> tuple[Any, ...]:
        (trigger_id, agent, shape), members = item
        return (-len(members), shape, agent is None, agent or "", trigger_id is None, trigger_id or "")

    rows = []
    for (trigger_id, agent, shape), members in sorted(groups.items(), key=order)[:top]:
        texts = Counter(q.question for q in members)
        latest: dict[str, datetime] = {}
        for q in members:
            latest[q.question] = max(latest.get(q.question, q.asked_at), q.asked_at)
        example = min(texts, key=lambda t: (-texts[t], -latest[t].timestamp(), t))
        rows.append(
            QuestionCount(
                question=example,
                count=len(members),
                shape=shape,
                agent=agent,
                trigger_id=trigger_id,
                share=round(len(members) / total, 4),
                distinct=len(texts),
                reason=_most_frequent((q.reason, q.asked_at) for q in members),
                reason_kind=_most_frequent((q.reason_kind, q.asked_at) for q in members),
                answered=sum(1 for q in members if q.chosen is not None),
                choices=_choices(members),
                free_text=sum(1 for q in members if q.chosen == ""),
            )
        )
    return rows
