"""The catalogue of subjects, streams, consumers and KV buckets: the bus layout as data.

The README's "Bus catalogue" section documents this module; a test checks they agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import BaseModel

from temporality_protocol.events import (
    EVENT_MODELS,
    AgentRegistration,
    AgentsQuery,
    AgentsReply,
    CollaboratorsQuery,
    CollaboratorsReply,
    ConformanceAnswers,
    ConformanceReply,
    ConsoleRoleQuery,
    ConsoleRoleReply,
    Deregistration,
    DeregistrationReply,
    Heartbeat,
    HeartbeatAck,
    PasswordCheck,
    PasswordCheckReply,
    RegistrationReply,
    TaskAction,
    TaskActionReply,
    TaskPoll,
    TaskPollReply,
)

__all__ = [
    "ACCESS_REFUSED",
    "ALL_BUCKETS",
    "ALL_EVENTS_SUBJECT",
    "ALL_STREAMS",
    "BUCKET_AGENTS",
    "BUCKET_AGENT_NONCES",
    "BUCKET_AGENT_TASKS",
    "BUCKET_CANCEL_MARKERS",
    "BUCKET_CHECKPOINTS",
    "BUCKET_COLLAB",
    "BUCKET_CONCURRENCY",
    "BUCKET_DEDUPE",
    "BUCKET_DELIVERIES",
    "BUCKET_HUMAN_CHANNELS",
    "BUCKET_HUMAN_DIRECTORY",
    "BUCKET_HUMAN_REQUESTS",
    "BUCKET_RUNS",
    "BUCKET_SIGNIN_FAILURES",
    "BUCKET_TRIGGERS",
    "CONSUMERS",
    "DEAD_LETTERED",
    "DLQ_PREFIX",
    "DLQ_STREAM",
    "EVENTS_PREFIX",
    "EVENTS_STREAM",
    "LEGACY_TIMERS_STREAM",
    "PERMISSION_REFUSED",
    "REFUSALS",
    "RPCS",
    "RPC_AGENTS_CONFORMANCE",
    "RPC_AGENTS_DEREGISTER",
    "RPC_AGENTS_HEARTBEAT",
    "RPC_AGENTS_LIST",
    "RPC_AGENTS_PREFIX",
    "RPC_AGENTS_REGISTER",
    "RPC_AGENTS_TASKS_ACT",
    "RPC_AGENTS_TASKS_POLL",
    "RPC_GET_COLLABORATORS",
    "RPC_HUMAN_CONSOLE_ROLE",
    "RPC_HUMAN_VERIFY_PASSWORD",
    "RPC_PREFIX",
    "RPC_SUBJECTS",
    "SERVICES",
    "SOURCE_PREFIX",
    "SUBSCRIBER_PREFIX",
    "TIMERS_STREAMS",
    "TIMER_FIRED_HUMAN",
    "TIMER_FIRED_PREFIX",
    "TIMER_FIRED_RUN_WATCHDOG",
    "TIMER_NS_AGENT_ASK",
    "TIMER_NS_AGENT_CONFORMANCE",
    "TIMER_NS_AGENT_HEARTBEAT",
    "TIMER_NS_HUMAN",
    "TIMER_NS_RUN_RETENTION",
    "TIMER_NS_RUN_WATCHDOG",
    "TIMER_NS_TRIGGER_DEBOUNCE",
    "TIMER_NS_TRIGGER_SCHEDULE",
    "TIMER_SCHEDULE_HUMAN",
    "TIMER_SCHEDULE_PREFIX",
    "TIMER_SCHEDULE_RUN_WATCHDOG",
    "TRIGGERABLE_EVENTS",
    "BucketSpec",
    "ConsumerSpec",
    "RpcSpec",
    "ServiceSpec",
    "StreamSpec",
    "agent_subject",
    "check_services",
    "senders_of",
    "service_problems",
    "service_source",
    "subject_agent",
    "subject_for",
    "subject_matches",
    "timers_stream",
    "timers_stream_name",
    "timers_stream_of",
]

DAY = 24 * 3600

#: Every CloudEvent is published on ``temporality.events.<type>`` (e.g. ``temporality.events.run.requested``).
EVENTS_PREFIX = "temporality.events"
#: Dead letters: ``temporality.dlq.<consumer>``.
DLQ_PREFIX = "temporality.dlq"
#: Durable consumers of journal subscribers outside the services (DC-6) are named ``sub-<name>...``; no
#: service consumer may be (``temporality_protocol.permissions.journal_subscriber_permissions``).
SUBSCRIBER_PREFIX = "sub-"
#: Timer schedules live on ``temporality.timers.schedule.<namespace>.<key>`` and fire onto
#: ``temporality.timers.fired.<namespace>.<key>`` (one namespace per purpose: ``human``,
#: ``run-watchdog``, later ``agent-ask``, ``renotify``, ``cron``).
TIMER_SCHEDULE_PREFIX = "temporality.timers.schedule"
TIMER_FIRED_PREFIX = "temporality.timers.fired"
#: Human-request timers (deadline, re-armed deadline, answer repair, the timeout policy chain's next step).
TIMER_NS_HUMAN = "human"
TIMER_SCHEDULE_HUMAN = f"{TIMER_SCHEDULE_PREFIX}.{TIMER_NS_HUMAN}"
TIMER_FIRED_HUMAN = f"{TIMER_FIRED_PREFIX}.{TIMER_NS_HUMAN}"
#: The run watchdog: one timer per active run (key = run id), re-armed every turn, cancelled while the run
#: waits for a person; firing on a run that made no progress since the arm fails it (reason ``stalled``).
TIMER_NS_RUN_WATCHDOG = "run-watchdog"
TIMER_SCHEDULE_RUN_WATCHDOG = f"{TIMER_SCHEDULE_PREFIX}.{TIMER_NS_RUN_WATCHDOG}"
TIMER_FIRED_RUN_WATCHDOG = f"{TIMER_FIRED_PREFIX}.{TIMER_NS_RUN_WATCHDOG}"
#: Finished runs' checkpoints: one timer per finished run (key = run id), armed when the run ends (completed,
#: failed, cancelled) at its end + the executor's checkpoint retention; firing on a run still finished removes
#: its checkpoint from KV (the run record stays: it is small and makes a replayed ``run.requested`` a duplicate).
TIMER_NS_RUN_RETENTION = "run-retention"
#: Schedule triggers (TRG-2): one timer per enabled schedule trigger (key = trigger id) for its next cron tick,
#: re-armed by the trigger-gateway at every tick; the tick time is in the payload (one run per tick).
TIMER_NS_TRIGGER_SCHEDULE = "trigger-schedule"
#: Trigger debounce (a trigger's ``concurrency.debounce_s``): one timer per (trigger, concurrency key), key =
#: the key's record id, re-armed by each new event at its time + the window; firing on the latest event
#: starts it (the payload names it: an older firing finds a newer event in the record and does nothing).
TIMER_NS_TRIGGER_DEBOUNCE = "trigger-debounce"
#: ``ask_agent`` in wait mode (COL-2): one timer per request (key = request id) at asked + ``timeout_s``,
#: armed by agent-collab; firing on a request still unanswered publishes ``agent.ask_expired``.
TIMER_NS_AGENT_ASK = "agent-ask"
#: External agents' liveness (AP-4): one timer per registered agent (key = agent id), re-armed by every
#: heartbeat at its time + the offline delay; firing with no newer heartbeat moves the agent ``offline``.
TIMER_NS_AGENT_HEARTBEAT = "agent-heartbeat"
#: External agents' conformance rounds (PRO-2): one timer per agent (key = agent id) at the open round's
#: deadline; firing on a round still unanswered ends it (every probed capability ``timeout``).
TIMER_NS_AGENT_CONFORMANCE = "agent-conformance"
#: The event types an ``event`` trigger may listen to (TRG-5): the filter of the ``trigger-gateway-events``
#: consumer, so every event of these types (and no other) passes through the trigger-gateway.
TRIGGERABLE_EVENTS: tuple[str, ...] = (
    "run.completed",
    "run.failed",
    "run.cancelled",
    "tool.failed",
    "human.answered",
    "human.expired",
    "human.rejected",
    "trigger.rejected",
)
#: Request/reply subjects (core NATS) are ``temporality.rpc.<area>.<operation>``; see :data:`RPCS`.
RPC_PREFIX = "temporality.rpc"
#: Request/reply (COL-1).
RPC_GET_COLLABORATORS = f"{RPC_PREFIX}.collab.get_collaborators"
#: Request/reply (issue 9): does this password sign this directory user in to the console?
RPC_HUMAN_VERIFY_PASSWORD = f"{RPC_PREFIX}.human.verify_password"
#: Request/reply (issue 9): a directory user's console role (an OIDC sign-in whose groups give none).
RPC_HUMAN_CONSOLE_ROLE = f"{RPC_PREFIX}.human.console_role"
#: The Agent Protocol for agents outside the run-executor (AP-2..AP-4, PRO-2): answered by agent-collab. Each
#: agent sends on subjects of its own, ``temporality.rpc.agents.<agent id>.<operation>`` (these constants are the
#: patterns agent-collab answers, ``*`` standing for the agent id; :func:`agent_subject` makes an agent's own), so
#: an external agent's NATS user can be allowed exactly its own subjects and nobody else's (AP-11).
RPC_AGENTS_PREFIX = f"{RPC_PREFIX}.agents"
RPC_AGENTS_REGISTER = f"{RPC_AGENTS_PREFIX}.*.register"
RPC_AGENTS_HEARTBEAT = f"{RPC_AGENTS_PREFIX}.*.heartbeat"
RPC_AGENTS_DEREGISTER = f"{RPC_AGENTS_PREFIX}.*.deregister"
RPC_AGENTS_LIST = f"{RPC_AGENTS_PREFIX}.*.list"
RPC_AGENTS_CONFORMANCE = f"{RPC_AGENTS_PREFIX}.*.conformance"
#: External agents take runs' tasks (AP-5) and act on them: tool calls, checkpoints, streaming events, results.
RPC_AGENTS_TASKS_POLL = f"{RPC_AGENTS_PREFIX}.*.tasks"
RPC_AGENTS_TASKS_ACT = f"{RPC_AGENTS_PREFIX}.*.act"
#: An external agent's id as a subject token (the same rule as ``ExternalAgentId``).
_AGENT_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def agent_subject(pattern: str, agent_id: str) -> str:
    """The subject the agent ``agent_id`` sends one of its requests on: ``RPC_AGENTS_HEARTBEAT`` ->
    ``temporality.rpc.agents.<agent_id>.heartbeat``. ``ValueError`` for an id that is not one subject token."""
    if not _AGENT_TOKEN.fullmatch(agent_id):
        raise ValueError(f"agent id {agent_id!r}: letters, digits, '_' and '-' only (at most 64), no '.', '*', '>'")
    head, star, tail = pattern.partition(".*.")
    if not star or head != RPC_AGENTS_PREFIX:
        raise ValueError(f"{pattern!r} is not a per-agent subject pattern")
    return f"{head}.{agent_id}.{tail}"


def subject_agent(subject: str) -> str | None:
    """The agent id a per-agent subject names (``temporality.rpc.agents.<agent id>.<operation>``), else ``None``."""
    tokens = subject.split(".")
    if len(tokens) != 5 or ".".join(tokens[:3]) != RPC_AGENTS_PREFIX or not _AGENT_TOKEN.fullmatch(tokens[3]):
        return None
    return tokens[3]


def subject_for(event_type: str) -> str:
    return f"{EVENTS_PREFIX}.{event_type}"


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    description: str
    max_age_s: float = 0  # 0 = keep forever
    duplicate_window_s: float = 120
    allow_msg_schedules: bool = False
    #: ``Nats-Rollup`` and ``Nats-TTL`` headers allowed (the timers' cancel: a short-lived rollup that replaces
    #: a schedule, published to the canceller's own subject).
    allow_rollup_and_ttl: bool = False


@dataclass(frozen=True)
class BucketSpec:
    name: str
    description: str
    ttl_s: float = 0  # 0 = keep forever
    history: int = 1


@dataclass(frozen=True)
class ConsumerSpec:
    durable: str
    stream: str
    filter_subjects: tuple[str, ...]
    description: str
    #: Deliveries before a message that keeps failing transiently is dead-lettered; -1 = never (retry
    #: forever with the last backoff), for consumers whose only transient failure is their own store.
    max_deliver: int = 8
    backoff_s: tuple[float, ...] = field(default=(0.5, 1, 2, 5, 10, 30))
    #: Where the durable starts when it is first created: ``all`` (the stream's first message) or ``new``
    #: (only messages stored after its creation: history is never replayed). Later starts resume it.
    deliver_policy: Literal["all", "new"] = "all"
    #: How many delivered messages the server lets the durable's clients hold unacknowledged at once (all its
    #: replicas together). The batch path takes at most half of it per batch (one batch handled, the next fetched).
    max_ack_pending: int = 1000


EVENTS_STREAM = StreamSpec(
    name="TEMPORALITY_EVENTS",
    subjects=(f"{EVENTS_PREFIX}.>",),
    description="The journal: every CloudEvent of every service, deduplicated by Nats-Msg-Id",
    duplicate_window_s=10 * 60,
)
DLQ_STREAM = StreamSpec(
    name="TEMPORALITY_DLQ",
    subjects=(f"{DLQ_PREFIX}.>",),
    description="Dead letters: poison messages copied with their headers and the error",
    max_age_s=30 * DAY,
)
#: The one timers stream of releases before SEC-1's per-service timers streams: every namespace in one stream,
#: so a publish on one's own schedule subject could stop another service's timer (ADR-51's "atomic stop",
#: ``Nats-Schedule-Next: purge``, purges any schedule *of the same stream*). Not created any more: an existing
#: one is migrated into :data:`TIMERS_STREAMS` (``temporality_bus.timers.migrate_legacy_timers``) and deleted.
LEGACY_TIMERS_STREAM = StreamSpec(
    name="TEMPORALITY_TIMERS",
    subjects=("temporality.timers.>",),
    description="Durable timers as JetStream message schedules (Nats-Schedule @at ...)",
    max_age_s=400 * DAY,
    allow_msg_schedules=True,
    allow_rollup_and_ttl=True,
)


def timers_stream_name(service: str) -> str:
    """The timers stream of ``service``: ``TEMPORALITY_TIMERS_<SERVICE>`` (``-`` as ``_``)."""
    return f"TEMPORALITY_TIMERS_{service.upper().replace('-', '_')}"


def timers_stream(name: str, namespaces: Iterable[str], description: str = "") -> StreamSpec:
    """A timers stream ``name`` holding the schedules and firings of ``namespaces`` and nothing else.

    A schedule can only fire onto a subject of its own stream and an atomic stop only purges a schedule of its
    own stream (ADR-51), so a namespace in a stream of its own is out of reach of every other stream's users."""
    namespaces = tuple(namespaces)
    if not namespaces:
        raise ValueError(f"timers stream {name!r} needs at least one namespace")
    return StreamSpec(
        name=name,
        subjects=tuple(
            f"{prefix}.{ns}.>" for ns in namespaces for prefix in (TIMER_SCHEDULE_PREFIX, TIMER_FIRED_PREFIX)
        ),
        description=description or f"Durable timers ({', '.join(namespaces)}) as JetStream message schedules",
        max_age_s=400 * DAY,
        allow_msg_schedules=True,
        allow_rollup_and_ttl=True,
    )


