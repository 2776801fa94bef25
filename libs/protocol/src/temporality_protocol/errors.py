"""The protocol's exception tree.

    ProtocolError                      -- base of everything raised by temporality_protocol
    ├── IllegalTransition              -- a state machine refused a move (state machines are data)
    ├── IncompatibleProtocolVersion    -- no common protocol version (PRO-3: explicit refusal)
    ├── UnknownEventType               -- an envelope's ``type`` is not in the catalogue
    └── InvalidEnvelope                -- bytes that are not a valid CloudEvent of ours

Consumers treat every ProtocolError as *permanent*: retrying cannot fix the message.
"""

from __future__ import annotations

__all__ = [
    "IllegalTransition",
    "IncompatibleProtocolVersion",
    "InvalidEnvelope",
    "ProtocolError",
    "UnknownEventType",
]


class ProtocolError(Exception):
    """Base class: the message or the move violates the protocol. Never retryable."""


class IllegalTransition(ProtocolError):
    def __init__(self, machine: str, current: str, target: str) -> None:
        super().__init__(f"{machine}: illegal transition {current} -> {target}")
        self.machine = machine
        self.current = current
        self.target = target


class IncompatibleProtocolVersion(ProtocolError):
    def __init__(self, ours: list[str], theirs: list[str]) -> None:
        super().__init__(f"no common protocol version: we speak {ours}, they speak {theirs}")
        self.ours = ours
        self.theirs = theirs


class UnknownEventType(ProtocolError):
    def __init__(self, event_type: str) -> None:
        super().__init__(f"unknown event type {event_type!r}")
        self.event_type = event_type


class InvalidEnvelope(ProtocolError):
    """The bytes are not a CloudEvent 1.0 of ours (bad JSON, missing attributes, bad data)."""
