"""Deliveries against a real nats-server: exactly-once run creation (IDEM-1), SEC-1, ignored events, 503."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest.mock import patch

import httpx
import pytest
from gateway_support import (
    MAX_BODY,
    REPO,
    basic,
    events_not_acked,
    fixture_bytes,
    fixture_json,
    journal,
    post,
    run_requested,
    types,
)

from temporality_bus import Bus, BusError, Pipeline, PublishResult, Store, TransientError
from temporality_bus.pipeline import Write
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
from temporality_trigger_gateway import Settings, TriggerConfig, create_app
from temporality_trigger_gateway.behind import Settle, WriteBehind
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

    await WriteBehind.of(bus).settled()  # the claim's mark is written behind the answer

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


async def test_concurrent_deliveries_one_accepted_every_other_a_journaled_duplicate(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    """Claim first: of 20 simultaneous deliveries of one event exactly one is accepted, and every
    delivery leaves its own outcome in the journal."""
    raw = fixture_bytes("pr-created.json")
    responses = await asyncio.wait_for(asyncio.gather(*(post(client, raw) for _ in range(20))), 30)
    statuses = sorted((r.status_code, r.json()["status"]) for r in responses)
    assert statuses == [(200, "duplicate")] * 19 + [(202, "accepted")]
    assert len({r.json()["run_id"] for r in responses}) == 1
    deliveries = {r.json()["delivery_id"] for r in responses}
    assert len(deliveries) == 20

    events = await journal(bus)
    assert types(events).count("run.requested") == 1
    assert types(events).count("trigger.accepted") == 1
    assert types(events).count("trigger.received") == 20
    rejected = [e.payload(TriggerRejected) for e in events if e.type == "trigger.rejected"]
    assert [r.reason for r in rejected] == ["duplicate"] * 19
    accepted = [e.payload(TriggerAccepted) for e in events if e.type == "trigger.accepted"]
    outcomes = {r.delivery_id for r in rejected} | {a.delivery_id for a in accepted}
    assert outcomes == deliveries  # one outcome per delivery, none left with only trigger.received

    await WriteBehind.of(bus).settled()  # the claim's mark is written behind the answer

    stored = await (await bus.store(BUCKET_DEDUPE, DedupeRecord)).get(derive_id("dd", "ado-pr-review", PR_EVENT_ID))
    assert stored is not None
    assert stored.value.state == "published"


async def test_the_events_of_one_answer_go_out_in_one_batch_after_the_claim(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    """Pipelined: the events of one answer in one batch (with the delivery's record), every ack awaited; the launch
    batch only once claimed."""
    real_send = Pipeline.send
    store = await bus.store(BUCKET_DEDUPE, DedupeRecord)
    key = derive_id("dd", "ado-pr-review", PR_EVENT_ID)
    batches: list[tuple[list[str], str | None]] = []

    async def spying(self: Pipeline, writes: Sequence[Write], **kw: Any) -> list[PublishResult | BusError]:
        events = [w.headers["Ce-Type"] for w in writes if w.bucket is None]
        if events:
            stored = await store.get(key)
            batches.append((events, stored.value.state if stored else None))
        results = await real_send(self, writes, **kw)
        if events:
            assert all(isinstance(r, PublishResult) for r in results)  # every one acked before the answer
        return results

    with patch.object(Pipeline, "send", spying):
        first = await post(client, fixture_bytes("pr-created.json"))
        again = await post(client, fixture_bytes("pr-created.json"))
    assert (first.status_code, again.status_code) == (202, 200)
    assert batches == [
        (["trigger.received", "trigger.accepted", "run.requested"], "claimed"),
        (["trigger.received", "trigger.rejected"], "published"),
    ]


class _Crash(BaseException):
    """The process dying between the claim and the publish (not an Exception: nothing cleans up)."""


async def _claim_left_by_a_crash(bus: Bus, settings: Settings, triggers: list[TriggerConfig]) -> str:
    """Deliver once through an app whose publish of ``trigger.accepted`` 'crashes' the process."""
    app = create_app(settings, bus, triggers)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as c:
        with events_not_acked("trigger.accepted", _Crash()), pytest.raises(_Crash):
            await post(c, fixture_bytes("pr-created.json"))
    await WriteBehind.of(bus).settled()  # the claim's mark is written behind the answer
    stored = await (await bus.store(BUCKET_DEDUPE, DedupeRecord)).get(derive_id("dd", "ado-pr-review", PR_EVENT_ID))
    assert stored is not None
    assert stored.value.state == "claimed"
    assert "run.requested" not in types(await journal(bus))
    return stored.value.delivery_id


async def test_crash_between_claim_and_publish_redelivery_after_the_lease_starts_the_run(
    bus: Bus, triggers: list[TriggerConfig]
) -> None:
    settings = Settings(max_body_bytes=MAX_BODY, retry_after_s=7, claim_lease_s=0.3)
    crashed_delivery = await _claim_left_by_a_crash(bus, settings, triggers)
    app = create_app(settings, bus, triggers)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as c:
        # A redelivery while the claim is fresh waits for it; once the lease is over it takes it over.
        response = await asyncio.wait_for(post(c, fixture_bytes("pr-created.json")), 10)
        assert response.status_code == 202
        assert response.json()["run_id"] == run_id_for_delivery("ado-pr-review", PR_EVENT_ID)
        again = await post(c, fixture_bytes("pr-created.json"))
        assert again.status_code == 200
        assert again.json()["status"] == "duplicate"

    events = await journal(bus)
    assert types(events).count("run.requested") == 1
    requested = next(e for e in events if e.type == "run.requested")
    assert requested.id == derive_id("evt", response.json()["run_id"], "run.requested")
    assert requested.payload(RunRequested).launch.delivery_id == response.json()["delivery_id"]
    assert response.json()["delivery_id"] != crashed_delivery
    await WriteBehind.of(bus).settled()  # the claim's mark is written behind the answer
    stored = await (await bus.store(BUCKET_DEDUPE, DedupeRecord)).get(derive_id("dd", "ado-pr-review", PR_EVENT_ID))
    assert stored is not None
    assert stored.value.state == "published"


async def test_crash_after_publish_redelivery_republishes_the_same_ids(bus: Bus, triggers: list[TriggerConfig]) -> None:
    """Died after run.requested was acked but before the claim said so (the mark is written behind the
    answer: the process died with it queued): the 202 stood, since run.requested is stored; a copy of the
    event after the lease takes the claim over and its publish is deduplicated."""
    settings = Settings(max_body_bytes=MAX_BODY, retry_after_s=7, claim_lease_s=0.2)
    real_add = WriteBehind.add

    def dying(self: WriteBehind, writes: Sequence[Write], settle: Settle | None = None) -> None:
        if any(w.bucket == BUCKET_DEDUPE.name for w in writes):
            return  # the process is gone before the queued mark goes out
        real_add(self, writes, settle)

    app = create_app(settings, bus, triggers)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as c:
        with patch.object(WriteBehind, "add", dying):
            first = await post(c, fixture_bytes("pr-created.json"))
        assert first.status_code == 202
        await WriteBehind.of(bus).settled()  # the claim's mark is written behind the answer
        stored = await (await bus.store(BUCKET_DEDUPE, DedupeRecord)).get(derive_id("dd", "ado-pr-review", PR_EVENT_ID))
        assert stored is not None
        assert stored.value.state == "claimed"
    app = create_app(settings, bus, triggers)  # the replica that took over
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as c:
        response = await asyncio.wait_for(post(c, fixture_bytes("pr-created.json")), 10)
    assert response.status_code == 202
    assert response.json()["run_id"] == first.json()["run_id"]
    events = await journal(bus)
    assert types(events).count("run.requested") == 1  # Nats-Msg-Id = the derived id
    assert types(events).count("trigger.accepted") == 1


async def test_failed_publish_releases_the_claim_so_the_retry_need_not_wait(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    with events_not_acked("run.requested", TransientError("simulated: no ack")):
        refused = await post(client, fixture_bytes("pr-created.json"))
    assert refused.status_code == 503
    await WriteBehind.of(bus).settled()  # the claim's mark is written behind the answer
    stored = await (await bus.store(BUCKET_DEDUPE, DedupeRecord)).get(derive_id("dd", "ado-pr-review", PR_EVENT_ID))
    assert stored is not None
    assert stored.value.state == "released"
    # The sender's retry (lease 10 s in this app) is accepted at once, and still one run.
    retried = await asyncio.wait_for(post(client, fixture_bytes("pr-created.json")), 2)
    assert retried.status_code == 202
    assert types(await journal(bus)).count("run.requested") == 1


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
    nats_server.stop(hold_port=True)  # the outage lasts: no other test's server takes the port (and answers)

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


async def test_an_expired_dedupe_record_is_claimed_again(client: httpx.AsyncClient, bus: Bus) -> None:
    """``ttl_days`` shorter than the bucket's TTL: past its expiry the event is new again (same run id)."""
    store = await bus.store(BUCKET_DEDUPE, DedupeRecord)
    key = derive_id("dd", "ado-pr-review", PR_EVENT_ID)
    past = datetime.now(UTC) - timedelta(days=8)
    run_id = run_id_for_delivery("ado-pr-review", PR_EVENT_ID)
    old = DedupeRecord(
        trigger_id="ado-pr-review",
        source_event_id=PR_EVENT_ID,
        run_id=run_id,
        delivery_id="dlv-old",
        accepted_at=past,
        expires_at=past + timedelta(days=7),
    )
    await store.create(key, old)
    response = await post(client, fixture_bytes("pr-created.json"))
    assert response.status_code == 202
    assert response.json()["run_id"] == run_id
    await WriteBehind.of(bus).settled()  # the claim's mark is written behind the answer
    stored = await store.get(key)
    assert stored is not None
    assert stored.value.state == "published"
    assert stored.value.delivery_id == response.json()["delivery_id"]


async def test_a_takeover_lost_to_another_replica_is_a_duplicate_not_a_503(
    client: httpx.AsyncClient, bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas take over the same expired claim: the one whose compare-and-set loses reads the winner's
    claim again and answers ``duplicate`` (it was a 503: ``Launcher.io`` took the lost race for a bus failure)."""
    store = await bus.store(BUCKET_DEDUPE, DedupeRecord)
    key = derive_id("dd", "ado-pr-review", PR_EVENT_ID)
    now = datetime.now(UTC)
    run_id = run_id_for_delivery("ado-pr-review", PR_EVENT_ID)
    expired = DedupeRecord(
        trigger_id="ado-pr-review",
        source_event_id=PR_EVENT_ID,
        run_id=run_id,
        delivery_id="dlv-old",
        accepted_at=now - timedelta(days=8),
        expires_at=now - timedelta(days=1),
    )
    await store.create(key, expired)
    rival = expired.model_copy(
        update={
            "delivery_id": "dlv-rival",
            "state": "published",
            "accepted_at": now,
            "expires_at": now + timedelta(days=7),
        }
    )
    real_update = Store.update
    raced: list[str] = []

    async def racing(self: Store[Any], k: str, value: Any, revision: int, *, validated: bool = False) -> int:
        if k == key and not raced:
            raced.append(k)
            await real_update(self, k, rival, revision)  # the other replica's takeover lands first
        return await real_update(self, k, value, revision, validated=validated)

    monkeypatch.setattr(Store, "update", racing)
    response = await post(client, fixture_bytes("pr-created.json"))
    assert raced, "the takeover did not go through Store.update"
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "duplicate"
    assert types(await journal(bus)).count("run.requested") == 0  # the rival published it; this replica did not


async def test_a_record_written_before_claims_existed_reads_as_published(client: httpx.AsyncClient, bus: Bus) -> None:
    now = datetime.now(UTC)
    legacy = {
        "trigger_id": "ado-pr-review",
        "source_event_id": PR_EVENT_ID,
        "run_id": run_id_for_delivery("ado-pr-review", PR_EVENT_ID),
        "delivery_id": "dlv-legacy",
        "accepted_at": now.isoformat(),
        "expires_at": (now + timedelta(days=7)).isoformat(),
    }
    kv = await bus.js.key_value(BUCKET_DEDUPE.name)
    await kv.create(derive_id("dd", "ado-pr-review", PR_EVENT_ID), json.dumps(legacy).encode())
    response = await post(client, fixture_bytes("pr-created.json"))
    assert (response.status_code, response.json()["status"]) == (200, "duplicate")
    assert "run.requested" not in types(await journal(bus))
