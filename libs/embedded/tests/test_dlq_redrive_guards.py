"""``temporality dlq redrive`` against a real nats-server and real consumers: a dead letter that is no valid
CloudEvent is refused unless ``--force`` (re-driven, every consumer of its subject would dead-letter it again: one
letter became one per consumer), and a dry run names the other dead letters of the same original message (re-drive
one, purge the rest); ``list`` that cannot reach NATS without ``--data-dir`` says to pass it."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from test_dlq import Poisoned, _cli, _event, _letters, _running, _spec, _until

from temporality_bus import Bus, NatsSettings
from temporality_embedded import dlq
from temporality_protocol.catalog import EVENTS_STREAM, subject_for


@asynccontextmanager
async def _two_consumers(bus: Bus, first: str, second: str) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        for durable in (first, second):
            await stack.enter_async_context(_running(bus, _spec(durable), Poisoned()))
        yield


async def _both_letters(bus: Bus, first: str, second: str) -> tuple[dlq.DeadLetter, dlq.DeadLetter]:
    async def both() -> bool:
        return bool(await _letters(bus, first)) and bool(await _letters(bus, second))

    await _until(both, f"a dead letter of {first} and of {second}")
    (a,) = await _letters(bus, first)
    (b,) = await _letters(bus, second)
    return a, b


async def test_an_invalid_envelope_is_refused_without_force_and_never_claimed_idempotent(
    bus: Bus, nats_settings: NatsSettings
) -> None:
    async with _two_consumers(bus, "t-inv-a", "t-inv-b"):
        await bus.publish_raw(subject_for("run.failed"), b'{"hello": "not a CloudEvent"}', {"Nats-Msg-Id": "bad-1"})
        a, b = await _both_letters(bus, "t-inv-a", "t-inv-b")
    assert not a.valid_envelope
    assert a.original_seq == b.original_seq
    before = (await bus.js.stream_info(EVENTS_STREAM.name)).state.last_seq

    for argv in ([str(a.seq)], [str(a.seq), "--yes"]):
        code, out, err = await _cli(nats_settings, "redrive", *argv)
        assert code == 2, (out, err)
        assert f"dead letter {a.seq} is not a valid CloudEvent" in err
        assert "one letter becomes one per consumer" in err
        assert f"temporality dlq purge {a.seq} --yes" in err
        assert "--force re-drives it anyway" in err
        assert "idempotent by event id" not in out
    # nothing changed: both letters stay, nothing published
    assert [x.seq for x in await _letters(bus, "t-inv-a")] == [a.seq]
    assert (await bus.js.stream_info(EVENTS_STREAM.name)).state.last_seq == before

    # with --force the dry run says what it would do: not idempotent, and the other letter of the same message
    code, out, err = await _cli(nats_settings, "redrive", str(a.seq), "--force")
    assert code == 0, err
    assert "idempotent by event id" not in out
    assert "NOT idempotent (no valid CloudEvent" in out
    assert f"also dead-lettered as {b.seq} (t-inv-b)" in out
    assert f"re-drive one and purge the rest (`temporality dlq purge {b.seq} --yes`)" in out
    assert (await bus.js.stream_info(EVENTS_STREAM.name)).state.last_seq == before


async def test_a_dry_run_names_the_other_letters_of_the_same_message(bus: Bus, nats_settings: NatsSettings) -> None:
    async with _two_consumers(bus, "t-sib-a", "t-sib-b"):
        await bus.publish(_event("sib1"))
        a, b = await _both_letters(bus, "t-sib-a", "t-sib-b")
    assert a.valid_envelope
    code, out, err = await _cli(nats_settings, "redrive", str(b.seq))
    assert code == 0, err
    assert "so do, idempotent by event id: t-sib-a" in out
    assert f"also dead-lettered as {a.seq} (t-sib-a)" in out
    assert f"`temporality dlq purge {a.seq} --yes`" in out
    # both selected: neither is "the rest"
    code, out, err = await _cli(nats_settings, "redrive", str(a.seq), str(b.seq))
    assert code == 0, err
    assert "also dead-lettered" not in out


async def test_list_that_cannot_connect_without_data_dir_says_to_pass_it() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(dlq.main, ["list", "--nats-url", "nats://127.0.0.1:1"], out, err)
    assert code == 1
    assert "pass its data directory: --data-dir .temporality" in err.getvalue()