BUCKET_RUNS = BucketSpec("runs", "Run records: state machine position, agent, policy (CAS on revision)")
BUCKET_CHECKPOINTS = BucketSpec("run-checkpoints", "The last checkpoint of each run (AP-7)")
#: The run-executor's cancels for runs it has not created yet (a trigger's ``supersede`` can overtake the
#: ``run.requested``): key = run id, written once; the ``run.requested`` that comes later is cancelled at once.
#: TTL 7 days (like the gateway's dedupe claims): a cancel for a run that never comes does not stay forever.
BUCKET_CANCEL_MARKERS = BucketSpec(
    "run-cancel-markers", "Cancels that arrived before their run.requested (run id -> the cancel)", ttl_s=7 * DAY
)
BUCKET_HUMAN_REQUESTS = BucketSpec("human-requests", "Human requests (HUM-4), persisted before delivery")
BUCKET_DEDUPE = BucketSpec(
    "trigger-dedupe",
    "Webhook dedupe keys (trigger id, source event id); Azure DevOps retries for ~36 h",
    ttl_s=7 * DAY,
)
BUCKET_COLLAB = BucketSpec(
    "collab-sagas", "agent-collab's projection of saga participants (COL-1) and its ask routing (COL-2..COL-9)"
)
#: Trigger definitions (TRG-1), key = trigger id; seeded from the triggers file (create-if-absent), managed
#: through the gateway's admin API, watched by every gateway replica.
BUCKET_TRIGGERS = BucketSpec("trigger-definitions", "Trigger definitions (TRG-1), watched by every gateway", history=5)
BUCKET_HUMAN_CHANNELS = BucketSpec(
    "human-channels",
    "human-interaction's channel bindings: reply tokens, sent message ids, DM rooms, sync tokens, run -> requests",
)
#: human-interaction's user directory (HUM-2): ``user.<id>`` / ``group.<id>``, seeded from the users file
#: (create-if-absent), managed through its directory API, watched by every replica.
BUCKET_HUMAN_DIRECTORY = BucketSpec(
    "human-directory", "User profiles and groups (HUM-2), watched by every human-interaction replica", history=5
)
#: Trigger flow control (the gateway's concurrency keys): per (trigger, key) the active run and the queued
#: deliveries, each queued delivery's launch, and run -> key; TTL 7 days like the dedupe claims.
BUCKET_CONCURRENCY = BucketSpec(
    "trigger-concurrency",
    "Trigger concurrency keys: the active run per (trigger, key), queued launches, run -> key",
    ttl_s=7 * DAY,
)
#: agent-collab's registry of external agents (AP-2..AP-4): ``agent.<agent id>``, changed with Store.modify.
BUCKET_AGENTS = BucketSpec(
    "agent-registry", "External agents: registration, negotiated version, policy, lifecycle state, last heartbeat"
)
#: agent-collab's replay protection for signed Agent Protocol messages (AP-11): ``nonce.<agent id>.<nonce>``,
#: created once (a second create is a replay), shared by every replica. TTL 10 min = twice the longest
#: timestamp window agent-collab accepts (``TEMPORALITY_COLLAB_SIGNATURE_WINDOW_S`` <= 300 s).
BUCKET_AGENT_NONCES = BucketSpec(
    "agent-nonces", "Nonces of signed external-agent messages seen within the timestamp window (replays)", ttl_s=600
)
#: agent-collab's tasks of external agents (AP-5, AP-7): ``task.<agent id>.<task id>`` (the dialogue, changed
#: with Store.modify), ``run.<run id>`` (which task a run has) and ``ckpt.<task id>`` (the agent's last checkpoint).
#: The run-executor reads it (the agent's action for a turn). TTL 30 days: finished tasks go.
BUCKET_AGENT_TASKS = BucketSpec(
    "agent-tasks", "External agents' tasks: the turn open, the agent's actions, its last checkpoint", ttl_s=30 * DAY
)
#: Trigger deliveries (IDEM-1): each delivery's processing state, key ``<trigger id>.<delivery id>``, with its
#: normalized event (bounded) so an operator can re-drive a rejected or failed one; TTL 7 days.
BUCKET_DELIVERIES = BucketSpec(
    "trigger-deliveries",
    "Trigger deliveries: processing state per delivery (received/accepted/rejected/failed), for re-drive",
    ttl_s=7 * DAY,
)
#: The journal's failed console sign-ins (issue 9): ``user.<digest>`` / ``address.<digest>`` -> the failures'
#: times within the window, shared by every replica (Store.modify); TTL 1 day, the longest window allowed.
BUCKET_SIGNIN_FAILURES = BucketSpec(
    "journal-signin-failures",
    "Failed console password sign-ins per user id and client address (the journal's attempt limits)",
    ttl_s=DAY,
)
ALL_BUCKETS: tuple[BucketSpec, ...] = (
    BUCKET_RUNS,
    BUCKET_CHECKPOINTS,
    BUCKET_CANCEL_MARKERS,
    BUCKET_HUMAN_REQUESTS,
    BUCKET_DEDUPE,
    BUCKET_COLLAB,
    BUCKET_TRIGGERS,
    BUCKET_HUMAN_CHANNELS,
    BUCKET_HUMAN_DIRECTORY,
    BUCKET_AGENTS,
    BUCKET_AGENT_NONCES,
    BUCKET_AGENT_TASKS,
    BUCKET_CONCURRENCY,
    BUCKET_DELIVERIES,
    BUCKET_SIGNIN_FAILURES,
)

