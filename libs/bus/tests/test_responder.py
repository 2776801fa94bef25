"""The typed request/reply Responder against a real nats-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import nats
import nats.errors
import pytest
from pydantic import BaseModel, Field

from temporality_bus import Bus, Failure, NatsSettings, Request, Responder, written_out

SUBJECT = "temporality.rpc.test.echo"


class Ping(BaseModel):
    text: str
    protocol_versions: list[str] = Field(default_factory=lambda: ["1.0"])


class Pong(BaseModel):
    text: str | None = None
    version: str | None = None
    replica: str | None = None
    error: str | None = None
    kind: str | None = None


def _error(failure: Failure) -> Pong:
    return Pong(error=failure.detail, kind=failure.kind)


def _echo(replica: str = "r1", gate: asyncio.Event | None = None) -> Callable[[Request[Ping]], Awaitable[Pong]]:
    async def handle(request: Request[Ping]) -> Pong:
        if request.body.text == "boom":
            raise RuntimeError("the handler broke")
        if request.body.text == "slow" and gate is not None:
            await gate.wait()
        return Pong(text=request.body.text, version=request.version, replica=replica)

    return handle


def _responder(bus: Bus, **kwargs: object) -> Responder[Ping, Pong]:
    handler = kwargs.pop("handler", None) or _echo()
    return Responder(bus, SUBJECT, request_model=Ping, handler=handler, on_error=_error, queue="test-q", **kwargs)  # type: ignore[arg-type]


async def _ask(bus: Bus, body: bytes, timeout_s: float = 15) -> Pong:
    """One request; "no responders" right after another connection's SUB + flush is retried (nats-server
    2.15 + nats-py 2.16 show it rarely, see agent-collab's tests)."""
    for _ in range(3):
        try:
            msg = await bus.nc.request(SUBJECT, body, timeout=timeout_s)
        except nats.errors.NoRespondersError:
            await bus.nc.flush()
            continue
        return Pong.model_validate_json(msg.data)
    raise AssertionError("no responder")


@pytest.fixture
async def echo(bus: Bus) -> AsyncIterator[Responder[Ping, Pong]]:
    responder = _responder(bus)
    await responder.start()
    try:
        yield responder
    finally:
        await responder.stop()


@pytest.fixture
async def other_bus(nats_settings: NatsSettings) -> AsyncIterator[Bus]:
    async with Bus.connect(nats_settings, name="test-2") as b:
        yield b


async def test_a_typed_request_gets_a_typed_reply_with_the_negotiated_version(
    bus: Bus, echo: Responder[Ping, Pong]
) -> None:
    assert echo.running.is_set()
    assert await _ask(bus, Ping(text="hello").model_dump_json().encode()) == Pong(
        text="hello", version="1.0", replica="r1"
    )
    # the highest common version; unknown fields and unparseable versions are ignored
    body = b'{"text": "v", "protocol_versions": ["2.0", "1.0", "next"], "future": 1}'
    assert await _ask(bus, body) == Pong(text="v", version="1.0", replica="r1")


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b"not json", "body: Invalid JSON"),
        (b"", "body: Invalid JSON"),
        (b"[1]", "body: Input should be an object"),
        (b"{}", "text: Field required"),
        (b'{"text": 5}', "text: Input should be a valid string"),
        (b'{"text": "x", "protocol_versions": "1.0"}', "protocol_versions: Input should be a valid array"),
    ],
)
async def test_a_malformed_request_gets_a_malformed_reply(
    bus: Bus, echo: Responder[Ping, Pong], body: bytes, detail: str
) -> None:
    reply = await _ask(bus, body)
    assert reply.kind == "malformed"
    assert reply.error is not None
    assert reply.error.startswith(detail)
    assert (await _ask(bus, b'{"text": "still here"}')).text == "still here"


async def test_no_common_version_is_refused_explicitly(bus: Bus, echo: Responder[Ping, Pong]) -> None:
    reply = await _ask(bus, b'{"text": "x", "protocol_versions": ["2.0", "3.1"]}')
    assert reply.kind == "unsupported_version"
    assert reply.error is not None
    assert "no common protocol version" in reply.error
    assert "2.0" in reply.error
    assert (await _ask(bus, b'{"text": "x", "protocol_versions": []}')).kind == "unsupported_version"


async def test_a_handler_exception_becomes_an_internal_error_reply(bus: Bus, echo: Responder[Ping, Pong]) -> None:
    reply = await _ask(bus, b'{"text": "boom"}')
    assert reply == Pong(error="RuntimeError", kind="internal")  # the type, never the trace or message
    assert (await _ask(bus, b'{"text": "after"}')).text == "after"


async def test_a_failing_error_reply_still_answers(bus: Bus) -> None:
    def broken(failure: Failure) -> Pong:
        raise ValueError("cannot build it")

    responder = Responder(bus, SUBJECT, request_model=Ping, handler=_echo(), on_error=broken)
    await responder.start()
    try:
        msg = await bus.nc.request(SUBJECT, b"not json", timeout=15)
        assert msg.data == b'{"error": "internal error: ValueError"}'
    finally:
        await responder.stop()


