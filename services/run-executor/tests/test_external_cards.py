"""Cards executed by an external agent (AP-5): the card format, the AP-5 task a run gives its agent, the inputs
of a turn and the agent's actions as the machine's provider replies (pure; the whole path runs in
``tests/test_external_agent_tasks.py`` against the five services)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from temporality_protocol import HumanPolicy, LaunchSource, RunState, TaskToolCall
from temporality_protocol.agent_tasks import StoredAction, task_id_for
from temporality_run_executor.__main__ import configure
from temporality_run_executor.agents import AgentsFileError, load_agents
from temporality_run_executor.external import inputs_of, task_of, turn_of
from temporality_run_executor.machine import Agent, CallProvider
from temporality_run_executor.providers.base import ToolSpec, TurnContext
from temporality_run_executor.records import Message, RunRecord, ToolCall
from temporality_run_executor.settings import Settings
from temporality_run_executor.tools import BUILTIN_TOOLS, ToolRegistry

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "external-agent" / "agents.yaml"
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def test_the_example_card_loads_and_the_executor_starts_with_it() -> None:
    (card,) = load_agents(EXAMPLE).cards()
    assert (card.provider.kind, card.provider.agent_id) == ("external", "example-agent")
    configure(Settings(agents_file=EXAMPLE))  # no provider is built for it: no error


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        ("{kind: external}", "an external provider takes agent_id"),
        ("{kind: scripted, script: reviewer, agent_id: a}", "an external provider takes agent_id"),
        ("{kind: external, agent_id: 'bad id'}", "agent_id"),
    ],
)
def test_an_external_card_names_exactly_one_valid_agent(tmp_path: Path, provider: str, message: str) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(f"agents:\n  - {{id: ext, role: r, system_prompt: p, provider: {provider}}}\n", encoding="utf-8")
    with pytest.raises(AgentsFileError, match=message):
        load_agents(path)


def _run() -> RunRecord:
    return RunRecord(
        run_id="run-ext-1",
        state=RunState.RUNNING,
        agent="external-triager",
        title="Review PR #42",
        launch=LaunchSource(kind="webhook", trigger_id="ado-pr-review"),
        input={"pr": 42, "priority": "high", "acceptance_criteria": ["a person decided"]},
        human=HumanPolicy(allowed_recipients=["user:alice"]),
        correlation_id="saga-1",
        created_at=T0,
        updated_at=T0,
    )


def test_the_task_carries_the_run_s_facts() -> None:
    (card,) = load_agents(EXAMPLE).cards()
    agent = Agent(card, ToolRegistry(BUILTIN_TOOLS), hosted=frozenset())
    call = CallProvider(
        turn=1,
        messages=[],
        tools=[ToolSpec(name="ask_human", description="", parameters={})],
        budget_s=600.0,
        context=TurnContext(run_id="run-ext-1", agent="external-triager", title="Review PR #42", turn=1),
    )
    task = task_of(_run(), agent, call)
    assert (task.run_id, task.task_id, task.objective) == ("run-ext-1", task_id_for("run-ext-1"), "Review PR #42")
    assert task.context["people"] == ["user:alice"]
    assert task.context["input"]["pr"] == 42
    assert task.constraints["tools"] == ["ask_human"]
    assert (task.acceptance_criteria, task.priority, task.timeout_s) == (["a person decided"], "high", 600.0)


def test_a_turn_s_inputs_are_the_outcomes_of_the_last_tool_calls() -> None:
    asked = ToolCall(id="ext-1-0", name="ask_human", arguments={"question": "Go?"})
    messages = [
        Message(role="system", content="s"),
        Message(role="user", content="task"),
        Message(role="assistant", tool_calls=[asked]),
        Message(role="tool", tool_call_id="ext-1-0", content='{"answer": "yes"}'),
    ]
    (got,) = inputs_of(messages)
    assert (got.tool_call_id, got.tool, got.content) == ("ext-1-0", "ask_human", '{"answer": "yes"}')
    assert inputs_of(messages[:2]) == []


def test_actions_become_the_machine_s_provider_replies() -> None:
    call = TaskToolCall(name="ask_human", arguments={"recipient": "user:alice", "question": "Go?"})
    tools = turn_of(StoredAction(turn=1, action_id="a", kind="tool_calls", calls=[call], at=T0))
    assert not isinstance(tools, str)
    assert [(c.id, c.name, c.arguments["question"]) for c in tools.tool_calls] == [("ext-1-0", "ask_human", "Go?")]
    result = turn_of(StoredAction(turn=2, action_id="b", kind="result", result="Done", at=T0))
    assert not isinstance(result, str)
    assert (result.content, result.tool_calls) == ("Done", [])
    failure = turn_of(StoredAction(turn=2, action_id="c", kind="failure", error="no access", at=T0))
    assert failure == "the external agent failed the task: no access"
