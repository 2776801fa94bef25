"""``temporality dlq``: read, re-drive and purge the dead letters of ``TEMPORALITY_DLQ``.

A consumer that gives up on a message (a permanent error, its deliveries used up, a forged event:
:mod:`temporality_bus.consumer`) copies it to ``temporality.dlq.<durable>`` with its headers and
``Temporality-Error``, ``-Original-Subject``, ``-Stream-Seq``, ``-Consumer``, terminates it, and journals
``bus.dead_lettered``. The dead letter is the only copy of that delivery the consumer will ever look at again.

=========================  =================================================================================
``list``                   the dead letters (DLQ stream sequence, time, consumer, original subject and
                           sequence, event id and type when the payload is a CloudEvent, the error)
``show SEQ``               one, with every header and the payload (pretty JSON), secrets redacted
``redrive SEQ...``         republish on the original subject, then delete from the DLQ (dry run unless
                           ``--yes``)
``purge SEQ...``           delete from the DLQ (dry run unless ``--yes``)
=========================  =================================================================================

**What a re-drive reaches.** JetStream has no way to hand one stored message back to one durable consumer (a
terminated message stays terminated; resetting a consumer re-delivers everything after a sequence), and every
service durable filters on event types, not on a subject of its own. So a re-drive publishes the payload again
on its original subject (``temporality.events.<type>``) with a fresh ``Nats-Msg-Id`` (derived from the dead
letter's DLQ sequence: re-running a re-drive that crashed before its delete is deduplicated by the stream for its
duplicate window): **every** consumer whose filter matches gets it again -- the journal, the gateway's event
triggers, the one that gave up, any journal subscriber. That is safe because the services' handlers are
idempotent by event id (the payload, its id included, is unchanged) -- the convention every consumer follows
(docs/service-conventions.md); a journal subscriber outside Temporality sees a second copy with the same ``id``.
A payload that is no valid CloudEvent has no such id, and every consumer would give up on it again (one letter
becomes one per consumer): refused unless ``--force``. The dry run names the other dead letters of the same
original message (several consumers gave up on it): re-drive one, purge the rest.
Before acting, :func:`audience` lists those consumers from the server. Timer firings (``temporality.timers.
fired...``) are refused: the server marks a real firing with ``Nats-Scheduler``, which no client may set, and
the consumers refuse a firing without it as forged.

The re-driven message carries ``Temporality-Redriven-From`` (``TEMPORALITY_DLQ#<seq>``), ``-Redriven-By`` (the
NATS user) and ``-Redriven-Consumer``: the stream itself keeps the trail. The catalogue lets no client but a
service publish an event (NATS permissions and the consumers' source check, :mod:`temporality_bus.provenance`),
so a re-drive or a purge is not journaled as an event: it is logged as one JSON line on standard error
(``dlq.redriven`` / ``dlq.purged``), and ``bus.dead_lettered`` in the journal keeps the record of the letter.

**Who may run it.** Any NATS user with full access (``temporality up``'s ``temporality-admin``), or the narrow
:data:`OPERATOR_USER`, ``dlq-operator``, that ``temporality nats-authorization`` adds for exactly this command
(:func:`operator_permissions`; docker compose's ``tools`` service and the chart's ``tools`` toolbox log in as it):
``TEMPORALITY_DLQ``'s info, message get and message delete, the consumer list of the stream a re-drive lands
in, and publishing on the subjects a re-drive publishes to (the event subjects the catalogue's consumers
read: whoever holds its password can publish any event there, which is what a re-drive is); replies below
``_INBOX.dlq-operator`` only. Nothing else: no purge or delete of a stream, no consumer, no bucket, no timer, no
other stream's messages (``tests/test_dlq_operator.py`` checks both on a real server).

Errors: :class:`DlqError` -- bad input, a sequence that holds no dead letter, a letter that cannot be
re-driven: exit 2, nothing changed; :class:`Unreachable` -- NATS refused or failed: exit 1 (run it again).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import nats.errors
import structlog
from nats.js.api import RawStreamMsg
from nats.js.errors import APIError, NotFoundError
from pydantic import ValidationError

from temporality_bus import Bus, BusError, NatsSettings
from temporality_bus.consumer import claimed_id_and_type
from temporality_protocol import decode
from temporality_protocol.catalog import (
    ALL_STREAMS,
    CONSUMERS,
    DLQ_PREFIX,
    DLQ_STREAM,
    EVENTS_PREFIX,
    TIMER_FIRED_PREFIX,
    subject_matches,
)
from temporality_protocol.errors import ProtocolError
from temporality_protocol.ids import derive_id
from temporality_protocol.permissions import Permissions, service_inbox
from temporality_protocol.redaction import CREDENTIAL_KEY, PatternError, Redactor, process_redactor

__all__ = [
    "OPERATOR_USER",
    "DeadLetter",
    "DlqError",
    "Unreachable",
    "add_parser",
    "audience",
    "operator_permissions",
    "read",
    "redrive",
    "redrive_subjects",
    "run",
    "scan",
]

#: Where re-drives and purges are logged when no audit logger is given (the command gives its own, on stderr).
log = structlog.get_logger("temporality.dlq")

#: The headers the consumer runner adds to a dead letter; a re-drive drops them (and every ``Nats-*``).
ERROR_HEADER = "Temporality-Error"
ORIGINAL_SUBJECT_HEADER = "Temporality-Original-Subject"
STREAM_SEQ_HEADER = "Temporality-Stream-Seq"
CONSUMER_HEADER = "Temporality-Consumer"
#: What a re-drive adds: where it came from, who did it, for whom.
REDRIVEN_FROM_HEADER = "Temporality-Redriven-From"
REDRIVEN_BY_HEADER = "Temporality-Redriven-By"
REDRIVEN_CONSUMER_HEADER = "Temporality-Redriven-Consumer"
_DEAD_LETTER_HEADERS = frozenset({ERROR_HEADER, ORIGINAL_SUBJECT_HEADER, STREAM_SEQ_HEADER, CONSUMER_HEADER})

#: The NATS user of this command in a deployment (``temporality nats-authorization``; :func:`operator_permissions`).
OPERATOR_USER = "dlq-operator"

#: The admin user ``temporality up`` makes (``temporality_embedded.stack.NATS_ADMIN``) and where it keeps things.
_UP_ADMIN = "temporality-admin"
_UP_PORT_FILE = "nats-port"
_UP_PASSWORDS_FILE = "nats-users.json"

#: The journal's audit trail blanks the values of these keys: the same here.
_SECRET_KEY = CREDENTIAL_KEY
REDACTED = "[redacted]"
#: How many characters of an error ``list`` prints (``show`` prints it whole).
_ERROR_WIDTH = 160


class DlqError(Exception):
    """Bad input, or a dead letter that is not there or cannot be re-driven: exit 2, nothing changed."""


class Unreachable(Exception):
    """NATS could not be reached, refused the user, or failed a request: exit 1 (nothing lost; run it again)."""


@dataclass(frozen=True)
class DeadLetter:
    """One message of ``TEMPORALITY_DLQ``, as the consumer runner wrote it."""

    seq: int
    time: datetime | None
    subject: str
    headers: dict[str, str]
    data: bytes
    consumer: str = field(init=False)
    error: str = field(init=False)
    original_subject: str | None = field(init=False)
    original_seq: int | None = field(init=False)
    event_id: str | None = field(init=False)
    event_type: str | None = field(init=False)
    #: Whether the payload is a valid CloudEvent; when not, :attr:`event_id` and :attr:`event_type` are what it
    #: says it is (a JSON object's ``id`` and ``type``, as the journal's ``bus.dead_lettered`` records them).
    valid_envelope: bool = field(init=False)

    def __post_init__(self) -> None:
        h = self.headers
        prefix = f"{DLQ_PREFIX}."
        fallback = self.subject[len(prefix) :] if self.subject.startswith(prefix) else self.subject
        object.__setattr__(self, "consumer", h.get(CONSUMER_HEADER) or fallback)
        object.__setattr__(self, "error", h.get(ERROR_HEADER, ""))
        object.__setattr__(self, "original_subject", h.get(ORIGINAL_SUBJECT_HEADER))
        raw_seq = h.get(STREAM_SEQ_HEADER, "")
        object.__setattr__(self, "original_seq", int(raw_seq) if raw_seq.isdigit() else None)
        event_id: str | None = None
        event_type: str | None = h.get("Ce-Type")
        valid = False
        try:
            envelope = decode(self.data)
        except (ProtocolError, ValidationError, ValueError):
            claimed_id, claimed_type = claimed_id_and_type(self.data)
            event_id, event_type = claimed_id, claimed_type or event_type
        else:
            event_id, event_type, valid = envelope.id, envelope.type, True
        object.__setattr__(self, "event_id", event_id)
        object.__setattr__(self, "event_type", event_type)
        object.__setattr__(self, "valid_envelope", valid)

    @classmethod
    def of(cls, msg: RawStreamMsg) -> DeadLetter:
        assert msg.seq is not None
        assert msg.subject is not None
        headers = {str(k): str(v) for k, v in (msg.headers or {}).items()}
        return cls(seq=msg.seq, time=msg.time, subject=msg.subject, headers=headers, data=msg.data or b"")


# ---------------------------------------------------------------------------------------------- reading


async def read(bus: Bus, seq: int) -> DeadLetter:
    """The dead letter at DLQ stream sequence ``seq``; :class:`DlqError` when there is none."""
    try:
        msg = await bus.js.get_msg(DLQ_STREAM.name, seq=seq)
    except NotFoundError:
        raise DlqError(f"no dead letter at {DLQ_STREAM.name} sequence {seq} (see `temporality dlq list`)") from None
    except APIError as exc:  # e.g. 10037 "no message found"
        if exc.code == 404 or exc.err_code == 10037:
            raise DlqError(f"no dead letter at {DLQ_STREAM.name} sequence {seq} (see `temporality dlq list`)") from None
        raise
    return DeadLetter.of(msg)


async def scan(bus: Bus, consumer: str | None = None, since: datetime | None = None) -> list[DeadLetter]:
    """Every dead letter (of ``consumer``; stored at or after ``since``), oldest first."""
    subject = f"{DLQ_PREFIX}.{consumer}" if consumer else f"{DLQ_PREFIX}.>"
    info = await bus.js.stream_info(DLQ_STREAM.name)
    seq = max(int(info.state.first_seq or 1), 1)
    last = int(info.state.last_seq or 0)
    letters: list[DeadLetter] = []
    while seq <= last:
        try:
            msg = await bus.js.get_msg(DLQ_STREAM.name, seq=seq, subject=subject, next=True)
        except NotFoundError:
            break
        except APIError as exc:
            if exc.code == 404 or exc.err_code == 10037:
                break
            raise
        letter = DeadLetter.of(msg)
        if since is None or letter.time is None or letter.time >= since:
            letters.append(letter)
        seq = letter.seq + 1
    return letters


def stream_of(subject: str) -> str | None:
    """The catalogue's stream that stores ``subject`` (the catalogue's streams never overlap), else ``None``. Read
    from the catalogue, not asked of the server (``$JS.API.STREAM.NAMES``): :data:`OPERATOR_USER` needs no listing
    of every stream."""
    for spec in ALL_STREAMS:
        if any(subject_matches(pattern, subject) for pattern in spec.subjects):
            return spec.name
    return None


def redrive_subjects() -> tuple[str, ...]:
    """The subjects a re-drive may publish on: what the catalogue's consumers outside the timers streams read (a
    dead letter's original subject is one of them), without those another one covers."""
    filters = dict.fromkeys(
        f
        for consumer in CONSUMERS.values()
        for f in consumer.filter_subjects
        if f.startswith(f"{EVENTS_PREFIX}.") or f == EVENTS_PREFIX
    )
    return tuple(f for f in filters if not any(o != f and subject_matches(o, f) for o in filters))


