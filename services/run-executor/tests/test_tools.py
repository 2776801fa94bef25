"""The tool registry: the card's allow/deny policy, JSON-schema argument checks, a breaking tool.

Unit checks of the policy and the schema messages, then runs over a real nats-server with the model
behind the OpenAI-compatible emulator (real HTTP), so what the model is offered and gets back is what
goes over the wire.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from executor_support import REVIEWER, RunExecutor, run_requested

from temporality_bus import Bus
from temporality_protocol import HumanNotifyRequested, ToolFailed
from temporality_run_executor.__main__ import configure
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.settings import Settings
from temporality_run_executor.tools import BUILTIN_TOOLS, Tool, ToolContext, ToolPolicy, ToolRegistry
from temporality_service import ConfigError
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, assistant_text, assistant_tool_call

BUILTINS = ToolRegistry(BUILTIN_TOOLS)


def _names(policy: ToolPolicy, registry: ToolRegistry = BUILTINS) -> list[str]:
    return [t.name for t in registry.offered(policy)]


def test_a_plain_list_is_the_allow_list_and_the_default_is_input_and_ask() -> None:
    assert ToolPolicy.model_validate(["get_input", "notify"]) == ToolPolicy(allow=["get_input", "notify"])
    assert _names(ToolPolicy()) == ["get_input", "ask_human"]


def test_deny_wins_over_allow_and_patterns_never_select_a_deprecated_alias() -> None:
    everything = ToolPolicy(allow=["*"])
    # not get_pr_context
    assert _names(everything) == [
        "get_input",
        "ask_human",
        "notify",
        "get_collaborators",
        "ask_agent",
        "answer_agent",
        "handoff_to_agent",
        "report_progress",
    ]
    assert _names(ToolPolicy(allow=["*"], deny=["notify", "ask_*", "report_*"])) == [
        "get_input",
        "get_collaborators",
        "answer_agent",
        "handoff_to_agent",
    ]
    assert _names(ToolPolicy(allow=["get_pr_context", "ask_human"])) == ["ask_human", "get_pr_context"]


def test_the_offered_tools_are_remembered_per_policy_and_handed_out_as_a_fresh_list() -> None:
    registry = ToolRegistry(BUILTIN_TOOLS)
    ask_only, everything = ToolPolicy(allow=["ask_*"]), ToolPolicy(allow=["*"], deny=["notify"])
    first = registry.offered(ask_only)
    assert [t.name for t in first] == ["ask_human", "ask_agent"]
    first.clear()  # a caller's list: the registry's memory is not it
    assert [t.name for t in registry.offered(ask_only)] == ["ask_human", "ask_agent"]
    assert "notify" not in [t.name for t in registry.offered(everything)]  # each policy its own
    assert [t.name for t in registry.offered(ToolPolicy(allow=["ask_*"]))] == ["ask_human", "ask_agent"]  # an equal one


def test_plain_names_that_name_no_tool_are_reported() -> None:
    policy = ToolPolicy(allow=["get_input", "get_inptu", "mcp.*"], deny=["rm_rf"])
    assert BUILTINS.unknown(policy) == ["get_inptu", "rm_rf"]


def test_argument_problems_name_the_place_and_the_reason() -> None:
    notify = BUILTINS.get("notify")
    assert notify is not None
    assert notify.argument_problem({"recipient": "user:alice", "message": "done"}) is None
    missing = notify.argument_problem({"recipient": "user:alice"})
    assert missing == "invalid arguments for 'notify' at (the arguments object): 'message' is a required property"
    wrong = notify.argument_problem({"recipient": "user:alice", "message": 7})
    assert wrong is not None
    assert wrong.startswith("invalid arguments for 'notify' at message: 7 is not of type 'string'")
    get_input = BUILTINS.get("get_input")
    assert get_input is not None
    assert "Additional properties are not allowed" in (get_input.argument_problem({"path": "x"}) or "")


def test_a_card_naming_an_unknown_tool_is_refused_at_start(tmp_path: Path) -> None:
    agents = tmp_path / "agents.yaml"
    agents.write_text(
        "agents:\n"
        "  - id: typo\n    role: r\n    system_prompt: s\n    tools: [get_input, ask_humn]\n"
        "    provider: {kind: scripted, script: reviewer}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=r"agent typo: tools names unknown tools \['ask_humn'\]"):
        configure(Settings(agents_file=agents))


# --------------------------------------------------------------------------- through a run


def _card(emulator: OpenAIEmulator, tools: ToolPolicy) -> AgentCard:
    provider = ProviderConfig(kind="openai", base_url=emulator.base_url, model="m", max_retries=0)
    return REVIEWER.model_copy(update={"provider": provider, "tools": tools})


def _tool_results(request: dict[str, Any]) -> dict[str, Any]:
    """The tool messages of a request the model received, by call id, content parsed."""
    return {m["tool_call_id"]: json.loads(m["content"]) for m in request["messages"] if m["role"] == "tool"}


async def test_a_denied_tool_is_never_offered_and_a_call_to_it_is_refused(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [
        assistant_tool_call("call_n", "notify", {"recipient": "user:alice", "message": "hi"}),
        assistant_text("done"),
    ]
    await executor(cards=[_card(emulator, ToolPolicy(allow=["*"], deny=["notify", "*_agent", "get_collaborators"]))])
    event = run_requested()
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=event.runid)
    offered = [t["function"]["name"] for t in emulator.requests[0]["tools"]]
    assert offered == ["get_input", "ask_human", "report_progress"]
    refusal = _tool_results(emulator.requests[1])["call_n"]["error"]
    assert (
        refusal
        == "tool 'notify' is denied for agent reviewer (its tools.deny); its tools: get_input, ask_human, report_progress"
    )
    await event_log.caught_up()
    assert not event_log.of_type("human.notify_requested", event.runid)


async def test_schema_errors_go_back_to_the_model_and_a_valid_notify_is_published(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [
        assistant_tool_call("call_bad", "notify", {"recipient": "user:alice"}),
        assistant_tool_call("call_mallory", "notify", {"recipient": "user:mallory", "message": "psst"}),
        assistant_tool_call("call_ok", "notify", {"recipient": "user:alice", "message": "Review started."}),
        assistant_text("done"),
    ]
    await executor(cards=[_card(emulator, ToolPolicy(allow=["get_input", "notify"]))])
    event = run_requested()
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=event.runid)
    assert _tool_results(emulator.requests[1])["call_bad"]["error"] == (
        "invalid arguments for 'notify' at (the arguments object): 'message' is a required property"
    )
    assert "user:mallory may not be notified" in _tool_results(emulator.requests[2])["call_mallory"]["error"]
    assert _tool_results(emulator.requests[3])["call_ok"]["status"] == "queued"
    (notified,) = await event_log.wait_for("human.notify_requested", run_id=event.runid)
    data = notified.payload(HumanNotifyRequested)
    assert (data.recipient, data.message, data.turn) == ("user:alice", "Review started.", 3)
    assert data.policy.allowed_recipients == ["user:alice"]
    await event_log.caught_up()
    assert len(event_log.of_type("human.notify_requested", event.runid)) == 1


def test_a_group_is_a_recipient_of_ask_human_and_notify() -> None:
    """docs/human-interaction.md#groups-as-recipients: ``group:<id>`` asks (or tells) every member."""
    ask, notify = BUILTINS.get("ask_human"), BUILTINS.get("notify")
    assert ask is not None
    assert notify is not None
    assert ask.argument_problem({"recipient": "group:api-owners", "question": "Drop v1?"}) is None
    assert notify.argument_problem({"recipient": "group:api-owners", "message": "done"}) is None
    channel = notify.argument_problem({"recipient": "matrix:@alice:example.org", "message": "done"})
    assert channel is not None
    assert "does not match" in channel


