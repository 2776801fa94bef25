"""A run whose conversation outgrows the bus fails ``conversation_too_large``, saying both sizes, instead of its message
being dead-lettered (``infrastructure_error``). The server's ``max_payload`` is read from the connection: this
nats-server's is 256 KiB. Over a real nats-server, the model behind the OpenAI emulator (real HTTP)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from executor_support import RunExecutor, run_requested
from test_conversation_bounds import BIG_READ, _big, _card

from temporality_bus import Bus
from temporality_embedded.natsserver import NatsServer
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, Reply, assistant_text, assistant_tool_call


@pytest.fixture
async def emulator() -> AsyncIterator[OpenAIEmulator]:
    async with OpenAIEmulator().serve() as emu:
        yield emu


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    config = tmp_path / "small.conf"
    config.write_text("max_payload: 262144\n")
    server = NatsServer(tmp_path / "nats", config_file=config)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_conversation_past_the_servers_max_payload_fails_the_run_saying_so(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    assert bus.nc.max_payload == 262144
    _big["size"] = 200_000  # cut to 64 KiB each: the fourth result takes the conversation past 256 KiB
    emulator.replies += [assistant_tool_call(f"call_{i}", "big_read", {}) for i in range(6)]
    emulator.replies.append(assistant_text("done"))
    await executor(cards=[_card(emulator)], card_tools={"reviewer": [BIG_READ]})
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid, timeout_s=60)
    assert failed.data["reason"] == "conversation_too_large"
    error = failed.data["error"]
    assert error.startswith("the conversation is ")
    assert "; the bus carries at most 262144 (the NATS server's max_payload)" in error
    size = int(error.removeprefix("the conversation is ").split(" ", 1)[0])
    assert size > 262144
    assert failed.data["usage"]["turns"] >= 3
    await event_log.caught_up()
    assert not event_log.of_type("run.completed", event.runid)


async def test_one_reply_too_big_to_keep_fails_the_run_saying_so(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    """Each call's arguments within their 64 KiB, five of them together past the server's 256 KiB: the reply cannot
    be kept on the run record (before its calls are made), so none is made and the run fails."""
    calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {
                "name": "notify",
                "arguments": json.dumps({"recipient": "user:alice", "message": "m" * 60_000}),
            },
        }
        for i in range(5)
    ]
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    body = {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": message}]}
    body["choices"][0]["finish_reason"] = "tool_calls"
    emulator.replies += [Reply(200, body), assistant_text("done")]
    await executor(cards=[_card(emulator)], card_tools={"reviewer": [BIG_READ]})
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid, timeout_s=60)
    assert failed.data["reason"] == "conversation_too_large"
    assert failed.data["error"].startswith("the model's reply is ")
    assert "; the bus carries at most 262144 (the NATS server's max_payload)" in failed.data["error"]
    await event_log.caught_up()
    assert not event_log.of_type("human.notify_requested", event.runid)
