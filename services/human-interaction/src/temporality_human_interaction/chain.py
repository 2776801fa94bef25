"""The timeout policy's chain (HUM-8): reminders, an escalation, then the terminal step at the deadline.

The policy (``HumanPolicy.on_timeout``, from the trigger, never from an adapter) is fixed in the
request record, so the chain is a pure function of the record (:func:`plan`)::

    created_at ── reask 1 ── reask 2 … reask max ── escalate ────────── expires_at: fail | default | cancel
               every_s    every_s             after_s

Reminder ``n`` is due at ``created_at + n * every_s``; the escalation ``after_s`` after the last
reminder (after the question, without reminders). The terminal step is the request's deadline
(``expires_at``: the agent's timeout, capped by the trigger's ``max_timeout_s``), which the person
sees in the question; a step that would fall at or after it is never taken (the deadline wins).

**Where the request is in the chain** is ``record.chain_done`` (how many steps are done). Each step
is one durable timer (``…schedule.human.<id>.chain``, payload ``{"request_id", "step"}``), armed
only once the previous step (or the question's delivery) is committed: :func:`arm_next_step`.
:class:`ChainRunner` takes a step when its timer fires, deciding from the stored record only:

* the request is no longer pending (answered, expired, cancelled), or ``chain_done`` is already past
  the step (a redelivered or duplicated firing): nothing happens;
* the step is not due yet (a timer that fired early): its timer is armed again at the due time;
* otherwise: the sends (each recorded in ``deliveries`` with the step's ``tag``, one compare-and-set
  per person: a redelivery after a crash skips whoever already got it), then ``human.reasked`` /
  ``human.escalated`` (deterministic ids: a repeat is deduplicated), then ``chain_done`` moves on
  (compare-and-set, only from this step), then the next step's timer.

A **reminder** sends the question again, as a new message with a ``🔔 Reminder n of max`` line (a
new message notifies the person; an edit would not), to each person first asked (the recipient or
the group's members), along their profile (:func:`.delivery.deliver_along`). An **escalation**
first records the target in the request (``escalated_to`` and, for a group, its current members in
``escalation_members``: from then on they may answer too, and the original recipient still may), then
sends them the question with a ``↪ Forwarded to you`` line. Every copy is in ``deliveries``, so the
first valid answer edits them all (the group machinery of :mod:`.inbound`). A send no channel could
carry is reported in the event's ``failed_attempts`` and the chain moves on: the deadline still comes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

import structlog

from temporality_bus import Bus, NotFound, TransientError, evolve
from temporality_human_interaction.channels import ChannelAdapter, DeliveryReceipt
from temporality_human_interaction.delivery import deliver_along
from temporality_human_interaction.directory import Directory, group_id_of, recipient_for, user_id_of
from temporality_human_interaction.events import escalated_event, reasked_event
from temporality_human_interaction.inbox import index_people
from temporality_human_interaction.records import HumanRequestRecord, RequestStore, SentCopy
from temporality_human_interaction.timers import arm_chain_step
from temporality_protocol.events import MAX_TEXT, DeliveryAttempt, TimeoutPolicy

__all__ = ["ChainRunner", "Step", "arm_next_step", "configured_steps", "next_step", "plan"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Step:
    """One step of a request's chain: its position, what it does and when it is due."""

    index: int
    kind: Literal["reask", "escalate"]
    at: datetime
    #: The reminder's number (1-based) and how many there are; 0 for the escalation.
    attempt: int = 0
    of: int = 0

    @property
    def tag(self) -> str:
        """The tag of the copies this step sends (:attr:`.records.SentCopy.tag`)."""
        return f"reask-{self.attempt}" if self.kind == "reask" else "escalation"


def plan(record: HumanRequestRecord) -> list[Step]:
    """The steps of ``record``'s chain that fall before its deadline, in order (pure: from the record only)."""
    policy = record.policy.on_timeout
    steps: list[Step] = []
    at = record.created_at
    if policy.renotify is not None:
        for n in range(1, policy.renotify.max + 1):
            at += timedelta(seconds=policy.renotify.every_s)
            steps.append(Step(len(steps), "reask", at, attempt=n, of=policy.renotify.max))
    if policy.escalate is not None:
        at += timedelta(seconds=policy.escalate.after_s)
        steps.append(Step(len(steps), "escalate", at))
    return [s for s in steps if s.at < record.expires_at]  # times only grow: a prefix


def configured_steps(policy: TimeoutPolicy) -> int:
    """How many steps ``policy``'s chain has before the terminal one, whatever the deadline."""
    return (policy.renotify.max if policy.renotify is not None else 0) + (1 if policy.escalate is not None else 0)


def next_step(record: HumanRequestRecord) -> Step | None:
    """The step the chain of ``record`` takes next, if any is left before the deadline."""
    steps = plan(record)
    return steps[record.chain_done] if record.chain_done < len(steps) else None


