"""A run whose conversation outgrows the bus fails ``conversation_too_large``, saying both sizes, instead of its message
being dead-lettered (``infrastructure_error``). The server's ``max_payload`` is read from the connection: this
nats-server's is 256 KiB. Over a real nats-server, the model behind the OpenAI emulator (real HTTP)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from executor_support import RunExecutor, run_record, run_requested
from test_conversation_bounds import BIG_READ, _big, _card

from temporality_bus import Bus
from temporality_embedded.natsserver import NatsServer
from temporality_protocol import RunState
from temporality_run_executor.bounds import MAX_RESULT_BYTES, result_limit
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, Reply, assistant_text, assistant_tool_call


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


async def test_a_final_reply_is_cut_to_what_the_servers_max_payload_leaves_for_it(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    """The code review's case: a final reply of 261,000 bytes, under the 256 KiB a result may be at most, on this
    256 KiB server. It was kept whole, the run record with it was 262,509 bytes, refused by the bus, and the run was
    dead-lettered (``infrastructure_error``). The result is now cut to a quarter of ``max_payload``: the run
    completes."""
    limit = result_limit(bus.nc.max_payload)
    assert limit == 65536 < MAX_RESULT_BYTES
    emulator.replies.append(assistant_text("r" * 261_000))
    await executor(cards=[_card(emulator)], card_tools={"reviewer": [BIG_READ]})
    event = run_requested()
    await bus.publish(event)
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    record = await run_record(bus, event.runid, RunState.COMPLETED)
    assert record.result is not None
    assert len(record.result.encode()) <= limit
    assert record.result.endswith(f"[cut by Temporality: the final reply was 261000 bytes; its first {limit} are kept]")
    assert completed.data["result"] == record.result[:16384]
    await event_log.caught_up()
    assert not event_log.of_type("run.failed", event.runid)
    assert not event_log.of_type("run.dead_lettered", event.runid)


async def test_a_run_record_too_big_for_the_bus_fails_the_run_saying_so(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    """A final reply within the result's 64 KiB here whose JSON text is six times that (each control character is
    written ``\\u00XX`` in the run record): the record with it does not fit in one message, so the run fails
    ``conversation_too_large`` saying so, instead of its message being dead-lettered."""
    emulator.replies.append(assistant_text("\x01" * 60_000))
    await executor(cards=[_card(emulator)], card_tools={"reviewer": [BIG_READ]})
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid, timeout_s=60)
    assert failed.data["reason"] == "conversation_too_large"
    error = failed.data["error"]
    assert error.startswith("the run's record (with its result) is ")
    assert "; the bus carries at most 262144 (the NATS server's max_payload)" in error
    assert error.endswith("Ask the agent for a shorter final reply, or raise max_payload")
    assert int(error.removeprefix("the run's record (with its result) is ").split(" ", 1)[0]) > 262144
    record = await run_record(bus, event.runid, RunState.FAILED)
    assert record.result is None
    await event_log.caught_up()
    assert not event_log.of_type("run.completed", event.runid)
    assert not event_log.of_type("run.dead_lettered", event.runid)
