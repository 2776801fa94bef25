"""The trigger store (TRG-1): the file seeds it once, every replica watches it, a change needs no restart.

Two in-process gateway replicas (the real ``configure`` + ``run_until``, each with its own NATS connection
and HTTP server on a free port) on one real nats-server.
"""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
from gateway_support import (
    AS_ADMIN,
    AS_OPERATOR,
    basic,
    eventually,
    fixture_bytes,
    journal_of,
    replicas,
    webhook_spec,
)

from temporality_bus import Bus
from temporality_protocol import TriggerCreated
from temporality_protocol.catalog import BUCKET_TRIGGERS
from temporality_trigger_gateway import Settings
from temporality_trigger_gateway.store import TriggerRecord, TriggerRegistry, TriggerStore


async def _hook(client: httpx.AsyncClient, trigger_id: str, body: bytes) -> httpx.Response:
    return await client.post(f"/hooks/{trigger_id}", content=body, headers=basic())


async def test_two_replicas_starting_at_once_seed_each_file_trigger_exactly_once(
    gateway_settings: Settings, bus: Bus
) -> None:
    async with replicas(gateway_settings) as (a, b):
        for client in (a, b):
            listed = (await client.get("/triggers", headers=AS_OPERATOR)).json()["triggers"]
            assert [t["trigger"]["id"] for t in listed] == ["file-nightly", "file-pr"]
            assert {t["origin"] for t in listed} == {"file"}
            ready = await client.get("/readyz")
            assert ready.status_code == 200, ready.text
        created = [e.payload(TriggerCreated) for e in await journal_of(bus, "trigger.created")]
        assert sorted(c.trigger_id for c in created) == ["file-nightly", "file-pr"]  # one each, by the winner
        assert {c.changed_by for c in created} == {f"file:{gateway_settings.triggers_file}"}
        body = fixture_bytes("pr-created.json")
        first = await _hook(b, "file-pr", body)
        assert first.status_code == 202, first.text
        second = await _hook(a, "file-pr", body)
        assert second.json()["status"] == "duplicate", second.text
        assert (await _hook(a, "file-nightly", body)).status_code == 404  # stored, not served yet


async def test_a_change_through_one_replica_takes_effect_on_the_other_without_restart(
    gateway_settings: Settings, bus: Bus
) -> None:
    body = fixture_bytes("pr-created.json")
    async with replicas(gateway_settings) as (a, b):
        assert (await _hook(b, "api-pr", body)).status_code == 404
        created = await a.post("/triggers", json=webhook_spec("api-pr"), headers=AS_ADMIN)
        assert created.status_code == 201, created.text

        async def b_serves() -> bool:
            return (await _hook(b, "api-pr", body)).status_code == 202

        await eventually(b_serves, what="replica b serving the trigger created through a")

        disabled = await a.post("/triggers/api-pr/disable", headers=AS_OPERATOR)
        assert disabled.status_code == 200, disabled.text

        async def b_ignores() -> bool:
            response = await _hook(b, "api-pr", body)
            return response.status_code == 200 and response.json().get("reason") == "disabled"

        await eventually(b_ignores, what="replica b ignoring the trigger disabled through a")

        etag = (await a.get("/triggers/api-pr", headers=AS_ADMIN)).headers["ETag"]
        assert (await a.delete("/triggers/api-pr", headers={**AS_ADMIN, "If-Match": etag})).status_code == 204

        async def b_forgot() -> bool:
            return (await _hook(b, "api-pr", body)).status_code == 404

        await eventually(b_forgot, what="replica b no longer serving the trigger deleted through a")


async def test_a_deleted_file_trigger_stays_deleted_and_a_stored_one_wins_over_the_file(
    gateway_settings: Settings, bus: Bus
) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        assert (await a.delete("/triggers/file-pr", headers=AS_ADMIN)).status_code == 204
        changed = webhook_spec("file-nightly", name="Stored version", type="webhook")
        etag = (await a.get("/triggers/file-nightly", headers=AS_ADMIN)).headers["ETag"]
        replaced = await a.put("/triggers/file-nightly", json=changed, headers={**AS_ADMIN, "If-Match": etag})
        assert replaced.status_code == 200, replaced.text
    async with replicas(gateway_settings, 1) as (again,):  # a restart seeds again: create-if-absent leaves both alone
        assert (await again.get("/triggers/file-pr", headers=AS_ADMIN)).status_code == 404
        kept = (await again.get("/triggers/file-nightly", headers=AS_ADMIN)).json()
        assert kept["trigger"]["name"] == "Stored version"
        assert kept["origin"] == "api"
    store = await bus.store(BUCKET_TRIGGERS, TriggerRecord)
    tombstone = await store.get("file-pr")
    assert tombstone is not None
    assert tombstone.value.deleted
    assert len(await journal_of(bus, "trigger.created")) == 2  # the second start created nothing


async def test_an_unusable_stored_trigger_is_not_served_and_the_replica_keeps_running(
    gateway_settings: Settings, bus: Bus
) -> None:
    """A record another replica could use but this one cannot (its *_env secret is not set here)."""
    async with replicas(gateway_settings, 1) as (a,):
        spec = webhook_spec("env-pr", auth={"type": "basic", "username": "azure", "password_env": "GW_TEST_UNSET"})
        store = await bus.store(BUCKET_TRIGGERS, TriggerRecord)
        record = TriggerRecord(spec=spec, origin="api", updated_by="elsewhere", updated_at=datetime.now(UTC))
        await store.create("env-pr", record)

        async def shown_as_invalid() -> bool:
            found = (await a.get("/triggers/env-pr", headers=AS_ADMIN)).json()
            return found.get("served") is False and "GW_TEST_UNSET" in (found.get("problem") or "")

        await eventually(shown_as_invalid, what="the unusable trigger reported")
        unserved = await _hook(a, "env-pr", fixture_bytes("pr-created.json"))  # it exists: 503, saying why
        assert (unserved.status_code, unserved.json()["error"]) == (503, "trigger_not_served"), unserved.text
        assert "GW_TEST_UNSET" not in unserved.text
        assert (await a.get("/readyz")).status_code == 200


async def test_an_unreadable_record_counts_as_applied_so_no_replica_waits_for_it(bus: Bus) -> None:
    """A record the watch cannot read is handled (not served, its problem noted): the replica has applied the
    store up to it, or every event trigger's wait for the store (wait_for_store) would wait on it for ever."""
    store = await TriggerStore.open(bus)
    registry = TriggerRegistry(environ={}, agents=None)
    async with registry.watching(store):
        await store.kv.put("broken", b"{not a record")
        latest = await store.last_revision()
        assert await registry.wait_for_store(latest, timeout_s=10)
        assert registry.applied == latest
        assert "unreadable record" in registry.problems["broken"]
        assert registry.get("broken") is None
