"""The bus catalogue is data; the README documents it (DC-6: services subscribe to journal subjects)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from temporality_protocol import EVENT_MODELS
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    CONSUMERS,
    EVENTS_STREAM,
    RPC_GET_COLLABORATORS,
    SERVICES,
    ConsumerSpec,
    ServiceSpec,
    check_services,
    service_problems,
    subject_for,
    subject_matches,
)

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_documents_every_stream_consumer_bucket_and_rpc_subject() -> None:
    text = README.read_text(encoding="utf-8")
    names = [s.name for s in ALL_STREAMS] + list(CONSUMERS) + [b.name for b in ALL_BUCKETS] + [RPC_GET_COLLABORATORS]
    missing = [name for name in names if f"`{name}`" not in text]
    assert not missing, f"README.md's bus catalogue lacks {missing}"


def test_every_consumer_filter_lies_inside_its_stream() -> None:
    streams = {s.name: s for s in ALL_STREAMS}
    for spec in CONSUMERS.values():
        prefixes = [p.removesuffix(">") for p in streams[spec.stream].subjects]
        for subject in spec.filter_subjects:
            assert any(subject.startswith(p) for p in prefixes), (spec.durable, subject)


def test_every_event_type_has_a_subject_in_the_events_stream() -> None:
    prefix = EVENTS_STREAM.subjects[0].removesuffix(">")
    for event_type in EVENT_MODELS:
        assert subject_for(event_type).startswith(prefix)
        assert "*" not in event_type
        assert ">" not in event_type


# --------------------------------------------------------------------------- the services
def test_the_service_table_is_consistent() -> None:
    assert service_problems() == []
    check_services()
    assert [s.script for s in SERVICES.values()] == [f"temporality-{name}" for name in SERVICES]
    assert {s.name: s.port_env for s in SERVICES.values() if s.http_port is not None} == {
        "trigger-gateway": "TEMPORALITY_GATEWAY_PORT",
        "human-interaction": "TEMPORALITY_HUMAN_PORT",
        "journal": "TEMPORALITY_JOURNAL_PORT",
    }


def test_receives_is_what_the_consumers_filter() -> None:
    assert SERVICES["trigger-gateway"].receives == ()
    assert not SERVICES["trigger-gateway"].receives_all
    assert set(SERVICES["run-executor"].receives) == {
        "run.requested",
        "human.answered",
        "human.expired",
        "human.rejected",
        "run.cancel_requested",
    }
    # its timer consumer is internal; run endings cancel the run's pending requests; notifications go out
    assert set(SERVICES["human-interaction"].receives) == {
        "human.requested",
        "human.notify_requested",
        "run.completed",
        "run.failed",
        "run.cancelled",
    }
    assert SERVICES["journal"].receives_all
    assert set(SERVICES["journal"].receives) == set(EVENT_MODELS)


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.b.c", False),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.>", "a.b.c", True),
        ("a.>", "a", False),
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.b.d", False),
    ],
)
def test_subject_matches(pattern: str, subject: str, matches: bool) -> None:
    assert subject_matches(pattern, subject) is matches


def _with(name: str, **changes: object) -> dict[str, ServiceSpec]:
    return {**SERVICES, name: replace(SERVICES[name], **changes)}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("services", "consumers", "problem"),
    [
        (_with("journal", consumers=("journal", "jornal")), CONSUMERS, "names consumer 'jornal'"),
        (_with("agent-collab", consumers=("agent-collab-runs", "journal")), CONSUMERS, "consumer journal belongs to 2"),
        (_with("agent-collab", consumers=(), sends=()), CONSUMERS, "consumer agent-collab-runs belongs to 0"),
        (_with("agent-collab", responders=("temporality.rpc.nope",)), CONSUMERS, "answers 'temporality.rpc.nope'"),
        (_with("agent-collab", responders=()), CONSUMERS, "is answered by 0 services"),
        (_with("run-executor", requests=("temporality.rpc.nope",)), CONSUMERS, "requests 'temporality.rpc.nope'"),
        (
            _with("trigger-gateway", consumers=(), timers=()),  # still sends bus.dead_lettered
            CONSUMERS,
            "exactly when",
        ),
        (_with("journal", sends=()), CONSUMERS, "exactly when"),
        (
            _with("journal", sends=("bus.dead_lettered", "journal.nope")),
            CONSUMERS,
            "'journal.nope', which has no model",
        ),
        (_with("trigger-gateway", sends=("trigger.received",)), CONSUMERS, "no service sends"),
        (_with("human-interaction", timers=()), CONSUMERS, "timer namespaces []"),
        (_with("run-executor", timers=("human",)), CONSUMERS, "timer namespaces ['human']"),
        (_with("journal", package="journal"), CONSUMERS, "is not temporality_<name>"),
        (_with("journal", env_prefix="JOURNAL_"), CONSUMERS, "is not TEMPORALITY_<WORD>_"),
        (_with("journal", http_port=8080), CONSUMERS, "is also trigger-gateway's"),
        ({**SERVICES, "jrnl": SERVICES["journal"]}, CONSUMERS, "keyed under another name"),
        (
            SERVICES,
            {**CONSUMERS, "journal": replace(CONSUMERS["journal"], filter_subjects=(subject_for("nope.x"),))},
            "no modelled event matches",
        ),
    ],
)
def test_an_inconsistent_service_table_is_refused(
    services: dict[str, ServiceSpec], consumers: dict[str, ConsumerSpec], problem: str
) -> None:
    problems = service_problems(services, consumers)
    assert any(problem in p for p in problems), problems
    with pytest.raises(ValueError, match="SERVICES is inconsistent"):
        check_services(services, consumers)
