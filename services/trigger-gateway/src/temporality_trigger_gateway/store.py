"""The trigger store (TRG-1): trigger definitions in the ``trigger-definitions`` KV bucket, watched live.

How the triggers file and the store relate::

    start   file validated (exit 2 if invalid) -> each file trigger created-if-absent in the store
            (an id already there, or deleted through the API, is left alone) -> watch the bucket
    later   the admin API creates, replaces, enables/disables and deletes; every replica's watch
            applies each change to what it serves, without a restart

So the file *seeds* the store and the store is the truth afterwards: editing a seeded trigger in the
file changes nothing once it is stored (change it through the API). Two replicas starting at once both
try to create each file trigger; KV create-if-absent lets exactly one win, and only the winner journals
``trigger.created``. A deleted trigger leaves a tombstone (``deleted: true``) under its id so the file
does not bring it back at the next start; creating it again through the API replaces the tombstone.

A record holds the trigger as written (``spec``), literal secrets included: they are write-only (the
admin API never returns them) and ``*_env`` references are preferred. Each replica validates a record
with its own environment (``*_env`` secrets) and the agent ids it knows; a record it cannot use is not
served (logged ``trigger.invalid``, shown by the admin API) instead of stopping the replica.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import structlog
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, model_validator

from temporality_bus import AlreadyExists, Bus, KvWatch, Store, Versioned, entry_value
from temporality_protocol.catalog import BUCKET_TRIGGERS, EVENTS_STREAM
from temporality_service.wording import message
from temporality_trigger_gateway.auth import SECRET_NOT_SET, NoAuth, literal_secret
from temporality_trigger_gateway.triggers import EventTrigger, TriggerConfig, WebhookTrigger

__all__ = ["TRIGGER", "Activation", "ChangeHook", "TriggerRecord", "TriggerRegistry", "TriggerStore", "validate_spec"]

log = structlog.get_logger(__name__)

#: Validates one trigger mapping (the discriminated union of the three types).
TRIGGER: TypeAdapter[TriggerConfig] = TypeAdapter(TriggerConfig)
#: Called after the registry applied a store change: (trigger id, the trigger now served or ``None``, revision).
ChangeHook = Callable[[str, TriggerConfig | None, int], Awaitable[None]]


#: The unknown record fields already logged (once each set: a newer gateway's record is read often).
_IGNORED_FIELDS: set[tuple[str, ...]] = set()


class TriggerRecord(BaseModel):
    """The value under a trigger id in ``trigger-definitions``.

    Unknown fields are ignored when a record is read (logged once per set of fields): a newer gateway may
    have written fields this one does not know, and during a rolling upgrade both read the same bucket.
    The trigger inside (``spec``) is validated as API input is, unknown keys refused: a trigger this
    replica cannot honour in full is not served (``trigger.invalid``) rather than served in part."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _note_unknown_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = tuple(sorted(str(k) for k in data if k not in cls.model_fields))
            if unknown and unknown not in _IGNORED_FIELDS:
                _IGNORED_FIELDS.add(unknown)
                log.warning("trigger.record_fields_ignored", fields=list(unknown), hint="written by a newer gateway")
        return data

    #: The trigger as written (file mapping or API body), literal secrets included: never returned.
    spec: dict[str, Any]
    origin: Literal["file", "api"]
    #: The API token's name, or ``file:<path>``.
    updated_by: str
    updated_at: datetime
    #: A tombstone: the id was deleted (the triggers file does not seed it again).
    deleted: bool = False
    #: An ``event`` trigger: the ``TEMPORALITY_EVENTS`` stream's last sequence when it was last enabled
    #: (created enabled, enabled, seeded); it reacts only to events stored after it (TRG-6).
    active_from_seq: int | None = None


@dataclass(frozen=True)
class Activation:
    """Since when an event trigger reacts: events after ``after_seq`` (or, for a record written without
    one, events the server stored after ``since``)."""

    after_seq: int | None
    since: datetime


