"""A deterministic, scripted provider — for demos and tests, and named so.

``ScriptedReviewer`` plays the *Reviewer* of E2E-1 without an LLM: it reads the normalized PR
context through the ``get_pr_context`` tool, looks for an API-contract ambiguity, asks a person
through ``ask_human`` with two options when it finds one, and finishes with a review that states
the decision it was given. It reads only the conversation, so it resumes from any checkpoint.

For crash tests only, ``crash_on`` makes it kill its own process (exit status 137, as the OOM killer
would) whenever the last message contains that text: one input that takes the executor down on every
attempt (``TEMPORALITY_EXECUTOR_SCRIPTED_CRASH_ON``; never set outside tests).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from typing import Any

import structlog

from temporality_run_executor.providers.base import AssistantTurn, Provider, ToolSpec
from temporality_run_executor.records import Message, ToolCall

__all__ = ["CRASH_EXIT_STATUS", "ScriptedReviewer"]

log = structlog.get_logger(__name__)
#: What a process killed by the OOM killer (SIGKILL) reports: 128 + 9.
CRASH_EXIT_STATUS = 137

_CONTRACT_WORDS = re.compile(r"\b(api|contract|endpoint|breaking|schema|response)\b", re.IGNORECASE)
_ASKABLE = re.compile(r"^People you may ask: (.+)$", re.MULTILINE)

OPTIONS = [
    {
        "id": "keep-v1",
        "label": "Keep the v1 contract",
        "consequence": "The change must stay backward compatible; I will ask for the old field to be kept.",
    },
    {
        "id": "ship-v2",
        "label": "Ship it as a breaking v2",
        "consequence": "Clients must migrate; I will ask for a versioned endpoint and a changelog entry.",
    },
]


class ScriptedReviewer(Provider):
    def __init__(self, think_s: float = 0.0, crash_on: str | None = None) -> None:
        self._think_s = think_s
        self._crash_on = crash_on

    async def complete(
        self, messages: list[Message], tools: list[ToolSpec], *, budget_s: float | None = None
    ) -> AssistantTurn:
        if self._think_s:
            await asyncio.sleep(self._think_s)  # stands in for model latency; holds no deadline
        last = messages[-1]
        if self._crash_on and self._crash_on in (last.content or ""):
            log.error("scripted.crashing", text=self._crash_on, exit_status=CRASH_EXIT_STATUS)
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(CRASH_EXIT_STATUS)  # no cleanup, no acks: the process is simply gone
        if last.role != "tool":
            return AssistantTurn(tool_calls=[ToolCall(id="call-context", name="get_pr_context", arguments={})])
        if last.name == "get_pr_context":
            return self._analyse(json.loads(last.content or "{}"), messages)
        if last.name == "ask_human":
            return self._finish(_context(messages), json.loads(last.content or "{}"))
        return AssistantTurn(content=f"Unexpected tool result from {last.name}; stopping.")

    def _analyse(self, pr: dict[str, Any], messages: list[Message]) -> AssistantTurn:
        title = str(pr.get("pull_request", {}).get("title", ""))
        description = str(pr.get("pull_request", {}).get("description", ""))
        found = sorted({m.group(0).lower() for m in _CONTRACT_WORDS.finditer(f"{title}\n{description}")})
        askable = _ASKABLE.search(messages[1].content or "") if len(messages) > 1 else None
        recipients = [r.strip() for r in askable.group(1).split(",")] if askable else []
        if not found or not recipients:
            return AssistantTurn(content=_review(pr, None, "No API-contract change found; nothing needs a decision."))
        number = pr.get("pull_request", {}).get("id")
        question = (
            f"PR #{number} '{title}' changes a public API contract. "
            "Must existing v1 clients keep working, or may this ship as a breaking v2?"
        )
        context = (
            f"Task: review PR #{number} in {pr.get('repository', {}).get('name')} "
            f"({pr.get('source_branch')} -> {pr.get('target_branch')}) by "
            f"{pr.get('author', {}).get('display_name')}.\n"
            f"Why I ask: the description mentions {', '.join(found)}, but says nothing about compatibility.\n"
            "Established: the response shape changes.\n"
            "Missing: whether backward compatibility is required — a product decision, not a code fact."
        )
        call = ToolCall(
            id="call-ask",
            name="ask_human",
            arguments={"recipient": recipients[0], "question": question, "context": context, "options": OPTIONS},
        )
        return AssistantTurn(content="The PR changes an API contract; I need a decision.", tool_calls=[call])

    def _finish(self, pr: dict[str, Any], result: dict[str, Any]) -> AssistantTurn:
        if result.get("status") in ("answered", "expired") and result.get("answer"):
            answer = result["answer"]
            who = result.get("responder") or "the timeout policy's default"
            if answer.get("type") == "option":
                chosen = next((o for o in OPTIONS if o["id"] == answer.get("option_id")), None)
                label = chosen["label"] if chosen else answer.get("option_id")
                follow = chosen["consequence"] if chosen else ""
                decision = f"Decision ({who}): {label} [{answer.get('option_id')}]. {follow}"
            else:
                decision = f"Decision ({who}), in their words: {answer.get('value')}"
        else:
            decision = f"Blocked: no decision could be obtained ({result.get('error') or result.get('status')})."
        return AssistantTurn(content=_review(pr, decision, "API-contract change reviewed."))


def _context(messages: list[Message]) -> dict[str, Any]:
    for m in messages:
        if m.role == "tool" and m.name == "get_pr_context":
            loaded: dict[str, Any] = json.loads(m.content or "{}")
            return loaded
    return {}


def _review(pr: dict[str, Any], decision: str | None, summary: str) -> str:
    p = pr.get("pull_request", {})
    lines = [
        f"Review of PR #{p.get('id')} '{p.get('title')}' ({pr.get('source_branch')} -> {pr.get('target_branch')})",
        summary,
    ]
    if decision:
        lines.append(decision)
    return "\n".join(lines)
