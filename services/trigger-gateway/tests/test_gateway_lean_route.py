"""``POST /hooks/{trigger_id}`` takes a lean path past the framework's layers while telemetry is off
(``api._GatewayApp``): it must answer exactly as the whole middleware stack does, run the middleware the app
was given, and leave a bug a 500 that is also raised to the server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from gateway_support import MAX_BODY, basic, fixture_bytes, post
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from temporality_bus import Bus
from temporality_trigger_gateway import Settings, TriggerConfig, create_app
from temporality_trigger_gateway.store import TriggerRegistry


class _Seen:
    """An app middleware (as the service runtime's request metrics): what each request's scope named."""

    def __init__(self, app: ASGIApp, seen: list[tuple[str, str | None, int]]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 0

        async def noted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, noted)
        self.seen.append((scope["method"], getattr(scope.get("route"), "path", None), status))


@pytest.fixture
async def both(
    bus: Bus, settings: Settings, triggers: list[TriggerConfig]
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, list[tuple[str, str | None, int]]]]:
    """A client of the app as it is (lean path) and one of the same app forced through the whole stack."""
    seen: list[tuple[str, str | None, int]] = []
    lean, full = create_app(settings, bus, triggers), create_app(settings, bus, triggers)
    full.webhook_route = None  # type: ignore[attr-defined]  # the whole stack for every request
    lean.add_middleware(_Seen, seen=seen)
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=lean), base_url="http://gateway.test") as a,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=full), base_url="http://gateway.test") as b,
    ):
        yield a, b, seen


def _answer(response: httpx.Response) -> tuple[int, Any, dict[str, str]]:
    body = response.json()
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k not in ("delivery_id", "run_id")}  # new per delivery
    kept = ("content-type", "www-authenticate", "retry-after", "allow")
    return response.status_code, body, {k: response.headers[k] for k in kept if k in response.headers}


def _event(event_id: str) -> bytes:
    doc = json.loads(fixture_bytes("pr-created.json").removeprefix(b"\xef\xbb\xbf"))
    doc["id"] = event_id
    return json.dumps(doc).encode()


async def test_the_lean_path_answers_as_the_whole_stack(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient, list[tuple[str, str | None, int]]],
) -> None:
    lean, full, seen = both
    cases: list[tuple[str, bytes, str, dict[str, str] | None]] = [
        ("unknown trigger", b"{}", "no-such-trigger", None),
        ("no credentials", b"{}", "ado-pr-review", {}),
        ("wrong password", b"{}", "ado-pr-review", basic(password="wrong")),
        ("too large", b"x" * (MAX_BODY + 1), "ado-pr-review", None),
        ("not JSON", b"{not json", "ado-pr-review", None),
        ("not the source's shape", b'{"eventType": "git.pullrequest.created"}', "ado-pr-review", None),
        ("a trigger id with an encoded slash", b"{}", "a%2Fb", None),
    ]
    for what, body, trigger_id, headers in cases:
        a = await post(lean, body, trigger_id=trigger_id, headers=headers)
        b = await post(full, body, trigger_id=trigger_id, headers=headers)
        assert _answer(a) == _answer(b), what
        assert a.status_code >= 400, what
    first, second = await post(lean, _event("lean-1")), await post(full, _event("full-1"))
    assert first.status_code == second.status_code == 202
    assert _answer(first) == _answer(second)
    again, again_full = await post(lean, _event("full-1")), await post(full, _event("lean-1"))
    assert again.status_code == again_full.status_code == 200
    assert _answer(again) == _answer(again_full)
    assert again.json()["status"] == "duplicate"
    # the app's own middleware ran for every lean request, with the route named as the router names it
    assert ("POST", "/hooks/{trigger_id}", 202) in seen
    assert ("POST", "/hooks/{trigger_id}", 401) in seen
    assert len(seen) == len(cases) + 2


async def test_other_methods_and_paths_still_take_the_whole_stack(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient, list[tuple[str, str | None, int]]],
) -> None:
    lean, full, _seen = both
    for method, path in [("GET", "/hooks/ado-pr-review"), ("POST", "/hooks/ado-pr-review/more"), ("POST", "/hooks/")]:
        a, b = await lean.request(method, path), await full.request(method, path)
        assert _answer(a) == _answer(b), (method, path)
        assert a.status_code in (404, 405), (method, path)


async def test_a_bug_on_the_lean_path_is_a_500_body_and_raised_to_the_server(
    bus: Bus, settings: Settings, triggers: list[TriggerConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: TriggerRegistry, trigger_id: str) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(TriggerRegistry, "webhook", broken)
    app = create_app(settings, bus, triggers)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
        response = await post(client, _event("bug-1"))
    assert response.status_code == 500
    assert response.json()["error"] == "internal_error"
    assert app.middleware_stack is None  # the whole stack was never even built: the lean path answered
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as client:
        with pytest.raises(RuntimeError, match="a bug"):  # as Starlette's server-error middleware re-raises
            await post(client, _event("bug-2"))


async def test_a_trailing_slash_is_the_same_hook_not_a_redirect(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient, list[tuple[str, str | None, int]]],
) -> None:
    """An integrator review: ``/hooks/<id>/`` was an empty-body 307 to an absolute ``http://`` Location (wrong
    behind TLS; GitHub does not follow redirects). It is the hook itself, on either path through the app."""
    lean, full, _ = both
    for client, event_id in ((lean, "slash-lean"), (full, "slash-full")):
        answer = await post(client, _event(event_id), trigger_id="ado-pr-review/")
        assert answer.status_code == 202, answer.text
        assert "location" not in answer.headers
        assert answer.json()["status"] == "accepted"
        again = await post(client, _event(event_id), trigger_id="ado-pr-review")  # the same hook, a duplicate
        assert again.json()["status"] == "duplicate"
        refused = await post(client, b"{}", trigger_id="ado-pr-review/", headers=basic(password="wrong"))
        assert refused.status_code == 401
        unknown = await post(client, b"{}", trigger_id="no-such-trigger/")
        assert unknown.status_code == 404
        assert (await client.get("/hooks/ado-pr-review/")).status_code == 405
