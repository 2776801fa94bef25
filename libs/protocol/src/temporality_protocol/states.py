"""State machines as data (PRO-5): allowed transitions are a table, checked at runtime and by tests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

from temporality_protocol.errors import IllegalTransition

__all__ = ["HUMAN_REQUEST", "RUN", "HumanRequestState", "RunState", "StateMachine"]

S = TypeVar("S", bound=StrEnum)


@dataclass(frozen=True)
class StateMachine(Generic[S]):
    name: str
    initial: S
    transitions: Mapping[S, frozenset[S]]

    @property
    def states(self) -> frozenset[S]:
        return frozenset(self.transitions)

    @property
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
