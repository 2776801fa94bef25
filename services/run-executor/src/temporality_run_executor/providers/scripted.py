"""The scripted provider -- deterministic, for demos and tests, and named so.

It plays an agent from a declarative script (:mod:`.script`: YAML steps in the card, in a file the card
names, or a named script shipped with the executor such as ``reviewer``) instead of asking an LLM. It
never reads the prompt: what it does depends only on the script, the tool results in the conversation,
the offered tools and the run's facts (:class:`~.base.TurnContext`). It reads the conversation afresh on
every turn, so it resumes from any checkpoint. An MCP tool's sampling request is played like a turn on the
request's conversation, its options (``max_tokens``, ``temperature``, ``stop``, the model) logged
(``scripted.sampling``) and in the script's scope as ``run.sampling``.

The shipped ``reviewer`` script (``scripts/reviewer.yaml``) is the *Reviewer* of E2E-1: it reads the
run's input, asks a person through ``ask_human`` with two options when the pull request mentions an API
contract, and finishes with a review stating the decision it was given.

For crash tests only, ``crash_on`` makes it kill its own process (exit status 137, as the OOM killer
would) whenever the last message contains that text: one input that takes the executor down on every
attempt (``TEMPORALITY_EXECUTOR_SCRIPTED_CRASH_ON``; never set outside tests).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import structlog

from temporality_run_executor.providers.base import (
    AssistantTurn,
    PermanentProviderError,
    Provider,
    ToolSpec,
    TurnContext,
)
from temporality_run_executor.providers.script import (
    CALL_PREFIX,
    Script,
    ScriptAnswer,
    ScriptError,
    evaluate,
    render,
)
from temporality_run_executor.records import Message, ToolCall

__all__ = ["CRASH_EXIT_STATUS", "ScriptedProvider"]

log = structlog.get_logger(__name__)
#: What a process killed by the OOM killer (SIGKILL) reports: 128 + 9.
CRASH_EXIT_STATUS = 137


def _step_of(call_id: str) -> str:
    """The step a scripted call id names: ``call-<step id>`` or, for one of several calls, ``call-<step id>.<n>``."""
    return call_id.removeprefix(CALL_PREFIX).partition(".")[0]


def _parsed(content: str | None) -> Any:
    try:
        return json.loads(content or "null")
    except ValueError:
        return content


class ScriptedProvider(Provider):
    def __init__(self, script: Script, *, think_s: float = 0.0, crash_on: str | None = None) -> None:
        self.script = script
        self._think_s = think_s
        self._crash_on = crash_on

    async def complete(
        self,
        messages: list[Message],
        tools: list[ToolSpec],
        *,
        budget_s: float | None = None,
        context: TurnContext | None = None,
    ) -> AssistantTurn:
        if self._think_s:
            await asyncio.sleep(self._think_s)  # stands in for model latency; holds no deadline
        if messages and self._crash_on and self._crash_on in (messages[-1].content or ""):
            log.error("scripted.crashing", text=self._crash_on, exit_status=CRASH_EXIT_STATUS)
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(CRASH_EXIT_STATUS)  # no cleanup, no acks: the process is simply gone
        if context is not None and context.sampling is not None:  # recorded: the script reads run.sampling
            log.info("scripted.sampling", **context.sampling.model_dump())
        try:
            return self._next(messages, tools, context)
        except ScriptError as exc:  # the same conversation fails the same way every time: never retried
            raise PermanentProviderError(f"scripted provider: {exc}") from exc

    def _next(self, messages: list[Message], tools: list[ToolSpec], context: TurnContext | None) -> AssistantTurn:
        done = [
            index
            for m in messages
            if m.role == "assistant"
            for call in m.tool_calls
            if (index := self.script.step_index(_step_of(call.id))) is not None
        ]
        start = max(done) + 1 if done else 0
        scope = self._scope(messages, tools, context, self.script.vars_read_from(start))
        for step in self.script.steps[start:]:
            where = f"step {step.id}"
            if step.when is not None and not evaluate(step.when, scope, f"{where}.when"):
                continue
            say = render(step.say, scope, f"{where}.say") if step.say is not None else None
            content = None if say is None else str(say)
            if step.call is not None:
                args = render(step.call.args, scope, f"{where}.call.args")
                call = ToolCall(id=CALL_PREFIX + step.id, name=step.call.tool, arguments=args)
                log.debug("scripted.step", step=step.id, tool=step.call.tool)
                return AssistantTurn(content=content, tool_calls=[call])
            if step.calls is not None:  # several calls in one reply (parallel tool calls)
                calls = [
                    ToolCall(
                        id=f"{CALL_PREFIX}{step.id}.{n}",
                        name=c.tool,
                        arguments=render(c.args, scope, f"{where}.calls[{n}].args"),
                    )
                    for n, c in enumerate(step.calls)
                ]
                log.debug("scripted.step", step=step.id, tools=[c.tool for c in step.calls])
                return AssistantTurn(content=content, tool_calls=calls)
            return AssistantTurn(content=str(self._answer(step.answer, scope, where)))
        raise ScriptError("no step left to run")  # unreachable: the last step is an unconditional answer

    def _answer(self, answer: str | ScriptAnswer | None, scope: dict[str, Any], where: str) -> Any:
        if isinstance(answer, ScriptAnswer):
            key = evaluate(answer.switch, scope, f"{where}.answer.switch")
            chosen = answer.cases.get(str(key), answer.default) if key is not None else answer.default
            return render(chosen, scope, f"{where}.answer")
        return render(answer or "", scope, f"{where}.answer")

    def _scope(
        self, messages: list[Message], tools: list[ToolSpec], context: TurnContext | None, read: frozenset[str]
    ) -> dict[str, Any]:
        """What the turn's expressions are evaluated over; of the ``vars``, those the turn's steps can ``read``
        (:meth:`~.script.Script.vars_read_from`), each rendered as when all are: in order, seeing the ones above it
        (none it reads is left out, so it renders the same), the others neither rendered nor in the scope."""
        results: dict[str, Any] = {}
        for m in messages:  # a step with several calls: a list, one slot per call (null until it returned)
            for call in m.tool_calls if m.role == "assistant" else []:
                step, _, n = call.id.removeprefix(CALL_PREFIX).partition(".")
                if call.id.startswith(CALL_PREFIX) and n.isdigit():
                    slots = results.setdefault(step, [])
                    slots.extend([None] * (int(n) + 1 - len(slots)))
        for m in messages:
            if m.role == "tool" and m.tool_call_id and m.tool_call_id.startswith(CALL_PREFIX):
                step, _, n = m.tool_call_id.removeprefix(CALL_PREFIX).partition(".")
                if n.isdigit() and isinstance(results.get(step), list) and int(n) < len(results[step]):
                    results[step][int(n)] = _parsed(m.content)
                else:
                    results[m.tool_call_id.removeprefix(CALL_PREFIX)] = _parsed(m.content)
        run = context.model_dump(mode="json") if context is not None else {}
        scope: dict[str, Any] = {"results": results, "run": run, "tools": [t.name for t in tools], "vars": {}}
        for name, value in self.script.vars.items():
            if name in read:
                scope["vars"] = {**scope["vars"], name: render(value, scope, f"vars.{name}")}
        return scope
