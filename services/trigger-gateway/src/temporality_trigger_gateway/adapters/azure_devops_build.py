"""The ``azure_devops.build`` source: Azure DevOps service-hook ``build.complete`` events (TRG-3/4/8).

``resource`` is the build as the Build REST API shows it. Two generations are in use: current pipelines send
``status: completed`` with the outcome in ``result`` (``succeeded``, ``partiallySucceeded``, ``failed``,
``canceled``), ``sourceBranch``/``sourceVersion``, ``requestedFor``, ``project`` and ``_links.web``; XAML builds of
on-prem TFS (Microsoft's own 2016 sample, ``/work/shared/fixtures/webhooks``) send the outcome as ``status``
(``succeeded``), no ``result``, the branch and commit packed into ``sourceGetVersion``
(``LG:refs/heads/master:<sha>``) and the requester in ``requests[].requestedFor``; that sample also starts with a
UTF-8 BOM (decoded by the API layer). Both become the same event: ``build.result`` is the outcome either way. The
event id is the payload's ``id`` (the event GUID), as for every Azure DevOps source; the subscription's
``buildStatus`` filter is Azure DevOps' own, the trigger's ``when`` can filter further (``build.result``).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, ClassVar

from pydantic import Field, ValidationError

from temporality_protocol import Actor, NormalizedEvent
from temporality_trigger_gateway.adapters.azure_devops import (
    AzureDevOpsSource,
    Container,
    Href,
    Identity,
    Message,
    _Ado,
    _origin,
    _person,
)
from temporality_trigger_gateway.adapters.azure_devops_push import event_message
from temporality_trigger_gateway.adapters.base import (
    WebhookRequest,
    aware,
    clip,
    invalid_payload,
    web_link,
)

__all__ = ["BUILD_EVENT_TYPES", "AzureDevOpsBuild"]

BUILD_EVENT_TYPES = frozenset({"build.complete"})
#: The outcomes a build can have; an old (XAML) build's ``status`` is one of them, a current build's ``result``.
_RESULTS = frozenset({"succeeded", "partiallySucceeded", "failed", "canceled", "stopped"})
_Short = 200


class Reference(_Ado):
    id: int | str | None = None
    name: str | None = None
    url: str | None = None


class Request(_Ado):
    requested_for: Identity | None = None


class BuildRepository(_Ado):
    id: str | None = None
    name: str | None = None
    type: str | None = None


class Build(_Ado):
    """Only ``id`` is required: "Resource details to send: Minimal" sends ``{id, url}`` and little more."""

    id: Annotated[int, Field(ge=1)]
    build_number: str | None = None
    status: str | None = None
    result: str | None = None
    reason: str | None = None
    url: str | None = None
    queue_time: datetime | None = None
    start_time: datetime | None = None
    finish_time: datetime | None = None
    source_branch: str | None = None
    source_version: str | None = None
    source_get_version: str | None = None
    definition: Reference | None = None
    project: Reference | None = None
    repository: BuildRepository | None = None
    requested_for: Identity | None = None
    requested_by: Identity | None = None
    last_changed_by: Identity | None = None
    requests: list[Request] = Field(default_factory=list)
    links: dict[str, Href] | None = Field(default=None, alias="_links")


class BuildEvent(_Ado):
    id: Annotated[str, Field(min_length=1)]
    event_type: Annotated[str, Field(min_length=1)]
    publisher_id: str | None = None
    subscription_id: str | None = None
    notification_id: int | str | None = None
    resource_version: str | None = None
    #: ``None``: "Resource details to send: None" (``null`` or absent).
    resource: Build | None = None
    message: Message | None = None
    detailed_message: Message | None = None
    resource_containers: dict[str, Container] | None = None
    created_date: datetime | None = None


#: ``LG:refs/heads/master:600c52d2…`` (a Git source of a XAML build): the ref, then the commit.
_GET_VERSION = re.compile(r"^LG:(?P<ref>[^:]+):(?P<sha>[0-9a-fA-F]+)$")
#: ``<collection>/<project>/_apis/build/Builds/2`` → its web page ``<collection>/<project>/_build/results?buildId=2``.
_BUILD_IN_URL = re.compile(r"^(?P<base>https?://.+?)/_apis/build/builds/(?P<id>\d+)(?:[/?#]|$)", re.IGNORECASE)


def _source(build: Build) -> tuple[str | None, str | None]:
    """The build's source ref and commit: ``sourceBranch``/``sourceVersion``, else read from ``sourceGetVersion``."""
    ref, sha = build.source_branch, build.source_version
    found = _GET_VERSION.match(build.source_get_version or "")
    if found:
        ref, sha = ref or found["ref"], sha or found["sha"]
    return ref, sha