def operator_permissions() -> Permissions:
    """:data:`OPERATOR_USER`'s permissions: what ``list``, ``show``, ``redrive`` and ``purge`` send, and nothing else
    (see the module's docstring); replies below ``_INBOX.dlq-operator``."""
    dlq = DLQ_STREAM.name
    publish = [f"$JS.API.STREAM.{op}.{dlq}" for op in ("INFO", "MSG.GET", "MSG.DELETE")]
    subjects = redrive_subjects()
    for stream in dict.fromkeys(s for s in map(stream_of, subjects) if s is not None):
        publish.append(f"$JS.API.CONSUMER.LIST.{stream}")  # audience(): who gets a re-drive
    publish += subjects
    return Permissions(publish=tuple(dict.fromkeys(publish)), subscribe=(f"{service_inbox(OPERATOR_USER)}.>",))


async def audience(bus: Bus, subject: str) -> tuple[str, list[str]]:
    """The stream that stores ``subject`` and the durable consumers on it whose filter matches it: who gets a
    message republished there. :class:`DlqError` when no stream stores it."""
    stream = stream_of(subject)
    if stream is None:
        raise DlqError(f"no stream stores {subject} (nothing would receive it)")
    names: list[str] = []
    offset = 0
    while True:
        try:
            page = await bus.js.consumers_info(stream, offset=offset or None)
        except NotFoundError:
            raise DlqError(f"no stream {stream} here to store {subject} (nothing would receive it)") from None
        for info in page:
            config = info.config
            filters = list(config.filter_subjects or ([config.filter_subject] if config.filter_subject else []))
            if not filters or any(subject_matches(f, subject) for f in filters):
                names.append(str(config.durable_name or info.name))
        if len(page) < 256:
            break
        offset += len(page)
    return stream, sorted(names)


