"""The sources' further events (TRG-3/4/8): Azure DevOps ``build.complete`` (``azure_devops.build``) and ``git.push``
(``azure_devops.push``); GitLab comment (``note.*``), issue (``issue.*``) and pipeline (``pipeline.<status>``) hooks;
GitHub ``issue_comment``, ``pull_request_review`` and ``workflow_run``. Each on the project's own small fixtures
(normalized directly, and through the real HTTP intake against a real nats-server), and on the team's real payloads
where there are any (skipped, saying so, where ``../shared`` is absent)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_support import (
    AGENTS,
    AS_VIEWER,
    ENVIRON,
    GITLAB_TOKEN,
    PASSWORD,
    basic,
    fixture_bytes,
    fixture_json,
    github_headers,
    journal,
    load_triggers_yaml,
    post,
    tokens_file,
    webhook_request,
)

from temporality_bus import Bus
from temporality_protocol import NormalizedEvent, RunRequested, run_id_for_delivery
from temporality_service import ApiAuth, ApiAuthSettings
from temporality_testing.fixtures import require_shared
from temporality_trigger_gateway import Settings, TriggerConfig, TriggerConfigError, create_app
from temporality_trigger_gateway.adapters import ADAPTERS
from temporality_trigger_gateway.adapters.base import MAX_DESCRIPTION
from temporality_trigger_gateway.errors import InvalidPayload
from temporality_trigger_gateway.store import TriggerRegistry, TriggerStore
from temporality_trigger_gateway.triggers import WebhookTrigger

TRIGGERS = """
triggers:
  - id: ado-builds
    name: Look into failed builds
    type: webhook
    adapter: azure_devops.build
    events: [build.complete]
    agent: triager
    auth: {type: basic, username: azure, password_env: TEST_GATEWAY_PASSWORD}
  - id: ado-pushes
    name: Pushes
    type: webhook
    adapter: azure_devops.push
    events: [git.push]
    agent: reviewer
    auth: {type: basic, username: azure, password_env: TEST_GATEWAY_PASSWORD}
  - id: gh-talk
    name: Comments, reviews and workflow runs
    type: webhook
    adapter: github
    events: [issue_comment.created, issue_comment.edited, pull_request_review.submitted, workflow_run.completed]
    agent: reviewer
    auth: {type: github, secret_env: TEST_GITHUB_SECRET}
  - id: gl-talk
    name: Comments, issues and pipelines
    type: webhook
    adapter: gitlab
    events: [note.merge_request, note.issue, issue.open, issue.close, pipeline.failed]
    agent: reviewer
    auth: {type: gitlab, secret_env: TEST_GITLAB_TOKEN}
