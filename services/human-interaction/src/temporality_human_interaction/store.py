"""The directory store (HUM-2): profiles and groups in the ``human-directory`` KV bucket, watched live.

==================  ==========================================================================
key                 value (:class:`DirectoryEntry`)
==================  ==========================================================================
``user.<id>``       ``{"user": <UserProfile, token hashed>, "origin", "updated_by", ...}``
``group.<id>``      ``{"group": {"display_name", "members": [<user id>, ...]}, "origin", ...}``
==================  ==========================================================================

How the users file and the store relate (the same rule as the trigger-gateway's triggers file)::

    start   file validated (exit 2 if invalid) -> each file user, then each file group, created-if-absent
            in the store (an id already there, or deleted through the API, is left alone) -> watch
    later   the directory API creates, replaces and deletes; every replica's watch applies each change
            to its :class:`~.directory.Directory` without a restart

So the file *seeds* the store and the API owns an entry once it is stored: editing a seeded user in the
file changes nothing at the next start (change it through the API), and an API edit survives every
restart. Two replicas starting at once both try to create each file entry; create-if-absent lets one
win, and only the winner journals ``human.directory.changed``. A deletion leaves a tombstone
(``deleted: true``) so the file does not bring the entry back; creating it again replaces the tombstone.

A literal inbox token is never stored: :meth:`~.directory.UserProfile.hashed` replaces it by its
SHA-256 before any write (:class:`DirectoryEntry` refuses a record holding one).
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Literal

import structlog
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from temporality_bus import AlreadyExists, Bus, KvWatch, Store, Versioned, entry_value
from temporality_human_interaction.directory import Directory, GroupProfile, UserProfile
from temporality_protocol.catalog import BUCKET_HUMAN_DIRECTORY

__all__ = ["DirectoryEntry", "DirectoryStore", "DirectoryWatch", "Kind", "entry_key", "split_key"]

log = structlog.get_logger(__name__)

Kind = Literal["user", "group"]


def entry_key(kind: Kind, entry_id: str) -> str:
    return f"{kind}.{entry_id}"


def split_key(key: str) -> tuple[Kind, str] | None:
    """``user.alice`` -> ``("user", "alice")``; a key of another shape -> None."""
    kind, _, entry_id = key.partition(".")
    if kind == "user" and entry_id:
        return "user", entry_id
    if kind == "group" and entry_id:
        return "group", entry_id
    return None


class DirectoryEntry(BaseModel):
    """The value under ``user.<id>`` / ``group.<id>`` in ``human-directory``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    user: UserProfile | None = None
    group: GroupProfile | None = None
    origin: Literal["file", "api"]
    #: The API token's name, or ``file:<path>``.
    updated_by: str
    updated_at: datetime
    #: A tombstone: the id was deleted (the users file does not seed it again).
    deleted: bool = False

    @model_validator(mode="after")
    def _shape(self) -> DirectoryEntry:
        if self.user is not None and self.group is not None:
            raise ValueError("an entry is a user or a group, not both")
        if not self.deleted and self.user is None and self.group is None:
            raise ValueError("a live entry holds a user or a group")
        if self.user is not None and self.user.inbox_token is not None:
            raise ValueError("a literal inbox token is never stored (store its SHA-256)")
        return self


def _now() -> datetime:
    return datetime.now(UTC)


