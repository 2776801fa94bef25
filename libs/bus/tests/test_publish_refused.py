"""A message JetStream refuses inside a pipelined batch fails that batch with JetStream's own reason, as
soon as the refusal arrives (``publish_raw_many`` is ``Pipeline.send`` with its first failure raised: the
refusal's error must be read from the reply, or the caller hears "no ack" at the deadline)."""

from __future__ import annotations

import asyncio

import pytest

from temporality_bus import Bus, TransientError
from temporality_protocol.catalog import EVENTS_STREAM


async def test_a_refused_message_fails_the_batch_with_jetstream_s_reason(bus: Bus) -> None:
    await bus.ensure([EVENTS_STREAM])
    messages = [
        ("temporality.events.run.failed", b"{}", {"Nats-Msg-Id": "kept-1"}),
        # JetStream answers this one with an error (code 400, "expected stream does not match")
        ("temporality.events.run.failed", b"{}", {"Nats-Msg-Id": "refused-1", "Nats-Expected-Stream": "NOT_IT"}),
    ]
    with pytest.raises(TransientError) as refused:
        # a deadline far beyond the refusal's round trip: "no ack within" would mean the error was lost
        await asyncio.wait_for(bus.publish_raw_many(messages, timeout_s=60), 90)
    assert "no ack" not in str(refused.value)
    assert "expected stream" in str(refused.value).lower()
    assert bus.pipeline.pending == 0