def validate_spec(
    spec: Mapping[str, Any],
    *,
    environ: Mapping[str, str],
    agents: frozenset[str] | None,
    new: bool = False,
    stored: bool = False,
) -> TriggerConfig:
    """One trigger mapping validated as the file and the API validate it (``ValidationError`` otherwise).
    ``new``: a trigger being created (a reserved id is refused; a stored record keeps being served). ``stored``: a
    record read back from the bucket, written by a version whose checks it passed (a check added since, such as an
    event trigger's prompt fields without a mapping, does not stop it being served)."""
    return TRIGGER.validate_python(spec, context={"environ": environ, "agents": agents, "new": new, "stored": stored})


class TriggerStore:
    """The bucket's effects: seed, read, create, compare-and-set, tombstone."""

    def __init__(self, store: Store[TriggerRecord], kv: KeyValue, bus: Bus) -> None:
        self.store = store
        self.kv = kv
        self.bus = bus

    @classmethod
    async def open(cls, bus: Bus) -> TriggerStore:
        """The bucket, created if absent (idempotent; safe from every replica at once)."""
        kv = await bus.ensure_bucket(BUCKET_TRIGGERS)
        return cls(await bus.store(BUCKET_TRIGGERS, TriggerRecord), kv, bus)

    async def last_revision(self) -> int:
        """The bucket's latest revision (its stream's last sequence): every change stored so far."""
        info = await self.bus.js.stream_info(f"KV_{BUCKET_TRIGGERS.name}")
        return int(info.state.last_seq or 0)

    async def events_tail(self) -> int:
        """The ``TEMPORALITY_EVENTS`` stream's last sequence: an event trigger enabled now reacts after it."""
        info = await self.bus.js.stream_info(EVENTS_STREAM.name)
        return int(info.state.last_seq or 0)

    async def seed(self, specs: Iterable[Mapping[str, Any]], *, by: str) -> list[tuple[str, int]]:
        """Create each file trigger that has no record yet; the ``(id, revision)`` this call created."""
        created: list[tuple[str, int]] = []
        tail: int | None = None
        for spec in specs:
            trigger_id = str(spec["id"])
            active_from: int | None = None
            if spec.get("type") == "event" and spec.get("enabled", True) is True:
                tail = await self.events_tail() if tail is None else tail
                active_from = tail
            record = TriggerRecord(
                spec=dict(spec),
                origin="file",
                updated_by=by,
                updated_at=datetime.now(UTC),
                active_from_seq=active_from,
            )
            try:
                created.append((trigger_id, await self.store.create(trigger_id, record)))
            except AlreadyExists:
                log.debug("trigger.seed_skipped", trigger_id=trigger_id, reason="already in the store")
        return created

    async def get(self, trigger_id: str) -> Versioned[TriggerRecord] | None:
        """The live record (``None`` when absent or a tombstone)."""
        found = await self.store.get(trigger_id)
        if found is None or found.value.deleted:
            return None
        return found

    async def get_any(self, trigger_id: str) -> Versioned[TriggerRecord] | None:
        """The record, tombstones included."""
        return await self.store.get(trigger_id)

    async def all(self) -> list[tuple[str, Versioned[TriggerRecord]]]:
        """Every live record, by id."""
        found: list[tuple[str, Versioned[TriggerRecord]]] = []
        for key in sorted(await self.store.keys()):
            record = await self.get(key)
            if record is not None:
                found.append((key, record))
        return found


