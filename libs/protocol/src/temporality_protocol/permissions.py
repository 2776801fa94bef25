"""Who may publish and subscribe where on NATS (SEC-1, AP-11), derived from the service catalogue.

Each service connects as its own NATS user. What that user may **publish** follows from its
:class:`~temporality_protocol.catalog.ServiceSpec`, never from a second hand-written list:

==================================================================  =====================================
``temporality.events.<type>``                                       each event type it ``sends``
``temporality.dlq.<durable>``                                       the dead letters of its own consumers
``$JS.API.CONSUMER.{INFO,CREATE,DURABLE.CREATE,DELETE,MSG.NEXT}``   its own durables (``consumers``):
``.<stream>.<durable>``, ``$JS.ACK.<stream>.<durable>.>``           create, read position, fetch, ack
``temporality.timers.schedule.<namespace>.>``                       its own timer namespaces (``timers``),
``$JS.API.STREAM.PURGE.TEMPORALITY_TIMERS``                         and cancelling them (a purge)
``$KV.<bucket>.>``                                                  writing the buckets it owns (``buckets``)
``$JS.API.STREAM.MSG.GET.KV_<bucket>``, ``$JS.API.DIRECT.GET...``,  reading and watching (an ephemeral
``$JS.API.CONSUMER.{CREATE,INFO,DELETE}.KV_<bucket>...``,           ordered consumer) the buckets it owns
``$JS.FC.KV_<bucket>.>``                                            or ``reads_buckets``
``$JS.API.STREAM.{INFO,CREATE,UPDATE}.<stream>``                    the layout: each service ensures the
``$JS.API.STREAM.{INFO,CREATE}.KV_<bucket>``                        three streams and every catalogue
                                                                    bucket at start (see below)
RPC subjects it ``requests``                                        asking another service
==================================================================  =====================================

and it may **subscribe** to ``_INBOX.>`` (replies, pull-consumer deliveries, KV watches) and the RPC
subjects it answers (``responders``, with ``allow_responses`` so it can reply). So the gateway cannot
publish ``human.answered`` and the run-executor cannot forge ``trigger.accepted``: the server refuses
with a permissions violation and the event never reaches the stream. A service cannot read, write or
watch another's bucket, touch another's durable, read a stream except through its own consumers, delete
or purge a stream (but the timers, for its cancels) or delete a bucket.

What is still wide, and why: the service runtime ensures the *whole* layout at every start (``Bus.ensure``
with every stream and bucket), so every service may create any catalogue bucket that does not exist yet
and read its stream info (its configuration and message counts, not its data), and create or update the
three shared streams. Once the runtime ensures only a service's own layout (``ServiceSpec.buckets`` and
the streams it uses) that can narrow too. A cancel is a purge by subject, which NATS permissions cannot
restrict to one namespace: a service with timers may purge any timer. ``_INBOX.>`` lets a service see
other clients' replies; a per-service inbox prefix (as the journal subscriber has) would close that.

A new bucket is declared in the catalogue (``ALL_BUCKETS``) *and* in the ``buckets`` of the service that
writes it (:func:`~temporality_protocol.catalog.check_services` refuses a bucket without exactly one owner);
a service that only reads another's bucket names it in ``reads_buckets``. A new durable consumer is in
``CONSUMERS`` and the service's ``consumers``. Nothing else has to be written twice.

An **external agent** (the Agent Protocol, AP-11) gets far less: it may publish only the requests of the
RPC subjects marked ``external`` (register, heartbeat, ...) and subscribe only to its reply inbox. It
cannot publish any event, touch JetStream or KV, or answer a request (:func:`external_agent_permissions`).

A **journal subscriber** (DC-6: a service outside Temporality reading every event) is read-only
(:func:`journal_subscriber_permissions`). A subscriber named ``<name>`` is the NATS user ``sub-<name>``;
it may run its own durable pull consumers on the events stream, ``sub-<name>`` (and any
``sub-<name>-<suffix>`` it is given), and nothing else. NATS permissions match whole subject tokens
(``sub-*`` is a literal, not a prefix), so each durable is granted by its exact name. What nats-py's
``js.pull_subscribe(subject, durable=..., stream=...)``, ``fetch`` and ``ack`` send (read from nats-py
2.16 and checked against nats-server 2.15 by ``tests/test_nats_permissions.py``):

=========================================================  =======================================
``$JS.API.STREAM.INFO.TEMPORALITY_EVENTS``                 ``js.stream_info`` (no other stream)
``$JS.API.CONSUMER.INFO.<stream>.<durable>``               ``pull_subscribe`` first looks it up
``$JS.API.CONSUMER.CREATE.<stream>.<durable>[.<filter>]``  ... and creates it when missing (servers
                                                           >= 2.9 put the one filter in the subject)
``$JS.API.CONSUMER.DURABLE.CREATE.<stream>.<durable>``     ``js.add_consumer(durable_name=...)``
``$JS.API.CONSUMER.DELETE.<stream>.<durable>``             dropping its own durable
``$JS.API.CONSUMER.MSG.NEXT.<stream>.<durable>``           ``fetch``
``$JS.ACK.<stream>.<durable>.>``                           ``ack`` / ``nak`` / ``in_progress`` / ``term``
=========================================================  =======================================

and it subscribes only below its own inbox prefix ``_INBOX.sub-<name>`` (nats-py
``connect(inbox_prefix=...)``; :func:`subscriber_inbox`): never ``_INBOX.>``, which would show it every
other client's replies (KV reads, fetched messages). The stream name is ``TEMPORALITY_EVENTS``, so it
never needs ``$JS.API.STREAM.NAMES`` (pass ``stream=``). It cannot publish an event, look up or touch a
service's durable, another subscriber's, any other stream or any KV bucket.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    CONSUMERS,
    DLQ_PREFIX,
    EVENTS_STREAM,
    RPCS,
    SERVICES,
    SUBSCRIBER_PREFIX,
    TIMER_SCHEDULE_PREFIX,
    TIMERS_STREAM,
    ServiceSpec,
    subject_for,
)

__all__ = [
    "SUBSCRIBER_PREFIX",
    "Permissions",
    "external_agent_permissions",
    "journal_subscriber_permissions",
    "permissions_for",
    "subscriber_inbox",
    "subscriber_user",
]

#: A subscriber's name: one subject token that is also a valid consumer name.
_SUBSCRIBER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}")


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


def _durable(stream: str, durable: str) -> list[str]:
    """A durable pull consumer's JetStream API: create (every form nats-py uses), look up, fetch, ack, delete."""
    return [
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"$JS.API.CONSUMER.DELETE.{stream}.{durable}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def _bucket_reads(bucket: str) -> list[str]:
    """Reading a bucket: gets (stream or direct) and watches/key listings (an ephemeral ordered push consumer)."""
    stream = f"KV_{bucket}"
    return [
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.*",
        f"$JS.API.CONSUMER.DELETE.{stream}.*",
        f"$JS.FC.{stream}.>",
    ]


def _layout() -> list[str]:
    """What ``Bus.ensure`` of the whole layout sends: stream info / create / update of the three streams,
    info / create of each catalogue bucket's stream (an existing bucket is never updated)."""
    grants: list[str] = []
    for stream in ALL_STREAMS:
        grants += [f"$JS.API.STREAM.{op}.{stream.name}" for op in ("INFO", "CREATE", "UPDATE")]
    for bucket in ALL_BUCKETS:
        grants += [f"$JS.API.STREAM.{op}.KV_{bucket.name}" for op in ("INFO", "CREATE")]
    return grants


def permissions_for(service: str | ServiceSpec) -> Permissions:
    """The permissions of ``service`` (a name of :data:`SERVICES` or a spec), derived from its declaration."""
    spec = SERVICES[service] if isinstance(service, str) else service
    publish: list[str] = [subject_for(t) for t in spec.sends]
    for durable in spec.consumers:
        consumer = CONSUMERS[durable]
        publish.append(f"{DLQ_PREFIX}.{durable}")
        publish += _durable(consumer.stream, durable)
    publish += [f"{TIMER_SCHEDULE_PREFIX}.{namespace}.>" for namespace in spec.timers]
    if spec.timers:
        publish.append(f"$JS.API.STREAM.PURGE.{TIMERS_STREAM.name}")  # Timers.cancel
    for bucket in spec.buckets:
        publish.append(f"$KV.{bucket}.>")
    for bucket in (*spec.buckets, *spec.reads_buckets):
        publish += _bucket_reads(bucket)
    publish += list(spec.requests)
    publish += _layout()
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


def _check_subscriber_name(name: str) -> None:
    if not _SUBSCRIBER_NAME.fullmatch(name):
        raise ValueError(f"subscriber name {name!r}: letters, digits, '_' and '-' only (at most 63), no '.', '*', '>'")


def subscriber_user(name: str) -> str:
    """The NATS user (and first durable) of the journal subscriber ``name``: ``sub-<name>``."""
    _check_subscriber_name(name)
    return f"{SUBSCRIBER_PREFIX}{name}"


def subscriber_inbox(name: str) -> str:
    """The inbox prefix the subscriber ``name`` connects with (nats-py ``inbox_prefix``): ``_INBOX.sub-<name>``."""
    return f"_INBOX.{subscriber_user(name)}"


def journal_subscriber_permissions(name: str, durables: Iterable[str] = ()) -> Permissions:
    """A read-only journal subscriber ``name`` (DC-6): its own durable pull consumers on the events stream.

    ``durables`` defaults to ``sub-<name>``; each must be ``sub-<name>`` or ``sub-<name>-<suffix>``, so two
    subscribers never share one and none is ever a service's. Raises ``ValueError`` otherwise."""
    user = subscriber_user(name)
    names = tuple(dict.fromkeys(durables)) or (user,)
    for durable in names:
        suffix = durable.removeprefix(f"{user}-")
        if durable != user and (suffix == durable or not _SUBSCRIBER_NAME.fullmatch(suffix)):
            raise ValueError(f"durable {durable!r} of subscriber {name!r} is neither {user!r} nor {user}-<suffix>")
        if durable in CONSUMERS:  # cannot happen while no service's durable starts with sub- (a test checks)
            raise ValueError(f"durable {durable!r} is a service's consumer")
    stream = EVENTS_STREAM.name
    publish = [f"$JS.API.STREAM.INFO.{stream}"]
    for durable in names:
        publish += [
            f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
            f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
            f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.>",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
            f"$JS.API.CONSUMER.DELETE.{stream}.{durable}",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
            f"$JS.ACK.{stream}.{durable}.>",
        ]
    return Permissions(publish=tuple(publish), subscribe=(f"{subscriber_inbox(name)}.>",))