# ---------------------------------------------------------------------------------------------- acting


@dataclass(frozen=True)
class Redriven:
    letter: DeadLetter
    stream: str
    seq: int
    duplicate: bool


def redrive_headers(letter: DeadLetter, user: str | None) -> dict[str, str]:
    """The headers a re-drive publishes with: the original ones, a fresh ``Nats-Msg-Id`` and the trail."""
    headers = {k: v for k, v in letter.headers.items() if not k.startswith("Nats-") and k not in _DEAD_LETTER_HEADERS}
    headers["Nats-Msg-Id"] = derive_id(
        "dlq-redrive", letter.consumer, str(letter.original_seq), str(letter.seq), letter.event_id or ""
    )
    headers[REDRIVEN_FROM_HEADER] = f"{DLQ_STREAM.name}#{letter.seq}"
    headers[REDRIVEN_BY_HEADER] = user or "-"
    headers[REDRIVEN_CONSUMER_HEADER] = letter.consumer
    return headers


def redrivable(letter: DeadLetter, force: bool = False) -> str:
    """``letter``'s original subject; :class:`DlqError` saying why when it cannot be re-driven. A payload that is no
    valid CloudEvent is refused unless ``force``: it has no event id the consumers could deduplicate by, and every
    consumer of the subject would give up on it again (one dead letter becomes one per consumer)."""
    subject = letter.original_subject
    if not subject:
        raise DlqError(f"dead letter {letter.seq} has no {ORIGINAL_SUBJECT_HEADER} header: not re-drivable")
    if subject.startswith(f"{TIMER_FIRED_PREFIX}."):
        raise DlqError(
            f"dead letter {letter.seq} is a timer firing ({subject}): a firing only the server may mark "
            "(Nats-Scheduler) cannot be re-driven by a client; the consumers would refuse it as forged. "
            "Purge it and repair what the timer was for (see docs/operations.md, Dead letters)"
        )
    if not subject.startswith(f"{EVENTS_PREFIX}."):
        raise DlqError(f"dead letter {letter.seq}: {subject} is not an event subject ({EVENTS_PREFIX}.>)")
    if not letter.valid_envelope and not force:
        raise DlqError(
            f"dead letter {letter.seq} is not a valid CloudEvent (`temporality dlq show {letter.seq}`): re-driven "
            "unchanged it would reach every consumer of its subject, each of which would refuse it again and "
            "dead-letter its own copy (one letter becomes one per consumer), and without a valid event id no "
            "consumer can recognise it as a repeat. Purge it (`temporality dlq purge "
            f"{letter.seq} --yes`; the journal's bus.dead_lettered keeps the record) and repair what it was for; "
            "--force re-drives it anyway"
        )
    return subject