_E = EVENTS_STREAM.name
CONSUMERS: dict[str, ConsumerSpec] = {
    c.durable: c
    for c in (
        ConsumerSpec("run-executor-requests", _E, (subject_for("run.requested"),), "Create and drive new runs"),
        ConsumerSpec(
            "run-executor-human",
            _E,
            (
                subject_for("human.answered"),
                subject_for("human.expired"),
                subject_for("human.rejected"),
                subject_for("run.cancel_requested"),
            ),
            "Resume (or fail) runs parked on ask_human; cancel runs (run.cancel_requested)",
        ),
        ConsumerSpec(
            "run-executor-agents",
            _E,
            (
                subject_for("agent.message.received"),
                subject_for("agent.answer.received"),
                subject_for("agent.ask_expired"),
                subject_for("agent.ask_undeliverable"),
                subject_for("agent.reply_undeliverable"),
                subject_for("agent.task.acted"),  # AP-5: wakes a run parked on its external agent's action
            ),
            "Agent messages for runs: resume runs waiting for an agent, queue the rest for the next turn boundary "
            "(COL-2..COL-4); an external agent's action wakes its run parked on it (AP-5)",
        ),
        ConsumerSpec(
            "run-executor-watchdog",
            timers_stream_name("run-executor"),
            (f"{TIMER_FIRED_RUN_WATCHDOG}.>",),
            "Run watchdogs firing: fail a run that made no progress past its compute limit plus grace",
            # a firing's only transient failure is the bus itself: never dead-letter one (that would
            # leave the run without a watchdog); an unreadable payload is still a permanent error
            max_deliver=-1,
        ),
        ConsumerSpec(
            "run-executor-retention",
            timers_stream_name("run-executor"),
            (f"{TIMER_FIRED_PREFIX}.{TIMER_NS_RUN_RETENTION}.>",),
            "Finished runs' checkpoint retention ending: the checkpoint of a run still finished is removed",
            # its only transient failure is the bus: never dead-letter one (the checkpoint would stay forever)
            max_deliver=-1,
        ),
        ConsumerSpec(
            "human-interaction-requests",
            _E,
            (subject_for("human.requested"),),
            "Persist and deliver requests",
        ),
        ConsumerSpec(
            "human-interaction-deadlines",
            timers_stream_name("human-interaction"),
            (f"{TIMER_FIRED_HUMAN}.>",),
            "Human-request deadlines and timeout-policy steps firing (reminders, escalation, expiry)",
        ),
        ConsumerSpec(
            "human-interaction-runs",
            _E,
            (
                subject_for("run.completed"),
                subject_for("run.failed"),
                subject_for("run.cancelled"),
                subject_for("human.cancel_requested"),
            ),
            "A run ended (or no longer needs some of its questions): its pending human requests are cancelled "
            "and their sent messages updated",
        ),
        ConsumerSpec(
            "human-interaction-notifications",
            _E,
            (subject_for("human.notify_requested"),),
            "Deliver an agent's notification (no answer expected) along the person's channels",
        ),
        ConsumerSpec(
            "human-interaction-policies",
            _E,
            (subject_for("run.requested"),),
            "SEC-1: each run's human policy (whom it may ask) as its trigger set it, never the executor's copy",
        ),
        ConsumerSpec(
            "journal",
            _E,
            (f"{EVENTS_PREFIX}.>",),
            "Every event into the SQL read model (a database outage must not dead-letter the journal)",
            max_deliver=-1,
            # batches of 1,000 (TEMPORALITY_JOURNAL_BATCH_SIZE) with the next one prefetched
            max_ack_pending=2000,
        ),
        ConsumerSpec(
            "agent-collab-runs",
            _E,
            (
                subject_for("run.started"),
                subject_for("run.completed"),
                subject_for("run.failed"),
                subject_for("run.cancelled"),
                subject_for("human.answered"),
                subject_for("agent.handed_off"),
            ),
            "Saga participants projection (COL-1; AP-6 handoffs)",
        ),
        ConsumerSpec(
            "agent-collab-asks",
            _E,
            (subject_for("agent.asked"), subject_for("agent.replied")),
            "Route asks and replies between agents inside a saga; relay runs for finished agents (COL-2..COL-9)",
        ),
        ConsumerSpec(
            "agent-collab-ask-timers",
            timers_stream_name("agent-collab"),
            (f"{TIMER_FIRED_PREFIX}.{TIMER_NS_AGENT_ASK}.>",),
            "Wait-mode ask timeouts firing: agent.ask_expired for a request still unanswered (COL-2)",
        ),
        ConsumerSpec(
            "agent-collab-heartbeats",
            timers_stream_name("agent-collab"),
            (f"{TIMER_FIRED_PREFIX}.{TIMER_NS_AGENT_HEARTBEAT}.>",),
            "External agents' heartbeat deadlines firing: offline when no newer heartbeat came (AP-4)",
            # a firing's only transient failure is the bus: never dead-letter one (the agent would stay
            # online forever); an unreadable payload is still a permanent error
            max_deliver=-1,
        ),
        ConsumerSpec(
            "agent-collab-tasks",
            _E,
            (subject_for("agent.task.offered"),),
            "Turns of runs executed by external agents: each task's open turn, for the agent to take (AP-5)",
        ),
        ConsumerSpec(
            "agent-collab-conformance",
            timers_stream_name("agent-collab"),
            (f"{TIMER_FIRED_PREFIX}.{TIMER_NS_AGENT_CONFORMANCE}.>",),
            "External agents' conformance deadlines firing: a round still unanswered fails (PRO-2)",
            max_deliver=-1,  # never dead-letter one: the round would stay open forever
        ),
        ConsumerSpec(
            "trigger-gateway-schedules",
            timers_stream_name("trigger-gateway"),
            (f"{TIMER_FIRED_PREFIX}.{TIMER_NS_TRIGGER_SCHEDULE}.>",),
            "Schedule trigger ticks firing: one run per tick, then the next tick armed",
            # a tick's only transient failure is the bus: never dead-letter one (the trigger would stop
            # ticking); an unreadable payload is still a permanent error
            max_deliver=-1,
        ),
        ConsumerSpec(
            "trigger-gateway-debounce",
            timers_stream_name("trigger-gateway"),
            (f"{TIMER_FIRED_PREFIX}.{TIMER_NS_TRIGGER_DEBOUNCE}.>",),
            "Trigger debounce windows ending: the latest event of a concurrency key is launched",
            # its only transient failure is the bus: never dead-letter one (the latest event would be lost)
            max_deliver=-1,
        ),
        ConsumerSpec(
            "trigger-gateway-events",
            _E,
            # the event types an `event` trigger may listen to (TRG-5): outcomes, not the chatty per-turn ones
            tuple(subject_for(t) for t in TRIGGERABLE_EVENTS),
            "Event triggers (TRG-5/6): the system's own events matched against the enabled event triggers",
            deliver_policy="new",  # a fresh gateway starts at the tail: history is never replayed (TRG-6)
        ),
    )
}


