"""The user directory: who can be asked, through which channels, in which order (HUM-2).

Channel settings live here, in the person's profile, never in an agent's config: the agent names
``user:<id>`` and this service decides how to reach them. Loaded once from YAML at start-up;
unknown keys are refused so a typo fails loudly instead of silently dropping a channel.
"""

from __future__ import annotations

import hmac
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

__all__ = [
    "RECIPIENT_PREFIX",
    "Directory",
    "DirectoryError",
    "MatrixAddress",
    "TelegramAddress",
    "UserChannels",
    "UserProfile",
    "WebAddress",
    "recipient_for",
    "user_id_of",
]

#: Recipients are written ``user:<id>`` on the wire (SEC-1: a person, never a channel or an address).
RECIPIENT_PREFIX = "user:"
_USER_ID = r"^[A-Za-z0-9_.-]{1,64}$"
_USER_ID_RE = re.compile(_USER_ID)


class DirectoryError(Exception):
    """The users file cannot be read or is invalid; the service refuses to start."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MatrixAddress(_Strict):
    user_id: Annotated[str, Field(pattern=r"^@[^:]+:.+$")]


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
    display_name: Annotated[str, Field(min_length=1, max_length=200)]
    #: A literal token is for demos; prefer ``inbox_token_env`` so the secret stays out of the file.
    inbox_token: SecretStr | None = None
    inbox_token_env: str | None = None
    preferred: str
    fallback: list[str] = Field(default_factory=list)
    channels: UserChannels

    @model_validator(mode="after")
    def _consistent(self) -> UserProfile:
        if self.inbox_token is not None and self.inbox_token_env is not None:
            raise ValueError("give inbox_token or inbox_token_env, not both")
        if self.channels.web is not None and self.inbox_token is None and self.inbox_token_env is None:
            raise ValueError(
                "channel 'web' is configured but the user has no inbox_token or inbox_token_env: "
                "they could never open the web inbox, so no request could ever reach them there"
            )
        configured = set(self.channels.names())
        for name in [self.preferred, *self.fallback]:
            if name not in configured:
                raise ValueError(f"channel {name!r} is named in preferred/fallback but not configured in channels")
        return self

    def channel_order(self) -> list[str]:
        """Preferred first, then the fallback order, without repeats."""
        order: list[str] = []
        for name in [self.preferred, *self.fallback]:
            if name not in order:
                order.append(name)
        return order


class _UsersFile(_Strict):
    users: dict[Annotated[str, Field(pattern=_USER_ID)], UserProfile]


def recipient_for(user_id: str) -> str:
    return f"{RECIPIENT_PREFIX}{user_id}"


def user_id_of(recipient: str) -> str | None:
    """``user:alice`` -> ``alice``; anything else (a channel address, a bare name) -> None."""
    if not recipient.startswith(RECIPIENT_PREFIX):
        return None
    user_id = recipient.removeprefix(RECIPIENT_PREFIX)
    return user_id if _USER_ID_RE.fullmatch(user_id) else None


class Directory:
    """User profiles by id, plus inbox-token lookup (constant-time comparison)."""

    def __init__(self, users: Mapping[str, UserProfile], tokens: Mapping[str, str]) -> None:
        self._users = dict(users)
        self._tokens = dict(tokens)  # user id -> resolved inbox token

    @classmethod
    def from_mapping(cls, raw: Any, *, environ: Mapping[str, str] | None = None) -> Directory:
        env = os.environ if environ is None else environ
        try:
            parsed = _UsersFile.model_validate(raw)
        except ValidationError as exc:
            raise DirectoryError(f"invalid user directory: {exc}") from exc
        tokens: dict[str, str] = {}
        for user_id, profile in parsed.users.items():
            token: str | None = None
            if profile.inbox_token is not None:
                token = profile.inbox_token.get_secret_value()
            elif profile.inbox_token_env is not None:
                token = env.get(profile.inbox_token_env)
                if not token:
                    raise DirectoryError(
                        f"user {user_id!r}: environment variable {profile.inbox_token_env} is unset or empty"
                    )
            if token is not None:
                if len(token) < 8:
                    raise DirectoryError(f"user {user_id!r}: the inbox token is shorter than 8 characters")
                if token in tokens.values():
                    raise DirectoryError(f"user {user_id!r}: the inbox token is shared with another user")
                tokens[user_id] = token
        return cls(parsed.users, tokens)

    @classmethod
    def from_yaml(cls, path: Path, *, environ: Mapping[str, str] | None = None) -> Directory:
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise DirectoryError(f"cannot read the user directory {path}: {exc}") from exc
        except yaml.YAMLError as exc:
            raise DirectoryError(f"{path} is not valid YAML: {exc}") from exc
        return cls.from_mapping(raw, environ=environ)

    def __contains__(self, user_id: object) -> bool:
        return user_id in self._users

    def __len__(self) -> int:
        return len(self._users)

    def get(self, user_id: str) -> UserProfile | None:
        return self._users.get(user_id)

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
        found: str | None = None
        candidate = token.encode("utf-8")
        for user_id, expected in self._tokens.items():
            if hmac.compare_digest(candidate, expected.encode("utf-8")):
                found = user_id
        return found
