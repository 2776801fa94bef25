"""Who may publish and subscribe where on NATS (SEC-1, AP-11), derived from the service catalogue.

Each service connects as its own NATS user. What that user may **publish** follows from its
:class:`~temporality_protocol.catalog.ServiceSpec`, never from a second hand-written list:

==================================================================  =====================================
``temporality.events.<type>``                                       each event type it ``sends``
``temporality.dlq.<durable>``                                       the dead letters of its own consumers
``$JS.API.CONSUMER.{INFO,CREATE,DURABLE.CREATE,DELETE,MSG.NEXT}``   its own durables (``consumers``):
``.<stream>.<durable>``, ``$JS.ACK.<stream>.<durable>.>``           create, read position, fetch, ack
``temporality.timers.schedule.<namespace>.>``                       its own timer namespaces (``timers``):
                                                                    arming and cancelling them, in its own
                                                                    timers stream
``$KV.<bucket>.>``                                                  writing the buckets it owns (``buckets``)
``$JS.API.STREAM.MSG.GET.KV_<bucket>``, ``$JS.API.DIRECT.GET...``,  reading and watching (an ephemeral
``$JS.API.CONSUMER.{CREATE,INFO,DELETE}.KV_<bucket>...``,           ordered consumer) the buckets it owns
``$JS.FC.KV_<bucket>.>``                                            or ``reads_buckets``
``$JS.API.STREAM.{INFO,CREATE,UPDATE}.<stream>``                    the layout: the streams it owns
``$JS.API.STREAM.{INFO,CREATE,UPDATE}.KV_<bucket>``                 (``streams``, its timers stream among
                                                                    them) and its buckets; only
``$JS.API.STREAM.INFO.<stream>`` / ``.KV_<bucket>``                 *info* of the streams it merely uses
                                                                    (``uses_streams``) and ``reads_buckets``
RPC subjects it ``requests``                                        asking another service
==================================================================  =====================================

and it may **subscribe** only below its own inbox prefix, ``_INBOX.<service>.>`` (:func:`service_inbox`;
the runtime connects with nats-py ``connect(inbox_prefix=...)``: its requests' replies, JetStream API
answers, pull-consumer deliveries and KV watches arrive there), and to the RPC subjects it answers
(``responders``). A responder replies to the requester's own inbox (``_INBOX.<other>.…``), which it may not
publish to in general: ``allow_responses`` is the NATS feature for exactly this, one reply to each request
it received, so a responder can answer but not write into another client's inbox unasked. So the gateway
cannot publish ``human.answered`` and the run-executor cannot forge ``trigger.accepted``: the server refuses
with a permissions violation and the event never reaches the stream. A service cannot read, write or
watch another's bucket, touch another's durable, read a stream except through its own consumers, delete
or purge a stream or delete a bucket, create or reconfigure a stream or
bucket it does not own, or read another client's replies.

Who owns the layout: each bucket's owner (``ServiceSpec.buckets``) creates it; the shared streams (events,
dead letters) are the journal's (``ServiceSpec.streams``): it creates and updates them, so its
``TEMPORALITY_NATS_EVENTS_MAX_AGE_DAYS`` and ``_STREAM_REPLICAS`` decide them. Each service with timers owns
its own timers stream, ``TEMPORALITY_TIMERS_<SERVICE>`` (:data:`~temporality_protocol.catalog.TIMERS_STREAMS`,
holding only its namespaces' schedule and fired subjects). A service started before the
owner waits, not ready, until the stream exists (``temporality_service.runtime``; without a NATS user, where
nothing is enforced, it creates a missing one instead, never changing an existing one). A timer is cancelled
by a publish to its own schedule subject (``temporality_bus.Timers.cancel``), never by a purge: a purge's
filter is in its payload, which NATS permissions cannot restrict, so no service has a purge right. Message
schedules act inside one stream (ADR-51): a schedule fires only onto a subject of its own stream, and the
"atomic stop" (a publish naming another schedule in ``Nats-Scheduler`` with ``Nats-Schedule-Next: purge``)
purges only a schedule of the stream it lands in. With every service's timers in a stream of its own, and only
its own stream's API granted, no service can stop, replace, fire or purge another's timer
(``tests/test_timer_isolation.py``; docs/operations.md, "Timers: one stream per service").

A new bucket is declared in the catalogue (``ALL_BUCKETS``) *and* in the ``buckets`` of the service that
writes it (:func:`~temporality_protocol.catalog.check_services` refuses a bucket without exactly one owner);
a service that only reads another's bucket names it in ``reads_buckets``. A new durable consumer is in
``CONSUMERS`` and the service's ``consumers``. Nothing else has to be written twice.

An **external agent** (the Agent Protocol, AP-11) gets far less. Its NATS user is its agent id, and it may
publish only the requests of the RPC subjects marked ``external`` on its *own* subjects,
``temporality.rpc.agents.<agent id>.<operation>`` (register, heartbeat, ..., tasks, act:
:func:`~temporality_protocol.catalog.agent_subject`), never another agent's, and subscribe only below its own
reply inbox, ``_INBOX.<its user>`` (nats-py ``connect(inbox_prefix=...)``; :func:`external_agent_inbox`), so it
cannot read another agent's replies (tasks, policies, conformance probes) or a service's. It cannot publish any
event, touch JetStream or KV, or answer a request (:func:`external_agent_permissions`). Which agent *sent* a
request is proven twice: NATS lets only that agent's user publish on its subjects, and its signature is checked
against the allow-list; agent-collab refuses (and journals, ``subject_mismatch``) a request signed by another
agent than the subject names.

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

The **timers migration** (upgrading from the one ``TEMPORALITY_TIMERS`` stream of older releases:
``temporality timers-migrate``, ``temporality_bus.timers.migrate_legacy_timers``) runs as a user of its own,
``timers-migrate`` (:data:`TIMERS_MIGRATION_USER`, :func:`timers_migration_permissions`): the chart's migration Job
and compose's one-shot log in as it, so no operator needs a user with full access. What it may do follows from the
catalogue's legacy stream and timers streams, and is what the migration sends (checked on a real server by
``tests/test_timers_migrate_role.py``):

=======================================================================  ====================================
``$JS.API.STREAM.{INFO,UPDATE,DELETE}.TEMPORALITY_TIMERS``               look at the legacy stream, park its
``$JS.API.STREAM.MSG.GET.TEMPORALITY_TIMERS``,                           subjects, read its schedules and
``$JS.API.CONSUMER.LIST.TEMPORALITY_TIMERS``                             firings and who read them, delete it
``$JS.API.STREAM.{INFO,CREATE}.TEMPORALITY_TIMERS_<SERVICE>``            create a missing timers stream (never
                                                                         update one: its owner's settings stay)
``temporality.timers.schedule.<namespace>.>``, every service's           arm the copies in their new streams
=======================================================================  ====================================

and it subscribes only below ``_INBOX.timers-migrate``. It cannot publish an event, read or write a bucket, touch a
consumer, or update, purge or delete any stream but the legacy one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from temporality_protocol.catalog import (
    CONSUMERS,
    DLQ_PREFIX,
    EVENTS_STREAM,
    LEGACY_TIMERS_STREAM,
    RPCS,
    SERVICES,
    SUBSCRIBER_PREFIX,
    TIMER_SCHEDULE_PREFIX,
    TIMERS_STREAMS,
    ServiceSpec,
    agent_subject,
    subject_for,
)
from temporality_protocol.jetstream import DEFAULT_API_PREFIX, api_prefix, kv_write_subject

__all__ = [
    "INBOX_PREFIX",
    "SUBSCRIBER_PREFIX",
    "TIMERS_MIGRATION_USER",
    "Permissions",
    "external_agent_inbox",
    "external_agent_permissions",
    "journal_subscriber_permissions",
    "permissions_for",
    "service_inbox",
    "subscriber_inbox",
    "subscriber_user",
    "timers_migration_permissions",
]

#: A subscriber's name: one subject token that is also a valid consumer name.
_SUBSCRIBER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}")
#: nats-py's default inbox prefix; every user here gets one token below it (its own).
INBOX_PREFIX = "_INBOX"
#: The NATS user of the timers migration (``temporality timers-migrate``; the chart's Job, compose's one-shot).
TIMERS_MIGRATION_USER = "timers-migrate"


@dataclass(frozen=True)
class Permissions:
    """One NATS user's permissions (``authorization.users[].permissions`` in the server config)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    #: May reply to the requests it receives (responders): a one-off publish to each request's inbox.
    allow_responses: bool = False

    def in_domain(self, domain: str | None) -> Permissions:
        """These permissions for a deployment whose JetStream is in ``domain`` (``None``: unchanged): the services
        then publish their JetStream API requests to ``$JS.<domain>.API...`` and their KV writes to
        ``$JS.<domain>.API.$KV...`` (:mod:`temporality_protocol.jetstream`); the server's reply subjects
        (``$JS.ACK``, ``$JS.FC``), events, timers and RPC subjects stay as they are."""
        if domain is None:
            return self
        prefix = api_prefix(domain)

        def moved(subject: str) -> str:
            if subject.startswith(DEFAULT_API_PREFIX + "."):
                return prefix + subject.removeprefix(DEFAULT_API_PREFIX)
            return kv_write_subject(subject, domain) if subject.startswith("$KV.") else subject

        return Permissions(tuple(moved(s) for s in self.publish), self.subscribe, self.allow_responses)

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


