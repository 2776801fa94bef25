"""The ``azure_devops.pull_request`` adapter: Azure DevOps service-hook PR events (TRG-3/4/8).

Real payloads differ (``/work/shared/fixtures/webhooks/README.md``): some start with a UTF-8 BOM
(cut off before parsing: by the one-pass read here, else by ``parse_json``), aspnet-era ones have no
``resourceContainers`` or ``resourceVersion``, docs-era ones no ``subscriptionId``/``notificationId``, and
``notificationId`` repeats across unrelated events — so the event id is the payload's ``id``
(the event GUID) and nothing else. ``git.pullrequest.merged`` means "merge attempted"; a
completed PR arrives as ``git.pullrequest.updated`` with ``status: completed``.

Models read tolerantly (unknown fields ignored) and require only what the mapping needs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import Annotated, Any, ClassVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from temporality_protocol import Actor, NormalizedEvent
from temporality_trigger_gateway.adapters.base import (
    MAX_DESCRIPTION,
    Adapter,
    SourceEvent,
    WebhookRequest,
    aware,
    clip,
    invalid_payload,
    web_link,
)
from temporality_trigger_gateway.errors import InvalidPayload

__all__ = [
    "MEMO_KEY",
    "TEST_SUBSCRIPTION_ID",
    "AzureDevOpsPullRequest",
    "AzureDevOpsSource",
    "PullRequestEvent",
    "azure_devops_test_notification",
    "identify_azure_devops",
]

_Text = Annotated[str, Field(min_length=1)]


class _Ado(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, alias_generator=to_camel)


class _Envelope(_Ado):
    """What every Azure DevOps service-hook event has. ``resource`` is ``null`` or absent when the subscription
    sends "Resource details: None"."""

    id: _Text
    event_type: _Text
    resource: dict[str, Any] | None = None


class Identity(_Ado):
    id: _Text
    display_name: str | None = None
    unique_name: str | None = None


class Project(_Ado):
    id: _Text
    name: _Text
    url: str | None = None


class Repository(_Ado):
    id: str | None = None
    name: str | None = None
    url: str | None = None
    project: Project | None = None
    remote_url: str | None = None
    web_url: str | None = None


class Href(_Ado):
    href: str | None = None


class CommitRef(_Ado):
    commit_id: _Text


class PullRequest(_Ado):
    """Only ``pullRequestId`` is required: "Resource details to send: Minimal" sends ``{pullRequestId, url}``
    (sometimes a bare ``repository``); what is absent is ``null`` in the event."""

    pull_request_id: Annotated[int, Field(ge=1)]
    repository: Repository | None = None
    title: str | None = None
    description: str | None = None
    status: str | None = None
    url: str | None = None
    created_by: Identity | None = None
    creation_date: datetime | None = None
    source_ref_name: str | None = None
    target_ref_name: str | None = None
    reviewers: list[Identity] | None = None
    last_merge_source_commit: CommitRef | None = None
    last_merge_target_commit: CommitRef | None = None
    links: dict[str, Href] | None = Field(default=None, alias="_links")


class Container(_Ado):
    id: str | None = None
    base_url: str | None = None


class Message(_Ado):
    text: str | None = None


class PullRequestEvent(_Ado):
    id: _Text
    event_type: _Text
    publisher_id: str | None = None
    subscription_id: str | None = None
    notification_id: int | str | None = None
    resource_version: str | None = None
    #: ``None``: "Resource details to send: None" (``null`` or absent).
    resource: PullRequest | None = None
    message: Message | None = None
    detailed_message: Message | None = None
    resource_containers: dict[str, Container] | None = None
    created_date: datetime | None = None


def identify_azure_devops(adapter: str, request: WebhookRequest) -> SourceEvent:
    """Every Azure DevOps service-hook event: the event GUID ``id`` and ``eventType``."""
    try:
        envelope = _Envelope.model_validate(request.json)
    except ValidationError as exc:
        raise invalid_payload(adapter, exc) from exc
    return SourceEvent(id=envelope.id[:200], type=envelope.event_type[:200])  # untrusted: clipped as other sources'


#: The ``subscriptionId`` of the sample event Azure DevOps' *Test* button sends from the service hook wizard
#: (Fabrikam's PR #1, Jamal Hartnett, ...): no subscription has it, so a delivery naming it is never a real event.
TEST_SUBSCRIPTION_ID = "00000000-0000-0000-0000-000000000000"
TEST_NOTIFICATION = "Azure DevOps test notification (subscriptionId {id}: sample data): accepted, no run started"


def azure_devops_test_notification(subscription_id: object) -> str | None:
    """The test notification's description when ``subscription_id`` (the body's ``subscriptionId``) is the one
    Azure DevOps' *Test* button sends, else ``None``."""
    if subscription_id == TEST_SUBSCRIPTION_ID:
        return TEST_NOTIFICATION.format(id=TEST_SUBSCRIPTION_ID)
    return None


