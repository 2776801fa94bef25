"""``temporality dlq list``'s columns line up under their headings, and a dead letter whose payload is JSON but no
valid CloudEvent (no ``protocolversion``) is listed and shown with the id and type it says it has (what the
journal's ``bus.dead_lettered`` records as ``original_id``/``original_type``), marked as invalid -- not ``- -``.
A real consumer on a real nats-server dead-letters it."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Awaitable, Callable

from temporality_bus import Bus, Consumer, Delivery, NatsSettings
from temporality_embedded import dlq
from temporality_protocol import Envelope
from temporality_protocol.catalog import EVENTS_STREAM, ConsumerSpec, subject_for


async def _never(event: Envelope, delivery: Delivery) -> None:
    raise AssertionError(f"an invalid envelope reached the handler: {event.id}")


async def _until(check: Callable[[], Awaitable[bool]], what: str, within_s: float = 15.0) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _cli(settings: NatsSettings, *argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(dlq.main, [*argv, "--nats-url", settings.url], out, err)
    return code, out.getvalue() + err.getvalue()


def _columns(line: str) -> list[int]:
    """Where each column after the first starts: after a run of two or more spaces."""
    starts, run = [], 0
    for index, char in enumerate(line):
        if char == " ":
            run += 1
        else:
            if run >= 2 and index - run > 0:
                starts.append(index)
            run = 0
    return starts


async def test_an_invalid_envelope_is_listed_with_its_claimed_id_and_the_columns_line_up(
    bus: Bus, nats_settings: NatsSettings
) -> None:
    spec = ConsumerSpec("t-dlq-listing", EVENTS_STREAM.name, (subject_for("run.failed"),), "test", backoff_s=(0.1,))
    poison = {"id": "evt-poison-1", "type": "run.failed", "source": "/test", "specversion": "1.0", "data": {}}
    stop = asyncio.Event()
    task = asyncio.create_task(Consumer(bus, spec, handler=_never).run(stop))
    try:
        await bus.publish_raw(subject_for("run.failed"), json.dumps(poison).encode(), {})

        async def there() -> bool:
            return bool(await dlq.scan(bus, spec.durable))

        await _until(there, "the poison message's dead letter")
        (letter,) = await dlq.scan(bus, spec.durable)
        assert not letter.valid_envelope
        assert (letter.event_type, letter.event_id) == ("run.failed", "evt-poison-1")

        code, out = await _cli(nats_settings, "list", "--consumer", spec.durable)
        assert code == 0, out
        lines = out.splitlines()
        heading, row = lines[0], lines[1]
        assert heading.split()[0] == "SEQ"
        assert "run.failed evt-poison-1 (invalid)" in row, out
        # every heading starts where its column's cells start (the SEQ column is right-aligned to its heading)
        assert _columns(heading) == _columns(row)[: len(_columns(heading))], out
        for name in ("CONSUMER", "ORIGINAL SUBJECT#SEQ", "EVENT TYPE ID", "ERROR"):
            assert row[heading.index(name) - 2 : heading.index(name)] == "  ", (name, out)
            assert row[heading.index(name)] != " ", (name, out)
        seq_end = heading.index("SEQ") + len("SEQ")
        assert row[:seq_end].strip() == str(letter.seq), out
        assert row[seq_end - 1] != " ", out  # right-aligned

        code, out = await _cli(nats_settings, "list", "--json", "--consumer", spec.durable)
        (entry,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert (entry["event_id"], entry["event_type"], entry["valid_envelope"]) == (
            "evt-poison-1",
            "run.failed",
            False,
        )

        code, out = await _cli(nats_settings, "show", str(letter.seq))
        assert code == 0, out
        event_line = next(line for line in out.splitlines() if line.strip().startswith("event "))
        assert "run.failed evt-poison-1" in event_line, out
        assert "no valid CloudEvent" in event_line
        assert "InvalidEnvelope" in out
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
