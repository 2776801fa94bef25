"""``/metrics``: what every service reports to Prometheus (the runtime wires it), and where a service adds its own.

==============================================  =======================================================
``temporality_http_requests_total``             counter by ``method``, ``route`` (the route template,
                                                e.g. ``/hooks/{trigger_id}``, never the raw path) and
                                                ``status``
``temporality_http_request_duration_seconds``   histogram by ``method`` and ``route``
``temporality_consumer_messages_total``         counter by ``consumer`` and ``outcome`` (``acked``,
                                                ``retried``, ``dead_lettered``)
``temporality_consumer_handle_seconds``         histogram by ``consumer``: handling time of settled
                                                messages (a batch counts once per batch)
``temporality_consumer_pending``                gauge by ``consumer``: messages not yet delivered (lag; 0 for an
                                                on-demand consumer not pulling: ``Consumer.lag_matters``)
``temporality_consumer_ack_pending``            gauge by ``consumer``: delivered, not yet acknowledged
``temporality_consumer_redelivered``            gauge by ``consumer``: delivered more than once (an ack that did
                                                not come in time, a nak, a replica that died) and not yet
                                                acknowledged: the server's ``num_redelivered``
``temporality_nats_connected``                  gauge: 1 while the NATS connection is up
``temporality_state_refreshed_timestamp_seconds`` gauge by ``gauges`` (a refresher's name): when the
                                                whole-system gauges were last read from the read model (0:
                                                not yet): a failing refresh keeps their last values, this
                                                says how old they are
``temporality_service_info``                    ``service`` and ``protocol_version`` labels, value 1
==============================================  =======================================================

Every metric also carries the ``service`` label. The pending gauges are refreshed from the server's
consumer info every ``LAG_REFRESH_S`` seconds (and are absent until the first refresh). Each
:class:`ServiceMetrics` has its own registry, so several in-process replicas (tests) never collide.

**A service's own metrics** (the domain: human-interaction's deliveries and waits, the journal's runs by
state; listed in each service's ``metrics`` module and in docs/operations.md) go on the same registry,
made with :meth:`ServiceMetrics.counter` / :meth:`~ServiceMetrics.histogram` / :meth:`~ServiceMetrics.gauge`
(``service`` is their first label). Two kinds, because every replica serves its own ``/metrics``:

* a **counter or histogram** is observed only by the replica that committed the fact (the one whose
  compare-and-set moved the record, whose adapter made the attempt): across replicas, ``sum()`` it;
* a **whole-system gauge** (runs by state, requests waiting) is read from the read model by a refresher
  (:meth:`ServiceMetrics.refresh_every`, run by the runtime every ``STATE_REFRESH_S`` seconds; a failed
  refresh is logged and keeps the last values): every replica reports the same number, so ``max()`` it,
  never ``sum()``.

``/metrics`` is served without authentication, like ``/healthz`` (issue 11: no anonymous endpoint but
health and metrics); it reveals counts, never payloads or ids.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, get_args

import structlog
from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from temporality_bus import Bus, Consumer, Outcome
from temporality_protocol.version import PROTOCOL_VERSION

__all__ = ["LAG_REFRESH_S", "REFRESH_TIMEOUT_S", "STATE_REFRESH_S", "Refresher", "ServiceMetrics"]

log = structlog.get_logger(__name__)

#: How often the consumer lag gauges are refreshed from the server.
LAG_REFRESH_S = 10.0
#: How often the services' whole-system gauges (:meth:`ServiceMetrics.refresh_every`) are read again.
STATE_REFRESH_S = 30.0

#: A refresher taking longer than this is given up (logged; its gauges keep their last values).
REFRESH_TIMEOUT_S = 10.0

#: Reads the read model and sets gauges; raising keeps their last values (logged).
Refresher = Callable[[], Awaitable[None]]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


class ServiceMetrics:
    """The instruments of one service process; also the consumers' :class:`~temporality_bus.ConsumerObserver`."""

    def __init__(self, service: str, bus: Bus) -> None:
        self.service = service
        self.bus = bus
        self.registry = CollectorRegistry(auto_describe=True)
        self._refreshers: list[tuple[str, Refresher]] = []
        self._refreshed = Gauge(
            "temporality_state_refreshed_timestamp_seconds",
            "When a whole-system gauge group was last refreshed from the read model (Unix time; 0: not yet)",
            ["service", "gauges"],
            registry=self.registry,
        )
        labels = {"service": service}
        Gauge(
            "temporality_service_info",
            "The service and the protocol version it speaks",
            ["service", "protocol_version"],
            registry=self.registry,
        ).labels(service, PROTOCOL_VERSION).set(1)
        connected = Gauge(
            "temporality_nats_connected", "1 while NATS is connected", ["service"], registry=self.registry
        )
        connected.labels(**labels).set_function(lambda: 1.0 if bus.nc.is_connected else 0.0)
        self._requests = Counter(
            "temporality_http_requests",
            "HTTP requests by route template and status",
            ["service", "method", "route", "status"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "temporality_http_request_duration_seconds",
            "HTTP request duration",
            ["service", "method", "route"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )
        self._messages = Counter(
            "temporality_consumer_messages",
            "Messages settled by a consumer, by outcome",
            ["service", "consumer", "outcome"],
            registry=self.registry,
        )
        self._handle = Histogram(
            "temporality_consumer_handle_seconds",
            "Handling time of settled messages (a batch once)",
            ["service", "consumer"],
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
        )
        self._pending = Gauge(
            "temporality_consumer_pending",
            "Messages of the consumer's filter not yet delivered (lag)",
            ["service", "consumer"],
            registry=self.registry,
        )
        self._ack_pending = Gauge(
            "temporality_consumer_ack_pending",
            "Messages delivered and not yet acknowledged",
            ["service", "consumer"],
            registry=self.registry,
        )
        self._redelivered = Gauge(
            "temporality_consumer_redelivered",
            "Messages delivered more than once and not yet acknowledged (the server's count)",
            ["service", "consumer"],
            registry=self.registry,
        )

    # ------------------------------------------------------------------ a service's own instruments
    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        """A counter on this process's registry; its labels are ``service`` then ``labels``."""
        return Counter(name, documentation, ["service", *labels], registry=self.registry)

    def histogram(
        self, name: str, documentation: str, labels: Sequence[str] = (), *, buckets: Sequence[float]
    ) -> Histogram:
        """A histogram on this process's registry; its labels are ``service`` then ``labels``."""
        return Histogram(name, documentation, ["service", *labels], registry=self.registry, buckets=buckets)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        """A gauge on this process's registry; its labels are ``service`` then ``labels``."""
        return Gauge(name, documentation, ["service", *labels], registry=self.registry)

    def refresh_every(self, name: str, refresher: Refresher) -> None:
        """Run ``refresher`` (it reads the read model and sets whole-system gauges) at start and then every
        :data:`STATE_REFRESH_S` while the service runs (the runtime's :meth:`watch`)."""
        self._refreshers.append((name, refresher))
        self._refreshed.labels(self.service, name).set(0)  # stale until the first refresh

    async def refresh_state(self) -> None:
        """Run every refresher once (each failure, or one taking over :data:`REFRESH_TIMEOUT_S`, is logged, never
        raised: the gauges keep their last values)."""
        for name, refresher in self._refreshers:
            try:
                async with asyncio.timeout(REFRESH_TIMEOUT_S):
                    await refresher()
            except Exception as exc:  # TimeoutError included: a slow read model never holds up the stop
                log.warning("metrics.refresh_failed", gauges=name, error=repr(exc))
            else:
                self._refreshed.labels(self.service, name).set(time.time())

    async def watch(self, consumers: list[Consumer], stop: asyncio.Event) -> None:
        """Refresh the lag gauges and the service's own gauges, each on its interval, until ``stop``.

        First every consumer's outcome series is made at 0: a series that first appears at 2 shows no rise to
        Prometheus's ``increase()``, so the alert on dead letters would miss a consumer's first ones after each
        start (and in a long-lived pod a dead letter is a rare, single event)."""
        self.declare(consumers)
        async with asyncio.TaskGroup() as tg:
            if consumers:
                tg.create_task(self.watch_lag(consumers, stop))
            if self._refreshers:
                tg.create_task(self._every(lambda: STATE_REFRESH_S, self.refresh_state, stop))

    @staticmethod
    async def _every(interval: Callable[[], float], step: Refresher, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await step()
            try:
                await asyncio.wait_for(stop.wait(), interval())
            except TimeoutError:
                pass

    # ------------------------------------------------------------------ consumers
    def declare(self, consumers: Sequence[Consumer]) -> None:
        """Every outcome series of ``consumers`` at 0 (a counter's child exists once its labels are named)."""
        for consumer in consumers:
            for outcome in get_args(Outcome):
                self._messages.labels(self.service, consumer.spec.durable, outcome)

    def settled(self, durable: str, outcome: Outcome, seconds: float, count: int = 1) -> None:
        self._messages.labels(self.service, durable, outcome).inc(count)
        self._handle.labels(self.service, durable).observe(seconds)

    async def refresh_lag(self, consumers: list[Consumer]) -> None:
        """Read each consumer's pending counts from the server (failures are logged, never raised)."""
        for consumer in consumers:
            if not consumer.lag_matters:  # an on-demand consumer nobody needs now: what it keeps is no lag
                self._pending.labels(self.service, consumer.spec.durable).set(0)
                self._ack_pending.labels(self.service, consumer.spec.durable).set(0)
                self._redelivered.labels(self.service, consumer.spec.durable).set(0)
                continue
            try:
                info = await self.bus.js.consumer_info(consumer.spec.stream, consumer.spec.durable, timeout=2.0)
            except Exception as exc:  # NATS down or the consumer not created yet: keep the last value
                log.debug("metrics.lag_unavailable", consumer=consumer.spec.durable, error=repr(exc))
                continue
            self._pending.labels(self.service, consumer.spec.durable).set(info.num_pending or 0)
            self._ack_pending.labels(self.service, consumer.spec.durable).set(info.num_ack_pending or 0)
            self._redelivered.labels(self.service, consumer.spec.durable).set(info.num_redelivered or 0)

    async def watch_lag(self, consumers: list[Consumer], stop: asyncio.Event) -> None:
        """Refresh the lag gauges every :data:`LAG_REFRESH_S` until ``stop``."""
        await self._every(lambda: LAG_REFRESH_S, lambda: self.refresh_lag(consumers), stop)

    # ------------------------------------------------------------------ HTTP
    def http(self, method: str, route: str, status: int, seconds: float) -> None:
        self._requests.labels(self.service, method, route, str(status)).inc()
        self._latency.labels(self.service, method, route).observe(seconds)

    def install(self, app: FastAPI) -> None:
        """Count every request of ``app`` and serve ``GET /metrics`` on it."""

        @app.get("/metrics", tags=["health"], summary="Prometheus metrics", include_in_schema=False)
        async def metrics() -> Response:
            return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

        app.add_middleware(_CountRequests, metrics=self)

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()


class _CountRequests:
    """Pure ASGI middleware: one counter increment and one observation per request, after the response."""

    def __init__(self, app: Asgi, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "(unmatched)"
            self.metrics.http(scope["method"], template, status, time.perf_counter() - started)
