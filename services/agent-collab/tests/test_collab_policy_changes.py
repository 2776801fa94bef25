"""AP-11's audit of a policy change: agent-collab started with an allow-list that grants an external agent other
tools or limits, lists a new one or no longer lists one publishes ``agent.policy_changed`` -- once per change, at
that start, not only at the agent's next registration (``temporality_agent_collab.policy``).

The pure decision first, then the service started in-process on a real nats-server with one allow-list after
another (the journal's side, the audit entry, is in ``services/journal/tests/test_journal_audit.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from collab_replicas import StartCollab, collab_replicas

from temporality_agent_collab.external import AllowList, ExternalAgent
from temporality_agent_collab.policy import GrantRecord, grant_of, policy_changed, policy_key
from temporality_bus import Bus, NatsSettings
from temporality_protocol import AgentPolicyChanged, ExternalAgentGrant
from temporality_protocol.catalog import BUCKET_AGENTS
from temporality_testing.events import EventLog

CHANGED = AgentPolicyChanged.EVENT_TYPE
WAIT_S = 8.0

FIRST = """
heartbeat_interval_s: 1
agents:
  - id: triage-bot
    allowed_tools: [get_input, notify, ask_human]
    limits: {max_concurrent_tasks: 2}
    allow_unsigned: true
  - id: old-bot
    allow_unsigned: true
"""
#: ``notify`` revoked and ``ask_agent`` granted to triage-bot, old-bot removed, new-bot listed.
SECOND = """
heartbeat_interval_s: 1
agents:
  - id: triage-bot
    allowed_tools: [get_input, ask_human, ask_agent]
    limits: {max_concurrent_tasks: 2}
    allow_unsigned: true
  - id: new-bot
    allowed_tools: [notify]
    allow_unsigned: true
