"""AP-9 for hosted runs over a real nats-server: a scripted agent reports progress, a log line and a warning
with ``report_progress`` and every turn reports its metrics -- each a ``run.streamed`` on the bus with the
saga's correlation id, the run's request id and the deterministic id of (run, turn, call index) / (run, turn,
``metrics``). A driver killed right after publishing them and replaced by another publishes nothing twice;
a card that denies the tool gets a tool error and streams nothing but its metrics. The decisions alone:
``test_machine_streaming.py``."""

from __future__ import annotations

import asyncio
import json
from typing import SupportsIndex

import pytest
from executor_processes import Crash, Process, start_process
from executor_support import REVIEWER, RunExecutor, run_record, run_requested, settled

from temporality_bus import Bus, NatsSettings
from temporality_protocol import Envelope, RunState, RunStreamed, derive_id
from temporality_protocol.catalog import service_source
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.providers.script import Script
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, Reply, assistant_text, assistant_tool_call
from temporality_testing.waiting import stays

TOKEN = "ghp_" + "x9Y8" * 9  # a GitHub token, as the built-in redaction patterns know it
SCRIPT = Script.model_validate(
    {
        "steps": [
            {
                "id": "start",
                "calls": [
                    {
                        "tool": "report_progress",
                        "args": {"kind": "progress", "message": "Reading", "data": {"percent": 10}},
                    },
                    {"tool": "get_input"},
                ],
            },
            {
                "id": "work",
                "calls": [
                    {"tool": "report_progress", "args": {"kind": "log", "message": f"cloned with {TOKEN}"}},
                    {"tool": "report_progress", "args": {"kind": "warning", "message": "no tests for the change"}},
                ],
            },
            {"id": "done", "answer": "Reviewed: {{ results.work[1].status }}"},
        ]
    }
)
REPORTER = AgentCard(
    id="reporter",
    role="Reporter",
    system_prompt="You report how it goes.",
    tools=ToolPolicy(allow=["get_input", "report_progress"]),
    provider=ProviderConfig(kind="scripted", script=SCRIPT),
)
SILENCED = REPORTER.model_copy(update={"id": "silenced", "tools": ToolPolicy(allow=["*"], deny=["report_progress"])})
SAGA = "saga-ap9"
#: (turn, call index or "metrics", kind) of every run.streamed of a REPORTER run, in the order published.
EXPECTED = [
    ("1", "metrics", "metrics"),
    ("1", "0", "progress"),
    ("2", "metrics", "metrics"),
    ("2", "0", "log"),
    ("2", "1", "warning"),
    ("3", "metrics", "metrics"),
]


async def _launch(bus: Bus, agent: str) -> str:
    """A run of ``agent`` requested in the saga :data:`SAGA`; its id."""
    event = run_requested(agent=agent).model_copy(update={"correlationid": SAGA})
    assert event.runid
    await bus.publish(event)
    return event.runid


def _streamed(log: EventLog, run_id: str) -> list[Envelope]:
    return log.of_type("run.streamed", run_id)


def _check(streamed: list[Envelope], run_id: str) -> None:
    """Each expected event once, with its deterministic id, the saga and the run's request id, redacted."""
    ids = [e.id for e in streamed]
    assert sorted(ids) == sorted(derive_id("evt", run_id, "run.streamed", turn, part) for turn, part, _ in EXPECTED)
    assert len(set(ids)) == len(ids)
    by_id = {e.id: e.payload(RunStreamed) for e in streamed}
    for turn, part, kind in EXPECTED:
        data = by_id[derive_id("evt", run_id, "run.streamed", turn, part)]
        assert isinstance(data, RunStreamed)
        assert (data.run_id, data.agent, data.turn, data.kind) == (run_id, "reporter", int(turn), kind)
        assert (data.correlation_id, data.request_id) == (SAGA, run_id)
    for event in streamed:
        assert (event.correlationid, event.runid, event.source) == (SAGA, run_id, service_source("run-executor"))
        assert event.actor == "agent:reporter"
    log_line = by_id[derive_id("evt", run_id, "run.streamed", "2", "0")]
    assert isinstance(log_line, RunStreamed)
    assert log_line.message == "cloned with [REDACTED:github_token]"
    metrics = by_id[derive_id("evt", run_id, "run.streamed", "1", "metrics")]
    assert isinstance(metrics, RunStreamed)
    assert (metrics.data["tool_calls"], metrics.data["tools"]) == (2, ["report_progress", "get_input"])
    assert metrics.data["provider_latency_s"] >= 0