async def test_replicas_in_one_queue_group_answer_each_request_once(bus: Bus, other_bus: Bus) -> None:
    first = _responder(bus, handler=_echo("r1"))
    second = _responder(other_bus, handler=_echo("r2"))
    await first.start()
    await second.start()
    try:
        inbox = bus.nc.new_inbox()
        replies = await bus.nc.subscribe(inbox)
        n = 40
        for k in range(n):
            await bus.nc.publish(SUBJECT, Ping(text=f"q{k}").model_dump_json().encode(), reply=inbox)
        got: list[Pong] = []
        async with asyncio.timeout(30):
            while len(got) < n:
                got.append(Pong.model_validate_json((await replies.next_msg(timeout=30)).data))
        with pytest.raises(nats.errors.TimeoutError):  # a settle window: nobody answers a second time
            await replies.next_msg(timeout=1)
    finally:
        await first.stop()
        await second.stop()
    assert sorted(p.text or "" for p in got) == sorted(f"q{k}" for k in range(n))
    assert {p.replica for p in got} == {"r1", "r2"}  # the group shares the load


async def test_stop_removes_interest_first_then_answers_what_it_received(bus: Bus, other_bus: Bus) -> None:
    gate = asyncio.Event()
    responder = _responder(other_bus, handler=_echo(gate=gate))
    await responder.start()
    in_flight = asyncio.create_task(_ask(bus, b'{"text": "slow"}'))
    deadline = time.monotonic() + 15
    while not responder._tasks:  # the slow request has reached the handler
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    stopping = asyncio.create_task(responder.stop(15))
    deadline = time.monotonic() + 15
    while True:  # interest goes first: a new request finds no responder while the slow one is served
        try:
            await bus.nc.request(SUBJECT, b'{"text": "late"}', timeout=2)
        except nats.errors.NoRespondersError:
            break
        assert time.monotonic() < deadline, "the stopping responder still takes new requests"
        await asyncio.sleep(0.05)
    assert not responder.running.is_set()
    assert not stopping.done()
    gate.set()
    assert (await asyncio.wait_for(in_flight, 15)).text == "slow"  # received before stop: answered
    await asyncio.wait_for(stopping, 15)
    await responder.stop()  # idempotent


async def test_stop_gives_up_on_a_handler_that_never_finishes(bus: Bus) -> None:
    never = asyncio.Event()
    responder = _responder(bus, handler=_echo(gate=never))
    await responder.start()
    inbox = bus.nc.new_inbox()
    replies = await bus.nc.subscribe(inbox)
    await bus.nc.publish(SUBJECT, b'{"text": "slow"}', reply=inbox)
    deadline = time.monotonic() + 15
    while not responder._tasks:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    started = time.monotonic()
    await responder.stop(0.5)
    assert time.monotonic() - started < 5
    assert not responder._tasks
    reply = Pong.model_validate_json((await replies.next_msg(timeout=15)).data)
    assert reply.kind == "stopped"  # even a request cut off at stop gets its reply


async def test_max_inflight_bounds_concurrent_handlers(bus: Bus) -> None:
    gate = asyncio.Event()
    active = 0
    peak = 0

    async def handle(request: Request[Ping]) -> Pong:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await gate.wait()
        active -= 1
        return Pong(text=request.body.text)

    responder = _responder(bus, handler=handle, max_inflight=2)
    await responder.start()
    try:
        asks = [asyncio.create_task(_ask(bus, Ping(text=f"c{k}").model_dump_json().encode())) for k in range(5)]
        deadline = time.monotonic() + 15
        while peak < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # more would have started by now if nothing bounded them
        assert peak == 2
        gate.set()
        assert sorted([(await a).text or "" for a in asks]) == [f"c{k}" for k in range(5)]
    finally:
        gate.set()
        await responder.stop()


async def test_negotiation_needs_a_declared_versions_field_or_can_be_off(bus: Bus) -> None:
    class Bare(BaseModel):
        text: str

    async def handle(request: Request[Bare]) -> Pong:
        return Pong(text=request.body.text, version=request.version)

    with pytest.raises(TypeError, match="protocol_versions"):
        Responder(bus, SUBJECT, request_model=Bare, handler=handle, on_error=_error)
    plain = Responder(bus, SUBJECT, request_model=Bare, handler=handle, on_error=_error, negotiate_versions=False)
    await plain.start()
    try:
        assert await _ask(bus, b'{"text": "x"}') == Pong(text="x", version=None)
    finally:
        await plain.stop()


async def test_written_out_pings_after_the_buffered_subscription(nats_settings: NatsSettings) -> None:
    """What ``written_out`` relies on, watched at the socket: nats-py's ``flush`` writes its ``PING`` ahead of the
    ``SUB`` still in its buffer (so its ``PONG`` proves nothing about the subscription); the second ``PING`` goes
    out after the ``SUB``, and its ``PONG`` comes only once the server has read it."""
    nc = await nats.connect(nats_settings.url)
    try:
        await nc.flush()
        writes: list[bytes] = []
        transport = nc._transport
        assert transport is not None
        write, writelines = transport.write, transport.writelines

        def recorded(data: bytes) -> None:
            writes.append(bytes(data))
            write(data)

        def recorded_lines(data: list[bytes]) -> None:
            writes.extend(bytes(line) for line in data)
            writelines(data)

        transport.write = recorded  # type: ignore[method-assign]
        transport.writelines = recorded_lines  # type: ignore[method-assign]
        await nc.subscribe("written.out.check")
        await written_out(nc)
        sent = b"".join(writes)
        assert sent.count(b"PING\r\n") == 2
        assert sent.index(b"SUB written.out.check") < sent.rindex(b"PING\r\n")
    finally:
        await nc.close()