def _subscription_id(request: WebhookRequest) -> object:
    """The body's ``subscriptionId`` as sent (``None``: none, or a body that is not an object)."""
    body = request.json
    return body.get("subscriptionId") if isinstance(body, dict) else None


class AzureDevOpsSource(Adapter):
    """What every Azure DevOps service-hook source shares: Basic, bearer or secret-header auth, the event id and
    type from the body (:func:`identify_azure_devops`), the *Test* button's sample answered as a test
    notification, and the refusal of another source's event (:meth:`other_event`)."""

    auth_types: ClassVar[frozenset[str]] = frozenset({"basic", "bearer", "header"})
    id_in_body: ClassVar[bool] = True  # signed with the body by a verifier that signs it
    #: What this source's events are called in a refusal ("a build event").
    noun: ClassVar[str]

    def identify(self, request: WebhookRequest) -> SourceEvent:
        return identify_azure_devops(self.name, request)

    def test_notification(self, request: WebhookRequest) -> str | None:
        return azure_devops_test_notification(_subscription_id(request))

    def other_event(self, event_type: str) -> InvalidPayload | None:
        """The refusal of ``event_type`` when it is not one of this source's, else ``None``."""
        types = self.event_types or frozenset()
        if event_type in types:
            return None
        return InvalidPayload(
            f"{event_type!r} is not a {self.noun} event ({', '.join(sorted(types))})",
            [{"loc": ["eventType"], "msg": f"not a {self.noun} event", "type": "value_error"}],
        )


_BOM = b"\xef\xbb\xbf"
#: The key of the validated event (or ``None``: the general path) in :attr:`WebhookRequest.memo`.
MEMO_KEY = "azure_devops.pull_request"


def _pull_request_event(request: WebhookRequest) -> PullRequestEvent | None:
    """The body as a :class:`PullRequestEvent`, parsed and validated from its bytes in one pass of
    pydantic-core (no Python value for a field the event does not read), or ``None``: the delivery takes
    the general path (:attr:`WebhookRequest.json`, then validation), which decides and words every refusal
    as before. Only a body that path would accept as the same event gets here: pydantic-core's parser
    refuses what ``parse_json`` does (not UTF-8, not JSON, lone surrogate escapes, numbers out of range,
    nesting too deep for it -- then the general path decides) but for ``NaN``/``Infinity`` literals (any
    occurrence of those words sends the body the general way) and a float literal no float holds
    (``1e999999``) in a field the event does not read, which is dropped with it instead of refused (a 202
    where the general path answers 400: no such value reaches anything). Kept in ``request.memo`` for
    :meth:`AzureDevOpsPullRequest.normalize`."""
    memo = request.memo
    if MEMO_KEY in memo:
        found: PullRequestEvent | None = memo[MEMO_KEY]
        return found
    raw = request.body
    if raw.startswith(_BOM):
        raw = raw[3:]
    event = None
    if b"NaN" not in raw and b"Infinity" not in raw:
        try:
            event = PullRequestEvent.model_validate_json(raw)
        except ValidationError:
            pass
    memo[MEMO_KEY] = event
    return event


def _branch(ref: str | None) -> str | None:
    return ref.removeprefix("refs/heads/") if ref else None


# The two URL helpers run on every event and see the same few repositories: cached (urlsplit is pure Python),
# a URL up to this long only (a sender's longer strings are worked out each time, never kept).
_CACHED_URL = 2048


def _origin(url: str) -> str:
    """The ``scheme://host`` of a URL (the event's ``source``), else the URL as is: one ``urlsplit`` refuses
    (``https://[x/…``: ValueError) or that has no scheme or host."""
    return _cached_origin(url) if len(url) <= _CACHED_URL else _split_origin(url)