class TriggerRegistry:
    """What one replica serves: the store's triggers, validated and compiled, kept current by a KV watch.

    ``TriggerRegistry.static(triggers)`` serves a fixed list (tests, benchmarks) with no store."""

    def __init__(self, *, environ: Mapping[str, str], agents: frozenset[str] | None) -> None:
        self.environ = environ
        self.agents = agents
        self._triggers: dict[str, TriggerConfig] = {}
        #: id -> why this replica cannot serve the stored record.
        self.problems: dict[str, str] = {}
        #: id -> the ``type`` of the last record stored under it that was not a tombstone (served or not; kept
        #: after a delete): what a trigger that is not served (or no longer) was.
        self.kinds: dict[str, str] = {}
        #: ids of stored records not served because a secret they read from the environment is not set here.
        self._secret_missing: set[str] = set()
        #: id -> the last store revision applied (tests and the admin API wait on it).
        self.revisions: dict[str, int] = {}
        #: id -> since when an event trigger reacts (its record's activation).
        self.activations: dict[str, Activation] = {}
        self._changed = asyncio.Condition()
        self._watch: KvWatch | None = None
        #: Effects of a change (arming a schedule trigger's timer); a failing hook is logged, never fatal.
        self.on_change: ChangeHook | None = None

    @classmethod
    def static(cls, triggers: Iterable[TriggerConfig]) -> TriggerRegistry:
        registry = cls(environ={}, agents=None)
        for trigger in triggers:
            registry._serve(trigger)
        return registry

    # ------------------------------------------------------------------ reading
    def get(self, trigger_id: str) -> TriggerConfig | None:
        return self._triggers.get(trigger_id)

    def webhook(self, trigger_id: str) -> WebhookTrigger | None:
        trigger = self._triggers.get(trigger_id)
        return trigger if isinstance(trigger, WebhookTrigger) else None

    def all(self) -> list[TriggerConfig]:
        return [self._triggers[k] for k in sorted(self._triggers)]

    def unserved_webhook(self, trigger_id: str) -> str | None:
        """Why the stored ``webhook`` trigger ``trigger_id`` is not served by this replica, in words its sender may
        read -- never the problem itself, which can name an environment variable or a field; ``None``: no such
        trigger (served, absent, deleted, or of another type)."""
        if trigger_id not in self.problems or self.kinds.get(trigger_id) != "webhook":
            return None
        if trigger_id in self._secret_missing:
            return "its secret is not configured on the server"
        return "its definition is not valid on this server"

    @property
    def applied(self) -> int:
        """The highest store revision this replica applied (a KV revision is the bucket stream's sequence)."""
        return max(self.revisions.values(), default=0)

    async def wait_for_store(self, revision: int, timeout_s: float = 2.0) -> bool:
        """Wait until this replica applied every store change up to ``revision``; False on timeout."""
        async with self._changed:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._changed.wait_for(lambda: self.applied >= revision)
            except TimeoutError:
                return False
        return True

    async def wait_for_revision(self, trigger_id: str, revision: int, timeout_s: float = 5.0) -> bool:
        """Wait until this replica applied ``revision`` (or a later one) of ``trigger_id``; False on timeout."""
        async with self._changed:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._changed.wait_for(lambda: self.revisions.get(trigger_id, 0) >= revision)
            except TimeoutError:
                return False
        return True

    async def check(self) -> None:
        """The readiness check: the watch runs (``/readyz`` 503 while it is being restarted)."""
        if self._watch is None:
            raise RuntimeError("the trigger store is not watched yet")
        await self._watch.check()

    # ------------------------------------------------------------------ applying
    def apply(self, trigger_id: str, record: TriggerRecord | None, revision: int) -> None:
        """One store change: serve the record's trigger, or stop serving ``trigger_id``."""
        self.revisions[trigger_id] = max(self.revisions.get(trigger_id, 0), revision)
        self._secret_missing.discard(trigger_id)
        if record is not None and not record.deleted and isinstance(record.spec.get("type"), str):
            self.kinds[trigger_id] = record.spec["type"]
        if record is None or record.deleted:
            self.problems.pop(trigger_id, None)
            self.activations.pop(trigger_id, None)
            if self._triggers.pop(trigger_id, None) is not None:
                log.info("trigger.removed", trigger_id=trigger_id, revision=revision)
            return
        try:
            trigger = validate_spec(record.spec, environ=self.environ, agents=self.agents, stored=True)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            # each validator's own sentence, without pydantic's "Value error, " (as the admin API words it)
            problem = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {message(e)}" for e in errors[:5])
            self.problems[trigger_id] = problem[:1000]
            if any(e["type"] == "value_error" and SECRET_NOT_SET in e["msg"] for e in errors):
                self._secret_missing.add(trigger_id)  # an *_env variable not set here
            self._triggers.pop(trigger_id, None)
            log.error("trigger.invalid", trigger_id=trigger_id, revision=revision, problem=problem[:1000])
            return
        if trigger.id != trigger_id:
            self.problems[trigger_id] = f"the record's id {trigger.id!r} is not its key"
            self._triggers.pop(trigger_id, None)
            log.error("trigger.invalid", trigger_id=trigger_id, revision=revision, problem="id is not the key")
            return
        self.problems.pop(trigger_id, None)
        self.activations[trigger_id] = Activation(record.active_from_seq, record.updated_at)
        self._serve(trigger, revision=revision)

    def _serve(self, trigger: TriggerConfig, *, revision: int | None = None) -> None:
        self._triggers[trigger.id] = trigger
        if isinstance(trigger, WebhookTrigger):
            if isinstance(trigger.auth, NoAuth):
                log.warning("trigger.unauthenticated", trigger_id=trigger.id)
            elif literal_secret(trigger.auth):
                log.warning("trigger.literal_secret", trigger_id=trigger.id, hint="use the auth *_env key")
            log.info(
                "trigger.served",
                trigger_id=trigger.id,
                adapter=trigger.adapter,
                auth=trigger.auth.type,
                enabled=trigger.enabled,
                revision=revision,
            )
        else:
            if isinstance(trigger, EventTrigger):
                log.info(
                    "trigger.listening",
                    trigger_id=trigger.id,
                    event_types=list(trigger.event_types),
                    enabled=trigger.enabled,
                    revision=revision,
                )
            else:
                log.info("trigger.scheduled", trigger_id=trigger.id, enabled=trigger.enabled, revision=revision)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------ watching
    def watching(self, store: TriggerStore) -> contextlib.AbstractAsyncContextManager[None]:
        """Load every stored trigger, then keep applying changes until the context exits.

        Returns once the initial snapshot is applied (so a replica is ready only when it serves the
        store's triggers). A watch that fails later (the bus went away) is started again, re-reading the
        whole bucket; meanwhile ``check`` fails (``/readyz`` 503) and the last known triggers are served
        (:class:`temporality_bus.KvWatch`)."""
        self._watch = KvWatch(
            store.bus,
            store.kv,
            "trigger store",
            apply=self._apply_entry,
            forget=self._forget,
            loaded=self._loaded,
            changed=self._notify,
        )
        return self._watch.watching()

    async def _forget(self, seen: set[str]) -> None:
        """After a snapshot: stop serving ids the store no longer holds."""
        for gone in set(self._triggers) - seen:
            self.apply(gone, None, self.revisions.get(gone, 0))
            await self._hook(gone)

    async def _loaded(self) -> None:
        await self._notify()
        log.info("trigger.store_loaded", triggers=len(self._triggers), invalid=len(self.problems))

    async def _apply_entry(self, entry: KeyValue.Entry) -> None:
        revision = entry.revision or 0
        value = entry_value(entry)
        if value is None:
            self.apply(entry.key, None, revision)
        else:
            try:
                record = TriggerRecord.model_validate_json(value)
            except ValidationError as exc:
                # handled (not served, its problem noted): counted as applied, or a replica would wait for
                # the store to catch up with it forever (wait_for_store, event triggers)
                self.revisions[entry.key] = max(self.revisions.get(entry.key, 0), revision)
                self.problems[entry.key] = f"unreadable record: {exc.error_count()} problem(s)"
                self._triggers.pop(entry.key, None)
                log.error("trigger.unreadable", trigger_id=entry.key, revision=revision)
            else:
                self.apply(entry.key, record, revision)
        await self._hook(entry.key)

    async def _hook(self, trigger_id: str) -> None:
        if self.on_change is None:
            return
        try:
            await self.on_change(trigger_id, self._triggers.get(trigger_id), self.revisions.get(trigger_id, 0))
        except Exception as exc:  # the next change, tick or start repeats the effect (each is idempotent)
            log.warning("trigger.change_effect_failed", trigger_id=trigger_id, error=repr(exc))
