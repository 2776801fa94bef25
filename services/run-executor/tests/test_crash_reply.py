"""A crash mid-turn with a model that never answers the same twice (issue 6, AP-7/AP-8), over a real nats-server and
the OpenAI-compatible emulator over real HTTP.

The crash matrix (``test_crash_matrix.py``) drives scripted agents, which answer a redelivered turn exactly as
before, so it cannot tell whether a recovery asks the model again. Here every call to the endpoint gets another
reply: the n-th call, while the conversation has no tool result yet, asks for ``n - 1`` ``get_input`` calls, then a
``notify`` and a ``report_progress`` whose texts name ``n`` (the model's own call ids name it too); once a tool
result is in, it answers. An executor "process" (``executor_processes``) is killed after turn 1's reply and before
its checkpoint -- once the reply is kept, once the notification is out, once the progress report is out too -- and
a fresh one takes over. Asked again, the model would move the notification to another call index (a second
notification) and change the texts at the same index (the journal's copy dropped as a duplicate, the transcript
saying what was never sent). The executor keeps the reply on the run record before the turn's first effect and
carries the turn out from it: one notification and one progress report, the ones the transcript holds, and the
model asked once per turn.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from executor_processes import Crash, Process, start_process
from executor_support import REVIEWER, run_record, run_requested, settled
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from temporality_bus import Bus, NatsSettings
from temporality_protocol import HumanNotifyRequested, RunState, RunStreamed
from temporality_protocol.catalog import BUCKET_CHECKPOINTS
from temporality_run_executor.agents import AgentCard, ProviderConfig
from temporality_run_executor.records import Checkpoint
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator
from temporality_testing.waiting import stays


@dataclass
class ChangingModel(OpenAIEmulator):
    """The emulator answering each call differently (see the module docstring); ``requests`` records them."""

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def completions(request: Request) -> JSONResponse:
            body = json.loads(await request.body())
            self.requests.append(body)
            n = len(self.requests)
            if any(m.get("role") == "tool" for m in body["messages"]):
                message: dict[str, Any] = {"role": "assistant", "content": f"done (call {n})"}
                return JSONResponse(_completion(message, "stop"))
            calls = [_call(f"call-{n}-input-{i}", "get_input", {}) for i in range(n - 1)]
            calls += [
                _call(f"call-{n}-notify", "notify", {"recipient": "user:alice", "message": f"deploy update #{n}"}),
                _call(f"call-{n}-progress", "report_progress", {"kind": "progress", "message": f"step #{n}"}),
            ]
            return JSONResponse(_completion({"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"))

        return app


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-emu",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


@pytest.fixture
async def model() -> AsyncIterator[ChangingModel]:
    async with ChangingModel().serve() as emu:
        yield emu


def _card(model: ChangingModel) -> AgentCard:
    provider = ProviderConfig(kind="openai", base_url=model.base_url, model="changing", max_retries=0)
    return REVIEWER.model_copy(
        update={"provider": provider, "tools": ToolPolicy(allow=["get_input", "notify", "report_progress"])}
    )


POINTS = [
    # the reply kept on the record, nothing of the turn out yet
    pytest.param("effect:KeepReply", id="reply-kept-nothing-published"),
    # notify ran (human.notify_requested published), the progress report not yet, no checkpoint
    pytest.param("tool_returned", id="notification-published-not-checkpointed"),
    # both published (the progress report's acknowledgement awaited before the commit), no checkpoint
    pytest.param("published:run.streamed", id="progress-published-not-checkpointed"),
]


@pytest.mark.parametrize("point", POINTS)
async def test_a_crash_mid_turn_never_asks_the_model_again_nor_repeats_a_side_effect(
    point: str,
    bus: Bus,
    event_log: EventLog,
    nats_settings: NatsSettings,
    processes: list[Process],
    model: ChangingModel,
) -> None:
    crash = Crash(point)
    first = await start_process(nats_settings, "executor-1", [_card(model)], crash)
    processes.append(first)
    event = run_requested()
    run_id = event.runid
    assert run_id
    await bus.publish(event)
    await asyncio.wait_for(crash.crashed.wait(), 30)
    await first.end()
    assert len(model.requests) == 1  # turn 1's reply, never committed

    processes.append(await start_process(nats_settings, "executor-2", [_card(model)]))
    (completed,) = await event_log.wait_for("run.completed", run_id=run_id, timeout_s=60)
    done = await run_record(bus, run_id, lambda r: r.ending is not None and r.ending.published)
    assert done.state is RunState.COMPLETED
    await settled(bus)
    await event_log.caught_up()

    def once() -> bool:
        mine = [e.type for e in event_log.events if e.runid == run_id]
        return mine.count("human.notify_requested") == 1 and mine.count("run.completed") == 1

    await stays(once, settle_s=1.0, what=f"one notification and one ending for {run_id}")
    # turn 1 carried out from its kept reply, turn 2 asked once: the model was asked twice in all
    assert len(model.requests) == 2
    assert completed.data["result"] == "done (call 2)"
    (notified,) = event_log.of_type("human.notify_requested", run_id)
    assert notified.payload(HumanNotifyRequested).message == "deploy update #1"
    progress = [e.payload(RunStreamed) for e in event_log.of_type("run.streamed", run_id)]
    assert [p.message for p in progress if p.kind == "progress"] == ["step #1"]

    # the transcript says what went out: turn 1's reply once, its two results, nothing of another reply
    ckpt = await (await bus.store(BUCKET_CHECKPOINTS, Checkpoint)).get(run_id)
    assert ckpt is not None
    saved = ckpt.value
    assert saved.turn == 1
    assert [m.role for m in saved.messages] == ["system", "user", "assistant", "tool", "tool"]
    (assistant,) = [m for m in saved.messages if m.role == "assistant"]
    assert [c.id for c in assistant.tool_calls] == ["call-1-notify", "call-1-progress"]
    assert assistant.tool_calls[0].arguments["message"] == "deploy update #1"
    assert [m.tool_call_id for m in saved.messages if m.role == "tool"] == ["call-1-notify", "call-1-progress"]
    sent = json.loads(saved.messages[3].content or "{}")
    assert sent["notification_id"] == notified.payload(HumanNotifyRequested).notification_id
    assert [e.data["call_id"] for e in event_log.of_type("run.tool_called", run_id)] == [
        "call-1-notify",
        "call-1-progress",
    ]
    # the kept reply went with the end
    assert done.reply is None
    assert not event_log.of_type("bus.dead_lettered")
