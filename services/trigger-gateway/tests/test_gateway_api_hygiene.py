"""Admin API hygiene (issue 7): the id ``preview`` is reserved for new triggers; a stored record with
fields a newer gateway wrote is read (the unknown fields ignored, logged once), while the API keeps
refusing unknown keys. Real nats-server; one gateway replica in-process (``gateway_support.replicas``)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
import structlog
import yaml
from gateway_support import AGENTS, AS_ADMIN, AS_VIEWER, eventually, fixture_json, post, replicas, webhook_spec

from temporality_bus import Bus
from temporality_protocol.catalog import BUCKET_TRIGGERS
from temporality_trigger_gateway import Settings, parse_triggers
from temporality_trigger_gateway.errors import TriggerConfigError
from temporality_trigger_gateway.store import TriggerRecord


def _stored(spec: dict[str, Any], **extra: Any) -> bytes:
    """A record as a gateway writes it, plus ``extra`` fields (as a newer gateway might)."""
    record = {"spec": spec, "origin": "api", "updated_by": "newer", "updated_at": datetime.now(UTC).isoformat()}
    return json.dumps({**record, **extra}).encode()


def test_a_file_trigger_cannot_take_a_reserved_id() -> None:
    data = yaml.safe_load(yaml.safe_dump({"triggers": [webhook_spec("preview")]}))
    with pytest.raises(TriggerConfigError) as refused:
        parse_triggers(data, source="t.yaml", agents=AGENTS)
    assert "triggers[0] (preview).id: the id 'preview' is reserved" in str(refused.value)


def test_unknown_record_fields_are_ignored_and_logged_once() -> None:
    field = f"field_{uuid.uuid4().hex[:8]}"
    raw = _stored({"id": "x"}, **{field: 1})
    with structlog.testing.capture_logs() as logs:
        first = TriggerRecord.model_validate_json(raw)
        second = TriggerRecord.model_validate_json(raw)
    assert first == second
    assert first.spec == {"id": "x"}
    assert [e["fields"] for e in logs if e["event"] == "trigger.record_fields_ignored"] == [[field]]


async def test_the_reserved_id_and_records_of_a_newer_gateway(gateway_settings: Settings, bus: Bus) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        reserved = await a.post("/triggers", json=webhook_spec("preview"), headers=AS_ADMIN)
        assert reserved.status_code == 422, reserved.text
        assert reserved.json()["error"] == "invalid_trigger"
        assert [e["field"] for e in reserved.json()["errors"]] == ["id"]
        assert "reserved" in reserved.json()["detail"]
        draft = await a.post(
            "/triggers/preview", json={"trigger": webhook_spec("preview"), "payload": {}}, headers=AS_VIEWER
        )
        assert draft.json()["errors"][0]["field"] == "id"
        unknown_key = await a.post("/triggers", json=webhook_spec("api-pr", colour="red"), headers=AS_ADMIN)
        assert unknown_key.status_code == 422, unknown_key.text  # API input: unknown keys still refused
        assert [e["field"] for e in unknown_key.json()["errors"]] == ["colour"]

        # written by a newer gateway: a record field this one does not know; and a trigger stored under the
        # id `preview` before it was reserved. Both are served.
        kv = await bus.kv(BUCKET_TRIGGERS)
        await kv.put("from-newer", _stored(webhook_spec("from-newer"), shard_hint=3, labels={"team": "web"}))
        await kv.put("preview", _stored(webhook_spec("preview")))

        async def served(trigger_id: str) -> bool:
            found = await a.get(f"/triggers/{trigger_id}", headers=AS_VIEWER)
            return found.status_code == 200 and found.json()["served"] is True

        await eventually(lambda: served("from-newer"), timeout_s=10, what="the newer record served")
        await eventually(lambda: served("preview"), timeout_s=10, what="the old preview record served")
        body = fixture_json("pr-created.json")
        accepted = await post(a, body, "from-newer")
        assert accepted.status_code == 202, accepted.text
        listed = (await a.get("/triggers", headers=AS_VIEWER)).json()["triggers"]
        assert {t["trigger"]["id"] for t in listed} >= {"from-newer", "preview"}