async def test_a_group_is_notified_when_the_trigger_allows_the_group_itself(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [
        assistant_tool_call("call_member", "notify", {"recipient": "user:alice", "message": "hi"}),
        assistant_tool_call("call_group", "notify", {"recipient": "group:api-owners", "message": "Review started."}),
        assistant_text("done"),
    ]
    await executor(cards=[_card(emulator, ToolPolicy(allow=["get_input", "notify"]))])
    event = run_requested(allowed=["group:api-owners"])
    await bus.publish(event)
    await event_log.wait_for("run.completed", run_id=event.runid)
    # allowing the group does not allow its members one by one (SEC-1)
    assert "user:alice may not be notified" in _tool_results(emulator.requests[1])["call_member"]["error"]
    assert _tool_results(emulator.requests[2])["call_group"]["status"] == "queued"
    (notified,) = await event_log.wait_for("human.notify_requested", run_id=event.runid)
    data = notified.payload(HumanNotifyRequested)
    assert (data.recipient, data.message) == ("group:api-owners", "Review started.")


async def test_a_tool_that_raises_is_a_tool_failed_event_and_an_error_for_the_model(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    async def explode(arguments: dict[str, Any], ctx: ToolContext) -> str:
        raise RuntimeError(f"disk gone while reading {arguments['path']}")

    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    tools = BUILTINS.with_tools(
        [Tool(name="read_file", description="Read a file", parameters=schema, implementation=explode)]
    )
    emulator.replies += [
        assistant_tool_call("call_read", "read_file", {"path": "a.py"}),
        assistant_text("Could not read the file; finishing."),
    ]
    await executor(cards=[_card(emulator, ToolPolicy(allow=["get_input", "read_file"]))], tools=tools)
    event = run_requested()
    await bus.publish(event)
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid)
    assert completed.data["result"] == "Could not read the file; finishing."
    (failed,) = await event_log.wait_for("tool.failed", run_id=event.runid)
    assert failed.payload(ToolFailed) == ToolFailed(
        run_id=str(event.runid),
        turn=1,
        call_id="call_read",
        tool="read_file",
        error="RuntimeError: disk gone while reading a.py",
    )
    result = _tool_results(emulator.requests[1])["call_read"]["error"]
    assert result == "the tool 'read_file' failed: RuntimeError: disk gone while reading a.py"
    await event_log.caught_up()
    assert not event_log.of_type("run.failed", event.runid)
    assert not event_log.of_type("bus.dead_lettered")
