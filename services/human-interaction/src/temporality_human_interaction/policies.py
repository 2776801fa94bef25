"""human-interaction's own projection of each run's policy (SEC-1).

Whom a run may ask (``allowed_recipients``) and what its timeout policy does (reminders, the escalation
target, the terminal step) come from the run's ``run.requested`` — published by the trigger-gateway from
the trigger's configuration, or by agent-collab for a relay run (nobody to ask) — never from the copy
the run-executor puts into ``human.requested`` / ``human.notify_requested``: a compromised or buggy
executor must not be able to widen whom a run may ask.

The ``human-interaction-policies`` consumer (:class:`RunPolicyHandler`) stores each ``run.requested``'s
``human`` policy under ``policy.<run id>`` in the ``human-channels`` bucket -- unless it allows nobody (a relay
run of agent-collab: no write, :func:`asks_nobody`) --, create-if-absent (the first
``run.requested`` of a run to be stored wins -- the consumer handles several at once, so of two different ones
for the same run, which only a trigger edited between two deliveries of its event makes, that need not be the
first in stream order; a redelivery is a no-op). The request and notification handlers look it
up (:meth:`RunPolicies.get`: from the replica's mirror of the bucket when it holds the key -- a policy, once
stored, never changes --, else from the bucket) and use it *instead of* the event's copy. The two streams are not ordered
against each other, so a ``human.requested`` may arrive before its run's policy is stored: the handler
waits for it at its first delivery (it is usually being stored that moment): up to :data:`FIRST_WAIT_S` for the
replica's mirror to deliver it (woken by the watch, no read meanwhile), then one read of the bucket (without a
running watch: a few looks in the bucket within 0.1 s, :data:`FIRST_LOOKS_S`), then raises :class:`~temporality_bus.TransientError` (nak with the consumer's backoff) until
:attr:`RunPolicies.wait_deliveries` deliveries have seen no policy, and then refuses the request
(``human.rejected``, ``recipient_not_allowed``, the detail says no policy is known for the run) -- unless
the policies consumer has messages pending then (it is catching up, e.g. after an outage with a backlog of
``run.requested``): :class:`PolicyPending`, and the request is parked on durable timers until the policy
comes or the request's deadline passes, however long that is (:mod:`.parking`).
"""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
import structlog

from temporality_bus import Bus, Delivery, TransientError
from temporality_human_interaction.channels.refs import ChannelRefs, ref_key
from temporality_human_interaction.mirror import ChannelMirror
from temporality_human_interaction.parking import arm_wake, parked_ids, parked_of_run
from temporality_protocol import Envelope, HumanPolicy, RunRequested
from temporality_protocol.catalog import CONSUMERS

__all__ = [
    "DEFAULT_WAIT_DELIVERIES",
    "FIRST_LOOKS_S",
    "FIRST_WAIT_S",
    "PolicyPending",
    "PolicyUnknown",
    "RunPolicies",
    "RunPolicyHandler",
    "asks_nobody",
    "policy_key",
]

log = structlog.get_logger(__name__)

#: How many deliveries of a ``human.requested`` wait for its run's policy (backoff 0.5, 1, 2, 5 s: ~8.5 s).
DEFAULT_WAIT_DELIVERIES = 5
#: At a request's first delivery, the pauses before looking for its run's policy again, before the retry (a nak:
#: the consumer's backoff, 0.5 s first). The policies consumer handles ``run.requested`` while the run starts, so
#: a ``human.requested`` of a run's first turn can arrive as its policy is being stored: about 4 % of the
#: questions at 20 runs starting at once (bench/human_loop.py) waited the 0.5 s for it.
FIRST_LOOKS_S = (0.01, 0.03, 0.06)
#: At a request's first delivery, how long it waits for its run's policy to reach this replica's mirror (woken by
#: the watch's delivery of it: no read meanwhile) before one read of the bucket and the retry (a nak: 0.5 s first).
#: Under load (bench/pipeline.py, 400 webhooks at once) most questions arrived before their policy was mirrored:
#: the looks of :data:`FIRST_LOOKS_S` read the bucket ~2.4 times per question and ~15 % waited for the retry.
FIRST_WAIT_S = 0.25
#: The consumer projecting ``run.requested``; while it lags, a request is parked instead of refused.
POLICIES_CONSUMER = "human-interaction-policies"


