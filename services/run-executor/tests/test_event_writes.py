"""The events the engine fires go out as ``encode_event`` writes them (the data serialized once from its model):
the same message as the :class:`~temporality_protocol.Envelope` the engine builds for the events it publishes
itself (``Engine._event``, then ``encode``) -- subject, headers and every attribute and data field, the time aside
(each takes its own ``now``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from temporality_bus.pipeline import event_write
from temporality_protocol import EventData, RunCompleted, RunResumed, RunStarted, RunStreamed, decode
from temporality_protocol.events import LaunchSource, RunUsage
from temporality_run_executor.engine import Engine
from temporality_run_executor.records import RunRecord

NOW = datetime(2026, 12, 6, 21, 0, tzinfo=UTC)
RUN = RunRecord(
    run_id="run-7f3a",
    state="running",
    agent="reviewer",
    title="Review PR 42",
    launch=LaunchSource(kind="webhook", trigger_id="ado-pr-review"),
    correlation_id="corr-1",
    tenant="acme",
    created_at=NOW,
    updated_at=NOW,
)
_TIME = re.compile(rb'"time":"[^"]*"')


@pytest.mark.parametrize(
    ("data", "causation", "run_id"),
    [
        (RunStarted(run_id=RUN.run_id, agent="reviewer", role="Reviewer", title=RUN.title), None, None),
        (
            RunResumed(run_id=RUN.run_id, reason="answer", from_turn=3, request_id="hr-1", waited_s=1.5),
            "evt-answer",
            None,
        ),
        (
            RunStreamed(
                run_id=RUN.run_id,
                agent="reviewer",
                turn=2,
                kind="metrics",
                correlation_id="corr-1",
                request_id="req-1",
                message='turn 2: ünïcode, "quotes" and a\nnewline',
                data={"tools": ["ask_human"], "provider_latency_s": 0.012},
            ),
            None,
            None,
        ),
        (RunCompleted(run_id=RUN.run_id, result="LGTM", turns=3, usage=RunUsage(turns=3, tool_calls=3)), None, None),
        (RunCompleted(run_id="run-child", result="done", turns=1, usage=RunUsage(turns=1)), "evt-x", "run-child"),
    ],
)
def test_a_fired_event_is_the_envelope_the_engine_would_build(
    data: EventData, causation: str | None, run_id: str | None
) -> None:
    fired = event_write(Engine._encoded(RUN, data, "part", causation=causation, run_id=run_id))
    built = event_write(Engine._event(RUN, data, "part", causation=causation, run_id=run_id))
    assert (fired.subject, fired.headers) == (built.subject, built.headers)
    assert _TIME.sub(b"", fired.payload) == _TIME.sub(b"", built.payload)  # byte for byte, the time aside
    assert decode(fired.payload).model_dump(exclude={"time"}) == decode(built.payload).model_dump(exclude={"time"})
