"""The runtime's parts against a real nats-server: readiness follows the consumers, declarations are enforced."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket

import httpx
import pytest
from fastapi import FastAPI

from temporality_bus import Bus, Consumer, Delivery, NatsSettings
from temporality_protocol import Envelope
from temporality_protocol.catalog import CONSUMERS, SERVICES, ServiceSpec
from temporality_service import Readiness, Runtime, ServiceSettings, bind_tcp, health, run_until
from temporality_service.health import add_health_routes
from temporality_service.server import KEEP_ALIVE_S, HttpServer
from temporality_testing.waiting import eventually

JOURNAL = CONSUMERS["journal"]


async def _ignore(event: Envelope, delivery: Delivery) -> None:
    return None


async def test_readyz_is_503_until_the_consumer_is_bound_and_again_once_it_stops(bus: Bus) -> None:
    readiness = Readiness("journal", bus)
    consumer = Consumer(bus, JOURNAL, handler=_ignore)
    readiness.watch_consumer(consumer)
    app = FastAPI()
    add_health_routes(app, readiness)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc.test") as client:
        starting = await client.get("/readyz")
        assert starting.status_code == 503
        assert starting.json()["consumers"] == {"journal": "not running"}
        assert "consumer journal is not running" in starting.json()["detail"]
        assert (await client.get("/healthz")).json() == {"status": "ok", "service": "journal", "nats": "connected"}

        stop = asyncio.Event()
        task = asyncio.create_task(consumer.run(stop))
        await asyncio.wait_for(consumer.running.wait(), 10)
        info = await bus.js.consumer_info(JOURNAL.stream, JOURNAL.durable)  # really bound on the server
        assert info.config.durable_name == JOURNAL.durable
        assert (await client.get("/readyz")).status_code == 503  # bound, but the runtime has not said ready
        readiness.ready = True
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["status"] == "ready"

        stop.set()
        await asyncio.wait_for(task, 10)
        assert not consumer.running.is_set()
        assert (await client.get("/readyz")).status_code == 503


async def test_a_failing_readiness_check_is_503_naming_it(bus: Bus) -> None:
    readiness = Readiness("journal", bus)
    readiness.ready = True

    async def database() -> None:
        raise ConnectionRefusedError("database down")

    readiness.add_check("database", database)
    ready, fields, reasons = await readiness.report()
    assert not ready
    assert fields["checks"] == {"database": "failing"}
    assert reasons == ["database failing: database down"]


async def test_a_failing_check_s_reason_is_redacted_and_bounded(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    """/readyz's detail says what the check raised (which part, its error), never a secret, at most 500 characters."""
    monkeypatch.setattr(health, "CHECK_TIMEOUT_S", 0.2)
    readiness = Readiness("run-executor", bus)
    readiness.ready = True

    async def servers() -> None:
        raise RuntimeError(
            "not listed yet: agent rn-future: mcp server notes: connect to postgres://app:hunter2secret@db/x failed "
            + "y" * 1000
        )

    async def hangs() -> None:
        await asyncio.sleep(10)

    readiness.add_check("mcp servers", servers)
    readiness.add_check("cache", hangs)
    ready, fields, reasons = await readiness.report()
    assert not ready
    assert fields["checks"] == {"mcp servers": "failing", "cache": "failing"}
    failing, hanging = reasons
    assert failing.startswith("mcp servers failing: not listed yet: agent rn-future: mcp server notes: connect to ")
    assert "hunter2secret" not in failing
    assert "[REDACTED:" in failing
    assert len(failing) == len("mcp servers failing: ") + health.MAX_CHECK_DETAIL
    assert failing.endswith("y…")
    assert hanging == "cache does not answer within 0.2s"