async def redrive(bus: Bus, letter: DeadLetter, audit: Any = None, *, force: bool = False) -> Redriven:
    """Republish ``letter`` on its original subject (see the module's docstring), then delete it from the DLQ;
    ``force``: also a payload that is no valid CloudEvent (:func:`redrivable`)."""
    subject = redrivable(letter, force)
    result = await bus.publish_raw(subject, letter.data, redrive_headers(letter, bus.settings.user))
    await bus.js.delete_msg(DLQ_STREAM.name, letter.seq)
    (audit or log).warning(
        "dlq.redriven",
        dlq_seq=letter.seq,
        consumer=letter.consumer,
        original_subject=subject,
        original_seq=letter.original_seq,
        event_id=letter.event_id,
        event_type=letter.event_type,
        stream=result.stream,
        stream_seq=result.seq,
        duplicate=result.duplicate,
        user=bus.settings.user,
    )
    return Redriven(letter, result.stream, result.seq, result.duplicate)


async def purge(bus: Bus, letter: DeadLetter, audit: Any = None) -> None:
    """Delete ``letter`` from the DLQ (``bus.dead_lettered`` in the journal keeps its record)."""
    try:
        await bus.js.delete_msg(DLQ_STREAM.name, letter.seq)
    except NotFoundError:  # gone already (another operator): what was asked is true
        pass
    (audit or log).warning(
        "dlq.purged",
        dlq_seq=letter.seq,
        consumer=letter.consumer,
        original_subject=letter.original_subject,
        original_seq=letter.original_seq,
        event_id=letter.event_id,
        event_type=letter.event_type,
        user=bus.settings.user,
    )


# ---------------------------------------------------------------------------------------------- redaction


