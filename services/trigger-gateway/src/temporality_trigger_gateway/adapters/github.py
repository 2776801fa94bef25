"""The ``github`` source: GitHub repository webhooks (pull requests, issues, pushes, comments, reviews, workflow runs).

The event type is ``X-GitHub-Event`` plus the body's ``action`` (``pull_request.opened``,
``issues.opened``, ``issue_comment.created``, ``pull_request_review.submitted``, ``workflow_run.completed``,
``push``); the event id is ``X-GitHub-Delivery`` (a GUID GitHub keeps when a
delivery is redelivered), never anything in the body. ``ping`` (sent once when a hook is created) is a
valid event that no trigger can list: it is answered 200 ``ignored`` and never starts a run.
Authenticate with ``auth: {type: github, secret_env: …}`` (``X-Hub-Signature-256``). A PR ``body``
may be ``null``; a push may delete a branch (``after`` all zeros, no ``head_commit``). An ``issue_comment`` is a
comment on an issue *or* a pull request (GitHub treats a PR as an issue: ``issue.pull_request`` is then set); a
review's ``body`` may be ``null``; a ``workflow_run``'s outcome is ``conclusion`` (``null`` until ``completed``).
Comment, review and commit texts are untrusted and clipped.
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
_COMMENT_ACTIONS = ("created", "edited", "deleted")
_REVIEW_ACTIONS = ("submitted", "edited", "dismissed")
_WORKFLOW_RUN_ACTIONS = ("requested", "in_progress", "completed")
GITHUB_EVENT_TYPES = frozenset(
    {f"pull_request.{a}" for a in _PR_ACTIONS}
    | {f"issues.{a}" for a in _ISSUE_ACTIONS}
    | {f"issue_comment.{a}" for a in _COMMENT_ACTIONS}
    | {f"pull_request_review.{a}" for a in _REVIEW_ACTIONS}
    | {f"workflow_run.{a}" for a in _WORKFLOW_RUN_ACTIONS}
    | {"push"}
)
#: A name or title of the sender's (a workflow's name, a run's display title) longer than this is cut.
_SHORT = 1024
#: A commit message longer than this is cut.
_COMMIT_MESSAGE = 4096
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


class Comment(_Gh):
    id: int
    body: str | None = None
    html_url: str | None = None
    user: User | None = None
    author_association: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class CommentedIssue(_Gh):
    """The issue or pull request a comment is on (``pull_request`` set: a pull request)."""

    number: Annotated[int, Field(ge=1)]
    title: str
    state: str | None = None
    html_url: str | None = None
    user: User | None = None
    pull_request: dict[str, Any] | None = None


class BodyChange(_Gh):
    #: The body before an ``edited`` comment's edit.
    from_: str | None = Field(default=None, alias="from")


class CommentChanges(_Gh):
    body: BodyChange | None = None


class IssueCommentEvent(_Gh):
    action: _Text
    issue: CommentedIssue
    comment: Comment
    changes: CommentChanges | None = None
    repository: Repository
    sender: User


class Review(_Gh):
    id: int
    body: str | None = None
    state: _Text
    html_url: str | None = None
    user: User | None = None
    submitted_at: datetime | None = None
    commit_id: str | None = None


class ReviewedPullRequest(_Gh):
    number: Annotated[int, Field(ge=1)]
    title: str
    state: str | None = None
    html_url: str | None = None
    user: User | None = None
    head: Ref
    base: Ref
    draft: bool | None = None


class PullRequestReviewEvent(_Gh):
    action: _Text
    review: Review
    pull_request: ReviewedPullRequest
    repository: Repository
    sender: User


class Workflow(_Gh):
    id: int | None = None
    name: str | None = None
    path: str | None = None


class RunPullRequest(_Gh):
    number: int


class WorkflowRun(_Gh):
    id: int
    name: str | None = None
    display_title: str | None = None
    run_number: int | None = None
    run_attempt: int | None = None
    event: str | None = None
    status: str | None = None
    conclusion: str | None = None
    head_branch: str | None = None
    head_sha: str | None = None
    html_url: str | None = None
    path: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    run_started_at: datetime | None = None
    actor: User | None = None
    triggering_actor: User | None = None
    pull_requests: list[RunPullRequest] = Field(default_factory=list)


class WorkflowRunEvent(_Gh):
    action: _Text
    workflow_run: WorkflowRun
    workflow: Workflow | None = None
    repository: Repository
    sender: User


class _Kind(_Gh):
    action: str | None = None


def _person(user: User | None) -> dict[str, Any] | None:
    return {"login": user.login, "id": user.id} if user is not None else None


def _short(text: str | None) -> str | None:
    return clip(text, _SHORT) if text else text


def _id(text: str | None) -> str | None:
    """A short untrusted field (a state, a branch, a SHA): at most 200 characters."""
    return text[:200] if text else text


def _iso(value: datetime | None) -> str | None:
    found = aware(value)
    return found.isoformat() if found else None


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
        kind = f"{event}.{action}" if action and event != "push" else event
        return SourceEvent(id=delivery[:200], type=kind[:200])  # untrusted: clipped

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
            if kind == "issue_comment":
                return self._comment(source, IssueCommentEvent.model_validate(request.json), tenant)
            if kind == "pull_request_review":
                return self._review(source, PullRequestReviewEvent.model_validate(request.json), tenant)
            if kind == "workflow_run":
                return self._workflow_run(source, WorkflowRunEvent.model_validate(request.json), tenant)
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
                "commits": [
                    {"id": c.id, "message": clip(c.message, _COMMIT_MESSAGE), "url": c.url} for c in event.commits[:50]
                ],
                "commit_count": len(event.commits),
            },
            web_link(
                event.compare,
                head.url if head else None,
                event.repository.html_url,
                label=f"Push to {event.ref.removeprefix('refs/heads/')} in {event.repository.full_name}",
            ),
        )

    def _comment(self, source: SourceEvent, event: IssueCommentEvent, tenant: str | None) -> NormalizedEvent:
        issue, comment = event.issue, event.comment
        on_pr = issue.pull_request is not None
        previous = event.changes.body.from_ if event.changes and event.changes.body else None
        where = f"{'PR' if on_pr else 'issue'} #{issue.number} in {event.repository.full_name}"
        return self._event(
            source,
            event.repository,
            event.sender,
            comment.updated_at or comment.created_at,
            tenant,
            {
                "issue": {
                    "number": issue.number,
                    "title": issue.title,
                    "url": issue.html_url,
                    "state": issue.state,
                    "is_pull_request": on_pr,
                    "author": _person(issue.user),
                },
                "comment": {
                    "id": comment.id,
                    "body": clip(comment.body or "", MAX_DESCRIPTION),
                    "url": comment.html_url,
                    "author_association": comment.author_association,
                    "created_at": _iso(comment.created_at),
                    "updated_at": _iso(comment.updated_at),
                },
                "author": _person(comment.user),
                "previous_body": clip(previous, MAX_DESCRIPTION) if previous is not None else None,
            },
            web_link(comment.html_url, issue.html_url, label=f"Comment on {where}"),
        )

    def _review(self, source: SourceEvent, event: PullRequestReviewEvent, tenant: str | None) -> NormalizedEvent:
        review, pr = event.review, event.pull_request
        return self._event(
            source,
            event.repository,
            event.sender,
            review.submitted_at,
            tenant,
            {
                "pull_request": {
                    "number": pr.number,
                    "title": pr.title,
                    "url": pr.html_url,
                    "state": pr.state,
                    "draft": pr.draft,
                    "author": _person(pr.user),
                },
                "review": {
                    "id": review.id,
                    "state": _id(review.state),
                    "body": clip(review.body or "", MAX_DESCRIPTION),
                    "url": review.html_url,
                    "commit_id": review.commit_id,
                    "submitted_at": _iso(review.submitted_at),
                },
                "reviewer": _person(review.user),
                "source_branch": pr.head.ref,
                "target_branch": pr.base.ref,
                "commits": {"source": pr.head.sha, "target": pr.base.sha},
            },
            web_link(review.html_url, pr.html_url, label=f"Review of PR #{pr.number} in {event.repository.full_name}"),
        )

    def _workflow_run(self, source: SourceEvent, event: WorkflowRunEvent, tenant: str | None) -> NormalizedEvent:
        run, workflow = event.workflow_run, event.workflow or Workflow()
        name = _short(run.name or workflow.name)
        return self._event(
            source,
            event.repository,
            event.sender,
            run.updated_at,
            tenant,
            {
                "workflow": {"id": workflow.id, "name": _short(workflow.name), "path": workflow.path or run.path},
                "workflow_run": {
                    "id": run.id,
                    "name": name,
                    "title": _short(run.display_title),
                    "number": run.run_number,
                    "attempt": run.run_attempt,
                    "event": _id(run.event),
                    "status": _id(run.status),
                    "conclusion": _id(run.conclusion),
                    "url": run.html_url,
                    "created_at": _iso(run.created_at),
                    "started_at": _iso(run.run_started_at),
                    "updated_at": _iso(run.updated_at),
                },
                "branch": _id(run.head_branch),
                "head_sha": _id(run.head_sha),
                "pull_requests": [p.number for p in run.pull_requests[:50]],
                "triggered_by": _person(run.triggering_actor or run.actor),
            },
            web_link(
                run.html_url,
                label=f"Workflow run {name or run.id}"
                + (f" #{run.run_number}" if run.run_number is not None else "")
                + f" in {event.repository.full_name}",
            ),
        )

    def run_title(self, event: NormalizedEvent) -> str:
        payload = event.payload
        repo = payload["repository"]["full_name"]
        kind = event.metadata.get("event_type", "").partition(".")[0]
        if kind == "issue_comment":
            issue = payload["issue"]
            what = f"{'PR' if issue['is_pull_request'] else 'Issue'} #{issue['number']}"
            return f"Comment {payload['action']} on {what} in {repo}: {issue['title']}"[:200]
        if kind == "pull_request_review":
            pr, review = payload["pull_request"], payload["review"]
            return f"Review {payload['action']} ({review['state']}) on PR #{pr['number']} in {repo}: {pr['title']}"[
                :200
            ]
        if kind == "workflow_run":
            run = payload["workflow_run"]
            outcome = run["conclusion"] or run["status"] or payload["action"]
            on = f" on {payload['branch']}" if payload["branch"] else ""
            return f"Workflow {run['name'] or run['id']} {outcome} in {repo}{on}"[:200]
        if "pull_request" in payload:
            pr = payload["pull_request"]
            return f"PR #{pr['number']} {payload['action']} in {repo}: {pr['title']}"[:200]
        if "issue" in payload:
            issue = payload["issue"]
            return f"Issue #{issue['number']} {payload['action']} in {repo}: {issue['title']}"[:200]
        return f"Push to {payload['ref']} in {repo} ({payload['commit_count']} commits)"[:200]
