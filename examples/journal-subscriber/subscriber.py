"""A journal subscriber for Temporality (DC-6): its own durable consumer on the events stream.

It uses nothing of Temporality's code: only what ``schemas/asyncapi.yaml`` and docs/journal.md publish --
every event is a CloudEvent 1.0 JSON body on the JetStream stream ``TEMPORALITY_EVENTS``, subject
``temporality.events.<type>`` -- and nats-py for the transport. It

1. connects (optionally as its own NATS user, e.g. the read-only subscriber ``sub-<name>``, with the inbox
   prefix ``_INBOX.sub-<name>`` that user may subscribe below);
2. creates its durable pull consumer ``sub-<name>`` on ``TEMPORALITY_EVENTS`` the first time (explicit ack,
   filtered to the event types asked for; ``--deliver all`` from the stream's first event, or ``new``), or
   binds to it again after a restart, which resumes after the last acknowledged event;
3. fetches in batches and handles each event -- prints one JSON line to stdout and, with ``--out``, appends
   it to a file, skipping an event id already there (at-least-once delivery: a redelivered event is handled
   once) -- and acks only after handling;
4. stops on SIGINT/SIGTERM (or after ``--max-events``), finishing the event in hand.

    python examples/journal-subscriber/subscriber.py --nats-url nats://127.0.0.1:4222 \\
        --type run.completed --type run.failed --out handled.jsonl

Every option can also come from the environment: ``TEMPORALITY_NATS_URL``, ``TEMPORALITY_SUBSCRIBER_NAME``,
``TEMPORALITY_SUBSCRIBER_DURABLE``, ``TEMPORALITY_SUBSCRIBER_USER``, ``TEMPORALITY_SUBSCRIBER_PASSWORD``,
``TEMPORALITY_SUBSCRIBER_TYPES`` (comma-separated), and ``TEMPORALITY_NATS_CREDS_FILE`` /
``TEMPORALITY_NATS_NKEY_SEED_FILE`` as the services read them (docs/operations.md, "A NATS without passwords"):
``--creds-file`` a credentials file of a NATS in operator/JWT mode (``nsc generate creds``), ``--nkey-seed-file``
a file with the user's nkey seed (``SU...``) for a server that lists the user by its public nkey; one way to
authenticate only (with ``--user`` too: exit 2), an empty variable counts as unset. A body that is not a CloudEvent is terminated (never
redelivered) and reported on stderr; a handler failure is nak'ed with a delay and retried up to
``--max-deliver`` times. Exit codes: 0 stopped, 2 bad arguments, 3 NATS refused or unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

log = logging.getLogger("journal-subscriber")

STREAM = "TEMPORALITY_EVENTS"
PREFIX = "temporality.events"
#: A subscriber's name: one subject token that is also a valid consumer name (the NATS user is sub-<name>).
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,62}$")
#: An event type or a NATS pattern of them (``run.completed``, ``agent.>``; ``human.*`` is one token below ``human``).
TYPE = re.compile(r"^([a-z0-9_]+|\*)(\.([a-z0-9_]+|\*))*(\.>)?$|^>$")


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nats-url", default=env("TEMPORALITY_NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument(
        "--name",
        default=env("TEMPORALITY_SUBSCRIBER_NAME", "example"),
        help="the subscriber's name: durable sub-<name>, inbox prefix _INBOX.sub-<name> (default: example)",
    )
    parser.add_argument(
        "--durable",
        default=env("TEMPORALITY_SUBSCRIBER_DURABLE"),
        help="the durable consumer's name (default: sub-<name>); as the read-only subscriber user, only a durable "
        "the deployment granted that user (temporality up grants sub-<name> alone)",
    )
    parser.add_argument("--user", default=env("TEMPORALITY_SUBSCRIBER_USER"), help="NATS user (e.g. sub-<name>)")
    parser.add_argument("--password", default=env("TEMPORALITY_SUBSCRIBER_PASSWORD"), help="its password")
    parser.add_argument(
        "--creds-file",
        type=Path,
        default=env("TEMPORALITY_NATS_CREDS_FILE") or None,
        help="a NATS credentials file (operator/JWT mode, as `nsc generate creds` writes it) instead of "
        "--user/--password (default: $TEMPORALITY_NATS_CREDS_FILE)",
    )
    parser.add_argument(
        "--nkey-seed-file",
        type=Path,
        default=env("TEMPORALITY_NATS_NKEY_SEED_FILE") or None,
        help="a file with the NATS user's nkey seed (SU...) instead of --user/--password "
        "(default: $TEMPORALITY_NATS_NKEY_SEED_FILE)",
    )
    parser.add_argument(
        "--type",
        action="append",
        dest="types",
        help="an event type to receive, or a family (human.>, agent.>: every type below it; * matches one token "
        "only, human.* misses human.directory.changed); repeat it; default: run.completed, run.failed, run.cancelled",
    )
    parser.add_argument(
        "--deliver",
        choices=("all", "new"),
        default="all",
        help="where a NEW durable starts: the stream's first event (all) or events from now on (new); an "
        "existing durable always resumes where it stopped",
    )
    parser.add_argument("--out", type=Path, help="append each handled event here (JSON lines), once per event id")
    parser.add_argument("--batch", type=int, default=64, help="events fetched at once (default 64)")
    parser.add_argument("--ack-wait-s", type=float, default=30.0, help="redelivered if not acked within (30 s)")
    parser.add_argument("--max-deliver", type=int, default=5, help="attempts per event before giving up (5)")
    parser.add_argument("--max-events", type=int, default=0, help="stop after handling this many (0: never)")
    args = parser.parse_args(argv)
    if args.types is None:
        listed = env("TEMPORALITY_SUBSCRIBER_TYPES", "")
        args.types = [t.strip() for t in listed.split(",") if t.strip()] or [
            "run.completed",
            "run.failed",
            "run.cancelled",
        ]
    if not NAME.match(args.name):
        parser.error(f"--name {args.name!r}: 1-63 of A-Z a-z 0-9 _ - (not starting with -)")
    args.durable = args.durable or f"sub-{args.name}"
    if not NAME.match(args.durable):
        parser.error(f"--durable {args.durable!r}: 1-63 of A-Z a-z 0-9 _ -")
    for event_type in args.types:
        if not TYPE.match(event_type):
            parser.error(f"--type {event_type!r}: an event type such as run.completed, or a pattern (human.*)")
    ways = [name for name, given in (("--user", args.user), ("--creds-file", args.creds_file),
            ("--nkey-seed-file", args.nkey_seed_file)) if given]  # fmt: skip
    if len(ways) > 1:
        parser.error(f"{' and '.join(ways)}: give one way to authenticate to NATS")
    for flag, path in (("--creds-file", args.creds_file), ("--nkey-seed-file", args.nkey_seed_file)):
        if path is not None and not os.access(path, os.R_OK):
            parser.error(f"{flag} {path}: not a readable file")
    if args.batch < 1 or args.max_deliver < 1 or args.ack_wait_s <= 0 or args.max_events < 0:
        parser.error("--batch and --max-deliver must be >= 1, --ack-wait-s > 0, --max-events >= 0")
    return args


class Handler:
    """The side effect: one JSON line per event (stdout, and ``out`` once per event id)."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self.seen: set[str] = set()
        if out is not None and out.exists():  # what an earlier run already handled (idempotency across restarts)
            for line in out.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    self.seen.add(json.loads(line)["id"])

    def __call__(self, event: dict[str, Any], seq: int) -> bool:
        """Handle ``event`` (stream sequence ``seq``); False when it was handled before (a redelivery)."""
        if event["id"] in self.seen:
            return False
        line = json.dumps(
            {
                "seq": seq,
                "id": event["id"],
                "type": event["type"],
                "time": event.get("time"),
                "run_id": event.get("runid"),
                "subject": event.get("subject"),
            },
            separators=(",", ":"),
        )
        if self.out is not None:
            with self.out.open("a", encoding="utf-8") as file:
                file.write(line + "\n")
                file.flush()
                os.fsync(file.fileno())
        self.seen.add(event["id"])
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        return True


