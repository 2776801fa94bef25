"""The sources beyond Azure DevOps pull requests, over HTTP against a real nats-server: ``github``,
``gitlab``, ``generic`` (Standard Webhooks or bearer) and ``azure_devops.work_item``; each on the
project's own small fixtures and on the team's real payloads (skipped where ``../shared`` is absent)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_support import (
    BEARER_TOKEN,
    GITLAB_TOKEN,
    PASSWORD,
    basic,
    fixture_bytes,
    github_headers,
    journal,
    post,
    run_requested,
    standard_headers,
    types,
    webhook_request,
)

from temporality_bus import Bus
from temporality_protocol import RunRequested, TriggerRejected, run_id_for_delivery
from temporality_testing.fixtures import require_shared
from temporality_trigger_gateway import Settings, TriggerConfig, create_app
from temporality_trigger_gateway.adapters import ADAPTERS


@pytest.fixture
async def roomy(bus: Bus, triggers: list[TriggerConfig]) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway at its default body limit (1 MiB): real GitHub payloads are ~30 KB."""
    app = create_app(Settings(), bus, triggers)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as c:
        yield c


def _shared(folder: str) -> Path:
    path = require_shared() / "fixtures/webhooks" / folder
    if not path.is_dir():
        pytest.skip(f"{path} not present; real {folder} payloads not checked")
    return path


def _requested(events: list[Any]) -> list[RunRequested]:
    return [e.payload(RunRequested) for e in events if e.type == "run.requested"]


# --------------------------------------------------------------------------- github
async def test_github_pull_request_starts_a_run_keyed_by_the_delivery_id(client: httpx.AsyncClient, bus: Bus) -> None:
    raw = fixture_bytes("github-pr-opened.json")
    delivery = "6f1c2a40-fa8e-11ef-8f3c-7d2b1f0c9a11"
    response = await post(client, raw, trigger_id="gh-review", headers=github_headers(raw, "pull_request", delivery))
    assert response.status_code == 202, response.text
    assert response.json()["run_id"] == run_id_for_delivery("gh-review", delivery)
    data = await run_requested(bus)
    assert data.title == "PR #12 opened in tidewater/ledger: Cache exchange rates"
    assert data.event is not None
    assert data.event.id == delivery
    assert data.event.type == "github.pull_request.opened"
    assert data.event.source == "https://github.com/tidewater/ledger"
    assert data.event.tenant == "tidewater"
    assert data.event.actor is not None
    assert data.event.actor.id == "marta-k"
    assert data.input["pull_request"]["description"] == ""  # body: null
    assert data.input["source_branch"] == "feat/rate-cache"
    assert data.input["target_branch"] == "main"
    assert data.input["commits"]["source"] == "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"

    again = await post(client, raw, trigger_id="gh-review", headers=github_headers(raw, "pull_request", delivery))
    assert again.status_code == 200
    assert again.json()["status"] == "duplicate"


async def test_github_ping_is_answered_and_never_starts_a_run(client: httpx.AsyncClient, bus: Bus) -> None:
    raw = fixture_bytes("github-ping.json")
    response = await post(client, raw, trigger_id="gh-review", headers=github_headers(raw, "ping", str(uuid.uuid4())))
    assert response.status_code == 200
    assert response.json()["status"] == "ignored"
    events = await journal(bus)
    assert types(events) == ["trigger.received", "trigger.rejected"]
    assert events[1].payload(TriggerRejected).reason == "unsupported_event"


async def test_github_without_a_delivery_id_is_422(client: httpx.AsyncClient) -> None:
    raw = fixture_bytes("github-pr-opened.json")
    headers = github_headers(raw, "pull_request", "x")
    del headers["X-GitHub-Delivery"]
    response = await post(client, raw, trigger_id="gh-review", headers=headers)
    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["header", "X-GitHub-Delivery"]


