"""What a webhook integrator meets setting a source up (a reviewer's findings as one, on a real nats-server): Azure
DevOps' *Test* button, a trigger whose own expression fails on a valid event, the original event a mapped run keeps,
a stored trigger whose secret is not set on this server, and the wording of the refusals around them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from gateway_support import (
    AGENTS,
    AS_ADMIN,
    AS_OPERATOR,
    AS_VIEWER,
    BEARER_TOKEN,
    basic,
    eventually,
    fixture_bytes,
    fixture_json,
    journal,
    post,
    tokens_file,
    webhook_spec,
)

from temporality_bus import Bus
from temporality_protocol import RunRequested, TriggerRejected, run_id_for_delivery
from temporality_protocol.trigger_admin import PreviewAnswer
from temporality_service import ApiAuth, ApiAuthSettings
from temporality_trigger_gateway import Settings, create_app
from temporality_trigger_gateway.schedule import Scheduler
from temporality_trigger_gateway.store import TriggerRecord, TriggerRegistry, TriggerStore

WORK_ITEM_TRIGGER = webhook_spec(
    "api-wi", adapter="azure_devops.work_item", events=["workitem.created", "workitem.updated"], input=None
)


@pytest.fixture
async def registry() -> TriggerRegistry:
    return TriggerRegistry(environ={}, agents=AGENTS)


@pytest.fixture
async def gateway(bus: Bus, tmp_path: Path, registry: TriggerRegistry) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway over the trigger store (its admin API served), at its default body limit (1 MiB)."""
    store = await TriggerStore.open(bus)
    auth = ApiAuth.from_settings(ApiAuthSettings(tokens_file=tokens_file(tmp_path)))
    async with registry.watching(store):
        app = create_app(Settings(retry_after_s=9), bus, registry, store=store, auth=auth)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as c:
            yield c


async def _create(client: httpx.AsyncClient, spec: dict[str, Any]) -> None:
    created = await client.post("/triggers", json=spec, headers=AS_ADMIN)
    assert created.status_code == 201, created.text


async def _deliveries(client: httpx.AsyncClient, trigger_id: str) -> list[dict[str, Any]]:
    listed = await client.get(f"/triggers/{trigger_id}/deliveries", headers=AS_VIEWER)
    assert listed.status_code == 200, listed.text
    rows: list[dict[str, Any]] = listed.json()["deliveries"]
    return rows


def _requested(events: list[Any]) -> list[RunRequested]:
    return [e.payload(RunRequested) for e in events if e.type == "run.requested"]


# --------------------------------------------------------------------------- 1. Azure DevOps' test notification
@pytest.mark.parametrize(
    ("spec", "fixture"),
    [(webhook_spec(), "ado-test-notification-pr.json"), (WORK_ITEM_TRIGGER, "ado-test-notification-workitem.json")],
    ids=["pull_request", "work_item"],
)
async def test_an_azure_devops_test_notification_is_ignored_and_recorded_never_a_run(
    gateway: httpx.AsyncClient, bus: Bus, spec: dict[str, Any], fixture: str
) -> None:
    await _create(gateway, spec)
    trigger_id = spec["id"]
    raw = fixture_bytes(fixture)

    wrong = await post(gateway, raw, trigger_id, headers=basic(password="not-the-password"))
    assert wrong.status_code == 401, wrong.text  # authentication first: a test with wrong credentials fails

    answer = await post(gateway, raw, trigger_id)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["status"], body["reason"]) == ("ignored", "test_notification")
    assert body["detail"].startswith("Azure DevOps test notification")
    assert "no run started" in body["detail"]

    events = await journal(bus)
    assert not _requested(events)
    rejected = [e.payload(TriggerRejected) for e in events if e.type == "trigger.rejected"]
    assert [(r.trigger_id, r.reason, r.delivery_id) for r in rejected] == [
        (trigger_id, "unsupported_event", body["delivery_id"])  # the protocol's reason: not an event it takes
    ]
    assert "test notification" in rejected[0].detail

    (row,) = await _deliveries(gateway, trigger_id)
    assert (row["delivery_id"], row["state"], row["reason"]) == (body["delivery_id"], "rejected", "test_notification")
    assert row["has_event"] is False  # sample data: never re-driven into a run
    redrive = await gateway.post(f"/triggers/{trigger_id}/deliveries/{row['delivery_id']}/redrive", headers=AS_OPERATOR)
    assert redrive.status_code == 409, redrive.text
    assert "test notification" in redrive.json()["detail"]

    # the trigger's preview says what the live hook did (not that a run would start)
    preview = await gateway.post(
        "/triggers/preview", json={"trigger_id": trigger_id, "payload": fixture_json(fixture)}, headers=AS_VIEWER
    )
    assert preview.status_code == 200, preview.text
    assert preview.json()["would_start_run"] is False
    assert preview.json()["ignored"]["reason"] == "test_notification"
    assert PreviewAnswer.model_validate(preview.json()).ignored is not None

    real = fixture_json(fixture)
    real["subscriptionId"] = "3f2a1b0c-9d8e-4f7a-b6c5-d4e3f2a1b0c9"  # the same event from a real subscription
    real_preview = await gateway.post(
        "/triggers/preview", json={"trigger_id": trigger_id, "payload": real}, headers=AS_VIEWER
    )
    assert real_preview.json()["would_start_run"] is True, real_preview.text
    started = await post(gateway, json.dumps(real).encode(), trigger_id)
    assert started.status_code == 202, started.text
    assert len(_requested(await journal(bus))) == 1