async def test_the_runtime_refuses_parts_the_catalogue_does_not_declare(bus: Bus) -> None:
    async with contextlib.AsyncExitStack() as stack:
        rt = Runtime(SERVICES["run-executor"], ServiceSettings(), bus, stack)
        with pytest.raises(ValueError, match="does not declare the consumer 'journal'"):
            rt.consumer("journal", handler=_ignore)
        rt.consumer("run-executor-requests", handler=_ignore)
        with pytest.raises(ValueError, match="registered twice"):
            rt.consumer("run-executor-requests", handler=_ignore)
        with pytest.raises(RuntimeError, match="run-executor-human"):
            rt._check_declared()  # declared in catalog.SERVICES but never registered
        with pytest.raises(ValueError, match="no port"):
            rt.http(FastAPI())


async def test_a_consumer_gets_its_dead_letter_hook_and_a_delivery_limit_override(bus: Bus) -> None:
    async def hook(message: Envelope | bytes, delivery: Delivery, error: BaseException) -> None:
        return None

    async with contextlib.AsyncExitStack() as stack:
        rt = Runtime(SERVICES["run-executor"], ServiceSettings(), bus, stack)
        requests = rt.consumer("run-executor-requests", handler=_ignore, on_dead_letter=hook, max_deliver=2)
        human = rt.consumer("run-executor-human", handler=_ignore)
        assert requests._on_dead_letter is hook
        assert requests.spec.max_deliver == 2
        assert requests.spec.filter_subjects == CONSUMERS["run-executor-requests"].filter_subjects
        assert CONSUMERS["run-executor-requests"].max_deliver == 8  # the catalogue itself is not changed
        assert human._on_dead_letter is None
        assert human.spec is CONSUMERS["run-executor-human"]
        with pytest.raises(ValueError, match="max_deliver"):
            rt.consumer("run-executor-watchdog", raw_handler=_ignore_raw, max_deliver=0)


async def _ignore_raw(data: bytes, delivery: Delivery) -> None:
    return None


async def test_a_spec_without_the_consumer_cannot_smuggle_it_in(bus: Bus) -> None:
    spec = ServiceSpec("x", package="x", description="x", env_prefix="X_")
    async with contextlib.AsyncExitStack() as stack:
        rt = Runtime(spec, ServiceSettings(), bus, stack)
        with pytest.raises(ValueError, match="does not declare"):
            rt.consumer("journal", handler=_ignore)


def test_the_listening_socket_gets_tcp_nodelay_and_reuseaddr() -> None:
    sock = bind_tcp("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP  # asyncio sets TCP_NODELAY on accepted sockets only then
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()


async def test_an_idle_keep_alive_connection_is_kept_longer_than_clients_and_proxies_keep_theirs() -> None:
    """The server closing an idle connection first would race the client's next request on it (a lost POST)."""
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, str]:
        return {"pong": "yes"}

    server = HttpServer(app, host="127.0.0.1", port=0)
    serving = asyncio.create_task(server.run_until_exit())
    try:
        await asyncio.wait_for(server.listening.wait(), 30)
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            assert (await client.get("/ping")).json() == {"pong": "yes"}
            [connection] = server.server_state.connections  # idle now, kept alive
            timer = connection.timeout_keep_alive_task  # type: ignore[attr-defined]
            assert timer is not None
            left = timer.when() - asyncio.get_running_loop().time()
            assert KEEP_ALIVE_S - 10 < left <= KEEP_ALIVE_S, left  # not uvicorn's 5 s
            assert KEEP_ALIVE_S > 60  # above AWS ALB's and nginx's 60 s idle timeouts
            assert (await client.get("/ping")).status_code == 200  # the same connection serves the next one
            assert len(server.server_state.connections) == 1
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)


