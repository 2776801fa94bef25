"""get_input hands the model the run's input with its letters as they are, not as ``\\u`` escapes (a
Cyrillic PR title read as ``\\u043e\\u0447…`` by the model and on the console's timeline)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from executor_support import REVIEWER

from temporality_protocol import EventData, LaunchSource, RunState
from temporality_run_executor.records import RunRecord
from temporality_run_executor.tools import BUILTIN_TOOLS, ToolContext, ToolRegistry


async def _get_input(run_input: dict[str, Any]) -> str:
    now = datetime.now(UTC)
    run = RunRecord(
        run_id="run-input-1",
        state=RunState.RUNNING,
        agent=REVIEWER.id,
        title="Отчёт",
        launch=LaunchSource(kind="webhook", trigger_id="ado-pr-review", delivery_id="dlv-1"),
        correlation_id="run-input-1",
        created_at=now,
        updated_at=now,
        input=run_input,
    )

    async def publish(data: EventData, id_parts: tuple[str, ...]) -> None:
        raise AssertionError("get_input publishes nothing")

    tool = ToolRegistry(BUILTIN_TOOLS).get("get_input")
    assert tool is not None
    return await tool.invoke({}, ToolContext(run=run, turn=1, index=0, call_id="call-1", publish=publish))


async def test_the_input_keeps_its_letters() -> None:
    run_input = {"title": "Отчёт по API 日本語", "pr": 7}
    text = await _get_input(run_input)
    assert "Отчёт по API 日本語" in text
    assert "\\u" not in text
    assert json.loads(text) == run_input


async def test_an_input_utf8_cannot_carry_is_escaped_not_lost() -> None:
    run_input = {"title": "broken \ud800 surrogate"}
    text = await _get_input(run_input)
    text.encode("utf-8")  # publishable
    assert json.loads(text) == run_input