# --------------------------------------------------------------------------- request/reply
@dataclass(frozen=True)
class RpcSpec:
    """One request/reply subject (core NATS): its bodies, who answers it and who may call it.

    The AsyncAPI document renders a channel, its reply channel and both bodies' JSON Schemas
    (``rpc/<name>.{request,reply}.schema.json``) for each; :func:`check_services` keeps
    :attr:`responder` and the services' ``responders`` in agreement. Messages *from* agents outside the
    services are requests on such subjects (``external``): the answering service journals what it
    accepted or refused as events it sends, so every event still has a sending service.
    """

    subject: str
    request: type[BaseModel]
    reply: type[BaseModel]
    #: The one service answering it (in a queue group named after the service).
    responder: str
    description: str
    #: Called by agents outside the services (the Agent Protocol), not only by services.
    external: bool = False

    @property
    def name(self) -> str:
        """``temporality.rpc.agents.*.register`` -> ``agents.register`` (the schema files' stem)."""
        return ".".join(t for t in self.subject.removeprefix(f"{RPC_PREFIX}.").split(".") if t != "*")

    @property
    def address(self) -> str:
        """The subject as documented: a per-agent subject's ``*`` is the parameter ``{agent_id}``."""
        return ".".join("{agent_id}" if t == "*" else t for t in self.subject.split("."))

    @property
    def per_agent(self) -> bool:
        """Sent by each agent on its own subject (``temporality.rpc.agents.<agent id>.<operation>``)."""
        return "*" in self.subject.split(".")