async def arm_next_step(bus: Bus, record: HumanRequestRecord) -> None:
    """Arm the timer of the chain's next step (deduplicated per step: safe to repeat)."""
    step = next_step(record)
    if step is None or not record.pending:
        return
    result = await arm_chain_step(bus, record.request_id, step.index, step.at)
    log.info("chain.step_armed", step=step.index, kind=step.kind, at=step.at.isoformat(), duplicate=result.duplicate)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class ChainRunner:
    """Takes the chain's steps when their timers fire (called by :class:`.deadlines.DeadlineHandler`)."""

    def __init__(self, bus: Bus, directory: Directory, adapters: Mapping[str, ChannelAdapter]) -> None:
        self._bus = bus
        self._directory = directory
        self._adapters = adapters

    async def take(self, store: RequestStore, record: HumanRequestRecord, step: Step) -> None:
        """Take ``step`` of a pending ``record`` whose ``chain_done`` is at it and that is due."""
        with structlog.contextvars.bound_contextvars(step=step.index, kind=step.kind):
            if step.kind == "escalate":
                escalated = await self._escalate(store, record)
                if escalated is None:
                    return
                record = escalated
                people, banner = record.escalation_members, self._forwarded_banner(record)
            else:
                people = record.asked()
                banner = f"🔔 Reminder {step.attempt} of {step.of}: still waiting for your answer."
            record, channels, failed = await self._send(store, record, people, step, banner)
            if step.kind == "escalate":
                event = escalated_event(record, channels=channels, failed=failed)
            else:
                event = reasked_event(record, attempt=step.attempt, of=step.of, channels=channels, failed=failed)
            result = await self._bus.publish(event)
            log.info("chain.step_taken", channels=channels, failed=len(failed), duplicate=result.duplicate)
            done = await self._advance(store, record.request_id, step)
            await arm_next_step(self._bus, done)

    def _forwarded_banner(self, record: HumanRequestRecord) -> str:
        user_id = user_id_of(record.recipient)
        profile = self._directory.get(user_id) if user_id is not None else None
        group = self._directory.group(group_id_of(record.recipient) or "") if profile is None else None
        who = profile.display_name if profile else (group.display_name if group else record.recipient)
        return f"↪ Forwarded to you: {who} has not answered yet (either of you may answer)."

    def _targets(self, to: str) -> list[str]:
        """The people behind the escalation target as the directory stands now (``user:<id>``)."""
        group_id = group_id_of(to)
        if group_id is None:
            return [to]
        group = self._directory.group(group_id)
        return [recipient_for(m) for m in group.members] if group is not None else []

    async def _escalate(self, store: RequestStore, record: HumanRequestRecord) -> HumanRequestRecord | None:
        """Record the escalation target (before anything is sent, so an instant answer binds); None: not pending."""
        escalate = record.policy.on_timeout.escalate
        assert escalate is not None  # plan() has an escalation step only then
        members = self._targets(escalate.to)
        await index_people(self._bus, record, [escalate.to, *members])  # listed before it binds

        def mark(current: HumanRequestRecord) -> HumanRequestRecord | None:
            if not current.pending or current.escalated_to is not None:
                return None
            return evolve(current, escalated_to=escalate.to, escalation_members=members)

        current = await self._modify(store, record.request_id, mark)
        if not current.pending:
            log.info("chain.answered_meanwhile", status=current.status.value)
            return None
        return current

    async def _send(
        self, store: RequestStore, record: HumanRequestRecord, people: list[str], step: Step, banner: str
    ) -> tuple[HumanRequestRecord, list[str], list[DeliveryAttempt]]:
        """Send the step to each of ``people`` not sent it yet; the record as updated, channels, failures."""
        channels: list[str] = []
        failed: list[DeliveryAttempt] = []
        for person in people:
            if not record.pending:
                break  # answered meanwhile: nobody else needs it
            existing = record.sent(person, step.tag)
            if existing is not None:
                channels.append(existing.channel)
                continue
            user_id = user_id_of(person)
            profile = self._directory.get(user_id) if user_id is not None else None
            if profile is None:
                failed.append(DeliveryAttempt(channel="none", error=f"{person}: not in the user directory"))
                continue
            try:
                receipt, failures = await deliver_along(self._adapters, record, profile, banner=banner, tag=step.tag)
            except TransientError as exc:
                failed.append(DeliveryAttempt(channel="none", error=f"{person}: {exc}"[:MAX_TEXT]))
                continue
            failed += [DeliveryAttempt(channel=f.channel, error=f"{person}: {f.error}"[:MAX_TEXT]) for f in failures]
            record = await self._record_copy(store, record.request_id, receipt, person, step.tag)
            channels.append(receipt.channel)
        return record, channels, failed

    async def _record_copy(
        self, store: RequestStore, key: str, receipt: DeliveryReceipt, person: str, tag: str
    ) -> HumanRequestRecord:
        copy = SentCopy(
            channel=receipt.channel,
            reference=receipt.reference or key,
            address=receipt.address,
            sent_at=_utcnow(),
            recipient=person,
            tag=tag,
        )

        def add(current: HumanRequestRecord) -> HumanRequestRecord | None:
            if current.sent(person, tag) is not None:
                return None
            return evolve(current, deliveries=[*current.deliveries, copy])

        return await self._modify(store, key, add)

    async def _advance(self, store: RequestStore, key: str, step: Step) -> HumanRequestRecord:
        """``chain_done`` past ``step`` (only from it: a racing duplicate moves it once)."""

        def advance(current: HumanRequestRecord) -> HumanRequestRecord | None:
            if current.chain_done != step.index:
                return None
            return evolve(current, chain_done=step.index + 1)

        return await self._modify(store, key, advance)

    @staticmethod
    async def _modify(
        store: RequestStore, key: str, fn: Callable[[HumanRequestRecord], HumanRequestRecord | None]
    ) -> HumanRequestRecord:
        try:
            return (await store.modify(key, fn)).value
        except NotFound:  # pragma: no cover - requests are never deleted
            raise TransientError(f"request {key} vanished") from None