def _layout(spec: ServiceSpec) -> list[str]:
    """What the runtime's layout step sends for ``spec``: info / create / update of the streams it owns, info
    of the other streams it uses; info / create / update of its own buckets' streams (an existing bucket is brought
    to the configured copies and direct reads), info of the buckets it only reads."""
    grants: list[str] = []
    for stream in dict.fromkeys((*spec.streams, *spec.uses_streams)):
        ops = ("INFO", "CREATE", "UPDATE") if stream in spec.streams else ("INFO",)
        grants += [f"$JS.API.STREAM.{op}.{stream}" for op in ops]
    for bucket in spec.buckets:
        grants += [f"$JS.API.STREAM.{op}.KV_{bucket}" for op in ("INFO", "CREATE", "UPDATE")]
    grants += [f"$JS.API.STREAM.INFO.KV_{bucket}" for bucket in spec.reads_buckets]
    return grants


def service_inbox(name: str) -> str:
    """The inbox prefix the service ``name`` connects with (nats-py ``inbox_prefix``): ``_INBOX.<name>``.

    Its replies (requests, JetStream API answers, fetched messages, KV watches) arrive below it, and its
    NATS user may subscribe nowhere else under ``_INBOX``: it cannot read another client's replies."""
    if not _SUBSCRIBER_NAME.fullmatch(name):
        raise ValueError(f"service name {name!r}: letters, digits, '_' and '-' only (at most 63), no '.', '*', '>'")
    return f"{INBOX_PREFIX}.{name}"


