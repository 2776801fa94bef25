"""agent-collab: the saga-participants projection and ``get_collaborators`` (COL-1); ask/answer routing
between agents, relay runs and wait timeouts (COL-2..COL-9, PRO-1); the Agent Protocol for external
agents: registration, heartbeats, lifecycle, discovery of the hosted and external agents' cards and the
conformance rounds that verify declared capabilities (AP-2..AP-4, PRO-2, PRO-3), the tasks of runs external
agents execute (AP-5, AP-7..AP-9), every message signed and verified (AP-11, PRO-4), and the operator API
that lists and decommissions agents."""

from temporality_agent_collab.agents import AgentRegistry
from temporality_agent_collab.api import create_app
from temporality_agent_collab.asks import AskRecord, RelayIndex, resolve
from temporality_agent_collab.conformance import ConformanceRound
from temporality_agent_collab.external import AllowList, ExternalAgent, load_allow_list
from temporality_agent_collab.gate import MessageGate, SignedResponder
from temporality_agent_collab.hosted import HostedAgent, HostedAgents
from temporality_agent_collab.participants import (
    HumanEntry,
    RunEntry,
    RunIndex,
    SagaParticipants,
    apply,
    collaborators,
)
from temporality_agent_collab.projector import Projector
from temporality_agent_collab.registry import AgentRecord
from temporality_agent_collab.router import AskRouter
from temporality_agent_collab.rpc import QUEUE_GROUP, CollaboratorsResponder, error_reply, lookup, open_responder
from temporality_agent_collab.settings import Settings
from temporality_agent_collab.tasks import TaskBoard

__all__ = [
    "QUEUE_GROUP",
    "AgentRecord",
    "AgentRegistry",
    "AllowList",
    "AskRecord",
    "AskRouter",
    "CollaboratorsResponder",
    "ConformanceRound",
    "ExternalAgent",
    "HostedAgent",
    "HostedAgents",
    "HumanEntry",
    "MessageGate",
    "Projector",
    "RelayIndex",
    "RunEntry",
    "RunIndex",
    "SagaParticipants",
    "Settings",
    "SignedResponder",
    "TaskBoard",
    "apply",
    "collaborators",
    "create_app",
    "error_reply",
    "load_allow_list",
    "lookup",
    "open_responder",
    "resolve",
]
