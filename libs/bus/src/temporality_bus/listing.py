"""The live keys (or entries) of a KV bucket matching a subject filter, complete as of the call.

nats-py's ``kv.keys()`` and a watch read until the watch's "caught up" marker (``None``) are not: nats-py
puts the marker first when it asks the consumer how many messages are pending (0, the server has sent them
all) before it has read those messages off the socket; the entries then arrive *after* the marker and a
listing read until it comes back empty (seen in CI: an inbox listing with no request in it). Here the
listing ends at the entry JetStream sent with nothing pending after it (each message says how many follow),
and a marker with no entry before it counts as "empty" only when the stream holds no message under the
filter. Deletes and purges are delivered too (they are the last message of their key) and left out here, so
they count towards "nothing pending" like every other message.
"""

from __future__ import annotations

import json

import nats.errors
import structlog
from nats.js import JetStreamContext
from nats.js.errors import APIError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

__all__ = ["LIST_TIMEOUT_S", "live_entries", "live_keys", "stored_keys", "stream_subjects"]

log = structlog.get_logger(__name__)

#: How long a listing waits for the next entry before it fails (nats-py's ``TimeoutError``).
LIST_TIMEOUT_S = 10.0


async def live_entries(
    kv: KeyValue,
    keys: str = ">",
    *,
    meta_only: bool = False,
    timeout_s: float = LIST_TIMEOUT_S,
    usually_empty: bool = False,
) -> list[KeyValue.Entry]:
    """The last entry of every key matching ``keys`` (a subject filter below the bucket: ``open.alice.*``)
    that is not deleted, in stream order. ``meta_only``: without the values (their headers only).

    ``usually_empty``: for a listing that almost always finds nothing (a per-run listing on every run's hot
    path): one ``STREAM.INFO`` with the filter first, and no watcher -- a consumer created, read and deleted on
    the server, three requests -- when no message (value or delete) is stored under ``keys``. Both read the
    stream at one moment, so the answer is the same; a listing that finds something costs one request more."""
    if usually_empty and not await _any_message(kv, keys):
        return []
    watcher = await kv.watch(keys, meta_only=meta_only)
    found: list[KeyValue.Entry] = []
    marked = False
    try:
        while True:
            try:
                entry = await watcher.updates(timeout=timeout_s)  # type: ignore[no-untyped-call]
            except nats.errors.TimeoutError:
                if not marked:
                    raise
                # after the marker, only a message nats-py skips (a marker reason it does not know) ends so
                log.warning("kv.listing_short", bucket=kv._name, keys=keys, found=len(found))
                break
            if entry is None:  # nats-py's marker: proof of the end only when nothing could still come
                marked = True
                # found: nats-py skipped the last message (it sends the marker after one with nothing pending)
                if found or not await _any_message(kv, keys):
                    break
                continue
            if entry.operation not in (KV_DEL, KV_PURGE):
                found.append(entry)
            if entry.delta == 0:  # nothing was pending after this one when JetStream sent it
                break
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    return found


async def live_keys(
    kv: KeyValue, keys: str = ">", *, timeout_s: float = LIST_TIMEOUT_S, usually_empty: bool = False
) -> list[str]:
    """The keys matching ``keys`` that hold a value (see :func:`live_entries`), in stream order."""
    entries = await live_entries(kv, keys, meta_only=True, timeout_s=timeout_s, usually_empty=usually_empty)
    return [str(entry.key) for entry in entries]


async def stream_subjects(
    js: JetStreamContext, stream: str, subjects_filter: str, *, timeout_s: float = LIST_TIMEOUT_S
) -> dict[str, int]:
    """Every subject of ``stream`` matching ``subjects_filter`` that holds a message, with its count: ``STREAM.INFO``
    with a subject filter, page after page. The server lists at most 100,000 subjects per answer (``offset`` and
    ``total`` say where a page stands) and nats-py's ``stream_info`` asks for the first page only: a longer list
    was cut short without a word. Raises what nats-py raises for the API's errors (``NotFoundError``...)."""
    subjects: dict[str, int] = {}
    while True:
        request = {"subjects_filter": subjects_filter, "offset": len(subjects)}
        reply = await js._nc.request(
            f"{js._prefix}.STREAM.INFO.{stream}", json.dumps(request).encode(), timeout=timeout_s
        )
        answer = json.loads(reply.data)
        if "error" in answer:
            raise APIError.from_error(answer["error"])  # raises the error's own class (NotFoundError...)
        page: dict[str, int] = (answer.get("state") or {}).get("subjects") or {}
        subjects.update(page)
        if not page or len(subjects) >= int(answer.get("total", 0)):
            return subjects


async def stored_keys(kv: KeyValue, keys: str) -> list[str]:
    """The keys matching ``keys`` (a key filter: ``run.r1.*``) that the bucket's stream holds a message on, a
    value or a delete, sorted: ``STREAM.INFO`` with a subject filter (:func:`stream_subjects`: one request per
    100,000 keys), no consumer made, nothing read. A key whose last message is a delete or a purge is among
    them: read it to know whether it holds a value."""
    subjects = await stream_subjects(kv._js, kv._stream, f"{kv._pre}{keys}")
    return sorted(subject.removeprefix(kv._pre) for subject in subjects)


async def _any_message(kv: KeyValue, keys: str) -> bool:
    """Whether the bucket's stream holds any message (a value or a delete) under ``keys``."""
    return bool(await stored_keys(kv, keys))
