"""A small OTLP/HTTP trace receiver over real HTTP, for testing what the services export.

The seam that cannot run here is a tracing backend (a collector, Jaeger, Tempo): the services under test
export with the real OpenTelemetry SDK and OTLP exporter to ``POST /v1/traces``
(``OTEL_EXPORTER_OTLP_ENDPOINT=`` :attr:`OtlpReceiver.endpoint`), and the receiver decodes each
``ExportTraceServiceRequest`` protobuf (opentelemetry-proto) into :class:`ReceivedSpan` s. Spans arrive
after the batch processor's delay: wait for them with :meth:`OtlpReceiver.wait_for`.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request, Response
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from temporality_embedded.processes import free_port
from temporality_testing.asgi import served_asgi

__all__ = ["OtlpReceiver", "ReceivedSpan", "decode_request"]

_PROTOBUF = "application/x-protobuf"
_KINDS = {
    Span.SPAN_KIND_INTERNAL: "internal",
    Span.SPAN_KIND_SERVER: "server",
    Span.SPAN_KIND_CLIENT: "client",
    Span.SPAN_KIND_PRODUCER: "producer",
    Span.SPAN_KIND_CONSUMER: "consumer",
}


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span, decoded: ids as lower-case hex, ``parent_span_id`` ``None`` for a root."""

    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    attributes: dict[str, Any]
    #: ``(trace_id, span_id)`` of each link.
    links: list[tuple[str, str]]
    error: bool
    #: When the span started (the exporting process's clock, UTC).
    start: datetime


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        assert isinstance(pair, KeyValue)
        out[pair.key] = _value(pair.value)
    return out


def decode_request(body: bytes) -> list[ReceivedSpan]:
    """The spans of one ``ExportTraceServiceRequest`` (protobuf); :class:`DecodeError` when it is not one."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=service,
                        name=span.name,
                        kind=_KINDS.get(span.kind, "unspecified"),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex() or None,
                        attributes=_attributes(span.attributes),
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        error=span.status.code == Status.STATUS_CODE_ERROR,
                        start=datetime.fromtimestamp(span.start_time_unix_nano / 1e9, UTC),
                    )
                )
    return spans


@dataclass
class OtlpReceiver:
    """``POST /v1/traces`` (OTLP/HTTP, protobuf, optionally gzip/deflate); every span received, in order."""

    spans: list[ReceivedSpan] = field(default_factory=list)
    #: How many export requests arrived (each a batch of spans).
    requests: int = 0
    port: int = 0
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def endpoint(self) -> str:
        """The base URL for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter appends ``/v1/traces``)."""
        return f"http://127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        """``OTEL_*`` variables pointing a service at this receiver, exporting every 100 ms."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            **extra,
        }

    def app(self) -> FastAPI:
        app = FastAPI(openapi_url=None)

        @app.post("/v1/traces")
        async def traces(request: Request) -> Response:
            if request.headers.get("content-type", "").split(";")[0].strip() != _PROTOBUF:
                return Response(b"only application/x-protobuf", status_code=415)
            body = await request.body()
            encoding = request.headers.get("content-encoding", "").lower()
            try:
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                received = decode_request(body)
            except (DecodeError, OSError, zlib.error):
                return Response(b"not an ExportTraceServiceRequest", status_code=400)
            async with self._arrived:
                self.requests += 1
                self.spans.extend(received)
                self._arrived.notify_all()
            return Response(ExportTraceServiceResponse().SerializeToString(), media_type=_PROTOBUF)

        return app

    async def wait_for(
        self, condition: Callable[[list[ReceivedSpan]], bool], *, timeout_s: float = 30.0, what: str = "spans"
    ) -> list[ReceivedSpan]:
        """Wait until ``condition(spans)`` holds for the spans received so far; AssertionError after ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s), self._arrived:
                await self._arrived.wait_for(lambda: condition(self.spans))
        except TimeoutError:
            names = sorted({f"{s.service}: {s.name}" for s in self.spans})
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; received {names}") from None
        return list(self.spans)

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[OtlpReceiver]:
        self.port = free_port()
        self._arrived = asyncio.Condition()
        async with served_asgi(self.app(), self.port):
            yield self
