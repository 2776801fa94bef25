"""``run_service``: the one lifecycle of every Temporality service process.

    settings -> logging -> tracing (``OTEL_*``, :mod:`.tracing`) -> connect (replies below its own inbox, ``_INBOX.<service>``) -> ensure the
    layout it owns (its streams and buckets, ``ServiceSpec.streams`` / ``buckets``) -> wait until the streams
    it uses and the buckets it reads exist (their owners create them; meanwhile ``/healthz`` 200 and
    ``/readyz`` 503) -> setup (the service registers its consumers,
    responders, HTTP app, readiness checks and resources) -> start them all -> ready (ready file,
    ``/readyz`` 200) only once every consumer is bound, every responder subscribed and the HTTP server
    accepting -> wait for SIGTERM/SIGINT -> not ready -> stop HTTP and responders (no new work) -> let the
    consumers finish their in-flight messages -> close resources -> drain the connection -> exit 0.

Exit codes: ``0`` after a clean stop, ``2`` when settings or the service's own configuration are invalid
(nothing was connected), ``1`` when a part of the service failed (any consumer, responder or the HTTP
server ending on its own stops all the others: a half-working process is worse than a restarted one).

A service declares what it runs in :data:`temporality_protocol.catalog.SERVICES`; the runtime refuses to
start a consumer or responder the service does not declare, and refuses to start when a declared one was
not registered, so the catalogue (and everything derived from it: the embedded launcher, AsyncAPI,
compose, the chart) cannot drift from the code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Generic, NoReturn, Protocol, TypeVar

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from nats.js.errors import BadRequestError, NotFoundError
from pydantic import ValidationError

from temporality_bus import Bus, Consumer
from temporality_bus.consumer import BatchHandler, DeadLetterHook, EnvelopeHandler, RawHandler
from temporality_bus.timers import checking_firings, migrate_legacy_timers
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    CONSUMERS,
    LEGACY_TIMERS_STREAM,
    SERVICES,
    ServiceSpec,
    timers_stream_name,
)
from temporality_protocol.permissions import service_inbox
from temporality_service.audit import AccessAudit
from temporality_service.cli import check_arguments
from temporality_service.health import Readiness, add_health_routes
from temporality_service.lifecycle import clear_ready, mark_ready, stop_on_signals
from temporality_service.logs import configure_logging
from temporality_service.metrics import ServiceMetrics
from temporality_service.server import HttpServer
from temporality_service.settings import LogSettings, ServiceSettings
from temporality_service.tracing import HTTP_TELEMETRY, TracingConfigError, configure_tracing, shutdown_tracing

__all__ = ["ConfigError", "Configure", "Responder", "Runtime", "Setup", "run_service", "run_until", "serve"]

log = structlog.get_logger(__name__)
S = TypeVar("S", bound=ServiceSettings)


class ConfigError(Exception):
    """The service's own configuration (a triggers/users/agents file, ...) cannot be used: exit 2."""


class Responder(Protocol):
    """What the runtime needs of a request/reply responder (``temporality_bus.Responder``)."""

    @property
    def subject(self) -> str: ...

    @property
    def running(self) -> asyncio.Event: ...

    async def start(self) -> None: ...

    async def stop(self, timeout_s: float = ...) -> None: ...


