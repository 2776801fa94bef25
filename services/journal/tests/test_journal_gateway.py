"""The ``/gateway/`` proxy (:mod:`temporality_journal.gateway`) against the real trigger-gateway.

The gateway runs in-process on a real port over the test's nats-server (``journal_support.serve_gateway``),
admitting the journal's test tokens; the journal app is driven in-process (``httpx.ASGITransport``), its
shared client to the gateway a real HTTP client, as ``setup`` opens it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from journal_support import ADMIN, OPERATOR, VIEWER, api_auth, serve_gateway

from temporality_bus import Bus, NatsSettings
from temporality_journal import Database, Settings, create_app
from temporality_journal.gateway import MAX_ANSWER_BYTES, gateway_client


def _spec(trigger_id: str = "wizard-hook", **changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "id": trigger_id,
        "name": "Orders through the proxy",
        "type": "webhook",
        "adapter": "generic",
        "events": ["order.created"],
        "agent": "reviewer",
        "auth": {"type": "none"},
        "input": {"order": "payload.order_id"},
    }
    spec.update(changes)
    return spec


@asynccontextmanager
async def _journal(tmp_path: Path, bus: Bus, gateway_url: str | None) -> AsyncIterator[httpx.AsyncClient]:
    """The journal app with the gateway at ``gateway_url`` (None: not configured); a client without a token."""
    settings = Settings(gateway_url=gateway_url)
    async with Database.open(f"sqlite+aiosqlite:///{tmp_path / 'proxy' / 'journal.db'}") as database:
        upstream = gateway_client(settings)
        async with upstream if upstream is not None else _nothing():
            app = create_app(settings, database, bus, api_auth(), gateway=upstream)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://journal", timeout=20) as client:
                yield client


@asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield None


@pytest.fixture
async def proxied(tmp_path: Path, nats_settings: NatsSettings, bus: Bus) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_gateway(tmp_path, nats_settings) as url, _journal(tmp_path, bus, url) as client:
        yield client


async def test_only_the_allow_listed_routes_are_forwarded(proxied: httpx.AsyncClient) -> None:
    listed = await proxied.get("/gateway/triggers", headers=VIEWER)
    assert listed.status_code == 200, listed.text
    assert [t["trigger"]["id"] for t in listed.json()["triggers"]] == ["seeded-hook"]
    for method, path in [
        ("GET", "/gateway/hooks/seeded-hook"),
        ("POST", "/gateway/hooks/seeded-hook"),
        ("GET", "/gateway/metrics"),
        ("GET", "/gateway/readyz"),
        ("GET", "/gateway/triggers/..%2F..%2Fmetrics"),
        ("GET", "/gateway/triggers/%2E%2E"),
        ("GET", "/gateway/triggers/seeded-hook%2Fdeliveries"),
        ("GET", "/gateway/triggers/Seeded-Hook"),
        ("POST", "/gateway/triggers/seeded-hook/deliveries/../../../hooks/seeded-hook"),
        ("POST", "/gateway/triggers/seeded-hook/deliveries/dlv-XYZ/redrive"),
    ]:
        answer = await proxied.request(method, path, headers=ADMIN)
        assert answer.status_code == 404, (method, path, answer.text)
        assert answer.json()["error"] == "gateway_route_not_found", (method, path)
    for method, path, allowed in [
        ("PATCH", "/gateway/triggers/seeded-hook", "GET, PUT, DELETE"),
        ("GET", "/gateway/triggers/seeded-hook/enable", "POST"),
        ("DELETE", "/gateway/triggers", "GET, POST"),
    ]:
        answer = await proxied.request(method, path, headers=ADMIN)
        assert (answer.status_code, answer.json()["error"]) == (405, "method_not_allowed"), (method, path)
        assert answer.headers["allow"] == allowed
    # a header value that is not ASCII goes on as its bytes; the gateway refuses it (no 5xx here)
    odd = await proxied.get("/gateway/triggers", headers={b"Authorization": "Bearer caf\u00e9-token".encode()})
    assert odd.status_code == 401, odd.text
    # the gateway's own 404 comes back as it is
    unknown = await proxied.get("/gateway/triggers/no-such-trigger", headers=VIEWER)
    assert (unknown.status_code, unknown.json()["error"]) == (404, "trigger_not_found")
    # only cursor and limit go on; the journal bounds them as the gateway does
    page = await proxied.get("/gateway/triggers/seeded-hook/deliveries", params={"limit": 5}, headers=VIEWER)
    assert page.status_code == 200, page.text
    assert page.json() == {"deliveries": [], "next_cursor": None}
    refused = await proxied.get("/gateway/triggers/seeded-hook/deliveries", params={"limit": 0}, headers=VIEWER)
    assert refused.status_code == 422


async def test_etag_and_if_match_pass_through(proxied: httpx.AsyncClient) -> None:
    created = await proxied.post("/gateway/triggers", json=_spec(), headers=ADMIN)
    assert created.status_code == 201, created.text
    assert created.headers["location"] == "/gateway/triggers/wizard-hook"
    etag = created.headers["etag"]
    read = await proxied.get("/gateway/triggers/wizard-hook", headers=VIEWER)
    assert (read.status_code, read.headers["etag"]) == (200, etag)
    assert read.headers["content-type"].startswith("application/json")
    assert set(read.headers) <= {"content-type", "etag", "content-length"}, read.headers  # nothing else comes back

    missing = await proxied.put("/gateway/triggers/wizard-hook", json=_spec(name="No If-Match"), headers=ADMIN)
    assert (missing.status_code, missing.json()["error"]) == (428, "precondition_required")
    replaced = await proxied.put(
        "/gateway/triggers/wizard-hook", json=_spec(name="Renamed"), headers={**ADMIN, "If-Match": etag}
    )
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["trigger"]["name"] == "Renamed"
    assert replaced.headers["etag"] != etag
    stale = await proxied.put(
        "/gateway/triggers/wizard-hook", json=_spec(name="Stale"), headers={**ADMIN, "If-Match": etag}
    )
    assert (stale.status_code, stale.json()["error"]) == (412, "precondition_failed")
    assert "read it again" in stale.json()["detail"]

    disabled = await proxied.post(
        "/gateway/triggers/wizard-hook/disable", headers={**OPERATOR, "If-Match": replaced.headers["etag"]}
    )
    assert (disabled.status_code, disabled.json()["trigger"]["enabled"]) == (200, False)
    again = await proxied.post("/gateway/triggers/wizard-hook/enable", headers={**OPERATOR, "If-Match": etag})
    assert again.status_code == 412
    duplicate = await proxied.post("/gateway/triggers", json=_spec(), headers=ADMIN)
    assert (duplicate.status_code, duplicate.json()["error"]) == (409, "trigger_exists")
    deleted = await proxied.delete(
        "/gateway/triggers/wizard-hook", headers={**ADMIN, "If-Match": disabled.headers["etag"]}
    )
    assert (deleted.status_code, deleted.content) == (204, b"")
    gone = await proxied.get("/gateway/triggers/wizard-hook", headers=VIEWER)
    assert gone.status_code == 404


async def test_the_adapters_come_from_the_gateway_for_a_viewer(proxied: httpx.AsyncClient) -> None:
    """GET /gateway/adapters: the gateway's adapter registry as the console's wizard reads it (viewer)."""
    from temporality_trigger_gateway.adapters import ADAPTERS

    assert (await proxied.get("/gateway/adapters")).status_code == 401
    answer = await proxied.get("/gateway/adapters", headers=VIEWER)
    assert answer.status_code == 200, answer.text
    listed = answer.json()["adapters"]
    assert [a["name"] for a in listed] == list(ADAPTERS)
    mindmap = next(a for a in listed if a["name"] == "mindmap.test_case")
    assert mindmap["auth_types"] == ["mindmap"]
    assert mindmap["event_types"] == ["test_case.created", "test_case.updated"]
    post = await proxied.post("/gateway/adapters", headers=ADMIN)
    assert (post.status_code, post.headers["allow"]) == (405, "GET")
    document = (await proxied.get("/openapi.json", headers=VIEWER)).json()
    assert "get" in document["paths"]["/gateway/adapters"]


async def test_the_gateway_checks_the_roles(proxied: httpx.AsyncClient) -> None:
    anonymous = await proxied.get("/gateway/triggers")
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert (await proxied.get("/gateway/triggers", headers=VIEWER)).status_code == 200
    refused = await proxied.post("/gateway/triggers", json=_spec(), headers=VIEWER)
    assert refused.status_code == 403, refused.text
    operator = await proxied.post("/gateway/triggers", json=_spec(), headers=OPERATOR)
    assert operator.status_code == 403
    # preview is the viewer's too: the normalized event and the agent input, or the field in error
    sample = {"type": "order.created", "id": "ord-1", "data": {"order_id": 42}}
    preview = await proxied.post(
        "/gateway/triggers/preview", json={"trigger": _spec(), "payload": sample}, headers=VIEWER
    )
    assert preview.status_code == 200, preview.text
    assert preview.json()["ok"] is True
    assert preview.json()["input"]["order"] == 42
    bad = await proxied.post(
        "/gateway/triggers/preview", json={"trigger": _spec(agent="nobody"), "payload": sample}, headers=VIEWER
    )
    assert bad.status_code == 200, bad.text
    assert (bad.json()["ok"], bad.json()["stage"]) == (False, "trigger")
    assert [e["field"] for e in bad.json()["errors"]] == ["agent"]
    invalid = await proxied.post("/gateway/triggers", json=_spec(cron="* * * * *"), headers=ADMIN)
    assert (invalid.status_code, invalid.json()["error"]) == (422, "invalid_trigger")
    assert any(e["field"] == "cron" for e in invalid.json()["errors"])


async def test_a_body_over_the_limit_is_413_before_anything_is_sent(proxied: httpx.AsyncClient) -> None:
    huge = b'{"x": "' + b"a" * (Settings().max_body_bytes + 10) + b'"}'
    answer = await proxied.post(
        "/gateway/triggers", content=huge, headers={**ADMIN, "Content-Type": "application/json"}
    )
    assert (answer.status_code, answer.json()["error"]) == (413, "body_too_large")


async def test_a_gateway_on_a_closed_port_is_502(tmp_path: Path, bus: Bus) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again when the block ends: nobody listens there
    async with _journal(tmp_path, bus, f"http://127.0.0.1:{port}") as client:
        answer = await client.get("/gateway/triggers", headers=VIEWER)
    assert answer.status_code == 502
    assert answer.json()["error"] == "gateway_unreachable"


async def test_no_gateway_url_is_503_naming_the_setting(tmp_path: Path, bus: Bus) -> None:
    async with _journal(tmp_path, bus, None) as client:
        answer = await client.post("/gateway/triggers", json=_spec(), headers=ADMIN)
        not_listed = await client.get("/gateway/elsewhere", headers=ADMIN)
    assert answer.status_code == 503
    assert answer.json()["error"] == "gateway_not_configured"
    assert "TEMPORALITY_JOURNAL_GATEWAY_URL" in answer.json()["detail"]
    assert not_listed.status_code == 404


async def test_an_answer_over_the_cap_is_502_and_not_passed_on(tmp_path: Path, bus: Bus) -> None:
    """An upstream that answers more than MAX_ANSWER_BYTES (a raw socket server: no gateway does that)."""
    size = MAX_ANSWER_BYTES + 1024

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n".encode())
        with contextlib.suppress(ConnectionError):
            for _ in range(size // 65536 + 1):
                writer.write(b" " * 65536)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, _journal(tmp_path, bus, f"http://127.0.0.1:{port}") as client:
        response = await client.get("/gateway/triggers", headers=VIEWER)
    assert response.status_code == 502
    assert response.json()["error"] == "gateway_answer_too_large"


def _without_defaults(schema: Any) -> Any:
    """``schema`` without its ``default`` annotations (FastAPI leaves a null default out of a response
    model's schema; it validates nothing either way), the ``Gateway`` prefix of its references dropped."""
    if isinstance(schema, dict):
        return {
            key: (value.replace("/Gateway", "/") if key == "$ref" else _without_defaults(value))
            for key, value in schema.items()
            if key != "default"
        }
    if isinstance(schema, list):
        return [_without_defaults(item) for item in schema]
    return schema


async def test_the_document_declares_the_gateways_answers(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> None:
    """Every proxied operation declares, for each success status, the body the gateway's own document
    declares for its route (the same model, ``Gateway``-prefixed), and the components match the gateway's."""
    async with serve_gateway(tmp_path, nats_settings) as url, _journal(tmp_path, bus, url) as journal:
        async with httpx.AsyncClient(base_url=url, timeout=20) as direct:
            theirs = (await direct.get("/openapi.json", headers=VIEWER)).json()
        ours = (await journal.get("/openapi.json", headers=VIEWER)).json()
    proxied = {path: ops for path, ops in ours["paths"].items() if path.startswith("/gateway/")}
    assert len(proxied) == 8, sorted(proxied)
    declared = 0
    for path, operations in proxied.items():
        upstream = theirs["paths"][path.removeprefix("/gateway")]
        assert set(operations) == set(upstream), path
        for method, operation in operations.items():
            their_answers = {s: a for s, a in upstream[method]["responses"].items() if s.startswith("2")}
            our_answers = {s: a for s, a in operation["responses"].items() if s.startswith("2")}
            assert set(our_answers) == set(their_answers), (method, path)
            for status, answer in their_answers.items():
                if "content" not in answer:  # 204
                    assert "content" not in our_answers[status], (method, path, status)
                    continue
                theirs_ref = answer["content"]["application/json"]["schema"]["$ref"]
                ours_ref = our_answers[status]["content"]["application/json"]["schema"]["$ref"]
                assert ours_ref == theirs_ref.replace("/schemas/", "/schemas/Gateway"), (method, path, status)
                declared += 1
    assert (
        declared == 11
    )  # list, create, preview, read, replace, enable, disable, deliveries, redrive 200 + 202, adapters
    components = ours["components"]["schemas"]
    gateway_components = sorted(name for name in components if name.startswith("Gateway"))
    assert gateway_components == sorted(
        f"Gateway{name}"
        for name in (
            "AdapterList",
            "AdapterView",
            "DeliveryPage",
            "DeliveryView",
            "PreviewAnswer",
            "PreviewFieldError",
            "PreviewIgnored",
            "RedriveAnswer",
            "TriggerList",
            "TriggerView",
        )
    )
    for name in gateway_components:
        their_schema = theirs["components"]["schemas"][name.removeprefix("Gateway")]
        assert _without_defaults(components[name]) == _without_defaults(their_schema), name
    # the journal's own /triggers view keeps its own TriggerView
    assert components["TriggerView"] != components["GatewayTriggerView"]
