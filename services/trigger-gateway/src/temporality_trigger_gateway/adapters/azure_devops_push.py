"""The ``azure_devops.push`` source: Azure DevOps service-hook ``git.push`` events (TRG-3/4/8).

``resource`` is the push: ``pushId``, ``pushedBy`` (an identity whose ``id`` may be a GUID or, on old accounts,
``00067FFED5C7AF52@Live.com``), ``refUpdates`` (``name``, ``oldObjectId``, ``newObjectId``; all zeros: the ref was
created or deleted), ``commits`` (``commitId``, ``comment``, ``author``, ``url``: a web URL in newer payloads, a
REST URL in on-prem TFS ones) and ``repository``. Real payloads differ as for pull requests
(``/work/shared/fixtures/webhooks/README.md``): an on-prem TFS sample's ``message.text`` holds the literal characters
``\\r\\n``, and ``notificationId`` repeats across events, so the event id is the payload's ``id`` (the event GUID),
as for every Azure DevOps source. "Resource details to send: Minimal/None" sends less or no ``resource``: accepted,
the missing values ``null``, the run titled from the event's message.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar

from pydantic import Field, ValidationError

from temporality_protocol import Actor, NormalizedEvent
from temporality_trigger_gateway.adapters.azure_devops import (
    AzureDevOpsSource,
    Container,
    Identity,
    Message,
    Repository,
    _Ado,
    _origin,
    _person,
    _without_user,
)
from temporality_trigger_gateway.adapters.base import (
    WebhookRequest,
    aware,
    clip,
    invalid_payload,
    web_link,
)

__all__ = ["PUSH_EVENT_TYPES", "AzureDevOpsPush", "event_message"]

PUSH_EVENT_TYPES = frozenset({"git.push"})
#: The object id of a ref that did not exist before (created) or does not any more (deleted).
_ZERO = "0" * 40
#: At most this many commits and ref updates are passed on (``commit_count`` says how many there were).
MAX_LISTED = 50
#: A commit message longer than this is cut (as the GitHub and GitLab push events do).
MAX_COMMIT_MESSAGE = 4096


class Person(_Ado):
    name: str | None = None
    email: str | None = None
    date: datetime | None = None


class GitCommit(_Ado):
    commit_id: Annotated[str, Field(min_length=1)]
    comment: str | None = None
    author: Person | None = None
    url: str | None = None


class RefUpdate(_Ado):
    name: Annotated[str, Field(min_length=1)]
    old_object_id: str | None = None
    new_object_id: str | None = None


class Push(_Ado):
    """Nothing is required: "Resource details to send: Minimal" sends little more than ``{pushId, url}``."""

    push_id: int | None = None
    commits: list[GitCommit] = Field(default_factory=list)
    ref_updates: list[RefUpdate] = Field(default_factory=list)
    repository: Repository | None = None
    pushed_by: Identity | None = None
    date: datetime | None = None
    url: str | None = None


class PushEvent(_Ado):
    id: Annotated[str, Field(min_length=1)]
    event_type: Annotated[str, Field(min_length=1)]
    publisher_id: str | None = None
    subscription_id: str | None = None
    notification_id: int | str | None = None
    resource_version: str | None = None
    #: ``None``: "Resource details to send: None" (``null`` or absent).
    resource: Push | None = None
    message: Message | None = None
    detailed_message: Message | None = None
    resource_containers: dict[str, Container] | None = None
    created_date: datetime | None = None


def event_message(*messages: Message | None) -> str | None:
    """The first line of the event's first non-empty message (``message``, then ``detailedMessage``), clipped: it
    titles a run whose resource was not sent. An on-prem TFS message may hold the literal characters ``\\r\\n``
    (double-escaped, not a line break): cut there too."""
    text = next((m.text.strip() for m in messages if m and m.text and m.text.strip()), None)
    if text is None:
        return None
    first = text.splitlines()[0].split("\\r\\n")[0].split("\\n")[0].strip()
    return clip(first or text, 200)


def _branch(ref: str) -> str | None:
    return ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else None


def _ref(update: RefUpdate) -> dict[str, Any]:
    return {
        "ref": update.name,
        "branch": _branch(update.name),
        "tag": update.name.removeprefix("refs/tags/") if update.name.startswith("refs/tags/") else None,
        "before": update.old_object_id,
        "after": update.new_object_id,
        "created": update.old_object_id == _ZERO,
        "deleted": update.new_object_id == _ZERO,
    }


def _repository_page(repo: Repository | None) -> str | None:
    """The repository's web page: ``webUrl`` when sent, else its clone URL (``remoteUrl``, the ``org@`` dropped),
    which is the same page in Azure DevOps (``…/_git/<repo>``)."""
    if repo is None:
        return None
    return repo.web_url or _without_user(repo.remote_url)


class AzureDevOpsPush(AzureDevOpsSource):
    name: ClassVar[str] = "azure_devops.push"
    event_types: ClassVar[frozenset[str] | None] = PUSH_EVENT_TYPES
    noun: ClassVar[str] = "push"

    def normalize(self, request: WebhookRequest, *, tenant: str | None) -> NormalizedEvent:
        event_type = self.identify(request).type  # another event's resource is not checked as a push's
        if (refused := self.other_event(event_type)) is not None:
            raise refused
        try:
            event = PushEvent.model_validate(request.json)
        except ValidationError as exc:
            raise invalid_payload(self.name, exc) from exc
        push = event.resource or Push()
        repo = push.repository or Repository()
        project = repo.project.name if repo.project else None
        collection = (event.resource_containers or {}).get("collection")
        api_url = repo.url or push.url
        source = (
            collection.base_url
            if collection and collection.base_url
            else (_origin(api_url) if api_url else "azure_devops")
        )
        refs = [_ref(u) for u in push.ref_updates[:MAX_LISTED]]
        branch = next((r["branch"] for r in refs if r["branch"]), None)
        page = _repository_page(push.repository)
        head = push.ref_updates[0].new_object_id if len(push.ref_updates) == 1 else None
        commit_page = f"{page.rstrip('/')}/commit/{head}" if page and head and head != _ZERO else None
        where = branch or (refs[0]["ref"] if refs else None)
        metadata = {
            "event_type": event.event_type,
            "notification_id": event.notification_id,
            "subscription_id": event.subscription_id,
            "publisher_id": event.publisher_id,
            "resource_version": event.resource_version,
            "message": event_message(event.message, event.detailed_message) if not refs else None,
        }
        pusher = push.pushed_by
        return NormalizedEvent(
            id=event.id[:200],  # as identify_azure_devops: untrusted, clipped
            type=f"azure_devops.{event.event_type}",
            source=source,
            timestamp=aware(push.date) or aware(event.created_date) or datetime.now(UTC),
            actor=Actor(id=pusher.unique_name or pusher.id, display_name=pusher.display_name) if pusher else None,
            tenant=tenant or project,
            payload={
                "repository": {"id": repo.id, "name": repo.name, "url": page, "project": project},
                "push": {"id": push.push_id, "url": push.url},
                "pushed_by": _person(pusher),
                "branch": branch,
                "ref_updates": refs,
                "commits": [
                    {
                        "id": c.commit_id,
                        "message": clip(c.comment or "", MAX_COMMIT_MESSAGE),
                        "author": c.author.name if c.author else None,
                        "url": c.url,
                    }
                    for c in push.commits[:MAX_LISTED]
                ],
                "commit_count": len(push.commits),
            },
            metadata={k: str(v) for k, v in metadata.items() if v is not None},
            source_link=web_link(
                commit_page,
                page,
                label=f"Push to {where}" + (f" in {repo.name}" if repo.name else "") if where else None,
            ),
        )

    def run_title(self, event: NormalizedEvent) -> str:
        payload = event.payload
        refs = payload["ref_updates"]
        if not refs:  # "Resource details to send: Minimal/None": the event's message, else its type
            return (event.metadata.get("message") or "Push")[:200]
        where = payload["branch"] or refs[0]["ref"]
        repo = payload["repository"]["name"]
        return f"Push to {where}{f' in {repo}' if repo else ''} ({payload['commit_count']} commits)"[:200]
