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
    "TIMER_FIRED_HUMAN",
    "TIMER_SCHEDULE_HUMAN",
    "BucketSpec",
    "ConsumerSpec",
    "StreamSpec",
    "subject_for",
]

DAY = 24 * 3600

#: Every CloudEvent is published on ``temporality.events.<type>`` (e.g. ``temporality.events.run.requested``).
EVENTS_PREFIX = "temporality.events"
#: Dead letters: ``temporality.dlq.<consumer>``.
DLQ_PREFIX = "temporality.dlq"
#: Timer schedules live on ``temporality.timers.schedule.…`` and fire onto ``temporality.timers.fired.…``.
TIMER_SCHEDULE_HUMAN = "temporality.timers.schedule.human"
TIMER_FIRED_HUMAN = "temporality.timers.fired.human"
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
