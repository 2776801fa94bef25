"""Conformance rounds (PRO-2), pure: a declared capability is unverified until the agent proved it.

No I/O here. A *round* is one short behavioural exchange: for each declared capability the protocol can
check (:data:`~temporality_protocol.events.CONFORMANCE_PROBES`: ``echo``, ``reverse``) one probe with a
fresh random challenge, and a deadline. agent-collab opens a round when an incarnation registers (its
first registration) and when a re-registration changes the declared capabilities; the round lives in
the agent's record (:attr:`~temporality_agent_collab.registry.AgentRecord.conformance`), so it is
decided once and survives restarts:

- the probes travel platform -> agent in the registration reply and in every heartbeat ack while the
  round is open (``conformance``), so a lost reply or a restarted agent gets them again;
- the agent answers, signed like every request, on ``temporality.rpc.agents.<agent id>.conformance``
  (:func:`answered`): each probe answered correctly before the deadline verifies its capability, a
  wrong answer (``wrong_answer``), a missing one (``unanswered``) or any answer after the deadline
  (``late``) fails it;
- a durable timer at the deadline (namespace ``agent-conformance``) ends a round nobody answered
  (:func:`timed_out`: every probed capability ``timeout``).

Every ended round is journaled as ``agent.conformance_checked`` (:func:`checked_event`, id derived from
agent, incarnation and round). A capability with no probe is listed ``no_probe`` and never verified: the
protocol cannot tell whether the agent can do it, and says so rather than trusting the declaration.
"""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timedelta
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from temporality_protocol import (
    CONFORMANCE_PROBES,
    AgentCapability,
    AgentConformanceChecked,
    ConformanceAnswers,
    ConformanceChallenge,
    ConformanceProbe,
    ConformanceResult,
    derive_id,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ConformanceRound",
    "ProbeRecord",
    "TimerPayload",
    "capability_views",
    "challenge",
    "checked_event_data",
    "checked_event_id",
    "correct_answer",
    "evaluate",
    "new_round",
    "round_closed_by_timer",
    "timer_payload",
]

#: The default time an agent has to answer a round's probes (``TEMPORALITY_COLLAB_CONFORMANCE_TIMEOUT_S``).
DEFAULT_TIMEOUT_S = 10.0


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ProbeRecord(_Model):
    probe_id: str
    capability: str
    challenge: str


class ConformanceRound(_Model):
    """One round of an incarnation: open while ``results`` is ``None``."""

    round: Annotated[int, Field(gt=0)]
    started_at: datetime
    deadline: datetime
    probes: list[ProbeRecord]
    results: list[ConformanceResult] | None = None
    #: When the answers came (``None``: the deadline's timer closed it).
    answered_at: datetime | None = None
    closed_at: datetime | None = None

    @property
    def open(self) -> bool:
        return self.results is None

    @property
    def passed(self) -> bool:
        return self.results is not None and all(r.verified for r in self.results)


class TimerPayload(_Model):
    """What an ``agent-conformance`` timer carries: the round it was armed for."""

    agent_id: str
    incarnation: Annotated[int, Field(gt=0)]
    round: Annotated[int, Field(gt=0)]


def timer_payload(agent_id: str, incarnation: int, round_no: int) -> bytes:
    return json.dumps({"agent_id": agent_id, "incarnation": incarnation, "round": round_no}).encode()


def correct_answer(capability: str, challenge_text: str) -> str:
    """What a conforming agent answers to a probe of ``capability`` (see CONFORMANCE_PROBES)."""
    if capability == "echo":
        return challenge_text
    if capability == "reverse":
        return challenge_text[::-1]
    raise ValueError(f"the protocol has no probe for capability {capability!r}")


def new_round(
    agent_id: str, incarnation: int, round_no: int, capabilities: list[str], *, now: datetime, timeout_s: float
) -> ConformanceRound | None:
    """A round probing every declared capability that has a probe; ``None`` when none has one."""
    probed = [c for c in dict.fromkeys(capabilities) if c in CONFORMANCE_PROBES]
    if not probed:
        return None
    probes = [
        ProbeRecord(
            probe_id=derive_id("prb", agent_id, str(incarnation), str(round_no), capability),
            capability=capability,
            challenge=secrets.token_urlsafe(12),  # a new one per round: an answer cannot be learnt in advance
        )
        for capability in probed
    ]
    return ConformanceRound(round=round_no, started_at=now, deadline=now + timedelta(seconds=timeout_s), probes=probes)