class Runtime(Generic[S]):
    """What a service's ``setup`` registers its parts with; the runtime starts, watches and stops them."""

    def __init__(self, spec: ServiceSpec, settings: S, bus: Bus, resources: contextlib.AsyncExitStack) -> None:
        self.spec = spec
        self.settings = settings
        self.bus = bus
        #: Enter the service's own resources here (database, channel adapters): closed before the bus drains.
        self.resources = resources
        self.readiness = Readiness(spec.name, bus)
        #: ``/metrics`` (served on the service's HTTP port next to ``/healthz``): see :mod:`.metrics`. ``None`` when
        #: ``TEMPORALITY_METRICS_ENABLED=false``: a service then makes none of its own instruments either.
        self.metrics = ServiceMetrics(spec.name, bus) if settings.process.metrics_enabled else None
        self.consumers: list[Consumer] = []
        self.responders: list[Responder] = []
        self.app: FastAPI | None = None
        self.server: HttpServer | None = None
        self._on_stop: list[Callable[[], Awaitable[None]]] = []
        #: The service's refusals into the audit trail (:mod:`.audit`): its HTTP API's 401/403 (each app it serves
        #: gets it as ``app.state.access_audit``) and NATS's permissions violations of its connection. Set by
        #: :func:`run_until`; ``None`` on a runtime made by hand (tests).
        self.access_audit: AccessAudit | None = None

    def consumer(
        self,
        durable: str,
        *,
        handler: EnvelopeHandler | None = None,
        raw_handler: RawHandler | None = None,
        max_inflight: int = 1,
        ack_wait_s: float | None = None,
        on_dead_letter: DeadLetterHook | None = None,
        max_deliver: int | None = None,
        batch_handler: BatchHandler | None = None,
        batch_size: int = 100,
        batch_linger_s: float = 0.0,
    ) -> Consumer:
        """Run the durable consumer ``durable`` (declared in the service's spec) with one of the handlers.

        ``on_dead_letter`` is awaited before each message the runner gives up on goes to the DLQ (see
        :class:`temporality_bus.Consumer`: idempotent, its failure retries the dead-lettering).
        ``max_deliver`` overrides the catalogue's delivery limit (a setting of the service, e.g. for tests).
        ``batch_handler`` takes up to ``batch_size`` messages at a time, ``handler`` being its per-message
        fallback (see :class:`temporality_bus.Consumer`). A ``raw_handler`` (timer firings) never sees a firing
        another service scheduled onto this service's timers (:func:`temporality_bus.timers.checking_firings`).
        """
        if durable not in self.spec.consumers:
            raise ValueError(f"{self.spec.name} does not declare the consumer {durable!r} (catalog.SERVICES)")
        if any(c.spec.durable == durable for c in self.consumers):
            raise ValueError(f"consumer {durable!r} registered twice")
        spec = CONSUMERS[durable]
        if max_deliver is not None:
            if max_deliver == 0 or max_deliver < -1:
                raise ValueError(f"max_deliver must be positive or -1 (never dead-letter), not {max_deliver}")
            spec = dataclasses.replace(spec, max_deliver=max_deliver)
        consumer = Consumer(
            self.bus,
            spec,
            handler=handler,
            raw_handler=None if raw_handler is None else checking_firings(raw_handler, self.bus.settings.source_check),
            max_inflight=max_inflight,
            ack_wait_s=ack_wait_s,
            on_dead_letter=on_dead_letter,
            batch_handler=batch_handler,
            batch_size=batch_size,
            batch_linger_s=batch_linger_s,
            observer=self.metrics,
        )
        self.consumers.append(consumer)
        self.readiness.watch_consumer(consumer)
        return consumer

    def responder(self, responder: Responder) -> Responder:
        if responder.subject not in self.spec.responders:
            raise ValueError(f"{self.spec.name} does not declare a responder on {responder.subject!r}")
        self.responders.append(responder)
        self.readiness.watch_responder(responder)
        return responder

    def http(self, app: FastAPI) -> FastAPI:
        """Serve ``app`` (with ``/healthz``, ``/readyz`` and, unless metrics are off, ``/metrics`` added) on the
        settings' host and port."""
        if self.settings.port is None:
            raise ValueError(f"{self.spec.name} has an HTTP app but no port setting")
        add_health_routes(app, self.readiness)
        if self.access_audit is not None and getattr(app.state, "access_audit", None) is None:
            app.state.access_audit = self.access_audit
        if self.metrics is not None:
            self.metrics.install(app)
        self.app = app
        return app

    def ready_check(self, name: str, check: Callable[[], Awaitable[None]]) -> None:
        """A condition ``/readyz`` also requires (e.g. the database answers); ``check`` raises when unmet."""
        self.readiness.add_check(name, check)

    def on_stop(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Called after the consumers stopped and before resources close (in reverse registration order)."""
        self._on_stop.append(callback)

    def _check_declared(self) -> None:
        missing = sorted(set(self.spec.consumers) - {c.spec.durable for c in self.consumers})
        missing += sorted(set(self.spec.responders) - {r.subject for r in self.responders})
        if missing:
            raise RuntimeError(f"{self.spec.name} declares {missing} in catalog.SERVICES but did not start them")


#: Registers the service's parts with the runtime (after the bus is connected and its layout ensured).
Setup = Callable[[Runtime[S]], Awaitable[None]]
#: Reads the service's own configuration before anything connects (raising :class:`ConfigError` when it
#: cannot be used) and returns its :data:`Setup`, which closes over what it read.
Configure = Callable[[S], Setup[S]]


async def run_service(spec: ServiceSpec, settings_type: type[S], configure: Configure[S]) -> int:
    """Run the service until SIGTERM/SIGINT; returns the process exit code (see the module docstring)."""
    try:
        settings = settings_type()
    except ValidationError as exc:
        configure_logging(LogSettings.model_construct(level="info", format="json"), service=spec.name)
        log.error("settings.invalid", error=str(exc))
        return 2
    configure_logging(settings.log, service=spec.name)
    try:
        setup = configure(settings)
        tracer_provider = configure_tracing(spec.name)  # OTEL_* (off without an endpoint): see .tracing
    except (ConfigError, TracingConfigError) as exc:
        log.error("config.invalid", error=str(exc))
        return 2
    stop = stop_on_signals()
    try:
        await run_until(spec, settings, setup, stop, freeze_heap=True)
        return 0
    except ConfigError as exc:
        log.error("config.invalid", error=str(exc))
        return 2
    except Exception as exc:
        log.error("service.failed", error=repr(exc), exc_info=True)
        return 1
    finally:
        clear_ready(settings.process.ready_file)
        shutdown_tracing(tracer_provider)  # exports the spans still queued


async def run_until(
    spec: ServiceSpec,
    settings: S,
    setup: Setup[S],
    stop: asyncio.Event,
    *,
    ready: asyncio.Event | None = None,
    freeze_heap: bool = False,
) -> None:
    """Connect, set up and serve until ``stop`` is set, then stop in order; sets ``ready`` once serving.

    The body of :func:`run_service` without its process concerns (logging, signals, exit codes): the
    tests run services in-process through it, several replicas on one event loop.

    ``freeze_heap`` (:func:`run_service`: the service's own process): once the setup is done, every object alive
    is moved out of the cyclic garbage collector's way (``gc.collect()``, then ``gc.freeze()``). What the start
    made (modules, pydantic schemas, the app, the service's configuration) lives as long as the process; without
    this every full collection walked all of it again under load: ~24 % of the run-executor's CPU in a bulk
    resume, ~15 % of the gateway's under webhook load with ~55 ms pauses, ~a sixth of the journal's per event
    (bench/README.md). Not for a process that starts services several times (tests): it would keep every start's
    objects forever.
    """
    async with contextlib.AsyncExitStack() as resources:
        bus = await resources.enter_async_context(
            Bus.connect(settings.nats, name=spec.name, inbox_prefix=service_inbox(spec.name))
        )
        access_audit = AccessAudit(bus, spec.name)  # refusals into the audit trail (.audit), rate-limited
        access_audit.watch(bus)  # the server's permissions violations of this connection
        await resources.enter_async_context(access_audit.running())  # its last totals go out before the drain
        if settings.nats.user is None and spec.timers:  # no NATS users: it may move the older releases' timers
            await migrate_legacy_timers(bus)  # nothing to do (one look-up) unless upgrading: docs/operations.md
        try:
            await bus.ensure(
                [s for s in ALL_STREAMS if s.name in spec.streams], [b for b in ALL_BUCKETS if b.name in spec.buckets]
            )
        except (BadRequestError, NotFoundError) as exc:  # refused create (subjects overlap), then update: not found
            if spec.timers and not await _exists(bus, timers_stream_name(spec.name)):
                raise RuntimeError(
                    f"cannot create {timers_stream_name(spec.name)} ({exc}): after an upgrade, the timers stream of "
                    f"an older release ({LEGACY_TIMERS_STREAM.name}) still holds its subjects; move its timers "
                    "first with `temporality timers-migrate` as the NATS user timers-migrate or one with full access "
                    "(the chart's Job and compose's one-shot do; docs/operations.md, Upgrading)"
                ) from exc
            raise
        if not await _wait_for_layout(spec, settings, bus, stop):
            log.info("service.stopped", while_waiting_for="the layout")
            return
        runtime = Runtime(spec, settings, bus, contextlib.AsyncExitStack())
        runtime.access_audit = access_audit
        await resources.enter_async_context(runtime.resources)  # the service's own: closed before the bus
        await _set_up(spec, settings, bus, setup, runtime)
        runtime._check_declared()
        if runtime.app is None and settings.port is not None:  # a worker with a probe port
            runtime.http(FastAPI(title=f"Temporality {spec.name} (health)", openapi_url=None, telemetry=HTTP_TELEMETRY))
        if runtime.app is not None:
            assert settings.port is not None
            runtime.app.state.body_timeout_s = settings.process.http_body_timeout_s  # read_body's deadline
            runtime.server = HttpServer(
                runtime.app,
                host=settings.host,
                port=settings.port,
                forwarded_allow_ips=settings.process.forwarded_allow_ips,
                body_timeout_s=settings.process.http_body_timeout_s,
            )
        if freeze_heap:
            gc.collect()
            gc.freeze()
        await _serve(runtime, stop, ready)
        for callback in reversed(runtime._on_stop):
            await callback()
    log.info("service.stopped")


async def _exists(bus: Bus, stream: str) -> bool:
    try:
        await bus.js.stream_info(stream)
    except NotFoundError:
        return False
    return True


#: How often a service waiting for another's streams or buckets says so in its log.
_LAYOUT_LOG_EVERY_S = 30.0


async def _wait_for_layout(spec: ServiceSpec, settings: ServiceSettings, bus: Bus, stop: asyncio.Event) -> bool:
    """Wait until the streams the service uses and the buckets it reads, which other services own and create,
    exist; ``False`` when ``stop`` came first. It only reads their info: it may not create or change them
    (without a NATS user, where nothing is enforced, it creates a missing one instead of waiting).

    Meanwhile a service with a port answers ``/healthz`` (200: alive, so no probe restarts it) and
    ``/readyz`` (503: the layout check fails, its log names what is missing and who creates it)."""
    streams = [s for s in ALL_STREAMS if s.name in spec.uses_streams and s.name not in spec.streams]
    buckets = [b for b in ALL_BUCKETS if b.name in spec.reads_buckets]
    # without a NATS user no permission stops anyone: waiting would only make start order matter (a service
    # or a test started alone), so it creates what is missing, never changing what exists
    create = settings.nats.user is None
    missing = await bus.find_layout(streams, buckets, create_missing=create)
    if not missing:
        return True
    owners = {stream: owner.name for owner in SERVICES.values() for stream in owner.streams}
    owners |= {f"KV_{bucket}": owner.name for owner in SERVICES.values() for bucket in owner.buckets}

    def waiting() -> str:
        return ", ".join(f"{name} (created by {owners.get(name, 'its owner')})" for name in missing)

    async def layout() -> None:
        if missing:
            raise RuntimeError(f"waiting for {waiting()}")

    async with _health_only(spec, settings, bus, "waiting for the layout", ("layout", layout)):
        loop = asyncio.get_running_loop()
        delay, since, logged = 0.05, loop.time(), loop.time()
        log.info("layout.waiting", missing=missing, detail=f"not ready until its owner creates {waiting()}")
        while missing:
            if loop.time() - logged >= _LAYOUT_LOG_EVERY_S:  # a normal start waits a second or two; this long is not
                log.warning(
                    "layout.still_waiting",
                    missing=missing,
                    waited_s=round(loop.time() - since),
                    detail=f"not ready until its owner creates {waiting()}: is it running?",
                )
                logged = loop.time()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await stop.wait()
            if stop.is_set():
                return False
            delay = min(delay * 2, 2.0)
            missing = await bus.find_layout(streams, buckets, create_missing=create)
        log.info("layout.found", streams=[s.name for s in streams], buckets=[b.name for b in buckets])
        return True


#: A setup still running this long after it began gets :func:`_health_only`'s server while it goes on.
SETUP_HEALTH_AFTER_S = 1.0


async def _set_up(spec: ServiceSpec, settings: S, bus: Bus, setup: Setup[S], runtime: Runtime[S]) -> None:
    """``setup(runtime)``; one that takes longer than :data:`SETUP_HEALTH_AFTER_S` (the journal's database
    migration on a large journal, or waiting on another replica's migration lock) answers ``/healthz`` 200 and
    ``/readyz`` 503 meanwhile, as while waiting for the layout: a startup probe (the chart's: 2 s x 60) would
    otherwise kill the process mid-migration, the migration roll back, and the start repeat forever. A quick setup
    (every other start) binds nothing before the real server."""
    task = asyncio.ensure_future(setup(runtime))
    try:
        await asyncio.wait({task}, timeout=SETUP_HEALTH_AFTER_S)
        if not task.done():

            async def setting_up() -> None:
                raise RuntimeError("still starting: its setup (a database migration, say) is running")

            async with _health_only(spec, settings, bus, "starting", ("setup", setting_up)):
                await asyncio.wait({task})
        task.result()
    finally:
        if not task.done():  # cancelled meanwhile: the setup too
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


@contextlib.asynccontextmanager
async def _health_only(
    spec: ServiceSpec,
    settings: ServiceSettings,
    bus: Bus,
    what: str,
    check: tuple[str, Callable[[], Awaitable[None]]],
) -> AsyncIterator[None]:
    """While the block runs, a service with a port answers ``/healthz`` (200: alive, so no probe restarts it),
    ``/readyz`` (503: ``check`` fails, naming what the service waits for) and any other path 503 ``starting`` with
    ``Retry-After`` (a webhook sender retries a 503; a 404 it would take as final) on it; then the port is free
    again for the real server."""
    if settings.port is None:
        yield
        return
    readiness = Readiness(spec.name, bus)
    readiness.add_check(*check)
    app = FastAPI(title=f"Temporality {spec.name} ({what})", openapi_url=None, telemetry=HTTP_TELEMETRY)
    add_health_routes(app, readiness)
    detail = f"{spec.name} is starting ({what}); try again shortly"

    async def starting(request: Request) -> JSONResponse:  # never a 404 a webhook sender would take as final
        return JSONResponse({"error": "starting", "detail": detail}, status_code=503, headers={"Retry-After": "5"})

    app.add_api_route("/{path:path}", starting, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
    server = HttpServer(
        app,
        host=settings.host,
        port=settings.port,
        forwarded_allow_ips=settings.process.forwarded_allow_ips,
        body_timeout_s=settings.process.http_body_timeout_s,
    )
    serving = asyncio.create_task(server.run_until_exit())
    try:
        yield
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):  # a server that failed to bind: the real one reports it
            await serving


async def _serve(runtime: Runtime[Any], stop: asyncio.Event, ready: asyncio.Event | None) -> None:
    settings = runtime.settings
    consumers_stop = asyncio.Event()
    stopping = False

    async def supervised(what: str, coro: Coroutine[Any, Any, None]) -> None:
        await coro
        if not stopping:
            raise RuntimeError(f"{what} stopped on its own")

    async with asyncio.TaskGroup() as tg:
        for consumer in runtime.consumers:
            tg.create_task(supervised(f"consumer {consumer.spec.durable}", consumer.run(consumers_stop)))
        if runtime.metrics is not None:
            tg.create_task(runtime.metrics.watch(runtime.consumers, consumers_stop))
        for responder in runtime.responders:
            await responder.start()
        server = runtime.server
        if server is not None:
            tg.create_task(supervised("the HTTP server", server.run_until_exit()))
        await _until_started(runtime, stop)
        if not stop.is_set():
            runtime.readiness.ready = True
            mark_ready(settings.process.ready_file, server.url if server is not None else None)
            if ready is not None:
                ready.set()
            log.info(
                "service.ready",
                url=server.url if server is not None else None,
                consumers=[c.spec.durable for c in runtime.consumers],
                responders=[r.subject for r in runtime.responders],
            )
            await stop.wait()
        log.info("service.stopping")
        stopping = True
        runtime.readiness.ready = False
        clear_ready(settings.process.ready_file)
        if server is not None:
            server.should_exit = True  # stop accepting; in-flight requests finish
        for responder in runtime.responders:
            await responder.stop(settings.process.drain_s)
        consumers_stop.set()  # each consumer finishes its in-flight messages, then unsubscribes


async def _until_started(runtime: Runtime[Any], stop: asyncio.Event) -> None:
    """Wait until every part runs (or stop is asked for); a part that fails meanwhile fails the TaskGroup."""
    events = [c.running for c in runtime.consumers] + [r.running for r in runtime.responders]
    if runtime.server is not None:
        events.append(runtime.server.listening)
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    stopper = asyncio.ensure_future(stop.wait())
    try:
        pending: set[asyncio.Future[Any]] = set(waiters)
        while pending and not stop.is_set():
            _, pending = await asyncio.wait({*pending, stopper}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(stopper)
    finally:
        for waiter in (*waiters, stopper):
            waiter.cancel()


def serve(spec: ServiceSpec, settings_type: type[S], configure: Configure[S]) -> NoReturn:
    """The console script's body: run the service on uvloop (when installed) and exit with its code.

    ``--help`` prints what configures the service and exits 0; any other argument exits 2 (:mod:`.cli`):
    nothing is connected to or created before the command line was read."""
    check_arguments(spec, settings_type)
    exit_now(run(run_service(spec, settings_type, configure)))


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` once the service has stopped, skipping the interpreter's teardown.

    By then everything that holds state is closed in order (consumers drained, the bus drained and closed, the
    database engine disposed, queued spans exported, the loop's default executor shut down): what is left is
    the interpreter freeing every object and module one by one, which takes 0.6 s for the imports alone and
    several seconds for a service that ran under load (a rolling restart, a scale-down and every test that
    stops a service wait for it), and does nothing another process could observe. The log handlers and the
    standard streams are flushed first; the exit code is the service's."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken pipe: nothing more can be written anyway
            stream.flush()
    os._exit(code)


def run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        return asyncio.run(coro)
    return uvloop.run(coro)