"""
GITLAB = {"X-Gitlab-Token": GITLAB_TOKEN}


@pytest.fixture
def triggers() -> list[TriggerConfig]:
    return load_triggers_yaml(TRIGGERS, **ENVIRON)


@pytest.fixture
def settings() -> Settings:
    # the default body limit (real payloads are a few KB); intake_timeout_s generous, as conftest's
    return Settings(intake_timeout_s=60)


def _normalize(adapter: str, body: Any, headers: dict[str, str] | None = None) -> NormalizedEvent:
    source = ADAPTERS[adapter]
    request = webhook_request(body, headers)
    source.identify(request)
    return source.normalize(request, tenant=None)


def _gh(event: str) -> dict[str, str]:
    return {"X-GitHub-Event": event, "X-GitHub-Delivery": f"d-{event}"}


def _gl(key: str = "k-1") -> dict[str, str]:
    return {"Idempotency-Key": key}


def _shared(folder: str) -> Path:
    path = require_shared() / "fixtures/webhooks" / folder
    if not path.is_dir():
        pytest.skip(f"{path} not present; real {folder} payloads not checked")
    return path


def _requested(events: list[Any]) -> list[RunRequested]:
    return [e.payload(RunRequested) for e in events if e.type == "run.requested"]


# --------------------------------------------------------------------------- the catalogue
def test_the_catalogue_lists_the_new_sources_and_event_types() -> None:
    assert ADAPTERS["azure_devops.build"].event_types == {"build.complete"}
    assert ADAPTERS["azure_devops.push"].event_types == {"git.push"}
    github = ADAPTERS["github"].event_types or frozenset()
    assert {
        "issue_comment.created",
        "issue_comment.edited",
        "issue_comment.deleted",
        "pull_request_review.submitted",
        "workflow_run.completed",
    } <= github
    gitlab = ADAPTERS["gitlab"].event_types or frozenset()
    assert {"note.merge_request", "note.issue", "note.commit", "issue.open", "pipeline.failed"} <= gitlab
    for name in ("azure_devops.build", "azure_devops.push"):
        assert ADAPTERS[name].auth_types == ADAPTERS["azure_devops.pull_request"].auth_types
        assert ADAPTERS[name].id_in_body


def test_trigger_validation_takes_the_new_events_and_names_them_when_refusing() -> None:
    assert len(load_triggers_yaml(TRIGGERS, **ENVIRON)) == 4
    wrong = TRIGGERS.replace("events: [git.push]", "events: [git.push, build.complete]")
    with pytest.raises(TriggerConfigError, match=r"adapter azure_devops.push cannot handle build.complete"):
        load_triggers_yaml(wrong, **ENVIRON)
    wrong = TRIGGERS.replace("pipeline.failed]", "pipeline.created]")
    with pytest.raises(TriggerConfigError, match=r"cannot handle pipeline.created; it supports .*pipeline.failed"):
        load_triggers_yaml(wrong, **ENVIRON)


# --------------------------------------------------------------------------- Azure DevOps build.complete
def test_a_current_build_complete_normalizes() -> None:
    event = _normalize("azure_devops.build", fixture_json("ado-build-complete.json"))
    assert event.id == "5b8e1f2a-3c4d-4e5f-9a6b-7c8d9e0f1a2b"
    assert event.type == "azure_devops.build.complete"
    assert event.source == "https://dev.azure.com/contoso/"
    assert event.tenant == "Contoso"
    assert event.actor is not None
    assert (event.actor.id, event.actor.display_name) == ("rosa@contoso.example", "Rosa Marquez")
    build = event.payload["build"]
    assert (build["id"], build["number"], build["status"], build["result"]) == (
        1187,
        "20250304.7",
        "completed",
        "failed",
    )
    assert build["duration_s"] == 390.0
    assert event.payload["definition"] == {"id": 12, "name": "payments-api-ci"}
    assert event.payload["source_branch"] == "refs/pull/7/merge"
    assert event.payload["source_version"] == "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
    assert event.payload["repository"] == {
        "id": "9e3c4b1a-7d2f-4c6e-8a5b-1f0e2d3c4b5a",
        "name": "payments-api",
        "type": "TfsGit",
    }
    assert event.source_link is not None
    assert event.source_link.href.endswith("/_build/results?buildId=1187")
    assert ADAPTERS["azure_devops.build"].run_title(event) == (
        "Build 20250304.7 of payments-api-ci failed on refs/pull/7/merge"
    )


def test_a_build_without_resource_details_is_titled_from_its_message() -> None:
    body = fixture_json("ado-build-complete.json")
    minimal = {**body, "resource": {"id": 1187, "url": body["resource"]["url"]}}
    event = _normalize("azure_devops.build", minimal)
    assert event.payload["build"]["result"] is None
    assert event.source_link is not None  # the web page derived from the REST URL
    assert (
        event.source_link.href
        == "https://dev.azure.com/contoso/1b2c3d4e-5f60-4718-9a0b-c1d2e3f4a5b6/_build/results?buildId=1187"
    )
    none = _normalize("azure_devops.build", {**body, "resource": None})
    assert none.payload["build"]["id"] is None
    assert none.source_link is None
    assert ADAPTERS["azure_devops.build"].run_title(none) == "Build 20250304.7 failed"


def test_the_build_source_refuses_other_azure_devops_events() -> None:
    with pytest.raises(InvalidPayload, match=r"'git\.push' is not a build event"):
        _normalize("azure_devops.build", fixture_json("git-push.json"))


# --------------------------------------------------------------------------- Azure DevOps git.push
def test_a_git_push_normalizes() -> None:
    event = _normalize("azure_devops.push", fixture_json("git-push.json"))
    assert event.type == "azure_devops.git.push"
    assert event.tenant == "Contoso"
    assert event.actor is not None
    assert event.actor.id == "rosa@contoso.example"
    assert event.payload["branch"] == "main"
    (ref,) = event.payload["ref_updates"]
    assert (ref["created"], ref["deleted"]) == (True, False)
    assert event.payload["commits"] == [
        {"id": "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678", "message": "Bump version", "author": None, "url": None}
    ]
    assert event.payload["push"]["id"] == 31
    assert ADAPTERS["azure_devops.push"].run_title(event) == "Push to main in payments-api (1 commits)"


def test_a_push_clips_long_commit_messages_and_lists_fifty_commits() -> None:
    body = fixture_json("git-push.json")
    commits = [{"commitId": f"{i:040x}", "comment": "x" * 10_000} for i in range(60)]
    body["resource"]["commits"] = commits
    event = _normalize("azure_devops.push", body)
    assert event.payload["commit_count"] == 60
    assert len(event.payload["commits"]) == 50
    assert len(event.payload["commits"][0]["message"]) < 4200
    assert "[... cut by Temporality" in event.payload["commits"][0]["message"]


def test_a_push_without_resource_details_is_titled_from_its_message() -> None:
    body = {
        "id": "e-9",
        "eventType": "git.push",
        "resource": None,
        "message": {"text": "Jamal pushed updates to branch master of repo\\r\\n(https://example/_git/repo)"},
    }
    event = _normalize("azure_devops.push", body)
    assert event.payload["ref_updates"] == []
    assert event.source_link is None
    assert ADAPTERS["azure_devops.push"].run_title(event) == "Jamal pushed updates to branch master of repo"


# --------------------------------------------------------------------------- GitHub
def test_a_github_issue_comment_on_a_pull_request() -> None:
    event = _normalize("github", fixture_json("github-issue-comment-created.json"), _gh("issue_comment"))
    assert event.type == "github.issue_comment.created"
    assert event.actor is not None
    assert event.actor.id == "omar-b"
    assert event.payload["issue"]["is_pull_request"] is True
    assert event.payload["comment"]["body"] == "@review-bot please look at the cache expiry again"
    assert event.payload["author"] == {"login": "omar-b", "id": 502}
    assert event.payload["previous_body"] is None
    assert event.source_link is not None
    assert event.source_link.href.endswith("#issuecomment-2690011")
    assert event.source_link.label == "Comment on PR #12 in tidewater/ledger"
    assert ADAPTERS["github"].run_title(event) == "Comment created on PR #12 in tidewater/ledger: Cache exchange rates"


def test_an_edited_github_comment_keeps_the_previous_body_and_clips_both() -> None:
    body = fixture_json("github-issue-comment-created.json")
    body["action"] = "edited"
    body["comment"]["body"] = "y" * (MAX_DESCRIPTION + 10)
    body["changes"] = {"body": {"from": "before"}}
    del body["issue"]["pull_request"]
    event = _normalize("github", body, _gh("issue_comment"))
    assert event.type == "github.issue_comment.edited"
    assert event.payload["previous_body"] == "before"
    assert event.payload["comment"]["body"].endswith("[... cut by Temporality: 10 more characters]")
    assert event.payload["issue"]["is_pull_request"] is False
    assert ADAPTERS["github"].run_title(event).startswith("Comment edited on Issue #12")


def test_a_github_review_with_a_null_body() -> None:
    event = _normalize("github", fixture_json("github-pr-review-submitted.json"), _gh("pull_request_review"))
    assert event.type == "github.pull_request_review.submitted"
    assert event.payload["review"]["state"] == "changes_requested"
    assert event.payload["review"]["body"] == ""
    assert event.payload["reviewer"] == {"login": "omar-b", "id": 502}
    assert event.payload["pull_request"]["author"] == {"login": "marta-k", "id": 501}
    assert (event.payload["source_branch"], event.payload["target_branch"]) == ("feat/rate-cache", "main")
    assert ADAPTERS["github"].run_title(event) == (
        "Review submitted (changes_requested) on PR #12 in tidewater/ledger: Cache exchange rates"
    )


def test_a_github_workflow_run() -> None:
    event = _normalize("github", fixture_json("github-workflow-run-completed.json"), _gh("workflow_run"))
    assert event.type == "github.workflow_run.completed"
    run = event.payload["workflow_run"]
    assert (run["status"], run["conclusion"], run["number"]) == ("completed", "failure", 87)
    assert event.payload["pull_requests"] == [12]
    assert event.payload["branch"] == "feat/rate-cache"
    assert event.payload["triggered_by"] == {"login": "marta-k", "id": 501}
    assert event.source_link is not None
    assert event.source_link.label == "Workflow run ci #87 in tidewater/ledger"
    assert ADAPTERS["github"].run_title(event) == "Workflow ci failure in tidewater/ledger on feat/rate-cache"


def test_untrusted_short_fields_are_clipped() -> None:
    """An id, a state, a branch, a ref or a SHA the sender makes as long as it likes is kept to 200 characters
    (a URL to 2048), as the older sources' are."""
    long = "x" * 5000
    build = fixture_json("ado-build-complete.json")
    build["id"] = long
    assert _normalize("azure_devops.build", build).id == long[:200]
    push = fixture_json("git-push.json")
    push["id"] = long
    assert _normalize("azure_devops.push", push).id == long[:200]
    review = fixture_json("github-pr-review-submitted.json")
    review["review"]["state"] = long
    assert _normalize("github", review, _gh("pull_request_review")).payload["review"]["state"] == long[:200]
    run = fixture_json("github-workflow-run-completed.json")
    run["workflow_run"]["head_branch"] = long
    run["workflow_run"]["head_sha"] = long
    event = _normalize("github", run, _gh("workflow_run"))
    assert (event.payload["branch"], event.payload["head_sha"]) == (long[:200], long[:200])
    acted = fixture_json("github-workflow-run-completed.json")
    acted["action"] = long
    assert len(ADAPTERS["github"].identify(webhook_request(acted, _gh("workflow_run"))).type) == 200
    pipeline = fixture_json("gitlab-pipeline-failed.json")
    pipeline["object_attributes"]["ref"] = long
    pipeline["object_attributes"]["sha"] = long
    pipeline["project"]["web_url"] = "https://gitlab.example/" + long
    event = _normalize("gitlab", pipeline, _gl())
    assert (event.payload["pipeline"]["ref"], event.payload["pipeline"]["sha"]) == (long[:200], long[:200])
    assert event.payload["branch"] == long[:200]
    assert len(event.payload["project"]["url"]) == len(event.source) == 2048


