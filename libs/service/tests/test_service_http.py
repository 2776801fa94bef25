"""The HTTP contract every service shares: errors, bounded bodies, JSON parsing, query bounds."""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Query, Request

from temporality_service import (
    MAX_INT64,
    ApiError,
    BodyTooLarge,
    ClientGone,
    MalformedJson,
    NonNegativeInt64,
    NotFound,
    Unauthorized,
    Unavailable,
    install_error_handlers,
    parse_json,
    read_body,
)
from temporality_service.http import summarize_errors


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/echo")
    async def echo(request: Request) -> Any:
        return {"body": parse_json(await read_body(request, 100))}

    @app.get("/seq")
    async def seq(after: Annotated[NonNegativeInt64, Query()] = 0) -> dict[str, int]:
        return {"after": after}

    @app.get("/refuse/{kind}")
    async def refuse(kind: str) -> None:
        raise {
            "missing": NotFound("no such thing", code="thing_not_found"),
            "auth": Unauthorized("who are you"),
            "busy": Unavailable("try later", retry_after_s=7),
            "extra": ApiError("bad shape", status=422, code="invalid_payload", extra={"errors": [{"loc": ["a"]}]}),
        }[kind]

    @app.put("/seq")
    async def put_seq() -> None:
        return None

    things = APIRouter(prefix="/things")  # an included router is one route to Starlette's matching

    @things.get("")
    async def list_things() -> None:
        return None

    @things.post("")
    async def add_thing() -> None:
        return None

    app.include_router(things)

    @app.get("/bug")
    async def bug() -> None:
        raise RuntimeError("a bug with a secret in it: hunter2")

    return app


@pytest.fixture
async def client() -> Any:
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://svc.test") as c:
        yield c


def _error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = response.json()
    assert body["error"] == code
    assert isinstance(body["detail"], str)
    assert body["detail"]
    return body


def _error_headers(response: httpx.Response, status: int, code: str) -> httpx.Headers:
    _error(response, status, code)
    return response.headers


async def test_api_errors_carry_status_code_headers_and_extra_fields(client: httpx.AsyncClient) -> None:
    _error(await client.get("/refuse/missing"), 404, "thing_not_found")
    auth = await client.get("/refuse/auth")
    _error(auth, 401, "unauthorized")
    assert auth.headers["www-authenticate"] == "Bearer"
    busy = await client.get("/refuse/busy")
    _error(busy, 503, "unavailable")
    assert busy.headers["retry-after"] == "7"
    assert _error(await client.get("/refuse/extra"), 422, "invalid_payload")["errors"] == [{"loc": ["a"]}]


async def test_framework_errors_speak_the_same_contract(client: httpx.AsyncClient) -> None:
    _error(await client.get("/nowhere"), 404, "not_found")
    # Allow names every method routed on the path, not only the first route's (Starlette's own 405 says GET)
    assert _error_headers(await client.delete("/seq"), 405, "method_not_allowed")["allow"] == "GET, PUT"
    assert _error_headers(await client.options("/bug"), 405, "method_not_allowed")["allow"] == "GET"
    assert _error_headers(await client.options("/things"), 405, "method_not_allowed")["allow"] == "GET, POST"
    body = _error(await client.get("/seq", params={"after": "x"}), 422, "invalid_request")
    assert "after" in body["detail"]


async def test_an_unexpected_exception_is_a_json_500_without_its_message(client: httpx.AsyncClient) -> None:
    body = _error(await client.get("/bug"), 500, "internal_error")
    assert "hunter2" not in body["detail"]