def _cloudevent(body: bytes) -> dict[str, Any]:
    """The CloudEvent of a message body, or ValueError (a poison message)."""
    event = json.loads(body)
    if not isinstance(event, dict) or event.get("specversion") != "1.0":
        raise ValueError("not a CloudEvents 1.0 JSON object")
    for key in ("id", "type", "source"):
        if not isinstance(event.get(key), str) or not event[key]:
            raise ValueError(f"the CloudEvent has no {key}")
    return event


#: What the server says when it refuses the user (nats-py passes it to ``error_cb``, lowercased here).
REFUSED = ("authorization violation", "authentication", "user authentication expired")


async def _connect(args: argparse.Namespace, options: dict[str, Any], last: list[str]) -> nats.NATS | None:
    """Connected, or None after one clear error line. A server that refuses the credentials ends the attempt at
    once (retrying cannot help); an unreachable one is retried (``max_reconnect_attempts``) before giving up.
    Every error nats-py reports is one log line, not a traceback, and kept in ``last`` (the connection's life)."""
    refused = asyncio.Event()

    async def on_error(exc: Exception) -> None:
        text = str(exc).strip("' ") or type(exc).__name__
        last.append(text)
        if any(word in text.lower() for word in REFUSED):
            refused.set()
        else:
            log.warning("nats: %s", text)

    connecting = asyncio.ensure_future(nats.connect(**options, error_cb=on_error))
    denied = asyncio.ensure_future(refused.wait())
    await asyncio.wait((connecting, denied), return_when=asyncio.FIRST_COMPLETED)
    denied.cancel()
    where = args.nats_url.rpartition("@")[2]  # never the password of a nats://user:password@host URL
    if refused.is_set() and not connecting.done():
        connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await connecting
        log.error(
            "cannot connect to %s: the server refused the credentials (%s); give the subscriber's user and "
            "password (--user/--password, or nats://<user>:<password>@host:port: `temporality up` prints the "
            "URL of each subscriber it created, --nats-subscriber <name> creates one), or its --creds-file or "
            "--nkey-seed-file",
            where,
            last[-1],
        )
        return None
    try:
        return connecting.result()
    except (OSError, nats.errors.Error) as exc:
        log.error("cannot connect to %s: %s%s", where, exc, f" (last error: {last[-1]})" if last else "")
        return None