# --------------------------------------------------------------------------- GitLab
def test_a_gitlab_diff_comment_on_a_merge_request() -> None:
    event = _normalize("gitlab", fixture_json("gitlab-note-mr-diff.json"), _gl())
    assert event.type == "gitlab.note.merge_request"
    assert event.actor is not None
    assert event.actor.id == "lpark"
    note = event.payload["note"]
    assert (note["type"], note["path"], note["line"]) == ("DiffNote", "billing/totals.py", 42)
    assert event.payload["merge_request"]["url"] == "https://gitlab.example/harbor/billing/-/merge_requests/4"
    assert event.source_link is not None
    assert event.source_link.href.endswith("#note_5521")
    assert ADAPTERS["gitlab"].run_title(event) == "Comment on MR !4 in harbor/billing: Round invoice totals once"


def test_a_gitlab_comment_on_an_issue_and_on_a_commit() -> None:
    body = fixture_json("gitlab-note-mr-diff.json")
    del body["merge_request"]
    issue = {
        **body,
        "object_attributes": {**body["object_attributes"], "noteable_type": "Issue", "position": None, "url": None},
        "issue": {"id": 3301, "iid": 19, "title": "Totals off by a cent", "state": "opened"},
    }
    event = _normalize("gitlab", issue, _gl())
    assert event.type == "gitlab.note.issue"
    assert event.payload["issue"]["url"] == "https://gitlab.example/harbor/billing/-/issues/19"
    assert event.source_link is not None
    assert event.source_link.href == "https://gitlab.example/harbor/billing/-/issues/19"
    assert ADAPTERS["gitlab"].run_title(event) == "Comment on issue #19 in harbor/billing: Totals off by a cent"
    commit = {
        **body,
        "object_attributes": {**body["object_attributes"], "noteable_type": "Commit"},
        "commit": {"id": "c0ffee0000000000000000000000000000000001", "message": "m" * 5000},
    }
    event = _normalize("gitlab", commit, _gl())
    assert event.type == "gitlab.note.commit"
    assert "[... cut by Temporality" in event.payload["commit"]["message"]
    assert ADAPTERS["gitlab"].run_title(event) == "Comment on commit c0ffee000000 in harbor/billing"