def policy_key(run_id: str) -> str:
    return ref_key("policy", run_id)


def asks_nobody(claimed: HumanPolicy) -> bool:
    """Whether the policy a ``human.requested`` / ``human.notify_requested`` carries lets its run ask nobody: refused
    then without looking the run's policy up (the copy may narrow what the run may do, never widen it). No policy
    is stored for such a run (:class:`RunPolicyHandler`): a lookup would wait, retry and refuse only in the end."""
    return not claimed.allowed_recipients


class PolicyUnknown(Exception):
    """No ``run.requested`` was seen for the run, and the wait for it is over: refuse."""


class PolicyPending(Exception):
    """No policy yet, and the projection is behind (it may still come): park the request (:mod:`.parking`)."""

    def __init__(self, run_id: str, behind: int) -> None:
        super().__init__(f"no policy for run {run_id} yet; the projection is {behind} events behind")
        self.behind = behind


class RunPolicies:
    """Read and write the projection (``policy.<run id>`` in ``human-channels``)."""

    def __init__(
        self,
        bus: Bus,
        *,
        wait_deliveries: int = DEFAULT_WAIT_DELIVERIES,
        first_looks_s: tuple[float, ...] = FIRST_LOOKS_S,
        first_wait_s: float = FIRST_WAIT_S,
        mirror: ChannelMirror | None = None,
    ) -> None:
        self.bus = bus
        #: ``human-channels`` as this replica's watch sees it: a policy it holds is not read from the bucket
        #: (a policy key is written once, create-if-absent, and never changed: a mirrored one is the stored one).
        self._mirror = mirror
        self._bus = bus
        self._refs = ChannelRefs(bus)
        self.wait_deliveries = wait_deliveries
        self.first_looks_s = first_looks_s
        self.first_wait_s = first_wait_s

    @property
    def mirror(self) -> ChannelMirror | None:
        return self._mirror

    async def record(self, run_id: str, policy: HumanPolicy) -> HumanPolicy:
        """Store ``policy`` for ``run_id`` unless one is stored; returns the stored one."""
        return (await self.record_at(run_id, policy))[0]

    async def record_at(self, run_id: str, policy: HumanPolicy) -> tuple[HumanPolicy, int | None]:
        """:meth:`record`, with the revision this call stored it at (None: one was stored already)."""
        revision = await self._refs.create(policy_key(run_id), policy.model_dump_json())
        if revision is not None:
            return policy, revision
        stored = await self._refs.claim(policy_key(run_id), policy.model_dump_json())
        return HumanPolicy.model_validate_json(stored), None

    async def lookup(self, run_id: str) -> HumanPolicy | None:
        """The run's stored policy: the mirror's copy when it has one and its watch runs (a watch that is down
        keeps a policy the sweep has purged since), else read from the bucket."""
        mirrored = None
        if self._mirror is not None:
            try:
                await self._mirror.check()
            except Exception:
                mirrored = None
            else:
                mirrored = self._mirror.get(policy_key(run_id))
        raw = mirrored.value if mirrored is not None else await self._refs.get(policy_key(run_id))
        return HumanPolicy.model_validate_json(raw) if raw is not None else None

    async def get(self, run_id: str, delivery: Delivery | None) -> HumanPolicy:
        """The run's projected policy. Not there yet: TransientError (retry later) for ``wait_deliveries``
        deliveries, then :class:`PolicyPending` while the projection is behind, else :class:`PolicyUnknown`.
        Without a ``delivery`` (a direct call, a parked request taken in) there is no retry: PolicyUnknown."""
        seen = delivery.num_delivered if delivery is not None else self.wait_deliveries
        watched = False
        if seen == 1:  # usually the policy is being stored this very moment: wait for the watch to deliver it
            policy, watched = await self._appears(run_id)
            if policy is not None:
                return policy
        policy = await self.lookup(run_id)  # from the bucket (the mirror lacks it): what decides the retry
        if policy is not None:
            return policy
        if seen == 1 and not watched:  # no mirror's watch to wait on: look again a few times before a retry
            for pause_s in self.first_looks_s:
                await asyncio.sleep(pause_s)
                if (policy := await self.lookup(run_id)) is not None:
                    return policy
        if seen < self.wait_deliveries:
            log.info("policy.not_yet_known", run_id=run_id, delivery=seen, of=self.wait_deliveries)
            raise TransientError(f"no run.requested seen yet for run {run_id} (delivery {seen})")
        if delivery is not None and (behind := await self._policies_behind()):
            log.info("policy.projection_catching_up", run_id=run_id, delivery=seen, pending=behind)
            raise PolicyPending(run_id, behind)
        raise PolicyUnknown(
            f"human-interaction has no policy for run {run_id}: its run.requested was not seen "
            f"(waited {seen} deliveries), so nobody may be asked"
        )

    async def _appears(self, run_id: str) -> tuple[HumanPolicy | None, bool]:
        """At a request's first delivery: the policy as the mirror's watch delivers it, waited for up to
        :attr:`first_wait_s` -- woken by the watch's delivery, no read of the bucket meanwhile -- and whether the
        watch ran (else :meth:`get` looks in the bucket a few times, :attr:`first_looks_s`). None: none delivered
        by then (:meth:`get` reads the bucket once before the retry: the mirror may be behind)."""
        if self._mirror is None:
            return None, False
        try:
            await self._mirror.check()
        except Exception:
            return None, False
        entry = await self._mirror.appears(policy_key(run_id), self.first_wait_s)
        return (HumanPolicy.model_validate_json(entry.value) if entry is not None else None), True

    async def _policies_behind(self) -> int:
        """Messages the policies consumer has not settled yet (0: caught up, or it cannot be told)."""
        spec = CONSUMERS[POLICIES_CONSUMER]
        try:
            info = await self._bus.js.consumer_info(spec.stream, spec.durable)
        except (nats.js.errors.NotFoundError, nats.errors.Error, TimeoutError):
            return 0  # no such durable (it never ran) or no answer: the bound applies as it is
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)


