"""Typed JetStream KV with compare-and-set: the long-lived state of every service.

Every write validates the value with the bucket's model first (:func:`~temporality_bus.models.revalidated`),
so a record that a reader could not load is never stored (a caller whose values are validated as they are
built, with :func:`~temporality_bus.models.evolve`, says so: ``validated=True``). :meth:`Store.modify` is *the*
compare-and-set retry loop: read, compute the next value, write it only if nobody wrote in between,
else read again.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, ValidationError

from temporality_bus.errors import AlreadyExists, BusError, Conflict, Contended, NotFound, TransientError
from temporality_bus.listing import live_keys
from temporality_bus.models import revalidated
from temporality_bus.pipeline import Pipeline, kv_write
from temporality_protocol.jetstream import DEFAULT_API_PREFIX

__all__ = ["DEFAULT_ATTEMPTS", "Modified", "Recent", "Store", "Versioned"]

log = structlog.get_logger(__name__)

M = TypeVar("M", bound=BaseModel)
V = TypeVar("V")

#: Compare-and-set attempts of :meth:`Store.modify` before it gives up with :class:`Contended`.
DEFAULT_ATTEMPTS = 8
#: After its n-th lost race :meth:`Store.modify` waits a random 0..min(n x this, cap) seconds before reading
#: again ("full jitter"): writers that collided do not collide again in lockstep on a hot key.
_RACE_BACKOFF_S = 0.002
_RACE_BACKOFF_CAP_S = 0.05


async def _after_lost_race(attempt: int) -> None:
    await asyncio.sleep(random.uniform(0, min(_RACE_BACKOFF_S * (1 << min(attempt, 8)), _RACE_BACKOFF_CAP_S)))


#: How long :meth:`Store.get` waits for JetStream's answer (the KV client's JetStream timeout).
_GET_S = 10.0
#: The header of a KV delete or purge marker (``KV-Operation: DEL`` / ``PURGE``), in a message's header block.
_DELETED = re.compile(rb"(?m)^KV-Operation:\s*(DEL|PURGE)\s*$")


class _ApiError(BaseModel):
    code: int
    description: str = ""


class _StoredMessage(BaseModel):
    """The stored message of a ``STREAM.MSG.GET`` answer; ``data`` and ``hdrs`` come base64-encoded, decoded by
    pydantic-core itself (``val_json_bytes``): ``Base64Bytes`` decodes in Python's ``base64`` module, which
    took ~8x as long for a checkpoint-sized value (a few KB: ~0.1 ms per read) as the rest of the read's parsing."""

    model_config = ConfigDict(val_json_bytes="base64")

    subject: str
    seq: int
    data: bytes | None = None
    hdrs: bytes | None = None


class _StoredSeq(BaseModel):
    """A ``STREAM.MSG.GET`` answer's message without its value (``data`` skipped, not decoded): which it is."""

    subject: str
    seq: int


class _SeqGet(BaseModel):
    """A ``STREAM.MSG.GET`` answer read for its message's sequence only (:meth:`Store.current`)."""

    message: _StoredSeq | None = None


class _MsgGet(BaseModel):
    """JetStream's answer to ``STREAM.MSG.GET``: the message, or the error."""

    message: _StoredMessage | None = None
    error: _ApiError | None = None


def _direct_found(reply: Msg, bucket: str, subject: str) -> int | None:
    """The sequence of the message a direct get of ``subject``'s last message answered with; ``None`` when there is
    none (``404``) or it is a delete or purge marker. :class:`TransientError` for any other status (``408``, ``503``:
    the server could not answer now)."""
    headers = reply.headers or {}
    status = headers.get("Status")
    if status == "404":
        return None
    key = subject.removeprefix(f"$KV.{bucket}.")
    if status is not None:
        description = headers.get("Description", "")
        raise TransientError(f"reading {bucket}/{key} failed: {description} ({status})")
    if headers.get("Nats-Subject") != subject or headers.get("KV-Operation") in ("DEL", "PURGE"):
        return None
    try:
        return int(headers["Nats-Sequence"])
    except (KeyError, ValueError):
        raise TransientError(f"reading {bucket}/{key} failed: a direct get answered without its sequence") from None


#: A key the KV client accepts (dot-separated tokens of these characters): written through the pipeline.
_KEY = re.compile(r"[-/_=a-zA-Z0-9]+(\.[-/_=a-zA-Z0-9]+)*")


@dataclass(frozen=True)
class Versioned(Generic[M]):
    value: M
    revision: int


