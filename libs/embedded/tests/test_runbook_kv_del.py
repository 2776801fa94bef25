"""docs/operations.md's repair command for human-interaction's ``migrated.run_entries`` key, run as written (the
Python the doc gives) as human-interaction's own NATS user against a server with the catalogue's users: it deletes
the key, with no ``nats`` CLI."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from nats.js.errors import KeyNotFoundError

from temporality_bus import Bus, NatsSettings
from temporality_embedded.natsserver import NatsServer
from temporality_embedded.stack import Stack, StackConfig
from temporality_protocol.catalog import ALL_BUCKETS, BUCKET_HUMAN_CHANNELS

OPERATIONS = Path(__file__).resolve().parents[3] / "docs" / "operations.md"


def _documented_script() -> str:
    match = re.search(r"^DEL='(.*?)'$", OPERATIONS.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    assert match is not None, "the DEL='...' script is gone from docs/operations.md"
    return match.group(1)


async def test_the_documented_kv_delete_works_as_human_interactions_user(tmp_path: Path) -> None:
    script = _documented_script()
    stack = Stack(StackConfig(data_dir=tmp_path / "data", config_dir=tmp_path, nats_auth=True))
    server = NatsServer(tmp_path / "nats", users=stack._nats_users())
    server.start()
    try:
        admin = stack.nats_admin
        assert admin is not None
        settings = NatsSettings(url=server.url, user=admin[0], password=admin[1], drain_timeout_s=2.0)
        async with Bus.connect(settings, name="test") as bus:
            await bus.ensure([], ALL_BUCKETS)
            kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
            await kv.put("migrated.run_entries", b"1")
            env = {
                **os.environ,
                "TEMPORALITY_NATS_URL": server.url,
                "TEMPORALITY_NATS_USER": "human-interaction",
                "TEMPORALITY_NATS_PASSWORD": stack._nats_passwords["human-interaction"],
            }
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-c", script],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            assert "deleted migrated.run_entries from human-channels" in done.stdout
            with pytest.raises(KeyNotFoundError):  # (KeyDeletedError is one): the key is gone
                await kv.get("migrated.run_entries")
    finally:
        server.stop()
