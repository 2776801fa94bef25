"""Deliveries against a real nats-server: exactly-once run creation (IDEM-1), SEC-1, ignored events, 503."""

from __future__ import annotations

import asyncio
import json

import httpx
from gateway_support import REPO, basic, fixture_bytes, fixture_json, journal, post, run_requested, types

from temporality_bus import Bus
from temporality_protocol import (
    HumanPolicy,
    RunRequested,
    TimeoutPolicy,
    TriggerAccepted,
    TriggerReceived,
    TriggerRejected,
    derive_id,
    encode,
    run_id_for_delivery,
)
from temporality_protocol.catalog import BUCKET_DEDUPE
from temporality_testing import NatsServer
from temporality_trigger_gateway.intake import DedupeRecord

PR_EVENT_ID = "5f0b8f6e-3c2d-4e71-a0d9-7b1e2c4d9a10"
PR_BASE = (
    "https://contoso.visualstudio.com/DefaultCollection/_apis/git/repositories/9e3c4b1a-7d2f-4c6e-8a5b-1f0e2d3c4b5a"
)

EXPECTED_INPUT = {
    "repository": {
        "id": "9e3c4b1a-7d2f-4c6e-8a5b-1f0e2d3c4b5a",
        "name": "payments-api",
        "url": PR_BASE,
        "project": "Contoso",
    },
    "pull_request": {
        "id": 7,
        "title": "Retry idempotent refunds",
        "description": "",
        "url": f"{PR_BASE}/pullRequests/7",
        "status": "active",
        "created_at": "2024-11-05T08:30:00.123456+00:00",
    },
    "source_branch": "fix/refund-retries",
    "target_branch": "develop",
    "author": {
        "id": "2c9d7e1f-0a3b-4c5d-8e6f-7a8b9c0d1e2f",
        "display_name": "Rosa Marquez",
        "unique_name": "rosa@contoso.example",
    },
    "reviewers": [
        {
            "id": "8d7c6b5a-4e3f-4a1b-9c0d-e1f2a3b4c5d6",
            "display_name": "Omar Haddad",
            "unique_name": "omar@contoso.example",
        }
    ],
    "commits": {"source": "4f1e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6", "target": None},
}


async def test_accepted_delivery_publishes_received_accepted_requested(client: httpx.AsyncClient, bus: Bus) -> None:
    raw = fixture_bytes("pr-created.json")
    response = await post(client, raw)

    run_id = run_id_for_delivery("ado-pr-review", PR_EVENT_ID)
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "accepted"
    assert body["run_id"] == run_id
    assert body["delivery_id"].startswith("dlv-")

    events = await journal(bus)
    assert types(events) == ["trigger.received", "trigger.accepted", "run.requested"]
    for event in events:
        assert event.source == "/temporality/trigger-gateway"
        assert event.actor == "service:trigger-gateway"
        assert event.runid == run_id
        assert event.correlationid == run_id
        assert event.tenant == "fabrikam"
    received, accepted, requested = events
    assert received.payload(TriggerReceived) == TriggerReceived(
        trigger_id="ado-pr-review",
        delivery_id=body["delivery_id"],
        adapter="azure_devops.pull_request",
        source_event_id=PR_EVENT_ID,
        source_event_type="git.pullrequest.created",
        body_bytes=len(raw),
    )
    assert accepted.id == derive_id("evt", run_id, "trigger.accepted")
    assert accepted.payload(TriggerAccepted) == TriggerAccepted(
        trigger_id="ado-pr-review",
        delivery_id=body["delivery_id"],
        source_event_id=PR_EVENT_ID,
        run_id=run_id,
        agent="reviewer",
    )
    assert requested.id == derive_id("evt", run_id, "run.requested")
    data = requested.payload(RunRequested)
    assert data.run_id == run_id
    assert data.agent == "reviewer"
    assert data.title == "Review PR #7: Retry idempotent refunds"
    assert data.launch.kind == "webhook"
    assert data.launch.trigger_id == "ado-pr-review"
    assert data.launch.delivery_id == body["delivery_id"]
    assert data.input == EXPECTED_INPUT
    assert data.event is not None
    assert data.event.id == PR_EVENT_ID
    assert data.event.type == "azure_devops.git.pullrequest.created"
    assert data.event.source == "https://contoso.visualstudio.com"  # no resourceContainers: repository origin
    assert data.event.tenant == "fabrikam"
    assert data.event.actor is not None
    assert data.event.actor.id == "rosa@contoso.example"
    assert data.event.actor.display_name == "Rosa Marquez"
    assert data.event.payload == {}  # the payload is carried once, as the input
    assert data.event.metadata == {
        "event_type": "git.pullrequest.created",
        "notification_id": "3",
        "subscription_id": "6a1c3e2b-52f4-4f0e-9d55-0f6d9a7b2c11",
        "publisher_id": "tfs",
    }
    assert data.human == HumanPolicy(
        allowed_recipients=["user:alice"],
        default_timeout_s=3600,
        on_timeout=TimeoutPolicy(action="default", default_option="keep-v1"),
    )

    stored = await (await bus.store(BUCKET_DEDUPE, DedupeRecord)).get(derive_id("dd", "ado-pr-review", PR_EVENT_ID))
    assert stored is not None
    assert stored.value.run_id == run_id