def test_a_gitlab_snippet_comment_is_an_event_no_trigger_lists() -> None:
    body = fixture_json("gitlab-note-mr-diff.json")
    body["object_attributes"]["noteable_type"] = "Snippet"
    request = webhook_request(body, _gl())
    assert ADAPTERS["gitlab"].identify(request).type == "note.snippet"
    assert "note.snippet" not in (ADAPTERS["gitlab"].event_types or ())


def test_a_gitlab_issue_hook() -> None:
    event = _normalize("gitlab", fixture_json("gitlab-issue-close.json"), _gl())
    assert event.type == "gitlab.issue.close"
    issue = event.payload["issue"]
    assert (issue["iid"], issue["state"], issue["labels"]) == (19, "closed", ["bug"])
    assert event.payload["assignees"] == ["lpark"]
    assert event.payload["changed"] == ["closed_at", "state_id"]
    assert ADAPTERS["gitlab"].run_title(event) == "Issue #19 close in harbor/billing: Totals off by a cent"


def test_a_gitlab_pipeline_hook() -> None:
    event = _normalize("gitlab", fixture_json("gitlab-pipeline-failed.json"), _gl())
    assert event.type == "gitlab.pipeline.failed"
    pipeline = event.payload["pipeline"]
    assert (pipeline["id"], pipeline["status"], pipeline["ref"], pipeline["duration_s"]) == (
        31077,
        "failed",
        "fix/rounding",
        352,
    )
    assert event.payload["branch"] == "fix/rounding"
    assert event.payload["merge_request"] == {
        "iid": 4,
        "title": "Round invoice totals once",
        "url": "https://gitlab.example/harbor/billing/-/merge_requests/4",
    }
    # the allowed-to-fail lint job is not a failure of the pipeline's
    assert event.payload["failed_jobs"] == [
        {"id": 9002, "name": "unit", "stage": "test", "failure_reason": "script_failure"}
    ]
    assert event.payload["job_count"] == 3
    assert ADAPTERS["gitlab"].run_title(event) == "Pipeline #31077 failed in harbor/billing (fix/rounding)"