#: What every external (Agent Protocol) request must carry (AP-11); the exact signing input is documented in
#: docs/agent-collaboration.md ("Signed messages") and by ``temporality_agent_collab.signing``.
_SIGNED = (
    " Each agent sends on its own subject, the agent id in place of {agent_id}: its NATS user may publish on its"
    " own subjects only, and a request signed by another agent than the subject names is refused."
    " Every request is signed with the agent's Ed25519 key: NATS headers Temporality-Key-Id, Temporality-Timestamp "
    "(Unix seconds), Temporality-Nonce and Temporality-Signature (base64) over 'temporality-agent-signature-v1' LF "
    "subject LF key id LF timestamp LF nonce LF body; unsigned, badly signed, stale or replayed requests are refused."
    " Replies arrive below the inbox prefix _INBOX.<the agent's NATS user>, the only one that user may subscribe to."
    " When agent-collab signs its replies, each carries Temporality-Key-Id, Temporality-Timestamp and"
    " Temporality-Signature over 'temporality-agent-reply-v1' LF request subject LF reply subject LF key id LF"
    " timestamp LF body (docs/agent-collaboration.md, 'Signed messages' and 'Signed replies')."
)
RPCS: dict[str, RpcSpec] = {
    r.subject: r
    for r in (
        RpcSpec(
            RPC_GET_COLLABORATORS,
            CollaboratorsQuery,
            CollaboratorsReply,
            "agent-collab",
            "COL-1: the participants of a run's saga.",
        ),
        RpcSpec(
            RPC_HUMAN_VERIFY_PASSWORD,
            PasswordCheck,
            PasswordCheckReply,
            "human-interaction",
            "Issue 9: the journal's password sign-in asks whether a password signs a directory user in to the "
            "console; the reply names the user's console role (human-interaction alone holds the Argon2id hashes). "
            "Only the journal may send it.",
        ),
        RpcSpec(
            RPC_HUMAN_CONSOLE_ROLE,
            ConsoleRoleQuery,
            ConsoleRoleReply,
            "human-interaction",
            "Issue 9: the journal asks a directory user's console role for a person signed in with the OIDC provider "
            "whose groups give no role (when TEMPORALITY_JOURNAL_OIDC_DIRECTORY_ROLES is on). Only the journal may "
            "send it.",
        ),
        RpcSpec(
            RPC_AGENTS_REGISTER,
            AgentRegistration,
            RegistrationReply,
            "agent-collab",
            "AP-3: an external agent registers; the reply is its configuration and security policy, or a refusal "
            "(journaled)." + _SIGNED,
            external=True,
        ),
        RpcSpec(
            RPC_AGENTS_HEARTBEAT,
            Heartbeat,
            HeartbeatAck,
            "agent-collab",
            "AP-4: a registered agent is alive and reports its state; none within the interval: offline." + _SIGNED,
            external=True,
        ),
        RpcSpec(
            RPC_AGENTS_DEREGISTER,
            Deregistration,
            DeregistrationReply,
            "agent-collab",
            "AP-2: an external agent leaves (decommissioned)." + _SIGNED,
            external=True,
        ),
        RpcSpec(
            RPC_AGENTS_LIST,
            AgentsQuery,
            AgentsReply,
            "agent-collab",
            "PRO-2: the hosted and registered agents' cards; a declared capability is unverified until the agent "
            "passed a conformance round for it." + _SIGNED,
            external=True,
        ),
        RpcSpec(
            RPC_AGENTS_CONFORMANCE,
            ConformanceAnswers,
            ConformanceReply,
            "agent-collab",
            "PRO-2: a registered agent answers the probes of its open conformance round (sent in the registration "
            "reply and heartbeat acks) before its deadline; correct answers verify capabilities." + _SIGNED,
            external=True,
        ),
        RpcSpec(
            RPC_AGENTS_TASKS_POLL,
            TaskPoll,
            TaskPollReply,
            "agent-collab",
            "AP-5, AP-8: a registered, online agent gets the tasks it holds: each with its open turn, the outcomes of "
            "its last tool calls and its last checkpoint; a task held under another session is resumed." + _SIGNED,
            external=True,
        ),
        RpcSpec(
            RPC_AGENTS_TASKS_ACT,
            TaskAction,
            TaskActionReply,
            "agent-collab",
            "AP-5..AP-7, AP-9: an agent acts on its task's open turn (tool calls such as ask_human, a result, a "
            "failure, or a handoff of the task to another agent card with the AP-6 handoff document) or stores a "
            "checkpoint or a streaming event; out-of-order messages are refused and journaled." + _SIGNED,
            external=True,
        ),
    )
}


# --------------------------------------------------------------------------- the services
#: Every request/reply subject (core NATS); each has exactly one responding service.
RPC_SUBJECTS: tuple[str, ...] = tuple(RPCS)


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a trailing ``>`` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(have) == len(want)


