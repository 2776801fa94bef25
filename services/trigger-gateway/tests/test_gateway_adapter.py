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
from gateway_support import fixture_bytes, fixture_json, journal, post, types, webhook_request

from temporality_bus import Bus
from temporality_protocol import RunRequested
from temporality_testing.fixtures import require_shared
from temporality_trigger_gateway.adapters import ADAPTERS, AzureDevOpsPullRequest, WebhookRequest
from temporality_trigger_gateway.adapters.azure_devops import MEMO_KEY, PR_EVENT_TYPES
from temporality_trigger_gateway.adapters.base import UNPARSED
from temporality_trigger_gateway.errors import InvalidPayload, MalformedBody

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
    """PR events start runs (one per event id); every other event is ignored, and so is every Azure DevOps sample
    event (the aspnet-* files: Microsoft's receiver tests captured the *Test* button's deliveries, subscriptionId
    all zeros), whatever its type: a test notification."""
    expected_runs: set[str] = set()
    for path in _shared_azure():
        body = _load(path)
        response = await post(client, path.read_bytes(), trigger_id="ado-pr-all")  # raw bytes, BOMs included
        if body.get("subscriptionId") == "00000000-0000-0000-0000-000000000000":
            assert response.status_code == 200, (path.name, response.text)
            assert response.json() == {**response.json(), "status": "ignored", "reason": "test_notification"}
        elif ".git.pullrequest." in path.name:
            assert response.status_code in (200, 202), (path.name, response.text)
            assert response.json()["status"] in ("accepted", "duplicate"), path.name
            expected_runs.add(response.json()["run_id"])
        else:
            assert response.status_code == 200, (path.name, response.text)
            assert response.json() == {**response.json(), "status": "ignored", "reason": "unsupported_event"}
            assert body["eventType"] not in PR_EVENT_TYPES
    events = await journal(bus)
    # docs2018-* publish the three PR events aspnet-* send as test notifications (same ids): three runs
    assert len(expected_runs) == 3
    assert types(events).count("run.requested") == 3


@pytest.mark.parametrize(
    ("field", "url"),
    [
        ("url", "https://[x/_apis/git/repositories/r"),  # urlsplit: ValueError (Invalid IPv6 URL)
        ("remoteUrl", "https://[x/_git/r"),
        ("remoteUrl", "https://org@[x/_git/r"),
        ("url", "https://[x/" + "a" * 3000),  # longer than the URL caches take: worked out, not kept
        ("remoteUrl", "https://[x/" + "a" * 3000),
    ],
    ids=["url", "remoteUrl", "remoteUrl-user", "url-long", "remoteUrl-long"],
)
async def test_a_repository_url_urlsplit_refuses_is_accepted_without_a_link(
    client: httpx.AsyncClient, bus: Bus, field: str, url: str
) -> None:
    """A PR whose repository ``url`` or ``remoteUrl`` is no URL ``urlsplit`` can read (``https://[x/…``) is a
    valid event: 202 and journaled (never a 500 that journals nothing); the event's source is that ``url`` as
    is, and no link is built from a ``remoteUrl`` like it."""
    body = fixture_json("pr-created.json")
    repository = body["resource"]["repository"]
    repository.pop("webUrl", None)
    body["resource"].pop("_links", None)
    repository[field] = url
    response = await post(client, body)
    assert response.status_code == 202, response.text
    (requested,) = [e for e in await journal(bus) if e.type == "run.requested"]
    event = requested.payload(RunRequested).event  # the event the run is about
    assert event is not None
    if field == "url":
        assert event.source == url
    else:
        assert event.source_link is None


async def test_a_work_item_url_urlsplit_refuses_is_accepted(client: httpx.AsyncClient, bus: Bus) -> None:
    """The work item source shares the origin helper: its ``url`` ``urlsplit`` refuses is the source as is."""
    body = fixture_json("ado-workitem-updated-bom.json")
    body.pop("resourceContainers", None)
    body["resource"]["url"] = body["resource"]["revision"]["url"] = "https://[x/_apis/wit/workItems/41"
    response = await post(client, body, trigger_id="ado-work-items")
    assert response.status_code == 202, response.text
    assert "trigger.accepted" in types(await journal(bus))


# --------------------------------------------------------------------------- the one-pass path (raw bytes)
def _raw_request(raw: bytes) -> WebhookRequest:
    """A delivery as the API hands it on: the raw body, not parsed (the adapter reads it in one pass)."""
    return WebhookRequest("POST", httpx.Headers({}), raw)


def _general_request(raw: bytes) -> WebhookRequest:
    """The same delivery forced onto the general path (parse_json, then validation of the Python values)."""
    return WebhookRequest("POST", httpx.Headers({}), raw, memo={MEMO_KEY: None})