async def test_a_hosted_run_streams_progress_logs_and_metrics_on_the_bus(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    await executor(cards=[REVIEWER, REPORTER])
    run_id = await _launch(bus, "reporter")
    (completed,) = await event_log.wait_for("run.completed", run_id=run_id)
    assert completed.data["result"] == "Reviewed: reported"
    await event_log.wait_for("run.streamed", run_id=run_id, count=len(EXPECTED))
    await event_log.caught_up()
    streamed = _streamed(event_log, run_id)
    _check(streamed, run_id)
    # a report goes out with its turn's events, the turn's metrics with its commit
    assert [e.payload(RunStreamed).kind for e in streamed][:2] == ["progress", "metrics"]
    called = [e.data for e in event_log.of_type("run.tool_called", run_id) if e.data["tool"] == "report_progress"]
    assert TOKEN not in str(called)
    assert not event_log.of_type("bus.dead_lettered")


# the seam, its nth passing: right after the first turn's events are stored (its checkpoint not), after turn 2's
REPLAYS = [
    pytest.param("published:run.streamed", 2, id="turn1-report-published-not-checkpointed"),
    pytest.param("published:run.streamed", 5, id="turn2-reports-published-not-checkpointed"),
    pytest.param("effect:SaveCheckpoint", 2, id="turn2-checkpoint-written-not-published"),
]


@pytest.mark.parametrize(("point", "nth"), REPLAYS)
async def test_a_replayed_turn_publishes_no_streamed_event_twice(
    bus: Bus, event_log: EventLog, nats_settings: NatsSettings, processes: list[Process], point: str, nth: int
) -> None:
    crash = Crash(point, nth)
    first = await start_process(nats_settings, "executor-1", [REPORTER], crash)
    processes.append(first)
    run_id = await _launch(bus, "reporter")
    await asyncio.wait_for(crash.crashed.wait(), 30)
    await first.end()
    processes.append(await start_process(nats_settings, "executor-2", [REPORTER]))
    await event_log.wait_for("run.completed", run_id=run_id, timeout_s=60)
    await run_record(bus, run_id, lambda r: r.state is RunState.COMPLETED)
    await settled(bus)
    await event_log.caught_up()

    def six() -> bool:
        return len(_streamed(event_log, run_id)) == len(EXPECTED)

    await stays(six, settle_s=1.0, what=f"each streamed event of {run_id} once")
    _check(_streamed(event_log, run_id), run_id)
    assert not event_log.of_type("bus.dead_lettered")


async def test_a_card_that_denies_report_progress_gets_a_tool_error_and_streams_only_metrics(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    await executor(cards=[REVIEWER, SILENCED])
    run_id = await _launch(bus, "silenced")
    await event_log.wait_for("run.completed", run_id=run_id)
    await event_log.caught_up()
    assert [e.payload(RunStreamed).kind for e in _streamed(event_log, run_id)] == ["metrics"] * 3
    refused = [e.data for e in event_log.of_type("run.tool_called", run_id) if e.data["tool"] == "report_progress"]
    assert len(refused) == 3
    assert all("'report_progress' is denied for agent silenced" in r["result_preview"] for r in refused)
    started = event_log.of_type("run.started", run_id)[0]
    assert "report_progress" not in started.data["agent_card"]["tools"]


async def test_the_shipped_reviewer_reports_its_progress_where_its_card_offers_the_tool(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    """The demo: the scripted reviewer (``scripts/reviewer.yaml``) says how far it is before it asks."""
    reporting = REVIEWER.model_copy(update={"tools": ToolPolicy(allow=["get_input", "ask_human", "report_progress"])})
    await executor(cards=[reporting])
    event = run_requested()
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    await event_log.wait_for("human.requested", run_id=run_id)
    await event_log.caught_up()
    reports = [e.payload(RunStreamed) for e in _streamed(event_log, run_id) if e.data["kind"] != "metrics"]
    assert [(r.kind, r.turn, r.request_id) for r in reports] == [("progress", 2, run_id)]
    keywords = reports[0].data["keywords"]
    assert (reports[0].data["pr"], "api" in keywords) == (42, True)
    assert reports[0].message == f"Read PR #42; API-contract keywords found: {len(keywords)}"
    turns = sorted(e.data["turn"] for e in _streamed(event_log, run_id) if e.data["kind"] == "metrics")
    assert turns == [1, 2, 3]  # get_input, report_progress, ask_human


class _ByConversation(list[Reply]):
    """The emulator's replies chosen by the conversation it was sent (it records the request before it takes a
    reply): ``first`` until the model has a tool result, then ``then`` -- so a turn replayed under load (its
    message redelivered while the first delivery still waits) gets the same reply again."""

    def __init__(self, emulator: OpenAIEmulator, first: Reply, then: Reply) -> None:
        super().__init__([first, then])
        self.emulator, self.first, self.then = emulator, first, then

    def pop(self, index: SupportsIndex = -1) -> Reply:
        answered = any(m["role"] == "tool" for m in self.emulator.requests[-1]["messages"])
        return self.then if answered else self.first


async def test_an_openai_compatible_model_calls_report_progress_like_any_tool(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    """The OpenAI-compatible path unchanged: the tool is offered with its schema, the model's call streams, and
    the metrics carry the endpoint's token usage."""
    usage = {"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57}
    emulator.replies = _ByConversation(
        emulator,
        assistant_tool_call("call_p", "report_progress", {"kind": "partial_result", "message": "1 issue"}, usage=usage),
        assistant_text("done", usage=usage),
    )
    provider = ProviderConfig(kind="openai", base_url=emulator.base_url, model="m", max_retries=0)
    card = REPORTER.model_copy(update={"id": "modelled", "provider": provider})
    await executor(cards=[REVIEWER, card])
    run_id = await _launch(bus, "modelled")
    await event_log.wait_for("run.completed", run_id=run_id)
    await event_log.caught_up()
    offered = {t["function"]["name"]: t["function"] for t in emulator.requests[0]["tools"]}
    assert offered["report_progress"]["parameters"]["required"] == ["kind", "message"]
    # what the model got back for its call (in the last request: a turn replayed under load asks again first)
    tool_messages = [m for m in emulator.requests[-1]["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], json.loads(m["content"])["status"]) for m in tool_messages] == [("call_p", "reported")]
    streamed = [e.payload(RunStreamed) for e in _streamed(event_log, run_id)]
    assert sorted((s.turn, s.kind) for s in streamed) == [(1, "metrics"), (1, "partial_result"), (2, "metrics")]
    assert all((s.correlation_id, s.request_id, s.agent) == (SAGA, run_id, "modelled") for s in streamed)
    first = next(s for s in streamed if s.kind == "metrics" and s.turn == 1)
    assert (first.data["prompt_tokens"], first.data["completion_tokens"]) == (50, 7)
