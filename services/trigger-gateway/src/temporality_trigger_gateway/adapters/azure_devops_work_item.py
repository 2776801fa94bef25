"""The ``azure_devops.work_item`` source: Azure DevOps service-hook work item events (TRG-3/4/8).

``workitem.created/.commented/.deleted/.restored`` carry the work item itself: ``resource.id`` is its
id, ``resource.fields`` its current values. ``workitem.updated`` carries an *update*: ``resource.id``
is the update number, ``resource.workItemId`` may be ``0`` and ``resource.revisedBy`` ``null`` (real
Microsoft samples), so the work item's id is read from ``resource.revision.id`` first, its current
values from ``resource.revision.fields`` and the change from ``resource.fields``
(``{"oldValue", "newValue"}`` pairs). Work item payloads may start with a UTF-8 BOM (decoded by the
API layer). The actor is a display-name string (``System.ChangedBy``). The event id is the payload's
``id`` (the event GUID), as for pull requests.

A subscription set to "Resource details to send: Minimal" sends the resource without its fields
(``{id, rev, url}``; an update ``{id, workItemId, rev, url}``), one set to "None" no resource at all: both are
accepted as for pull requests, the missing values ``null`` and the run titled from the event's message. The work
item's id then comes from ``workItemId`` or the resource's REST URL (``…/workItems/5/updates/2``), else is ``null``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar

from pydantic import Field, ValidationError

from temporality_protocol import Actor, NormalizedEvent
from temporality_trigger_gateway.adapters.azure_devops import (
    AzureDevOpsSource,
    Container,
    Href,
    Message,
    _Ado,
    _origin,
)
from temporality_trigger_gateway.adapters.base import (
    MAX_DESCRIPTION,
    WebhookRequest,
    aware,
    clip,
    invalid_payload,
    web_link,
)

__all__ = ["WORK_ITEM_EVENT_TYPES", "AzureDevOpsWorkItem"]

WORK_ITEM_EVENT_TYPES = frozenset(
    {"workitem.created", "workitem.updated", "workitem.commented", "workitem.deleted", "workitem.restored"}
)


class Revision(_Ado):
    id: Annotated[int, Field(ge=1)]
    rev: int | None = None
    fields: dict[str, Any] = Field(default_factory=dict)
    url: str | None = None


class WorkItemResource(_Ado):
    id: Annotated[int, Field(ge=0)]
    work_item_id: int | None = None
    rev: int | None = None
    fields: dict[str, Any] = Field(default_factory=dict)
    url: str | None = None
    revision: Revision | None = None
    links: dict[str, Href] | None = Field(default=None, alias="_links")


class WorkItemEvent(_Ado):
    id: Annotated[str, Field(min_length=1)]
    event_type: Annotated[str, Field(min_length=1)]
    publisher_id: str | None = None
    subscription_id: str | None = None
    notification_id: int | str | None = None
    resource_version: str | None = None
    #: ``None``: "Resource details to send: None" (``null`` or absent).
    resource: WorkItemResource | None = None
    message: Message | None = None
    detailed_message: Message | None = None
    resource_containers: dict[str, Container] | None = None
    created_date: datetime | None = None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _item_page(resource: WorkItemResource, api_url: str, item_id: int) -> str | None:
    """The work item's web page: ``_links.html`` (newer payloads), else derived from its REST URL
    (``<collection>/_apis/wit/workItems/5`` → ``<collection>/_workitems/edit/5``)."""
    html = (resource.links or {}).get("html")
    if html and html.href:
        return html.href
    collection, found, _ = api_url.partition("/_apis/wit/workItems/")
    return f"{collection}/_workitems/edit/{item_id}" if found else None


_ITEM_IN_URL = re.compile(r"/_apis/wit/workItems/(\d+)(?:[/?#]|$)", re.IGNORECASE)


def _id_in_url(url: str | None) -> int | None:
    """The work item id in a REST URL (``…/_apis/wit/workItems/5/updates/2`` → 5): a Minimal update's resource
    may name it nowhere else."""
    found = _ITEM_IN_URL.search(url) if url else None
    return int(found.group(1)) or None if found else None


def _change(value: Any) -> dict[str, Any] | None:
    if isinstance(value, dict) and ("oldValue" in value or "newValue" in value):
        return {"old": value.get("oldValue"), "new": value.get("newValue")}
    return None


class AzureDevOpsWorkItem(AzureDevOpsSource):
    name: ClassVar[str] = "azure_devops.work_item"
    event_types: ClassVar[frozenset[str] | None] = WORK_ITEM_EVENT_TYPES
    noun: ClassVar[str] = "work item"

    def normalize(self, request: WebhookRequest, *, tenant: str | None) -> NormalizedEvent:
        try:
            event = WorkItemEvent.model_validate(request.json)
        except ValidationError as exc:
            raise invalid_payload(self.name, exc) from exc
        if (refused := self.other_event(event.event_type)) is not None:
            raise refused
        resource = event.resource or WorkItemResource(id=0)
        updated = event.event_type == "workitem.updated"
        if updated:
            # The update's own id is resource.id; the work item's is revision.id (workItemId may be 0), else the
            # one in the update's URL (Minimal: no revision).
            item_id = resource.revision.id if resource.revision else resource.work_item_id or _id_in_url(resource.url)
            current = resource.revision.fields if resource.revision else {}
            changes = {k: c for k, v in resource.fields.items() if (c := _change(v)) is not None}
        else:
            item_id = resource.id or _id_in_url(resource.url)
            current = resource.fields
            changes = {}
        project = _text(current.get("System.TeamProject"))
        changed_by = _text(current.get("System.ChangedBy"))
        if updated:  # the update's author is the new System.ChangedBy, when the update names it
            new_by = (changes.get("System.ChangedBy") or {}).get("new")
            changed_by = _text(new_by) or changed_by
        collection = (event.resource_containers or {}).get("collection")
        url = (resource.revision.url if updated and resource.revision else None) or resource.url or ""
        source = (
            collection.base_url if collection and collection.base_url else (_origin(url) if url else "azure_devops")
        )
        comment = _text(current.get("System.History")) if event.event_type == "workitem.commented" else None
        title = _text(current.get("System.Title"))
        # With "Resource details to send: Minimal/None" there is no title: the event's message stands in for it in
        # the run's title ("Bug #5 (Some great new idea!) created by Jamal Hartnett.").
        message = next(
            (m.text.strip() for m in (event.message, event.detailed_message) if m and m.text and m.text.strip()),
            None,
        )
        kind = _text(current.get("System.WorkItemType"))
        metadata = {
            "event_type": event.event_type,
            "notification_id": event.notification_id,
            "subscription_id": event.subscription_id,
            "publisher_id": event.publisher_id,
            "resource_version": event.resource_version,
            "update_id": resource.id if updated and resource.id else None,
            "message": clip(message.splitlines()[0], 200) if message and title is None else None,
        }
        return NormalizedEvent(
            id=event.id[:200],  # as identify_azure_devops: untrusted, clipped
            type=f"azure_devops.{event.event_type}",
            source=source,
            timestamp=aware(event.created_date) or datetime.now(UTC),
            actor=Actor(id=changed_by, display_name=changed_by) if changed_by else None,
            tenant=tenant or project,
            payload={
                "project": project,
                "work_item": {
                    "id": item_id,
                    "rev": (resource.revision.rev if updated and resource.revision else resource.rev),
                    "type": kind,
                    "title": title,
                    "state": _text(current.get("System.State")),
                    "reason": _text(current.get("System.Reason")),
                    "area_path": _text(current.get("System.AreaPath")),
                    "iteration_path": _text(current.get("System.IterationPath")),
                    "assigned_to": _text(current.get("System.AssignedTo")),
                    "url": url or None,
                },
                "action": event.event_type.removeprefix("workitem."),
                "changed_by": changed_by,
                "changes": changes,
                "comment": clip(comment, MAX_DESCRIPTION) if comment else None,
            },
            metadata={k: str(v) for k, v in metadata.items() if v is not None},
            source_link=web_link(
                _item_page(resource, url, item_id) if item_id else None,
                label=f"{kind or 'Work item'} #{item_id}" + (f" in {project}" if project else "") if item_id else None,
            ),
        )

    def run_title(self, event: NormalizedEvent) -> str:
        item = event.payload["work_item"]
        kind = item["type"] or "Work item"
        what = f"{kind} #{item['id']}" if item["id"] is not None else kind
        # No title ("Resource details to send: Minimal/None"): the event's message, if any.
        title = item["title"] or event.metadata.get("message")
        return f"{what} {event.payload['action']}{f': {title}' if title else ''}"[:200]
