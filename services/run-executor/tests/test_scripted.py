"""The scripted provider (deterministic, for demos and tests): declarative steps, templates, load-time checks.

The provider itself is pure (a conversation in, a turn out), so most checks drive it directly; the shipped
reviewer script is exercised end to end by test_engine.py and tests/test_e2e.py, and here once through a
card that offers only the deprecated get_pr_context (the Helm chart's card).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from executor_support import REVIEWER, RunExecutor, run_requested
from pydantic import ValidationError

from temporality_bus import Bus
from temporality_protocol import HumanRequested
from temporality_run_executor.agents import AgentCard, ProviderConfig, load_agents
from temporality_run_executor.providers import PermanentProviderError, ToolSpec, TurnContext
from temporality_run_executor.providers.factory import ProviderCache, ProviderConfigError
from temporality_run_executor.providers.script import Script, render
from temporality_run_executor.providers.scripted import ScriptedProvider
from temporality_run_executor.records import Message, ToolCall
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog

SCRIPT: dict[str, Any] = {
    "vars": {"item": "{{ results.read.item }}", "n": "{{ length(results.read.tags || `[]`) }}"},
    "steps": [
        {"id": "read", "call": {"tool": "get_input"}},
        {
            "id": "ask",
            "when": "vars.item != null",
            "say": "Asking about {{ vars.item }} ({{ vars.n }} tags).",
            "call": {
                "tool": "ask_human",
                "args": {
                    "recipient": "{{ run.people[0] }}",
                    "question": "Ship {{ vars.item }}?",
                    "options": [{"id": "yes-ship", "label": "Yes"}, {"id": "no", "label": "No"}],
                    "tags": "{{ results.read.tags }}",
                },
            },
        },
        {
            "id": "done",
            "answer": {
                "switch": "results.ask.answer.option_id || results.ask.answer.type",
                "cases": {"yes-ship": "Shipping {{ vars.item }}.", "text": "They said: {{ results.ask.answer.value }}"},
                "default": "Not shipping ({{ results.ask.status || 'nothing asked' }}).",
            },
        },
    ],
}
TOOLS = [ToolSpec(name=n, description="", parameters={"type": "object"}) for n in ("get_input", "ask_human")]
CONTEXT = TurnContext(run_id="run-1", agent="a", title="t", people=["user:alice"], turn=1)


def _provider(script: dict[str, Any] = SCRIPT) -> ScriptedProvider:
    return ScriptedProvider(Script.model_validate(script))


def _called(step: str, tool: str, result: Any) -> list[Message]:
    """The conversation after a scripted call of ``step`` returned ``result``."""
    return [
        Message(role="assistant", tool_calls=[ToolCall(id=f"call-{step}", name=tool)]),
        Message(role="tool", tool_call_id=f"call-{step}", name=tool, content=json.dumps(result)),
    ]


async def test_steps_run_in_order_with_templates_from_results_and_run_facts() -> None:
    provider = _provider()
    start = [Message(role="system", content="whatever the prompt says"), Message(role="user", content="go")]
    first = await provider.complete(start, TOOLS, context=CONTEXT)
    assert first.tool_calls == [ToolCall(id="call-read", name="get_input", arguments={})]
    read = [*start, *_called("read", "get_input", {"item": "v2 API", "tags": ["api", "breaking"]})]
    second = await provider.complete(read, TOOLS, context=CONTEXT)
    assert second.content == "Asking about v2 API (2 tags)."
    (ask,) = second.tool_calls
    assert ask.id == "call-ask"
    assert ask.arguments["recipient"] == "user:alice"
    assert ask.arguments["question"] == "Ship v2 API?"
    assert ask.arguments["tags"] == ["api", "breaking"]  # a whole-string template keeps the value's type
    answered = {"status": "answered", "answer": {"type": "option", "option_id": "yes-ship"}}
    final = await provider.complete([*read, *_called("ask", "ask_human", answered)], TOOLS, context=CONTEXT)
    assert (final.content, final.tool_calls) == ("Shipping v2 API.", [])
    text = {"status": "answered", "answer": {"type": "text", "value": "next week"}}
    final = await provider.complete([*read, *_called("ask", "ask_human", text)], TOOLS, context=CONTEXT)
    assert final.content == "They said: next week"
    rejected = {"status": "rejected", "error": "no_channel: none"}
    final = await provider.complete([*read, *_called("ask", "ask_human", rejected)], TOOLS, context=CONTEXT)
    assert final.content == "Not shipping (rejected)."


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ results.read.tags }}", ["a", "b"]),  # exactly one expression: its value
        ("  {{ results.read.item }} ", "PR-7"),
        ("no template", "no template"),
        ("{{ results.read.item }}/{{ results.read.tags }} and {{ results.none }}.", 'PR-7/["a", "b"] and .'),
        ("{{ results.read.item }}{{ length(results.read.tags) }}", "PR-72"),
    ],
)
def test_templates_render_the_same_every_time(template: str, expected: Any) -> None:
    """A template is split once and kept (the scripted provider renders the same strings every turn)."""
    scope = {"results": {"read": {"item": "PR-7", "tags": ["a", "b"]}}}
    assert [render(template, scope, "t") for _ in range(2)] == [expected, expected]


async def test_a_step_whose_when_fails_is_skipped_and_the_prompt_is_never_read() -> None:
    provider = _provider()
    read = _called("read", "get_input", {"other": 1})
    for prompt in ("Call ask_human now!", "People you may ask: user:mallory"):
        turn = await provider.complete([Message(role="user", content=prompt), *read], TOOLS, context=CONTEXT)
        assert (turn.content, turn.tool_calls) == ("Not shipping (nothing asked).", [])


async def test_an_expression_failing_while_running_is_a_permanent_provider_error() -> None:
    script = {"steps": [{"id": "done", "answer": "{{ length(run.turn) }}"}]}
    with pytest.raises(PermanentProviderError, match=r"step done\.answer: 'length\(run.turn\)' failed: .*length"):
        await _provider(script).complete([], TOOLS, context=CONTEXT)


@pytest.mark.parametrize(
    ("steps", "problem"),
    [
        ([{"id": "a", "answer": "{{ results.[ }}"}], "step a.answer: not a JMESPath expression"),
        ([{"id": "a", "when": "x ==", "answer": "x"}, {"id": "b", "answer": "y"}], "step a.when: not a JMESPath"),
        ([{"id": "a", "call": {"tool": "get_input"}}], "the last step (a) must be an answer without when"),
        ([{"id": "a", "answer": "x", "call": {"tool": "t"}}], "step a: exactly one of call or answer"),
        ([{"id": "a", "answer": "x"}, {"id": "a", "answer": "y"}], "step ids repeat: ['a']"),
        ([{"id": "a", "answer": {"switch": "x", "cases": {True: "y"}, "default": "z"}}], "ScriptAnswer.cases.1.[key]"),
    ],
)
def test_a_bad_script_is_refused_when_loaded_naming_the_place(steps: list[dict[str, Any]], problem: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Script.model_validate({"steps": steps})
    assert problem in str(caught.value)


def test_scripts_by_name_inline_or_in_a_file_next_to_the_agents_file(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "hello.yaml").write_text("steps:\n  - id: hi\n    answer: Hello.\n", encoding="utf-8")
    agents = tmp_path / "agents.yaml"
    agents.write_text(
        "agents:\n"
        "  - {id: by-file, role: r, system_prompt: s, provider: {kind: scripted, script_file: scripts/hello.yaml}}\n"
        "  - {id: inline, role: r, system_prompt: s,\n"
        "     provider: {kind: scripted, script: {steps: [{id: hi, answer: Inline.}]}}}\n"
        "  - {id: named, role: r, system_prompt: s, provider: {kind: scripted, script: reviewer}}\n",
        encoding="utf-8",
    )
    cache = ProviderCache()
    cards = load_agents(agents).cards()
    cache.validate(cards)
    scripts = {card.id: cache(card) for card in cards}
    assert all(isinstance(p, ScriptedProvider) for p in scripts.values())
    unknown = REVIEWER.model_copy(update={"provider": ProviderConfig(kind="scripted", script="nobody")})
    with pytest.raises(ProviderConfigError, match=r"agent reviewer: provider.script: no script named 'nobody'"):
        cache.validate([unknown])
    with pytest.raises(ValidationError, match="exactly one of script or script_file"):
        ProviderConfig(kind="scripted")


async def test_the_reviewer_script_reads_through_the_deprecated_alias_when_that_is_all_it_is_offered(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    legacy: AgentCard = REVIEWER.model_copy(update={"tools": ToolPolicy(allow=["get_pr_context", "ask_human"])})
    await executor(cards=[legacy])
    event = run_requested()
    await bus.publish(event)
    (requested,) = await event_log.wait_for("human.requested", run_id=event.runid)
    assert "PR #42 'Orders API: return totals as money objects'" in requested.payload(HumanRequested).question
    (called,) = event_log.of_type("run.tool_called", event.runid)
    assert called.data["tool"] == "get_pr_context"


#: A script whose vars chain (b reads a; c reads a later var, d, which it sees as null) and one no step reads
#: after the first (``costly``); the last step reads ``b`` and ``c`` only.
CHAINED: dict[str, Any] = {
    "vars": {
        "a": "{{ results.read.item }}",
        "b": "{{ join('-', [vars.a || 'none', 'b']) }}",
        "c": "{{ vars.d || 'd unseen' }}",
        "d": "D",
        "costly": "{{ length(results.read.tags || `[]`) }}",
    },
    "steps": [
        {"id": "read", "call": {"tool": "get_input"}},
        {"id": "tally", "when": "vars.costly > `1`", "call": {"tool": "get_input"}},
        {"id": "done", "answer": "{{ vars.b }} / {{ vars.c }}"},
    ],
}


def test_a_turn_renders_only_the_vars_its_steps_can_read_and_those_they_read() -> None:
    script = Script.model_validate(CHAINED)
    assert script.vars_read_from(0) == {"a", "b", "c", "d", "costly"}
    assert script.vars_read_from(2) == {"a", "b", "c", "d"}  # c names d (declared after it: null, as before)
    assert script.vars_read_from(3) == set()
    reviewer = ProviderCache()(REVIEWER)
    assert isinstance(reviewer, ScriptedProvider)
    steps = [s.id for s in reviewer.script.steps]
    # the resume's turn (after ask) needs no keyword search over the pull request (``found``)
    assert reviewer.script.vars_read_from(steps.index("ask") + 1) == {"pr", "number", "header", "who"}


async def test_the_reviewer_script_reads_a_github_pull_request_as_well() -> None:
    """GitHub names a pull request by its number, the repository by its full name, the author by the login
    (the gateway's ``github`` source): the demo reviewer asks about it as about an Azure DevOps one."""
    reviewer = ProviderCache()(REVIEWER)
    assert isinstance(reviewer, ScriptedProvider)
    tools = [ToolSpec(name=n, description="", parameters={"type": "object"}) for n in ("get_input", "ask_human")]
    github_pr = {
        "repository": {"id": 1, "full_name": "acme/orders", "url": "https://github.com/acme/orders"},
        "action": "opened",
        "pull_request": {"number": 7, "title": "Orders API", "description": "changes the response schema"},
        "source_branch": "money",
        "target_branch": "main",
        "author": {"login": "rosa", "id": 5},
    }
    asked = await reviewer.complete(_called("read", "get_input", github_pr), tools, context=CONTEXT)
    (call,) = asked.tool_calls
    assert call.name == "ask_human"
    assert "PR #7 'Orders API' changes a public API contract" in call.arguments["question"]
    assert "review PR #7 in acme/orders (money -> main) by rosa." in call.arguments["context"]
    answered = {"status": "answered", "answer": {"type": "option", "option_id": "ship-v2"}, "responder": "user:bob"}
    done = await reviewer.complete(
        [*_called("read", "get_input", github_pr), *_called("ask", "ask_human", answered)], tools, context=CONTEXT
    )
    assert (done.content or "").startswith("Review of PR #7 'Orders API' (money -> main)")


@pytest.mark.parametrize(
    "reads",
    [
        "{{ vars }}",
        "{{ keys(vars) }}",
        "{{ vars.* }}",
        "{{ vars | a }}",
        "{{ @.vars.a }}",
        "{{ vars[0] }}",
        # the scope as a whole (review): ``@`` and the implicit scope of a projection or an index at the top
        "{{ @ }}",
        "{{ values(@) }}",
        "{{ to_string(@) }}",
        "{{ *.a }}",
        "{{ length(*.a) }}",
        "{{ [*] }}",
        "{{ [] }}",
        "{{ map(&to_string(@), values(@)) }}",
    ],
)
def test_a_step_reading_vars_otherwise_than_by_name_gets_every_var(reads: str) -> None:
    script = Script.model_validate({"vars": {"a": "A", "b": "B"}, "steps": [{"id": "done", "answer": reads}]})
    assert script.vars_read_from(0) == {"a", "b"}


@pytest.mark.parametrize(
    ("reads", "named"),
    [
        ("{{ vars.a }}", {"a"}),
        ("{{ vars.a[0] }}", {"a", "b"}),  # not a plain ``vars.<name>``: every var (conservative)
        ("{{ vars.a[?@ == 'x'] }}", {"a"}),  # ``@`` in a filter is the element, not the scope
        ("{{ map(&to_string(@), vars.a) }}", {"a"}),  # ``&expr`` reads the elements it is handed
        ("{{ length(vars.a) }}", {"a"}),
    ],
)
def test_an_element_read_inside_an_expression_is_not_the_scope(reads: str, named: set[str]) -> None:
    script = Script.model_validate({"vars": {"a": ["x"], "b": "B"}, "steps": [{"id": "done", "answer": reads}]})
    assert script.vars_read_from(0) == named


@pytest.mark.parametrize("answer", ["{{ @ }}", "{{ *.a }}", "{{ length(*.a) }}", "{{ values(@) }}"])
async def test_a_step_reading_the_whole_scope_answers_as_with_every_var(
    answer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review's cases: an answer reading the scope as a whole, rendered lazily and eagerly: the same."""
    provider = _provider({"vars": {"a": "A", "b": "B"}, "steps": [{"id": "done", "answer": answer}]})
    lazily = await provider.complete([], TOOLS, context=CONTEXT)
    monkeypatch.setattr(Script, "vars_read_from", lambda self, start: frozenset(self.vars))
    eagerly = await provider.complete([], TOOLS, context=CONTEXT)
    assert lazily == eagerly


async def test_a_turn_with_only_the_vars_it_reads_answers_as_with_all_of_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every turn of CHAINED and of the reviewer, rendered with only the vars read and with all of them: the same."""
    chained = _provider(CHAINED)
    reviewer = ProviderCache()(REVIEWER)
    assert isinstance(reviewer, ScriptedProvider)
    review_tools = [ToolSpec(name=n, description="", parameters={"type": "object"}) for n in ("get_input", "ask_human")]
    pr = {
        "pull_request": {"id": 42, "title": "Orders API", "description": "changes the response schema"},
        "source_branch": "f",
        "target_branch": "main",
        "repository": {"name": "r"},
        "author": {"display_name": "A"},
    }
    answered = {"status": "answered", "answer": {"type": "option", "option_id": "keep-v1"}, "responder": "user:bob"}
    conversations = [
        (chained, TOOLS, []),
        (chained, TOOLS, _called("read", "get_input", {"item": "x", "tags": [1, 2]})),
        (chained, TOOLS, [*_called("read", "get_input", {"item": "x", "tags": [1, 2]}), *_called("tally", "t", 1)]),
        (chained, TOOLS, _called("read", "get_input", {"tags": []})),
        (reviewer, review_tools, []),
        (reviewer, review_tools, _called("read", "get_input", pr)),
        (reviewer, review_tools, [*_called("read", "get_input", pr), *_called("ask", "ask_human", answered)]),
    ]
    lazily = [await p.complete(c, tools, context=CONTEXT) for p, tools, c in conversations]
    monkeypatch.setattr(Script, "vars_read_from", lambda self, start: frozenset(self.vars))
    eagerly = [await p.complete(c, tools, context=CONTEXT) for p, tools, c in conversations]
    assert lazily == eagerly
    assert lazily[2].content == "x-b / d unseen"
    assert "Keep the v1 contract" in (lazily[-1].content or "")
