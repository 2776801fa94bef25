"""``temporality up``'s banner lists every webhook trigger of the store -- those created through the admin API too,
and one this gateway does not serve marked so -- read from a real gateway's admin API."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from gateway_support import ADMIN_TOKEN, AS_ADMIN, replicas, webhook_spec

from temporality_bus import Bus
from temporality_embedded.cli import webhook_lines
from temporality_protocol.catalog import BUCKET_TRIGGERS
from temporality_trigger_gateway import Settings
from temporality_trigger_gateway.store import TriggerRecord


async def test_the_banner_lists_the_stored_webhook_triggers(gateway_settings: Settings, bus: Bus) -> None:
    async with replicas(gateway_settings, 1) as (gateway,):
        created = await gateway.post("/triggers", json=webhook_spec("api-banner"), headers=AS_ADMIN)
        assert created.status_code == 201, created.text
        unset = webhook_spec("env-banner", auth={"type": "basic", "username": "a", "password_env": "GW_BANNER_UNSET"})
        store = await bus.store(BUCKET_TRIGGERS, TriggerRecord)
        await store.create(
            "env-banner", TriggerRecord(spec=unset, origin="api", updated_by="elsewhere", updated_at=datetime.now(UTC))
        )
        url = str(gateway.base_url).rstrip("/")
        assert gateway_settings.triggers_file is not None
        config_dir = Path(gateway_settings.triggers_file).parent  # its triggers.yaml: file-pr, file-nightly

        lines = await asyncio.to_thread(webhook_lines, url, ADMIN_TOKEN, config_dir)
        assert [line.split()[1] for line in lines] == ["api-banner", "env-banner", "file-pr"]
        assert lines[0].endswith(f"POST {url}/hooks/api-banner")
        assert lines[1].endswith("(not served: see GET /triggers/env-banner)")

        from_file = await asyncio.to_thread(webhook_lines, url, None, config_dir)  # no admin token: the file's
        assert [line.split()[1] for line in from_file] == ["file-pr"]
