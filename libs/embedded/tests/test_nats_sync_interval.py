"""``temporality up --sync-always``: the embedded nats-server fsyncs every JetStream write (docs/operations.md,
"Durability and retention"). The config is rendered into the server's config file and a real nats-server
started with it applies it (its ``/varz`` says ``sync_always``) and takes JetStream publishes."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import nats
import pytest

from temporality_embedded import Stack
from temporality_embedded.cli import build_parser, stack_config
from temporality_embedded.natsserver import NatsServer, sync_interval_ok


def _jetstream_config(server: NatsServer) -> dict[str, Any]:
    with urllib.request.urlopen(f"{server.monitoring_url}/varz", timeout=10) as answer:
        config: dict[str, Any] = json.load(answer)["jetstream"]["config"]
    return config


def test_sync_always_is_off_unless_asked(tmp_path: Path) -> None:
    default = Stack(stack_config(build_parser().parse_args(["up", "--data-dir", str(tmp_path)])))
    assert default.nats.sync_interval is None
    assert "jetstream" not in default.nats.config_text()
    always = Stack(stack_config(build_parser().parse_args(["up", "--data-dir", str(tmp_path), "--sync-always"])))
    assert always.nats.sync_interval == "always"
    assert 'jetstream: {"sync_interval": "always"}' in always.nats.config_text()


@pytest.mark.parametrize("value", ["always", "10s", "500ms", "2m", "1h30m", "0.5s"])
def test_a_sync_interval_the_server_takes_is_accepted(value: str) -> None:
    assert sync_interval_ok(value)


@pytest.mark.parametrize("value", ["", "never", "10", "0s", "-1s", "10 s", "always\n"])
def test_anything_else_is_refused_before_the_server_starts(value: str, tmp_path: Path) -> None:
    assert not sync_interval_ok(value)
    with pytest.raises(ValueError, match="sync_interval"):
        NatsServer(tmp_path, sync_interval=value)


def test_with_a_config_file_of_the_callers_the_setting_belongs_in_that_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="config file"):
        NatsServer(tmp_path, sync_interval="always", config_file=tmp_path / "nats.conf")


@pytest.mark.parametrize("users", [False, True], ids=["alone", "with-authorization"])
async def test_the_server_runs_with_sync_always_and_takes_publishes(tmp_path: Path, users: bool) -> None:
    server = NatsServer(
        tmp_path / "nats",
        sync_interval="always",
        monitoring=True,
        users={"svc": ("svc-password-0123456789", None)} if users else None,
    )
    server.start()
    try:
        rendered = (tmp_path / "nats" / "nats.conf").read_text(encoding="utf-8")
        assert 'jetstream: {"sync_interval": "always"}' in rendered
        assert ("authorization" in rendered) is users
        config = _jetstream_config(server)
        assert config["sync_always"] is True
        assert Path(config["store_dir"]).is_relative_to(tmp_path / "nats" / "jetstream")  # -sd still applies
        url = server.url.replace("nats://", "nats://svc:svc-password-0123456789@", 1) if users else server.url
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="durable", subjects=["durable.>"])
            ack = await js.publish("durable.one", b"kept")
            assert ack.seq == 1
        finally:
            await nc.drain()
    finally:
        server.stop()


def test_a_duration_sets_the_interval(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats", sync_interval="10s", monitoring=True)
    server.start()
    try:
        config = _jetstream_config(server)
        assert config["sync_interval"] == 10 * 10**9
        assert not config.get("sync_always")
    finally:
        server.stop()


def test_without_the_setting_the_server_keeps_its_default(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats", monitoring=True)
    server.start()
    try:
        config = _jetstream_config(server)
        assert config["sync_interval"] == 120 * 10**9
        assert not config.get("sync_always")
        assert not (tmp_path / "nats" / "nats.conf").exists()
    finally:
        server.stop()