def permissions_for(service: str | ServiceSpec) -> Permissions:
    """The permissions of ``service`` (a name of :data:`SERVICES` or a spec), derived from its declaration."""
    spec = SERVICES[service] if isinstance(service, str) else service
    publish: list[str] = [subject_for(t) for t in spec.sends]
    for durable in spec.consumers:
        consumer = CONSUMERS[durable]
        publish.append(f"{DLQ_PREFIX}.{durable}")
        publish += _durable(consumer.stream, durable)
    publish += [f"{TIMER_SCHEDULE_PREFIX}.{namespace}.>" for namespace in spec.timers]
    for bucket in spec.buckets:
        publish.append(f"$KV.{bucket}.>")
    for bucket in (*spec.buckets, *spec.reads_buckets):
        publish += _bucket_reads(bucket)
    publish += list(spec.requests)
    publish += _layout(spec)
    subscribe = [f"{service_inbox(spec.name)}.>", *spec.responders]
    return Permissions(
        publish=tuple(dict.fromkeys(publish)),
        subscribe=tuple(dict.fromkeys(subscribe)),
        allow_responses=bool(spec.responders),
    )


def external_agent_inbox(user: str) -> str:
    """The inbox prefix the external agent with NATS user ``user`` connects with: ``_INBOX.<user>``.

    Raises ``ValueError`` for a user that is not one subject token (letters, digits, ``_``, ``-``)."""
    if not _SUBSCRIBER_NAME.fullmatch(user):
        raise ValueError(
            f"external agent user {user!r}: letters, digits, '_' and '-' only (at most 63), no '.', '*', '>'"
        )
    if user in SERVICES or user == TIMERS_MIGRATION_USER:
        raise ValueError(f"external agent user {user!r} is a service's NATS user")
    return f"{INBOX_PREFIX}.{user}"


def external_agent_permissions(user: str) -> Permissions:
    """The NATS user ``user`` of the external agent whose agent id is ``user``: the requests of every ``external``
    RPC subject on its own subjects only (``temporality.rpc.agents.<user>.<operation>``), and the replies below
    its own inbox prefix only (:func:`external_agent_inbox`), never ``_INBOX.>``."""
    inbox = external_agent_inbox(user)
    return Permissions(
        publish=tuple(agent_subject(spec.subject, user) for spec in RPCS.values() if spec.external),
        subscribe=(f"{inbox}.>",),
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
    return f"{INBOX_PREFIX}.{subscriber_user(name)}"


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


def timers_migration_permissions() -> Permissions:
    """The NATS user :data:`TIMERS_MIGRATION_USER`: what moving the legacy ``TEMPORALITY_TIMERS`` stream into the
    per-service timers streams needs (``temporality_bus.timers.migrate_legacy_timers``), derived from the
    catalogue's streams and timer namespaces, and nothing else; replies below ``_INBOX.timers-migrate`` only."""
    legacy = LEGACY_TIMERS_STREAM.name
    publish = [f"$JS.API.STREAM.{op}.{legacy}" for op in ("INFO", "UPDATE", "DELETE")]
    publish += [f"$JS.API.STREAM.MSG.GET.{legacy}", f"$JS.API.CONSUMER.LIST.{legacy}"]
    for stream in TIMERS_STREAMS.values():
        publish += [f"$JS.API.STREAM.{op}.{stream.name}" for op in ("INFO", "CREATE")]
    publish += [f"{TIMER_SCHEDULE_PREFIX}.{namespace}.>" for spec in SERVICES.values() for namespace in spec.timers]
    return Permissions(publish=tuple(dict.fromkeys(publish)), subscribe=(f"{service_inbox(TIMERS_MIGRATION_USER)}.>",))
