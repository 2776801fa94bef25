"""The webhook reads a body that came in one ASGI message as it is (``api._read_body``), any other through
``read_body``: the same answers either way, for whole bodies, bodies in pieces, declared lengths and a client
that hangs up. Driven with raw ASGI messages, over a real nats-server."""

from __future__ import annotations

import base64
import json
from typing import Any

from gateway_support import MAX_BODY, PASSWORD, fixture_bytes, journal_of

from temporality_bus import Bus
from temporality_trigger_gateway import Settings, TriggerConfig, create_app


def _event(event_id: str) -> bytes:
    doc = json.loads(fixture_bytes("pr-created.json").removeprefix(b"\xef\xbb\xbf"))
    doc["id"] = event_id
    return json.dumps(doc).encode()


async def _deliver(app: Any, messages: list[dict[str, Any]], length: str | None) -> tuple[int, dict[str, Any]]:
    """POST to the Azure DevOps trigger with ``messages`` as what the server hands over (then nothing more)."""
    headers = [
        (b"host", b"gateway.test"),
        (b"content-type", b"application/json"),
        (b"authorization", b"Basic " + base64.b64encode(f"azure:{PASSWORD}".encode())),
    ]
    if length is not None:
        headers.append((b"content-length", length.encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/hooks/ado-pr-review",
        "raw_path": b"/hooks/ado-pr-review",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }
    handed = list(messages)

    async def receive() -> dict[str, Any]:
        return handed.pop(0) if handed else {"type": "http.disconnect"}

    answer: dict[str, Any] = {}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        elif message["type"] == "http.response.body":
            answer["body"] = answer.get("body", b"") + message.get("body", b"")

    await app(scope, receive, send)
    return answer["status"], json.loads(answer["body"])


def _pieces(body: bytes, n: int) -> list[dict[str, Any]]:
    size = -(-len(body) // n)
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]


def _shape(answer: tuple[int, dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    status, body = answer
    return status, {k: v for k, v in body.items() if k not in ("delivery_id", "run_id")}


async def test_a_body_in_one_message_or_in_pieces_is_answered_alike(
    bus: Bus, settings: Settings, triggers: list[TriggerConfig]
) -> None:
    app = create_app(settings, bus, triggers)
    whole = _event("read-whole")
    pieces = _event("read-pieces")
    one = await _deliver(app, [{"type": "http.request", "body": whole, "more_body": False}], str(len(whole)))
    several = await _deliver(app, _pieces(pieces, 3), str(len(pieces)))
    undeclared = await _deliver(app, [{"type": "http.request", "body": _event("read-undeclared")}], None)
    assert one[0] == several[0] == undeclared[0] == 202
    assert _shape(one) == _shape(several) == _shape(undeclared)
    # each started its run, from the whole body (the events' source ids are the bodies' ids)
    accepted = {e.data["source_event_id"] for e in await journal_of(bus, "trigger.accepted")}
    assert {"read-whole", "read-pieces", "read-undeclared"} <= accepted
    # a copy of the event in pieces is a duplicate of the one read whole, and the other way round
    again_pieces = await _deliver(app, _pieces(whole, 4), str(len(whole)))
    again_whole = await _deliver(app, [{"type": "http.request", "body": pieces, "more_body": False}], None)
    assert again_pieces[0] == again_whole[0] == 200
    assert again_pieces[1]["status"] == again_whole[1]["status"] == "duplicate"


async def test_refusals_are_the_same_for_a_body_in_one_message_and_in_pieces(
    bus: Bus, settings: Settings, triggers: list[TriggerConfig]
) -> None:
    app = create_app(settings, bus, triggers)
    big = b"x" * (MAX_BODY + 1)
    small = b'{"eventType": "git.pullrequest.created"}'
    cases: list[tuple[str, bytes, str | None, int]] = [
        ("too large, declared", big, str(len(big)), 413),
        ("too large, undeclared", big, None, 413),
        ("declared too large, small body", small, str(MAX_BODY + 1), 413),
        ("declared length not a number", small, "abc", 400),
        ("declared length not ASCII digits", small, "\u00b2", 400),
        ("not JSON", b"{not json", None, 400),
        ("not the source's shape", small, str(len(small)), 422),
    ]
    for what, body, length, status in cases:
        one = await _deliver(app, [{"type": "http.request", "body": body, "more_body": False}], length)
        several = await _deliver(app, _pieces(body, 3), length)
        assert one == several, what
        assert one[0] == status, (what, one)
    # the client hangs up: before any body, and after a first piece
    gone_first = await _deliver(app, [], None)
    gone_later = await _deliver(app, _pieces(_event("read-gone"), 3)[:1], None)
    assert gone_first == gone_later
    assert gone_first[0] == 400
    assert gone_first[1]["error"] == "client_disconnected"
