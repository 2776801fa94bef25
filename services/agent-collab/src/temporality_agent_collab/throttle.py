"""How much one external agent may ask of agent-collab, and how much of it reaches the journal.

Two limits, both per agent and per agent-collab replica (each replica counts what it serves; N replicas take
up to N times the rate), both in memory (a restart forgets them: they bound a flood, they are not state):

**Requests.** Every Agent Protocol request takes a token from its agent's bucket before anything else is done
with it (before the signature check, the nonce store, the record): ``TEMPORALITY_COLLAB_AGENT_RATE_PER_S``
tokens a second, at most ``TEMPORALITY_COLLAB_AGENT_RATE_BURST`` saved up. The agent is the one its subject
names (``temporality.rpc.agents.<agent id>.<operation>``): NATS permissions say who may send there. A request
with no token left is refused at once, ``rate_limited``, with ``retry_after_s`` (when the next token comes);
nothing else happens to it. Refused requests are counted in ``temporality_collab_agent_requests_limited_total``
(by operation) and journaled as one ``agent.message_refused`` (reason ``rate_limited``) per agent and window,
then one more with the window's total (``count``) when it ends.

**Refusals in the journal.** Refused registrations (``agent.registration_refused``) and refused messages
(``agent.message_refused``) are journaled one by one up to ``TEMPORALITY_COLLAB_REFUSALS_JOURNALED`` per agent,
reason and window (``TEMPORALITY_COLLAB_AUDIT_WINDOW_S``), as before; past that they are only counted, and one
event with their number (``count``, ``window_s``) follows when the window ends -- like the access refusals of
:mod:`temporality_service.audit`. At most :data:`MAX_AGENTS` agents per window get events of their own; the
refusals of any further agent in that window are counted under agent ``*``. Totals are published in the
background (best effort: a failed publish is logged, ``agent.refusal_total_unpublished``); their ids derive from
(this process, kind, agent, reason, window), so a republish is deduplicated and replicas never collide.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import structlog
from prometheus_client import Counter

from temporality_bus import Bus
from temporality_protocol import Envelope, derive_id
from temporality_service.audit import Windowed

__all__ = ["MAX_AGENTS", "MAX_BUCKETS", "OVERFLOW", "Throttle", "TokenBuckets", "operation_of"]

log = structlog.get_logger(__name__)

#: Agents with tallies of their own per kind and window; refusals of more are counted under :data:`OVERFLOW`.
MAX_AGENTS = 100
OVERFLOW = "*"
#: Token buckets kept at most (full ones are dropped first: an agent with a full bucket loses nothing).
MAX_BUCKETS = 10_000

#: Builds a window's total: (agent or ``*``, refusals it stands for, window seconds, event id) -> the event.
TotalOf = Callable[[str, int, int, str], Envelope]


def operation_of(subject: str) -> str:
    """``register`` of ``temporality.rpc.agents.<agent id>.register`` (``tasks.poll`` of a task subject)."""
    parts = subject.split(".")
    return ".".join(parts[4:])[:64] if len(parts) > 4 else ""


@dataclass
class TokenBuckets:
    """A token bucket per key, pure (the caller passes the monotonic time). ``rate_per_s`` 0: no limit."""

    rate_per_s: float
    burst: int
    max_buckets: int = MAX_BUCKETS
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)  # key -> (tokens, at)

    def take(self, key: str, now: float) -> float:
        """0.0 when ``key`` may go ahead (a token taken), else the seconds until its next token."""
        if self.rate_per_s <= 0:
            return 0.0
        tokens, at = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate_per_s)
        if tokens >= 1.0:
            self._set(key, tokens - 1.0, now)
            return 0.0
        self._set(key, tokens, now)
        return (1.0 - tokens) / self.rate_per_s

    def _set(self, key: str, tokens: float, now: float) -> None:
        if key not in self._buckets and len(self._buckets) >= self.max_buckets:
            full = [k for k, (t, at) in self._buckets.items() if t + (now - at) * self.rate_per_s >= self.burst]
            for k in full or list(self._buckets)[: self.max_buckets // 2]:
                del self._buckets[k]
        self._buckets[key] = (tokens, now)


@dataclass
class _Tally:
    total: TotalOf
    count: int = 0
    journaled: int = 0


@dataclass
class Throttle(Windowed):
    """The request limit and the journal's limit on refusals (module docstring). One per process."""

    TICKS_PER_WINDOW: ClassVar[int] = 8
    MIN_TICK_S: ClassVar[float] = 0.5

    bus: Bus
    rate_per_s: float
    burst: int
    window_s: int = 60
    refusals_journaled: int = 10
    max_agents: int = MAX_AGENTS
    limited_counter: Counter | None = None
    service: str = "agent-collab"
    monotonic: Callable[[], float] = time.monotonic
    clock: Callable[[], float] = time.time
    _buckets: TokenBuckets = field(init=False)
    _window: int = -1
    #: kind -> (agent, reason) -> tally of the current window
    _tallies: dict[str, dict[tuple[str, str], _Tally]] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _instance: str = field(default_factory=lambda: secrets.token_hex(6))

    def __post_init__(self) -> None:
        self._buckets = TokenBuckets(self.rate_per_s, self.burst)

    # ------------------------------------------------------------------ requests
    def admit(self, agent: str) -> float:
        """0.0: ``agent``'s request may go ahead; else it is over the limit, retry after that many seconds."""
        return self._buckets.take(agent, self.monotonic())

    def describe(self) -> str:
        return f"{self.rate_per_s:g} requests a second, bursts of {self.burst}"

    async def limited(self, agent: str, subject: str, first: Envelope, total: TotalOf) -> None:
        """One request refused ``rate_limited``: counted; journaled once per agent and window, then as a total."""
        if self.limited_counter is not None:
            self.limited_counter.labels(self.service, operation_of(subject)).inc()
        try:
            await self.journal("rate", agent, "rate_limited", first, total, allowance=1)
        except Exception as exc:  # the refusal is replied either way; its summary is best effort
            log.warning("agent.rate_limit_unjournaled", agent_id=agent, error=repr(exc))

    # ------------------------------------------------------------------ refusals into the journal
    async def journal(
        self, kind: str, agent: str, reason: str, event: Envelope, total: TotalOf, *, allowance: int | None = None
    ) -> None:
        """Publish ``event`` if ``agent`` has had fewer than the allowance of ``kind``/``reason`` refusals in this
        window; otherwise count it (the window's total goes out when it ends). A failed publish raises."""
        allowed = self.refusals_journaled if allowance is None else allowance
        self._roll()
        tallies = self._tallies.setdefault(kind, {})
        key = (agent, reason)
        if key not in tallies and len(tallies) >= self.max_agents:
            key = (OVERFLOW, reason)
        tally = tallies.setdefault(key, _Tally(total))
        tally.count += 1
        if tally.journaled < allowed and key[0] != OVERFLOW:
            tally.journaled += 1
            await self.bus.publish(event)

    def _close_window(self) -> None:
        """Publish the totals of the window that ended (the refusals not journaled one by one)."""
        for kind, tallies in self._tallies.items():
            for (agent, reason), tally in tallies.items():
                left = tally.count - tally.journaled
                if left <= 0:
                    continue
                event_id = derive_id("evt", "agent-refusals", self._instance, kind, agent, reason, str(self._window))
                self._in_background(self._send(tally.total(agent, left, self.window_s, event_id)))
        self._tallies = {}

    async def _send(self, event: Envelope) -> None:
        try:
            await self.bus.publish(event)
        except Exception as exc:
            log.warning("agent.refusal_total_unpublished", ce_id=event.id, type=event.type, error=repr(exc))

    def _loop_name(self) -> str:
        return "agent-collab-throttle"