async def test_a_test_notification_of_an_event_type_the_trigger_does_not_take_says_so(
    gateway: httpx.AsyncClient, bus: Bus
) -> None:
    await _create(gateway, webhook_spec())  # git.pullrequest.created only
    sample = fixture_json("ado-test-notification-pr.json")
    sample["eventType"] = "git.pullrequest.updated"
    answer = await post(gateway, json.dumps(sample).encode(), "api-pr")
    assert answer.status_code == 200, answer.text
    assert answer.json()["reason"] == "test_notification"
    assert "would be ignored too" in answer.json()["detail"]
    assert "'git.pullrequest.updated'" in answer.json()["detail"]
    assert not _requested(await journal(bus))


# --------------------------------------------------------------------------- 2. the trigger's own expression fails
async def test_a_failing_mapping_names_the_trigger_keeps_the_event_and_is_redriven_once_fixed(
    gateway: httpx.AsyncClient, bus: Bus
) -> None:
    await _create(gateway, webhook_spec(input={"n": "length(payload.pull_request.id)"}))
    refused = await post(gateway, fixture_bytes("pr-created.json"), "api-pr")
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["error"] == "mapping_failed"
    assert "input.n" in body["detail"]
    assert "length()" in body["detail"]  # the expression's own error
    assert "re-drive" in body["detail"]
    assert body["errors"][0]["loc"] == ["input", "n"]
    delivery_id = body["delivery_id"]

    (row,) = await _deliveries(gateway, "api-pr")
    assert (row["delivery_id"], row["state"], row["reason"]) == (delivery_id, "rejected", "mapping_failed")
    assert row["source_event_id"] == "5f0b8f6e-3c2d-4e71-a0d9-7b1e2c4d9a10"
    assert row["has_event"] is True
    (rejected,) = [e.payload(TriggerRejected) for e in await journal(bus) if e.type == "trigger.rejected"]
    assert (rejected.reason, rejected.source_event_id) == ("invalid_payload", row["source_event_id"])
    assert rejected.detail.startswith("mapping_failed: ")

    url = f"/triggers/api-pr/deliveries/{delivery_id}/redrive"
    still = await gateway.post(url, headers=AS_OPERATOR)  # the trigger as it still is: the same failure
    assert still.status_code == 200, still.text
    assert (still.json()["status"], still.json()["reason"]) == ("ignored", "mapping_failed")

    current = await gateway.get("/triggers/api-pr", headers=AS_VIEWER)
    fixed = await gateway.put(
        "/triggers/api-pr",
        json=webhook_spec(input={"n": "payload.pull_request.id"}),
        headers={**AS_ADMIN, "If-Match": current.headers["ETag"]},
    )
    assert fixed.status_code == 200, fixed.text

    async def redriven() -> httpx.Response | None:
        again = await gateway.post(url, headers=AS_OPERATOR)
        return again if again.status_code == 202 else None

    accepted = await eventually(redriven, what="the re-drive accepted once the trigger serves its fix")
    assert accepted.json()["run_id"] == run_id_for_delivery("api-pr", row["source_event_id"])
    (requested,) = _requested(await journal(bus))
    assert requested.input["n"] == 7


# --------------------------------------------------------------------------- 3. the run keeps the original event
async def test_a_mapped_webhook_run_keeps_the_original_payload(gateway: httpx.AsyncClient, bus: Bus) -> None:
    await _create(gateway, webhook_spec())  # an input mapping: the input is not the payload
    assert (await post(gateway, fixture_bytes("pr-created.json"), "api-pr")).status_code == 202
    (requested,) = _requested(await journal(bus))
    assert requested.input["pull_request"] == 7
    assert requested.event is not None
    assert requested.event.payload["pull_request"]["title"] == "Retry idempotent refunds"
    assert requested.event.payload["target_branch"] == "develop"
    assert "payload_omitted" not in requested.event.metadata

    await _create(gateway, webhook_spec("api-plain", input=None))  # no mapping: the input is the payload, once
    assert (await post(gateway, fixture_bytes("pr-created.json"), "api-plain")).status_code == 202
    plain = [r for r in _requested(await journal(bus)) if r.launch.trigger_id == "api-plain"]
    assert plain[0].event is not None
    assert plain[0].event.payload == {}
    assert plain[0].input["pull_request"]["title"] == "Retry idempotent refunds"