def _outcome(request: WebhookRequest) -> Any:
    """What the adapter makes of ``request``: its id/type and normalized event, or the refusal as answered."""
    try:
        source = ADAPTER.identify(request)
        event = ADAPTER.normalize(request, tenant=None)
    except (InvalidPayload, MalformedBody) as exc:
        return type(exc).__name__, exc.status, exc.detail, getattr(exc, "errors", None)
    dumped = event.model_dump(mode="json")
    if b"creationDate" not in request.body and b"createdDate" not in request.body:
        dumped.pop("timestamp")  # the time of the call (no date in the body)
    return source, dumped


def _pr_bodies() -> list[bytes]:
    ours = [fixture_bytes("pr-created.json"), fixture_bytes("pr-created-bom.json"), fixture_bytes("git-push.json")]
    try:
        shared = [p.read_bytes() for p in _shared_azure()]
    except pytest.skip.Exception:
        shared = []
    return ours + shared


def test_the_one_pass_path_makes_the_same_event_as_the_general_one() -> None:
    """Parsed and validated from the raw bytes (pydantic-core, one pass), a body gives the same id, type and
    normalized event -- or the same refusal -- as parse_json followed by validation: every PR payload we have,
    with and without a BOM, and the non-PR ones (refused by normalize alike)."""
    bodies = _pr_bodies()
    assert len(bodies) >= 3
    for raw in bodies:
        fast, general = _raw_request(raw), _general_request(raw)
        assert _outcome(fast) == _outcome(general), raw[:80]
        if b"pullrequest" in raw and ADAPTER.identify(fast).type in PR_EVENT_TYPES:
            assert fast.memo[MEMO_KEY] is not None  # it did take the one-pass path
            assert fast.parsed is UNPARSED  # and never built the Python values
    bom = b"\xef\xbb\xbf" + fixture_bytes("pr-created.json").removeprefix(b"\xef\xbb\xbf")
    assert _outcome(_raw_request(bom)) == _outcome(_general_request(bom))


@pytest.mark.parametrize(
    "change",
    [
        lambda body: b"{not json" + body,  # not JSON
        lambda body: body[:-40],  # cut short
        lambda body: body.replace(b'"eventType"', b'"ignored": "\\ud800", "eventType"', 1),  # lone surrogate
        lambda body: body.replace(b'"eventType"', b'"ignored": NaN, "eventType"', 1),  # not a JSON value
        lambda body: body.replace(b'"eventType"', b'"ignored": -Infinity, "eventType"', 1),
        lambda body: body.replace(b'"eventType"', b'"ignored": "\xff", "eventType"', 1),  # not UTF-8
        lambda body: body.replace(b'"eventType"', b'"ignored": ' + b"[" * 300 + b"]" * 300 + b', "eventType"', 1),
        lambda body: body.replace(b'"eventType"', b'"ignored": ' + b"[" * 5000 + b"]" * 5000 + b', "eventType"', 1),
        lambda body: body.replace(b'"eventType"', b'"ignored": ' + b"7" * 5000 + b', "eventType"', 1),  # int too long
        lambda body: body.replace(b'"pullRequestId": 7', b'"pullRequestId": 7e999999', 1),  # read: no float holds it
        lambda body: body.replace(b'"pullRequestId": 7', b'"pullRequestId": 0', 1),  # invalid shape
        lambda body: body.replace(b'"sourceRefName"', b'"sourceRefNameX"', 1),  # missing field
        lambda body: body.replace(b'"git.pullrequest.created"', b'"git.push"', 1),  # not a PR event
        lambda body: body.replace(b'"eventType"', b'"eventType": "x", "eventType"', 1),  # duplicate key: the last
        lambda body: body.replace(b'"title": "', b'"title": "\\u00e9\\ud83d\\ude00 \\" ', 1),  # escapes, a pair
        lambda body: b"  \r\n" + body + b"\n\t ",  # blanks around
        lambda body: body + b" []",  # data after the value
    ],
)
def test_the_one_pass_path_answers_every_odd_body_as_the_general_one(change: Any) -> None:
    """An odd body gets the same answer (the same event, or the same refusal: 400 or 422, its detail and
    errors) whichever path reads it: the one-pass path hands anything it cannot take as is to the general
    one, which decides and words it."""
    body = fixture_bytes("pr-created.json").removeprefix(b"\xef\xbb\xbf")
    raw = change(body)
    assert raw != body
    assert _outcome(_raw_request(raw)) == _outcome(_general_request(raw))


def test_an_unreadable_float_in_a_field_the_event_does_not_read_is_dropped_with_it() -> None:
    """The one difference, documented: a number no float holds (``1e999999``) where the event reads nothing
    is dropped with the rest of what it does not read (the general path refuses it, 400); the event is the
    one the body without it makes."""
    body = fixture_bytes("pr-created.json").removeprefix(b"\xef\xbb\xbf")
    raw = body.replace(b'"eventType"', b'"ignored": 1e999999, "eventType"', 1)
    assert _outcome(_raw_request(raw)) == _outcome(_general_request(body))
    assert _outcome(_general_request(raw))[0] == "MalformedJson"
