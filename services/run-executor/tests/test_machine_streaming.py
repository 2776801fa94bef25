"""AP-9 for hosted runs, decided from plain data (no NATS): ``report_progress`` as a plan of the turn and each
provider reply's ``metrics``, both ``run.streamed`` with the saga's correlation id, the turn's request id and
deterministic ids; redaction and size caps; the card's deny list. The same over a real nats-server:
``test_streaming.py``."""

from __future__ import annotations

import json
import typing
from functools import partial
from typing import Any

from executor_support import REVIEWER, run_requested
from machine_support import T0, make_checkpoint, make_run

from temporality_protocol import (
    AgentTaskStreamed,
    LaunchSource,
    RelayRequest,
    RunRequested,
    RunStreamed,
    RunToolCalled,
    TaskEventKind,
    ToolFailed,
)
from temporality_protocol.events import MAX_TEXT
from temporality_run_executor.agents import ProviderConfig
from temporality_run_executor.machine import (
    Agent,
    Boundary,
    CallTool,
    Decision,
    Emit,
    ProviderReplied,
    Publish,
    Refuse,
    Requested,
    SaveCheckpoint,
    ToolBroke,
    ToolOutput,
    ToolReturned,
    decide,
    offered_tools,
)
from temporality_run_executor.providers import AssistantTurn
from temporality_run_executor.records import ReceivedAsk, RunRecord, ToolCall, Usage
from temporality_run_executor.tools import (
    BUILTIN_TOOLS,
    REPORT_DATA_MAX_BYTES,
    REPORT_PROGRESS,
    ReportKind,
    ToolPolicy,
    ToolRegistry,
)

RUN_ID = "run-ap9-1"
ALL = Agent(REVIEWER.model_copy(update={"tools": ToolPolicy(allow=["*"])}), ToolRegistry(BUILTIN_TOOLS))
TOKEN = "ghp_" + "a1B2" * 9  # a GitHub token, as the built-in patterns know it


_run = partial(
    make_run, RUN_ID, launch=LaunchSource(kind="webhook", trigger_id="t"), correlation_id="saga-9", collab=True
)


_ckpt = partial(make_checkpoint, RUN_ID)


def _reply(*calls: ToolCall, usage: Usage | None = None, elapsed_s: float = 0.25) -> ProviderReplied:
    return ProviderReplied(
        turn=2, reply=AssistantTurn(content="", tool_calls=list(calls), usage=usage), elapsed_s=elapsed_s
    )


def _decide(incoming: ProviderReplied, agent: Agent = ALL, run: RunRecord | None = None, **ckpt: Any) -> Decision:
    return decide(run or _run(), _ckpt(**ckpt), agent, incoming, now=T0)


def _streamed(decision: Decision) -> list[Publish]:
    return [e for e in decision.effects if isinstance(e, Publish) and isinstance(e.data, RunStreamed)]


def _report(**arguments: Any) -> ToolCall:
    return ToolCall(id="call-rp", name=REPORT_PROGRESS, arguments=arguments)


# --------------------------------------------------------------------------- report_progress
def test_report_progress_publishes_run_streamed_with_the_saga_and_a_deterministic_id() -> None:
    calls = (_report(kind="progress", message="Read the PR; 2 of 3 files checked", data={"percent": 66}),)
    decision = _decide(_reply(*calls))
    reported, metrics = _streamed(decision)
    data = reported.data
    assert isinstance(data, RunStreamed)
    assert (data.kind, data.message, data.data, data.call_id) == (
        "progress",
        "Read the PR; 2 of 3 files checked",
        {"percent": 66},
        "call-rp",
    )
    assert (data.run_id, data.agent, data.turn, data.correlation_id, data.request_id) == (
        RUN_ID,
        "reviewer",
        2,
        "saga-9",
        RUN_ID,
    )
    assert reported.id_parts == ("2", "0")  # (turn, call index): a replayed turn republishes the same id
    assert metrics.id_parts == ("2", "metrics")
    assert decision.then == Boundary()  # decided by the machine, never invoked by the driver: the run goes on
    called = [e.data for e in decision.effects if isinstance(e, Publish) and isinstance(e.data, RunToolCalled)]
    assert json.loads(called[0].result_preview) == {
        "status": "reported",
        "kind": "progress",
        "request_id": RUN_ID,
        "truncated": False,
    }
    # facts before state: the report is published before the turn's checkpoint (which holds its tool result)
    kinds = [type(e).__name__ for e in decision.effects]
    assert kinds.index("SaveCheckpoint") > decision.effects.index(reported)
    assert _decide(_reply(*calls)) == decision  # the same reply decided twice: the same events, the same ids