def _differences(have: ConsumerConfig, want: ConsumerConfig) -> list[str]:
    """What of ``want`` (the filter, ack wait, redelivery bound) an existing durable's ``have`` does not match."""
    found = []
    had = sorted(have.filter_subjects or ([have.filter_subject] if have.filter_subject else []))
    wanted = sorted(want.filter_subjects or ([want.filter_subject] if want.filter_subject else []))
    if had != wanted:
        found.append(f"filter {', '.join(had) or 'none'}, asked {', '.join(wanted)}")
    if have.ack_wait is not None and want.ack_wait is not None and abs(have.ack_wait - want.ack_wait) > 1e-3:
        found.append(f"ack wait {have.ack_wait:g} s, asked {want.ack_wait:g} s")
    if have.max_deliver != want.max_deliver:
        found.append(f"max deliver {have.max_deliver}, asked {want.max_deliver}")
    return found


async def run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    options: dict[str, Any] = {
        "servers": [args.nats_url],
        "name": f"journal-subscriber-{args.name}",
        "inbox_prefix": f"_INBOX.sub-{args.name}",  # the subscriber user may subscribe below this only
        "connect_timeout": 5,
        "max_reconnect_attempts": 10,
        "allow_reconnect": True,
    }
    if args.user:
        options |= {"user": args.user, "password": args.password or ""}
    elif args.creds_file is not None:  # nats-py reads it again at every reconnection: a rotated file is used
        options["user_credentials"] = str(args.creds_file)
    elif args.nkey_seed_file is not None:  # the client signs the server's nonce: no secret crosses the wire
        options["nkeys_seed"] = str(args.nkey_seed_file)
    errors: list[str] = []
    nc = await _connect(args, options, errors)
    if nc is None:
        return 3
    handler = Handler(args.out)
    handled = 0
    try:
        js = nc.jetstream()
        subjects = [f"{PREFIX}.{t}" for t in args.types]
        config = ConsumerConfig(
            durable_name=args.durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL if args.deliver == "all" else DeliverPolicy.NEW,
            ack_wait=args.ack_wait_s,
            max_deliver=args.max_deliver,
            max_ack_pending=max(args.batch * 4, 256),
            description=f"journal subscriber {args.name} (examples/journal-subscriber)",
        )
        if len(subjects) == 1:
            config.filter_subject = subjects[0]
        else:
            config.filter_subjects = subjects
        try:
            # Binds to the durable when it exists (a restart: it resumes after the last ack), creates it otherwise.
            sub = await js.pull_subscribe(subjects[0], durable=args.durable, stream=STREAM, config=config)
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            await asyncio.sleep(0.2)  # the server's permissions violation comes on its own, after the request's
            denied = [e for e in errors if "permissions violation" in e.lower()]
            why = f" ({denied[-1]}: this user may not use durable {args.durable})" if denied else ""
            log.error("cannot open the durable consumer %s on %s: %s%s", args.durable, STREAM, exc, why)
            return 3
        info = await sub.consumer_info()
        changed = _differences(info.config, config)
        if changed:
            # A durable made before with other settings (the server binds to it as it is): bring it to what was asked
            # (its delivery start and position stay, they cannot change), or say why it cannot be.
            log.warning("durable %s exists with other settings (%s): updating it", args.durable, "; ".join(changed))
            wanted = info.config.evolve(
                filter_subject=config.filter_subject,
                filter_subjects=config.filter_subjects,
                ack_wait=config.ack_wait,
                max_deliver=config.max_deliver,
                max_ack_pending=config.max_ack_pending,
            )
            try:
                await js.add_consumer(STREAM, wanted)
                # what the server holds now, read again: the banner below shows it, never what was there before
                info = await js.consumer_info(STREAM, args.durable)
            except (nats.errors.Error, nats.js.errors.Error) as exc:
                log.error(
                    "cannot update durable %s on %s (%s): run with its settings, or delete it (as a user allowed to: "
                    "nats consumer rm %s %s) and start again",
                    args.durable,
                    STREAM,
                    exc,
                    STREAM,
                    args.durable,
                )
                await sub.unsubscribe()
                return 3
            still = _differences(info.config, config)
            if still:  # another client changed it back in between: say so rather than print a filter it lacks
                log.warning("durable %s still differs from what was asked (%s)", args.durable, "; ".join(still))
        log.info(
            "subscribed: durable %s on %s, filter %s, %d pending, %d acknowledged before",
            args.durable,
            STREAM,
            ", ".join(info.config.filter_subjects or [info.config.filter_subject or ""]),
            info.num_pending,
            info.ack_floor.stream_seq if info.ack_floor else 0,
        )
        while not stop.is_set():
            try:
                messages = await sub.fetch(args.batch, timeout=1)
            except TimeoutError:  # nats.errors.TimeoutError, and the plain one nats-py's fetch raises at its deadline
                continue
            for index, msg in enumerate(messages):
                if stop.is_set():  # --max-events reached mid-batch: hand the rest back now, not after ack_wait
                    for rest in messages[index:]:
                        await rest.nak()
                    break
                seq = msg.metadata.sequence.stream
                try:
                    event = _cloudevent(msg.data)
                except ValueError as exc:
                    log.error("seq %d is not a CloudEvent (%s): terminated, not redelivered", seq, exc)
                    await msg.term()
                    continue
                try:
                    if not handler(event, seq):
                        log.info("seq %d (%s) was handled before: acked again", seq, event["id"])
                except Exception as exc:  # a failed side effect: try again later, bounded by max_deliver
                    log.warning("handling seq %d failed (%s): redelivered in 5 s", seq, exc)
                    await msg.nak(delay=5)
                    continue
                await msg.ack_sync()  # only after the side effect is done; the server confirms it
                handled += 1
                if args.max_events and handled >= args.max_events:
                    stop.set()
        await sub.unsubscribe()  # before drain: an idle pull subscription can hold drain up
    finally:
        await nc.drain()
    log.info("stopped after handling %d events", handled)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    return asyncio.run(run(_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