def _split_origin(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else url


_cached_origin = lru_cache(maxsize=1024)(_split_origin)


def _without_user(url: str | None) -> str | None:
    """``https://org@dev.azure.com/…`` (a ``remoteUrl``) without the ``org@``; ``None`` for a URL ``urlsplit``
    refuses (``https://[x/…``: ValueError): no link is built from it."""
    if not url:
        return None
    return _cached_without_user(url) if len(url) <= _CACHED_URL else _split_without_user(url)


def _split_without_user(url: str) -> str | None:
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


_cached_without_user = lru_cache(maxsize=1024)(_split_without_user)


def _pr_page(pr: PullRequest) -> str | None:
    """The PR's web page: ``_links.web`` (newer payloads), else the repository's web URL or clone URL
    plus ``/pullrequest/<id>`` (what Azure DevOps' own PR links look like)."""
    web = (pr.links or {}).get("web")
    if web and web.href:
        return web.href
    if pr.repository is None:
        return None
    base = pr.repository.web_url or _without_user(pr.repository.remote_url)
    return f"{base.rstrip('/')}/pullrequest/{pr.pull_request_id}" if base else None


def _person(identity: Identity | None) -> dict[str, Any] | None:
    if identity is None:
        return None
    return {"id": identity.id, "display_name": identity.display_name, "unique_name": identity.unique_name}


PR_EVENT_TYPES = frozenset({"git.pullrequest.created", "git.pullrequest.updated", "git.pullrequest.merged"})


class AzureDevOpsPullRequest(AzureDevOpsSource):
    name: ClassVar[str] = "azure_devops.pull_request"
    event_types: ClassVar[frozenset[str] | None] = PR_EVENT_TYPES
    noun: ClassVar[str] = "pull request"
    reads_raw_body: ClassVar[bool] = True  # identify reads it (_pull_request_event), or parses it first

    def identify(self, request: WebhookRequest) -> SourceEvent:
        event = _pull_request_event(request)
        if event is not None:  # a valid PR event is a valid envelope with the same id and type
            return SourceEvent(id=event.id, type=event.event_type)
        return identify_azure_devops(self.name, request)

    def test_notification(self, request: WebhookRequest) -> str | None:
        event = _pull_request_event(request)  # (memoized by identify)
        return azure_devops_test_notification(event.subscription_id if event is not None else _subscription_id(request))

    def normalize(self, request: WebhookRequest, *, tenant: str | None) -> NormalizedEvent:
        event = _pull_request_event(request)
        if event is None:
            try:
                event = PullRequestEvent.model_validate(request.json)
            except ValidationError as exc:
                raise invalid_payload(self.name, exc) from exc
        if (refused := self.other_event(event.event_type)) is not None:
            raise refused
        pr = event.resource
        repo = (pr.repository if pr else None) or Repository()
        project = repo.project.name if repo.project else None
        collection = (event.resource_containers or {}).get("collection")
        api_url = repo.url or (pr.url if pr else None)
        source = (
            collection.base_url
            if collection and collection.base_url
            else (_origin(api_url) if api_url else "azure_devops")
        )
        created_at = aware(pr.creation_date) if pr else None
        author = pr.created_by if pr else None
        # With "Resource details to send: Minimal/None" the PR has no title: the event's message stands in
        # for it in the run's title ("Jamal Hartnett created a new pull request").
        message = next(
            (m.text.strip() for m in (event.message, event.detailed_message) if m and m.text and m.text.strip()),
            None,
        )
        metadata = {
            "event_type": event.event_type,
            "notification_id": event.notification_id,
            "subscription_id": event.subscription_id,
            "publisher_id": event.publisher_id,
            "resource_version": event.resource_version,
            "message": clip(message.splitlines()[0], 200) if message and (pr is None or pr.title is None) else None,
        }
        pr_id = pr.pull_request_id if pr else None
        return NormalizedEvent(
            id=event.id[:200],  # as identify_azure_devops: untrusted, clipped
            type=f"azure_devops.{event.event_type}",
            source=source,
            timestamp=created_at or aware(event.created_date) or datetime.now(UTC),
            actor=Actor(id=author.unique_name or author.id, display_name=author.display_name) if author else None,
            tenant=tenant or project,
            payload={
                "repository": {"id": repo.id, "name": repo.name, "url": repo.url, "project": project},
                "pull_request": {
                    "id": pr_id,
                    "title": pr.title if pr else None,
                    "description": clip(pr.description or "", MAX_DESCRIPTION) if pr else None,
                    "url": pr.url if pr else None,
                    "status": pr.status if pr else None,
                    "created_at": created_at.isoformat() if created_at else None,
                },
                "source_branch": _branch(pr.source_ref_name) if pr else None,
                "target_branch": _branch(pr.target_ref_name) if pr else None,
                "author": _person(author),
                "reviewers": [p for r in (pr.reviewers if pr else None) or () if (p := _person(r)) is not None],
                "commits": {
                    "source": pr.last_merge_source_commit.commit_id if pr and pr.last_merge_source_commit else None,
                    "target": pr.last_merge_target_commit.commit_id if pr and pr.last_merge_target_commit else None,
                },
            },
            metadata={k: str(v) for k, v in metadata.items() if v is not None},
            source_link=web_link(
                _pr_page(pr) if pr else None,
                label=f"PR #{pr_id}" + (f" in {repo.name}" if repo.name else "") if pr_id else None,
            ),
        )

    def run_title(self, event: NormalizedEvent) -> str:
        pr = event.payload["pull_request"]
        what = f"PR #{pr['id']}" if pr["id"] is not None else "a pull request"
        # No title ("Resource details to send: Minimal/None"): the event's message, else its type.
        title = pr["title"] or event.metadata.get("message") or event.type.removeprefix("azure_devops.")
        return f"Review {what}: {title}"[:200]