def test_each_call_of_a_turn_is_its_own_event_and_the_agent_may_name_the_request() -> None:
    decision = _decide(
        _reply(
            _report(kind="log", message="one"),
            ToolCall(
                id="call-2",
                name=REPORT_PROGRESS,
                arguments={"kind": "warning", "message": "two", "request_id": "req-x"},
            ),
            ToolCall(id="call-3", name=REPORT_PROGRESS, arguments={"kind": "partial_result", "message": "three"}),
        )
    )
    *reported, _ = _streamed(decision)
    assert [(p.id_parts, p.data.kind, p.data.request_id) for p in reported] == [  # type: ignore[attr-defined]
        (("2", "0"), "log", RUN_ID),
        (("2", "1"), "warning", "req-x"),
        (("2", "2"), "partial_result", RUN_ID),
    ]


def test_report_progress_is_redacted_on_the_bus_and_in_run_tool_called() -> None:
    call = _report(
        kind="log",
        message=f"pushed with {TOKEN}",
        data={"db_password": "hunter2", "steps": [f"clone {TOKEN}", 3], "ok": True},
    )
    decision = _decide(_reply(call))
    reported, _ = _streamed(decision)
    data = reported.data
    assert isinstance(data, RunStreamed)
    assert data.message == "pushed with [REDACTED:github_token]"
    assert data.data == {
        "db_password": "[REDACTED:secret_assignment]",
        "steps": ["clone [REDACTED:github_token]", 3],
        "ok": True,
    }
    (called,) = [e.data for e in decision.effects if isinstance(e, Publish) and isinstance(e.data, RunToolCalled)]
    assert TOKEN not in json.dumps(called.model_dump(mode="json"))
    assert "hunter2" not in json.dumps(called.arguments)


def test_a_long_message_is_cut_and_too_much_data_is_refused_to_the_model() -> None:
    decision = _decide(_reply(_report(kind="partial_result", message="x" * (MAX_TEXT + 10))))
    reported, _ = _streamed(decision)
    assert isinstance(reported.data, RunStreamed)
    assert (len(reported.data.message), reported.data.truncated) == (MAX_TEXT, True)

    big = _report(kind="log", message="dump", data={"blob": "y" * REPORT_DATA_MAX_BYTES})
    decision = _decide(_reply(big))
    assert [p.data.kind for p in _streamed(decision)] == ["metrics"]  # type: ignore[attr-defined]
    (called,) = [e.data for e in decision.effects if isinstance(e, Publish) and isinstance(e.data, RunToolCalled)]
    assert "at most 8192" in json.loads(called.result_preview)["error"]


def test_bad_arguments_are_refused_by_the_schema_before_anything_is_published() -> None:
    for arguments in (
        {"kind": "metrics", "message": "I am the executor"},
        {"kind": "progress"},
        {"kind": "log", "message": "m", "x": 1},
    ):
        decision = _decide(_reply(_report(**arguments)))
        assert [p.data.kind for p in _streamed(decision)] == ["metrics"]  # type: ignore[attr-defined]
        (called,) = [e.data for e in decision.effects if isinstance(e, Publish) and isinstance(e.data, RunToolCalled)]
        assert json.loads(called.result_preview)["error"].startswith("invalid arguments for 'report_progress'")


