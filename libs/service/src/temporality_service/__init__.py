"""Temporality's service runtime: every service process starts through :func:`run_service` / :func:`serve`.

Read ``docs/anatomy-of-a-service.md`` first. What lives here: the settings groups every process shares,
structlog configuration, signals and ready files, the lifecycle (:mod:`.runtime`), the HTTP server with
TCP_NODELAY, uvloop and httptools (:mod:`.server`), the HTTP error contract and bounded body reader
(:mod:`.http`), ``/healthz`` + ``/readyz`` (:mod:`.health`), role tokens (:mod:`.auth`), the audit of what they and NATS refuse (:mod:`.audit`) and the signed
assertions one service vouches for a person with to another (:mod:`.vouch`).
"""

from temporality_service.audit import AccessAudit
from temporality_service.auth import (
    ApiAuth,
    ApiAuthSettings,
    ApiToken,
    AsAdmin,
    AsOperator,
    AsViewer,
    Principal,
    Role,
    RoleForbidden,
    TokenFileError,
)
from temporality_service.health import Readiness
from temporality_service.http import (
    MAX_INT64,
    ApiError,
    BadRequest,
    BodyTimeout,
    BodyTooLarge,
    ClientGone,
    ErrorBody,
    Forbidden,
    Int64,
    MalformedJson,
    NonNegativeInt64,
    NotFound,
    Unauthorized,
    Unavailable,
    Unprocessable,
    error_response,
    install_error_handlers,
    parse_json,
    read_body,
)
from temporality_service.lifecycle import clear_ready, mark_ready, stop_on_signals
from temporality_service.limits import FailureLimiter, TooManyFailures, client_address
from temporality_service.logs import configure_logging
from temporality_service.metrics import ServiceMetrics
from temporality_service.runtime import ConfigError, Configure, Responder, Runtime, Setup, run_service, run_until, serve
from temporality_service.server import HttpServer, bind_tcp
from temporality_service.settings import HttpServiceSettings, LogSettings, ProcessSettings, ServiceSettings
from temporality_service.tracing import HTTP_TELEMETRY, TracingConfigError, configure_tracing, shutdown_tracing
from temporality_service.vouch import PRINCIPAL_HEADER, VOUCH_HEADER, PrincipalVoucher, Voucher, VouchSecretError

__all__ = [
    "HTTP_TELEMETRY",
    "MAX_INT64",
    "PRINCIPAL_HEADER",
    "VOUCH_HEADER",
    "AccessAudit",
    "ApiAuth",
    "ApiAuthSettings",
    "ApiError",
    "ApiToken",
    "AsAdmin",
    "AsOperator",
    "AsViewer",
    "BadRequest",
    "BodyTimeout",
    "BodyTooLarge",
    "ClientGone",
    "ConfigError",
    "Configure",
    "ErrorBody",
    "FailureLimiter",
    "Forbidden",
    "HttpServer",
    "HttpServiceSettings",
    "Int64",
    "LogSettings",
    "MalformedJson",
    "NonNegativeInt64",
    "NotFound",
    "Principal",
    "PrincipalVoucher",
    "ProcessSettings",
    "Readiness",
    "Responder",
    "Role",
    "RoleForbidden",
    "Runtime",
    "ServiceMetrics",
    "ServiceSettings",
    "Setup",
    "TokenFileError",
    "TooManyFailures",
    "TracingConfigError",
    "Unauthorized",
    "Unavailable",
    "Unprocessable",
    "VouchSecretError",
    "Voucher",
    "bind_tcp",
    "clear_ready",
    "client_address",
    "configure_logging",
    "configure_tracing",
    "error_response",
    "install_error_handlers",
    "mark_ready",
    "parse_json",
    "read_body",
    "run_service",
    "run_until",
    "serve",
    "shutdown_tracing",
    "stop_on_signals",
]
