"""Role tokens on the journal API: anonymous and wrong tokens refused everywhere but health; viewer reads,
operator cancels (``run.cancel_requested`` on the real bus, recorded by the journal)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
from journal_support import ADMIN, OPERATOR

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal

NOBODY = {"Authorization": ""}
WRONG = {"Authorization": "Bearer not-a-token-of-this-journal-at-all"}


def _assert_error(response: httpx.Response, status: int, error: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "detail"}
    assert body["error"] == error
    assert body["detail"]


def _routes(openapi: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (method, concrete path) of the API, path parameters filled with a benign value."""
    routes = []
    for path, operations in openapi["paths"].items():
        for method in operations:
            routes.append((method.upper(), re.sub(r"\{[^}]+\}", "x-1", path)))
    return routes


async def test_every_route_but_health_needs_a_token(journal: Journal) -> None:
    openapi = (await journal.client.get("/openapi.json")).json()
    routes = _routes(openapi)
    assert ("POST", "/runs/x-1/cancel") in routes
    assert len(routes) >= 10
    assert not any(path in ("/healthz", "/readyz") for _, path in routes)
    assert ("GET", "/auth/config") in routes  # how to sign in: asked before signing in, says no secret
    for method, path in routes:
        if path == "/auth/config":
            continue
        for headers, code in ((NOBODY, "unauthorized"), (WRONG, "invalid_token")):
            if path.startswith("/human/") and headers is WRONG:
                continue  # an inbox token: human-interaction judges it (test_journal_human.py), not the journal
            response = await journal.client.request(method, path, headers=headers)
            _assert_error(response, 401, code)
            assert response.headers["WWW-Authenticate"] == "Bearer"
    # nor is the API's description anonymous (issue 11): the document needs a viewer, and no docs pages are served
    for headers, code in ((NOBODY, "unauthorized"), (WRONG, "invalid_token")):
        _assert_error(await journal.client.get("/openapi.json", headers=headers), 401, code)
    for page in ("/docs", "/redoc"):
        assert (await journal.client.get(page)).status_code == 404, page


async def test_viewer_reads_and_whoami_names_the_token(journal: Journal, story: MakeStory) -> None:
    s = story()
    await journal.send(s.requested())
    assert (await journal.client.get(f"/runs/{s.run_id}")).status_code == 200
    token = {"kind": "token", "user": None, "expires_at": None}
    assert (await journal.client.get("/whoami")).json() == {"name": "board", "role": "viewer", **token}
    assert (await journal.client.get("/whoami", headers=OPERATOR)).json() == {
        "name": "oncall",
        "role": "operator",
        **token,
    }
    assert (await journal.client.get("/runs", headers=ADMIN)).status_code == 200


async def test_operator_cancels_a_running_run(journal: Journal, story: MakeStory) -> None:
    s = story()
    await journal.send(s.requested(), s.started())
    url = f"/runs/{s.run_id}/cancel"

    refused = await journal.client.post(url, json={"reason": "stuck"})  # the client's viewer token
    _assert_error(refused, 403, "forbidden")
    assert "operator" in refused.json()["detail"]

    accepted = await journal.client.post(url, json={"reason": "stuck on a closed PR"}, headers=OPERATOR)
    assert accepted.status_code == 202, accepted.text
    body = accepted.json()
    assert body["status"] == "cancel_requested"
    assert body["run_id"] == s.run_id
    assert body["requested_by"] == "oncall"

    # published durably on the real bus and recorded by the journal's consumer like any event
    await journal.wait_handled(body["event_id"])
    events = (await journal.client.get("/events", params={"type": "run.cancel_requested"}, headers=OPERATOR)).json()[
        "events"
    ]
    assert [e["id"] for e in events] == [body["event_id"]]
    assert events[0]["run_id"] == s.run_id
    assert events[0]["data"] == {"run_id": s.run_id, "reason": "stuck on a closed PR", "requested_by": "oncall"}
    assert events[0]["actor"] == "token:oncall"
    # the request alone does not move the run: the run-executor answers with run.cancelled
    assert (await journal.run(s.run_id))["state"] == "running"

    again = await journal.client.post(url, json={"reason": "stuck on a closed PR"}, headers=ADMIN)
    assert again.status_code == 202
    assert again.json()["requested_by"] == "root"


async def test_a_cancel_without_a_body_or_reason_is_accepted_with_no_reason_given(
    journal: Journal, story: MakeStory
) -> None:
    """``curl -X POST …/cancel`` with no body (or ``{}``) cancels: the reason is optional, the journal says none
    was given."""
    s = story()
    await journal.send(s.requested(), s.started())
    url = f"/runs/{s.run_id}/cancel"
    bare = await journal.client.post(url, headers=OPERATOR)
    assert bare.status_code == 202, bare.text
    empty = await journal.client.post(url, json={}, headers=OPERATOR)
    assert empty.status_code == 202, empty.text
    # the same person asking again with the same (no) reason is the same fact: one event
    assert empty.json()["event_id"] == bare.json()["event_id"]
    await journal.wait_handled(bare.json()["event_id"])
    events = (await journal.client.get("/events", params={"type": "run.cancel_requested"}, headers=OPERATOR)).json()[
        "events"
    ]
    assert [e["id"] for e in events] == [bare.json()["event_id"]]
    assert events[0]["data"] == {"run_id": s.run_id, "reason": "no reason given", "requested_by": "oncall"}


async def test_cancel_refuses_unknown_finished_and_bad_requests(journal: Journal, story: MakeStory) -> None:
    done = story()
    await journal.send(done.requested(), done.started(), done.completed())
    _assert_error(
        await journal.client.post("/runs/run-nope/cancel", json={"reason": "x"}, headers=OPERATOR),
        404,
        "run_not_found",
    )
    finished = await journal.client.post(f"/runs/{done.run_id}/cancel", json={"reason": "x"}, headers=OPERATOR)
    _assert_error(finished, 409, "run_finished")
    assert "completed" in finished.json()["detail"]

    url = f"/runs/{done.run_id}/cancel"
    _assert_error(await journal.client.post(url, content=b"{not json", headers=OPERATOR), 400, "malformed_json")
    bodies: list[object] = [{"reason": ""}, {"reason": "x" * 501}, {"reason": "ok", "extra": 1}, [], {"reason": 5}]
    for body in bodies:
        _assert_error(await journal.client.post(url, json=body, headers=OPERATOR), 422, "invalid_cancel")
    big = b'{"reason": "' + b"x" * 70_000 + b'"}'
    _assert_error(await journal.client.post(url, content=big, headers=OPERATOR), 413, "body_too_large")
    assert (await journal.client.get("/events", params={"type": "run.cancel_requested"}, headers=OPERATOR)).json()[
        "events"
    ] == []
