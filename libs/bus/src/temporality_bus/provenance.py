"""Who may have sent an event: its envelope's ``source`` (and a ``service:`` actor) against the catalogue.

NATS permissions (``temporality_protocol.permissions``) already stop a service publishing an event type it
does not send. The consumers check again (SEC-1, AP-11: defence in depth, e.g. an account configured too
permissively, an external agent's user given more than its own subjects): an event whose envelope claims
another sender than the services that publish its type (:func:`temporality_protocol.catalog.senders_of`)
is *forged*. The consumer runner (:class:`temporality_bus.Consumer`) never hands a forged event to its
handler nor to the service's dead-letter hook: it copies it to the dead-letter stream and journals
``bus.dead_lettered`` (the error names the claim and the owners), as a poison message.

Every service writes ``source = /temporality/<service>`` on what it publishes
(:func:`~temporality_protocol.catalog.service_source`), and an actor ``service:<name>`` names the service
that acted. ``TEMPORALITY_NATS_SOURCE_CHECK`` (:attr:`temporality_bus.NatsSettings.source_check`) decides how
strictly the claim is read:

==========  ===========================================================================================
``strict``  (the default) the source must be ``/temporality/<service>`` of a service that sends the type
            (of any service, for a type this version does not know: a newer sender during a rolling
            upgrade); an actor ``service:<name>`` must name that same service
``claimed`` only a claim is checked: a source ``/temporality/<service>`` or an actor ``service:<name>``
            naming a service of the catalogue that does not send the type is refused; a source naming
            no service (a test's ``/test``, a tool's) passes. For test suites that publish as no service
``off``     nothing is checked
==========  ===========================================================================================

**Timer firings** carry no envelope: nats-server publishes the payload of a schedule onto its target subject
(:mod:`temporality_bus.timers`). NATS permissions let a service arm only its own namespaces
(``temporality.timers.schedule.<its namespace>.>``), but not *where* its schedule fires: the target is a header
of the schedule, which the server does not check against the publisher's permissions. So a service could
schedule, in its own namespace, a firing onto another service's timer subject (a forged human deadline, a
forged agent heartbeat expiry). The server marks every firing with ``Nats-Scheduler``, the schedule's subject,
and refuses a schedule that sets that header itself: that is the sender of a firing, which
:func:`forged_firing` holds against the owner of the fired namespace (``ServiceSpec.timers``) under the same
``TEMPORALITY_NATS_SOURCE_CHECK``: ``strict`` wants a ``Nats-Scheduler`` in a namespace of the same service;
``claimed`` refuses only a scheduler of another service (a test's firing published by hand has none);
``off`` checks nothing. :func:`temporality_bus.timers.checking_firings` raises :class:`ForgedEvent` for one, which
the consumer runner dead-letters and journals like a forged event, never telling the service.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from temporality_bus.errors import PermanentError
from temporality_protocol import Envelope
from temporality_protocol.catalog import (
    SERVICES,
    SOURCE_PREFIX,
    TIMER_FIRED_PREFIX,
    TIMER_SCHEDULE_PREFIX,
    senders_of,
)

__all__ = ["SCHEDULER_HEADER", "ForgedEvent", "SourceCheck", "claimed_service", "forged_firing", "forgery"]

#: The header nats-server puts on every message a schedule fires: the schedule's subject (a publisher cannot set
#: it: the server refuses such a schedule with ``message schedules invalid scheduler``).
SCHEDULER_HEADER = "Nats-Scheduler"
#: Each timer namespace's owner: the one service that may arm it (``ServiceSpec.timers``).
_TIMER_OWNERS = {namespace: spec.name for spec in SERVICES.values() for namespace in spec.timers}

SourceCheck = Literal["strict", "claimed", "off"]
_ACTOR_PREFIX = "service:"


class ForgedEvent(PermanentError):
    """The envelope claims a sender that does not publish its type (see the module docstring)."""


def claimed_service(source: str) -> str | None:
    """The service a ``source`` names (``/temporality/<service>``, a catalogue service), else ``None``."""
    if not source.startswith(SOURCE_PREFIX):
        return None
    name = source[len(SOURCE_PREFIX) :]
    return name if name in SERVICES else None


def forgery(event: Envelope, mode: SourceCheck) -> str | None:
    """Why ``event`` cannot come from whom it claims under ``mode``, or ``None`` when it may."""
    if mode == "off":
        return None
    owners = senders_of(event.type)
    source = claimed_service(event.source)
    actor = event.actor[len(_ACTOR_PREFIX) :] if event.actor and event.actor.startswith(_ACTOR_PREFIX) else None
    sent_by = f"{event.type} is sent by {', '.join(owners)}" if owners else f"{event.type} is sent by no known service"
    if mode == "strict":
        if source is None:
            return f"source {event.source!r} is no service's (/temporality/<service>); {sent_by}"
        if owners and source not in owners:
            return f"source {event.source!r} claims {source}, but {sent_by}"
        if actor is not None and actor != source:
            return f"actor {event.actor!r} is not the source's service {source}; {sent_by}"
        return None
    if not owners:
        return None  # a type this version does not know: nothing to hold a claim against
    if source is not None and source not in owners:
        return f"source {event.source!r} claims {source}, but {sent_by}"
    if actor is not None and actor in SERVICES and actor not in owners:
        return f"actor {event.actor!r} claims {actor}, but {sent_by}"
    return None


def _namespace(subject: str, prefix: str) -> str | None:
    """The namespace token of ``<prefix>.<namespace>.<key...>``, else ``None``."""
    if not subject.startswith(prefix + "."):
        return None
    namespace, dot, key = subject[len(prefix) + 1 :].partition(".")
    return namespace if namespace and dot and key else None


def forged_firing(subject: str, headers: Mapping[str, str] | None, mode: SourceCheck) -> str | None:
    """Why the timer firing on ``subject`` cannot come from the owner of its namespace under ``mode`` (its
    ``Nats-Scheduler`` header names another service's schedule, or, ``strict``, none), or ``None`` when it may.
    A message on any other subject is no firing: ``None``."""
    fired = _namespace(subject, TIMER_FIRED_PREFIX)
    if mode == "off" or fired is None:
        return None
    owner = _TIMER_OWNERS.get(fired)
    owned = f"the {fired!r} timers are {owner}'s" if owner else f"{fired!r} is no service's timer namespace"
    scheduler = (headers or {}).get(SCHEDULER_HEADER)
    if scheduler is None:
        if mode == "strict":
            return f"a firing on {subject} without {SCHEDULER_HEADER}: no schedule fired it; {owned}"
        return None
    scheduled = _namespace(scheduler, TIMER_SCHEDULE_PREFIX)
    by = _TIMER_OWNERS.get(scheduled) if scheduled else None
    if mode == "strict":
        if by is None:
            return f"{SCHEDULER_HEADER} {scheduler!r} is no service's timer schedule; {owned}"
        if by != owner:
            return f"{SCHEDULER_HEADER} {scheduler!r} was armed by {by}, but {owned}"
        return None
    if by is not None and owner is not None and by != owner:
        return f"{SCHEDULER_HEADER} {scheduler!r} was armed by {by}, but {owned}"
    return None
