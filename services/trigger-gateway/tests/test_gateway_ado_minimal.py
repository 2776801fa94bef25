"""Azure DevOps PR hooks with "Resource details to send: Minimal" or "None" (docs/webhook-senders.md).

An integrator review found them answered 422 ``invalid_payload`` (no repository, title, createdBy, branches):
Azure DevOps retries such a delivery and puts the subscription on probation. They are accepted, start their
run with the missing fields ``null`` in its input, get a title from the event's message, and a retry is still
answered ``duplicate`` (the event GUID is the dedupe id, as for a full payload).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_support import fixture_json, journal, post, run_requested, types, webhook_request

from temporality_bus import Bus
from temporality_protocol import run_id_for_delivery
from temporality_trigger_gateway.adapters import AzureDevOpsPullRequest

EVENT_ID = "0d7c2f3e-6b1a-4c5d-9e8f-1a2b3c4d5e6f"
PR_URL = (
    "https://contoso.visualstudio.com/DefaultCollection/_apis/git/repositories/"
    "9e3c4b1a-7d2f-4c6e-8a5b-1f0e2d3c4b5a/pullRequests/7"
)
SHARED = Path("/work/shared/fixtures/webhooks/azure-devops/docs2018.git.pullrequest.created.json")

NULL_REPOSITORY = {"id": None, "name": None, "url": None, "project": None}


def _body(resource: Any, *, message: bool = True) -> dict[str, Any]:
    body = fixture_json("pr-created.json")
    body["id"] = EVENT_ID
    if not message:
        del body["message"]
    if resource == "absent":
        del body["resource"]
    else:
        body["resource"] = resource
    return body


@pytest.mark.parametrize(
    ("resource", "pr_id", "title"),
    [
        pytest.param(
            {"pullRequestId": 7, "url": PR_URL},
            7,
            "Review PR #7: Rosa Marquez created a new pull request",
            id="minimal",
        ),
        pytest.param(
            {"pullRequestId": 7, "url": PR_URL, "repository": {"id": "9e3c4b1a-7d2f-4c6e-8a5b-1f0e2d3c4b5a"}},
            7,
            "Review PR #7: Rosa Marquez created a new pull request",
            id="minimal-with-bare-repository",
        ),
        pytest.param(None, None, "Review a pull request: Rosa Marquez created a new pull request", id="none-null"),
        pytest.param(
            "absent", None, "Review a pull request: Rosa Marquez created a new pull request", id="none-absent"
        ),
    ],
)
async def test_minimal_and_no_resource_start_a_run_with_nulls(
    client: httpx.AsyncClient, bus: Bus, resource: Any, pr_id: int | None, title: str
) -> None:
    response = await post(client, _body(resource))
    assert response.status_code == 202, response.text
    run_id = run_id_for_delivery("ado-pr-review", EVENT_ID)
    assert response.json()["run_id"] == run_id

    requested = await run_requested(bus)
    assert requested.title == title
    data = requested.input
    assert data["pull_request"]["id"] == pr_id
    assert data["pull_request"]["title"] is None
    assert data["pull_request"]["url"] == (PR_URL if pr_id else None)
    assert data["source_branch"] is None
    assert data["target_branch"] is None
    assert data["author"] is None
    assert data["reviewers"] == []
    repository = data["repository"]
    assert repository["name"] is None
    assert repository["url"] is None
    assert repository["project"] is None
    assert requested.event is not None
    assert requested.event.id == EVENT_ID
    assert requested.event.actor is None
    assert requested.event.tenant == "fabrikam"  # the trigger's

    retry = await post(client, _body(resource))  # Azure DevOps resends the same event id
    assert retry.status_code == 200, retry.text
    assert retry.json()["status"] == "duplicate"
    assert retry.json()["run_id"] == run_id
    assert types(await journal(bus)).count("run.requested") == 1


async def test_no_resource_and_no_message_titles_the_run_with_the_event_type(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    response = await post(client, _body(None, message=False), trigger_id="ado-pr-all")
    assert response.status_code == 202, response.text
    requested = await run_requested(bus)
    assert requested.title == "Review a pull request: git.pullrequest.created"
    assert requested.input["repository"] == NULL_REPOSITORY
    assert requested.event is not None
    assert requested.event.tenant is None


async def test_a_full_payload_keeps_its_title_and_no_message_metadata() -> None:
    event = AzureDevOpsPullRequest().normalize(webhook_request(fixture_json("pr-created.json")), tenant=None)
    assert AzureDevOpsPullRequest().run_title(event) == "Review PR #7: Retry idempotent refunds"
    assert "message" not in event.metadata


async def test_a_resource_without_a_pull_request_id_is_still_422(client: httpx.AsyncClient) -> None:
    response = await post(client, _body({"url": PR_URL}))
    assert response.status_code == 422, response.text
    assert ["resource", "pullRequestId"] in [e["loc"] for e in response.json()["errors"]]


@pytest.mark.skipif(not SHARED.is_file(), reason=f"the shared Azure DevOps fixture {SHARED} is absent")
async def test_the_shared_sample_cut_to_minimal_is_accepted(client: httpx.AsyncClient, bus: Bus) -> None:
    body = json.loads(SHARED.read_bytes().decode("utf-8-sig"))  # noqa: ASYNC240 -- a small file, once
    resource = body["resource"]
    body["resource"] = {"pullRequestId": resource["pullRequestId"], "url": resource["url"]}
    response = await post(client, body, trigger_id="ado-pr-all")
    assert response.status_code == 202, response.text
    requested = await run_requested(bus)
    assert requested.title == f"Review PR #{resource['pullRequestId']}: {body['message']['text']}"
    assert requested.event is not None
    assert requested.event.source.startswith("https://")


# --------------------------------------------------------------------------- work items (azure_devops.work_item)
WI_EVENT_ID = "6e2b9c1d-4a7f-4e3b-8c5d-2f1a0b9c8d7e"
WI_URL = "https://dev.azure.com/contoso/_apis/wit/workItems/41"
WI_MESSAGE = "Bug #41 (Refunds double-charge) created by Omar Haddad"


def _work_item(event_type: str, resource: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": WI_EVENT_ID,
        "eventType": event_type,
        "publisherId": "tfs",
        "message": {"text": WI_MESSAGE},
        "resourceContainers": {"collection": {"id": "c1", "baseUrl": "https://dev.azure.com/contoso/"}},
        "createdDate": "2026-12-07T09:00:00Z",
    }
    if resource != "absent":
        body["resource"] = resource
    return body


@pytest.mark.parametrize(
    ("event_type", "resource", "item_id", "title"),
    [
        pytest.param(
            "workitem.created",
            {"id": 41, "rev": 1, "url": WI_URL},
            41,
            f"Work item #41 created: {WI_MESSAGE}",
            id="created-minimal",
        ),
        pytest.param(
            "workitem.updated",
            {"id": 3, "workItemId": 41, "rev": 3, "url": f"{WI_URL}/updates/3"},
            41,
            f"Work item #41 updated: {WI_MESSAGE}",
            id="updated-minimal",
        ),
        pytest.param(
            "workitem.updated",
            {"id": 3, "workItemId": 0, "rev": 3, "url": f"{WI_URL}/updates/3"},
            41,
            f"Work item #41 updated: {WI_MESSAGE}",
            id="updated-minimal-id-in-url-only",
        ),
        pytest.param("workitem.created", None, None, f"Work item created: {WI_MESSAGE}", id="none-null"),
        pytest.param("workitem.commented", "absent", None, f"Work item commented: {WI_MESSAGE}", id="none-absent"),
    ],
)
async def test_work_item_minimal_and_no_resource_start_a_run_with_nulls(
    client: httpx.AsyncClient, bus: Bus, event_type: str, resource: Any, item_id: int | None, title: str
) -> None:
    """A work item subscription set to Minimal or None is accepted like a PR one: 202, nulls, a title from the
    message, and a retry answered ``duplicate`` (no second run)."""
    response = await post(client, _work_item(event_type, resource), trigger_id="ado-work-items")
    assert response.status_code == 202, response.text
    run_id = run_id_for_delivery("ado-work-items", WI_EVENT_ID)
    assert response.json()["run_id"] == run_id

    requested = await run_requested(bus)
    assert requested.title == title
    item = requested.input["work_item"]
    assert item["id"] == item_id
    assert item["title"] is None
    assert item["type"] is None
    assert requested.input["changes"] == {}
    assert requested.event is not None
    assert requested.event.source == "https://dev.azure.com/contoso/"
    assert (requested.event.source_link is not None) == (item_id is not None)

    retry = await post(client, _work_item(event_type, resource), trigger_id="ado-work-items")
    assert retry.status_code == 200, retry.text
    assert retry.json()["status"] == "duplicate"
    assert types(await journal(bus)).count("run.requested") == 1
