"""The user directory: who can be asked, through which channels, in which order (HUM-2), and groups.

Channel settings live here, in the person's profile, never in an agent's config: the agent names
``user:<id>`` (or ``group:<id>``: every member is asked, the first answer wins) and this service
decides how to reach them. The users file (YAML) is validated at start-up and *seeds* the directory
store (:mod:`.store`, the ``human-directory`` KV bucket); the store is the truth afterwards, changed
through the directory API and applied live by every replica's watch onto its :class:`Directory`.
Unknown keys are refused so a typo fails loudly instead of silently dropping a channel.

Console sign-in (issue 9): a profile may carry a ``console_role`` (``viewer``, ``operator``, ``admin``: what the
person may do in the journal's console once signed in; none: only their inbox) and a ``password_hash``, an
Argon2id hash (PHC string) of the password they sign in to the console with -- never the password itself
(:mod:`.passwords` makes and checks the hashes; ``temporality-human-interaction hash-password`` prints one).
The hash is never shown: no API view, event or log carries it (``password_set`` says whether there is one).

Inbox tokens are never kept in clear past validation: a literal ``inbox_token`` (file or API) becomes
``inbox_token_sha256`` before anything is stored; ``inbox_token_env`` names a variable each replica
reads from its own environment. The web inbox compares the SHA-256 of the presented token with every
user's in constant time.

An inbox token has at least :data:`MIN_INBOX_TOKEN` (24) characters: the directory API refuses a shorter literal
``inbox_token`` (422). Before 7 December 2026 the floor was 8; so that an upgrade locks nobody out, a shorter one
(at least :data:`LEGACY_MIN_INBOX_TOKEN`) in the users file or in an ``inbox_token_env`` variable still opens the
inbox, with ``directory.inbox_token_short`` logged as a warning (user id, never the token) each time it is read
-- replace it. One already stored as its SHA-256 cannot be measured and keeps working; set a new one through the
API. Wrong tokens are limited per client address besides (:mod:`temporality_service.limits`, :mod:`.api`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import structlog
import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

__all__ = [
    "GROUP_PREFIX",
    "ID_PATTERN",
    "LEGACY_MIN_INBOX_TOKEN",
    "MIN_INBOX_TOKEN",
    "PASSWORD_HASH_PATTERN",
    "RECIPIENT_PREFIX",
    "ConsoleRole",
    "Directory",
    "DirectoryError",
    "GroupProfile",
    "MatrixAddress",
    "TelegramAddress",
    "UserChannels",
    "UserProfile",
    "WebAddress",
    "group_id_of",
    "group_recipient",
    "hash_token",
    "parse_directory",
    "read_directory_file",
    "recipient_for",
    "resolve_token",
    "user_id_of",
]

log = structlog.get_logger(__name__)

#: Recipients are written ``user:<id>`` on the wire (SEC-1: a person, never a channel or an address) ...
RECIPIENT_PREFIX = "user:"
#: ... or ``group:<id>``: every member of the group is asked.
GROUP_PREFIX = "group:"
#: A user or group id: dot-separated words of ``A-Z a-z 0-9 _ -`` (so ``user.<id>`` is a valid KV key).
ID_PATTERN = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"
_ID_RE = re.compile(ID_PATTERN)
_MAX_ID = 64
EntityId = Annotated[str, Field(pattern=ID_PATTERN, min_length=1, max_length=_MAX_ID)]
#: A new inbox token (the directory API's literal ``inbox_token``) shorter than this is refused ...
MIN_INBOX_TOKEN = 24
#: ... and one of the users file or an ``inbox_token_env`` variable shorter than this (the floor before 7 December
#: 2026); between the two it still works, with a warning (module docstring).
LEGACY_MIN_INBOX_TOKEN = 8
#: An Argon2id hash as ``argon2-cffi`` writes it (PHC string format); nothing else is a console password hash.
PASSWORD_HASH_PATTERN = (
    r"^\$argon2id\$v=19\$m=[0-9]{1,7},t=[0-9]{1,3},p=[0-9]{1,3}\$[A-Za-z0-9+/]{11,128}\$[A-Za-z0-9+/]{16,256}$"
)
#: The console roles a profile may name (the journal's API roles).
ConsoleRole = Literal["viewer", "operator", "admin"]


def is_entity_id(value: str) -> bool:
    return 0 < len(value) <= _MAX_ID and _ID_RE.fullmatch(value) is not None


def hash_token(token: str) -> str:
    """The hex SHA-256 of an inbox token: what the directory keeps instead of the token."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


