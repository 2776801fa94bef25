"""State machines as data (PRO-5): allowed transitions are a table, checked at runtime and by tests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Generic, TypeVar

from temporality_protocol.errors import IllegalTransition

__all__ = [
    "AGENT_ASK",
    "AGENT_LIFECYCLE",
    "AGENT_REPORTABLE",
    "AGENT_TASK",
    "HUMAN_REQUEST",
    "RUN",
    "AgentAskState",
    "AgentLifecycleState",
    "AgentTaskState",
    "HumanRequestState",
    "RunState",
    "StateMachine",
]

S = TypeVar("S", bound=StrEnum)


@dataclass(frozen=True)
class StateMachine(Generic[S]):
    name: str
    initial: S
    transitions: Mapping[S, frozenset[S]]

    # (computed once per machine: the tables are constants, and ``terminal`` is read several times a run resume;
    # ``cached_property`` writes the instance's ``__dict__`` directly, which a frozen dataclass allows)
    @cached_property
    def states(self) -> frozenset[S]:
        return frozenset(self.transitions)

    @cached_property
    def terminal(self) -> frozenset[S]:
        return frozenset(s for s, targets in self.transitions.items() if not targets)

    def allowed(self, current: S, target: S) -> bool:
        return target in self.transitions[current]

    def transition(self, current: S, target: S) -> S:
        """Return ``target`` if the move is legal, else raise :class:`IllegalTransition`."""
        if not self.allowed(current, target):
            raise IllegalTransition(self.name, current.value, target.value)
        return target


class RunState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    WAITING_FOR_HUMAN = "waiting_for_human"
    WAITING_FOR_AGENT = "waiting_for_agent"
    RESUMING = "resuming"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


_R = RunState
RUN: StateMachine[RunState] = StateMachine(
    name="run",
    initial=_R.PENDING,
    transitions={
        _R.PENDING: frozenset({_R.RUNNING, _R.FAILED, _R.CANCELLED}),
        _R.RUNNING: frozenset({_R.WAITING_FOR_HUMAN, _R.WAITING_FOR_AGENT, _R.COMPLETED, _R.FAILED, _R.CANCELLED}),
        _R.WAITING_FOR_HUMAN: frozenset({_R.RESUMING, _R.FAILED, _R.CANCELLED}),
        _R.WAITING_FOR_AGENT: frozenset({_R.RESUMING, _R.FAILED, _R.CANCELLED}),
        _R.RESUMING: frozenset({_R.RUNNING, _R.FAILED, _R.CANCELLED}),
        _R.COMPLETED: frozenset(),
        _R.FAILED: frozenset(),
        _R.CANCELLED: frozenset(),
    },
)


class HumanRequestState(StrEnum):
    PENDING = "pending"
    ANSWERED = "answered"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


_H = HumanRequestState
HUMAN_REQUEST: StateMachine[HumanRequestState] = StateMachine(
    name="human_request",
    initial=_H.PENDING,
    transitions={
        _H.PENDING: frozenset({_H.ANSWERED, _H.EXPIRED, _H.CANCELLED}),
        _H.ANSWERED: frozenset(),
        _H.EXPIRED: frozenset(),
        _H.CANCELLED: frozenset(),
    },
)


class AgentAskState(StrEnum):
    """One ``ask_agent`` request as agent-collab routes it (COL-2, COL-3, COL-9, PRO-1).

    ``expired`` is not terminal: a wait that timed out leaves the request with its recipient, and a
    late reply still goes back (COL-2). A reply ends it as ``answered`` or ``refused`` (the recipient's
    right to refuse, PRO-1), or ``reply_undeliverable`` when the asker had already finished.
    """

    ASKED = "asked"
    DELIVERED = "delivered"
    EXPIRED = "expired"
    ANSWERED = "answered"
    REFUSED = "refused"
    REPLY_UNDELIVERABLE = "reply_undeliverable"
    UNDELIVERABLE = "undeliverable"


_A = AgentAskState
_A_REPLIED = frozenset({_A.ANSWERED, _A.REFUSED, _A.REPLY_UNDELIVERABLE})
AGENT_ASK: StateMachine[AgentAskState] = StateMachine(
    name="agent_ask",
    initial=_A.ASKED,
    transitions={
        _A.ASKED: frozenset({_A.DELIVERED, _A.UNDELIVERABLE}),
        _A.DELIVERED: _A_REPLIED | {_A.EXPIRED, _A.UNDELIVERABLE},
        _A.EXPIRED: _A_REPLIED | {_A.UNDELIVERABLE},
        _A.ANSWERED: frozenset(),
        _A.REFUSED: frozenset(),
        _A.REPLY_UNDELIVERABLE: frozenset(),
        _A.UNDELIVERABLE: frozenset(),
    },
)


class AgentLifecycleState(StrEnum):
    """An external agent as agent-collab's registry sees it (AP-2); every move is journaled as
    ``agent.lifecycle_changed``.

    ``created`` is where a registration starts and ``registered`` where an accepted one lands; the
    working states (``idle`` … ``failed``) are what the agent itself reports in its heartbeats (AP-4);
    ``offline`` is set by agent-collab when no heartbeat came within the interval, and an agent coming
    back goes through ``resuming``; ``decommissioned`` (deregistration) ends an incarnation: a later
    registration starts a new one at ``created``.
    """

    CREATED = "created"
    REGISTERED = "registered"
    IDLE = "idle"
    BUSY = "busy"
    WAITING_APPROVAL = "waiting_approval"
    PAUSED = "paused"
    RESUMING = "resuming"
    COMPLETED = "completed"
    FAILED = "failed"
    OFFLINE = "offline"
    DECOMMISSIONED = "decommissioned"


_L = AgentLifecycleState
#: The states an agent may report in a heartbeat (its own view of its work). Heartbeats sample the
#: agent's state, so any working state may follow any other: one the agent passed through between two
#: heartbeats is never seen.
AGENT_REPORTABLE: frozenset[AgentLifecycleState] = frozenset(
    {_L.IDLE, _L.BUSY, _L.WAITING_APPROVAL, _L.PAUSED, _L.RESUMING, _L.COMPLETED, _L.FAILED}
)
#: Every state but the ends may be left by a re-registration, a missed heartbeat or a deregistration.
_L_LEAVE = frozenset({_L.REGISTERED, _L.OFFLINE, _L.DECOMMISSIONED})
AGENT_LIFECYCLE: StateMachine[AgentLifecycleState] = StateMachine(
    name="agent_lifecycle",
    initial=_L.CREATED,
    transitions={
        _L.CREATED: frozenset({_L.REGISTERED}),
        _L.REGISTERED: AGENT_REPORTABLE | {_L.OFFLINE, _L.DECOMMISSIONED},
        **{state: (AGENT_REPORTABLE - {state}) | _L_LEAVE for state in AGENT_REPORTABLE},
        # back from offline: through resuming (a heartbeat), or a fresh registration
        _L.OFFLINE: frozenset({_L.RESUMING, _L.REGISTERED, _L.DECOMMISSIONED}),
        _L.DECOMMISSIONED: frozenset(),
    },
)


class AgentTaskState(StrEnum):
    """The dialogue of one task an external agent executes for a run (AP-5, PRO-5), as agent-collab keeps it.

    The run-executor *offers* each turn (the task on the first, the tool results of the last action on the
    next); the agent *takes* it by polling (``working``), then *acts* once per turn: tool calls (``acted``:
    the run runs them -- ``ask_human`` parks it -- and offers the next turn), a result (``completed``) or a
    failure (``failed``). A run that ends otherwise (cancelled, failed, timed out) ends its task too.
    """

    OFFERED = "offered"
    WORKING = "working"
    ACTED = "acted"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


_T = AgentTaskState
_T_ENDS = frozenset({_T.COMPLETED, _T.FAILED, _T.CANCELLED})
AGENT_TASK: StateMachine[AgentTaskState] = StateMachine(
    name="agent_task",
    initial=_T.OFFERED,
    transitions={
        _T.OFFERED: frozenset({_T.WORKING}) | _T_ENDS,
        _T.WORKING: frozenset({_T.ACTED}) | _T_ENDS,
        _T.ACTED: frozenset({_T.OFFERED}) | _T_ENDS,
        _T.COMPLETED: frozenset(),
        _T.FAILED: frozenset(),
        _T.CANCELLED: frozenset(),
    },
)
