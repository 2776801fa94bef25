"""The run-executor's redaction patterns (SEC-1) come from its settings (``TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS``)
and are injected: settings -> engine -> run machine (and the tools). Unusable ones stop the start (exit 2 at
configuration) rather than failing every question later; usable ones redact every question it publishes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from executor_support import REVIEWER, executor_main, run_requested

from temporality_bus import Bus, NatsSettings
from temporality_protocol import Envelope, HumanRequested, RunRequested, RunState, make_event
from temporality_protocol.redaction import REDACT_PATTERNS_ENV, Redactor, process_redactor, redactor_from_json
from temporality_run_executor.__main__ import configure
from temporality_run_executor.machine import Agent, Boundary, Publish, Requested, decide, initial_checkpoint, new_record
from temporality_run_executor.records import PendingAsk
from temporality_run_executor.settings import Settings
from temporality_run_executor.tools import BUILTIN_TOOLS, ToolRegistry
from temporality_service import ConfigError
from temporality_testing.events import EventLog
from temporality_testing.inprocess import serving

AGENTS = Path(__file__).resolve().parents[3] / "config" / "agents.yaml"
TICKETS = '{"ticket": "TCK-[0-9]{6}"}'


@pytest.fixture(autouse=True)
def _fresh_redactor() -> Iterator[None]:
    process_redactor.cache_clear()  # it reads the environment once per process
    yield
    process_redactor.cache_clear()


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("{not json", "not JSON"),
        ('["ticket-\\\\d+"]', "JSON object"),
        ('{"ticket": "("}', "ticket"),
    ],
)
def test_unusable_patterns_stop_the_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str, says: str
) -> None:
    monkeypatch.setenv(REDACT_PATTERNS_ENV, value)
    with pytest.raises(ConfigError, match=REDACT_PATTERNS_ENV) as refused:
        configure(Settings(agents_file=AGENTS))
    assert says in str(refused.value)


def test_usable_patterns_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REDACT_PATTERNS_ENV, '{"ticket": "TCK-[0-9]{6}"}')
    settings = Settings(agents_file=AGENTS)
    assert settings.redact_patterns == '{"ticket": "TCK-[0-9]{6}"}'
    configure(settings)


def test_the_machine_redacts_a_question_with_the_patterns_it_is_given() -> None:
    now = datetime.now(UTC)
    run = new_record(Requested(request=_requested("run-redact-1").payload(RunRequested), correlation_id="c"), now)
    run = run.model_copy(update={"state": RunState.RUNNING})
    agent = Agent(REVIEWER, ToolRegistry(BUILTIN_TOOLS), hosted=frozenset({REVIEWER.id}))
    ask = {"recipient": "user:alice", "question": "May I close TCK-123456?", "options": [{"id": "yes", "label": "Yes"}]}
    pending = PendingAsk(request_id="hr-1", call_id="call-1", turn=1, asked_at=now, arguments=ask)
    ckpt = initial_checkpoint(run, agent, now).model_copy(update={"pending": pending})

    def asked(redactor: Redactor | None) -> HumanRequested:
        extra = {} if redactor is None else {"redactor": redactor}
        decision = decide(run, ckpt, agent, Boundary(), now=now, **extra)
        (question,) = [e.data for e in decision.effects if isinstance(e, Publish)]
        assert isinstance(question, HumanRequested)
        return question

    assert "TCK-123456" in asked(None).question  # the built-in patterns alone know no tickets
    question = asked(redactor_from_json(TICKETS))
    assert question.question == "May I close [REDACTED:ticket]?"
    assert "TCK-" not in question.title


async def test_the_service_redacts_every_question_with_its_settings_patterns(
    bus: Bus, event_log: EventLog, nats_settings: NatsSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The patterns reach the questions through the settings alone: the process environment holds none."""
    monkeypatch.delenv(REDACT_PATTERNS_ENV, raising=False)
    settings = Settings.model_validate({"nats": nats_settings, "agents_file": AGENTS, REDACT_PATTERNS_ENV: TICKETS})
    async with serving(("run-executor", executor_main(settings))):
        event = _requested("run-redact-2")
        await bus.publish(event)
        (requested,) = await event_log.wait_for("human.requested", run_id=event.runid, timeout_s=30)
    text = json.dumps(requested.data)
    assert "TCK-654321" not in text
    assert requested.payload(HumanRequested).title.startswith("Review [REDACTED:ticket]: ")
    assert process_redactor().redact("TCK-654321").text == "TCK-654321"  # nothing read from the environment


def _requested(run_id: str) -> Envelope:
    """The reviewer's run for the PR with a contract change (it asks a person), a ticket in its title."""
    data = run_requested(run_id).payload(RunRequested)
    titled = data.model_copy(update={"title": "Review TCK-654321: Orders API: return totals as money objects"})
    return make_event(titled, source="/test", id=f"evt-rr-{run_id}", run_id=run_id)
