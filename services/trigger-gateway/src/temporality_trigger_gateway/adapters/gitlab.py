"""The ``gitlab`` source: GitLab project webhooks (merge request, push, tag push, issue, comment and pipeline hooks).

The event type is the body's ``object_kind`` plus what tells its events apart: for merge requests and issues
``object_attributes.action`` (``merge_request.open``, ``issue.close``), for comments what was commented on
(``object_attributes.noteable_type``: ``note.merge_request``, ``note.issue``, ``note.commit``), for pipelines
their ``object_attributes.status`` (``pipeline.failed``, ``pipeline.success``); ``push`` and ``tag_push`` as they
are. The event id is the ``Idempotency-Key`` header (GitLab keeps it across retries of one event), else
``X-Gitlab-Event-UUID`` (older GitLab); a delivery with neither is refused (422): the body has no id of the event
itself. Authenticate with ``auth: {type: gitlab, secret_env: …}`` (GitLab's secret token in ``X-Gitlab-Token``).
Other hooks (wiki pages, jobs, releases, snippet comments, a pipeline status no trigger can list such as
``created``) are valid events a trigger cannot list: answered 200 ``ignored``. Confidential issues and comments
(``event_type: confidential_issue`` / ``confidential_note``) come as ``issue`` / ``note`` hooks and are mapped alike.
Comment, issue and commit texts are untrusted and clipped.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_protocol import Actor, NormalizedEvent, SourceLink
from temporality_protocol.events import MAX_LINK
from temporality_trigger_gateway.adapters.base import (
    MAX_DESCRIPTION,
    Adapter,
    SourceEvent,
    WebhookRequest,
    clip,
    invalid_payload,
    missing_header,
    web_link,
)
from temporality_trigger_gateway.errors import InvalidPayload

__all__ = ["GITLAB_EVENT_TYPES", "GitLab"]

_MR_ACTIONS = ("open", "update", "close", "reopen", "merge", "approved", "unapproved")
_ISSUE_ACTIONS = ("open", "update", "close", "reopen")
#: What a comment can be on (``noteable_type``, in snake case); snippet comments are not mapped.
_NOTEABLES = {"MergeRequest": "merge_request", "Issue": "issue", "Commit": "commit"}
_PIPELINE_STATUSES = ("pending", "running", "success", "failed", "canceled", "skipped", "manual")
GITLAB_EVENT_TYPES = frozenset(
    {f"merge_request.{a}" for a in _MR_ACTIONS}
    | {f"issue.{a}" for a in _ISSUE_ACTIONS}
    | {f"note.{n}" for n in _NOTEABLES.values()}
    | {f"pipeline.{s}" for s in _PIPELINE_STATUSES}
    | {"push", "tag_push"}
)
#: A commit message longer than this is cut.
_COMMIT_MESSAGE = 4096
#: At most this many jobs, labels and assignees are passed on.
_LISTED = 50
_Text = Annotated[str, Field(min_length=1)]


class _Gl(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class User(_Gl):
    username: _Text
    name: str | None = None
    id: int | None = None


class Project(_Gl):
    id: int | None = None
    path_with_namespace: _Text
    web_url: _Text
    namespace: str | None = None
    default_branch: str | None = None


class LastCommit(_Gl):
    id: _Text


class MergeRequest(_Gl):
    id: int
    iid: Annotated[int, Field(ge=1)]
    title: str
    description: str | None = None
    state: str | None = None
    action: str | None = None
    url: str | None = None
    source_branch: _Text
    target_branch: _Text
    last_commit: LastCommit | None = None
    updated_at: str | None = None


class MergeRequestEvent(_Gl):
    object_kind: _Text
    user: User
    project: Project
    object_attributes: MergeRequest


class Commit(_Gl):
    id: _Text
    message: str = ""
    url: str | None = None
    timestamp: datetime | None = None


class PushEvent(_Gl):
    object_kind: _Text
    ref: _Text
    before: _Text
    after: _Text
    checkout_sha: str | None = None
    user_username: _Text
    user_name: str | None = None
    project: Project
    commits: list[Commit] = Field(default_factory=list)
    total_commits_count: int | None = None


class Label(_Gl):
    title: str | None = None


class IssueAttributes(_Gl):
    id: int
    iid: Annotated[int, Field(ge=1)]
    title: str
    description: str | None = None
    state: str | None = None
    action: str | None = None
    url: str | None = None
    confidential: bool | None = None


class Assignee(_Gl):
    username: str | None = None


class IssueEvent(_Gl):
    object_kind: _Text
    user: User
    project: Project
    object_attributes: IssueAttributes
    labels: list[Label] | None = None
    assignees: list[Assignee] | None = None
    changes: dict[str, Any] | None = None


class Position(_Gl):
    """Where a diff comment is (``DiffNote``): the new side's path and line, else the old side's."""

    new_path: str | None = None
    old_path: str | None = None
    new_line: int | None = None
    old_line: int | None = None


class NoteAttributes(_Gl):
    id: int
    note: str | None = None
    noteable_type: _Text
    type: str | None = None
    action: str | None = None
    system: bool | None = None
    url: str | None = None
    commit_id: str | None = None
    discussion_id: str | None = None
    position: Position | None = None


class NotedMergeRequest(_Gl):
    id: int | None = None
    iid: Annotated[int, Field(ge=1)]
    title: str
    state: str | None = None
    url: str | None = None
    source_branch: str | None = None
    target_branch: str | None = None


class NotedIssue(_Gl):
    id: int | None = None
    iid: Annotated[int, Field(ge=1)]
    title: str
    state: str | None = None
    url: str | None = None


class NotedCommit(_Gl):
    id: _Text
    message: str = ""
    url: str | None = None


class NoteEvent(_Gl):
    object_kind: _Text
    user: User
    project: Project
    object_attributes: NoteAttributes
    merge_request: NotedMergeRequest | None = None
    issue: NotedIssue | None = None
    commit: NotedCommit | None = None


class PipelineAttributes(_Gl):
    id: int
    iid: int | None = None
    name: str | None = None
    ref: str | None = None
    tag: bool | None = None
    sha: str | None = None
    before_sha: str | None = None
    source: str | None = None
    status: _Text
    detailed_status: str | None = None
    stages: list[str] | None = None
    created_at: str | None = None
    finished_at: str | None = None
    duration: float | None = None
    url: str | None = None


class PipelineMergeRequest(_Gl):
    iid: int | None = None
    title: str | None = None
    url: str | None = None


class Job(_Gl):
    id: int | None = None
    name: str | None = None
    stage: str | None = None
    status: str | None = None
    allow_failure: bool | None = None
    failure_reason: str | None = None


class PipelineEvent(_Gl):
    object_kind: _Text
    #: The pipeline's user; ``null`` for some pipelines (a schedule's whose owner left).
    user: User | None = None
    project: Project
    object_attributes: PipelineAttributes
    merge_request: PipelineMergeRequest | None = None
    commit: Commit | None = None
    builds: list[Job] | None = None


class _Kind(_Gl):
    object_kind: _Text
    object_attributes: dict[str, Any] | None = None


def _id(text: str | None) -> str | None:
    """A short untrusted field (a status, a ref, a SHA): at most 200 characters."""
    return text[:200] if text else text


def _project(project: Project) -> dict[str, Any]:
    return {"id": project.id, "path": project.path_with_namespace, "url": project.web_url[:MAX_LINK]}


class GitLab(Adapter):
    name: ClassVar[str] = "gitlab"
    event_types: ClassVar[frozenset[str] | None] = GITLAB_EVENT_TYPES
    auth_types: ClassVar[frozenset[str]] = frozenset({"gitlab"})
    delivery_id_headers: ClassVar[tuple[str, ...]] = ("X-Gitlab-Event-UUID", "Idempotency-Key")

    def identify(self, request: WebhookRequest) -> SourceEvent:
        event_id = request.headers.get("idempotency-key") or request.headers.get("x-gitlab-event-uuid")
        if not event_id:
            raise missing_header(self.name, "Idempotency-Key or X-Gitlab-Event-UUID")
        try:
            kind = _Kind.model_validate(request.json)
        except ValidationError as exc:
            raise invalid_payload(self.name, exc) from exc
        attributes = kind.object_attributes or {}
        action = attributes.get("action")
        if kind.object_kind in ("merge_request", "issue") and isinstance(action, str) and action:
            return SourceEvent(id=event_id[:200], type=f"{kind.object_kind}.{action}"[:200])
        noteable = attributes.get("noteable_type")
        if kind.object_kind == "note" and isinstance(noteable, str) and noteable:
            return SourceEvent(id=event_id[:200], type=f"note.{_NOTEABLES.get(noteable, noteable.lower())}"[:200])
        status = attributes.get("status")
        if kind.object_kind == "pipeline" and isinstance(status, str) and status:
            return SourceEvent(id=event_id[:200], type=f"pipeline.{status}"[:200])
        return SourceEvent(id=event_id[:200], type=kind.object_kind[:200])

    def normalize(self, request: WebhookRequest, *, tenant: str | None) -> NormalizedEvent:
        source = self.identify(request)
        try:
            if source.type.startswith("merge_request."):
                return self._merge_request(source, MergeRequestEvent.model_validate(request.json), tenant)
            if source.type in ("push", "tag_push"):
                return self._push(source, PushEvent.model_validate(request.json), tenant)
            if source.type.startswith("issue."):
                return self._issue(source, IssueEvent.model_validate(request.json), tenant)
            if source.type in {f"note.{n}" for n in _NOTEABLES.values()}:
                return self._note(source, NoteEvent.model_validate(request.json), tenant)
            if source.type.startswith("pipeline."):
                return self._pipeline(source, PipelineEvent.model_validate(request.json), tenant)
        except ValidationError as exc:
            raise invalid_payload(self.name, exc) from exc
        raise InvalidPayload(
            f"{source.type!r} is not an event the gitlab source maps",
            [{"loc": ["object_kind"], "msg": "unsupported event", "type": "value_error"}],
        )

    def _event(
        self,
        source: SourceEvent,
        project: Project,
        actor: Actor | None,
        tenant: str | None,
        payload: dict[str, Any],
        link: SourceLink | None,
    ) -> NormalizedEvent:
        return NormalizedEvent(
            id=source.id,
            type=f"gitlab.{source.type}",
            source=project.web_url[:MAX_LINK],
            timestamp=datetime.now(UTC),  # GitLab's own times are not in one format across versions
            actor=actor,
            tenant=tenant or project.namespace or project.path_with_namespace.partition("/")[0],
            payload={"project": _project(project), **payload},
            metadata={"event_type": source.type, "event_id": source.id},
            source_link=link,
        )

    def _merge_request(self, source: SourceEvent, event: MergeRequestEvent, tenant: str | None) -> NormalizedEvent:
        mr = event.object_attributes
        return self._event(
            source,
            event.project,
            Actor(id=event.user.username, display_name=event.user.name),
            tenant,
            {
                "action": mr.action,
                "merge_request": {
                    "iid": mr.iid,
                    "id": mr.id,
                    "title": mr.title,
                    "description": clip(mr.description or "", MAX_DESCRIPTION),
                    "url": mr.url,
                    "state": mr.state,
                },
                "source_branch": mr.source_branch,
                "target_branch": mr.target_branch,
                "author": {"username": event.user.username, "name": event.user.name},
                "commits": {"source": mr.last_commit.id if mr.last_commit else None},
            },
            web_link(mr.url, label=f"MR !{mr.iid} in {event.project.path_with_namespace}"),
        )

    def _push(self, source: SourceEvent, event: PushEvent, tenant: str | None) -> NormalizedEvent:
        return self._event(
            source,
            event.project,
            Actor(id=event.user_username, display_name=event.user_name),
            tenant,
            {
                "ref": event.ref,
                "branch": event.ref.removeprefix("refs/heads/") if event.ref.startswith("refs/heads/") else None,
                "before": event.before,
                "after": event.after,
                "commits": [
                    {"id": c.id, "message": clip(c.message, _COMMIT_MESSAGE), "url": c.url} for c in event.commits[:50]
                ],
                "commit_count": event.total_commits_count
                if event.total_commits_count is not None
                else len(event.commits),
            },
            web_link(
                *(c.url for c in event.commits if c.id in (event.checkout_sha, event.after)),
                event.project.web_url,
                label=f"Push to {event.ref.removeprefix('refs/heads/')} in {event.project.path_with_namespace}",
            ),
        )

    def _issue(self, source: SourceEvent, event: IssueEvent, tenant: str | None) -> NormalizedEvent:
        issue = event.object_attributes
        return self._event(
            source,
            event.project,
            Actor(id=event.user.username, display_name=event.user.name),
            tenant,
            {
                "action": issue.action,
                "issue": {
                    "iid": issue.iid,
                    "id": issue.id,
                    "title": issue.title,
                    "description": clip(issue.description or "", MAX_DESCRIPTION),
                    "url": issue.url,
                    "state": issue.state,
                    "confidential": issue.confidential,
                    "labels": [label.title for label in (event.labels or [])[:_LISTED] if label.title],
                },
                "assignees": [a.username for a in (event.assignees or [])[:_LISTED] if a.username],
                "changed": sorted(event.changes or {})[:_LISTED],
                "author": {"username": event.user.username, "name": event.user.name},
            },
            web_link(issue.url, label=f"Issue #{issue.iid} in {event.project.path_with_namespace}"),
        )

    def _note(self, source: SourceEvent, event: NoteEvent, tenant: str | None) -> NormalizedEvent:
        note = event.object_attributes
        noteable = source.type.removeprefix("note.")
        path = event.project.path_with_namespace
        position = note.position
        what: dict[str, Any] = {}
        on = noteable.replace("_", " ")
        page: str | None = None
        if noteable == "merge_request" and event.merge_request is not None:
            mr = event.merge_request
            # A comment's MR has no url in GitLab's payload (its issue does): the MR's page is the project's + iid.
            page = mr.url or f"{event.project.web_url.rstrip('/')}/-/merge_requests/{mr.iid}"
            what["merge_request"] = {
                "iid": mr.iid,
                "id": mr.id,
                "title": mr.title,
                "url": page,
                "state": mr.state,
                "source_branch": mr.source_branch,
                "target_branch": mr.target_branch,
            }
            on = f"MR !{mr.iid}"
        elif noteable == "issue" and event.issue is not None:
            issue = event.issue
            page = issue.url or f"{event.project.web_url.rstrip('/')}/-/issues/{issue.iid}"
            what["issue"] = {
                "iid": issue.iid,
                "id": issue.id,
                "title": issue.title,
                "url": page,
                "state": issue.state,
            }
            on = f"issue #{issue.iid}"
        elif noteable == "commit" and event.commit is not None:
            commit = event.commit
            what["commit"] = {"id": commit.id, "message": clip(commit.message, _COMMIT_MESSAGE), "url": commit.url}
            on, page = f"commit {commit.id[:12]}", commit.url
        return self._event(
            source,
            event.project,
            Actor(id=event.user.username, display_name=event.user.name),
            tenant,
            {
                "action": note.action,
                "noteable_type": noteable,
                "note": {
                    "id": note.id,
                    "body": clip(note.note or "", MAX_DESCRIPTION),
                    "url": note.url,
                    "type": note.type,
                    "system": note.system,
                    "discussion_id": note.discussion_id,
                    "path": (position.new_path or position.old_path) if position else None,
                    "line": (position.new_line or position.old_line) if position else None,
                },
                **what,
                "author": {"username": event.user.username, "name": event.user.name},
            },
            web_link(note.url, page, label=f"Comment on {on} in {path}"),
        )

    def _pipeline(self, source: SourceEvent, event: PipelineEvent, tenant: str | None) -> NormalizedEvent:
        pipeline = event.object_attributes
        jobs = event.builds or []
        failed = [j for j in jobs if j.status == "failed" and not j.allow_failure]
        mr = event.merge_request
        page = pipeline.url or f"{event.project.web_url.rstrip('/')}/-/pipelines/{pipeline.id}"
        user = event.user
        return self._event(
            source,
            event.project,
            Actor(id=user.username, display_name=user.name) if user else None,
            tenant,
            {
                "pipeline": {
                    "id": pipeline.id,
                    "iid": pipeline.iid,
                    "name": clip(pipeline.name, 200) if pipeline.name else None,
                    "status": _id(pipeline.status),
                    "detailed_status": _id(pipeline.detailed_status),
                    "source": _id(pipeline.source),
                    "ref": _id(pipeline.ref),
                    "tag": pipeline.tag,
                    "sha": _id(pipeline.sha),
                    "before_sha": _id(pipeline.before_sha),
                    "stages": [s[:200] for s in (pipeline.stages or [])[:_LISTED]],
                    "created_at": pipeline.created_at,
                    "finished_at": pipeline.finished_at,
                    "duration_s": pipeline.duration,
                    "url": page[:MAX_LINK],
                },
                "branch": _id(pipeline.ref) if pipeline.ref and not pipeline.tag else None,
                "merge_request": {"iid": mr.iid, "title": mr.title, "url": mr.url} if mr and mr.iid else None,
                "commit": {
                    "id": event.commit.id,
                    "message": clip(event.commit.message, _COMMIT_MESSAGE),
                    "url": event.commit.url,
                }
                if event.commit
                else None,
                "failed_jobs": [
                    {"id": j.id, "name": j.name, "stage": j.stage, "failure_reason": j.failure_reason}
                    for j in failed[:_LISTED]
                ],
                "job_count": len(jobs),
                "author": {"username": user.username, "name": user.name} if user else None,
            },
            web_link(page, label=f"Pipeline #{pipeline.id} in {event.project.path_with_namespace}"),
        )

    def run_title(self, event: NormalizedEvent) -> str:
        payload = event.payload
        path = payload["project"]["path"]
        kind = event.metadata.get("event_type", "").partition(".")[0]
        if kind == "issue":
            issue = payload["issue"]
            return f"Issue #{issue['iid']} {payload['action']} in {path}: {issue['title']}"[:200]
        if kind == "note":
            where, title = payload["noteable_type"].replace("_", " "), None
            if "merge_request" in payload:
                where, title = f"MR !{payload['merge_request']['iid']}", payload["merge_request"]["title"]
            elif "issue" in payload:
                where, title = f"issue #{payload['issue']['iid']}", payload["issue"]["title"]
            elif "commit" in payload:
                where = f"commit {payload['commit']['id'][:12]}"
            return (f"Comment on {where} in {path}" + (f": {title}" if title else ""))[:200]
        if kind == "pipeline":
            pipeline = payload["pipeline"]
            on = f" ({pipeline['ref']})" if pipeline["ref"] else ""
            return f"Pipeline #{pipeline['id']} {pipeline['status']} in {path}{on}"[:200]
        if "merge_request" in payload:
            mr = payload["merge_request"]
            return f"MR !{mr['iid']} {payload['action']} in {path}: {mr['title']}"[:200]
        return f"Push to {payload['ref']} in {path} ({payload['commit_count']} commits)"[:200]
