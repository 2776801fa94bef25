"""The bus catalogue is data; the README documents it (DC-6: services subscribe to journal subjects)."""

from __future__ import annotations

from pathlib import Path

from temporality_protocol import EVENT_MODELS
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    CONSUMERS,
    EVENTS_STREAM,
    RPC_GET_COLLABORATORS,
    subject_for,
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
