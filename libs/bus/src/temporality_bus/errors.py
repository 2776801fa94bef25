"""The bus's exception tree; whether to retry is a property of the error.

    BusError
    ├── PermanentError      -- the message can never succeed: consumer terms it, dead-letters it, journals it
    ├── TransientError      -- try again later: consumer naks with backoff, bounded by max_deliver
    └── StoreError          -- KV compare-and-set outcomes
        ├── AlreadyExists   -- create() found the key
        ├── NotFound        -- modify() found no key (and was given no way to create it)
        ├── Conflict        -- update() lost the race (the revision moved): retry from a fresh read
        └── Contended       -- modify() lost every one of its compare-and-set races (also transient)

Any exception a handler raises that is none of these counts as transient; a
:class:`temporality_protocol.ProtocolError` or pydantic ``ValidationError`` counts as permanent.
"""

from __future__ import annotations

__all__ = [
    "AlreadyExists",
    "BusError",
    "Conflict",
    "Contended",
    "NotFound",
    "PermanentError",
    "StoreError",
    "TransientError",
]


class BusError(Exception):
    pass


class PermanentError(BusError):
    """Retrying cannot help (bad data, a refused protocol version, an illegal transition)."""


class PayloadTooLarge(PermanentError):
    """A message larger than the server's ``max_payload``: :attr:`size` its bytes (never sent)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"{size} bytes exceed the server's max_payload")
        self.size = size


class TransientError(BusError):
    """Retrying may help (a peer is down, a race was lost)."""


class StoreError(BusError):
    pass


class AlreadyExists(StoreError):
    def __init__(self, bucket: str, key: str) -> None:
        super().__init__(f"{bucket}/{key} already exists")
        self.bucket = bucket
        self.key = key


class Conflict(StoreError, TransientError):
    def __init__(self, bucket: str, key: str, revision: int | None) -> None:
        super().__init__(f"{bucket}/{key} changed since revision {revision}")
        self.bucket = bucket
        self.key = key
        self.revision = revision


class NotFound(StoreError):
    """:meth:`temporality_bus.Store.modify` found no value under the key and had no ``create``."""

    def __init__(self, bucket: str, key: str) -> None:
        super().__init__(f"{bucket}/{key} does not exist")
        self.bucket = bucket
        self.key = key


class Contended(StoreError, TransientError):
    """:meth:`temporality_bus.Store.modify` lost ``attempts`` compare-and-set races in a row.

    Transient (the consumer naks and retries later), but deliberately not a :class:`Conflict`:
    a single lost race means another writer is making progress, running out of attempts does not.
    """

    def __init__(self, bucket: str, key: str, attempts: int) -> None:
        super().__init__(f"{bucket}/{key}: lost {attempts} compare-and-set races in a row")
        self.bucket = bucket
        self.key = key
        self.attempts = attempts
