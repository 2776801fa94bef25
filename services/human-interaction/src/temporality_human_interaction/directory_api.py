"""The directory API (HUM-2): ``/directory/users`` and ``/directory/groups`` over the directory store, with role
tokens (authorized exactly like the trigger-gateway's trigger admin API).

============================================  ========  ===============================================
``GET /directory/users``                      viewer    every user (no secret: ``*_set`` flags)
``GET /directory/users/{id}``                 viewer    one user; ``ETag: "<store revision>"``
``POST /directory/users``                     admin     create (201, ``ETag``, ``Location``); 409 if it exists
``PUT /directory/users/{id}``                 admin     replace; ``If-Match`` required: 428 without, 412 stale
``DELETE /directory/users/{id}``              admin     delete (204); ``If-Match`` honoured; 409 in a group
``GET|POST /directory/groups``, ``GET|PUT|DELETE /directory/groups/{id}``: the same for groups
============================================  ========  ===============================================

Writes are compare-and-set: ``create`` (create-if-absent), then on the ``If-Match`` revision when one is
given, else :meth:`~temporality_bus.Store.modify` (``If-Match: *`` or a ``DELETE`` without it: re-read on
a lost race, never a spurious 412).

Authentication is :mod:`temporality_service.auth` (``Authorization: Bearer <API token>``): 401 without a
valid token, 403 below the role. A body is validated exactly as the users file is: 422 ``invalid_user`` /
``invalid_group`` whose ``detail`` and ``errors[].field`` name each field (``channels.telegram.chat_id``,
``preferred``, ``inbox_token``, ``members[1]`` for a member who is not a user).

Inbox tokens are write-only: a literal ``inbox_token`` is stored as its SHA-256 and never returned (a view
says ``inbox_token_set``; ``inbox_token_env`` names stay visible). A replace whose body has no
``inbox_token`` / ``inbox_token_sha256`` key and no ``inbox_token_env`` value keeps the stored one, so a client can send
back what it read (the view's read-only fields, ``revision``, ``origin``, ``inbox_token_set``... are
ignored in a body); give ``"inbox_token": null`` (and no other) to remove it.

Console passwords (issue 9) likewise: a body's ``password`` (12 to 1024 characters) is hashed with Argon2id
(:mod:`.passwords`) and only the hash is stored (``password_hash``, which a body may also give, made by
``temporality-human-interaction hash-password``); no view, event or log shows either (``password_set`` says
whether there is one); a replace without ``password`` / ``password_hash`` keeps the stored hash; ``"password":
null`` removes it. ``console_role`` (``viewer``, ``operator``, ``admin`` or null) is what the person may do in the
console once signed in. Both are written by admins only, like every change. Every change is journaled
(``human.directory.changed``: the token's name and role, the changed fields, the new view; never a
secret) after the store took it; the answer waits until this replica serves the new revision.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import re
from collections.abc import Awaitable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import nats.errors
import structlog
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temporality_bus import AlreadyExists, Bus, Conflict, PermanentError, TransientError, Versioned
from temporality_bus import NotFound as StoreNotFound
from temporality_human_interaction.directory import (
    ID_PATTERN,
    MIN_INBOX_TOKEN,
    Directory,
    DirectoryError,
    GroupProfile,
    UserChannels,
    UserProfile,
    resolve_token,
)
from temporality_human_interaction.events import SOURCE
from temporality_human_interaction.passwords import PasswordTooShort, hash_password
from temporality_human_interaction.store import DirectoryEntry, DirectoryStore, Kind, entry_key
from temporality_human_interaction.validation import message_of
from temporality_protocol import derive_id, make_event
from temporality_protocol.events import HumanDirectoryChanged
from temporality_service import (
    AsAdmin,
    AsViewer,
    NotFound,
    Principal,
    Unavailable,
    Unprocessable,
    parse_json,
    read_body,
)
from temporality_service.http import Conflict as HttpConflict
from temporality_service.http import PreconditionFailed, PreconditionRequired, revision_of
from temporality_service.openapi import component_schemas, if_match, json_body, operation

__all__ = [
    "OPENAPI_SCHEMAS",
    "GroupList",
    "GroupView",
    "PreconditionFailed",
    "PreconditionRequired",
    "UserList",
    "UserView",
    "directory_router",
    "group_view",
    "user_view",
]

log = structlog.get_logger(__name__)

_ID = re.compile(ID_PATTERN)
#: A profile is a few hundred bytes; a KV value is bounded by NATS's max_payload.
MAX_ENTRY_BYTES = 64 * 1024
#: What a view shows besides the entry itself; a body may carry them back (they are ignored).
_READ_ONLY = ("inbox_token_set", "password_set", "groups", "revision", "origin", "updated_by", "updated_at", "problem")
T = TypeVar("T")


class EntryInvalid(Unprocessable):
    def __init__(self, kind: Kind, errors: list[dict[str, str]]) -> None:
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5]) or f"invalid {kind}"
        if len(errors) > 5:
            detail += f"; and {len(errors) - 5} more"
        super().__init__(detail[:2000], code=f"invalid_{kind}", extra={"errors": errors[:50]})


def _field_errors(
    exc: ValidationError, model: type[BaseModel], top_level: tuple[str, ...] = ("id",)
) -> list[dict[str, str]]:
    """pydantic's errors as ``{field, message}`` (never the input); a whole-profile check names its field, an
    unknown key the keys its object takes (``model``'s JSON schema)."""
    out: list[dict[str, str]] = []
    schema = model.model_json_schema()
    for err in exc.errors(include_url=False, include_input=False, include_context=False):
        message = message_of(err, schema, top_level)
        field = ""
        for part in err["loc"]:
            if part == "[key]" or str(part).startswith("function-"):
                continue
            field += f"[{part}]" if isinstance(part, int) else (f".{part}" if field else str(part))
        if not field:
            field = "inbox_token" if "inbox_token" in message else "preferred" if "preferred" in message else "<body>"
        out.append({"field": field, "message": message[:500]})
    return out


def _openapi_schemas() -> dict[str, Any]:
    """The bodies the routes read themselves: a profile plus its ``id`` (on PUT: the path's, or left out)."""
    schemas = component_schemas(UserBody=UserProfile, GroupBody=GroupProfile)
    schemas["UserBody"]["properties"]["password"] = {
        "anyOf": [{"type": "string", "minLength": 12, "maxLength": 1024}, {"type": "null"}],
        "format": "password",
        "writeOnly": True,
        "description": "The console password (write-only): stored as its Argon2id hash, never shown; null removes it",
    }
    token = schemas["UserBody"]["properties"]["inbox_token"]
    for option in token.get("anyOf", [token]):
        if option.get("type") == "string":
            option["minLength"] = MIN_INBOX_TOKEN  # a new one (the users file may still hold a shorter, legacy one)
    for name in ("UserBody", "GroupBody"):
        entry_id = {"type": "string", "maxLength": 64, "pattern": ID_PATTERN, "description": "The id (PUT: the path's)"}
        schemas[name]["properties"] = {"id": entry_id, **schemas[name]["properties"]}
        schemas[name]["description"] = (
            "A directory entry as the users file has it (422 invalid_user / invalid_group names each wrong field); "
            "the read-only fields of a view (revision, origin, ...) may be sent back and are ignored."
        )
    return schemas


#: The components the directory API's bodies refer to (``add_schemas`` in :func:`~.api.create_app`).
OPENAPI_SCHEMAS = _openapi_schemas()
_USER_BODY, _GROUP_BODY = json_body("UserBody"), json_body("GroupBody")
_IF_MATCH = if_match(required=False, what="the entry")
_IF_MATCH_REQUIRED = if_match(required=True, what="the entry")


class _EntryMeta(BaseModel):
    """What a view shows of the stored entry besides the profile (read-only; ignored in a body)."""

    model_config = ConfigDict(extra="forbid")

    revision: int = Field(ge=0, description="The store revision; the ETag is this number, quoted")
    origin: Literal["file", "api"] = Field(description="Seeded from the users file, or written through this API")
    updated_by: str = Field(description="The API token's name, or file:<path>")
    updated_at: datetime
    problem: str | None = Field(description="Why this replica cannot use the entry as stored (None: it can)")


class UserView(_EntryMeta):
    """A user as the API shows it: every field but the inbox token (``inbox_token_set`` says whether one is)."""

    id: str = Field(pattern=ID_PATTERN)
    display_name: str
    preferred: str
    fallback: list[str]
    channels: UserChannels
    inbox_token_env: str | None
    inbox_token_set: bool
    console_role: Literal["viewer", "operator", "admin"] | None = Field(
        description="What the person may do in the journal's console once signed in; null: only their inbox"
    )
    password_set: bool = Field(description="Whether the person has a console password (the hash is never shown)")
    groups: list[str] = Field(description="The groups the user is a member of")


class GroupView(_EntryMeta):
    """A group as the API shows it."""

    id: str = Field(pattern=ID_PATTERN)
    display_name: str
    members: list[str] = Field(description="Member user ids")


class UserList(BaseModel):
    model_config = ConfigDict(extra="forbid")

    users: list[UserView]


class GroupList(BaseModel):
    model_config = ConfigDict(extra="forbid")

    groups: list[GroupView]


def _meta(found: Versioned[DirectoryEntry]) -> dict[str, Any]:
    return {
        "revision": found.revision,
        "origin": found.value.origin,
        "updated_by": found.value.updated_by,
        "updated_at": found.value.updated_at.isoformat(),
    }


def user_view(user_id: str, profile: UserProfile) -> dict[str, Any]:
    """A user as the API shows it: every field but the inbox token (``inbox_token_set`` says whether one is)."""
    return {
        "id": user_id,
        "display_name": profile.display_name,
        "preferred": profile.preferred,
        "fallback": list(profile.fallback),
        "channels": profile.channels.model_dump(mode="json", exclude_none=True),
        "inbox_token_env": profile.inbox_token_env,
        "inbox_token_set": profile.has_inbox_token,
        "console_role": profile.console_role,
        "password_set": profile.password_hash is not None,
    }


def group_view(group_id: str, group: GroupProfile) -> dict[str, Any]:
    return {"id": group_id, "display_name": group.display_name, "members": list(group.members)}


def _changed_fields(
    before: dict[str, Any] | None, after: dict[str, Any] | None, token_changed: bool, password_changed: bool = False
) -> list[str]:
    """The fields a change touched; a secret by its name (``inbox_token``, ``password``), never its value."""
    keys = sorted(set(before or {}) | set(after or {}))
    flags = ("inbox_token_set", "password_set")
    changed = [k for k in keys if (before or {}).get(k) != (after or {}).get(k) and k not in flags]
    if token_changed or (before or {}).get("inbox_token_set") != (after or {}).get("inbox_token_set"):
        changed.append("inbox_token")
    if password_changed or (before or {}).get("password_set") != (after or {}).get("password_set"):
        changed.append("password")
    return sorted(changed)


def _token_of(profile: UserProfile | None) -> tuple[str | None, str | None]:
    return (profile.inbox_token_sha256, profile.inbox_token_env) if profile is not None else (None, None)


def _password_of(profile: UserProfile | None) -> str | None:
    return profile.password_hash if profile is not None else None


def directory_router(
    directory: Directory,
    store: DirectoryStore,
    bus: Bus,
    *,
    max_body_bytes: int,
    retry_after_s: int = 5,
    environ: Mapping[str, str] | None = None,
) -> APIRouter:
    """The ``/directory`` routes over ``store``; ``directory`` is this replica's live view of it."""
    env = os.environ if environ is None else environ
    router = APIRouter(prefix="/directory", tags=["directory"])

    async def io(call: Awaitable[T]) -> T:
        try:
            return await call
        except (Conflict, AlreadyExists):
            raise
        except (TransientError, PermanentError, OSError, TimeoutError, nats.errors.Error) as exc:
            log.warning("directory.store_unavailable", error=repr(exc))
            raise Unavailable(
                "the directory store did not answer; retry later", code="bus_unavailable", retry_after_s=retry_after_s
            ) from exc

    async def read_json(request: Request) -> Any:
        return parse_json(await read_body(request, min(max_body_bytes, MAX_ENTRY_BYTES)))

    async def current(kind: Kind, entry_id: str) -> Versioned[DirectoryEntry]:
        found = await io(store.get(kind, entry_id)) if len(entry_id) <= 64 and _ID.match(entry_id) else None
        if found is None:
            raise NotFound(f"no {kind} with id {entry_id[:100]!r}", code=f"{kind}_not_found")
        return found

    def check_precondition(kind: Kind, entry_id: str, found: Versioned[DirectoryEntry], if_match: str | None) -> None:
        expected = revision_of(if_match, "the entry")
        if expected is not None and found.revision != expected:
            raise PreconditionFailed(
                f"{kind} {entry_id!r} is at revision {found.revision}, not {expected}: read it again"
            )

    def view(kind: Kind, entry_id: str, found: Versioned[DirectoryEntry]) -> dict[str, Any]:
        entry = found.value
        if kind == "user":
            assert entry.user is not None
            shown = user_view(entry_id, entry.user)
            shown["groups"] = directory.groups_with(entry_id)
        else:
            assert entry.group is not None
            shown = group_view(entry_id, entry.group)
        return {**shown, **_meta(found), "problem": directory.problems.get(entry_key(kind, entry_id))}

    def answer(kind: Kind, entry_id: str, found: Versioned[DirectoryEntry], status: int = 200) -> JSONResponse:
        headers = {"ETag": f'"{found.revision}"'}
        if status == 201:
            headers["Location"] = f"/directory/{kind}s/{entry_id}"
        return JSONResponse(view(kind, entry_id, found), status_code=status, headers=headers)

    def body_object(kind: Kind, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise EntryInvalid(kind, [{"field": "<body>", "message": f"a {kind} is a JSON object"}])
        return {k: v for k, v in body.items() if k not in _READ_ONLY}

    def take_id(kind: Kind, body: dict[str, Any], path_id: str | None) -> str:
        entry_id = body.pop("id", path_id)
        if path_id is not None and entry_id != path_id:
            raise EntryInvalid(kind, [{"field": "id", "message": f"the body's id is not {path_id!r} (the path's)"}])
        if not isinstance(entry_id, str) or len(entry_id) > 64 or not _ID.match(entry_id):
            message = "required: 1-64 characters, dot-separated words of A-Z a-z 0-9 _ -"
            raise EntryInvalid(kind, [{"field": "id", "message": message}])
        return entry_id

    async def with_password_hashed(body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with a literal ``password`` replaced by its hash (``password_hash``); null removes it."""
        if "password" not in body:
            return body
        password = body.pop("password")
        if password is None:
            return {**body, "password_hash": None}
        if not isinstance(password, str):
            raise EntryInvalid("user", [{"field": "password", "message": "a string, or null to remove it"}])
        if "password_hash" in body:
            raise EntryInvalid("user", [{"field": "password", "message": "give password or password_hash, not both"}])
        try:
            return {**body, "password_hash": await asyncio.to_thread(hash_password, password)}
        except PasswordTooShort as exc:
            raise EntryInvalid("user", [{"field": "password", "message": str(exc)}]) from None

    async def validate_user(user_id: str, body: dict[str, Any]) -> UserProfile:
        body = await with_password_hashed(body)
        try:
            given = UserProfile.model_validate(body)
        except ValidationError as exc:
            raise EntryInvalid("user", _field_errors(exc, UserProfile, ("id", "password"))) from None
        if given.inbox_token is not None and len(given.inbox_token.get_secret_value()) < MIN_INBOX_TOKEN:
            # (the profile's own floor is the legacy one the users file may still hold: directory.py)
            raise EntryInvalid(
                "user", [{"field": "inbox_token", "message": f"must be at least {MIN_INBOX_TOKEN} characters"}]
            )
        profile = given.hashed()
        try:
            digest = resolve_token(user_id, profile, env)
        except DirectoryError as exc:
            field = "inbox_token_env" if profile.inbox_token_env is not None else "inbox_token"
            raise EntryInvalid("user", [{"field": field, "message": str(exc)}]) from None
        if digest is not None and await token_owned_elsewhere(user_id, digest):
            raise EntryInvalid("user", [{"field": "inbox_token", "message": "is another user's inbox token"}])
        return profile

    async def token_owned_elsewhere(user_id: str, digest: str) -> bool:
        """Whether another user holds this token: in this replica's directory or in the store itself.

        The store is read too because the directory follows it through a watch and may not have seen a
        user yet (just seeded, or written by another replica a moment ago)."""
        if directory.token_owner(digest) not in (None, user_id):
            return True
        for other_id, record in await io(store.all("user")):
            other = record.value.user
            if other_id == user_id or other is None:
                continue
            try:
                theirs = resolve_token(other_id, other, env)
            except DirectoryError:
                continue
            if theirs is not None and hmac.compare_digest(bytes.fromhex(theirs), bytes.fromhex(digest)):
                return True
        return False

    async def validate_group(body: dict[str, Any]) -> GroupProfile:
        try:
            group = GroupProfile.model_validate(body)
        except ValidationError as exc:
            raise EntryInvalid("group", _field_errors(exc, GroupProfile)) from None
        errors = [
            {"field": f"members[{n}]", "message": f"{member!r} is not a user of the directory"}
            for n, member in enumerate(group.members)
            if await io(store.get("user", member)) is None
        ]
        if errors:
            raise EntryInvalid("group", errors)
        return group

    async def journal(
        kind: Kind,
        entry_id: str,
        action: Literal["created", "updated", "deleted"],
        revision: int,
        who: Principal,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        token_changed: bool = False,
        password_changed: bool = False,
    ) -> None:
        """Publish the audit event (id derived from the entry and revision: a retry republishes the same one)."""
        change = HumanDirectoryChanged(
            kind=kind,
            entry_id=entry_id,
            action=action,
            revision=revision,
            changed_by=who.name,
            role=str(who.role),
            changed_fields=_changed_fields(before, after, token_changed, password_changed),
            after=after,
        )
        envelope = make_event(
            change,
            source=SOURCE,
            id=derive_id("evt", "directory", kind, entry_id, str(revision), action),
            actor=f"token:{who.name}",
            correlation_id=entry_key(kind, entry_id),
        )
        try:
            await bus.publish(envelope)
        except (TransientError, PermanentError) as exc:
            log.error("directory.audit_not_journaled", kind=kind, id=entry_id, revision=revision, error=repr(exc))
            raise Unavailable(
                f"the change was saved (revision {revision}) but could not be journaled; it is logged",
                code="audit_unavailable",
                retry_after_s=retry_after_s,
            ) from exc
        log.info("directory.changed", kind=kind, id=entry_id, action=action, revision=revision, principal=who.name)

    async def settled(kind: Kind, entry_id: str, revision: int) -> None:
        """Answer once this replica serves the change (its own watch applied it), bounded."""
        if not await directory.wait_for_revision(entry_key(kind, entry_id), revision, timeout_s=5.0):
            log.warning("directory.change_not_applied_yet", kind=kind, id=entry_id, revision=revision)

    def public(kind: Kind, entry_id: str, entry: DirectoryEntry | None) -> dict[str, Any] | None:
        if entry is None or entry.deleted:
            return None
        if kind == "user":
            return user_view(entry_id, entry.user) if entry.user is not None else None
        return group_view(entry_id, entry.group) if entry.group is not None else None

    async def create(kind: Kind, entry_id: str, entry: DirectoryEntry, who: Principal) -> JSONResponse:
        key = entry_key(kind, entry_id)
        existing = await io(store.get_any(kind, entry_id))
        exists = HttpConflict(f"a {kind} with id {entry_id!r} exists; replace it with PUT", code=f"{kind}_exists")
        try:
            if existing is None:
                revision = await io(store.store.create(key, entry))
            elif existing.value.deleted:  # re-create over the tombstone
                revision = await io(store.store.update(key, entry, existing.revision))
            else:
                raise exists
        except (AlreadyExists, Conflict):
            raise exists from None
        await journal(kind, entry_id, "created", revision, who, None, public(kind, entry_id, entry))
        await settled(kind, entry_id, revision)
        return answer(kind, entry_id, Versioned(entry, revision), status=201)

    async def write(
        kind: Kind, entry_id: str, found: Versioned[DirectoryEntry], new: DirectoryEntry, if_match: str | None
    ) -> tuple[DirectoryEntry, int]:
        """Store ``new`` over the live entry ``found``; the entry it replaced and the new revision.

        With an ``If-Match`` revision: compare-and-set on that revision (412 if it moved). Without one (or
        ``*``): :meth:`~temporality_bus.Store.modify`, which re-reads on a lost race; an entry deleted
        meanwhile is a 404."""
        key = entry_key(kind, entry_id)
        if revision_of(if_match, "the entry") is not None:
            try:
                return found.value, await io(store.store.update(key, new, found.revision))
            except Conflict:
                raise PreconditionFailed(f"{kind} {entry_id!r} changed meanwhile: read it again") from None
        replaced = found.value
        gone = NotFound(f"no {kind} with id {entry_id[:100]!r}", code=f"{kind}_not_found")

        def swap(current: DirectoryEntry) -> DirectoryEntry:
            nonlocal replaced
            if current.deleted:
                raise gone
            replaced = current
            return new

        try:
            result = await io(store.store.modify(key, swap))
        except StoreNotFound:
            raise gone from None
        return replaced, result.revision

    async def replace(
        kind: Kind,
        entry_id: str,
        found: Versioned[DirectoryEntry],
        entry: DirectoryEntry,
        who: Principal,
        if_match: str | None,
    ) -> JSONResponse:
        previous, revision = await write(kind, entry_id, found, entry, if_match)
        token_changed = kind == "user" and _token_of(previous.user) != _token_of(entry.user)
        password_changed = kind == "user" and _password_of(previous.user) != _password_of(entry.user)
        before, after = public(kind, entry_id, previous), public(kind, entry_id, entry)
        await journal(kind, entry_id, "updated", revision, who, before, after, token_changed, password_changed)
        await settled(kind, entry_id, revision)
        return answer(kind, entry_id, Versioned(entry, revision))

    async def delete(kind: Kind, entry_id: str, if_match: str | None, who: Principal) -> Response:
        found = await current(kind, entry_id)
        check_precondition(kind, entry_id, found, if_match)
        if kind == "user":
            groups = [
                gid for gid, g in await io(store.all("group")) if g.value.group and entry_id in g.value.group.members
            ]
            if groups:
                raise HttpConflict(
                    f"user {entry_id!r} is a member of {', '.join(groups)}: remove them from the group first",
                    code="user_in_group",
                )
        tombstone = DirectoryEntry(origin=found.value.origin, updated_by=who.name, updated_at=_now(), deleted=True)
        previous, revision = await write(kind, entry_id, found, tombstone, if_match)
        await journal(kind, entry_id, "deleted", revision, who, public(kind, entry_id, previous), None)
        await settled(kind, entry_id, revision)
        return Response(status_code=204)

    # ------------------------------------------------------------------ users
    @router.get("/users", summary="List users", response_model=UserList)
    async def list_users(who: AsViewer) -> JSONResponse:
        found = await io(store.all("user"))
        return JSONResponse({"users": [view("user", uid, record) for uid, record in found]})

    @router.get("/users/{user_id}", summary="Read a user", response_model=UserView)
    async def read_user(user_id: str, who: AsViewer) -> JSONResponse:
        return answer("user", user_id, await current("user", user_id))

    @router.post(
        "/users",
        status_code=201,
        summary="Create a user",
        response_model=UserView,
        openapi_extra=operation(body=_USER_BODY),
    )
    async def create_user(request: Request, who: AsAdmin) -> JSONResponse:
        body = body_object("user", await read_json(request))
        user_id = take_id("user", body, None)
        profile = await validate_user(user_id, body)
        entry = DirectoryEntry(user=profile, origin="api", updated_by=who.name, updated_at=_now())
        return await create("user", user_id, entry, who)

    @router.put(
        "/users/{user_id}",
        summary="Replace a user (If-Match: its ETag)",
        response_model=UserView,
        openapi_extra=operation(body=_USER_BODY, headers=[_IF_MATCH_REQUIRED]),
    )
    async def replace_user(user_id: str, request: Request, who: AsAdmin) -> JSONResponse:
        if_match = request.headers.get("if-match")  # read here, not by FastAPI: 428/412, not a 422
        if if_match is None:
            raise PreconditionRequired('replacing a user needs If-Match: "<revision>" (the ETag of a GET)')
        body = body_object("user", await read_json(request))
        take_id("user", body, user_id)
        found = await current("user", user_id)
        check_precondition("user", user_id, found, if_match)
        stored = found.value.user
        token_given = "inbox_token" in body or "inbox_token_sha256" in body or body.get("inbox_token_env")
        if stored is not None and not token_given:
            body.update(inbox_token_sha256=stored.inbox_token_sha256, inbox_token_env=stored.inbox_token_env)
        if stored is not None and "password" not in body and "password_hash" not in body:
            body["password_hash"] = stored.password_hash  # kept: a client sends back what it read
        profile = await validate_user(user_id, body)
        entry = DirectoryEntry(user=profile, origin="api", updated_by=who.name, updated_at=_now())
        return await replace("user", user_id, found, entry, who, if_match)

    @router.delete(
        "/users/{user_id}", status_code=204, summary="Delete a user", openapi_extra=operation(headers=[_IF_MATCH])
    )
    async def delete_user(user_id: str, request: Request, who: AsAdmin) -> Response:
        return await delete("user", user_id, request.headers.get("if-match"), who)

    # ------------------------------------------------------------------ groups
    @router.get("/groups", summary="List groups", response_model=GroupList)
    async def list_groups(who: AsViewer) -> JSONResponse:
        found = await io(store.all("group"))
        return JSONResponse({"groups": [view("group", gid, record) for gid, record in found]})

    @router.get("/groups/{group_id}", summary="Read a group", response_model=GroupView)
    async def read_group(group_id: str, who: AsViewer) -> JSONResponse:
        return answer("group", group_id, await current("group", group_id))

    @router.post(
        "/groups",
        status_code=201,
        summary="Create a group",
        response_model=GroupView,
        openapi_extra=operation(body=_GROUP_BODY),
    )
    async def create_group(request: Request, who: AsAdmin) -> JSONResponse:
        body = body_object("group", await read_json(request))
        group_id = take_id("group", body, None)
        group = await validate_group(body)
        entry = DirectoryEntry(group=group, origin="api", updated_by=who.name, updated_at=_now())
        return await create("group", group_id, entry, who)

    @router.put(
        "/groups/{group_id}",
        summary="Replace a group (If-Match: its ETag)",
        response_model=GroupView,
        openapi_extra=operation(body=_GROUP_BODY, headers=[_IF_MATCH_REQUIRED]),
    )
    async def replace_group(group_id: str, request: Request, who: AsAdmin) -> JSONResponse:
        if_match = request.headers.get("if-match")  # read here, not by FastAPI: 428/412, not a 422
        if if_match is None:
            raise PreconditionRequired('replacing a group needs If-Match: "<revision>" (the ETag of a GET)')
        body = body_object("group", await read_json(request))
        take_id("group", body, group_id)
        found = await current("group", group_id)
        check_precondition("group", group_id, found, if_match)
        group = await validate_group(body)
        entry = DirectoryEntry(group=group, origin="api", updated_by=who.name, updated_at=_now())
        return await replace("group", group_id, found, entry, who, if_match)

    @router.delete(
        "/groups/{group_id}", status_code=204, summary="Delete a group", openapi_extra=operation(headers=[_IF_MATCH])
    )
    async def delete_group(group_id: str, request: Request, who: AsAdmin) -> Response:
        return await delete("group", group_id, request.headers.get("if-match"), who)

    return router


def _now() -> datetime:
    return datetime.now(UTC)
