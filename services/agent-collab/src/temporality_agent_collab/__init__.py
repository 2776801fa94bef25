"""agent-collab: the saga-participants projection and ``get_collaborators`` (COL-1)."""

from temporality_agent_collab.participants import (
    HumanEntry,
    RunEntry,
    RunIndex,
    SagaParticipants,
    apply,
    collaborators,
)
from temporality_agent_collab.projector import Projector
from temporality_agent_collab.rpc import QUEUE_GROUP, CollaboratorsResponder, error_reply, lookup, open_responder
from temporality_agent_collab.settings import Settings

__all__ = [
    "QUEUE_GROUP",
    "CollaboratorsResponder",
    "HumanEntry",
    "Projector",
    "RunEntry",
    "RunIndex",
    "SagaParticipants",
    "Settings",
    "apply",
    "collaborators",
    "error_reply",
    "lookup",
    "open_responder",
]