async def test_redelivery_is_a_duplicate_and_never_a_second_run(client: httpx.AsyncClient, bus: Bus) -> None:
    raw = fixture_bytes("pr-created.json")
    first = await post(client, raw)
    assert first.status_code == 202
    run_id = first.json()["run_id"]
    deliveries = {first.json()["delivery_id"]}

    for _ in range(3):
        again = await post(client, raw)
        assert again.status_code == 200
        assert again.json()["status"] == "duplicate"
        assert again.json()["run_id"] == run_id
        deliveries.add(again.json()["delivery_id"])
    assert len(deliveries) == 4  # every delivery is its own fact

    events = await journal(bus)
    assert types(events).count("run.requested") == 1
    assert types(events).count("trigger.accepted") == 1
    assert types(events).count("trigger.received") == 4
    assert len({e.id for e in events if e.type == "trigger.received"}) == 4
    rejected = [e for e in events if e.type == "trigger.rejected"]
    assert len(rejected) == 3
    for event in rejected:
        data = event.payload(TriggerRejected)
        assert data.reason == "duplicate"
        assert data.run_id == run_id
        assert data.source_event_id == PR_EVENT_ID
        assert event.runid == run_id


async def test_concurrent_redeliveries_start_one_run(client: httpx.AsyncClient, bus: Bus) -> None:
    raw = fixture_bytes("pr-created.json")
    responses = await asyncio.gather(*(post(client, raw) for _ in range(5)))
    assert {r.status_code for r in responses} <= {200, 202}
    assert len({r.json()["run_id"] for r in responses}) == 1
    assert types(await journal(bus)).count("run.requested") == 1  # JetStream dedupes the derived ids


async def test_recipients_come_from_the_trigger_never_from_the_payload(client: httpx.AsyncClient, bus: Bus) -> None:
    payload = fixture_json("pr-created.json")
    payload["recipient"] = "user:mallory"
    payload["human"] = {"allowed_recipients": ["user:mallory"]}
    payload["resource"]["recipient"] = "user:mallory"
    payload["resource"]["allowed_recipients"] = ["user:mallory"]
    assert (await post(client, payload)).status_code == 202

    requested = [e for e in await journal(bus) if e.type == "run.requested"]
    assert len(requested) == 1
    data = requested[0].payload(RunRequested)
    assert data.human.allowed_recipients == ["user:alice"]
    assert b"mallory" not in encode(requested[0])


async def test_payload_with_bom_is_accepted(client: httpx.AsyncClient, bus: Bus) -> None:
    raw = fixture_bytes("pr-created-bom.json")
    assert raw.startswith(b"\xef\xbb\xbf")
    response = await post(client, raw)
    assert response.status_code == 202
    requested = await run_requested(bus)
    assert requested.title == "Review PR #8: Café menu: prices in €"
    assert requested.input["pull_request"]["description"].endswith("日本語.")