@dataclass(frozen=True)
class ServiceSpec:
    """One service as the rest of the system sees it: the one place to add a consumer, a responder,
    a timer namespace or an event type it sends.

    The embedded launcher, the service runtime (which refuses to start a consumer it does not
    declare), the AsyncAPI roles, the compose file and the Helm chart are derived from or checked
    against :data:`SERVICES`; :func:`check_services` keeps the table consistent with :data:`CONSUMERS`.
    What a service *receives* is not declared: it is what its consumers' filter subjects match
    (:attr:`receives`, :attr:`receives_all`), so it cannot drift from what the code subscribes to.
    """

    name: str
    #: The Python package (``python -m <package>`` runs it) and the console script ``temporality-<name>``.
    package: str
    description: str
    #: Prefix of the service's own settings (``TEMPORALITY_GATEWAY_PORT``, ...).
    env_prefix: str
    #: Durable consumers it runs (keys of :data:`CONSUMERS`).
    consumers: tuple[str, ...] = ()
    #: Request/reply subjects it answers (of :data:`RPC_SUBJECTS`).
    responders: tuple[str, ...] = ()
    #: Timer namespaces it arms and whose firings it consumes.
    timers: tuple[str, ...] = ()
    #: Default HTTP port of its API; ``None``: no API (a worker: it serves only ``/healthz`` and ``/readyz``, on
    #: ``<env_prefix>PORT`` when that is set).
    http_port: int | None = None
    #: Event types it publishes (AsyncAPI send operations); ``bus.dead_lettered`` exactly when it has
    #: consumers (their runner dead-letters poison messages).
    sends: tuple[str, ...] = ()
    #: Request/reply subjects it calls.
    requests: tuple[str, ...] = ()
    #: KV buckets it owns (names of :data:`ALL_BUCKETS`; each bucket has exactly one owner): it alone writes
    #: them, and its NATS user may read, write and watch only these (``temporality_protocol.permissions``).
    buckets: tuple[str, ...] = ()
    #: KV buckets another service owns that it reads or watches (never writes).
    reads_buckets: tuple[str, ...] = ()
    #: Shared streams it owns (names of :data:`ALL_STREAMS`; each has exactly one owner): it alone creates and
    #: updates them at start (its settings decide their retention and replicas); every other service only reads
    #: their info and, started first, waits until the owner has created them (:attr:`uses_streams`).
    streams: tuple[str, ...] = ()

    @property
    def uses_streams(self) -> tuple[str, ...]:
        """The shared streams it publishes to or consumes from, its own included: the events stream when it
        sends events, the dead letters when it has consumers, the timers when it arms timers, and the stream
        of each of its consumers."""
        used = {CONSUMERS[durable].stream for durable in self.consumers if durable in CONSUMERS}
        if self.sends:
            used.add(EVENTS_STREAM.name)
        if self.consumers:
            used.add(DLQ_STREAM.name)
        if self.timers:
            used.add(timers_stream_name(self.name))
        return tuple(stream.name for stream in ALL_STREAMS if stream.name in used)

    @property
    def script(self) -> str:
        """The console script (``[project.scripts]`` of ``services/<name>``)."""
        return f"temporality-{self.name}"

    @property
    def distribution(self) -> str:
        """The workspace member's distribution name (``uv sync --package <distribution>``)."""
        return f"temporality-{self.name}"

    @property
    def port_env(self) -> str | None:
        """The variable setting its HTTP port (``TEMPORALITY_GATEWAY_PORT``), ``None`` for a worker."""
        return None if self.http_port is None else f"{self.env_prefix}PORT"

    def _event_filters(self) -> list[str]:
        return [
            subject
            for durable in self.consumers
            if durable in CONSUMERS and CONSUMERS[durable].stream == EVENTS_STREAM.name
            for subject in CONSUMERS[durable].filter_subjects
        ]

    @property
    def receives_all(self) -> bool:
        """Subscribed to every event: one of its consumers filters on ``temporality.events.>``."""
        return ALL_EVENTS_SUBJECT in self._event_filters()

    @property
    def receives(self) -> tuple[str, ...]:
        """The modelled event types its consumers' filter subjects match (every one when :attr:`receives_all`)."""
        filters = self._event_filters()
        return tuple(t for t in EVENT_MODELS if any(subject_matches(f, subject_for(t)) for f in filters))