@pytest.mark.parametrize("after", [str(MAX_INT64 + 1), "100000000000000000000", "-1"])
async def test_integers_no_database_column_holds_are_422(client: httpx.AsyncClient, after: str) -> None:
    _error(await client.get("/seq", params={"after": after}), 422, "invalid_request")
    assert (await client.get("/seq", params={"after": str(MAX_INT64)})).json() == {"after": MAX_INT64}


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (b'{"a": ', "not JSON"),
        (b"[" * 10_000 + b"]" * 10_000, "nested too deeply"),
        (b'{"a": ' * 10_000 + b"1" + b"}" * 10_000, "nested too deeply"),
        (b'{"title": "\\ud800 broken"}', "surrogate"),
        (b'{"title": "x\\uDFFF"}', "surrogate"),  # upper case, a low half alone
        (b'{"deep": [{"k": ["\\uDbFf"]}]}', "surrogate"),  # mixed case, nested
        (b'{"\\ud83d": 1}', "surrogate"),  # in a key
        # a sender set to another content type is told what its body looks like, never the body itself
        (b'<?xml version="1.0"?><event id="secret-123"/>', r"looks like XML: send the event as JSON"),
        (b"payload=%7B%22action%22%3A%22opened%22%7D", r"looks like a form, application/x-www-form-urlencoded"),
        (b"not json at all", r"not JSON: Expecting value: line 1 column 1 \(char 0\)$"),
    ],
)
def test_parse_json_refuses_with_one_error_type(raw: bytes, fragment: str) -> None:
    with pytest.raises(MalformedJson, match=fragment):
        parse_json(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 129 + b"]" * 129,
        b'{"a": ' * 129 + b"1" + b"}" * 129,
        # valid at the top, deep in one field (a signed webhook's data): pydantic could not encode it (> ~255)
        b'{"type": "x", "data": {"x": ' + b"[" * 300 + b"]" * 300 + b"}}",
        b'{"a": [' + b'{"b": ' * 200 + b"0" + b"}" * 200 + b"]}",
    ],
)
def test_parse_json_refuses_nesting_past_the_limit(raw: bytes) -> None:
    with pytest.raises(MalformedJson, match=r"nested too deeply \(more than 128 levels\)"):
        parse_json(raw)


def test_parse_json_takes_nesting_up_to_the_limit_and_many_shallow_brackets() -> None:
    assert parse_json(b"[" * 128 + b"]" * 128) is not None
    deep_object = b'{"a": ' * 127 + b"[1]" + b"}" * 127
    assert parse_json(deep_object) is not None
    wide = b"[" + b",".join([b"[{}]"] * 5_000) + b"]"  # 10,001 brackets, three levels
    assert len(parse_json(wide)) == 5_000
    assert parse_json(b'{"s": "' + b"[" * 500 + b'"}') == {"s": "[" * 500}  # brackets in a string are text


def test_parse_json_accepts_a_bom_and_surrogate_pairs() -> None:
    assert parse_json(b'\xef\xbb\xbf{"ok": "\\ud83d\\ude00"}') == {"ok": "\U0001f600"}
    assert parse_json(b'{"ok": "\\\\ud800"}') == {"ok": "\\ud800"}  # an escaped backslash, then text
    assert parse_json(b'{"ok": "\\u00e9\\ue000"}') == {"ok": "\u00e9\ue000"}  # escapes outside D800-DFFF


async def test_bodies_over_the_limit_are_413_declared_or_streamed(client: httpx.AsyncClient) -> None:
    _error(await client.post("/echo", content=b"1" * 101), 413, "body_too_large")

    async def chunks() -> Any:  # no Content-Length: the limit holds while streaming
        for _ in range(20):
            yield b"1" * 10

    _error(await client.post("/echo", content=chunks()), 413, "body_too_large")
    assert (await client.post("/echo", content=b"[1, 2]")).json() == {"body": [1, 2]}
    _error(await client.post("/echo", content=b"[" * 50), 400, "malformed_json")


@pytest.mark.parametrize("declared", [b"12x", "\u00b2".encode("latin-1")])  # "²".isdigit(), but int("²") raises
async def test_a_content_length_that_is_not_a_number_is_400(declared: bytes) -> None:
    request = Request({"type": "http", "method": "POST", "headers": [(b"content-length", declared)], "path": "/"})
    with pytest.raises(ApiError) as refused:
        await read_body(request, 100)
    assert (refused.value.status, refused.value.code) == (400, "bad_request")
    assert not isinstance(refused.value, BodyTooLarge)


@pytest.mark.parametrize("raw", [b"[NaN]", b'{"a": Infinity}', b"-Infinity", b"[1e999999]"])
def test_parse_json_refuses_what_python_accepts_but_json_has_not(raw: bytes) -> None:
    with pytest.raises(MalformedJson, match="not JSON"):
        parse_json(raw)
    assert parse_json(b"[1.5e3, -0.25]") == [1500.0, -0.25]


def test_validation_summaries_never_echo_the_input_at_length() -> None:
    long_key = "k" * 60_000
    errors = [{"loc": ("body", long_key), "msg": "Extra inputs are not permitted"}]
    errors += [{"loc": ("body", f"k{i}"), "msg": "Extra inputs are not permitted"} for i in range(4096)]
    summary = summarize_errors(errors)
    assert len(summary) < 1000
    assert "and 4092 more errors" in summary
    assert long_key not in summary


async def test_a_client_that_hangs_up_mid_body_is_a_refusal_not_a_server_error() -> None:
    messages = [{"type": "http.request", "body": b'{"a": ', "more_body": True}, {"type": "http.disconnect"}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "headers": [], "path": "/"}
    with pytest.raises(ClientGone):
        await read_body(Request(scope, receive), 100)