def test_the_deny_list_refuses_report_progress() -> None:
    denied = Agent(REVIEWER.model_copy(update={"tools": ToolPolicy(allow=["*"], deny=[REPORT_PROGRESS])}), ALL.tools)
    assert REPORT_PROGRESS not in [t.name for t in offered_tools(_run(), denied)]
    assert REPORT_PROGRESS in [t.name for t in offered_tools(_run(), ALL)]
    default = Agent(REVIEWER.model_copy(update={"tools": ToolPolicy()}), ALL.tools)  # get_input, ask_human
    for agent, why in ((denied, "is denied for agent reviewer"), (default, "is not allowed for agent reviewer")):
        decision = _decide(_reply(_report(kind="progress", message="hi")), agent)
        assert [p.data.kind for p in _streamed(decision)] == ["metrics"]  # type: ignore[attr-defined]
        (called,) = [e.data for e in decision.effects if isinstance(e, Publish) and isinstance(e.data, RunToolCalled)]
        assert f"'report_progress' {why}" in json.loads(called.result_preview)["error"]


def test_the_plan_of_a_report_is_an_emit_never_an_invocation() -> None:
    big = {"b": "c" * (REPORT_DATA_MAX_BYTES + 1)}
    decision = _decide(
        _reply(
            _report(kind="progress", message="a"),
            ToolCall(id="c-big", name=REPORT_PROGRESS, arguments={"kind": "log", "message": "b", "data": big}),
            ToolCall(id="c-in", name="get_input"),
        )
    )
    assert isinstance(decision.then, CallTool)  # get_input is the driver's; the reports are decided already
    plans = decision.then.turn.plans
    assert [type(plan) for plan in plans[:2]] == [Emit, Refuse]


# --------------------------------------------------------------------------- metrics
def test_every_provider_reply_of_a_hosted_run_reports_its_metrics_once() -> None:
    usage = Usage(prompt_tokens=120, completion_tokens=30, total_tokens=150)
    first = _decide(_reply(ToolCall(id="c1", name="get_input"), usage=usage, elapsed_s=1.23456))
    assert isinstance(first.then, CallTool)
    assert first.effects == ()  # no wait of its own before the turn's tool calls
    decision = decide(_run(), _ckpt(), ALL, ToolReturned(first.then.turn, 0, ToolOutput("{}"), elapsed_s=1.5), now=T0)
    (metrics,) = _streamed(decision)
    # right after the commit, with run.checkpointed (no wait of its own); the checkpoint keeps them for a recovery
    (save,) = [e for e in decision.effects if isinstance(e, SaveCheckpoint)]
    assert decision.effects.index(metrics) > decision.effects.index(save)
    assert save.checkpoint.metrics == metrics.data
    data = metrics.data
    assert isinstance(data, RunStreamed)
    assert (data.kind, data.turn, data.correlation_id, data.request_id, data.call_id) == (
        "metrics",
        2,
        "saga-9",
        RUN_ID,
        None,
    )
    assert data.data == {
        "prompt_tokens": 120,
        "completion_tokens": 30,
        "total_tokens": 150,
        "provider_latency_s": 1.235,
        "tool_calls": 1,
        "tools": ["get_input"],
    }
    assert metrics.id_parts == ("2", "metrics")
    # a final answer and a token limit report theirs too, before the run ends
    done = _decide(_reply(usage=usage))
    assert done.effects[0] == _streamed(done)[0]
    limited = Agent(
        REVIEWER.model_copy(update={"limits": REVIEWER.limits.model_copy(update={"max_tokens": 10})}), ALL.tools
    )
    assert [p.data.kind for p in _streamed(_decide(_reply(usage=usage), limited))] == ["metrics"]  # type: ignore[attr-defined]


def test_the_metrics_name_the_request_the_turn_answers() -> None:
    received = [ReceivedAsk(request_id="req-in-7", asker_run_id="run-a", asker_agent="architect")]
    answer = ToolCall(id="c1", name="answer_agent", arguments={"request_id": "req-in-7", "answer": "yes"})
    decision = _decide(_reply(answer, _report(kind="progress", message="answered")), received=received)
    assert [p.data.request_id for p in _streamed(decision)] == ["req-in-7", "req-in-7"]  # type: ignore[attr-defined]
    relay = RelayRequest(
        request_id="req-relay-1", asker_run_id="run-a", asker_agent="architect", target_run_id="run-old"
    )
    decision = _decide(_reply(_report(kind="log", message="relaying")), run=_run(relay=relay))
    assert [p.data.request_id for p in _streamed(decision)] == ["req-relay-1", "req-relay-1"]  # type: ignore[attr-defined]