#: ``temporality.events.>``: every event.
ALL_EVENTS_SUBJECT = f"{EVENTS_PREFIX}.>"
#: Every service with consumers dead-letters their poison messages (``bus.dead_lettered``).
DEAD_LETTERED = "bus.dead_lettered"
#: What every service publishes of the refusals it sees (the audit trail): its API's, and NATS's of its connection.
ACCESS_REFUSED = "api.access_refused"
PERMISSION_REFUSED = "bus.permission_refused"
REFUSALS = (ACCESS_REFUSED, PERMISSION_REFUSED)
SERVICES: dict[str, ServiceSpec] = {
    s.name: s
    for s in (
        ServiceSpec(
            "trigger-gateway",
            package="temporality_trigger_gateway",
            description="Webhook intake: auth, normalization, dedupe, run.requested",
            env_prefix="TEMPORALITY_GATEWAY_",
            http_port=8080,
            sends=(
                "trigger.received",
                "trigger.accepted",
                "trigger.rejected",
                "run.requested",
                "trigger.created",
                "trigger.updated",
                "trigger.deleted",
                "trigger.enabled",
                "trigger.disabled",
                "run.cancel_requested",  # a superseded run (a trigger's concurrency policy `supersede`)
                DEAD_LETTERED,
            ),
            consumers=("trigger-gateway-schedules", "trigger-gateway-events", "trigger-gateway-debounce"),
            timers=(TIMER_NS_TRIGGER_SCHEDULE, TIMER_NS_TRIGGER_DEBOUNCE),
            buckets=(BUCKET_TRIGGERS.name, BUCKET_DEDUPE.name, BUCKET_CONCURRENCY.name, BUCKET_DELIVERIES.name),
        ),
        ServiceSpec(
            "run-executor",
            package="temporality_run_executor",
            description="Durable agent runs: state machine, checkpoints, tools, ask_human parking",
            env_prefix="TEMPORALITY_EXECUTOR_",
            consumers=(
                "run-executor-requests",
                "run-executor-human",
                "run-executor-agents",
                "run-executor-watchdog",
                "run-executor-retention",
            ),
            timers=(TIMER_NS_RUN_WATCHDOG, TIMER_NS_RUN_RETENTION),
            buckets=(BUCKET_RUNS.name, BUCKET_CHECKPOINTS.name, BUCKET_CANCEL_MARKERS.name),
            reads_buckets=(BUCKET_AGENT_TASKS.name,),  # an external agent's action for a run's turn (AP-5)
            requests=(RPC_GET_COLLABORATORS,),  # the get_collaborators tool (COL-1)
            sends=(
                "run.created",
                "run.started",
                "run.tool_called",
                "tool.failed",
                "run.sampled",  # an MCP tool's sampling request, answered by the run's model
                "run.streamed",  # AP-9: report_progress and each turn's metrics (hosted runs)
                "run.checkpointed",
                "run.resumed",
                "run.completed",
                "run.failed",
                "run.cancelled",
                "run.input_after_end",  # an answer or agent message for a run that had ended: journaled
                "human.requested",
                "human.notify_requested",
                "human.cancel_requested",  # HUM-7: the questions a wait_for=first turn no longer needs
                "agent.asked",
                "agent.replied",
                "agent.handed_off",  # AP-6: a handoff, then the child's run.requested
                "agent.task.offered",  # AP-5: a turn of a run an external agent executes
                "run.requested",
                DEAD_LETTERED,
            ),
        ),
        ServiceSpec(
            "human-interaction",
            package="temporality_human_interaction",
            description="People: user directory, channels, web inbox, answer binding, deadlines",
            env_prefix="TEMPORALITY_HUMAN_",
            consumers=(
                "human-interaction-requests",
                "human-interaction-deadlines",
                "human-interaction-runs",
                "human-interaction-notifications",
                "human-interaction-policies",
            ),
            timers=(TIMER_NS_HUMAN,),
            responders=(RPC_HUMAN_VERIFY_PASSWORD, RPC_HUMAN_CONSOLE_ROLE),  # the console's sign-in (issue 9)
            buckets=(BUCKET_HUMAN_REQUESTS.name, BUCKET_HUMAN_CHANNELS.name, BUCKET_HUMAN_DIRECTORY.name),
            http_port=8081,
            sends=(
                "human.notified",
                "human.answered",
                "human.answer_refused",  # a late, foreign or second answer: journaled, never applied (HUM-7)
                "human.expired",
                "human.withdrawn",  # a question still open when its run ended (or no longer needed it, HUM-7)
                "human.reasked",  # the timeout policy chain (HUM-8): a reminder
                "human.escalated",  # ... the question forwarded to the escalation target
                "human.rejected",
                "human.directory.changed",
                "run.cancel_requested",  # ... the terminal step `cancel`
                "human.notification_delivered",  # an agent's notify (HUM-9): the channel that carried it
                "human.notification_failed",  # ... or why nobody could be told
                DEAD_LETTERED,
            ),
        ),
        ServiceSpec(
            "agent-collab",
            package="temporality_agent_collab",
            description="Saga participants, get_collaborators, ask/answer routing between agents, relay runs",
            env_prefix="TEMPORALITY_COLLAB_",
            consumers=(
                "agent-collab-runs",
                "agent-collab-asks",
                "agent-collab-ask-timers",
                "agent-collab-heartbeats",
                "agent-collab-conformance",
                "agent-collab-tasks",
            ),
            responders=(
                RPC_GET_COLLABORATORS,
                RPC_AGENTS_REGISTER,
                RPC_AGENTS_HEARTBEAT,
                RPC_AGENTS_DEREGISTER,
                RPC_AGENTS_LIST,
                RPC_AGENTS_CONFORMANCE,
                RPC_AGENTS_TASKS_POLL,
                RPC_AGENTS_TASKS_ACT,
            ),
            timers=(TIMER_NS_AGENT_ASK, TIMER_NS_AGENT_HEARTBEAT, TIMER_NS_AGENT_CONFORMANCE),
            buckets=(BUCKET_COLLAB.name, BUCKET_AGENTS.name, BUCKET_AGENT_NONCES.name, BUCKET_AGENT_TASKS.name),
            sends=(
                "agent.message.received",
                "agent.answer.received",
                "agent.ask_expired",
                "agent.ask_undeliverable",
                "agent.reply_undeliverable",
                "run.requested",  # relay runs (COL-6)
                "agent.registered",  # the Agent Protocol (AP-2..AP-4): what it accepted or refused
                "agent.registration_refused",
                "agent.message_refused",  # unsigned, badly signed, stale or replayed (AP-11)
                "agent.lifecycle_changed",
                "agent.readmitted",  # an operator lifted a decommissioning's hold (its HTTP API)
                "agent.policy_changed",  # the allow-list grants an agent something else (AP-11, audited)
                "agent.conformance_checked",  # a conformance round ended (PRO-2)
                "agent.task.taken",  # external agents' tasks (AP-5, AP-7..AP-9)
                "agent.task.acted",
                "agent.task.checkpointed",
                "agent.task.streamed",
                "agent.task.refused",
                "agent.task.ended",
                DEAD_LETTERED,
            ),
        ),
        ServiceSpec(
            "journal",
            package="temporality_journal",
            description="Every event into SQL; run and trajectory API",
            env_prefix="TEMPORALITY_JOURNAL_",
            consumers=("journal",),
            # the record of every event: it owns the shared streams (every other service waits for them)
            streams=(EVENTS_STREAM.name, DLQ_STREAM.name),
            http_port=8082,
            buckets=(BUCKET_SIGNIN_FAILURES.name,),  # the sign-in's attempt limits, shared by the replicas
            sends=("run.cancel_requested", DEAD_LETTERED),
            requests=(RPC_HUMAN_VERIFY_PASSWORD, RPC_HUMAN_CONSOLE_ROLE),  # the console's sign-in (issue 9)
        ),
    )
}


# Every service audits the refusals it sees (issue 11, SEC-1/AP-11; temporality_service.audit): its HTTP API's
# 401/403 (and the gateway's refused webhook credentials) and the NATS server's permissions violations of its own
# connection. Derived here, not written into each entry: each service's user may send both.
SERVICES = {
    name: replace(spec, sends=(*spec.sends, *(t for t in REFUSALS if t not in spec.sends)))
    for name, spec in SERVICES.items()
}
# Each service with timers owns its own timers stream (SEC-1): it creates and updates it, and no other service's
# user may touch it (temporality_protocol.permissions). Derived here, not written into each entry twice.
SERVICES = {
    name: replace(spec, streams=(*spec.streams, timers_stream_name(name))) if spec.timers else spec
    for name, spec in SERVICES.items()
}
#: The timers stream of each service with timers (key: the service), holding only its own namespaces.
TIMERS_STREAMS: dict[str, StreamSpec] = {
    name: timers_stream(
        timers_stream_name(name), spec.timers, f"{name}'s durable timers as JetStream message schedules"
    )
    for name, spec in SERVICES.items()
    if spec.timers
}
ALL_STREAMS: tuple[StreamSpec, ...] = (EVENTS_STREAM, DLQ_STREAM, *TIMERS_STREAMS.values())
_TIMER_NAMESPACE_STREAMS = {ns: timers_stream_name(spec.name) for spec in SERVICES.values() for ns in spec.timers}


def timers_stream_of(namespace: str) -> str:
    """The name of the timers stream holding ``namespace`` (its owner's); ``KeyError`` for no service's namespace."""
    try:
        return _TIMER_NAMESPACE_STREAMS[namespace]
    except KeyError:
        raise KeyError(f"timer namespace {namespace!r} is no service's (ServiceSpec.timers)") from None


#: The source every service writes on the events it publishes: ``/temporality/<service>``.
SOURCE_PREFIX = "/temporality/"


def service_source(service: str) -> str:
    """The CloudEvents ``source`` of the events ``service`` publishes: ``/temporality/<service>``."""
    return f"{SOURCE_PREFIX}{service}"


def senders_of(event_type: str) -> tuple[str, ...]:
    """The services that publish ``event_type`` (its owners, :attr:`ServiceSpec.sends`), in catalogue order;
    empty for a type no service sends (not a modelled type). Several services share a few types:
    ``run.requested``, ``run.cancel_requested`` and ``bus.dead_lettered``."""
    return _SENDERS.get(event_type, ())