def redact_value(value: Any, redactor: Redactor) -> Any:
    """``value`` (decoded JSON) with credential-like keys' values blanked, as the journal's audit trail does, and
    every string passed through the secret patterns (``temporality_protocol.redaction``)."""
    if isinstance(value, dict):
        return {
            k: REDACTED
            if isinstance(k, str) and not k.endswith("_set") and _SECRET_KEY.search(k) and not isinstance(v, bool)
            else redact_value(v, redactor)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_value(v, redactor) for v in value]
    if isinstance(value, str):
        return redactor.redact(value).text
    return value


def render_payload(data: bytes, redactor: Redactor) -> str:
    """The payload for a person: pretty JSON (redacted), else the text (redacted), else its size."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(data)} bytes, not UTF-8: not shown>"
    try:
        value = json.loads(text)
    except ValueError:
        return redactor.redact(text).text
    return json.dumps(redact_value(value, redactor), indent=2, ensure_ascii=False, sort_keys=False)


# ---------------------------------------------------------------------------------------------- the command


def _since(text: str) -> datetime:
    """``30m``, ``2h``, ``7d`` (ago) or an ISO 8601 time (UTC unless it says)."""
    match = re.fullmatch(r"(\d+)\s*([smhd])", text.strip())
    if match:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match.group(2)]
        return datetime.now(UTC) - timedelta(**{unit: int(match.group(1))})
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--since {text!r}: want a duration (30m, 2h, 7d) or an ISO time (2026-12-07T02:00:00Z)"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _seq(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a DLQ sequence (a positive number, the SEQ column of `temporality dlq list`)"
        )
    return value


def _connection_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group(
        "NATS connection",
        "default: TEMPORALITY_NATS_URL, _USER, _PASSWORD, _TLS_CA_FILE, _TLS_CERT_FILE, _TLS_KEY_FILE, "
        "_JETSTREAM_DOMAIN from the environment (as every service reads them). The user: dlq-operator (the user "
        "`temporality nats-authorization` makes for this command: it reads and deletes in TEMPORALITY_DLQ and "
        "publishes on the event subjects, nothing else) or one with full access (temporality up's temporality-admin)",
    )
    group.add_argument("--nats-url", default=None, help="e.g. nats://127.0.0.1:4222")
    group.add_argument(
        "--user", default=None, help="NATS user (password: TEMPORALITY_NATS_PASSWORD or --password-file)"
    )
    group.add_argument("--password-file", default=None, type=Path, help="a file holding the NATS password")
    group.add_argument("--tls-ca-file", default=None, type=Path, help="the CA of the server's certificate")
    group.add_argument("--tls-cert-file", default=None, type=Path, help="a client certificate (mutual TLS)")
    group.add_argument("--tls-key-file", default=None, type=Path, help="its key")
    group.add_argument(
        "--data-dir",
        default=None,
        type=Path,
        help="a running `temporality up`'s data directory (e.g. .temporality): its NATS port and its "
        "temporality-admin user and password",
    )
    return common


def add_parser(commands: Any) -> None:
    """Register ``dlq`` and its subcommands on ``temporality``'s subparsers."""
    common = _connection_options()
    p_dlq = commands.add_parser(
        "dlq",
        help="dead letters: list, show, re-drive or purge the messages consumers gave up on (TEMPORALITY_DLQ)",
        description="Read, re-drive and purge dead letters. See docs/operations.md, 'Dead letters'.",
    )
    verbs = p_dlq.add_subparsers(dest="dlq_command", required=True)

    p_list = verbs.add_parser("list", parents=[common], help="the dead letters, oldest first")
    p_list.add_argument("--consumer", default=None, metavar="DURABLE", help="only this consumer's")
    p_list.add_argument("--since", type=_since, default=None, help="only newer: 30m, 2h, 7d or an ISO time")
    p_list.add_argument("--limit", type=int, default=50, help="the newest N (default: 50; 0: all)")
    p_list.add_argument("--json", action="store_true", help="one JSON object per line (no payload)")

    p_show = verbs.add_parser("show", parents=[common], help="one dead letter: headers and payload, secrets redacted")
    p_show.add_argument("seq", type=_seq, metavar="SEQ", help="its DLQ sequence (the SEQ column of list)")

    for verb, what in (
        ("redrive", "republish on the original subject (every consumer of it gets it again) and delete from the DLQ"),
        ("purge", "delete from the DLQ for good (the journal's bus.dead_lettered keeps the record)"),
    ):
        p_act = verbs.add_parser(verb, parents=[common], help=f"{what}; a dry run unless --yes")
        p_act.add_argument("seqs", type=_seq, nargs="*", metavar="SEQ", help="DLQ sequences (the SEQ column of list)")
        p_act.add_argument("--consumer", default=None, metavar="DURABLE", help="every dead letter of this consumer")
        p_act.add_argument("--all", action="store_true", help="every dead letter of every consumer")
        p_act.add_argument("--since", type=_since, default=None, help="with --consumer/--all: only newer")
        p_act.add_argument("--yes", action="store_true", help="act (default: say what would be done)")
        if verb == "redrive":
            p_act.add_argument(
                "--force",
                action="store_true",
                help="also re-drive a payload that is no valid CloudEvent (refused otherwise: every consumer of its "
                "subject would dead-letter it again, and it has no event id to deduplicate by)",
            )