async def test_real_github_payloads(roomy: httpx.AsyncClient, bus: Bus) -> None:
    folder = _shared("github")
    expected = {
        "octokit.pull_request.opened.payload.json": ("pull_request", "pull_request.opened"),
        "octokit.pull_request.opened.with-null-body.json": ("pull_request", "pull_request.opened"),
        "octokit.pull_request.synchronize.payload.json": ("pull_request", "pull_request.synchronize"),
        "octokit.pull_request.closed.payload.json": ("pull_request", "pull_request.closed"),
        "octokit.issues.opened.payload.json": ("issues", "issues.opened"),
        "octokit.push.payload.json": ("push", "push"),
        "octokit.push.1.payload.json": ("push", "push"),
        "octokit.push.with-new-branch.payload.json": ("push", "push"),
        "octokit.ping.payload.json": ("ping", "ping"),
    }
    accepted = 0
    for name, (header, event_type) in expected.items():
        raw = (folder / name).read_bytes()
        request = webhook_request(json.loads(raw), github_headers(raw, header, name), raw=raw)
        assert ADAPTERS["github"].identify(request).type == event_type
        response = await post(roomy, raw, trigger_id="gh-review", headers=github_headers(raw, header, name))
        if event_type == "ping":
            assert (response.status_code, response.json()["status"]) == (200, "ignored")
        else:
            assert response.status_code == 202, (name, response.text)
            accepted += 1
    requested = _requested(await journal(bus))
    assert len(requested) == accepted == 8
    titles = {r.title for r in requested}
    assert any(t.startswith("Issue #1 opened in Codertocat/Hello-World") for t in titles)
    assert any(t.startswith("PR #2 synchronize in Codertocat/Hello-World") for t in titles)


# --------------------------------------------------------------------------- gitlab
async def test_a_body_that_is_not_json_is_400_before_a_sources_header_checks(client: httpx.AsyncClient) -> None:
    """A source that reads no raw body itself gets it parsed by the API first: not JSON is a 400 even when
    the headers the source checks first are missing too (not their 422); the Azure DevOps PR source, which
    reads the raw body itself, answers it 400 alike."""
    raw = b"{not json"
    signed = github_headers(raw, "pull_request", "x")
    github = await post(client, raw, trigger_id="gh-review", headers=signed)
    unsigned_parts = {k: v for k, v in signed.items() if k not in ("X-GitHub-Delivery", "X-GitHub-Event")}
    no_headers = await post(client, raw, trigger_id="gh-review", headers=unsigned_parts)  # signed, no event headers
    ado = await post(client, raw)
    for response in (github, no_headers, ado):
        assert response.status_code == 400, response.text
        assert response.json()["error"] == "malformed_json"


async def test_gitlab_merge_request_and_push(client: httpx.AsyncClient, bus: Bus) -> None:
    token = {"X-Gitlab-Token": GITLAB_TOKEN}
    key = "d2c6bd3a-1f7e-4c59-9a83-0e4b5c6d7f80"
    mr = await post(
        client,
        fixture_bytes("gitlab-mr-open.json"),
        trigger_id="gl-review",
        headers={**token, "X-Gitlab-Event": "Merge Request Hook", "Idempotency-Key": key, "X-Gitlab-Event-UUID": "u-1"},
    )
    assert mr.status_code == 202, mr.text
    assert mr.json()["run_id"] == run_id_for_delivery("gl-review", key)  # Idempotency-Key first
    push = await post(
        client,
        fixture_bytes("gitlab-push.json"),
        trigger_id="gl-review",
        headers={**token, "X-Gitlab-Event": "Push Hook", "X-Gitlab-Event-UUID": "u-2"},
    )
    assert push.status_code == 202, push.text
    assert push.json()["run_id"] == run_id_for_delivery("gl-review", "u-2")
    by_type = {r.event.type: r for r in _requested(await journal(bus)) if r.event is not None}
    merge = by_type["gitlab.merge_request.open"]
    assert merge.title == "MR !4 open in harbor/billing: Round invoice totals once"
    assert merge.input["source_branch"] == "fix/rounding"
    assert merge.event is not None
    assert merge.event.tenant == "harbor"
    assert merge.event.actor is not None
    assert merge.event.actor.id == "jweber"
    assert by_type["gitlab.push"].input["branch"] == "main"
    assert by_type["gitlab.push"].input["commit_count"] == 1


async def test_gitlab_without_an_event_id_header_is_422(client: httpx.AsyncClient) -> None:
    response = await post(
        client, fixture_bytes("gitlab-push.json"), trigger_id="gl-review", headers={"X-Gitlab-Token": GITLAB_TOKEN}
    )
    assert response.status_code == 422
    assert "Idempotency-Key" in response.json()["detail"]