def test_a_gitlab_pipeline_without_user_or_url_links_the_project_pipeline_page() -> None:
    body = fixture_json("gitlab-pipeline-failed.json")
    body["user"] = None
    del body["object_attributes"]["url"]
    event = _normalize("gitlab", body, _gl())
    assert event.actor is None
    assert event.source_link is not None
    assert event.source_link.href == "https://gitlab.example/harbor/billing/-/pipelines/31077"
    body["object_attributes"]["status"] = "created"
    assert ADAPTERS["gitlab"].identify(webhook_request(body, _gl())).type == "pipeline.created"


# --------------------------------------------------------------------------- through the HTTP intake
async def test_azure_devops_build_and_push_start_runs(client: httpx.AsyncClient, bus: Bus) -> None:
    build = await post(client, fixture_bytes("ado-build-complete.json"), trigger_id="ado-builds", headers=basic())
    assert build.status_code == 202, build.text
    assert build.json()["run_id"] == run_id_for_delivery("ado-builds", "5b8e1f2a-3c4d-4e5f-9a6b-7c8d9e0f1a2b")
    again = await post(client, fixture_bytes("ado-build-complete.json"), trigger_id="ado-builds", headers=basic())
    assert (again.status_code, again.json()["status"]) == (200, "duplicate")
    push = await post(client, fixture_bytes("git-push.json"), trigger_id="ado-pushes", headers=basic())
    assert push.status_code == 202, push.text
    # a pull request event sent to the build trigger: a valid Azure DevOps event it does not take
    pr = await post(client, fixture_bytes("pr-created.json"), trigger_id="ado-builds", headers=basic())
    assert (pr.status_code, pr.json()["status"], pr.json()["reason"]) == (200, "ignored", "unsupported_event")
    wrong = await post(
        client, fixture_bytes("ado-build-complete.json"), trigger_id="ado-builds", headers=basic(password="x")
    )
    assert wrong.status_code == 401
    by_type = {r.event.type: r for r in _requested(await journal(bus)) if r.event is not None}
    assert set(by_type) == {"azure_devops.build.complete", "azure_devops.git.push"}
    assert (
        by_type["azure_devops.build.complete"].title
        == "Build 20250304.7 of payments-api-ci failed on refs/pull/7/merge"
    )
    assert by_type["azure_devops.build.complete"].input["build"]["result"] == "failed"
    assert by_type["azure_devops.git.push"].input["branch"] == "main"