async def test_a_payload_too_large_to_carry_twice_is_omitted_and_marked(gateway: httpx.AsyncClient, bus: Bus) -> None:
    """A body near the 1 MiB limit: with its payload as well as a mapped input, run.requested would pass the bus's
    message limit; the run starts with the input, its event marked ``payload_omitted``."""
    spec = webhook_spec(
        "api-orders",
        adapter="generic",
        events=["order.created"],
        auth={"type": "bearer", "token": BEARER_TOKEN},
        input={"notes": "payload.notes", "order": "payload.order"},
    )
    await _create(gateway, spec)
    headers = {"Authorization": f"Bearer {BEARER_TOKEN}"}
    small = {"type": "order.created", "id": "o-1", "data": {"order": 1, "notes": "fragile"}}
    assert (await post(gateway, json.dumps(small).encode(), "api-orders", headers=headers)).status_code == 202
    large = {"type": "order.created", "id": "o-2", "data": {"order": 2, "notes": "n" * (600 * 1024)}}
    answer = await post(gateway, json.dumps(large).encode(), "api-orders", headers=headers)
    assert answer.status_code == 202, answer.text
    kept, omitted = sorted(_requested(await journal(bus)), key=lambda r: r.input["order"])
    assert kept.event is not None
    assert kept.event.payload == {"order": 1, "notes": "fragile"}
    assert omitted.event is not None
    assert omitted.event.payload == {}
    assert "max_payload" in omitted.event.metadata["payload_omitted"]
    assert len(omitted.input["notes"]) == 600 * 1024


# --------------------------------------------------------------------------- 4. a stored trigger this server cannot serve
async def test_a_webhook_trigger_whose_secret_is_not_set_here_is_503_saying_so(
    gateway: httpx.AsyncClient, bus: Bus, registry: TriggerRegistry
) -> None:
    store = await TriggerStore.open(bus)
    spec = webhook_spec("env-pr", auth={"type": "basic", "username": "azure", "password_env": "GW_SECRET_UNSET"})
    record = TriggerRecord(spec=spec, origin="api", updated_by="elsewhere", updated_at=datetime.now(UTC))
    revision = await store.store.create("env-pr", record)
    assert await registry.wait_for_revision("env-pr", revision, timeout_s=10)

    with structlog.testing.capture_logs() as logs:
        answer = await post(gateway, fixture_bytes("pr-created.json"), "env-pr")
        for _ in range(5):  # anyone may post before authentication: one warning, the rest counted
            assert (await post(gateway, fixture_bytes("pr-created.json"), "env-pr")).status_code == 503
    warned = [entry for entry in logs if entry["event"] == "webhook.trigger_not_served"]
    assert [w["trigger_id"] for w in warned] == ["env-pr"], warned
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"] == "trigger_not_served"
    detail = answer.json()["detail"]
    assert "exists but is not served" in detail
    assert "its secret is not configured on the server" in detail
    assert "GET /triggers/env-pr" in detail
    assert "GW_SECRET_UNSET" not in answer.text  # never the variable (the sender is not authenticated)
    assert answer.headers["Retry-After"] == "9"
    view = (await gateway.get("/triggers/env-pr", headers=AS_VIEWER)).json()
    assert view["served"] is False
    assert "Value error" not in view["problem"]
    assert registry.problems["env-pr"].endswith(
        "environment variable GW_SECRET_UNSET (password_env) is not set or empty"
    )

    missing = await post(gateway, fixture_bytes("pr-created.json"), "no-such-trigger")
    assert (missing.status_code, missing.json()["error"]) == (404, "unknown_trigger")


async def test_an_unserved_webhook_trigger_cancels_no_schedule(bus: Bus) -> None:
    """Only a schedule trigger (or one not known to be another type) has a timer to cancel when it is not served."""
    store = await TriggerStore.open(bus)
    registry = TriggerRegistry(environ={}, agents=AGENTS)
    scheduler = Scheduler(bus, registry)
    spec = webhook_spec("env-pr", auth={"type": "basic", "username": "azure", "password_env": "GW_SECRET_UNSET"})
    record = TriggerRecord(spec=spec, origin="api", updated_by="elsewhere", updated_at=datetime.now(UTC))
    revision = await store.store.create("env-pr", record)
    with structlog.testing.capture_logs() as logs:
        registry.apply("env-pr", record, revision)
        await scheduler.on_change("env-pr", registry.get("env-pr"), revision)
        await scheduler.on_change("gone-schedule", None, revision)  # never seen here: its timer is cancelled
    cancelled = [entry["trigger_id"] for entry in logs if entry["event"] == "schedule.cancelled"]
    assert cancelled == ["gone-schedule"]
    (invalid,) = [entry for entry in logs if entry["event"] == "trigger.invalid"]
    assert "Value error" not in invalid["problem"]


# --------------------------------------------------------------------------- 5. wording
async def test_an_empty_body_is_400_saying_it_is_empty(gateway: httpx.AsyncClient) -> None:
    await _create(gateway, webhook_spec())
    for raw in (b"", b" \r\n"):
        answer = await post(gateway, raw, "api-pr")
        assert answer.status_code == 400, answer.text
        assert answer.json()["detail"].startswith("the body is empty")
        assert "Expecting value" not in answer.text
