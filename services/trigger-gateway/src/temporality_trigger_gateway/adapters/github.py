"""The ``github`` source: GitHub repository webhooks (pull requests, issues, pushes).

The event type is ``X-GitHub-Event`` plus the body's ``action`` (``pull_request.opened``,
``issues.opened``, ``push``); the event id is ``X-GitHub-Delivery`` (a GUID GitHub keeps when a
delivery is redelivered), never anything in the body. ``ping`` (sent once when a hook is created) is a
valid event that no trigger can list: it is answered 200 ``ignored`` and never starts a run.
Authenticate with ``auth: {type: github, secret_env: …}`` (``X-Hub-Signature-256``). A PR ``body``
may be ``null``; a push may delete a branch (``after`` all zeros, no ``head_commit``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_protocol import Actor, NormalizedEvent, SourceLink
from temporality_trigger_gateway.adapters.base import (
    MAX_DESCRIPTION,
    Adapter,
    SourceEvent,
    WebhookRequest,
    aware,
    clip,
    invalid_payload,
    missing_header,
    web_link,
)
from temporality_trigger_gateway.errors import InvalidPayload

__all__ = ["GITHUB_EVENT_TYPES", "GitHub"]

_PR_ACTIONS = ("opened", "synchronize", "closed", "reopened", "edited", "ready_for_review")
_ISSUE_ACTIONS = ("opened", "edited", "closed", "reopened", "labeled")
GITHUB_EVENT_TYPES = frozenset(
    {f"pull_request.{a}" for a in _PR_ACTIONS} | {f"issues.{a}" for a in _ISSUE_ACTIONS} | {"push"}
)
_Text = Annotated[str, Field(min_length=1)]


class _Gh(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class User(_Gh):
    login: _Text
    id: int | None = None
    html_url: str | None = None


class Repository(_Gh):
    id: int
    full_name: _Text
    html_url: _Text
    default_branch: str | None = None
    owner: User | None = None


class Ref(_Gh):
    ref: _Text
    sha: _Text


class PullRequest(_Gh):
    number: Annotated[int, Field(ge=1)]
    title: str
    body: str | None = None
    state: str | None = None
    html_url: str | None = None
    user: User
    head: Ref
    base: Ref
    draft: bool | None = None
    merged: bool | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class PullRequestEvent(_Gh):
    action: _Text
    number: int | None = None
    pull_request: PullRequest
    repository: Repository
    sender: User
    before: str | None = None
    after: str | None = None


class Issue(_Gh):
    number: Annotated[int, Field(ge=1)]
    title: str
    body: str | None = None
    state: str | None = None
    html_url: str | None = None
    user: User
    labels: list[dict[str, Any]] = Field(default_factory=list)
    updated_at: datetime | None = None


class IssuesEvent(_Gh):
    action: _Text
    issue: Issue
    repository: Repository
    sender: User


class Commit(_Gh):
    id: _Text
    message: str = ""
    url: str | None = None
    timestamp: datetime | None = None


class PushEvent(_Gh):
    ref: _Text
    before: _Text
    after: _Text
    created: bool = False
    deleted: bool = False
    forced: bool = False
    compare: str | None = None
    commits: list[Commit] = Field(default_factory=list)
    head_commit: Commit | None = None
    repository: Repository
    sender: User


class _Kind(_Gh):
    action: str | None = None


def _person(user: User) -> dict[str, Any]:
    return {"login": user.login, "id": user.id}


def _repo(repo: Repository) -> dict[str, Any]:
    return {"id": repo.id, "full_name": repo.full_name, "url": repo.html_url, "default_branch": repo.default_branch}


class GitHub(Adapter):
    name: ClassVar[str] = "github"
    event_types: ClassVar[frozenset[str] | None] = GITHUB_EVENT_TYPES
    auth_types: ClassVar[frozenset[str]] = frozenset({"github"})
    delivery_id_headers: ClassVar[tuple[str, ...]] = ("X-GitHub-Delivery",)

    def identify(self, request: WebhookRequest) -> SourceEvent:
        delivery = request.headers.get("x-github-delivery")
        event = request.headers.get("x-github-event")
        if not delivery:
            raise missing_header(self.name, "X-GitHub-Delivery")
        if not event:
            raise missing_header(self.name, "X-GitHub-Event")
        if not isinstance(request.json, dict):
            raise InvalidPayload(
                f"the body is not a valid {self.name} event (not a JSON object)",
                [{"loc": [], "msg": "Input should be an object", "type": "dict_type"}],
            )
        try:
            action = _Kind.model_validate(request.json).action
        except ValidationError as exc:
            raise invalid_payload(self.name, exc) from exc
        return SourceEvent(id=delivery[:200], type=f"{event}.{action}" if action and event != "push" else event)

    def normalize(self, request: WebhookRequest, *, tenant: str | None) -> NormalizedEvent:
        source = self.identify(request)
        kind = source.type.partition(".")[0]
        try:
            if kind == "pull_request":
                return self._pull_request(source, PullRequestEvent.model_validate(request.json), tenant)
            if kind == "issues":
                return self._issue(source, IssuesEvent.model_validate(request.json), tenant)
            if kind == "push":
                return self._push(source, PushEvent.model_validate(request.json), tenant)
        except ValidationError as exc:
            raise invalid_payload(self.name, exc) from exc
        raise InvalidPayload(
            f"{source.type!r} is not an event the github source maps",
            [{"loc": ["header", "X-GitHub-Event"], "msg": "unsupported event", "type": "value_error"}],
        )

    def _event(
        self,
        source: SourceEvent,
        repo: Repository,
        sender: User,
        when: datetime | None,
        tenant: str | None,
        payload: dict[str, Any],
        link: SourceLink | None,
    ) -> NormalizedEvent:
        return NormalizedEvent(
            id=source.id,
            type=f"github.{source.type}",
            source=repo.html_url,
            timestamp=aware(when) or datetime.now(UTC),
            actor=Actor(id=sender.login, display_name=sender.login),
            tenant=tenant or (repo.owner.login if repo.owner else repo.full_name.partition("/")[0]),
            payload={"repository": _repo(repo), "action": source.type.partition(".")[2] or None, **payload},
            metadata={"event_type": source.type, "delivery_id": source.id},
            source_link=link,
        )

    def _pull_request(self, source: SourceEvent, event: PullRequestEvent, tenant: str | None) -> NormalizedEvent:
        pr = event.pull_request
        return self._event(
            source,
            event.repository,
            event.sender,
            pr.updated_at,
            tenant,
            {
                "pull_request": {
                    "number": pr.number,
                    "title": pr.title,
                    "description": clip(pr.body or "", MAX_DESCRIPTION),
                    "url": pr.html_url,
                    "state": pr.state,
                    "draft": pr.draft,
                    "merged": pr.merged,
                },
                "source_branch": pr.head.ref,
                "target_branch": pr.base.ref,
                "author": _person(pr.user),
                "commits": {"source": pr.head.sha, "target": pr.base.sha, "before": event.before, "after": event.after},
            },
            web_link(pr.html_url, label=f"PR #{pr.number} in {event.repository.full_name}"),
        )

    def _issue(self, source: SourceEvent, event: IssuesEvent, tenant: str | None) -> NormalizedEvent:
        issue = event.issue
        return self._event(
            source,
            event.repository,
            event.sender,
            issue.updated_at,
            tenant,
            {
                "issue": {
                    "number": issue.number,
                    "title": issue.title,
                    "description": clip(issue.body or "", MAX_DESCRIPTION),
                    "url": issue.html_url,
                    "state": issue.state,
                    "labels": [str(label.get("name")) for label in issue.labels if label.get("name")],
                },
                "author": _person(issue.user),
            },
            web_link(issue.html_url, label=f"Issue #{issue.number} in {event.repository.full_name}"),
        )

    def _push(self, source: SourceEvent, event: PushEvent, tenant: str | None) -> NormalizedEvent:
        head = event.head_commit
        return self._event(
            source,
            event.repository,
            event.sender,
            head.timestamp if head else None,
            tenant,
            {
                "ref": event.ref,
                "branch": event.ref.removeprefix("refs/heads/") if event.ref.startswith("refs/heads/") else None,
                "before": event.before,
                "after": event.after,
                "created": event.created,
                "deleted": event.deleted,
                "forced": event.forced,
                "compare": event.compare,
                "commits": [{"id": c.id, "message": clip(c.message, 4096), "url": c.url} for c in event.commits[:50]],
                "commit_count": len(event.commits),
            },
            web_link(
                event.compare,
                head.url if head else None,
                event.repository.html_url,
                label=f"Push to {event.ref.removeprefix('refs/heads/')} in {event.repository.full_name}",
            ),
        )

    def run_title(self, event: NormalizedEvent) -> str:
        payload = event.payload
        repo = payload["repository"]["full_name"]
        if "pull_request" in payload:
            pr = payload["pull_request"]
            return f"PR #{pr['number']} {payload['action']} in {repo}: {pr['title']}"[:200]
        if "issue" in payload:
            issue = payload["issue"]
            return f"Issue #{issue['number']} {payload['action']} in {repo}: {issue['title']}"[:200]
        return f"Push to {payload['ref']} in {repo} ({payload['commit_count']} commits)"[:200]