async def test_github_comment_review_and_workflow_run_start_runs(client: httpx.AsyncClient, bus: Bus) -> None:
    sent = {
        "github-issue-comment-created.json": "issue_comment",
        "github-pr-review-submitted.json": "pull_request_review",
        "github-workflow-run-completed.json": "workflow_run",
    }
    for name, header in sent.items():
        raw = fixture_bytes(name)
        response = await post(client, raw, trigger_id="gh-talk", headers=github_headers(raw, header, f"d-{name}"))
        assert response.status_code == 202, (name, response.text)
        assert response.json()["run_id"] == run_id_for_delivery("gh-talk", f"d-{name}")
    # a review that is only edited: a valid event the trigger does not list
    raw = json.dumps({**fixture_json("github-pr-review-submitted.json"), "action": "edited"}).encode()
    edited = await post(client, raw, trigger_id="gh-talk", headers=github_headers(raw, "pull_request_review", "d-e"))
    assert (edited.status_code, edited.json()["reason"]) == (200, "unsupported_event")
    titles = sorted(r.title for r in _requested(await journal(bus)))
    assert titles == [
        "Comment created on PR #12 in tidewater/ledger: Cache exchange rates",
        "Review submitted (changes_requested) on PR #12 in tidewater/ledger: Cache exchange rates",
        "Workflow ci failure in tidewater/ledger on feat/rate-cache",
    ]


async def test_gitlab_comment_issue_and_pipeline_start_runs(client: httpx.AsyncClient, bus: Bus) -> None:
    sent = {
        "gitlab-note-mr-diff.json": "Note Hook",
        "gitlab-issue-close.json": "Issue Hook",
        "gitlab-pipeline-failed.json": "Pipeline Hook",
    }
    for name, hook in sent.items():
        headers = {**GITLAB, "X-Gitlab-Event": hook, "Idempotency-Key": f"k-{name}"}
        response = await post(client, fixture_bytes(name), trigger_id="gl-talk", headers=headers)
        assert response.status_code == 202, (name, response.text)
        assert response.json()["run_id"] == run_id_for_delivery("gl-talk", f"k-{name}")
    running = fixture_json("gitlab-pipeline-failed.json")
    running["object_attributes"]["status"] = "running"
    ignored = await post(client, running, trigger_id="gl-talk", headers={**GITLAB, "Idempotency-Key": "k-run"})
    assert (ignored.status_code, ignored.json()["reason"]) == (200, "unsupported_event")
    no_id = await post(client, fixture_bytes("gitlab-issue-close.json"), trigger_id="gl-talk", headers=GITLAB)
    assert no_id.status_code == 422
    by_type = {r.event.type: r for r in _requested(await journal(bus)) if r.event is not None}
    assert set(by_type) == {"gitlab.note.merge_request", "gitlab.issue.close", "gitlab.pipeline.failed"}
    assert by_type["gitlab.pipeline.failed"].input["failed_jobs"][0]["name"] == "unit"
    assert by_type["gitlab.note.merge_request"].input["note"]["line"] == 42