async def test_real_gitlab_payloads(roomy: httpx.AsyncClient, bus: Bus) -> None:
    folder = _shared("gitlab")
    outcomes = {}
    for path in sorted(folder.glob("*.json")):
        headers = {"X-Gitlab-Token": GITLAB_TOKEN, "X-Gitlab-Event-UUID": path.name}
        response = await post(roomy, path.read_bytes(), trigger_id="gl-review", headers=headers)
        outcomes[path.name] = (response.status_code, response.json()["status"])
    assert outcomes == {
        "go-gitlab.merge_request.json": (202, "accepted"),
        "go-gitlab.push.json": (202, "accepted"),
        "go-gitlab.issue.json": (200, "ignored"),
        "go-gitlab.note_merge_request.json": (200, "ignored"),
    }
    titles = sorted(r.title for r in _requested(await journal(bus)))
    assert titles == [
        "MR !1 open in gitlabhq/gitlab-test: MS-Viewport",
        "Push to refs/heads/master in mike/diaspora (4 commits)",
    ]


# --------------------------------------------------------------------------- generic
async def test_generic_signed_with_standard_webhooks(client: httpx.AsyncClient, bus: Bus) -> None:
    raw = fixture_bytes("generic-order.json")
    response = await post(client, raw, trigger_id="orders-signed", headers=standard_headers(raw, "msg_order_1001"))
    assert response.status_code == 202, response.text
    assert response.json()["run_id"] == run_id_for_delivery("orders-signed", "msg_order_1001")  # webhook-id
    data = await run_requested(bus)
    assert data.input == {"order_id": "ord-1001", "total": {"amount": "12.50", "currency": "EUR"}}
    assert data.event is not None
    assert data.event.type == "generic.order.created"
    assert data.event.tenant == "shop"
    # The same webhook-id re-signed later (a retry) is the same event.
    again = await post(client, raw, trigger_id="orders-signed", headers=standard_headers(raw, "msg_order_1001"))
    assert again.json()["status"] == "duplicate"


def _svix(headers: dict[str, str]) -> dict[str, str]:
    """Standard Webhooks headers under Svix's names (Clerk, Resend send ``svix-id`` etc.)."""
    return {k.replace("webhook-", "svix-"): v for k, v in headers.items()}


async def test_generic_signed_by_a_svix_sender_with_svix_headers(client: httpx.AsyncClient, bus: Bus) -> None:
    """An integrator review: Clerk's and Resend's ``svix-id``/``svix-timestamp``/``svix-signature`` got 401.
    They are the Standard Webhooks headers under another name (Svix's libraries read either): accepted, and
    ``svix-id`` is the event id, so a redelivery is a duplicate."""
    raw = fixture_bytes("generic-order.json")
    headers = _svix(standard_headers(raw, "msg_svix_1"))
    assert "svix-signature" in headers
    assert "webhook-signature" not in headers
    response = await post(client, raw, trigger_id="orders-signed", headers=headers)
    assert response.status_code == 202, response.text
    assert response.json()["run_id"] == run_id_for_delivery("orders-signed", "msg_svix_1")
    again = await post(client, raw, trigger_id="orders-signed", headers=_svix(standard_headers(raw, "msg_svix_1")))
    assert again.json()["status"] == "duplicate"
    forged = _svix(standard_headers(raw, "msg_svix_2", secret="whsec_" + base64.b64encode(b"x" * 24).decode()))
    refused = await post(client, raw, trigger_id="orders-signed", headers=forged)
    assert refused.status_code == 401
    assert "no svix-signature matches the body" in refused.text
    unsigned = await post(client, raw, trigger_id="orders-signed", headers={})
    assert unsigned.status_code == 401
    assert "webhook-id, webhook-timestamp and webhook-signature" in unsigned.text
    assert "svix-id, svix-timestamp and svix-signature" in unsigned.text


