"""Temporality's wire protocol: one place defines what crosses the bus (DC-4)."""

from temporality_protocol import catalog
from temporality_protocol.envelope import CONTENT_TYPE, EncodedEvent, Envelope, decode, encode, encode_event, make_event
from temporality_protocol.errors import (
    IllegalTransition,
    IncompatibleProtocolVersion,
    InvalidEnvelope,
    ProtocolError,
    UnknownEventType,
)
from temporality_protocol.events import *  # noqa: F403 - events.__all__ is curated
from temporality_protocol.events import __all__ as _events_all
from temporality_protocol.ids import derive_id, new_id, run_id_for_delivery
from temporality_protocol.states import HUMAN_REQUEST, RUN, HumanRequestState, RunState, StateMachine
from temporality_protocol.version import PROTOCOL_VERSION, SUPPORTED_VERSIONS, is_supported, negotiate

__all__ = [
    "catalog",
    "CONTENT_TYPE",
    "EncodedEvent",
    "Envelope",
    "decode",
    "encode",
    "encode_event",
    "make_event",
    "IllegalTransition",
    "IncompatibleProtocolVersion",
    "InvalidEnvelope",
    "ProtocolError",
    "UnknownEventType",
    "derive_id",
    "new_id",
    "run_id_for_delivery",
    "HUMAN_REQUEST",
    "RUN",
    "HumanRequestState",
    "RunState",
    "StateMachine",
    "PROTOCOL_VERSION",
    "SUPPORTED_VERSIONS",
    "is_supported",
    "negotiate",
    *_events_all,
]