def test_an_external_agents_turn_reports_no_metrics_of_the_executor() -> None:
    external = Agent(
        REVIEWER.model_copy(update={"provider": ProviderConfig(kind="external", agent_id="example-agent")}), ALL.tools
    )
    assert _streamed(_decide(_reply(ToolCall(id="c1", name="get_input")), external)) == []


# --------------------------------------------------------------------------- the vocabulary
def test_run_streamed_speaks_agent_task_streamed_s_vocabulary() -> None:
    assert {*typing.get_args(ReportKind), "metrics"} == set(typing.get_args(TaskEventKind))
    shared = ("run_id", "turn", "kind", "correlation_id", "message", "data")
    for name in shared:
        assert RunStreamed.model_fields[name].annotation == AgentTaskStreamed.model_fields[name].annotation, name
        assert RunStreamed.model_fields[name].metadata == AgentTaskStreamed.model_fields[name].metadata, name
    assert RunStreamed.model_fields["request_id"].annotation is str


def test_a_recovery_republishes_the_last_turns_metrics_with_the_same_id() -> None:
    """A driver killed between a turn's commit and its metrics' publish: the recovery sends them again (the
    bus drops the repeat when they went out)."""
    reply = _reply(_report(kind="log", message="x"), usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2))
    (save,) = [e for e in _decide(reply).effects if isinstance(e, SaveCheckpoint)]
    committed = save.checkpoint
    assert committed.metrics is not None
    assert committed.metrics.turn == committed.turn == 2
    incoming = Requested(request=run_requested(RUN_ID).payload(RunRequested), correlation_id="saga-9")
    recovered = decide(_run(), committed, ALL, incoming, now=T0)
    assert [(p.id_parts, p.data) for p in _streamed(recovered)] == [(("2", "metrics"), committed.metrics)]


# --------------------------------------------------------------------------- what the journal shows of a tool call
def test_a_tool_call_s_arguments_result_and_error_are_journaled_redacted_and_the_model_gets_them_whole() -> None:
    """``run.tool_called`` and ``tool.failed`` leave the process: the executor's redaction patterns apply to the
    arguments (a value under a key naming a secret replaced whole), the result preview and the error, as to a
    question; the model's own conversation keeps the tool's result as it was."""
    told = ToolCall(id="call-1", name="notify", arguments={"recipient": "user:alice", "message": f"use {TOKEN}"})
    again = ToolCall(
        id="call-2", name="notify", arguments={"recipient": "user:alice", "message": "db_password=hunter2"}
    )
    first = _decide(_reply(told, again))
    assert isinstance(first.then, CallTool)
    returned = ToolReturned(first.then.turn, 0, ToolOutput(f"sent: {TOKEN}"), elapsed_s=0.5)
    second = decide(_run(), _ckpt(), ALL, returned, now=T0)
    (called,) = [e.data for e in second.effects if isinstance(e, Publish) and isinstance(e.data, RunToolCalled)]
    assert called.arguments == {"recipient": "user:alice", "message": "use [REDACTED:github_token]"}
    assert called.result_preview == "sent: [REDACTED:github_token]"
    assert isinstance(second.then, CallTool)
    broke = ToolReturned(second.then.turn, 1, ToolBroke(f"the server refused {TOKEN}"), elapsed_s=0.7)
    third = decide(_run(), _ckpt(), ALL, broke, now=T0)
    journaled = [e.data for e in third.effects if isinstance(e, Publish)]
    (failed,) = [d for d in journaled if isinstance(d, ToolFailed)]
    assert failed.error == "the server refused [REDACTED:github_token]"
    (called,) = [d for d in journaled if isinstance(d, RunToolCalled)]
    assert "hunter2" not in called.arguments["message"]
    assert TOKEN not in called.result_preview
    # the model gets the tool's result whole: its conversation is never journaled
    saved = next(e for e in third.effects if isinstance(e, SaveCheckpoint))
    assert any(m.role == "tool" and m.content == f"sent: {TOKEN}" for m in saved.checkpoint.messages)