async def test_generic_with_a_bearer_token_and_the_body_id(client: httpx.AsyncClient, bus: Bus) -> None:
    body = {"id": "evt-77", "type": "order.created", "order_id": "ord-77"}
    auth = {"Authorization": f"Bearer {BEARER_TOKEN}"}
    response = await post(client, body, trigger_id="orders-bearer", headers=auth)
    assert response.status_code == 202, response.text
    assert response.json()["run_id"] == run_id_for_delivery("orders-bearer", "evt-77")
    assert (await run_requested(bus)).input == {"order_id": "ord-77"}
    other = await post(client, {"id": "evt-78", "type": "order.cancelled"}, trigger_id="orders-bearer", headers=auth)
    assert other.json()["status"] == "ignored"
    no_id = await post(client, {"type": "order.created"}, trigger_id="orders-bearer", headers=auth)
    assert no_id.status_code == 422


# --------------------------------------------------------------------------- azure_devops.work_item
async def test_work_item_update_with_bom_and_workitemid_zero(client: httpx.AsyncClient, bus: Bus) -> None:
    raw = fixture_bytes("ado-workitem-updated-bom.json")
    assert raw.startswith(b"\xef\xbb\xbf")
    response = await post(client, raw, trigger_id="ado-work-items")
    assert response.status_code == 202, response.text
    data = await run_requested(bus)
    assert data.input["work_item"]["id"] == 41  # resource.revision.id, not workItemId 0 nor the update id 3
    assert data.input["changes"]["System.State"] == {"old": "New", "new": "Active"}
    assert data.input["changed_by"] == "Omar Haddad"
    assert data.title == "User Story #41 updated: Refunds: café receipts in €"
    assert data.event is not None
    assert data.event.source == "https://dev.azure.com/contoso/"
    assert data.event.tenant == "Contoso"
    assert data.event.metadata["update_id"] == "3"


def test_work_item_update_without_a_revision_reads_the_id_from_its_url_else_null() -> None:
    """A Minimal update has no revision and may have workItemId 0: the id in its URL, else ``null`` (not 422)."""
    body = json.loads(fixture_bytes("ado-workitem-updated-bom.json").decode("utf-8-sig"))
    del body["resource"]["revision"]
    adapter = ADAPTERS["azure_devops.work_item"]
    event = adapter.normalize(webhook_request(body), tenant=None)
    assert event.payload["work_item"]["id"] == 41  # .../workItems/41/updates/3
    del body["resource"]["url"]
    event = adapter.normalize(webhook_request(body), tenant=None)
    assert event.payload["work_item"]["id"] is None
    assert event.source_link is None
    assert adapter.run_title(event).startswith("Work item updated")


async def test_real_work_item_payloads(roomy: httpx.AsyncClient, bus: Bus) -> None:
    folder = _shared("azure-devops")
    files = sorted(folder.glob("*.workitem.*.json"))
    assert len(files) >= 5
    run_ids = set()
    for path in files:
        response = await post(roomy, path.read_bytes(), trigger_id="ado-work-items", headers=basic(password=PASSWORD))
        assert response.status_code in (200, 202), (path.name, response.text)
        if path.name.startswith("aspnet-"):  # the Test button's sample events (subscriptionId all zeros)
            assert (response.json()["status"], response.json()["reason"]) == ("ignored", "test_notification")
            # the same sample as a real subscription's delivery: it starts a run
            real = json.loads(path.read_bytes().decode("utf-8-sig"))
            real["subscriptionId"] = "4c1d2e3f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
            response = await post(roomy, json.dumps(real).encode(), "ado-work-items", headers=basic(password=PASSWORD))
        assert response.json()["status"] in ("accepted", "duplicate"), (path.name, response.text)
        run_ids.add(response.json()["run_id"])
    pr = await post(roomy, (folder / "docs2018.git.pullrequest.created.json").read_bytes(), trigger_id="ado-work-items")
    assert pr.json()["status"] == "ignored"
    requested = _requested(await journal(bus))
    assert len(requested) == len(run_ids) == 5  # both publications share the event ids: one run each
    assert {r.input["work_item"]["id"] for r in requested} == {5}  # workitem.updated: revision.id
    actions = {r.input["action"]: r for r in requested}
    assert set(actions) == {"created", "updated", "commented", "deleted", "restored"}
    assert actions["commented"].input["comment"] == "This is a great new idea"
    assert actions["updated"].input["changes"]["System.State"] == {"old": "New", "new": "Approved"}
    assert actions["updated"].input["work_item"]["title"] == "Some great new idea!"
