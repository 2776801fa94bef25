"""AP-9 for hosted runs: what a run streams while it works, as ``run.streamed`` events (pure functions).

Two sources, one event type (:class:`~temporality_protocol.RunStreamed`, the payload of an external agent's
``agent.task.streamed``):

* the agent's ``report_progress`` tool (``progress``, ``log``, ``warning``, ``partial_result``): decided by the
  run machine like ``answer_agent`` (an :class:`~.machine.Emit` plan of the turn, published before the turn's
  checkpoint), the message cut at :data:`~temporality_protocol.events.MAX_TEXT` characters, ``data`` at most
  :data:`~.tools.REPORT_DATA_MAX_BYTES` bytes of JSON, both through the executor's redaction patterns (SEC-1) --
  also in the call's ``run.tool_called``;
* the executor itself, once per provider reply of a hosted run (``metrics``): the turn's tokens, the provider's
  latency and the number of tool calls the model made -- published right after the turn's commit (kept in the
  checkpoint, republished by a recovery), or with the run's end when the reply ends it.

Ids are deterministic: ``report_progress`` per (run, turn, call index), ``metrics`` per (run, turn), so a turn
replayed after a crash republishes the same ids (the bus's duplicate window and the journal drop them).
``request_id`` is the request the turn works on (:func:`turn_request`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from temporality_protocol import RunStreamed
from temporality_protocol.events import MAX_TEXT
from temporality_protocol.redaction import SECRET_FIELD_MARKER, Redactor, is_secret_field
from temporality_run_executor.records import RunRecord, ToolCall, Usage
from temporality_run_executor.tools import ANSWER_AGENT, REPORT_DATA_MAX_BYTES, ReportProgressArgs

__all__ = ["Reported", "redact_json", "report", "turn_metrics", "turn_request"]


def turn_request(run: RunRecord, calls: list[ToolCall]) -> str:
    """The request a turn works on: the first one it answers (``answer_agent``), else the one a relay run
    answers, else the run's own id (an external agent's task id stands for its run the same way)."""
    for call in calls:
        answered = call.arguments.get("request_id") if call.name == ANSWER_AGENT else None
        if isinstance(answered, str) and answered:
            return answered[:128]
    return run.relay.request_id if run.relay is not None else run.run_id


def redact_json(value: Any, redactor: Redactor, secret: bool = False) -> Any:
    """``value`` with every string through ``redactor``, and every string under a key that names a secret
    (``password``, ``api_key``: :func:`~temporality_protocol.redaction.is_secret_field`) replaced whole."""
    if isinstance(value, str):
        return SECRET_FIELD_MARKER if secret else redactor.redact(value).text
    if isinstance(value, list):
        return [redact_json(item, redactor, secret) for item in value]
    if isinstance(value, dict):
        return {k: redact_json(v, redactor, secret or is_secret_field(str(k), {})) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Reported:
    """A ``report_progress`` call, decided: the event, what ``run.tool_called`` shows, the tool's result."""

    event: RunStreamed
    arguments: dict[str, Any]
    content: str


def report(run: RunRecord, turn: int, call: ToolCall, request_id: str, redactor: Redactor) -> Reported | str:
    """The ``run.streamed`` a ``report_progress`` call sends, or (text) why it sends nothing (a tool error)."""
    try:
        args = ReportProgressArgs.model_validate(call.arguments)
    except ValidationError as exc:
        return f"invalid report_progress arguments: {exc}"
    size = len(json.dumps(args.data, separators=(",", ":"), ensure_ascii=False).encode())
    if size > REPORT_DATA_MAX_BYTES:
        return (
            f"report_progress data is {size} bytes as JSON; at most {REPORT_DATA_MAX_BYTES} are kept: "
            "send a summary (put the rest in a partial_result message or an artifact)"
        )
    message = redactor.redact(args.message).text
    data = redact_json(args.data, redactor)
    event = RunStreamed(
        run_id=run.run_id,
        agent=run.agent,
        turn=turn,
        kind=args.kind,
        correlation_id=run.correlation_id,
        request_id=args.request_id or request_id,
        message=message[:MAX_TEXT],
        data=data,
        call_id=call.id,
        truncated=len(message) > MAX_TEXT,
    )
    shown = {**call.arguments, "message": event.message, "data": data}
    content = {"status": "reported", "kind": args.kind, "request_id": event.request_id, "truncated": event.truncated}
    return Reported(event, shown, json.dumps(content, sort_keys=True))


def turn_metrics(
    run: RunRecord, turn: int, usage: Usage | None, elapsed_s: float, calls: list[ToolCall], request_id: str
) -> RunStreamed:
    """The ``metrics`` of one provider reply of a hosted run."""
    used = usage or Usage()
    data = {
        "prompt_tokens": used.prompt_tokens,
        "completion_tokens": used.completion_tokens,
        "total_tokens": used.total_tokens,
        "provider_latency_s": round(elapsed_s, 3),
        "tool_calls": len(calls),
        "tools": [call.name for call in calls],
    }
    message = (
        f"turn {turn}: {used.prompt_tokens} tokens in, {used.completion_tokens} out, "
        f"provider {elapsed_s:.2f} s, {len(calls)} tool call(s)"
    )
    return RunStreamed(
        run_id=run.run_id,
        agent=run.agent,
        turn=turn,
        kind="metrics",
        correlation_id=run.correlation_id,
        request_id=request_id,
        message=message,
        data=data,
    )
