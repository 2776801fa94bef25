"""Who may publish and subscribe where on NATS (SEC-1, AP-11), derived from the service catalogue.

Each service connects as its own NATS user. What that user may **publish** follows from its
:class:`~temporality_protocol.catalog.ServiceSpec`, never from a second hand-written list:

=====================================================  ============================================
``temporality.events.<type>``                          each event type it ``sends``
``temporality.dlq.<durable>``                          the dead letters of its own consumers
``temporality.timers.schedule.<namespace>.>``          its own timer namespaces
``$JS.ACK.<stream>.<durable>.>``                       acknowledging its own consumers' messages
RPC subjects it ``requests``                           asking another service
``$JS.API.>``, ``$KV.>``                               JetStream and KV operations (see below)
=====================================================  ============================================

and it may **subscribe** to ``_INBOX.>`` (replies, pull-consumer deliveries, KV watches) and the RPC
subjects it answers (``responders``, with ``allow_responses`` so it can reply). So the gateway cannot
publish ``human.answered`` and the run-executor cannot forge ``trigger.accepted``: the server refuses
with a permissions violation and the event never reaches the stream.

Coarse on purpose, for now: every service may call the JetStream API (``$JS.API.>``: each one ensures
the whole layout at start, and reading a stream through a consumer goes through it) and write any KV
bucket (``$KV.>``). Narrowing both to the consumers and buckets each service owns is the next step
(the catalogue would have to say which buckets a service writes).

An **external agent** (the Agent Protocol, AP-11) gets far less: it may publish only the requests of the
RPC subjects marked ``external`` (register, heartbeat, ...) and subscribe only to its reply inbox. It
cannot publish any event, touch JetStream or KV, or answer a request (:func:`external_agent_permissions`).
"""

from __future__ import annotations

from dataclasses import dataclass

from temporality_protocol.catalog import (
    CONSUMERS,
    DLQ_PREFIX,
    RPCS,
    SERVICES,
    TIMER_SCHEDULE_PREFIX,
    ServiceSpec,
    subject_for,
)

__all__ = ["JETSTREAM_API", "Permissions", "external_agent_permissions", "permissions_for"]

#: The JetStream and KV API every service uses (layout, pull fetches, KV get/put/watch, direct gets).
JETSTREAM_API: tuple[str, ...] = ("$JS.API.>", "$KV.>")


@dataclass(frozen=True)
class Permissions:
    """One NATS user's permissions (``authorization.users[].permissions`` in the server config)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    #: May reply to the requests it receives (responders): a one-off publish to each request's inbox.
    allow_responses: bool = False

    def as_config(self) -> dict[str, object]:
        """The ``permissions`` block of the server's config (JSON is valid nats-server config syntax)."""
        block: dict[str, object] = {
            "publish": {"allow": list(self.publish)},
            "subscribe": {"allow": list(self.subscribe)},
        }
        if self.allow_responses:
            block["allow_responses"] = True
        return block


def permissions_for(service: str | ServiceSpec) -> Permissions:
    """The permissions of ``service`` (a name of :data:`SERVICES` or a spec), derived from its declaration."""
    spec = SERVICES[service] if isinstance(service, str) else service
    publish: list[str] = [subject_for(t) for t in spec.sends]
    for durable in spec.consumers:
        consumer = CONSUMERS[durable]
        publish.append(f"{DLQ_PREFIX}.{durable}")
        publish.append(f"$JS.ACK.{consumer.stream}.{durable}.>")
    publish += [f"{TIMER_SCHEDULE_PREFIX}.{namespace}.>" for namespace in spec.timers]
    publish += list(spec.requests)
    publish += JETSTREAM_API
    subscribe = ["_INBOX.>", *spec.responders]
    return Permissions(
        publish=tuple(dict.fromkeys(publish)),
        subscribe=tuple(dict.fromkeys(subscribe)),
        allow_responses=bool(spec.responders),
    )


def external_agent_permissions() -> Permissions:
    """An external agent's NATS user: the requests of every ``external`` RPC subject, replies on its inbox."""
    return Permissions(
        publish=tuple(spec.subject for spec in RPCS.values() if spec.external),
        subscribe=("_INBOX.>",),
    )
