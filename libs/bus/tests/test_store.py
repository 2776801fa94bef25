"""Store.modify (the one compare-and-set loop) and validated updates, against a real nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import nats.js.errors
import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from temporality_bus import (
    Bus,
    Conflict,
    Contended,
    Modified,
    NotFound,
    Recent,
    Store,
    TransientError,
    Versioned,
    evolve,
)
from temporality_bus.models import evolve_shallow
from temporality_protocol.catalog import BucketSpec

BUCKET = BucketSpec("t-modify", "test bucket")


class Counter(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    count: int = 0
    seen: list[str] = Field(default_factory=list)
    limit: int | None = None

    @model_validator(mode="after")
    def _within_limit(self) -> Counter:
        if self.limit is not None and self.count > self.limit:
            raise ValueError(f"count {self.count} is over the limit {self.limit}")
        return self


class Other(BaseModel):
    name: str


def _bump(by: str) -> Callable[[Counter], Counter]:
    def fn(c: Counter) -> Counter:
        return evolve(c, count=c.count + 1, seen=[*c.seen, by])

    return fn


class Refused(Exception):
    pass


async def _store(bus: Bus) -> Store[Counter]:
    return await bus.store(BUCKET, Counter)


# --------------------------------------------------------------------------- evolve
@pytest.mark.parametrize("change", [evolve, evolve_shallow])
def test_evolve_validates_the_result_and_refuses_unknown_names(change: Callable[..., Counter]) -> None:
    c = Counter(name="a", limit=2)
    assert change(c, count=2) == Counter(name="a", count=2, limit=2)
    assert c.count == 0  # a copy
    with pytest.raises(ValidationError, match="extra_forbidden") as unknown:
        change(c, cuont=1)  # model_copy(update=...) would drop this silently
    assert unknown.value.errors()[0]["loc"] == ("cuont",)
    with pytest.raises(ValidationError, match="int_parsing"):
        change(c, count="many")  # model_copy(update=...) would store this
    with pytest.raises(ValidationError, match="over the limit"):
        change(c, count=3)  # model validators run too


class Holder(BaseModel):
    model_config = ConfigDict(extra="allow")

    counter: Counter
    data: dict[str, object] = Field(default_factory=dict)
    note: str = ""


def test_evolve_shallow_keeps_the_nested_models_it_was_given() -> None:
    """The same result as :func:`evolve`, without dumping and validating again what ``model`` already holds: a
    nested model goes in as it is (validated when it was made), extra fields stay."""
    h = Holder(counter=Counter(name="a"), data={"pr": {"id": 1}}, more=1)  # type: ignore[call-arg]
    deep, shallow = evolve(h, note="x"), evolve_shallow(h, note="x")
    assert shallow == deep == Holder(counter=Counter(name="a"), data={"pr": {"id": 1}}, note="x", more=1)  # type: ignore[call-arg]
    assert shallow.counter is h.counter  # taken as it is
    assert deep.counter is not h.counter  # dumped and built again
    assert shallow.model_extra == {"more": 1}
    with pytest.raises(ValidationError, match="string_type"):
        evolve_shallow(h, note=3)  # the changes are validated all the same


# --------------------------------------------------------------------------- modify
async def test_concurrent_modifiers_are_all_applied(bus: Bus) -> None:
    store = await _store(bus)
    await store.create("k", Counter(name="k"))
    writers = [f"w{n:02d}" for n in range(20)]
    results = await asyncio.gather(*(store.modify("k", _bump(w), attempts=100) for w in writers))
    got = await store.get("k")
    assert got is not None
    assert got.value.count == len(writers)
    assert sorted(got.value.seen) == writers  # every modifier applied exactly once
    assert all(r.changed for r in results)
    assert len({r.revision for r in results}) == len(writers)  # each won its own revision
    assert max(r.revision for r in results) == got.revision


async def test_modify_returns_what_is_stored(bus: Bus) -> None:
    store = await _store(bus)
    rev = await store.create("k", Counter(name="k"))
    result = await store.modify("k", lambda c: evolve(c, count=5))
    assert isinstance(result, Modified)
    assert isinstance(result, Versioned)
    assert result.changed
    assert result.value == Counter(name="k", count=5)
    assert result.revision > rev
    got = await store.get("k")
    assert got == Versioned(result.value, result.revision)


async def test_no_change_writes_nothing(bus: Bus) -> None:
    store = await _store(bus)
    rev = await store.create("k", Counter(name="k", count=1))
    for fn in (lambda c: None, lambda c: c):  # None, or the very object it got
        result = await store.modify("k", fn)
        assert not result.changed
        assert result.revision == rev
        assert result.value == Counter(name="k", count=1)
    got = await store.get("k")
    assert got is not None
    assert got.revision == rev


async def test_absent_key_is_not_found_or_created(bus: Bus) -> None:
    store = await _store(bus)
    with pytest.raises(NotFound):
        await store.modify("absent", lambda c: evolve(c, count=1))
    # with create: fn sees the created value; nothing is written when it changes nothing
    untouched = await store.modify("absent", lambda c: None, create=lambda: Counter(name="new"))
    assert not untouched.changed
    assert untouched.revision == 0
    assert await store.get("absent") is None
    made = await store.modify("absent", _bump("first"), create=lambda: Counter(name="new"))
    assert made.changed
    assert made.value == Counter(name="new", count=1, seen=["first"])
    assert await store.get("absent") == Versioned(made.value, made.revision)


async def test_concurrent_creators_all_land(bus: Bus) -> None:
    store = await _store(bus)
    writers = [f"c{n}" for n in range(10)]
    await asyncio.gather(
        *(store.modify("fresh", _bump(w), create=lambda: Counter(name="fresh"), attempts=50) for w in writers)
    )
    got = await store.get("fresh")
    assert got is not None
    assert sorted(got.value.seen) == writers


async def test_an_invalid_result_is_refused_and_nothing_is_written(bus: Bus) -> None:
    store = await _store(bus)
    rev = await store.create("k", Counter(name="k", limit=1))
    with pytest.raises(ValidationError, match="int_parsing"):
        await store.modify("k", lambda c: c.model_copy(update={"count": "many"}))  # unvalidated copy
    with pytest.raises(ValidationError, match="over the limit"):
        await store.modify("k", lambda c: c.model_copy(update={"count": 2}))  # the model validator runs
    with pytest.raises(TypeError, match="expected a Counter"):
        await store.modify("k", lambda c: Other(name="x"))  # type: ignore[arg-type,return-value]
    got = await store.get("k")
    assert got is not None
    assert got.revision == rev
    # the plain writes validate too
    with pytest.raises(ValidationError):
        await store.update("k", Counter(name="k").model_copy(update={"seen": "not a list"}), rev)
    with pytest.raises(ValidationError):
        await store.create("k2", Counter(name="k2").model_copy(update={"name": 3}))


async def test_validated_writes_are_written_as_they_are_built(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    """``validated=True``: values built with ``evolve`` (validated once) are not validated again; the default
    validates every write (counted on the model's validator), and another model is refused either way."""
    store = await _store(bus)
    await store.create("v", Counter(name="v"), validated=True)
    validations = 0
    original = Counter.model_validate

    def counting(obj: object, **kwargs: object) -> Counter:
        nonlocal validations
        validations += 1
        return original(obj, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Counter, "model_validate", counting)
    bumped = await store.modify("v", lambda c: evolve(c, count=c.count + 1), validated=True)
    assert (bumped.value.count, validations) == (1, 1)  # evolve's own validation only
    again = await store.modify("v", lambda c: evolve(c, count=c.count + 1))
    assert (again.value.count, validations) == (2, 3)  # evolve's, then the store's
    updated = await store.update("v", evolve(again.value, count=3), again.revision, validated=True)
    assert validations == 4
    with pytest.raises(TypeError, match="expected a Counter"):
        await store.modify("v", lambda c: Other(name="x"), validated=True)  # type: ignore[arg-type,return-value]
    got = await store.get("v")
    assert got is not None
    assert (got.value.count, got.revision) == (3, updated)


async def test_fn_raising_aborts_without_writing(bus: Bus) -> None:
    store = await _store(bus)
    rev = await store.create("k", Counter(name="k"))

    def refuse(c: Counter) -> Counter:
        raise Refused("not today")

    with pytest.raises(Refused):
        await store.modify("k", refuse)
    got = await store.get("k")
    assert got is not None
    assert got.revision == rev


class _Interfering(Store[Counter]):
    """Another writer gets in between every read and write of ``modify``."""

    async def get(self, key: str) -> Versioned[Counter] | None:
        got = await super().get(key)
        if got is not None:
            await self.put(key, evolve(got.value, seen=[*got.value.seen, "other"]))
        return got


async def test_attempts_exhausted_is_a_transient_contended_error(bus: Bus) -> None:
    store = await _store(bus)
    await store.create("k", Counter(name="k"))
    interfering = _Interfering(await bus.kv(BUCKET), BUCKET.name, Counter)
    calls = 0

    def fn(c: Counter) -> Counter:
        nonlocal calls
        calls += 1
        return evolve(c, count=c.count + 1)

    with pytest.raises(Contended) as lost:
        await interfering.modify("k", fn, attempts=3)
    assert calls == 3  # fn ran once per attempt, on a fresh read each time
    assert isinstance(lost.value, TransientError)
    assert not isinstance(lost.value, Conflict)  # one lost race is progress elsewhere; all lost is not
    assert lost.value.attempts == 3
    got = await store.get("k")
    assert got is not None
    assert got.value.count == 0  # none of our attempts landed
    assert got.value.seen == ["other"] * 3
    with pytest.raises(ValueError, match="at least 1"):
        await store.modify("k", fn, attempts=0)


async def test_as_many_attempts_as_concurrent_writers_never_run_out(bus: Bus) -> None:
    """Each lost race is another writer's write landing, so N writers of one key with N attempts each all
    land, whatever the interleaving (the backoff between races only spreads them out)."""
    store = await _store(bus)
    writers = 16

    async def one(i: int) -> None:
        await store.modify(
            "hot",
            lambda c: evolve(c, count=c.count + 1, seen=[*c.seen, str(i)]),
            create=lambda: Counter(name="hot"),
            attempts=writers,
        )

    await asyncio.gather(*(one(i) for i in range(writers)))
    got = await store.get("hot")
    assert got is not None
    assert got.value.count == writers
    assert sorted(got.value.seen, key=int) == [str(i) for i in range(writers)]


async def test_a_lost_race_calls_fn_again_on_the_new_value(bus: Bus) -> None:
    """What the racing-answers rule rests on: fn sees what the winner wrote and can refuse."""
    store = await _store(bus)
    rev = await store.create("k", Counter(name="k"))
    winner_written = False
    seen_counts: list[int] = []

    def fn(c: Counter) -> Counter:
        seen_counts.append(c.count)
        if c.count:
            raise Refused("someone else got there first")
        return evolve(c, count=1, seen=["loser"])

    class _Racing(Store[Counter]):
        async def get(self, key: str) -> Versioned[Counter] | None:
            nonlocal winner_written
            got = await super().get(key)
            if not winner_written and got is not None:
                winner_written = True
                await store.update(key, evolve(got.value, count=1, seen=["winner"]), got.revision)
            return got

    racing = _Racing(await bus.kv(BUCKET), BUCKET.name, Counter)
    with pytest.raises(Refused):
        await racing.modify("k", fn)
    assert seen_counts == [0, 1]
    got = await store.get("k")
    assert got is not None
    assert got.value.seen == ["winner"]
    assert got.revision == rev + 1


# --------------------------------------------------------------------------- purge
async def test_purge_removes_the_key_and_its_history_and_stale_writes_lose(bus: Bus) -> None:
    """What a finished run's checkpoint removal rests on: gone for readers, every revision with it, and a
    writer holding a revision from before cannot bring it back (only a create can)."""
    spec = BucketSpec("t-purge", "test bucket with history", history=5)
    store = await bus.store(spec, Counter)
    first = await store.create("k", Counter(name="k"))
    second = await store.update("k", Counter(name="k", count=1), first)
    await store.create("other", Counter(name="other"))

    await store.purge("k")
    assert await store.get("k") is None
    assert await store.keys() == ["other"]
    # the purge marker alone: no revision left. Read from the stream itself: nats-py's KeyValue.history() races
    # (its watch asks the consumer's pending count while the first message is already in hand, and then ends
    # the history before it, raising NoKeysError: seen once in CI)
    subject = f"$KV.{spec.name}.k"
    state = (await bus.js.stream_info(f"KV_{spec.name}", subjects_filter=subject)).state
    assert state.subjects == {subject: 1}
    marker = await bus.js.get_last_msg(f"KV_{spec.name}", subject)
    assert marker.headers is not None
    assert marker.headers.get("KV-Operation") == "PURGE"
    assert not marker.data
    with pytest.raises(Conflict):
        await store.update("k", Counter(name="k", count=2), second)
    with pytest.raises(NotFound):
        await store.modify("k", _bump("late"))
    assert await store.get("k") is None

    await store.purge("k")  # again, and a key never written: nothing changes, nothing raises
    await store.purge("never")
    assert await store.keys() == ["other"]
    assert (await store.get("other")) is not None
    await store.create("k", Counter(name="k", count=7))  # a create may write it again
    got = await store.get("k")
    assert got is not None
    assert got.value.count == 7


# --------------------------------------------------------------------------- reads
async def test_a_read_gives_what_the_kv_client_reads(bus: Bus) -> None:
    """``get`` reads the key's last message itself (not through nats-py's KV client): the same value and revision
    for a value written by compare-and-set (it carries a header) or by a plain put, and nothing for a key never
    written, deleted or purged; a key the KV client would refuse still goes through the client and is refused."""
    spec = BucketSpec("t-read", "test bucket for reads", history=3)
    store = await bus.store(spec, Counter)
    kv = await bus.kv(spec)
    created = await store.create("a.b", Counter(name="a"))
    updated = await store.update("a.b", Counter(name="a", count=3), created)
    entry = await kv.get("a.b")
    got = await store.get("a.b")
    assert got is not None
    assert (
        (got.value, got.revision)
        == (Counter.model_validate_json(entry.value or b""), entry.revision)
        == (
            Counter(name="a", count=3),
            updated,
        )
    )
    await kv.put("plain", Counter(name="plain", count=1).model_dump_json().encode())
    plain = await store.get("plain")
    assert plain is not None
    assert plain.value == Counter(name="plain", count=1)
    assert await store.get("never") is None
    await kv.delete("plain")
    assert await store.get("plain") is None
    await store.purge("a.b")
    assert await store.get("a.b") is None
    with pytest.raises(nats.js.errors.InvalidKeyError):
        await store.get("not a key")


def test_recent_keeps_the_most_recently_used_and_drops_the_oldest() -> None:
    recent: Recent[int] = Recent(2)
    recent.put("a", 1)
    recent.put("b", 2)
    recent.put("a", 3)  # put again: now the newest
    recent.put("c", 4)  # one too many: "b", used longest ago, goes
    assert (recent.get("a"), recent.get("b"), recent.get("c"), len(recent)) == (3, None, 4, 2)
    assert recent.get("a") == 3  # read: now the most recently used
    recent.put("d", 5)
    assert (recent.get("a"), recent.get("c"), recent.get("d")) == (3, None, 5)
    assert recent.pop("a") == 3
    assert recent.get("a") is None
    with pytest.raises(ValueError, match="positive"):
        Recent(0)
