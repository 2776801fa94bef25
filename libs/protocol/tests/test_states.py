"""The state machines are data: enumerate every allowed and every forbidden move."""

from __future__ import annotations

import itertools
from typing import get_args

import pytest

from temporality_protocol import HUMAN_REQUEST, RUN, HumanRequestState, IllegalTransition, RunState
from temporality_protocol.events import ReportedAgentState
from temporality_protocol.states import AGENT_LIFECYCLE, AGENT_REPORTABLE, AgentLifecycleState

R = RunState
ALLOWED_RUN = {
    (R.PENDING, R.RUNNING), (R.PENDING, R.FAILED), (R.PENDING, R.CANCELLED),
    (R.RUNNING, R.WAITING_FOR_HUMAN), (R.RUNNING, R.WAITING_FOR_AGENT), (R.RUNNING, R.COMPLETED),
    (R.RUNNING, R.FAILED), (R.RUNNING, R.CANCELLED),
    (R.WAITING_FOR_HUMAN, R.RESUMING), (R.WAITING_FOR_HUMAN, R.FAILED), (R.WAITING_FOR_HUMAN, R.CANCELLED),
    (R.WAITING_FOR_AGENT, R.RESUMING), (R.WAITING_FOR_AGENT, R.FAILED), (R.WAITING_FOR_AGENT, R.CANCELLED),
    (R.RESUMING, R.RUNNING), (R.RESUMING, R.FAILED), (R.RESUMING, R.CANCELLED),
}  # fmt: skip
H = HumanRequestState
ALLOWED_HUMAN = {(H.PENDING, H.ANSWERED), (H.PENDING, H.EXPIRED), (H.PENDING, H.CANCELLED)}


@pytest.mark.parametrize(("current", "target"), sorted(itertools.product(R, R)))
def test_run_transitions(current: RunState, target: RunState) -> None:
    if (current, target) in ALLOWED_RUN:
        assert RUN.transition(current, target) is target
    else:
        with pytest.raises(IllegalTransition, match=f"{current.value} -> {target.value}"):
            RUN.transition(current, target)


@pytest.mark.parametrize(("current", "target"), sorted(itertools.product(H, H)))
def test_human_request_transitions(current: HumanRequestState, target: HumanRequestState) -> None:
    assert HUMAN_REQUEST.allowed(current, target) == ((current, target) in ALLOWED_HUMAN)
    if (current, target) not in ALLOWED_HUMAN:
        with pytest.raises(IllegalTransition):
            HUMAN_REQUEST.transition(current, target)


def test_terminal_states() -> None:
    assert RUN.terminal == {R.COMPLETED, R.FAILED, R.CANCELLED}
    assert HUMAN_REQUEST.terminal == {H.ANSWERED, H.EXPIRED, H.CANCELLED}
    assert RUN.initial is R.PENDING
    # RUN-2: the seed's states are all there
    assert {s.value for s in RUN.states} >= {
        "pending", "running", "waiting_for_human", "resuming", "completed", "failed", "cancelled",
    }  # fmt: skip


# --------------------------------------------------------------------------- external agents (AP-2)
L = AgentLifecycleState
WORKING = {L.IDLE, L.BUSY, L.WAITING_APPROVAL, L.PAUSED, L.RESUMING, L.COMPLETED, L.FAILED}
ALLOWED_AGENT = (
    {(L.CREATED, L.REGISTERED)}
    | {(L.REGISTERED, t) for t in WORKING | {L.OFFLINE, L.DECOMMISSIONED}}
    | {(s, t) for s in WORKING for t in WORKING | {L.REGISTERED, L.OFFLINE, L.DECOMMISSIONED} if s != t}
    | {(L.OFFLINE, L.RESUMING), (L.OFFLINE, L.REGISTERED), (L.OFFLINE, L.DECOMMISSIONED)}
)


@pytest.mark.parametrize(("current", "target"), sorted(itertools.product(L, L)))
def test_agent_lifecycle_transitions(current: AgentLifecycleState, target: AgentLifecycleState) -> None:
    assert AGENT_LIFECYCLE.allowed(current, target) == ((current, target) in ALLOWED_AGENT)
    if (current, target) not in ALLOWED_AGENT:
        with pytest.raises(IllegalTransition):
            AGENT_LIFECYCLE.transition(current, target)


def test_agent_lifecycle_has_the_states_of_ap_2() -> None:
    # AP-2: Created, Registered, Idle, Busy, WaitingApproval, Paused, Resuming, Completed, Failed, Offline,
    # Decommissioned
    assert [s.value for s in L] == [
        "created", "registered", "idle", "busy", "waiting_approval", "paused", "resuming", "completed", "failed",
        "offline", "decommissioned",
    ]  # fmt: skip
    assert AGENT_LIFECYCLE.states == set(L)
    assert AGENT_LIFECYCLE.initial is L.CREATED
    assert AGENT_LIFECYCLE.terminal == {L.DECOMMISSIONED}
    assert AGENT_REPORTABLE == WORKING
    # what a heartbeat may report is exactly the schema's enum (events.ReportedAgentState)
    assert set(get_args(ReportedAgentState)) == {s.value for s in AGENT_REPORTABLE}