def challenge(rnd: ConformanceRound | None, now: datetime) -> ConformanceChallenge | None:
    """The open round as the agent is sent it (``None``: none open, or its deadline has passed)."""
    if rnd is None or not rnd.open or now >= rnd.deadline:
        return None
    return ConformanceChallenge(
        round=rnd.round,
        deadline=rnd.deadline,
        probes=[
            ConformanceProbe(
                probe_id=p.probe_id,
                capability=p.capability,
                challenge=p.challenge,
                expects=CONFORMANCE_PROBES[p.capability],
            )
            for p in rnd.probes
        ],
    )


def _cut(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def evaluate(rnd: ConformanceRound, body: ConformanceAnswers, now: datetime) -> ConformanceRound:
    """The open round closed by the agent's answers."""
    late = now > rnd.deadline
    given: dict[str, str] = {}
    for answer in body.answers:
        given.setdefault(answer.probe_id, answer.answer)  # the first answer to a probe counts
    results: list[ConformanceResult] = []
    for probe in rnd.probes:
        got = given.get(probe.probe_id)
        outcome: Literal["verified", "wrong_answer", "unanswered", "late"]
        if got is None:
            outcome, detail = "unanswered", f"no answer to probe {probe.probe_id}"
        elif late:
            outcome, detail = "late", f"answered {(now - rnd.deadline).total_seconds():.1f} s after the deadline"
        elif got == correct_answer(probe.capability, probe.challenge):
            outcome, detail = "verified", ""
        else:
            outcome, detail = "wrong_answer", f"expected {CONFORMANCE_PROBES[probe.capability]}, got {_cut(got)!r}"
        results.append(
            ConformanceResult(
                capability=probe.capability, verified=outcome == "verified", outcome=outcome, detail=detail
            )
        )
    return rnd.model_copy(update={"results": results, "answered_at": now, "closed_at": now})


def round_closed_by_timer(rnd: ConformanceRound, now: datetime) -> ConformanceRound:
    """The open round ended at its deadline with no answers: every probed capability ``timeout``."""
    seconds = (rnd.deadline - rnd.started_at).total_seconds()
    results = [
        ConformanceResult(
            capability=p.capability, verified=False, outcome="timeout", detail=f"no answers within {seconds:g} s"
        )
        for p in rnd.probes
    ]
    return rnd.model_copy(update={"results": results, "closed_at": now})


def capability_views(capabilities: list[str], rnd: ConformanceRound | None) -> list[AgentCapability]:
    """Each declared capability as discovery lists it: verified only by a correct, timely answer."""
    results = {r.capability: r for r in (rnd.results or [])} if rnd is not None else {}
    probed = {p.capability for p in rnd.probes} if rnd is not None else set()
    views = []
    for name in dict.fromkeys(capabilities):
        if name not in CONFORMANCE_PROBES:
            views.append(AgentCapability(name=name, status="no_probe"))
        elif rnd is None or name not in probed:
            views.append(AgentCapability(name=name, probe=name))
        elif rnd.open:
            views.append(AgentCapability(name=name, status="pending", probe=name, round=rnd.round))
        else:
            result = results[name]
            views.append(
                AgentCapability(
                    name=name,
                    verified=result.verified,
                    status="verified" if result.verified else "failed",
                    probe=name,
                    round=rnd.round,
                    checked_at=rnd.closed_at,
                    outcome=result.outcome,
                )
            )
    return views


def checked_event_data(agent_id: str, incarnation: int, rnd: ConformanceRound) -> AgentConformanceChecked:
    assert rnd.results is not None, "only an ended round is journaled"
    return AgentConformanceChecked(
        agent_id=agent_id,
        incarnation=incarnation,
        round=rnd.round,
        passed=rnd.passed,
        results=rnd.results,
        started_at=rnd.started_at,
        deadline=rnd.deadline,
        answered_at=rnd.answered_at,
    )


def checked_event_id(agent_id: str, incarnation: int, round_no: int) -> str:
    return derive_id("evt", "agent.conformance_checked", agent_id, str(incarnation), str(round_no))