def settings_for(args: argparse.Namespace) -> NatsSettings:
    """The NATS settings: the environment's, overridden by the flags. :class:`DlqError` for bad ones."""
    overrides: dict[str, Any] = {"max_reconnect_attempts": 2, "reconnect_wait_s": 0.5, "drain_timeout_s": 2.0}
    if args.data_dir is not None:
        data_dir: Path = args.data_dir
        try:
            port = int((data_dir / _UP_PORT_FILE).read_text(encoding="utf-8").strip())
        except (OSError, ValueError) as exc:
            raise DlqError(f"--data-dir {data_dir}: no NATS port of a `temporality up` there ({exc})") from None
        overrides["url"] = f"nats://127.0.0.1:{port}"
        overrides |= {"creds_file": None, "nkey_seed_file": None}  # the stack's own users, not the shell's files
        passwords = data_dir / _UP_PASSWORDS_FILE
        if passwords.is_file():  # absent: temporality up --no-nats-auth
            try:
                users = json.loads(passwords.read_text(encoding="utf-8"))
                overrides |= {"user": _UP_ADMIN, "password": str(users[_UP_ADMIN])}
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise DlqError(f"--data-dir {data_dir}: cannot read {_UP_ADMIN}'s password ({exc!r})") from None
    for flag, key in (
        ("nats_url", "url"),
        ("user", "user"),
        ("tls_ca_file", "tls_ca_file"),
        ("tls_cert_file", "tls_cert_file"),
        ("tls_key_file", "tls_key_file"),
    ):
        if getattr(args, flag) is not None:
            overrides[key] = getattr(args, flag)
    if args.user is not None:  # the flag's user and password over the environment's credentials or nkey file
        overrides |= {"creds_file": None, "nkey_seed_file": None}
    if args.password_file is not None:
        try:
            overrides["password"] = args.password_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise DlqError(f"--password-file: {exc}") from None
    try:
        return NatsSettings(**overrides)
    except ValidationError as exc:
        raise DlqError(f"NATS settings: {exc.errors()[0]['msg']}") from None


def _select_check(args: argparse.Namespace) -> None:
    chosen = sum((bool(args.seqs), args.consumer is not None, args.all))
    if chosen != 1:
        raise DlqError(f"{args.dlq_command}: name SEQ..., or --consumer DURABLE, or --all (exactly one)")
    if args.since is not None and args.seqs:
        raise DlqError("--since goes with --consumer or --all, not with sequences")


async def _selected(bus: Bus, args: argparse.Namespace) -> list[DeadLetter]:
    if args.seqs:
        return [await read(bus, seq) for seq in dict.fromkeys(args.seqs)]  # all read before anything is done
    return await scan(bus, None if args.all else args.consumer, args.since)


def _siblings(letters: list[DeadLetter], every: list[DeadLetter]) -> dict[int, list[DeadLetter]]:
    """For each of ``letters``: the other dead letters of ``every`` that hold the same original message (its stream
    sequence and subject), and are not selected themselves -- one message several consumers gave up on."""
    chosen = {letter.seq for letter in letters}
    found: dict[int, list[DeadLetter]] = {}
    for letter in letters:
        if letter.original_seq is None:
            continue
        found[letter.seq] = [
            other
            for other in every
            if other.seq not in chosen
            and other.original_seq == letter.original_seq
            and other.original_subject == letter.original_subject
        ]
    return found


def _cells(letter: DeadLetter, redactor: Redactor) -> tuple[str, ...]:
    when = letter.time.strftime("%Y-%m-%d %H:%M:%S") if letter.time is not None else "-"
    original = f"{letter.original_subject or '-'}#{letter.original_seq if letter.original_seq is not None else '-'}"
    event = f"{letter.event_type or '-'} {letter.event_id or '-'}"
    if not letter.valid_envelope and (letter.event_type or letter.event_id):
        event += " (invalid)"  # what the message says it is; it is no valid CloudEvent
    error = redactor.redact(letter.error).text
    if len(error) > _ERROR_WIDTH:
        error = error[: _ERROR_WIDTH - 1] + "…"
    return (str(letter.seq), when, letter.consumer, original, event, error)