class DirectoryError(Exception):
    """The users file cannot be read or is invalid; the service refuses to start."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MatrixAddress(_Strict):
    user_id: Annotated[str, Field(pattern=r"^@[^:]+:.+$", max_length=255)]


class TelegramAddress(_Strict):
    chat_id: int


class WebAddress(_Strict):
    """The web inbox needs no address: the person signs in with their inbox token."""


class UserChannels(_Strict):
    """Every channel a person can be reached on. A new transport adds a field here and an adapter."""

    matrix: MatrixAddress | None = None
    telegram: TelegramAddress | None = None
    web: WebAddress | None = None

    def names(self) -> list[str]:
        return [name for name in type(self).model_fields if getattr(self, name) is not None]


class UserProfile(_Strict):
    """A person: how they are called and reached. The same shape in the file, the API and the store.

    One of ``inbox_token`` (a literal, for demos; write-only: turned into ``inbox_token_sha256`` before
    it is stored), ``inbox_token_env`` (a variable of each replica's environment) or ``inbox_token_sha256``
    identifies the person to the web inbox; the ``web`` channel needs one.

    ``console_role`` and ``password_hash`` (an Argon2id hash; write-only, never shown) let the person sign in to
    the journal's console with their user id and password (issue 9).
    """

    display_name: Annotated[str, Field(min_length=1, max_length=200)]
    inbox_token: Annotated[SecretStr, Field(min_length=LEGACY_MIN_INBOX_TOKEN)] | None = None
    inbox_token_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")] | None = None
    inbox_token_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    preferred: str
    fallback: list[str] = Field(default_factory=list, max_length=16)
    channels: UserChannels
    console_role: ConsoleRole | None = None
    password_hash: str | None = Field(default=None, pattern=PASSWORD_HASH_PATTERN, max_length=512, repr=False)

    @model_validator(mode="after")
    def _consistent(self) -> UserProfile:
        given = [self.inbox_token, self.inbox_token_env, self.inbox_token_sha256]
        if sum(x is not None for x in given) > 1:
            raise ValueError("give inbox_token or inbox_token_env, not both")
        if self.channels.web is not None and not self.has_inbox_token:
            raise ValueError(
                "channel 'web' is configured but the user has no inbox_token or inbox_token_env: "
                "they could never open the web inbox, so no request could ever reach them there"
            )
        configured = set(self.channels.names())
        for name in [self.preferred, *self.fallback]:
            if name not in configured:
                raise ValueError(f"channel {name!r} is named in preferred/fallback but not configured in channels")
        return self

    @property
    def has_inbox_token(self) -> bool:
        return self.inbox_token is not None or self.inbox_token_env is not None or self.inbox_token_sha256 is not None

    def channel_order(self) -> list[str]:
        """Preferred first, then the fallback order, without repeats."""
        order: list[str] = []
        for name in [self.preferred, *self.fallback]:
            if name not in order:
                order.append(name)
        return order

    def hashed(self) -> UserProfile:
        """This profile as it is stored: a literal ``inbox_token`` replaced by its SHA-256."""
        if self.inbox_token is None:
            return self
        data = self.model_dump()
        data.update(inbox_token=None, inbox_token_sha256=hash_token(self.inbox_token.get_secret_value()))
        return UserProfile.model_validate(data)


class GroupProfile(_Strict):
    """A group of people asked together (``group:<id>``): every member, the first valid answer wins."""

    display_name: Annotated[str, Field(min_length=1, max_length=200)]
    members: Annotated[list[EntityId], Field(min_length=1, max_length=200)]

    @field_validator("members")
    @classmethod
    def _unique(cls, members: list[str]) -> list[str]:
        repeated = sorted({m for m in members if members.count(m) > 1})
        if repeated:
            raise ValueError(f"members are listed twice: {', '.join(repeated)}")
        return members


class _UsersFile(_Strict):
    users: dict[EntityId, UserProfile]
    groups: dict[EntityId, GroupProfile] = Field(default_factory=dict)


def recipient_for(user_id: str) -> str:
    return f"{RECIPIENT_PREFIX}{user_id}"


def group_recipient(group_id: str) -> str:
    return f"{GROUP_PREFIX}{group_id}"


def user_id_of(recipient: str) -> str | None:
    """``user:alice`` -> ``alice``; anything else (a channel address, a bare name, a group) -> None."""
    if not recipient.startswith(RECIPIENT_PREFIX):
        return None
    user_id = recipient.removeprefix(RECIPIENT_PREFIX)
    return user_id if is_entity_id(user_id) else None


def group_id_of(recipient: str) -> str | None:
    """``group:api-owners`` -> ``api-owners``; anything else -> None."""
    if not recipient.startswith(GROUP_PREFIX):
        return None
    group_id = recipient.removeprefix(GROUP_PREFIX)
    return group_id if is_entity_id(group_id) else None


def resolve_token(user_id: str, profile: UserProfile, env: Mapping[str, str]) -> str | None:
    """The SHA-256 (hex) that identifies ``profile`` to the web inbox here; ``DirectoryError`` if unusable."""
    if profile.inbox_token is not None:
        return hash_token(profile.inbox_token.get_secret_value())
    if profile.inbox_token_sha256 is not None:
        return profile.inbox_token_sha256
    if profile.inbox_token_env is not None:
        token = env.get(profile.inbox_token_env)
        if not token:
            raise DirectoryError(f"user {user_id!r}: environment variable {profile.inbox_token_env} is unset or empty")
        if len(token) < LEGACY_MIN_INBOX_TOKEN:
            raise DirectoryError(f"user {user_id!r}: the inbox token is shorter than {MIN_INBOX_TOKEN} characters")
        warn_if_short(user_id, token, f"environment variable {profile.inbox_token_env}")
        return hash_token(token)
    return None


def warn_if_short(user_id: str, token: str, where: str) -> None:
    """Log ``directory.inbox_token_short`` for a legacy token (shorter than :data:`MIN_INBOX_TOKEN`)."""
    if len(token) < MIN_INBOX_TOKEN:
        log.warning(
            "directory.inbox_token_short",
            user_id=user_id,
            where=where,
            minimum=MIN_INBOX_TOKEN,
            advice="still accepted so that the upgrade locks nobody out; set a new one of at least 24 random characters",
        )


def parse_directory(
    raw: Any, *, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, UserProfile], dict[str, GroupProfile]]:
    """The users file's mapping validated as a whole: profiles (tokens hashed) and groups, or ``DirectoryError``.

    Every ``inbox_token_env`` must be set here, no two users may share a token, and every group member
    must be a user of the file.
    """
    env = os.environ if environ is None else environ
    try:
        parsed = _UsersFile.model_validate(raw)
    except ValidationError as exc:
        raise DirectoryError(f"invalid user directory: {exc}") from exc
    tokens: dict[str, str] = {}
    for user_id, profile in parsed.users.items():
        if profile.inbox_token is not None:
            warn_if_short(user_id, profile.inbox_token.get_secret_value(), "the users file")
        digest = resolve_token(user_id, profile, env)
        if digest is not None:
            if digest in tokens.values():
                raise DirectoryError(f"user {user_id!r}: the inbox token is shared with another user")
            tokens[user_id] = digest
    for group_id, group in parsed.groups.items():
        unknown = [m for m in group.members if m not in parsed.users]
        if unknown:
            raise DirectoryError(f"group {group_id!r}: members {', '.join(unknown)} are not users of the file")
    return {k: v.hashed() for k, v in parsed.users.items()}, dict(parsed.groups)


def read_directory_file(path: Path) -> Any:
    """The users file's YAML, or ``DirectoryError``."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DirectoryError(f"cannot read the user directory {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise DirectoryError(f"{path} is not valid YAML: {exc}") from exc


class Directory:
    """What one replica knows of the directory: profiles and groups by id, plus inbox-token lookup.

    Built from the users file (``from_yaml`` / ``from_mapping``: a fixed directory, as tests use it) or
    kept current by the store's watch (:class:`~.store.DirectoryWatch` calls :meth:`apply`). Every
    change is applied whole, so a reader sees a profile before or after an edit, never half of one.
    """

    def __init__(
        self,
        users: Mapping[str, UserProfile] | None = None,
        groups: Mapping[str, GroupProfile] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._environ = os.environ if environ is None else environ
        self._users: dict[str, UserProfile] = {}
        self._groups: dict[str, GroupProfile] = {}
        self._tokens: dict[str, bytes] = {}  # user id -> SHA-256 of the inbox token
        #: ``user.<id>`` / ``group.<id>`` -> why this replica cannot fully serve the stored entry.
        self.problems: dict[str, str] = {}
        #: ``user.<id>`` / ``group.<id>`` -> the last store revision applied (the API waits on it).
        self.revisions: dict[str, int] = {}
        self._changed = asyncio.Condition()
        for user_id, profile in (users or {}).items():
            self.apply_user(user_id, profile)
        for group_id, group in (groups or {}).items():
            self.apply_group(group_id, group)

    @classmethod
    def from_mapping(cls, raw: Any, *, environ: Mapping[str, str] | None = None) -> Directory:
        users, groups = parse_directory(raw, environ=environ)
        return cls(users, groups, environ=environ)

    @classmethod
    def from_yaml(cls, path: Path, *, environ: Mapping[str, str] | None = None) -> Directory:
        return cls.from_mapping(read_directory_file(path), environ=environ)

    # ------------------------------------------------------------------ reading
    def __contains__(self, user_id: object) -> bool:
        return user_id in self._users

    def __len__(self) -> int:
        return len(self._users)

    def get(self, user_id: str) -> UserProfile | None:
        return self._users.get(user_id)

    def group(self, group_id: str) -> GroupProfile | None:
        return self._groups.get(group_id)

    def user_ids(self) -> list[str]:
        return sorted(self._users)

    def group_ids(self) -> list[str]:
        return sorted(self._groups)

    def groups_with(self, user_id: str) -> list[str]:
        """The groups ``user_id`` is a member of."""
        return sorted(g for g, group in self._groups.items() if user_id in group.members)

    def token_owner(self, digest: str) -> str | None:
        """The user whose inbox token has this SHA-256 (hex), if any (the API refuses a shared token)."""
        found: str | None = None
        candidate = bytes.fromhex(digest)
        for user_id, expected in self._tokens.items():
            if hmac.compare_digest(candidate, expected):
                found = user_id
        return found

    def user_for_identity(self, channel: str, identity: str) -> str | None:
        """The user behind a channel identity (who pressed, reacted or replied), or None if nobody is.

        ``matrix``: the Matrix user id; ``telegram``: the Telegram user id (equal to the private chat id
        in the profile); ``web``: the user id itself (the API authenticated it by inbox token).
        """
        if channel == "web":
            return identity if identity in self._users else None
        for user_id, profile in self._users.items():
            if channel == "matrix" and profile.channels.matrix is not None:
                if profile.channels.matrix.user_id == identity:
                    return user_id
            elif channel == "telegram" and profile.channels.telegram is not None:
                if str(profile.channels.telegram.chat_id) == identity:
                    return user_id
        return None

    def user_for_token(self, token: str) -> str | None:
        """The user whose inbox token this is, or None. Compares against every token in constant time."""
        return self.token_owner(hash_token(token))

    # ------------------------------------------------------------------ applying
    def apply_user(self, user_id: str, profile: UserProfile | None) -> None:
        """Serve ``profile`` as ``user_id`` from now on (None: forget the user)."""
        key = f"user.{user_id}"
        self._tokens.pop(user_id, None)
        self.problems.pop(key, None)
        if profile is None:
            self._users.pop(user_id, None)
            return
        self._users[user_id] = profile
        try:
            digest = resolve_token(user_id, profile, self._environ)
        except DirectoryError as exc:
            self.problems[key] = str(exc)
            log.error("directory.inbox_token_unusable", user_id=user_id, problem=str(exc))
            return
        if digest is None:
            return
        owner = self.token_owner(digest)
        if owner is not None:
            self.problems[key] = f"the inbox token is shared with user {owner!r}: it does not open the inbox"
            log.error("directory.inbox_token_shared", user_id=user_id, other=owner)
            return
        self._tokens[user_id] = bytes.fromhex(digest)

    def apply_group(self, group_id: str, group: GroupProfile | None) -> None:
        """Serve ``group`` as ``group_id`` from now on (None: forget the group)."""
        if group is None:
            self._groups.pop(group_id, None)
        else:
            self._groups[group_id] = group

    def applied(self, key: str, revision: int) -> None:
        """Record that the store's ``revision`` of ``key`` is applied here."""
        self.revisions[key] = max(self.revisions.get(key, 0), revision)

    async def notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for_revision(self, key: str, revision: int, timeout_s: float = 5.0) -> bool:
        """Wait until this replica applied ``revision`` (or a later one) of ``key``; False on timeout."""
        async with self._changed:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._changed.wait_for(lambda: self.revisions.get(key, 0) >= revision)
            except TimeoutError:
                return False
        return True