def _build_page(build: Build) -> str | None:
    web = (build.links or {}).get("web")
    if web and web.href:
        return web.href
    found = _BUILD_IN_URL.match(build.url or "")
    return f"{found['base']}/_build/results?buildId={found['id']}" if found else None


def _seconds(start: datetime | None, finish: datetime | None) -> float | None:
    started, finished = aware(start), aware(finish)
    if started is None or finished is None:
        return None
    return round((finished - started).total_seconds(), 3)


def _iso(value: datetime | None) -> str | None:
    found = aware(value)
    return found.isoformat() if found else None


def _text(value: str | None) -> str | None:
    return clip(value, _Short) if value else None


class AzureDevOpsBuild(AzureDevOpsSource):
    name: ClassVar[str] = "azure_devops.build"
    event_types: ClassVar[frozenset[str] | None] = BUILD_EVENT_TYPES
    noun: ClassVar[str] = "build"

    def normalize(self, request: WebhookRequest, *, tenant: str | None) -> NormalizedEvent:
        event_type = self.identify(request).type  # another event's resource is not checked as a build's
        if (refused := self.other_event(event_type)) is not None:
            raise refused
        try:
            event = BuildEvent.model_validate(request.json)
        except ValidationError as exc:
            raise invalid_payload(self.name, exc) from exc
        build = event.resource
        definition = build.definition if build and build.definition else Reference()
        project = build.project.name if build and build.project and build.project.name else None
        collection = (event.resource_containers or {}).get("collection")
        api_url = build.url if build else None
        source = (
            collection.base_url
            if collection and collection.base_url
            else (_origin(api_url) if api_url else "azure_devops")
        )
        ref, sha = _source(build) if build else (None, None)
        requester = None
        if build is not None:
            requester = build.requested_for or next((r.requested_for for r in build.requests if r.requested_for), None)
            requester = requester or build.requested_by or build.last_changed_by
        result = None
        if build is not None:
            result = build.result or (build.status if build.status in _RESULTS else None)
        page = _build_page(build) if build else None
        metadata = {
            "event_type": event.event_type,
            "notification_id": event.notification_id,
            "subscription_id": event.subscription_id,
            "publisher_id": event.publisher_id,
            "resource_version": event.resource_version,
            "message": event_message(event.message, event.detailed_message) if build is None else None,
        }
        number = _text(build.build_number) if build else None
        label = None
        if build is not None:
            label = (f"Build {number}" if number else f"Build #{build.id}") + (
                f" of {definition.name}" if definition.name else ""
            )
        return NormalizedEvent(
            id=event.id[:200],  # as identify_azure_devops: untrusted, clipped
            type=f"azure_devops.{event.event_type}",
            source=source,
            timestamp=(aware(build.finish_time) if build else None) or aware(event.created_date) or datetime.now(UTC),
            actor=Actor(id=requester.unique_name or requester.id, display_name=requester.display_name)
            if requester
            else None,
            tenant=tenant or project,
            payload={
                "project": project,
                "build": {
                    "id": build.id if build else None,
                    "number": number,
                    "status": build.status if build else None,
                    "result": result,
                    "reason": build.reason if build else None,
                    "url": page,
                    "started_at": _iso(build.start_time) if build else None,
                    "finished_at": _iso(build.finish_time) if build else None,
                    "duration_s": _seconds(build.start_time, build.finish_time) if build else None,
                },
                "definition": {"id": definition.id, "name": _text(definition.name)},
                "source_branch": ref.removeprefix("refs/heads/") if ref else None,
                "source_ref": ref,
                "source_version": sha,
                "repository": {"id": build.repository.id, "name": build.repository.name, "type": build.repository.type}
                if build and build.repository
                else None,
                "requested_for": _person(requester),
            },
            metadata={k: str(v) for k, v in metadata.items() if v is not None},
            source_link=web_link(page, label=label),
        )

    def run_title(self, event: NormalizedEvent) -> str:
        build = event.payload["build"]
        if build["id"] is None:  # "Resource details to send: None": the event's message, else its type
            return (event.metadata.get("message") or "Build completed")[:200]
        what = f"Build {build['number']}" if build["number"] else f"Build #{build['id']}"
        name = event.payload["definition"]["name"]
        outcome = build["result"] or build["status"] or "completed"
        branch = event.payload["source_branch"]
        return f"{what}{f' of {name}' if name else ''} {outcome}{f' on {branch}' if branch else ''}"[:200]