# --------------------------------------------------------------------------- the mapping preview
@pytest.fixture
async def admin(bus: Bus, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    store = await TriggerStore.open(bus)
    registry = TriggerRegistry(environ={}, agents=AGENTS)
    auth = ApiAuth.from_settings(ApiAuthSettings(tokens_file=tokens_file(tmp_path)))
    async with registry.watching(store):
        app = create_app(Settings(), bus, registry, store=store, auth=auth)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as c:
            yield c


async def test_the_preview_maps_the_new_events(admin: httpx.AsyncClient) -> None:
    build = {
        "id": "builds",
        "name": "Failed builds",
        "type": "webhook",
        "adapter": "azure_devops.build",
        "events": ["build.complete"],
        "agent": "triager",
        "auth": {"type": "basic", "username": "azure", "password": PASSWORD},
        "when": "payload.build.result == 'failed'",
        "input": {"build": "payload.build.number", "page": "source_link.href"},
    }
    sample = {"trigger": build, "payload": fixture_json("ado-build-complete.json")}
    answer = (await admin.post("/triggers/preview", json=sample, headers=AS_VIEWER)).json()
    assert answer["ok"] is True, answer
    assert answer["would_start_run"] is True
    assert answer["input"]["build"] == "20250304.7"
    pipeline = {
        **build,
        "id": "pipelines",
        "adapter": "gitlab",
        "events": ["pipeline.failed"],
        "auth": {"type": "gitlab", "secret": GITLAB_TOKEN},
        "when": None,
        "input": {"jobs": "payload.failed_jobs[].name"},
    }
    sample = {
        "trigger": {k: v for k, v in pipeline.items() if v is not None},
        "payload": fixture_json("gitlab-pipeline-failed.json"),
    }
    answer = (await admin.post("/triggers/preview", json=sample, headers=AS_VIEWER)).json()
    assert answer["ok"] is True, answer
    assert answer["source_event"]["type"] == "pipeline.failed"
    assert answer["input"] == {"jobs": ["unit"]}


# --------------------------------------------------------------------------- the team's real payloads
def test_every_new_real_azure_devops_payload_normalizes() -> None:
    folder = _shared("azure-devops")
    expected = {
        "aspnet-webhooks.build.complete.json": "azure_devops.build",
        "aspnet-webhooks.git.push.json": "azure_devops.push",
        "docs2018.git.push.json": "azure_devops.push",
    }
    for name, adapter in expected.items():
        raw = (folder / name).read_bytes()
        request = webhook_request(json.loads(raw.decode("utf-8-sig")), raw=raw)
        source = ADAPTERS[adapter]
        assert source.identify(request).type in (source.event_types or ())
        event = source.normalize(request, tenant=None)
        assert event.id == json.loads(raw.decode("utf-8-sig"))["id"], name
        assert event.source_link is not None, name
        assert source.run_title(event), name
    raw = (folder / "aspnet-webhooks.build.complete.json").read_bytes()
    build = _normalize("azure_devops.build", json.loads(raw.decode("utf-8-sig")))
    # a XAML build: the outcome is its status, branch and commit are read from sourceGetVersion
    assert build.payload["build"]["result"] == "succeeded"
    assert build.payload["source_branch"] == "master"
    assert build.payload["source_version"] == "600c52d2d5b655caa111abfd863e5a9bd304bb0e"
    assert build.actor is not None
    assert build.actor.display_name == "John Smith"  # from requests[].requestedFor
    tfs = _normalize("azure_devops.push", json.loads((folder / "aspnet-webhooks.git.push.json").read_bytes()))
    assert tfs.source_link is not None
    assert tfs.source_link.href == (
        "https://good-company.some.ssl.host/tfs/GoodCompany/_git/Project/commit/c8e823a60a85381732726d6a9b6a276e71e6ce12"
    )
    docs = _normalize("azure_devops.push", json.loads((folder / "docs2018.git.push.json").read_bytes()))
    assert docs.actor is not None
    assert docs.actor.id == "Windows Live ID\\fabrikamfiber4@hotmail.com"


async def test_real_azure_devops_build_and_push_payloads_through_the_gateway(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    folder = _shared("azure-devops")
    sent = {
        "aspnet-webhooks.build.complete.json": "ado-builds",
        "aspnet-webhooks.git.push.json": "ado-pushes",
        "docs2018.git.push.json": "ado-pushes",
    }
    accepted = 0
    for name, trigger_id in sent.items():
        raw = (folder / name).read_bytes()
        response = await post(client, raw, trigger_id=trigger_id, headers=basic())
        if name.startswith("aspnet-"):  # the Test button's sample events (subscriptionId all zeros)
            assert (response.status_code, response.json()["reason"]) == (200, "test_notification"), name
            real = json.loads(raw.decode("utf-8-sig"))
            real["subscriptionId"] = "4c1d2e3f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
            response = await post(client, real, trigger_id=trigger_id, headers=basic())
        assert (response.status_code, response.json()["status"]) == (202, "accepted"), (name, response.text)
        accepted += 1
    titles = sorted(r.title for r in _requested(await journal(bus)))
    assert len(titles) == accepted == 3
    assert titles == [
        "Build ConsumerAddressModule_20150407.1 of ConsumerAddressModule succeeded on master",
        "Push to master in Fabrikam-Fiber-Git (1 commits)",
        "Push to master in Project (1 commits)",
    ]


async def test_real_gitlab_note_and_issue_payloads_through_the_gateway(client: httpx.AsyncClient, bus: Bus) -> None:
    folder = _shared("gitlab")
    sent = {"go-gitlab.note_merge_request.json": "note.merge_request", "go-gitlab.issue.json": "issue.open"}
    for name, event_type in sent.items():
        raw = (folder / name).read_bytes()
        assert ADAPTERS["gitlab"].identify(webhook_request(json.loads(raw), _gl(name))).type == event_type
        response = await post(client, raw, trigger_id="gl-talk", headers={**GITLAB, "X-Gitlab-Event-UUID": name})
        assert (response.status_code, response.json()["status"]) == (202, "accepted"), (name, response.text)
    titles = sorted(r.title for r in _requested(await journal(bus)))
    assert titles == [
        "Comment on MR !1 in gitlab-org/gitlab-test: Tempora et eos debitis quae laborum et.",
        "Issue #23 open in gitlabhq/gitlab-test: New API: create/update/delete file",
    ]


def test_the_documented_mention_trigger_skips_the_agents_own_comments() -> None:
    """docs/webhook-senders.md's ``gh-mentions``: a comment mentioning the bot starts a run, the bot's own does not."""
    (trigger,) = load_triggers_yaml(
        """
triggers:
  - id: gh-mentions
    name: Answer review-bot mentions in comments
    type: webhook
    adapter: github
    events: [issue_comment.created]
    when: "contains(payload.comment.body, '@review-bot') && actor.id != 'review-bot[bot]'"
    agent: reviewer
    auth: {type: github, secret: s}
"""
    )
    assert isinstance(trigger, WebhookTrigger)
    body = fixture_json("github-issue-comment-created.json")
    assert trigger.filtered(_normalize("github", body, _gh("issue_comment"))) is None
    own = {**body, "sender": {"login": "review-bot[bot]", "id": 9}}
    assert trigger.filtered(_normalize("github", own, _gh("issue_comment"))) is not None
    plain = {**body, "comment": {**body["comment"], "body": "looks good"}}
    assert trigger.filtered(_normalize("github", plain, _gh("issue_comment"))) is not None