_HEADINGS = ("SEQ", "TIME (UTC)", "CONSUMER", "ORIGINAL SUBJECT#SEQ", "EVENT TYPE ID", "ERROR")


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """``rows`` under :data:`_HEADINGS`, each column as wide as its widest cell (SEQ right-aligned; the last,
    the error, not padded)."""
    every = [_HEADINGS, *rows]
    widths = [max(len(row[i]) for row in every) for i in range(len(_HEADINGS) - 1)]
    lines = []
    for row in every:
        cells = [row[0].rjust(widths[0])] + [
            cell.ljust(width) for cell, width in zip(row[1:-1], widths[1:], strict=True)
        ]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return lines


async def _list(bus: Bus, args: argparse.Namespace, out: TextIO, redactor: Redactor) -> int:
    letters = await scan(bus, args.consumer, args.since)
    shown = letters[-args.limit :] if args.limit > 0 else letters
    if args.json:
        for letter in shown:
            row = {
                "seq": letter.seq,
                "time": letter.time.isoformat() if letter.time is not None else None,
                "consumer": letter.consumer,
                "original_subject": letter.original_subject,
                "original_seq": letter.original_seq,
                "event_id": letter.event_id,
                "event_type": letter.event_type,
                "valid_envelope": letter.valid_envelope,
                "error": redactor.redact(letter.error).text,
            }
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
        return 0
    if not letters:
        scope = f" of {args.consumer}" if args.consumer else ""
        out.write(f"no dead letters{scope} in {DLQ_STREAM.name}\n")
        return 0
    for line in _table([_cells(letter, redactor) for letter in shown]):
        out.write(line + "\n")
    if len(shown) < len(letters):
        out.write(f"({len(letters) - len(shown)} older not shown: --limit 0 for all, or --since)\n")
    out.write(f"{len(letters)} dead letter(s); `temporality dlq show SEQ` for one's headers and payload\n")
    return 0


async def _show(bus: Bus, args: argparse.Namespace, out: TextIO, redactor: Redactor) -> int:
    letter = await read(bus, args.seq)
    when = letter.time.isoformat() if letter.time is not None else "-"
    out.write(f"dead letter {letter.seq} of {DLQ_STREAM.name} ({letter.subject}), stored {when}\n")
    out.write(f"  consumer         {letter.consumer}\n")
    out.write(f"  original         {letter.original_subject or '-'} (stream seq {letter.original_seq or '-'})\n")
    invalid = "" if letter.valid_envelope else "   (no valid CloudEvent: the type and id it says it has)"
    if not letter.valid_envelope and not (letter.event_type or letter.event_id):
        invalid = "   (no valid CloudEvent)"
    out.write(f"  event            {letter.event_type or '-'} {letter.event_id or '-'}{invalid}\n")
    out.write(f"  error            {redactor.redact(letter.error).text}\n")
    out.write("headers:\n")
    for key in sorted(letter.headers):
        value = letter.headers[key]
        shown = REDACTED if _SECRET_KEY.search(key) else redactor.redact(value).text
        out.write(f"  {key}: {shown}\n")
    out.write(f"payload ({len(letter.data)} bytes, secrets redacted):\n")
    out.write(render_payload(letter.data, redactor) + "\n")
    return 0


