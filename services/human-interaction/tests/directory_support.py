"""Helpers for the directory tests: an in-process replica (seeded store, live watch, the API over ASGI)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import SecretStr

from temporality_bus import Bus
from temporality_human_interaction.__main__ import seed_directory
from temporality_human_interaction.api import create_app
from temporality_human_interaction.channels import ChannelAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.settings import Settings
from temporality_human_interaction.store import DirectoryStore, DirectoryWatch
from temporality_service import ApiAuth, ApiToken, Role

TOKENS = [
    ApiToken(name="ci-bot", role=Role.admin, token=SecretStr("admin-token-0123456789abcdef")),
    ApiToken(name="on-call", role=Role.operator, token=SecretStr("operator-token-0123456789abc")),
    ApiToken(name="dashboard", role=Role.viewer, token=SecretStr("viewer-token-0123456789abcde")),
]
ADMIN = {"Authorization": f"Bearer {TOKENS[0].token.get_secret_value()}"}
OPERATOR = {"Authorization": f"Bearer {TOKENS[1].token.get_secret_value()}"}
VIEWER = {"Authorization": f"Bearer {TOKENS[2].token.get_secret_value()}"}

#: A literal inbox token that must never come back from the API or appear in an audit event.
CAROL_TOKEN = "carol-secret-inbox-token-42"

USERS: dict[str, Any] = {
    "users": {
        "alice": {
            "display_name": "Alice Example",
            "inbox_token": "alice-demo-inbox-token-change-me",
            "preferred": "web",
            "channels": {"web": {}},
        },
        "bob": {
            "display_name": "Bob Example",
            "inbox_token": "bob-demo-inbox-token-change-me",
            "preferred": "web",
            "channels": {"web": {}},
        },
    },
    "groups": {"api-owners": {"display_name": "API owners", "members": ["alice"]}},
}


def carol(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "carol",
        "display_name": "Carol Example",
        "inbox_token": CAROL_TOKEN,
        "preferred": "web",
        "channels": {"web": {}},
    }
    body.update(changes)
    return body


@dataclass
class Replica:
    directory: Directory
    store: DirectoryStore
    watch: DirectoryWatch
    client: httpx.AsyncClient
    #: The one binding every channel and the web inbox hand answers to (over ``adapters``).
    router: AnswerRouter


@asynccontextmanager
async def replica(
    bus: Bus, raw: Any = None, *, adapters: dict[str, ChannelAdapter] | None = None
) -> AsyncIterator[Replica]:
    """One human-interaction replica's directory side, as ``__main__.setup`` wires it: seed, watch, API.

    ``adapters`` (filled in by the caller, possibly after this starts) are the channels its router edits."""
    store = await DirectoryStore.open(bus)
    await seed_directory(bus, store, USERS if raw is None else raw, by="file:test-users.yaml")
    directory = Directory()
    watch = DirectoryWatch(directory, store)
    router = AnswerRouter(bus, directory, adapters if adapters is not None else {})
    async with watch.watching():
        app = create_app(Settings(bus_timeout_s=2.0), bus, directory, router, store=store, auth=ApiAuth(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://human.test") as client:
            yield Replica(directory, store, watch, client, router)
