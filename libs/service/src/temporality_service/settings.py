"""Settings every service process shares (pydantic-settings: a bad environment fails before connecting).

    ServiceSettings              -- nats (TEMPORALITY_NATS_*), log (TEMPORALITY_LOG_*), process (TEMPORALITY_*),
                                    api (TEMPORALITY_API_*: role tokens, see :mod:`.auth`)
    └── HttpServiceSettings      -- + host, port, max_body_bytes under the service's own prefix

A service subclasses one of them, sets ``model_config = SettingsConfigDict(env_prefix="TEMPORALITY_<SVC>_")``
and overrides the defaults it needs (e.g. ``port: int = Field(default=8080, ...)``). A worker without an
API keeps ``port = None``: it serves no HTTP at all unless a port is given, and then only
``/healthz`` and ``/readyz`` (for Kubernetes probes).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from temporality_bus import NatsSettings
from temporality_service.auth import ApiAuthSettings

__all__ = [
    "HttpServiceSettings",
    "LogSettings",
    "ProcessSettings",
    "ServiceSettings",
    "parse_forwarded_allow_ips",
]


class LogSettings(BaseSettings):
    """``TEMPORALITY_LOG_*``."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_LOG_", extra="ignore")

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "console"] = "json"


class ProcessSettings(BaseSettings):
    """``TEMPORALITY_*`` settings every service process understands."""

    model_config = SettingsConfigDict(env_prefix="TEMPORALITY_", extra="ignore")

    #: Written (with the pid) once the service is connected, has ensured the layout and all its consumers,
    #: responders and its HTTP server run; the embedded launcher and the tests wait on it. Removed at stop.
    ready_file: Path | None = None
    #: How long a SIGTERM waits for in-flight messages and requests before the process gives up on them
    #: (they are redelivered: handlers are idempotent). Well below Kubernetes' 30 s grace period.
    drain_s: float = Field(default=10.0, gt=0)
    #: ``False`` (``TEMPORALITY_METRICS_ENABLED=false``): no Prometheus metrics at all, ``/metrics`` answers 404
    #: and no instrument is made or updated (requests, consumers, the services' own; no lag or state refresh).
    metrics_enabled: bool = True
    #: The proxies whose ``X-Forwarded-For`` / ``X-Forwarded-Proto`` are believed
    #: (``TEMPORALITY_FORWARDED_ALLOW_IPS``): a comma list of IP addresses and CIDR networks. Empty (the
    #: default): those headers are ignored and the TCP peer is the client -- the address the sign-in limits
    #: and the audit trail use. Behind an ingress or TLS proxy, name the proxy's addresses; anyone who can
    #: reach the service from an address named here can choose the client address it is known by.
    forwarded_allow_ips: str = ""
    #: How long reading one request body may take in all (``TEMPORALITY_HTTP_BODY_TIMEOUT_S``): a body still
    #: incomplete after it is a 408 ``body_timeout`` and the connection is closed (a slow-loris client trickling
    #: a body byte by byte no longer holds a connection forever).
    http_body_timeout_s: float = Field(default=30.0, gt=0, le=3600)

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxies(cls, value: str) -> str:
        return ",".join(parse_forwarded_allow_ips(value))


def parse_forwarded_allow_ips(value: str) -> list[str]:
    """``"10.0.0.5, 10.1.0.0/16"`` -> ``["10.0.0.5", "10.1.0.0/16"]``; anything that is not an IP address or a
    network (a host name, ``*``, ``10.0.0.1/8`` with host bits set) is a ValueError naming it: uvicorn would
    silently never match it, and the proxy's clients would all share its address."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    for item in items:
        try:
            if "/" in item:
                ipaddress.ip_network(item)
            else:
                ipaddress.ip_address(item)
        except ValueError as exc:
            raise ValueError(
                f"TEMPORALITY_FORWARDED_ALLOW_IPS: {item[:60]!r} is not an IP address or a CIDR network ({exc}); "
                "list the proxies' addresses, e.g. 10.0.0.5,10.1.0.0/16"
            ) from None
    return items


class ServiceSettings(BaseSettings):
    """The base of every service's ``Settings``: the shared NATS, log and process groups."""

    model_config = SettingsConfigDict(extra="ignore")

    nats: NatsSettings = Field(default_factory=NatsSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    process: ProcessSettings = Field(default_factory=ProcessSettings)
    api: ApiAuthSettings = Field(default_factory=ApiAuthSettings)
    #: Bind address of the service's HTTP server; loopback unless a container needs more.
    host: str = Field(default="127.0.0.1", description="Bind address; loopback unless a container needs more")
    #: ``None``: no HTTP server (a worker); ``0`` picks a free port (tests, benchmarks), logged at start.
    port: int | None = Field(default=None, ge=0, le=65535)


class HttpServiceSettings(ServiceSettings):
    """A service with an HTTP API; subclasses set the default ``port``."""

    port: int | None = Field(default=0, ge=0, le=65535)
    #: Larger request bodies are refused with 413, by Content-Length or by the size actually streamed.
    max_body_bytes: int = Field(default=64 * 1024, gt=0)
