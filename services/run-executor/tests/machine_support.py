"""Builders for the run machine's unit tests: a run record and a checkpoint with the fields every test fills the
same way. A test module binds its own run id and defaults once (``functools.partial``) and names only what its
case is about::

    _run = partial(make_run, RUN_ID, collab=True)
    _ckpt = partial(make_checkpoint, RUN_ID)
    _run(RunState.WAITING_FOR_HUMAN, waiting_request_id="hr-1")
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from temporality_protocol import AgentAnswerReceived, HumanPolicy, LaunchSource, RunState, derive_id
from temporality_run_executor.machine import Incoming, agent_news
from temporality_run_executor.records import Checkpoint, Message, RunRecord

__all__ = ["T0", "late_agent_answer", "make_checkpoint", "make_run"]

#: The tests' clock: every record and checkpoint is made and saved then unless a test says otherwise.
T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def make_run(run_id: str, state: RunState = RunState.RUNNING, **changes: Any) -> RunRecord:
    """The reviewer's run ``run_id`` in ``state``, launched by a webhook, alice its one person, created at
    :data:`T0`; ``changes`` replace any field."""
    fields: dict[str, Any] = {
        "run_id": run_id,
        "state": state,
        "agent": "reviewer",
        "title": "Review PR #42",
        "launch": LaunchSource(kind="webhook", trigger_id="ado-pr-review"),
        "human": HumanPolicy(allowed_recipients=["user:alice"]),
        "correlation_id": run_id,
        "created_at": T0,
        "updated_at": T0,
    }
    return RunRecord(**(fields | changes))


def make_checkpoint(run_id: str, turn: int = 1, **changes: Any) -> Checkpoint:
    """``run_id``'s checkpoint after ``turn`` (id ``ckpt-<turn>``, saved at :data:`T0`), its conversation the
    system prompt and the task; ``changes`` replace any field."""
    fields: dict[str, Any] = {
        "checkpoint_id": f"ckpt-{turn}",
        "run_id": run_id,
        "turn": turn,
        "saved_at": T0,
        "messages": [Message(role="system", content="s"), Message(role="user", content="task")],
    }
    return Checkpoint(**(fields | changes))


def late_agent_answer(run_id: str) -> Incoming:
    """The architect's async answer to ``run_id``'s first ``ask_agent``, as it arrives after the run moved on."""
    data = AgentAnswerReceived(
        request_id=derive_id("req", run_id, "ask_agent", "1", "0"),
        asker_run_id=run_id,
        replier_run_id="run-architect",
        replier_agent="architect",
        outcome="answer",
        answer="Yes.",
        mode="async",
        waited_s=12.0,
    )
    return agent_news("agent.answer.received", "evt-agent-late", data)