"""


def _grant(**changes: object) -> ExternalAgentGrant:
    fields: dict[str, object] = {"allowed_tools": ["get_input"], "max_concurrent_tasks": 1, "heartbeat_interval_s": 10}
    return ExternalAgentGrant.model_validate(fields | changes)


# --------------------------------------------------------------------------- the decision, pure
def test_the_same_grant_is_no_change() -> None:
    assert policy_changed("bot", _grant(), _grant(), "file:x.yaml", revision=3) is None
    assert policy_changed("bot", None, None, "file:x.yaml", revision=3) is None


def test_a_change_names_the_tools_granted_and_revoked_and_its_id_is_the_change_s() -> None:
    before, after = _grant(allowed_tools=["get_input", "notify"]), _grant(allowed_tools=["ask_agent", "get_input"])
    event = policy_changed("bot", before, after, "file:x.yaml", revision=3)
    assert event is not None
    data = event.payload(AgentPolicyChanged)
    assert (data.change, data.tools_granted, data.tools_revoked) == ("changed", ["ask_agent"], ["notify"])
    assert (data.before, data.after, data.requested_by) == (before, after, "file:x.yaml")
    assert event.subject == "bot"
    again = policy_changed("bot", before, after, "file:x.yaml", revision=3)
    assert again is not None
    assert again.id == event.id  # a second replica, or a start after a crash: the same fact
    back = policy_changed("bot", after, before, "file:x.yaml", revision=4)
    assert back is not None
    assert back.id != event.id  # changed back: another fact
    repeated = policy_changed("bot", before, after, "file:x.yaml", revision=5)
    assert repeated is not None
    assert repeated.id != event.id  # the same change made again later (revoke, restore, revoke): a third fact
    limits = policy_changed(
        "bot", before, before.model_copy(update={"max_concurrent_tasks": 3}), "file:x.yaml", revision=3
    )
    assert limits is not None
    assert limits.payload(AgentPolicyChanged).tools_granted == limits.payload(AgentPolicyChanged).tools_revoked == []


def test_listed_and_unlisted() -> None:
    listed = policy_changed("bot", None, _grant(), "file:x.yaml", revision=0)
    unlisted = policy_changed("bot", _grant(), None, "file:x.yaml", revision=7)
    assert listed is not None
    assert unlisted is not None
    assert (listed.payload(AgentPolicyChanged).change, listed.payload(AgentPolicyChanged).tools_granted) == (
        "listed",
        ["get_input"],
    )
    assert (unlisted.payload(AgentPolicyChanged).change, unlisted.payload(AgentPolicyChanged).tools_revoked) == (
        "unlisted",
        ["get_input"],
    )


def test_the_grant_carries_a_digest_of_the_key_never_the_key() -> None:
    key = "MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE="
    allow_list = AllowList(agents=[ExternalAgent(id="signed-bot", public_key=key)], heartbeat_interval_s=5)
    grant = grant_of(allow_list, allow_list.agents[0])
    assert grant.public_key_sha256 is not None
    assert len(grant.public_key_sha256) == 64
    assert key not in grant.model_dump_json()
    assert grant.heartbeat_interval_s == 5  # the list's, the agent setting none


# --------------------------------------------------------------------------- the service, on a real nats-server
@pytest.fixture
async def start_agent_collab(nats_settings: NatsSettings) -> AsyncIterator[StartCollab]:
    async with collab_replicas(nats_settings) as start:
        yield start


def _allow(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


async def _stored_changes(bus: Bus) -> list[AgentPolicyChanged]:
    """Every ``agent.policy_changed`` the stream holds (the stream, not a subscription: what was kept once)."""
    log = await EventLog(bus.nc, f"temporality.events.{CHANGED}").start()
    try:
        seen = await log.caught_up(WAIT_S)
    finally:
        await log.stop()
    return [e.payload(AgentPolicyChanged) for e in seen]


async def test_each_start_journals_what_its_allow_list_changed_once(
    bus: Bus, start_agent_collab: StartCollab, tmp_path: Path
) -> None:
    """First start: both agents ``listed``. The same list again: nothing. The second list: triage-bot
    ``changed`` (notify revoked, ask_agent granted), old-bot ``unlisted`` (its record gone), new-bot ``listed``."""
    first = _allow(tmp_path, "first.yaml", FIRST)
    stop = await start_agent_collab(first)
    await stop()
    changes = await _stored_changes(bus)
    assert sorted((c.agent_id, c.change) for c in changes) == [("old-bot", "listed"), ("triage-bot", "listed")]
    assert {c.requested_by for c in changes} == {f"file:{first}"}
    store = await bus.store(BUCKET_AGENTS, GrantRecord)
    triage = await store.get(policy_key("triage-bot"))
    assert triage is not None
    assert triage.value.grant is not None
    assert triage.value.grant.allowed_tools == ["ask_human", "get_input", "notify"]

    stop = await start_agent_collab(first)  # restarted with the same list: no change to report
    await stop()
    assert len(await _stored_changes(bus)) == 2

    stop = await start_agent_collab(_allow(tmp_path, "second.yaml", SECOND))
    await stop()
    changes = await _stored_changes(bus)
    later = sorted((c.agent_id, c.change, c.tools_granted, c.tools_revoked) for c in changes[2:])
    assert later == [
        ("new-bot", "listed", ["notify"], []),
        ("old-bot", "unlisted", [], []),
        ("triage-bot", "changed", ["ask_agent"], ["notify"]),
    ]
    gone = await store.get(policy_key("old-bot"))
    assert gone is not None
    assert gone.value.grant is None  # kept as "not listed": its revision only grows


async def test_the_same_change_made_again_is_journaled_again(
    bus: Bus, start_agent_collab: StartCollab, tmp_path: Path
) -> None:
    """Revoke, restore, revoke: three facts on record, the third not taken for a duplicate of the first; an
    agent unlisted and listed again is ``listed`` again."""
    first, second = _allow(tmp_path, "first.yaml", FIRST), _allow(tmp_path, "second.yaml", SECOND)
    for allow in (first, second, first, second, first):
        stop = await start_agent_collab(allow)
        await stop()
    triage = [
        (c.change, c.tools_granted, c.tools_revoked) for c in await _stored_changes(bus) if c.agent_id == "triage-bot"
    ]
    revoke, restore = ("changed", ["ask_agent"], ["notify"]), ("changed", ["notify"], ["ask_agent"])
    assert triage == [("listed", ["ask_human", "get_input", "notify"], []), revoke, restore, revoke, restore]
    old = [c.change for c in await _stored_changes(bus) if c.agent_id == "old-bot"]
    assert old == ["listed", "unlisted", "listed", "unlisted", "listed"]


async def test_replicas_starting_together_journal_a_change_once(
    bus: Bus, start_agent_collab: StartCollab, tmp_path: Path
) -> None:
    """Two replicas start at once with the same new list: each may publish the change, under one derived id, so
    the stream keeps it once."""
    first = _allow(tmp_path, "first.yaml", FIRST)
    stops = await asyncio.gather(start_agent_collab(first), start_agent_collab(first))
    for stop in stops:
        await stop()
    changes = await _stored_changes(bus)
    assert sorted((c.agent_id, c.change) for c in changes) == [("old-bot", "listed"), ("triage-bot", "listed")]
