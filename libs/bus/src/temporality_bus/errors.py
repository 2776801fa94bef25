"""The bus's exception tree; whether to retry is a property of the error.

    BusError
    ├── PermanentError      -- the message can never succeed: consumer terms it, dead-letters it, journals it
    ├── TransientError      -- try again later: consumer naks with backoff, bounded by max_deliver
    └── StoreError          -- KV compare-and-set outcomes
        ├── AlreadyExists   -- create() found the key
        └── Conflict        -- update() lost the race (the revision moved): retry from a fresh read

Any exception a handler raises that is none of these counts as transient; a
:class:`temporality_protocol.ProtocolError` or pydantic ``ValidationError`` counts as permanent.
"""

from __future__ import annotations

__all__ = ["AlreadyExists", "BusError", "Conflict", "PermanentError", "StoreError", "TransientError"]


class BusError(Exception):
    pass


class PermanentError(BusError):
    """Retrying cannot help (bad data, a refused protocol version, an illegal transition)."""


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
