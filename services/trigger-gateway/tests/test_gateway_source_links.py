"""Each webhook source puts its *web* link into the normalized event (HUM-5: the question a person gets is
one tap from the PR / work item): ``NormalizedEvent.source_link``, only an absolute http(s) URL; a source
whose link is missing or not a web URL is still normalized, without one. Through the gateway the link is
in ``run.requested.event`` (also when the event's payload is omitted there because it is the input)."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
from gateway_support import fixture_bytes, fixture_json, post, run_requested, webhook_request

from temporality_bus import Bus
from temporality_protocol import NormalizedEvent, SourceLink, is_web_url
from temporality_trigger_gateway.adapters import ADAPTERS


def _link(adapter: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> SourceLink | None:
    return ADAPTERS[adapter].normalize(webhook_request(body, headers), tenant=None).source_link


GITHUB = {"X-GitHub-Event": "pull_request", "X-GitHub-Delivery": "d-1"}
GITLAB = {"Idempotency-Key": "k-1"}


# --------------------------------------------------------------------------- azure devops
def test_azure_devops_pr_links_to_its_web_page_from_the_repository_clone_url() -> None:
    link = _link("azure_devops.pull_request", fixture_json("pr-created.json"))
    assert link == SourceLink(
        href="https://contoso.visualstudio.com/DefaultCollection/_git/payments-api/pullrequest/7",
        label="PR #7 in payments-api",
    )


def test_azure_devops_pr_prefers_links_web_then_web_url_and_drops_the_clone_url_s_user() -> None:
    body = fixture_json("pr-created.json")
    with_links = copy.deepcopy(body)
    with_links["resource"]["_links"] = {"web": {"href": "https://dev.azure.com/contoso/Contoso/_git/p/pullrequest/7"}}
    assert _link("azure_devops.pull_request", with_links) == SourceLink(
        href="https://dev.azure.com/contoso/Contoso/_git/p/pullrequest/7", label="PR #7 in payments-api"
    )
    web_url = copy.deepcopy(body)
    web_url["resource"]["repository"]["webUrl"] = "https://dev.azure.com/contoso/Contoso/_git/payments-api/"
    link = _link("azure_devops.pull_request", web_url)
    assert link is not None
    assert link.href == "https://dev.azure.com/contoso/Contoso/_git/payments-api/pullrequest/7"
    with_user = copy.deepcopy(body)
    with_user["resource"]["repository"]["remoteUrl"] = "https://contoso@dev.azure.com/contoso/Contoso/_git/payments-api"
    link = _link("azure_devops.pull_request", with_user)
    assert link is not None
    assert link.href == "https://dev.azure.com/contoso/Contoso/_git/payments-api/pullrequest/7"


def test_azure_devops_work_item_links_to_its_edit_page_or_its_links_html() -> None:
    body = fixture_json("ado-workitem-updated-bom.json")
    link = _link("azure_devops.work_item", body)
    assert link is not None
    assert link.href == "https://dev.azure.com/contoso/_workitems/edit/41"
    assert link.label is not None
    assert "#41" in link.label
    html = copy.deepcopy(body)
    html["resource"]["_links"] = {"html": {"href": "https://dev.azure.com/contoso/Contoso/_workitems/edit/41"}}
    link = _link("azure_devops.work_item", html)
    assert link is not None
    assert link.href == "https://dev.azure.com/contoso/Contoso/_workitems/edit/41"


# --------------------------------------------------------------------------- github, gitlab, mindmap
def test_github_pull_request_issue_and_push_links() -> None:
    pr = fixture_json("github-pr-opened.json")
    assert _link("github", pr, GITHUB) == SourceLink(
        href="https://github.com/tidewater/ledger/pull/12", label="PR #12 in tidewater/ledger"
    )
    issue = {
        "action": "opened",
        "issue": {
            "number": 3,
            "title": "Refunds fail",
            "html_url": "https://github.com/tidewater/ledger/issues/3",
            "user": {"login": "marta-k"},
        },
        "repository": pr["repository"],
        "sender": pr["sender"],
    }
    link = _link("github", issue, {**GITHUB, "X-GitHub-Event": "issues"})
    assert link == SourceLink(href="https://github.com/tidewater/ledger/issues/3", label="Issue #3 in tidewater/ledger")
    push = {
        "ref": "refs/heads/main",
        "before": "a" * 40,
        "after": "b" * 40,
        "compare": "https://github.com/tidewater/ledger/compare/aaaa...bbbb",
        "repository": pr["repository"],
        "sender": pr["sender"],
    }
    link = _link("github", push, {**GITHUB, "X-GitHub-Event": "push"})
    assert link == SourceLink(
        href="https://github.com/tidewater/ledger/compare/aaaa...bbbb", label="Push to main in tidewater/ledger"
    )


def test_gitlab_merge_request_and_push_links() -> None:
    link = _link("gitlab", fixture_json("gitlab-mr-open.json"), GITLAB)
    assert link == SourceLink(
        href="https://gitlab.example/harbor/billing/-/merge_requests/4", label="MR !4 in harbor/billing"
    )
    link = _link("gitlab", fixture_json("gitlab-push.json"), GITLAB)
    assert link is not None
    assert link.href == "https://gitlab.example/harbor/billing/-/commit/2222222"  # the pushed head commit
    assert link.label == "Push to main in harbor/billing"


def test_mindmap_links_to_the_map() -> None:
    link = _link("mindmap.test_case", fixture_json("mindmap-test-case.json"))
    assert link == SourceLink(href="https://mindmap.example/maps/map-checkout", label="Test case TC-17 in Checkout")


@pytest.mark.parametrize(
    "href", ["javascript:alert(document.cookie)", "file:///etc/passwd", "https://u:p@github.com/x/y/pull/12", "n/a"]
)
def test_a_link_that_is_not_a_web_url_is_left_out_and_the_event_still_normalizes(href: str) -> None:
    pr = fixture_json("github-pr-opened.json")
    pr["pull_request"]["html_url"] = href
    event = ADAPTERS["github"].normalize(webhook_request(pr, GITHUB), tenant=None)
    assert event.source_link is None
    assert event.payload["pull_request"]["number"] == 12
    assert not is_web_url(href)


def test_an_event_from_before_the_field_parses_without_a_link() -> None:
    old = {"id": "e", "type": "github.push", "source": "s", "timestamp": "2026-01-01T00:00:00Z", "payload": {}}
    assert NormalizedEvent.model_validate(old).source_link is None


# --------------------------------------------------------------------------- through the gateway
async def test_the_link_travels_in_run_requested(client: httpx.AsyncClient, bus: Bus) -> None:
    response = await post(client, fixture_bytes("pr-created.json"))
    assert response.status_code == 202, response.text
    requested = await run_requested(bus)
    assert requested.event is not None
    assert requested.event.payload == {}  # the payload is the input; the link is kept all the same
    assert requested.event.source_link == SourceLink(
        href="https://contoso.visualstudio.com/DefaultCollection/_git/payments-api/pullrequest/7",
        label="PR #7 in payments-api",
    )