def service_problems(
    services: Mapping[str, ServiceSpec] | None = None, consumers: Mapping[str, ConsumerSpec] | None = None
) -> list[str]:
    """What is inconsistent in the service table (empty when nothing): see :func:`check_services`."""
    services = SERVICES if services is None else services
    consumers = CONSUMERS if consumers is None else consumers
    problems: list[str] = []
    owners: dict[str, list[str]] = {durable: [] for durable in consumers}
    responders: dict[str, list[str]] = {subject: [] for subject in RPC_SUBJECTS}
    ports: dict[int, str] = {}
    bucket_owners: dict[str, list[str]] = {bucket.name: [] for bucket in ALL_BUCKETS}
    stream_owners: dict[str, list[str]] = {stream.name: [] for stream in ALL_STREAMS}
    problems += [
        f"consumer {d} is named like a journal subscriber's ({SUBSCRIBER_PREFIX}...)"
        for d in consumers
        if d.startswith(SUBSCRIBER_PREFIX)
    ]
    timer_owners: dict[str, str] = {}
    for key, spec in services.items():
        where = f"service {key}"
        for namespace in spec.timers:  # one stream per service: a namespace in two would overlap
            if namespace in timer_owners:
                problems.append(f"{where} declares timer namespace {namespace!r}, which is {timer_owners[namespace]}'s")
            timer_owners.setdefault(namespace, spec.name)
        for bucket in (*spec.buckets, *spec.reads_buckets):
            if bucket not in bucket_owners:
                problems.append(f"{where} names bucket {bucket!r}, which is not in ALL_BUCKETS")
        for bucket in spec.buckets:
            bucket_owners.get(bucket, []).append(spec.name)
        for stream in spec.streams:
            if stream not in stream_owners:
                problems.append(f"{where} owns stream {stream!r}, which is not in ALL_STREAMS")
            else:
                stream_owners[stream].append(spec.name)
        if set(spec.buckets) & set(spec.reads_buckets):
            problems.append(f"{where} both owns and only reads {sorted(set(spec.buckets) & set(spec.reads_buckets))}")
        if spec.name != key:
            problems.append(f"{where} is keyed under another name than its own ({spec.name!r})")
        if spec.package != "temporality_" + spec.name.replace("-", "_"):
            problems.append(f"{where}: package {spec.package!r} is not temporality_<name>")
        if not re.fullmatch(r"TEMPORALITY_[A-Z]+_", spec.env_prefix):
            problems.append(f"{where}: env_prefix {spec.env_prefix!r} is not TEMPORALITY_<WORD>_")
        if spec.http_port is not None:
            if spec.http_port in ports:
                problems.append(f"{where}: HTTP port {spec.http_port} is also {ports[spec.http_port]}'s")
            ports[spec.http_port] = spec.name
        for durable in spec.consumers:
            if durable not in consumers:
                problems.append(f"{where} names consumer {durable!r}, which is not in CONSUMERS")
            else:
                owners[durable].append(spec.name)
        for subject in spec.responders:
            if subject not in responders:
                problems.append(f"{where} answers {subject!r}, which is not in RPC_SUBJECTS")
            else:
                responders[subject].append(spec.name)
        for subject in spec.requests:
            if subject not in responders:
                problems.append(f"{where} requests {subject!r}, which is not in RPC_SUBJECTS")
        missing = [t for t in REFUSALS if t not in spec.sends]
        if missing:
            problems.append(f"{where} does not send {missing}: every service audits the refusals it sees")
        if (DEAD_LETTERED in spec.sends) != bool(spec.consumers):
            problems.append(f"{where}: sends {DEAD_LETTERED} exactly when it has consumers (their runner dead-letters)")
        for event_type in spec.sends:
            if event_type not in EVENT_MODELS:
                problems.append(f"{where} sends {event_type!r}, which has no model in EVENT_MODELS")
        for durable in spec.consumers:
            consumer = consumers.get(durable)
            if consumer is None or consumer.stream != EVENTS_STREAM.name:
                continue
            for subject in consumer.filter_subjects:
                if not any(subject_matches(subject, subject_for(t)) for t in EVENT_MODELS):
                    problems.append(f"{where}: consumer {durable} filters {subject!r}, which no modelled event matches")
        timer_filters = [
            subject
            for durable in spec.consumers
            if durable in consumers
            for subject in consumers[durable].filter_subjects
            if subject.startswith(f"{TIMER_FIRED_PREFIX}.")
        ]
        fired = {subject.removeprefix(f"{TIMER_FIRED_PREFIX}.").split(".", 1)[0] for subject in timer_filters}
        if set(spec.timers) != fired:
            problems.append(
                f"{where}: timer namespaces {sorted(spec.timers)} are not those its consumers' filters fire "
                f"({sorted(fired)})"
            )
    for bucket, names in bucket_owners.items():
        if len(names) != 1:
            problems.append(
                f"bucket {bucket} belongs to {len(names)} services ({names}), not exactly one: add it to the "
                "`buckets` of the service that writes it (its NATS user may touch no other)"
            )
    for stream, names in stream_owners.items():
        if len(names) != 1:
            problems.append(
                f"stream {stream} belongs to {len(names)} services ({names}), not exactly one: add it to the "
                "`streams` of the service that creates it (no other may)"
            )
    senders = {t for spec in services.values() for t in spec.sends}
    orphans = sorted(set(EVENT_MODELS) - senders)
    if orphans:
        problems.append(f"no service sends {orphans}: add them to a service's sends")
    for durable, names in owners.items():
        if len(names) != 1:
            problems.append(f"consumer {durable} belongs to {len(names)} services ({names}), not exactly one")
    for subject, names in responders.items():
        if len(names) != 1:
            problems.append(f"RPC subject {subject} is answered by {len(names)} services ({names}), not exactly one")
        elif subject in RPCS and RPCS[subject].responder != names[0]:
            problems.append(
                f"RPC subject {subject} is answered by {names[0]}, but RPCS names {RPCS[subject].responder}"
            )
    return problems


_SENDERS: dict[str, tuple[str, ...]] = {
    t: tuple(spec.name for spec in SERVICES.values() if t in spec.sends)
    for spec in SERVICES.values()
    for t in spec.sends
}


def check_services(
    services: Mapping[str, ServiceSpec] | None = None, consumers: Mapping[str, ConsumerSpec] | None = None
) -> None:
    """Raise ``ValueError`` listing every inconsistency: each consumer a service names exists and each of
    :data:`CONSUMERS` belongs to exactly one service; each responder / request subject is an RPC subject
    and each RPC subject has exactly one responder; ``bus.dead_lettered`` is sent exactly by services
    with consumers; every modelled event type has a sender and every type sent has a model; every
    event filter of a consumer matches a modelled type; timer namespaces are those the consumers'
    filters fire; each bucket of :data:`ALL_BUCKETS` is owned (``buckets``) by exactly one service and the
    buckets a service names exist; each stream of :data:`ALL_STREAMS` is owned (``streams``) by exactly one; no consumer is named like a journal subscriber's (``sub-``); names,
    packages, env prefixes and HTTP ports follow the conventions."""
    problems = service_problems(services, consumers)
    if problems:
        raise ValueError("temporality_protocol.catalog.SERVICES is inconsistent:\n  " + "\n  ".join(problems))
