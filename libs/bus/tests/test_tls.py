"""TLS to NATS (issue 11) against a real nats-server with certificates from a CA the test makes."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from pydantic import ValidationError

from temporality_bus import Bus, NatsSettings
from temporality_embedded import NatsServer
from temporality_protocol.catalog import EVENTS_STREAM
from temporality_testing.tls import TestCA


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA.create(tmp_path / "pki")


@pytest.fixture
def tls_server(tmp_path: Path, ca: TestCA) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats", tls=ca.issue("nats-server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_client_trusting_the_ca_connects_over_tls(tls_server: NatsServer, ca: TestCA) -> None:
    settings = NatsSettings(url=tls_server.url, tls_ca_file=ca.ca_file, connect_timeout_s=5)
    async with Bus.connect(settings, name="tls-client") as bus:
        await bus.ensure([EVENTS_STREAM])
        info = await bus.js.stream_info(EVENTS_STREAM.name)
        assert info.config.name == EVENTS_STREAM.name
        assert bus.nc._server_info.get("tls_required") is True  # the server really asked for TLS


async def _refusal(settings: NatsSettings) -> BaseException:
    """The error of one connection attempt with ``settings``' TLS context (no retries)."""
    try:
        nc = await nats.connect(settings.servers, tls=settings.ssl_context(), allow_reconnect=False, connect_timeout=3)
    except BaseException as exc:
        return exc
    await nc.close()
    raise AssertionError("the connection was accepted")


async def test_a_client_that_does_not_trust_the_ca_is_refused(tls_server: NatsServer, tmp_path: Path) -> None:
    stranger = TestCA.create(tmp_path / "other-pki", name="another CA")
    refused = await _refusal(NatsSettings(url=tls_server.url, tls_ca_file=stranger.ca_file))
    assert isinstance(refused, ssl.SSLCertVerificationError), repr(refused)


async def test_a_client_without_the_ca_is_refused(tls_server: NatsServer) -> None:
    """No TLS setting: the server requires TLS, nats-py upgrades with the system trust store, which does not
    know our CA -- never a silent fall-back to an unverified or plain connection."""
    refused = await _refusal(NatsSettings(url=tls_server.url))
    assert isinstance(refused, ssl.SSLCertVerificationError), repr(refused)


async def test_mutual_tls_needs_a_client_certificate(tmp_path: Path, ca: TestCA) -> None:
    server = NatsServer(tmp_path / "mtls", tls=ca.issue("nats-mtls"), tls_verify_ca=ca.ca_file)
    server.start()
    try:
        cert, key = ca.issue("run-executor", server=False)
        with_cert = NatsSettings(url=server.url, tls_ca_file=ca.ca_file, tls_cert_file=cert, tls_key_file=key)
        async with Bus.connect(with_cert, name="with-cert") as bus:
            assert bus.nc.is_connected
        refused = await _refusal(NatsSettings(url=server.url, tls_ca_file=ca.ca_file))
        assert isinstance(refused, (ssl.SSLError, ConnectionError, nats.errors.Error, TimeoutError)), repr(refused)
    finally:
        server.stop()


def test_a_certificate_without_its_key_is_a_settings_error(ca: TestCA) -> None:
    cert, _ = ca.issue("lonely", server=False)
    with pytest.raises(ValidationError, match="go together"):
        NatsSettings(tls_cert_file=cert)
