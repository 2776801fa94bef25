"""The hosted agents' cards (PRO-2): the run-executor's agents, as the journal shows them.

agent-collab does not read the run-executor's card file (``config/agents.yaml``): the card that
matters is the one a run was actually started with, and that is what every ``run.started`` carries in
its ``agent_card`` summary (provider, model, skills, the tools offered after the allow/deny list, the
limits) -- no shared file to keep in step, no second parser of the executor's format, and the same
answer on every replica and in every deployment. The projection keeps, per agent id, the summary of
its latest-started run (KV ``agent-registry`` / ``hosted.<agent id>``, compare-and-set on the event
time, so a redelivered or out-of-order older ``run.started`` never overwrites a newer one) -- as of at
most ``refresh_s`` ago, below.

What follows from that, documented rather than hidden: an agent whose card exists but has never run is
not listed yet, and a card edited since its last run shows as it was then (``last_started_at`` says
when). A hosted agent has no conformance round: it runs inside the platform, its tools are the
platform's own; its skills are listed as the card's (``skills``), not as verified capabilities.

Written only when it says something new (a busy agent's every run used to rewrite it, racing itself across
the consumer's concurrent events): a ``run.started`` whose role and card summary are those of the stored card
(as this replica last read or wrote it), started less than ``refresh_s`` (:data:`DEFAULT_REFRESH_S`, 60 s;
0: every run writes) after the stored card's run, changes nothing. So ``last_run_id`` and
``last_started_at`` name *a* run started at most ``refresh_s`` before the agent's latest-started one (they
are rewritten at least that often while it runs), not always the latest itself; a changed role or summary is
written at once. With several replicas, each decides on the card it last read or wrote: one whose copy is
stale may skip a run whose summary another replica's newer write had replaced, so the summary shown is that
of a run started at most ``refresh_s`` before the latest (its next run after that writes again). The order
holds throughout: a write is a compare-and-set on the stored card, and an older ``run.started`` never
overwrites a newer card; a ``run.started`` older than the card this replica knows is dropped without a read
(the stored card is at least as new as that one).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import structlog
from pydantic import BaseModel, ConfigDict, ValidationError

from temporality_bus import Bus, Recent, Store, Versioned
from temporality_protocol import AgentCard, AgentSummary, Envelope, ProtocolError, RunStarted
from temporality_protocol.catalog import BUCKET_AGENTS

__all__ = ["DEFAULT_REFRESH_S", "HOSTED_PREFIX", "HostedAgent", "HostedAgents", "hosted_key"]

log = structlog.get_logger(__name__)

#: The key prefix of hosted cards in ``agent-registry`` (external agents are ``agent.<id>``).
HOSTED_PREFIX = "hosted."
#: A hosted agent id is one KV key token.
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
#: Compare-and-set attempts: every run of an agent writes its card, so busy agents race themselves.
MODIFY_ATTEMPTS = 16
#: How long a card's run may stay its latest when later runs of the agent change nothing else (seconds).
DEFAULT_REFRESH_S = 60.0
_NEVER = datetime(1970, 1, 1, tzinfo=UTC)


class HostedAgent(BaseModel):
    """KV ``agent-registry`` / ``hosted.<agent id>``: the card summary of the agent's latest-started run."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    agent_id: str
    role: str
    summary: AgentSummary
    last_run_id: str
    last_started_at: datetime


def hosted_key(agent_id: str) -> str:
    return f"{HOSTED_PREFIX}{agent_id}"


def card_of(agent: HostedAgent) -> AgentCard:
    summary = agent.summary
    return AgentCard(
        agent_id=agent.agent_id,
        kind="hosted",
        provider=summary.provider,
        model=summary.model,
        supported_tools=summary.tools,
        allowed_tools=summary.tools,
        role=agent.role,
        skills=summary.skills,
        last_run_id=agent.last_run_id,
        last_started_at=agent.last_started_at,
    )


class HostedAgents:
    """The projection; :meth:`on_run_event` from the ``agent-collab-runs`` consumer, :meth:`cards` for discovery."""

    def __init__(self, store: Store[HostedAgent], *, refresh_s: float = DEFAULT_REFRESH_S) -> None:
        if refresh_s < 0:
            raise ValueError(f"refresh_s must not be negative, not {refresh_s}")
        self._store = store
        self._refresh = timedelta(seconds=refresh_s)
        #: agent id -> what this replica last read or wrote of its card: the base of the next compare-and-set
        #: (a busy agent's every run writes it; stale after another replica's write, which then costs a read).
        self._known: Recent[Versioned[HostedAgent]] = Recent(1024)

    @classmethod
    async def open(cls, bus: Bus, *, refresh_s: float = DEFAULT_REFRESH_S) -> HostedAgents:
        return cls(await bus.store(BUCKET_AGENTS, HostedAgent), refresh_s=refresh_s)

    def _current_enough(self, stored: HostedAgent, fresh: HostedAgent) -> bool:
        """``fresh`` (a run's card) would tell nothing new over ``stored``: the same role and summary, and started
        less than the refresh interval after ``stored``'s run (or before it: an older run never replaces it)."""
        return (
            fresh.last_started_at - stored.last_started_at < self._refresh
            and stored.role == fresh.role
            and stored.summary == fresh.summary
        )

    async def on_run_event(self, event: Envelope) -> bool:
        """Project a ``run.started`` (other types are ignored); ``True`` if the card changed. An event that
        cannot be projected (no card summary, an id that is no key) is logged and skipped: the saga
        projection sharing this consumer must not be dead-lettered for it."""
        if event.type != RunStarted.EVENT_TYPE:
            return False
        try:
            data = event.payload(RunStarted)
        except (ValidationError, ProtocolError):
            return False  # not a run.started we can read: the saga projection deals with it
        if data.agent_card is None or not _ID.fullmatch(data.agent):
            log.info("hosted.not_projected", agent=data.agent[:128], has_card=data.agent_card is not None)
            return False
        fresh = HostedAgent(
            agent_id=data.agent,
            role=data.role,
            summary=data.agent_card,
            last_run_id=data.run_id,
            last_started_at=event.time,
        )

        known = self._known.get(data.agent)
        if known is not None and (
            known.value.last_started_at > fresh.last_started_at or self._current_enough(known.value, fresh)
        ):
            # the stored card is at least as new as ``known`` (an older run never replaces a newer card): older than
            # it, or nothing new as far as this replica knows -- no read, no write (see the module docstring)
            return False

        def newer(current: HostedAgent) -> HostedAgent | None:
            if current == fresh or current.last_started_at > fresh.last_started_at:
                return None
            if current.last_started_at == fresh.last_started_at and current.last_run_id >= fresh.last_run_id:
                return None  # the same instant: the larger run id wins, whatever order they come in
            if self._current_enough(current, fresh):
                return None  # written less than the refresh interval ago, and nothing else changed
            return fresh

        never = fresh.model_copy(update={"last_run_id": "", "last_started_at": _NEVER})  # older than any run
        result = await self._store.modify(
            hosted_key(data.agent),
            newer,
            create=lambda: never,
            attempts=MODIFY_ATTEMPTS,
            known=known,
        )
        if result.revision > 0:
            self._known.put(data.agent, result)
        return result.changed

    async def cards(self) -> list[AgentCard]:
        out = []
        for key in sorted(await self._store.keys()):
            if not key.startswith(HOSTED_PREFIX):
                continue
            found = await self._store.get(key)
            if found is not None:
                out.append(card_of(found.value))
        return out
