"""The ``gitlab`` source: GitLab project webhooks (merge request hooks, push hooks).

The event type is the body's ``object_kind`` plus, for merge requests, ``object_attributes.action``
(``merge_request.open``, ``merge_request.update``, ``push``). The event id is the ``Idempotency-Key``
header (GitLab keeps it across retries of one event), else ``X-Gitlab-Event-UUID`` (older GitLab); a
delivery with neither is refused (422): the body has no id of the event itself. Authenticate with
``auth: {type: gitlab, secret_env: …}`` (GitLab's secret token in ``X-Gitlab-Token``). Other hooks
(issues, notes, pipelines) are valid events a trigger cannot list: answered 200 ``ignored``.
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
    clip,
    invalid_payload,
    missing_header,
    web_link,
)
from temporality_trigger_gateway.errors import InvalidPayload

__all__ = ["GITLAB_EVENT_TYPES", "GitLab"]

_MR_ACTIONS = ("open", "update", "close", "reopen", "merge", "approved", "unapproved")
GITLAB_EVENT_TYPES = frozenset({f"merge_request.{a}" for a in _MR_ACTIONS} | {"push", "tag_push"})
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


class _Kind(_Gl):
    object_kind: _Text
    object_attributes: dict[str, Any] | None = None


def _project(project: Project) -> dict[str, Any]:
    return {"id": project.id, "path": project.path_with_namespace, "url": project.web_url}


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
        action = (kind.object_attributes or {}).get("action")
        if kind.object_kind == "merge_request" and isinstance(action, str) and action:
            return SourceEvent(id=event_id[:200], type=f"merge_request.{action}")
        return SourceEvent(id=event_id[:200], type=kind.object_kind)

    def normalize(self, request: WebhookRequest, *, tenant: str | None) -> NormalizedEvent:
        source = self.identify(request)
        try:
            if source.type.startswith("merge_request."):
                return self._merge_request(source, MergeRequestEvent.model_validate(request.json), tenant)
            if source.type in ("push", "tag_push"):
                return self._push(source, PushEvent.model_validate(request.json), tenant)
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
        actor: Actor,
        tenant: str | None,
        payload: dict[str, Any],
        link: SourceLink | None,
    ) -> NormalizedEvent:
        return NormalizedEvent(
            id=source.id,
            type=f"gitlab.{source.type}",
            source=project.web_url,
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
                "commits": [{"id": c.id, "message": clip(c.message, 4096), "url": c.url} for c in event.commits[:50]],
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

    def run_title(self, event: NormalizedEvent) -> str:
        payload = event.payload
        path = payload["project"]["path"]
        if "merge_request" in payload:
            mr = payload["merge_request"]
            return f"MR !{mr['iid']} {payload['action']} in {path}: {mr['title']}"[:200]
        return f"Push to {payload['ref']} in {path} ({payload['commit_count']} commits)"[:200]