class DirectoryStore:
    """The bucket's effects: seed, read, create, compare-and-set, tombstone."""

    def __init__(self, store: Store[DirectoryEntry], kv: KeyValue, bus: Bus) -> None:
        self.store = store
        self.kv = kv
        self.bus = bus

    @classmethod
    async def open(cls, bus: Bus) -> DirectoryStore:
        """The bucket, created if absent (idempotent; safe from every replica at once)."""
        kv = await bus.ensure_bucket(BUCKET_HUMAN_DIRECTORY)
        return cls(await bus.store(BUCKET_HUMAN_DIRECTORY, DirectoryEntry), kv, bus)

    async def seed(
        self, users: dict[str, UserProfile], groups: dict[str, GroupProfile], *, by: str
    ) -> list[tuple[Kind, str, DirectoryEntry, int]]:
        """Create each file user, then each group, that has no record yet; what this call created."""
        created: list[tuple[Kind, str, DirectoryEntry, int]] = []
        entries: list[tuple[Kind, str, DirectoryEntry]] = [
            ("user", uid, DirectoryEntry(user=p.hashed(), origin="file", updated_by=by, updated_at=_now()))
            for uid, p in users.items()
        ]
        entries += [
            ("group", gid, DirectoryEntry(group=g, origin="file", updated_by=by, updated_at=_now()))
            for gid, g in groups.items()
        ]
        for kind, entry_id, entry in entries:
            try:
                revision = await self.store.create(entry_key(kind, entry_id), entry)
            except AlreadyExists:
                log.debug("directory.seed_skipped", kind=kind, id=entry_id, reason="already in the store")
                continue
            created.append((kind, entry_id, entry, revision))
        return created

    async def get(self, kind: Kind, entry_id: str) -> Versioned[DirectoryEntry] | None:
        """The live entry (``None`` when absent, a tombstone, or unreadable by this version)."""
        found = await self.get_any(kind, entry_id)
        if found is None or found.value.deleted:
            return None
        return found

    async def get_any(self, kind: Kind, entry_id: str) -> Versioned[DirectoryEntry] | None:
        """The entry, tombstones included (``None`` when absent or unreadable by this version)."""
        key = entry_key(kind, entry_id)
        try:
            return await self.store.get(key)
        except ValidationError as exc:  # written by a newer version (PRO-3): not this replica's to edit
            log.error("directory.unreadable", key=key, problems=exc.error_count())
            return None

    async def all(self, kind: Kind) -> list[tuple[str, Versioned[DirectoryEntry]]]:
        """Every live entry of ``kind``, by id."""
        found: list[tuple[str, Versioned[DirectoryEntry]]] = []
        for key in sorted(await self.store.keys()):
            parsed = split_key(key)
            if parsed is None or parsed[0] != kind:
                continue
            record = await self.get(kind, parsed[1])
            if record is not None:
                found.append((parsed[1], record))
        return found


class DirectoryWatch:
    """Keeps one replica's :class:`~.directory.Directory` equal to the store, through a KV watch.

    A :class:`temporality_bus.KvWatch`, like the trigger-gateway's registry: an initial snapshot (the replica is ready
    only once it serves the store), then every change applied as it comes; a watch that fails (the bus
    went away, the connection was re-established) is started again from a full snapshot, and meanwhile
    :meth:`check` fails (``/readyz`` 503) while the last known directory is served.
    """

    def __init__(self, directory: Directory, store: DirectoryStore) -> None:
        self.directory = directory
        self.store = store
        self._watch = KvWatch(
            store.bus,
            store.kv,
            "directory store",
            apply=self._apply_async,
            forget=self._forget,
            loaded=self._loaded,
            changed=directory.notify,
        )

    async def check(self) -> None:
        """The readiness check: the watch runs."""
        await self._watch.check()

    def watching(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Load every stored entry, then keep applying changes until the context exits."""
        return self._watch.watching()

    async def _apply_async(self, entry: KeyValue.Entry) -> None:
        self._apply_entry(entry)

    async def _forget(self, seen: set[str]) -> None:
        """After a snapshot: drop the people and groups the store no longer holds."""
        known = {f"user.{u}" for u in self.directory.user_ids()} | {f"group.{g}" for g in self.directory.group_ids()}
        for gone in known - seen:
            self._apply(gone, None, self.directory.revisions.get(gone, 0))

    async def _loaded(self) -> None:
        await self.directory.notify()
        log.info(
            "directory.store_loaded",
            users=len(self.directory),
            groups=len(self.directory.group_ids()),
            problems=len(self.directory.problems),
        )

    def _apply_entry(self, entry: KeyValue.Entry) -> None:
        revision = entry.revision or 0
        value = entry_value(entry)
        if value is None:
            self._apply(entry.key, None, revision)
            return
        try:
            record = DirectoryEntry.model_validate_json(value)
        except ValidationError as exc:  # a newer writer's shape (PRO-3): keep serving what was last readable
            self.directory.applied(entry.key, revision)
            self.directory.problems[entry.key] = f"unreadable record: {exc.error_count()} problem(s)"
            log.error("directory.unreadable", key=entry.key, revision=revision, kept_previous=True)
            return
        self._apply(entry.key, record, revision)

    def _apply(self, key: str, record: DirectoryEntry | None, revision: int) -> None:
        parsed = split_key(key)
        if parsed is None:
            log.warning("directory.unknown_key", key=key)
            return
        kind, entry_id = parsed
        live = record is not None and not record.deleted
        if kind == "user":
            self.directory.apply_user(entry_id, record.user if live and record is not None else None)
        else:
            self.directory.apply_group(entry_id, record.group if live and record is not None else None)
        self.directory.applied(key, revision)
        log.info("directory.applied", kind=kind, id=entry_id, revision=revision, deleted=not live)
