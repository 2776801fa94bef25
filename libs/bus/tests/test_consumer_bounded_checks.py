"""What both consumer paths remember of the messages they check, against a real nats-server (2026-12-06 review):
nothing of a publisher's spelling of a version, only short senders; a version that is no version at all is a
poison message (dead-lettered at once, the batch runner goes on); a key spelt with a ``\\u`` escape is refused
as ``decode`` refuses it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from consumer_support import failed, failed_spec, running
from test_consumer_batch import _settled

from temporality_bus import Bus, Consumer, Delivery
from temporality_bus.consumer import _READABLE, _SENDER_KEPT_CHARS, _decode
from temporality_protocol import Envelope, InvalidEnvelope, ProtocolError, RunFailed, make_event
from temporality_protocol.envelope import decode, encode
from temporality_protocol.version import SUPPORTED_VERSIONS

Batch = list[tuple[Envelope, Delivery]]
LONG_SOURCE = "/test/" + "s" * (_SENDER_KEPT_CHARS + 1)


def _version(spelling: str) -> Callable[[bytes], bytes]:
    return lambda raw: raw.replace(b'"protocolversion":"1.0"', b'"protocolversion":"' + spelling.encode() + b'"')


def _escaped_base64(raw: bytes) -> bytes:
    return raw.replace(b'"data":', b'"data\\u005fbase64":"e30=","data":')


#: run id -> how its event's bytes are written, and whether it is handled (else dead-lettered as poison)
CASES: dict[str, tuple[Callable[[bytes], bytes], bool]] = {
    "v100": (_version("1.00"), True),  # 1.0 spelt otherwise: read, never remembered
    "v010": (_version("01.0"), True),
    "vlong": (_version("0001." + "0" * 4000), True),
    "vx": (_version("x"), False),  # no version at all: poison (negotiate's plain ValueError)
    "v90": (_version("9.0"), False),  # a version we do not speak
    "escaped": (_escaped_base64, False),  # data_base64, spelt with an escape
    "long-source": (lambda raw: raw, True),
    "good": (lambda raw: raw, True),
}


async def _publish_cases(bus: Bus, prefix: str) -> tuple[int, dict[str, str]]:
    """Each case's event, in order; the last stream sequence and the event ids by case."""
    seq, ids = 0, {}
    for case, (spoil, _) in CASES.items():
        run_id = f"{prefix}-{case}"
        if case == "long-source":
            event = make_event(
                RunFailed(run_id=run_id, reason="r", error="e"), source=LONG_SOURCE, id=f"evt-{run_id}", run_id=run_id
            )
        else:
            event = failed(run_id)
        raw = spoil(encode(event))
        seq = (await bus.publish_raw(event.nats_subject, raw, {"Nats-Msg-Id": event.id})).seq
        ids[case] = event.id
    return seq, ids


def _check_outcome(consumer: Consumer, ids: dict[str, str], handled: list[str], refused: dict[str, Any]) -> None:
    assert sorted(handled) == sorted(ids[case] for case, (_, ok) in CASES.items() if ok)
    for case, (_, ok) in CASES.items():
        if ok:
            continue
        error, deliveries = refused[ids[case]]
        assert isinstance(error, ProtocolError), (case, repr(error))  # poison: not retried first
        assert deliveries == 1, case
    # nothing of a publisher's spelling is kept, nor a long sender
    kept = {item for value in vars(consumer).values() if isinstance(value, set | frozenset) for item in value}
    assert not kept & {"1.00", "01.0", "0001." + "0" * 4000}
    assert all(len(source) < len(LONG_SOURCE) for _, source, _ in consumer._senders)
    assert ("run.failed", "/test", None) in consumer._senders  # a short one is remembered


def _hook(refused: dict[str, Any]) -> Any:
    async def hook(message: Envelope | bytes, delivery: Delivery, error: BaseException) -> None:
        key = message.id if isinstance(message, Envelope) else decode_id(message)
        refused[key] = (error, delivery.num_delivered)

    return hook


def decode_id(raw: bytes) -> str:
    return str(json.loads(raw)["id"])


async def test_the_per_message_path_keeps_nothing_of_a_spelling_and_dead_letters_a_non_version(bus: Bus) -> None:
    seq, ids = await _publish_cases(bus, "pm-bounded")
    handled: list[str] = []
    refused: dict[str, Any] = {}

    async def handler(event: Envelope, delivery: Delivery) -> None:
        if event.id.startswith("evt-pm-bounded"):
            handled.append(event.id)

    spec = failed_spec("t-pm-bounded", max_deliver=3)
    consumer = Consumer(bus, spec, handler=handler, on_dead_letter=_hook(refused))
    async with running(consumer):
        await _settled(bus, spec, seq)
    _check_outcome(consumer, ids, handled, refused)


async def test_the_batch_path_keeps_nothing_of_a_spelling_and_goes_on_after_a_non_version(bus: Bus) -> None:
    seq, ids = await _publish_cases(bus, "b-bounded")
    handled: list[str] = []
    refused: dict[str, Any] = {}

    async def handler(event: Envelope, delivery: Delivery) -> None:
        if event.id.startswith("evt-b-bounded"):
            handled.append(event.id)

    async def batch_handler(batch: Batch) -> None:
        handled.extend(event.id for event, _ in batch if event.id.startswith("evt-b-bounded"))

    spec = failed_spec("t-b-bounded", max_deliver=3)
    consumer = Consumer(
        bus, spec, handler=handler, batch_handler=batch_handler, batch_size=100, on_dead_letter=_hook(refused)
    )
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await _settled(bus, spec, seq)
        assert not task.done(), task  # the runner goes on
        later = (await bus.publish(failed("b-bounded-later"))).seq
        await _settled(bus, spec, later)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    handled.remove("evt-b-bounded-later")
    _check_outcome(consumer, ids, handled, refused)


def test_the_readable_versions_are_the_supported_ones() -> None:
    assert frozenset(SUPPORTED_VERSIONS) == _READABLE


@pytest.mark.parametrize(
    "spoil",
    [
        _escaped_base64,
        lambda raw: raw.replace(b'"data":', b'"\\u0064ata_base64":"e30=","data":'),
        lambda raw: raw.replace(b'"data":', b'"data\\u005Fbase64":"e30=","data":'),  # upper-case hex
    ],
)
def test_the_one_pass_decode_refuses_an_escaped_data_base64_as_decode_does(spoil: Callable[[bytes], bytes]) -> None:
    raw = spoil(encode(failed("escaped")))
    with pytest.raises(InvalidEnvelope):
        decode(raw)
    with pytest.raises(InvalidEnvelope):
        _decode(raw)


def test_control_characters_our_encoder_escapes_keep_the_one_pass_decode_exact() -> None:
    event = make_event(
        RunFailed(run_id="ctl", reason="r", error="\x1b[31mred\x1b[0m \x00\x1f"), source="/test", id="evt-ctl"
    )
    raw = encode(event)
    assert b"\\u001b" in raw
    assert b"\\u0000" in raw
    assert _decode(raw) == decode(raw) == event
