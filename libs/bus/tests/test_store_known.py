"""Store.modify(known=...): starting from what the caller last read or wrote saves the read when it is
current, and never changes what modify returns or raises when it is not (real nats-server)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from pydantic import BaseModel, ConfigDict

from temporality_bus import Bus, NotFound, Store, Versioned, evolve
from temporality_protocol.catalog import BucketSpec

BUCKET = BucketSpec("t-known", "test bucket")


class Gate(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    count: int = 0
    holder: str | None = None


class Held(Exception):
    pass


def _take(who: str) -> Callable[[Gate], Gate]:
    def fn(g: Gate) -> Gate:
        if g.holder not in (None, who):
            raise Held(g.holder)
        return evolve(g, holder=who, count=g.count + 1)

    return fn


async def _counted(bus: Bus) -> tuple[Store[Gate], list[str]]:
    """The store, and the keys of every read ``modify`` makes (a wrapper on this instance's ``get``)."""
    store = await bus.store(BUCKET, Gate)
    reads: list[str] = []
    get: Callable[[str], Awaitable[Versioned[Gate] | None]] = store.get

    async def counting(key: str) -> Versioned[Gate] | None:
        reads.append(key)
        return await get(key)

    store.get = counting  # type: ignore[method-assign]
    return store, reads


async def test_a_current_known_writes_without_a_read(bus: Bus) -> None:
    store, reads = await _counted(bus)
    rev = await store.create("k", Gate())
    first = await store.modify("k", _take("a"), known=Versioned(Gate(), rev))
    second = await store.modify("k", lambda g: evolve(g, count=g.count + 1), known=first)
    assert reads == []
    assert second.value == Gate(count=2, holder="a")
    assert await store.get("k") == Versioned(second.value, second.revision)


async def test_a_stale_known_loses_the_race_and_the_stored_value_decides(bus: Bus) -> None:
    store, reads = await _counted(bus)
    rev = await store.create("k", Gate())
    stale = Versioned(Gate(), rev)
    await store.modify("k", lambda g: evolve(g, count=10))  # someone else wrote meanwhile
    reads.clear()
    result = await store.modify("k", lambda g: evolve(g, count=g.count + 1), known=stale)
    assert result.value.count == 11  # applied to what is stored, not to the stale copy
    assert reads == ["k"]


async def test_no_change_on_a_stale_known_is_decided_on_a_fresh_read(bus: Bus) -> None:
    store, _ = await _counted(bus)
    rev = await store.create("k", Gate())
    stale = Versioned(Gate(), rev)
    await store.modify("k", _take("b"))
    # on the stale copy nobody holds it, so "release if b holds it" would change nothing; stored, b holds it
    result = await store.modify("k", lambda g: evolve(g, holder=None) if g.holder == "b" else None, known=stale)
    assert result.changed
    assert result.value.holder is None
    unchanged = await store.modify("k", lambda g: None, known=Versioned(Gate(count=99), result.revision))
    assert not unchanged.changed
    assert unchanged.value == result.value  # what is stored, not the known copy


async def test_fn_raising_on_a_stale_known_is_decided_on_a_fresh_read(bus: Bus) -> None:
    store, _ = await _counted(bus)
    rev = await store.create("k", Gate(holder="a"))
    stale = Versioned(Gate(holder="a"), rev)
    await store.modify("k", lambda g: evolve(g, holder=None))  # a released it meanwhile
    taken = await store.modify("k", _take("c"), known=stale)  # the stale copy says a holds it: would raise
    assert taken.value.holder == "c"
    with pytest.raises(Held, match="c"):  # and on what is stored it still raises when it should
        await store.modify("k", _take("d"), known=taken)


async def test_a_deleted_key_is_not_found_whatever_was_known(bus: Bus) -> None:
    store, _ = await _counted(bus)
    rev = await store.create("k", Gate())
    kv = await bus.ensure_bucket(BUCKET)
    await kv.delete("k")
    with pytest.raises(NotFound):
        await store.modify("k", _take("a"), known=Versioned(Gate(), rev))


async def test_current_gives_back_what_the_caller_holds_while_the_key_holds_it(bus: Bus) -> None:
    store = await bus.store(BUCKET, Gate)
    rev = await store.create("c", Gate(count=1))
    known = Versioned(Gate(count=1), rev)
    assert await store.current("c", known) is known  # unchanged: the caller's own, not decoded again
    written = await store.modify("c", lambda g: evolve(g, count=2), known=known)
    assert await store.current("c", written) is written


async def test_current_reads_what_another_writer_wrote_since(bus: Bus) -> None:
    store = await bus.store(BUCKET, Gate)
    rev = await store.create("w", Gate(count=1))
    known = Versioned(Gate(count=1), rev)
    other = await store.update("w", Gate(count=5, holder="b"), rev)
    assert await store.current("w", known) == Versioned(Gate(count=5, holder="b"), other)


@pytest.mark.parametrize("gone", ["delete", "purge"])
async def test_current_finds_nothing_once_the_key_is_deleted_or_purged(bus: Bus, gone: str) -> None:
    store = await bus.store(BUCKET, Gate)
    key = f"gone-{gone}"
    known = Versioned(Gate(count=1), await store.create(key, Gate(count=1)))
    if gone == "purge":
        await store.purge(key)
    else:
        await store._kv.delete(key)
    assert await store.current(key, known) is None
    recreated = await store.create(key, Gate(count=7))  # created again: the new value, never the old one
    assert await store.current(key, known) == Versioned(Gate(count=7), recreated)


async def test_current_of_a_key_that_never_was_is_nothing(bus: Bus) -> None:
    store = await bus.store(BUCKET, Gate)
    rev = await store.create("elsewhere", Gate())
    assert await store.current("never", Versioned(Gate(), rev)) is None  # a revision of another key
