"""Typed JetStream KV with compare-and-set: the long-lived state of every service."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError
from nats.js.kv import KeyValue
from pydantic import BaseModel

from temporality_bus.errors import AlreadyExists, Conflict

__all__ = ["Store", "Versioned"]

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Versioned(Generic[M]):
    value: M
    revision: int


class Store(Generic[M]):
    """A KV bucket holding one pydantic model per key."""

    def __init__(self, kv: KeyValue, bucket: str, model: type[M]) -> None:
        self._kv = kv
        self.bucket = bucket
        self._model = model

    async def get(self, key: str) -> Versioned[M] | None:
        try:
            entry = await self._kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        if entry.value is None:
            return None
        return Versioned(self._model.model_validate_json(entry.value), entry.revision or 0)

    async def create(self, key: str, value: M) -> int:
        """Create-if-absent; :class:`AlreadyExists` when the key is there."""
        try:
            return await self._kv.create(key, value.model_dump_json().encode())
        except KeyWrongLastSequenceError as exc:
            raise AlreadyExists(self.bucket, key) from exc

    async def update(self, key: str, value: M, revision: int) -> int:
        """Write only if the key is still at ``revision``; :class:`Conflict` otherwise."""
        try:
            return await self._kv.update(key, value.model_dump_json().encode(), last=revision)
        except KeyWrongLastSequenceError as exc:
            raise Conflict(self.bucket, key, revision) from exc

    async def put(self, key: str, value: M) -> int:
        return await self._kv.put(key, value.model_dump_json().encode())

    async def keys(self) -> list[str]:
        try:
            return list(await self._kv.keys())
        except NoKeysError:
            return []