@pytest.mark.parametrize("freeze_heap", [False, True])
async def test_the_service_s_own_process_freezes_what_its_start_made_out_of_the_collector(
    nats_settings: NatsSettings, freeze_heap: bool
) -> None:
    """``run_service`` (the service's own process) passes ``freeze_heap``: once the setup is done, what it made is
    in the collector's permanent generation, which full collections never walk; in-process (tests) it stays put."""
    spec = ServiceSpec("freeze-probe", package="tests", description="a service made for this test", env_prefix="P_")
    made: list[list[object]] = []

    async def setup(rt: Runtime[ServiceSettings]) -> None:
        made.append([object()])  # a container the start made (the cyclic collector tracks lists)

    before = gc.get_freeze_count()
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        run_until(spec, ServiceSettings(nats=nats_settings), setup, stop, ready=ready, freeze_heap=freeze_heap)
    )
    try:
        await asyncio.wait_for(ready.wait(), 30)
        frozen = gc.get_freeze_count()
        walked = any(o is made[0] for o in gc.get_objects())  # the generations a collection walks
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        if freeze_heap:
            gc.unfreeze()  # this test process goes on starting services
    if freeze_heap:
        assert frozen > before
        assert not walked
    else:
        assert frozen == before
        assert walked


async def test_run_service_runs_the_service_with_its_heap_frozen(
    monkeypatch: pytest.MonkeyPatch, nats_settings: NatsSettings
) -> None:
    """The console script's body (``run_service``: the service's own process) is the one that asks for it."""
    from temporality_service import runtime

    asked: list[bool] = []

    async def run_until(*args: object, freeze_heap: bool = False, **kwargs: object) -> None:
        asked.append(freeze_heap)

    async def setup(rt: Runtime[ServiceSettings]) -> None:
        pass

    monkeypatch.setattr(runtime, "run_until", run_until)
    monkeypatch.setattr(runtime, "configure_logging", lambda *args, **kwargs: None)  # this process's logging stays
    monkeypatch.setattr(runtime, "stop_on_signals", asyncio.Event)  # and its signal handlers
    monkeypatch.setenv("P_NATS_URL", nats_settings.url)
    spec = ServiceSpec("freeze-probe", package="tests", description="a service made for this test", env_prefix="P_")
    assert await runtime.run_service(spec, ServiceSettings, lambda settings: setup) == 0
    assert asked == [True]


async def test_a_slow_setup_answers_healthz_meanwhile_and_a_quick_one_binds_nothing_before_the_app(
    nats_settings: NatsSettings,
) -> None:
    """A setup that takes long (the journal's migration of a large database, or waiting on another replica's
    migration lock) must not look dead to a startup probe: ``/healthz`` 200 and ``/readyz`` 503 saying it is still
    starting, then the service's own app on the same port."""
    probe = bind_tcp("127.0.0.1", 0)
    port = probe.getsockname()[1]
    probe.close()
    spec = ServiceSpec("setup-probe", package="tests", description="a service made for this test", env_prefix="P_")
    release = asyncio.Event()

    async def setup(rt: Runtime[ServiceSettings]) -> None:
        await release.wait()  # a migration that takes its time
        app = FastAPI()

        @app.get("/own")
        async def own() -> dict[str, str]:
            return {"app": "the service's own"}

        rt.http(app)

    stop, ready = asyncio.Event(), asyncio.Event()
    settings = ServiceSettings(nats=nats_settings, port=port)
    task = asyncio.create_task(run_until(spec, settings, setup, stop, ready=ready))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:

            async def alive() -> httpx.Response | None:
                try:
                    answer = await client.get("/healthz")
                except httpx.TransportError:
                    return None
                return answer if answer.status_code == 200 else None

            await eventually(alive, timeout_s=30, what="/healthz while the setup runs")
            starting = await client.get("/readyz")
            assert starting.status_code == 503, starting.text
            assert starting.json()["checks"] == {"setup": "failing"}
            early = await client.post("/own", content=b"{}")  # not the service's app yet: retry, never a 404
            assert early.status_code == 503, early.text
            assert early.json()["error"] == "starting"
            assert early.headers["retry-after"] == "5"
            release.set()
            await asyncio.wait_for(ready.wait(), 30)
            own = await client.get("/own")
            assert own.status_code == 200, own.text
            assert own.json() == {"app": "the service's own"}
    finally:
        release.set()
        stop.set()
        await asyncio.wait_for(task, 30)