@dataclass(frozen=True)
class Modified(Versioned[M]):
    """What :meth:`Store.modify` left in the store: the value, its revision, and whether this call wrote it.

    ``revision`` 0 means the key still does not exist (``create`` was given, and ``fn`` changed
    nothing on the created value, so nothing was written; ``value`` is that created value).
    """

    changed: bool = True


class Store(Generic[M]):
    """A KV bucket holding one pydantic model per key."""

    def __init__(
        self,
        kv: KeyValue,
        bucket: str,
        model: type[M],
        *,
        pipeline: Pipeline | None = None,
        nc: NATS | None = None,
        api_prefix: str = DEFAULT_API_PREFIX,
        direct: bool = False,
    ) -> None:
        self._kv = kv
        self.bucket = bucket
        self._model = model
        #: The connection's pipelined writes (:meth:`Bus.store` passes the Bus's): a compare-and-set goes out as
        #: one frame with one acknowledgement wait, not as a request with its own timeout scope (a hot path's
        #: CPU). ``None``: through the KV client.
        self._pipeline = pipeline
        #: The connection (:meth:`Bus.store` passes it): :meth:`get` asks JetStream for the key's last message
        #: itself and reads the answer in one pydantic-core pass, where the KV client decodes it with ``json``,
        #: a dataclass and the ``email`` package's header parser (the hot path's CPU). ``None``: the KV client.
        self._nc = nc
        #: The JetStream API :meth:`get` asks (``$JS.<domain>.API`` in a JetStream domain: ``NatsSettings``).
        self._api_prefix = api_prefix
        #: Reads are direct gets (``DIRECT.GET``, answered by the stream itself, the value as the message's
        #: payload) rather than ``STREAM.MSG.GET``: only for a bucket of one replica (:func:`Bus.store` decides;
        #: a follower's direct answer could miss a write just acknowledged).
        self._direct = direct

    async def get(self, key: str) -> Versioned[M] | None:
        if self._nc is not None and _KEY.fullmatch(key):
            return await self._get_last(key)
        try:
            entry = await self._kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        if entry.value is None:
            return None
        return Versioned(self._model.model_validate_json(entry.value), entry.revision or 0)

    async def _get_last(self, key: str) -> Versioned[M] | None:
        """:meth:`get` as the KV client does it (``STREAM.MSG.GET`` of the key's last message; none, a deleted
        or a purged one: ``None``), the reply read by :class:`_MsgGet`."""
        subject = f"$KV.{self.bucket}.{key}"
        if self._direct:
            return self._read_direct(await self._ask_direct(subject, key), subject)
        return self._read(await self._ask(subject, key), subject)

    def _read_direct(self, reply: Msg, subject: str) -> Versioned[M] | None:
        """A direct get's answer: the key's last message itself (its subject and sequence in ``Nats-Subject`` and
        ``Nats-Sequence``, its own headers beside them), or a status: ``404``, nothing stored under it."""
        found = _direct_found(reply, self.bucket, subject)
        if found is None or not reply.data:
            return None
        return Versioned(self._model.model_validate_json(reply.data), found)

    def _read(self, reply: bytes, subject: str) -> Versioned[M] | None:
        got = _MsgGet.model_validate_json(reply)
        if got.error is not None:
            if got.error.code == 404:  # no such message (or bucket): as the KV client, nothing there
                return None
            key = subject.removeprefix(f"$KV.{self.bucket}.")
            raise TransientError(f"reading {self.bucket}/{key} failed: {got.error.description} ({got.error.code})")
        message = got.message
        if message is None or message.subject != subject or not message.data:
            return None
        if message.hdrs and _DELETED.search(message.hdrs):  # a delete or purge marker
            return None
        return Versioned(self._model.model_validate_json(message.data), message.seq)

    async def current(self, key: str, known: Versioned[M]) -> Versioned[M] | None:
        """What :meth:`get` returns now, given ``known``: what the caller last read or wrote of ``key`` (the value
        stored at that revision, as the bucket's model validated it). The same one read of the key's last
        message as :meth:`get`; when that is still the message at ``known.revision``, ``known`` itself comes
        back and the stored value is neither base64-decoded nor validated again (a hot path's CPU: a run
        record's re-read after each provider call); anything else is read as :meth:`get` reads it."""
        if self._nc is None or not _KEY.fullmatch(key) or known.revision <= 0:
            return await self.get(key)
        subject = f"$KV.{self.bucket}.{key}"
        if self._direct:
            answer = await self._ask_direct(subject, key)
            if _direct_found(answer, self.bucket, subject) == known.revision and answer.data:
                return known
            return self._read_direct(answer, subject)
        reply = await self._ask(subject, key)
        last = _SeqGet.model_validate_json(reply)
        if last.message is not None and last.message.seq == known.revision and last.message.subject == subject:
            return known  # the very message ``known`` was read from or written as: a value, unchanged since
        return self._read(reply, subject)

    async def _ask(self, subject: str, key: str) -> bytes:
        """JetStream's answer to ``STREAM.MSG.GET`` of ``subject``'s last message (:meth:`_read_request`)."""
        body = b'{"last_by_subj":"%s"}' % subject.encode()
        return (await self._read_request(f"{self._api_prefix}.STREAM.MSG.GET.KV_{self.bucket}", body, key)).data

    async def _ask_direct(self, subject: str, key: str) -> Msg:
        """The direct get of ``subject``'s last message (``DIRECT.GET.<stream>.<subject>``, no body)."""
        return await self._read_request(f"{self._api_prefix}.DIRECT.GET.KV_{self.bucket}.{subject}", b"", key)

    async def _read_request(self, api: str, body: bytes, key: str) -> Msg:
        """The reply to a read of ``key`` sent to ``api``, through the pipeline's inbox (no ``nc.request`` per read:
        :meth:`Pipeline.request`); :class:`TransientError` naming the key when it cannot be had."""
        assert self._nc is not None
        try:
            if self._pipeline is not None:
                return await self._pipeline.request(api, body, timeout_s=_GET_S)
            return await self._nc.request(api, body, timeout=_GET_S)
        except TransientError as exc:
            raise TransientError(f"reading {self.bucket}/{key} failed: {exc}") from exc
        except (nats.errors.Error, OSError) as exc:
            raise TransientError(f"reading {self.bucket}/{key} failed: {exc!r}") from exc

    async def create(self, key: str, value: M, *, validated: bool = False) -> int:
        """Create-if-absent; :class:`AlreadyExists` when the key is there. ``validated``: see :meth:`modify`."""
        payload = self._encode(value, validated)
        try:
            return await self._kv.create(key, payload)
        except KeyWrongLastSequenceError as exc:
            raise AlreadyExists(self.bucket, key) from exc

    async def update(self, key: str, value: M, revision: int, *, validated: bool = False) -> int:
        """Write only if the key is still at ``revision``; :class:`Conflict` otherwise. ``validated``: see
        :meth:`modify`."""
        return await self._update(key, self._encode(value, validated), revision)

    async def _update(self, key: str, payload: bytes, revision: int) -> int:
        """Write ``payload`` only if ``key`` is at ``revision``: the new revision; :class:`Conflict` otherwise."""
        if self._pipeline is None or not _KEY.fullmatch(key):  # (the KV client refuses a key that is no subject)
            try:
                return await self._kv.update(key, payload, last=revision)
            except KeyWrongLastSequenceError as exc:
                raise Conflict(self.bucket, key, revision) from exc
        (outcome,) = await self._pipeline.send([kv_write(self.bucket, key, payload, revision=revision)])
        if isinstance(outcome, BusError):
            raise outcome
        return outcome.seq

    async def put(self, key: str, value: M) -> int:
        return await self._kv.put(key, self._encode(value))

    async def purge(self, key: str) -> None:
        """Remove ``key`` and every revision of it (absent already: nothing changes). What stays is the
        server's purge marker (no value, a few bytes); :meth:`get` then finds nothing, :meth:`create` may
        create the key again, and an :meth:`update` or :meth:`modify` based on a revision read before the
        purge loses its compare-and-set."""
        await self._kv.purge(key)

    async def keys(self, match: str = ">") -> list[str]:
        """The keys holding a value (matching the subject filter ``match``), complete as of the call."""
        return await live_keys(self._kv, match)

    async def modify(
        self,
        key: str,
        fn: Callable[[M], M | None],
        *,
        create: Callable[[], M] | None = None,
        attempts: int = DEFAULT_ATTEMPTS,
        known: Versioned[M] | None = None,
        validated: bool = False,
    ) -> Modified[M]:
        """Compare-and-set ``key`` to ``fn(current)``, re-reading and calling ``fn`` again on every lost race.

        ``fn`` gets the stored value and returns the next one; returning ``None`` or the very object
        it got means "no change": nothing is written and the stored value comes back with
        ``changed=False``. ``fn`` may raise to abort (the exception propagates, nothing is written);
        it must be pure apart from that, since it runs once per attempt.

        When the key is absent, ``fn`` gets ``create()`` instead and a changed result is written
        create-if-absent (losing that race to another creator counts as a lost race too); without
        ``create`` an absent key is :class:`NotFound`.

        The result is validated with the bucket's model before it is written (pydantic's
        ``ValidationError`` for a value the model refuses, ``TypeError`` for another model), and the
        :class:`Modified` returned holds exactly what was stored. After ``attempts`` lost races:
        :class:`Contended` (a :class:`TransientError`). Between races it waits a short random while (a few ms,
        growing): colliding writers spread out. Each lost race means another writer's write succeeded, so
        ``attempts`` at least the number of concurrent writers of the key can never run out.

        ``known``: what the caller last read or wrote of the key (value and revision). The first attempt
        starts from it instead of reading, which saves a round trip whenever it is still current. Only a
        *write* is ever based on it -- the compare-and-set proves it current; a stale one loses the race and
        the next attempt reads. Any other outcome (``fn`` changes nothing, or raises) is decided again on a
        fresh read, so ``known`` never changes what ``modify`` returns or raises, only how many reads it takes.

        ``validated``: ``fn`` only ever returns values the bucket's model has just validated -- built with
        its constructor or :func:`~temporality_bus.models.evolve`, never ``model_copy`` -- so they are written
        without validating them again (a dump and a validation less per write, on a hot path). Only a value
        of another model is still refused (``TypeError``).
        """
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        if known is not None:
            written = await self._modify_known(key, fn, known, validated)
            if written is not None:
                return written
        for attempt in range(1, attempts + 1):
            current = await self.get(key)
            if current is None:
                if create is None:
                    raise NotFound(self.bucket, key)
                base = create()
                new = fn(base)
                if new is None or new is base:
                    return Modified(base, 0, changed=False)
                value = self._checked(new, validated)
                try:
                    revision = await self._kv.create(key, value.model_dump_json().encode())
                except KeyWrongLastSequenceError:
                    log.debug("store.cas_retry", bucket=self.bucket, key=key, attempt=attempt, race="create")
                    if attempt < attempts:
                        await _after_lost_race(attempt)
                    continue
                return Modified(value, revision)
            new = fn(current.value)
            if new is None or new is current.value:
                return Modified(current.value, current.revision, changed=False)
            value = self._checked(new, validated)
            try:
                revision = await self._update(key, value.model_dump_json().encode(), current.revision)
            except Conflict:
                log.debug("store.cas_retry", bucket=self.bucket, key=key, attempt=attempt, race="update")
                if attempt < attempts:
                    await _after_lost_race(attempt)
                continue
            return Modified(value, revision)
        raise Contended(self.bucket, key, attempts)

    async def _modify_known(
        self, key: str, fn: Callable[[M], M | None], known: Versioned[M], validated: bool
    ) -> Modified[M] | None:
        """:meth:`modify`'s write from ``known`` without a read; ``None``: decide on a fresh read instead."""
        try:
            new = fn(known.value)
        except Exception:  # perhaps only because ``known`` is stale: raise (or not) on what is stored
            return None
        if new is None or new is known.value:  # "no change" must be true of what is stored, not of ``known``
            return None
        try:
            value = self._checked(new, validated)
        except (ValidationError, TypeError):
            return None
        try:
            revision = await self._update(key, value.model_dump_json().encode(), known.revision)
        except Conflict:
            log.debug("store.cas_retry", bucket=self.bucket, key=key, attempt=0, race="known")
            return None
        return Modified(value, revision)

    def _checked(self, value: M, validated: bool) -> M:
        """``value`` as the bucket's model validates it (as it is, when the caller ``validated`` it already)."""
        if not validated:
            return revalidated(self._model, value)
        if not isinstance(value, self._model):
            raise TypeError(f"expected a {self._model.__name__}, got a {type(value).__name__}")
        return value

    def _encode(self, value: M, validated: bool = False) -> bytes:
        return self._checked(value, validated).model_dump_json().encode()


class Recent(Generic[V]):
    """The values last put or read, by key: the ``size`` most recently used (the one used longest ago goes first).

    What a service remembers of the keys it last read or wrote -- a :class:`Versioned` value to start a
    :meth:`Store.modify` from (``known=``), or a value that never changes once written -- so the next write or
    lookup of the same key saves its read. Only ever a hint for a compare-and-set, or a copy of a value that is
    never changed, deleted or purged once written: what it holds never decides anything a read of the store
    would decide differently.
    """

    def __init__(self, size: int = 1024) -> None:
        if size < 1:
            raise ValueError(f"size must be positive, not {size}")
        self._size = size
        self._values: OrderedDict[str, V] = OrderedDict()

    def get(self, key: str) -> V | None:
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    def put(self, key: str, value: V) -> None:
        self._values.pop(key, None)
        self._values[key] = value
        if len(self._values) > self._size:
            self._values.popitem(last=False)

    def pop(self, key: str) -> V | None:
        return self._values.pop(key, None)

    def __len__(self) -> int:
        return len(self._values)