async def test_shipped_example_payload_is_accepted(client: httpx.AsyncClient, bus: Bus) -> None:
    raw = (REPO / "examples/azure-devops/git.pullrequest.created.json").read_bytes()
    response = await post(client, raw)
    assert response.status_code == 202
    data = await run_requested(bus)
    assert data.title == "Review PR #42: Orders API: return totals as money objects"
    assert data.event is not None
    assert data.event.source == "https://dev.azure.com/fabrikam/"  # resourceContainers.collection.baseUrl
    assert data.input["repository"]["name"] == "orders-service"
    assert data.input["repository"]["project"] == "Fabrikam"
    assert "GET /api/orders/{id}" in data.input["pull_request"]["description"]
    assert data.input["source_branch"] == "feature/money-totals"
    assert data.input["target_branch"] == "main"
    assert [r["display_name"] for r in data.input["reviewers"]] == ["Alice Nguyen"]
    assert data.event.metadata["resource_version"] == "1.0"


async def test_tenant_defaults_to_the_project_name(client: httpx.AsyncClient, bus: Bus) -> None:
    response = await post(client, fixture_bytes("pr-created.json"), trigger_id="ado-pr-all")
    assert response.status_code == 202
    assert {e.tenant for e in await journal(bus)} == {"Contoso"}


async def test_event_type_not_handled_is_ignored_and_journaled(client: httpx.AsyncClient, bus: Bus) -> None:
    response = await post(client, fixture_bytes("git-push.json"))
    assert response.status_code == 200
    assert response.json()["status"] == "ignored"
    assert response.json()["reason"] == "unsupported_event"

    events = await journal(bus)
    assert types(events) == ["trigger.received", "trigger.rejected"]
    received, rejected = events
    assert received.payload(TriggerReceived).source_event_type == "git.push"
    assert received.runid is None  # no run exists or will exist for it
    assert rejected.payload(TriggerRejected).reason == "unsupported_event"
    assert rejected.correlationid == response.json()["delivery_id"]


async def test_pr_event_outside_the_trigger_events_is_ignored(client: httpx.AsyncClient, bus: Bus) -> None:
    payload = fixture_json("pr-created.json")
    payload["eventType"] = "git.pullrequest.updated"
    response = await post(client, payload)
    assert response.status_code == 200
    assert response.json()["reason"] == "unsupported_event"
    assert "run.requested" not in types(await journal(bus))


async def test_disabled_trigger_ignores_deliveries(client: httpx.AsyncClient, bus: Bus) -> None:
    response = await post(client, fixture_bytes("pr-created.json"), trigger_id="ado-pr-disabled")
    assert response.status_code == 200
    assert response.json()["status"] == "ignored"
    assert response.json()["reason"] == "disabled"
    events = await journal(bus)
    assert types(events) == ["trigger.received", "trigger.rejected"]
    assert events[1].payload(TriggerRejected).reason == "disabled"


async def test_nats_unavailable_answers_503_with_retry_after(
    client: httpx.AsyncClient, bus: Bus, nats_server: NatsServer
) -> None:
    nats_server.stop()

    async def disconnected() -> None:
        # Only makes the test fast: a POST before the client noticed would get 503 after the JetStream timeout.
        while bus.nc.is_connected:  # noqa: ASYNC110 - the Bus exposes no disconnect event
            await asyncio.sleep(0.01)

    await asyncio.wait_for(disconnected(), 30)
    response = await post(client, fixture_bytes("pr-created.json"))
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "7"
    assert response.json()["error"] == "bus_unavailable"


async def test_title_is_cut_to_200_characters(client: httpx.AsyncClient, bus: Bus) -> None:
    payload = fixture_json("pr-created.json")
    payload["resource"]["title"] = "x" * 500
    assert (await post(client, payload, headers=basic())).status_code == 202
    data = await run_requested(bus)
    assert len(data.title) == 200
    assert data.input["pull_request"]["title"] == "x" * 500
    assert json.dumps(data.input)  # the input stays plain JSON
