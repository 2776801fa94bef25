"""Property tests of the trigger admin API (hypothesis, issue 7; schemathesis is not installable here):
arbitrary bodies for create, replace and preview -- random JSON, random bytes, valid drafts with a few
values replaced at any depth or removed, unknown keys -- never reach a 5xx. Every refusal is a 4xx with a
named error (``{"error": <code>, "detail": <sentence>}``), every success the documented shape. Bounded
(``max_examples``, no deadline), against the app over the real-nats ``bus`` and trigger store."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_support import AGENTS, AS_ADMIN, PASSWORD, fixture_json, tokens_file, webhook_spec
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from temporality_bus import Bus
from temporality_service import ApiAuth, ApiAuthSettings
from temporality_trigger_gateway import Settings, create_app
from temporality_trigger_gateway.store import TriggerRegistry, TriggerStore

_FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_KEYS = st.sampled_from(
    [
        *("id", "type", "adapter", "events", "agent", "auth", "input", "when", "cron", "timezone", "event_type"),
        *("filter", "concurrency", "deduplication", "retry", "human", "context", "prompt", "enabled", "name", "x-new"),
    ]
)
_EVENT_TRIGGER = {
    "id": "api-event",
    "name": "On completed runs",
    "type": "event",
    "event_type": "run.completed",
    "agent": "reviewer",
    "filter": {"actor_type": "agent"},
}
_SCHEDULE_TRIGGER = {
    "id": "api-nightly",
    "name": "Nightly",
    "type": "schedule",
    "cron": "0 3 * * *",
    "agent": "reviewer",
}


@st.composite
def _mutated(draw: st.DrawFn, document: Any) -> Any:
    """``document`` with a few values (at any depth) replaced by random JSON or removed, or keys added."""
    document = copy.deepcopy(document)
    for _ in range(draw(st.integers(0, 3))):
        node = document
        path: list[Any] = []
        while isinstance(node, dict | list) and node and (not path or draw(st.integers(0, 3)) > 0):
            key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
            path.append(key)
            node = node[key]
        if not path:
            return draw(_JSON)
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.integers(0, 2))
        if isinstance(parent, dict) and action == 0:
            del parent[path[-1]]
        elif isinstance(parent, dict) and action == 1:
            parent[draw(_KEYS)] = draw(_JSON)
        else:
            parent[path[-1]] = draw(_JSON)
    return document


_DRAFT = st.sampled_from([webhook_spec(), _EVENT_TRIGGER, _SCHEDULE_TRIGGER]).flatmap(_mutated)
#: A body as a client may send it: a (mutated) draft, any JSON, or bytes that need not be JSON at all.
_BODY = st.one_of(
    _DRAFT.map(lambda d: json.dumps(d).encode()),
    _JSON.map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=120),
)


@pytest.fixture
async def admin(bus: Bus, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    store = await TriggerStore.open(bus)
    registry = TriggerRegistry(environ={"GW_HOOK_PASSWORD": PASSWORD}, agents=AGENTS)
    auth = ApiAuth.from_settings(ApiAuthSettings(tokens_file=tokens_file(tmp_path)))
    async with registry.watching(store):
        app = create_app(Settings(max_body_bytes=64 * 1024), bus, registry, store=store, auth=auth)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as c:
            yield c


def _named(response: httpx.Response) -> None:
    """No 5xx; a refusal names its error; a success is JSON (an object)."""
    assert response.status_code < 500, response.text
    body = response.json()
    event(f"{response.status_code} {body.get('error') or body.get('ok', '')}")  # --hypothesis-show-statistics
    assert isinstance(body, dict)
    if response.status_code >= 400:
        assert isinstance(body.get("error"), str), body
        assert body["error"], body
        assert isinstance(body.get("detail"), str), body
        assert body["detail"], body


async def _post(client: httpx.AsyncClient, path: str, raw: bytes, **headers: str) -> httpx.Response:
    return await client.post(path, content=raw, headers={**AS_ADMIN, "Content-Type": "application/json", **headers})


@_FUZZ
@given(raw=_BODY)
async def test_create_never_fails_with_a_5xx(admin: httpx.AsyncClient, raw: bytes) -> None:
    created = await _post(admin, "/triggers", raw)
    _named(created)
    if created.status_code == 201:  # a valid draft: remove it, so the next example may create it again
        trigger_id = created.headers["Location"].removeprefix("/triggers/")
        assert (await admin.delete(f"/triggers/{trigger_id}", headers=AS_ADMIN)).status_code == 204


@_FUZZ
@given(raw=_BODY)
async def test_replace_never_fails_with_a_5xx(admin: httpx.AsyncClient, raw: bytes) -> None:
    existing = await admin.get("/triggers/api-pr", headers=AS_ADMIN)
    if existing.status_code == 404:
        assert (await admin.post("/triggers", json=webhook_spec(), headers=AS_ADMIN)).status_code == 201
        existing = await admin.get("/triggers/api-pr", headers=AS_ADMIN)
    etag = existing.headers["ETag"]
    replaced = await admin.put(
        "/triggers/api-pr", content=raw, headers={**AS_ADMIN, "Content-Type": "application/json", "If-Match": etag}
    )
    _named(replaced)


@_FUZZ
@given(
    trigger=_DRAFT | _JSON,
    payload=st.one_of(_JSON, st.just(fixture_json("pr-created.json")).flatmap(_mutated)),
    headers=_JSON,
    shape=st.integers(0, 3),
)
async def test_preview_never_fails_with_a_5xx(
    admin: httpx.AsyncClient, trigger: Any, payload: Any, headers: Any, shape: int
) -> None:
    request: Any = {"trigger": trigger, "payload": payload}
    if shape == 1:
        request["headers"] = headers
    elif shape == 2:
        request = {"trigger_id": "api-pr", "payload": payload}
    elif shape == 3:
        request = trigger  # not a preview request at all
    previewed = await _post(admin, "/triggers/preview", json.dumps(request).encode())
    _named(previewed)
    if previewed.status_code == 200:
        assert isinstance(previewed.json().get("ok"), bool)
