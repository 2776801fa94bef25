"""The registry's decisions, pure (no NATS): negotiation, policy, idempotent registration, liveness markers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from temporality_agent_collab.external import AllowList
from temporality_agent_collab.registry import (
    AlreadyDecommissioned,
    Refused,
    decommissioned,
    fresh_record,
    heartbeat_missed,
    heartbeat_seen,
    lifecycle_events,
    negotiated,
    operator_decommissioned,
    readmitted,
    registered,
)
from temporality_protocol import AgentRegistration, Deregistration, Heartbeat
from temporality_protocol.states import AgentLifecycleState

L = AgentLifecycleState
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
ALLOW = AllowList.model_validate(
    {
        "heartbeat_interval_s": 5,
        "agents": [
            {"id": "bot", "protocol_versions": ["1.0"], "allowed_tools": ["a", "b"], "limits": {"max_context_size": 10}}
        ],
    }
)
BOT = ALLOW.agents[0]


def request(**changes: object) -> AgentRegistration:
    body: dict[str, object] = {
        "agent_id": "bot",
        "protocol_version": "1.0",
        "provider": "p",
        "model": "m",
        "supported_tools": ["b", "c"],
        "max_context_size": 100,
    }
    return AgentRegistration.model_validate({**body, **changes})


def beat(state: str = "idle", **changes: object) -> Heartbeat:
    body: dict[str, object] = {"agent_id": "bot", "timestamp": T0, "current_state": state, "protocol_version": "1.0"}
    return Heartbeat.model_validate({**body, **changes})


def test_negotiation_picks_the_highest_common_version_and_refuses_none() -> None:
    assert negotiated(request(protocol_version="1.0", protocol_versions=["3.1", "junk"]), BOT) == "1.0"
    with pytest.raises(Refused) as refused:
        negotiated(request(protocol_version="2.0"), BOT)
    assert refused.value.reason == "no_common_version"


def test_a_fresh_registration_has_its_policy_and_one_move() -> None:
    record = fresh_record(request(), BOT, ALLOW, version="1.0", grace_s=1, now=T0)
    assert (record.state, record.incarnation, record.seq, record.beat) == (L.REGISTERED, 1, 1, 1)
    assert record.policy.allowed_tools == ["b"]  # supported and allowed
    assert record.policy.limits.max_context_size == 10  # the smaller of declared and granted
    assert (record.offline_after_s, record.deadline) == (6, T0 + timedelta(seconds=6))
    (event,) = lifecycle_events(record)
    assert (event.data["from_state"], event.data["to_state"], event.data["seq"]) == ("created", "registered", 1)


def test_registering_again_is_idempotent_and_a_change_is_a_re_registration() -> None:
    record = fresh_record(request(), BOT, ALLOW, version="1.0", grace_s=1, now=T0)
    assert registered(record, request(), BOT, ALLOW, version="1.0", grace_s=1, now=T0 + timedelta(seconds=1)) is None
    busy = heartbeat_seen(record, beat("busy"), T0)
    again = registered(busy, request(), BOT, ALLOW, version="1.0", grace_s=1, now=T0)
    assert again is not None
    assert (again.state, again.registration, [(t.from_state, t.reason) for t in again.recent]) == (
        L.REGISTERED,
        2,
        [(L.BUSY, "re_registered")],
    )


def test_a_stale_or_early_firing_leaves_the_agent_online() -> None:
    record = fresh_record(request(), BOT, ALLOW, version="1.0", grace_s=1, now=T0)
    later = heartbeat_seen(record, beat(), T0 + timedelta(seconds=3))
    after_deadline = later.deadline + timedelta(seconds=1)
    assert heartbeat_missed(later, record.incarnation, record.beat, after_deadline) is None  # an older marker
    assert heartbeat_missed(later, later.incarnation, later.beat, later.deadline - timedelta(seconds=1)) is None
    offline = heartbeat_missed(later, later.incarnation, later.beat, after_deadline)
    assert offline is not None
    assert offline.state is L.OFFLINE
    assert heartbeat_missed(offline, offline.incarnation, offline.beat, after_deadline) is None  # a repeat
    back = heartbeat_seen(offline, beat("busy"), after_deadline)
    assert [(t.from_state, t.to_state, t.reason) for t in back.recent] == [
        (L.OFFLINE, L.RESUMING, "came_back"),
        (L.RESUMING, L.BUSY, "heartbeat"),
    ]


def test_heartbeats_and_deregistrations_that_cannot_be_taken() -> None:
    record = fresh_record(request(), BOT, ALLOW, version="1.0", grace_s=1, now=T0)
    with pytest.raises(Refused) as mismatch:
        heartbeat_seen(record, beat(protocol_version="1.1"), T0)
    assert mismatch.value.reason == "version_mismatch"
    gone = decommissioned(record, Deregistration(agent_id="bot", protocol_version="1.0"), T0)
    assert gone is not None
    assert gone.state is L.DECOMMISSIONED
    assert decommissioned(gone, Deregistration(agent_id="bot", protocol_version="1.0"), T0) is None
    with pytest.raises(Refused) as late:
        heartbeat_seen(gone, beat(), T0)
    assert late.value.reason == "not_registered"
    new = registered(gone, request(), BOT, ALLOW, version="1.0", grace_s=1, now=T0)
    assert new is not None
    assert (new.incarnation, new.seq, new.state) == (2, 1, L.REGISTERED)


def test_an_operator_decommissioning_holds_the_agent_out_until_readmitted() -> None:
    record = fresh_record(request(), BOT, ALLOW, version="1.0", grace_s=1, now=T0)
    held = operator_decommissioned(record, "on-call", "leaked key", T0)
    assert held is not None
    assert (held.state, held.held_by, held.decommission_reason) == (L.DECOMMISSIONED, "on-call", "leaked key")
    (move,) = held.recent
    assert (move.reason, move.requested_by, move.detail) == ("decommissioned", "on-call", "leaked key")
    (event,) = lifecycle_events(held)
    assert (event.actor, event.data["requested_by"]) == ("token:on-call", "on-call")
    assert operator_decommissioned(held, "someone-else", "", T0) is None  # a repeat: nothing moves
    # every later message of the agent is refused, its registration too
    for attempt in (
        lambda: heartbeat_seen(held, beat(), T0),
        lambda: decommissioned(held, Deregistration(agent_id="bot", protocol_version="1.0"), T0),
        lambda: registered(held, request(), BOT, ALLOW, version="1.0", grace_s=1, now=T0),
    ):
        with pytest.raises(Refused) as refused:
            attempt()
        assert "on-call" in refused.value.detail
    with pytest.raises(Refused) as again:
        registered(held, request(), BOT, ALLOW, version="1.0", grace_s=1, now=T0)
    assert again.value.reason == "decommissioned"
    # readmitted: a registration is the next incarnation
    free = readmitted(held)
    assert free is not None
    assert (free.held_by, free.state, free.recent) == (None, L.DECOMMISSIONED, [])
    assert readmitted(free) is None
    back = registered(free, request(), BOT, ALLOW, version="1.0", grace_s=1, now=T0)
    assert back is not None
    assert (back.incarnation, back.state) == (2, L.REGISTERED)


def test_an_agent_that_left_by_itself_cannot_be_decommissioned_again() -> None:
    record = fresh_record(request(), BOT, ALLOW, version="1.0", grace_s=1, now=T0)
    left = decommissioned(record, Deregistration(agent_id="bot", protocol_version="1.0"), T0)
    assert left is not None
    with pytest.raises(AlreadyDecommissioned):
        operator_decommissioned(left, "on-call", "", T0)