class RunPolicyHandler:
    """The ``human-interaction-policies`` consumer's handler: ``run.requested`` -> the projection, then the
    requests parked for it are woken (:mod:`.parking`)."""

    def __init__(self, policies: RunPolicies) -> None:
        self._policies = policies

    async def handle(self, event: Envelope, delivery: Delivery | None = None) -> None:
        payload = event.payload(RunRequested)  # invalid data -> ProtocolError -> dead-lettered
        if not payload.human.allowed_recipients:
            # Nobody may be asked (a relay run of agent-collab, a trigger that names nobody): nothing stored, no write.
            # Its requests and notifications carry a copy that allows nobody and are refused at once (:func:`asks_nobody`);
            # one whose copy claims somebody finds no policy and is refused as for a run never seen (or parked, then
            # refused at its deadline): never widened.
            log.info("policy.nobody_to_ask", run_id=payload.run_id)
            return
        stored, revision = await self._policies.record_at(payload.run_id, payload.human)
        if stored != payload.human:
            log.warning("policy.kept_first", run_id=payload.run_id, event_id=event.id)
        else:
            log.info("policy.recorded", run_id=payload.run_id, allowed=payload.human.allowed_recipients)
        # after the policy is stored: a request parking now sees it, one parked before is listed here
        for request_id in await self._parked(payload.run_id, revision):
            await arm_wake(self._policies.bus, payload.run_id, request_id, cause=event.id)
            log.info("policy.parked_request_woken", run_id=payload.run_id, request_id=request_id)

    async def _parked(self, run_id: str, stored_at: int | None) -> list[str]:
        """The requests parked under ``run_id``: from the mirror once it has applied the policy this call stored
        (``stored_at``, its revision) -- one parked before it is then in the mirror, one parked after it finds
        the policy (a parker that does not find it in its mirror reads the bucket) --, else listed from the
        bucket (:func:`.parking.parked_of_run`)."""
        mirror = self._policies.mirror
        if stored_at is None or mirror is None or not await mirror.reached(stored_at):
            return await parked_of_run(self._policies.bus, run_id)
        return parked_ids(mirror.children(ref_key("parked", run_id)))