async def _act(bus: Bus, args: argparse.Namespace, out: TextIO, redactor: Redactor, audit: Any) -> int:
    letters = await _selected(bus, args)
    verb = args.dlq_command
    if not letters:
        out.write("no dead letters selected: nothing to do\n")
        return 0
    force = bool(getattr(args, "force", False))
    if verb == "redrive":
        subjects = {letter.seq: redrivable(letter, force) for letter in letters}  # refuse before doing anything
        audiences = {s: await audience(bus, s) for s in dict.fromkeys(subjects.values())}
        siblings = _siblings(letters, await scan(bus))
    mode = "" if args.yes else "DRY RUN (nothing changed; --yes to act): would "
    out.write(f"{mode}{verb} {len(letters)} dead letter(s):\n")
    for letter, line in zip(letters, _table([_cells(letter, redactor) for letter in letters])[1:], strict=True):
        out.write(line + "\n")
        if verb == "redrive":
            stream, consumers = audiences[subjects[letter.seq]]
            others = [c for c in consumers if c != letter.consumer]
            if letter.consumer in consumers:
                gave_up = f"{letter.consumer} (which gave up on it) gets it again"
            else:
                gave_up = f"NOTE: there is no consumer {letter.consumer} on {stream} now, so it will not get it"
            if letter.valid_envelope:
                also = f"so do, idempotent by event id: {', '.join(others) or 'no other consumer'}"
            else:
                also = (
                    f"so do, NOT idempotent (no valid CloudEvent, no event id to deduplicate by; --force): "
                    f"{', '.join(others) or 'no other consumer'}, each of which may dead-letter it again"
                )
            out.write(
                f"        -> republished on {subjects[letter.seq]} ({stream}) under a new Nats-Msg-Id: {gave_up}; "
                f"{also}\n"
            )
            same = siblings.get(letter.seq, [])
            if same:
                listed = ", ".join(f"{other.seq} ({other.consumer})" for other in same)
                out.write(
                    f"        NOTE: the same message ({letter.original_subject}#{letter.original_seq}) is also "
                    f"dead-lettered as {listed}: the re-drive reaches those consumers too, so re-drive one and purge "
                    f"the rest (`temporality dlq purge {' '.join(str(o.seq) for o in same)} --yes`)\n"
                )
    if not args.yes:
        return 0
    done = 0
    for letter in letters:
        if verb == "redrive":
            result = await redrive(bus, letter, audit, force=force)
            dup = " (already re-driven: the stream deduplicated it)" if result.duplicate else ""
            out.write(f"redriven {letter.seq} -> {result.stream} seq {result.seq}{dup}; removed from the DLQ\n")
        else:
            await purge(bus, letter, audit)
            out.write(f"purged {letter.seq}\n")
        done += 1
    out.write(f"{done} dead letter(s) {'redriven' if verb == 'redrive' else 'purged'}\n")
    return 0


async def _run(args: argparse.Namespace, out: TextIO, audit: Any) -> int:
    settings = settings_for(args)
    hint = (
        " For a `temporality up` stack, pass its data directory: --data-dir .temporality (its NATS port and admin "
        "user and password)."
        if args.data_dir is None
        else ""
    )
    try:
        redactor = process_redactor()
    except PatternError as exc:
        raise DlqError(str(exc)) from None
    if args.dlq_command in ("redrive", "purge"):
        _select_check(args)
    try:
        # replies below _INBOX.dlq-operator, the inbox OPERATOR_USER may read (a full-access user may read any), also
        # when the user comes from a credentials or nkey seed file, which has no user name to derive it from
        inbox = service_inbox(OPERATOR_USER)
        async with Bus.connect(settings, name="temporality-dlq", inbox_prefix=inbox) as bus:
            try:
                await bus.js.stream_info(DLQ_STREAM.name)
            except NotFoundError:
                raise Unreachable(
                    f"no {DLQ_STREAM.name} stream at {settings.url}: another server or JetStream domain, or the "
                    f"journal (its owner) never started there.{hint}"
                ) from None
            if args.dlq_command == "list":
                return await _list(bus, args, out, redactor)
            if args.dlq_command == "show":
                return await _show(bus, args, out, redactor)
            return await _act(bus, args, out, redactor, audit)
    except (DlqError, Unreachable):
        raise
    except (nats.errors.Error, OSError, TimeoutError, BusError) as exc:
        raise Unreachable(
            f"NATS at {settings.url} as {settings.user or '(no user)'} failed: {exc!r} -- is it up, are the user and "
            f"password right, is the user {OPERATOR_USER} (`temporality nats-authorization`) or one with full access?"
            f"{hint}"
        ) from exc


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``temporality dlq ...``: 0 done (or a dry run), 2 bad input or a letter not there (nothing changed),
    1 NATS failed (run it again)."""
    out = out or sys.stdout
    err = err or sys.stderr
    if not structlog.is_configured():  # the bus's own log lines: warnings and errors, on stderr, not stdout
        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        )
    # the audit lines, one JSON object each, on stderr; a logger of its own (no global structlog set-up)
    audit = structlog.wrap_logger(
        structlog.PrintLogger(err),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
    )
    try:
        return asyncio.run(_run(args, out, audit))
    except DlqError as exc:
        err.write(f"error: {exc}\n")
        return 2
    except Unreachable as exc:
        err.write(f"error: {exc}\n")
        return 1


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``temporality dlq`` alone (for tests and ``python -m``): parse ``argv`` (without ``dlq``) and run."""
    parser = argparse.ArgumentParser(prog="temporality")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["dlq", *(argv or [])]), out, err)
