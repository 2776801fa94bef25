"""What the operator's allow-list grants each external agent, and its changes on record (AP-11: "every critical
action -- registration, decommission, handoff, **policy change**, refusal -- is written to an audit trail").

The allow-list is a file read at start (``TEMPORALITY_COLLAB_EXTERNAL_AGENTS_FILE``): an operator changes an
agent's tools or limits, lists a new agent or removes one, and restarts agent-collab. A tool call is checked
against the new list from that start on (:func:`temporality_agent_collab.registry.granted`); this module puts the
change in the journal at that moment, not only at the agent's next registration.

KV ``agent-registry`` / ``policy.<agent id>`` holds the grant (:class:`ExternalAgentGrant`) agent-collab last
started with (``None`` once the agent was unlisted: the record stays, so its revision only grows). At each start
:func:`record_policy_changes` compares it with the list's, and for each agent whose grant differs publishes
``agent.policy_changed`` and then records the new grant by compare-and-set on the revision it read. The event's id
is derived from the agent, that revision and both grants: replicas starting together with the same list, or a
start that crashed between the publish and the write, publish the same fact, which JetStream and the journal keep
once; the same change made again later (revoke, restore, revoke) is a new fact. A replica that loses the
compare-and-set reads again and reports what is left to change. The first start with this module reports every
listed agent as ``listed``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import structlog
from pydantic import BaseModel, ConfigDict

from temporality_agent_collab.external import DEFAULT_FILE, AllowList, ExternalAgent
from temporality_bus import AlreadyExists, Bus, Conflict, Contended, Store
from temporality_protocol import AgentPolicyChanged, Envelope, ExternalAgentGrant, derive_id, make_event
from temporality_protocol.catalog import BUCKET_AGENTS

__all__ = ["POLICY_PREFIX", "GrantRecord", "grant_of", "policy_changed", "policy_key", "record_policy_changes"]

log = structlog.get_logger(__name__)

POLICY_PREFIX = "policy."
#: Compare-and-set rounds per agent before the start fails (replicas starting with different lists).
_ATTEMPTS = 8
SOURCE = "/temporality/agent-collab"


class GrantRecord(BaseModel):
    """KV ``agent-registry`` / ``policy.<agent id>``: the grant agent-collab last started with (``None``: the
    agent is no longer listed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    agent_id: str
    grant: ExternalAgentGrant | None


def policy_key(agent_id: str) -> str:
    return f"{POLICY_PREFIX}{agent_id}"


def grant_of(allow_list: AllowList, agent: ExternalAgent) -> ExternalAgentGrant:
    """What ``agent``'s entry grants (its key as a digest: the event never carries the key)."""
    key = agent.public_key
    return ExternalAgentGrant(
        allowed_tools=sorted(agent.allowed_tools),
        protocol_versions=list(agent.protocol_versions),
        max_context_size=agent.limits.max_context_size,
        max_concurrent_tasks=agent.limits.max_concurrent_tasks,
        heartbeat_interval_s=allow_list.interval_of(agent),
        public_key_sha256=hashlib.sha256(key.strip().encode()).hexdigest() if key is not None else None,
        allow_unsigned=agent.allow_unsigned,
    )


def _digest(grant: ExternalAgentGrant | None) -> str:
    return "none" if grant is None else hashlib.sha256(grant.model_dump_json().encode()).hexdigest()[:32]


def policy_changed(
    agent_id: str,
    before: ExternalAgentGrant | None,
    after: ExternalAgentGrant | None,
    requested_by: str,
    *,
    revision: int,
) -> Envelope | None:
    """``agent.policy_changed`` for a move from ``before`` to ``after`` (``None``: not listed); ``None`` when they
    are the same. Pure: the id is derived from the agent, ``revision`` (the stored grant's, 0: none) and both
    grants."""
    if before == after:
        return None
    change = "listed" if before is None else "unlisted" if after is None else "changed"
    was = set(before.allowed_tools) if before is not None else set()
    now = set(after.allowed_tools) if after is not None else set()
    data = AgentPolicyChanged(
        agent_id=agent_id,
        change=change,
        before=before,
        after=after,
        tools_granted=sorted(now - was),
        tools_revoked=sorted(was - now),
        requested_by=requested_by,
    )
    event_id = derive_id("evt", "agent.policy_changed", agent_id, str(revision), _digest(before), _digest(after))
    return make_event(data, source=SOURCE, id=event_id, subject=agent_id, actor="service:agent-collab")


async def record_policy_changes(bus: Bus, allow_list: AllowList, file: Path | None) -> list[AgentPolicyChanged]:
    """Journal every agent whose grant differs from the one recorded at the last start, then record the new
    grants (see the module docstring). Returns the changes this call published."""
    store: Store[GrantRecord] = await bus.store(BUCKET_AGENTS, GrantRecord)
    requested_by = f"file:{file if file is not None else DEFAULT_FILE}"
    listed = {agent.id: grant_of(allow_list, agent) for agent in allow_list.agents}
    recorded = [key.removeprefix(POLICY_PREFIX) for key in await store.keys(f"{POLICY_PREFIX}>")]
    changes: list[AgentPolicyChanged] = []
    for agent_id in sorted(set(recorded) | set(listed)):
        for _ in range(_ATTEMPTS):
            found = await store.get(policy_key(agent_id))
            before = found.value.grant if found is not None else None
            revision = found.revision if found is not None else 0
            after = listed.get(agent_id)
            event = policy_changed(agent_id, before, after, requested_by, revision=revision)
            if event is None:
                break
            await bus.publish(event)  # first: a crash before the write below publishes the same fact again
            record = GrantRecord(agent_id=agent_id, grant=after)
            try:
                if found is None:
                    await store.create(policy_key(agent_id), record)
                else:
                    await store.update(policy_key(agent_id), record, found.revision)
            except (AlreadyExists, Conflict):
                continue  # another replica recorded a grant meanwhile: compare with that one
            data = event.payload(AgentPolicyChanged)
            changes.append(data)
            log.info(
                "external_agents.policy_changed",
                agent_id=agent_id,
                change=data.change,
                tools_granted=data.tools_granted,
                tools_revoked=data.tools_revoked,
            )
            break
        else:
            raise Contended(BUCKET_AGENTS.name, policy_key(agent_id), _ATTEMPTS)
    return changes
