"""The catalogue of subjects, streams, consumers and KV buckets: the bus layout as data.

The README's "Bus catalogue" section documents this module; a test checks they agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "ALL_BUCKETS",
    "ALL_STREAMS",
    "BUCKET_CHECKPOINTS",
    "BUCKET_COLLAB",
    "BUCKET_DEDUPE",
    "BUCKET_HUMAN_REQUESTS",
    "BUCKET_RUNS",
    "CONSUMERS",
    "DLQ_PREFIX",
    "DLQ_STREAM",
    "EVENTS_PREFIX",
    "EVENTS_STREAM",
    "RPC_GET_COLLABORATORS",
    "TIMERS_STREAM",
    "SERVICES",
    "TIMER_FIRED_HUMAN",
    "TIMER_FIRED_PREFIX",
    "TIMER_NS_HUMAN",
    "TIMER_SCHEDULE_HUMAN",
    "TIMER_SCHEDULE_PREFIX",
    "BucketSpec",
    "ConsumerSpec",
    "ServiceSpec",
    "StreamSpec",
    "subject_for",
]

DAY = 24 * 3600

#: Every CloudEvent is published on ``temporality.events.<type>`` (e.g. ``temporality.events.run.requested``).
EVENTS_PREFIX = "temporality.events"
#: Dead letters: ``temporality.dlq.<consumer>``.
DLQ_PREFIX = "temporality.dlq"
#: Timer schedules live on ``temporality.timers.schedule.<namespace>.<key>`` and fire onto
#: ``temporality.timers.fired.<namespace>.<key>`` (one namespace per purpose: ``human``, later
#: ``heartbeat``, ``agent-ask``, ``renotify``, ``cron``).
TIMER_SCHEDULE_PREFIX = "temporality.timers.schedule"
TIMER_FIRED_PREFIX = "temporality.timers.fired"
#: Human-request timers (deadline, re-armed deadline, answer repair).
TIMER_NS_HUMAN = "human"
TIMER_SCHEDULE_HUMAN = f"{TIMER_SCHEDULE_PREFIX}.{TIMER_NS_HUMAN}"
TIMER_FIRED_HUMAN = f"{TIMER_FIRED_PREFIX}.{TIMER_NS_HUMAN}"
#: Request/reply (COL-1).
RPC_GET_COLLABORATORS = "temporality.rpc.collab.get_collaborators"


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
TIMERS_STREAM = StreamSpec(
    name="TEMPORALITY_TIMERS",
    subjects=("temporality.timers.>",),
    description="Durable timers as JetStream message schedules (Nats-Schedule @at ...)",
    max_age_s=400 * DAY,
    allow_msg_schedules=True,
)
ALL_STREAMS: tuple[StreamSpec, ...] = (EVENTS_STREAM, DLQ_STREAM, TIMERS_STREAM)

BUCKET_RUNS = BucketSpec("runs", "Run records: state machine position, agent, policy (CAS on revision)")
BUCKET_CHECKPOINTS = BucketSpec("run-checkpoints", "The last checkpoint of each run (AP-7)")
BUCKET_HUMAN_REQUESTS = BucketSpec("human-requests", "Human requests (HUM-4), persisted before delivery")
BUCKET_DEDUPE = BucketSpec(
    "trigger-dedupe",
    "Webhook dedupe keys (trigger id, source event id); Azure DevOps retries for ~36 h",
    ttl_s=7 * DAY,
)
BUCKET_COLLAB = BucketSpec("collab-sagas", "agent-collab's projection of saga participants (COL-1)")
ALL_BUCKETS: tuple[BucketSpec, ...] = (
    BUCKET_RUNS,
    BUCKET_CHECKPOINTS,
    BUCKET_HUMAN_REQUESTS,
    BUCKET_DEDUPE,
    BUCKET_COLLAB,
)

_E = EVENTS_STREAM.name
CONSUMERS: dict[str, ConsumerSpec] = {
    c.durable: c
    for c in (
        ConsumerSpec("run-executor-requests", _E, (subject_for("run.requested"),), "Create and drive new runs"),
        ConsumerSpec(
            "run-executor-human",
            _E,
            (subject_for("human.answered"), subject_for("human.expired"), subject_for("human.rejected")),
            "Resume (or fail) runs parked on ask_human",
        ),
        ConsumerSpec(
            "human-interaction-requests",
            _E,
            (subject_for("human.requested"),),
            "Persist and deliver requests",
        ),
        ConsumerSpec(
            "human-interaction-deadlines",
            TIMERS_STREAM.name,
            (f"{TIMER_FIRED_HUMAN}.>",),
            "Human-request deadlines firing",
        ),
        ConsumerSpec(
            "journal",
            _E,
            (f"{EVENTS_PREFIX}.>",),
            "Every event into the SQL read model (a database outage must not dead-letter the journal)",
            max_deliver=-1,
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
            ),
            "Saga participants projection (COL-1)",
        ),
    )
}


# --------------------------------------------------------------------------- the services
@dataclass(frozen=True)
class ServiceSpec:
    """One service as the rest of the system sees it: the one place to add a consumer, a responder,
    a timer namespace or an event type it sends.

    The embedded launcher, the service runtime (which refuses to start a consumer it does not
    declare), the AsyncAPI roles, the compose file and the Helm chart are derived from or checked
    against :data:`SERVICES`.
    """

    name: str
    #: The Python package (``python -m <package>`` runs it) and the console script ``temporality-<name>``.
    package: str
    description: str
    #: Prefix of the service's own settings (``TEMPORALITY_GATEWAY_PORT``, ...).
    env_prefix: str
    #: Durable consumers it runs (keys of :data:`CONSUMERS`).
    consumers: tuple[str, ...] = ()
    #: Request/reply subjects it answers.
    responders: tuple[str, ...] = ()
    #: Timer namespaces it arms and whose firings it consumes.
    timers: tuple[str, ...] = ()
    #: Default HTTP port of its API; ``None``: no HTTP API (a worker; probes use its ready file).
    http_port: int | None = None
    #: Event types it publishes / consumes (AsyncAPI send/receive operations).
    sends: tuple[str, ...] = ()
    receives: tuple[str, ...] = ()
    #: Subscribed to every event (``temporality.events.>``).
    receives_all: bool = False
    #: Request/reply subjects it calls.
    requests: tuple[str, ...] = ()

    @property
    def script(self) -> str:
        return f"temporality-{self.name}"


#: Every service dead-letters poison messages of its consumers (``bus.dead_lettered``).
_DLQ = "bus.dead_lettered"
SERVICES: dict[str, ServiceSpec] = {
    s.name: s
    for s in (
        ServiceSpec(
            "trigger-gateway",
            package="temporality_trigger_gateway",
            description="Webhook intake: auth, normalization, dedupe, run.requested",
            env_prefix="TEMPORALITY_GATEWAY_",
            http_port=8080,
            sends=("trigger.received", "trigger.accepted", "trigger.rejected", "run.requested", _DLQ),
            receives_all=True,  # journal events for `event` triggers (TRG-5)
        ),
        ServiceSpec(
            "run-executor",
            package="temporality_run_executor",
            description="Durable agent runs: state machine, checkpoints, tools, ask_human parking",
            env_prefix="TEMPORALITY_EXECUTOR_",
            consumers=("run-executor-requests", "run-executor-human"),
            sends=(
                "run.created",
                "run.started",
                "run.tool_called",
                "run.checkpointed",
                "run.resumed",
                "run.completed",
                "run.failed",
                "run.cancelled",
                "human.requested",
                _DLQ,
            ),
            receives=("run.requested", "human.answered", "human.expired", "human.rejected"),
            requests=(RPC_GET_COLLABORATORS,),
        ),
        ServiceSpec(
            "human-interaction",
            package="temporality_human_interaction",
            description="People: user directory, channels, web inbox, answer binding, deadlines",
            env_prefix="TEMPORALITY_HUMAN_",
            consumers=("human-interaction-requests", "human-interaction-deadlines"),
            timers=(TIMER_NS_HUMAN,),
            http_port=8081,
            sends=("human.notified", "human.answered", "human.expired", "human.rejected", _DLQ),
            receives=("human.requested",),
        ),
        ServiceSpec(
            "agent-collab",
            package="temporality_agent_collab",
            description="Saga participants and get_collaborators",
            env_prefix="TEMPORALITY_COLLAB_",
            consumers=("agent-collab-runs",),
            responders=(RPC_GET_COLLABORATORS,),
            sends=("run.requested", _DLQ),  # relay runs (COL-6)
            receives=("run.started", "run.completed", "run.failed", "run.cancelled", "human.answered"),
        ),
        ServiceSpec(
            "journal",
            package="temporality_journal",
            description="Every event into SQL; run and trajectory API",
            env_prefix="TEMPORALITY_JOURNAL_",
            consumers=("journal",),
            http_port=8082,
            sends=(_DLQ,),
            receives_all=True,
        ),
    )
}
