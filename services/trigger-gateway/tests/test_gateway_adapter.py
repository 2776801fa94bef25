"""The ``azure_devops.pull_request`` adapter, on our own fixtures and on the team's real payloads.

Decision for events that are not pull requests (git.push, workitem.*, build.complete): they are
well-formed Azure DevOps events, so the gateway *ignores* them by ``eventType`` (200 + a journaled
``trigger.rejected(unsupported_event)``) rather than answering 422 — a failing answer would make
Azure DevOps retry them and eventually put the subscription on probation. A trigger cannot even
list them: the config refuses event types its adapter cannot handle. Only bodies that are not an
Azure DevOps event at all (no id / eventType / resource) or PR events missing what the mapping
needs get 422. Called directly, :meth:`normalize` still refuses a non-PR event (422).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_support import fixture_json, journal, post, types, webhook_request

from temporality_bus import Bus
from temporality_testing.fixtures import require_shared
from temporality_trigger_gateway.adapters import ADAPTERS, AzureDevOpsPullRequest
from temporality_trigger_gateway.adapters.azure_devops import PR_EVENT_TYPES
from temporality_trigger_gateway.errors import InvalidPayload

ADAPTER = AzureDevOpsPullRequest()
PAYLOAD_KEYS = {
    "repository",
    "pull_request",
    "source_branch",
    "target_branch",
    "author",
    "reviewers",
    "commits",
}


def _shared_azure() -> list[Path]:
    files = sorted((require_shared() / "fixtures/webhooks/azure-devops").glob("*.json"))
    if not files:
        pytest.skip("../shared/fixtures/webhooks/azure-devops has no *.json files")
    return files


def _load(path: Path) -> Any:
    return json.loads(path.read_bytes().decode("utf-8-sig"))


def test_registry_names_the_adapter() -> None:
    assert (
        ADAPTERS["azure_devops.pull_request"].event_types
        == PR_EVENT_TYPES
        == {
            "git.pullrequest.created",
            "git.pullrequest.updated",
            "git.pullrequest.merged",
        }
    )


def test_missing_optional_fields_normalize_to_defaults() -> None:
    body = fixture_json("pr-created.json")
    resource = body["resource"]
    for key in ("description", "status", "url", "creationDate", "reviewers", "lastMergeSourceCommit"):
        resource.pop(key, None)
    del body["createdDate"]
    before = datetime.now(UTC)
    event = ADAPTER.normalize(webhook_request(body), tenant=None)
    assert event.timestamp >= before  # no date at all: now
    assert event.payload["pull_request"]["description"] == ""
    assert event.payload["pull_request"]["created_at"] is None
    assert event.payload["reviewers"] == []
    assert event.payload["commits"] == {"source": None, "target": None}


def test_timestamp_falls_back_to_created_date_and_naive_dates_are_utc() -> None:
    body = fixture_json("pr-created.json")
    del body["resource"]["creationDate"]
    body["createdDate"] = "2024-11-05T08:30:01"
    event = ADAPTER.normalize(webhook_request(body), tenant=None)
    assert event.timestamp == datetime(2024, 11, 5, 8, 30, 1, tzinfo=UTC)


def test_actor_falls_back_to_the_identity_id() -> None:
    body = fixture_json("pr-created.json")
    del body["resource"]["createdBy"]["uniqueName"]
    event = ADAPTER.normalize(webhook_request(body), tenant="t")
    assert event.actor is not None
    assert event.actor.id == "2c9d7e1f-0a3b-4c5d-8e6f-7a8b9c0d1e2f"
    assert event.tenant == "t"


def test_normalize_refuses_a_non_pr_event() -> None:
    with pytest.raises(InvalidPayload):
        ADAPTER.normalize(webhook_request(fixture_json("git-push.json")), tenant=None)


def test_real_pull_request_payloads_normalize() -> None:
    files = [p for p in _shared_azure() if ".git.pullrequest." in p.name]
    assert {p.name.split(".", 1)[1] for p in files} >= {
        "git.pullrequest.created.json",
        "git.pullrequest.updated.json",
        "git.pullrequest.merged.json",
    }
    for path in files:
        body = _load(path)
        source = ADAPTER.identify(webhook_request(body))
        assert source.id == body["id"], path.name
        event = ADAPTER.normalize(webhook_request(body), tenant=None)
        assert event.id == body["id"]
        assert event.type == f"azure_devops.{body['eventType']}"
        assert event.source == "https://fabrikam.visualstudio.com"  # collection has no baseUrl in these
        assert event.tenant == "Fabrikam"
        assert event.actor is not None
        assert event.actor.id == "fabrikamfiber4@hotmail.com"
        assert event.actor.display_name == "Jamal Hartnett"
        assert set(event.payload) == PAYLOAD_KEYS
        assert event.payload["pull_request"]["id"] == 1
        assert event.payload["pull_request"]["description"] == " - test2\r\n"
        assert event.payload["source_branch"] == "mytopic"
        assert event.payload["target_branch"] == "master"
        assert event.payload["commits"]["source"] == "53d54ac915144006c2c9e90d2c7d3880920db49c"
        assert event.payload["reviewers"][0]["display_name"] == "[Mobile]\\Mobile Team"
        assert json.loads(json.dumps(event.payload)) == event.payload
        # notificationId repeats across files, so it is metadata only, never the event id
        if "notificationId" in body:
            assert event.metadata["notification_id"] == str(body["notificationId"])
        else:
            assert "notification_id" not in event.metadata
        if "resourceContainers" not in body:
            assert "resource_version" not in event.metadata
    statuses = {
        p.name: ADAPTER.normalize(webhook_request(_load(p)), tenant=None).payload["pull_request"]["status"]
        for p in files
    }
    assert statuses["docs2018.git.pullrequest.created.json"] == "active"
    assert statuses["docs2018.git.pullrequest.updated.json"] == "completed"


async def test_real_payloads_through_the_gateway(client: httpx.AsyncClient, bus: Bus) -> None:
    """PR events start runs (one per event id across both publications); every other event is ignored."""
    expected_runs: set[str] = set()
    for path in _shared_azure():
        body = _load(path)
        response = await post(client, path.read_bytes(), trigger_id="ado-pr-all")  # raw bytes, BOMs included
        if ".git.pullrequest." in path.name:
            assert response.status_code in (200, 202), (path.name, response.text)
            assert response.json()["status"] in ("accepted", "duplicate"), path.name
            expected_runs.add(response.json()["run_id"])
        else:
            assert response.status_code == 200, (path.name, response.text)
            assert response.json() == {**response.json(), "status": "ignored", "reason": "unsupported_event"}
            assert body["eventType"] not in PR_EVENT_TYPES
    events = await journal(bus)
    # aspnet-* and docs2018-* publish the same three events (same ids): three runs, not six
    assert len(expected_runs) == 3
    assert types(events).count("run.requested") == 3
