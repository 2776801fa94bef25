"""The refusals of ``POST /hooks/{trigger_id}``, in their order: 404, 401, 413, 415, 400, 422.

404 and 401 publish nothing (an unauthenticated sender cannot write into the journal); an authenticated
delivery refused with 413/415/400/422 is journaled as ``trigger.received`` + ``trigger.rejected``.
"""

from __future__ import annotations

import base64
import gzip
import json
import urllib.parse
from collections.abc import AsyncIterator

import httpx
import pytest
from gateway_support import (
    BEARER_TOKEN,
    MAX_BODY,
    PASSWORD,
    basic,
    fixture_bytes,
    fixture_json,
    github_headers,
    journal,
    post,
    types,
)

from temporality_bus import Bus
from temporality_protocol import TriggerRejected
from temporality_trigger_gateway.api import ACCEPTED_MEDIA_TYPES


async def _nothing_published(bus: Bus) -> None:
    assert await journal(bus) == []


async def _refusal_journaled(bus: Bus, status: int, code: str) -> None:
    """An authenticated delivery refused with 400/413/422 is journaled (no run, no run id) so an
    integrator can see why nothing started; the refusal itself is never echoed back as a payload."""
    events = await journal(bus)
    assert types(events) == ["trigger.received", "trigger.rejected"]
    rejected = events[1].payload(TriggerRejected)
    assert rejected.reason == "invalid_payload"
    assert rejected.detail.startswith(f"{status} {code}: ")
    assert rejected.trigger_id == "ado-pr-review"
    assert rejected.run_id is None
    assert events[1].runid is None
    assert events[1].causationid == events[0].id


async def test_unknown_trigger_is_404(client: httpx.AsyncClient, bus: Bus) -> None:
    response = await post(client, fixture_bytes("pr-created.json"), trigger_id="no-such-trigger")
    assert response.status_code == 404
    assert response.json()["error"] == "unknown_trigger"
    await _nothing_published(bus)


async def test_trigger_that_is_not_a_webhook_is_404(client: httpx.AsyncClient) -> None:
    response = await post(client, fixture_bytes("pr-created.json"), trigger_id="nightly-digest")
    assert response.status_code == 404


async def test_unknown_trigger_is_404_even_without_credentials(client: httpx.AsyncClient) -> None:
    response = await post(client, b"{}", trigger_id="no-such-trigger", headers={})
    assert response.status_code == 404


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="missing"),
        pytest.param(basic(password="wrong"), id="wrong-password"),
        pytest.param(basic(username="someone", password=PASSWORD), id="wrong-user"),
        pytest.param(basic(password=""), id="empty-password"),
        pytest.param({"Authorization": f"Bearer {PASSWORD}"}, id="not-basic"),
        pytest.param({"Authorization": "Basic !!!not-base64"}, id="bad-base64"),
        pytest.param({"Authorization": "Basic " + base64.b64encode(b"azure").decode()}, id="no-colon"),
        pytest.param({"Authorization": "Basic " + base64.b64encode(b"\xff:\xfe").decode()}, id="not-utf8"),
    ],
)
async def test_bad_credentials_are_401_with_a_basic_challenge(
    client: httpx.AsyncClient, bus: Bus, headers: dict[str, str]
) -> None:
    response = await post(client, fixture_bytes("pr-created.json"), headers=headers)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Basic realm="temporality"'
    assert response.json()["error"] == "unauthorized"
    assert PASSWORD not in response.text
    await _nothing_published(bus)


async def test_credentials_are_checked_before_the_body(client: httpx.AsyncClient) -> None:
    response = await post(client, b"x" * (MAX_BODY + 1), headers={})
    assert response.status_code == 401


async def test_declared_content_length_over_the_limit_is_413(client: httpx.AsyncClient, bus: Bus) -> None:
    response = await post(client, b" " * (MAX_BODY + 1))
    assert response.status_code == 413
    assert response.json()["error"] == "body_too_large"
    await _refusal_journaled(bus, 413, "body_too_large")


async def test_chunked_body_over_the_limit_is_413(client: httpx.AsyncClient, bus: Bus) -> None:
    sent: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(64):
            sent.append(1)
            yield b" " * 1024

    response = await client.post("/hooks/ado-pr-review", content=chunks(), headers=basic())
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert len(sent) < 64  # refused while streaming, not after reading everything
    await _refusal_journaled(bus, 413, "body_too_large")


async def test_body_exactly_at_the_limit_is_read(client: httpx.AsyncClient) -> None:
    response = await post(client, b" " * MAX_BODY)
    assert response.status_code == 400  # read in full, then not JSON


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"{not json", id="broken"),
        pytest.param(b"\xff\xfe{\x00}\x00", id="utf16"),
        pytest.param(b'{"id": "\xe9"}', id="latin1"),
    ],
)
async def test_body_that_is_not_utf8_json_is_400(client: httpx.AsyncClient, bus: Bus, raw: bytes) -> None:
    response = await post(client, raw)
    assert response.status_code == 400
    assert response.json()["error"] == "malformed_json"
    await _refusal_journaled(bus, 400, "malformed_json")


def _without(path: str) -> dict[str, object]:
    payload = fixture_json("pr-created.json")
    node = payload
    *parents, leaf = path.split(".")
    for key in parents:
        node = node[key]
    del node[leaf]
    return payload


@pytest.mark.parametrize(
    ("body", "missing"),
    [
        pytest.param({"hello": "world"}, ["id", "eventType"], id="not-azure"),
        pytest.param([1, 2], [], id="array"),
        pytest.param(_without("id"), ["id"], id="no-id"),
        pytest.param(_without("eventType"), ["eventType"], id="no-eventType"),
        pytest.param(_without("resource.pullRequestId"), ["resource.pullRequestId"], id="no-pullRequestId"),
        # (no repository, createdBy, project...: "Resource details to send: Minimal", accepted with nulls --
        # test_gateway_ado_minimal.py)
    ],
)
async def test_json_of_the_wrong_shape_is_422_with_the_errors(
    client: httpx.AsyncClient, bus: Bus, body: object, missing: list[str]
) -> None:
    response = await client.post("/hooks/ado-pr-review", json=body, headers=basic())
    assert response.status_code == 422
    answer = response.json()
    assert answer["error"] == "invalid_payload"
    assert answer["detail"]
    locations = {".".join(str(p) for p in e["loc"]) for e in answer["errors"]}
    assert set(missing) <= locations
    assert all("input" not in e for e in answer["errors"])  # the payload is never echoed back
    await _refusal_journaled(bus, 422, "invalid_payload")


@pytest.mark.parametrize(
    ("raw", "what"),
    [
        pytest.param(b"[]", "an array", id="array"),
        pytest.param(b"null", "null", id="null"),
        pytest.param(b'"hello"', "a string", id="string"),
        pytest.param(b"42", "a number", id="number"),
    ],
)
async def test_a_body_that_is_not_an_object_is_422_saying_an_object_was_expected(
    client: httpx.AsyncClient, bus: Bus, raw: bytes, what: str
) -> None:
    """A user review: ``[]`` was answered "...valid dictionary or instance of _Envelope", one of our classes.
    The answer says what the body must be, in JSON's words, and what came (its type, never its value)."""
    response = await client.post(
        "/hooks/ado-pr-review", content=raw, headers=basic() | {"Content-Type": "application/json"}
    )
    assert response.status_code == 422, response.text
    answer = response.json()
    expected = f"the body is not a valid azure_devops.pull_request event: the body must be a JSON object, not {what}"
    assert answer["detail"] == expected
    assert answer["errors"] == [{"type": "model_type", "loc": [], "msg": f"must be a JSON object, not {what}"}]
    for internal in ("_Envelope", "instance of", "dictionary"):
        assert internal not in response.text
    await _refusal_journaled(bus, 422, "invalid_payload")


async def test_an_azure_devops_body_with_six_wrong_fields_names_all_six(client: httpx.AsyncClient, bus: Bus) -> None:
    """A user review: "6 problem(s): " listed 5 names with no "...". Six are all listed (one more than five is
    named rather than counted); past that, five and "and N more" -- the count never disagrees with the list.
    (Fields of the wrong type: a missing one is ``null``, "Resource details to send: Minimal".)"""
    resource: dict[str, object] = {
        "pullRequestId": "seven",
        "title": 1,
        "description": 2,
        "status": 3,
        "sourceRefName": 4,
        "targetRefName": 5,
    }
    body = {"id": "evt-1", "eventType": "git.pullrequest.created", "resource": resource}
    response = await client.post("/hooks/ado-pr-review", json=body, headers=basic())
    assert response.status_code == 422, response.text
    answer = response.json()
    places = [".".join(str(p) for p in e["loc"]) for e in answer["errors"]]
    assert len(places) == 6
    assert answer["detail"] == (
        f"the body is not a valid azure_devops.pull_request event (6 problems: {', '.join(places)})"
    )
    await _refusal_journaled(bus, 422, "invalid_payload")

    resource |= {"url": 6, "createdBy": 7, "repository": 8}
    more = (await client.post("/hooks/ado-pr-review", json=body, headers=basic())).json()
    places = [".".join(str(p) for p in e["loc"]) for e in more["errors"]]
    assert len(places) > 6
    assert more["detail"].endswith(f"({len(places)} problems: {', '.join(places[:5])} and {len(places) - 5} more)")


async def test_wrong_types_are_422(client: httpx.AsyncClient) -> None:
    payload = fixture_json("pr-created.json")
    payload["resource"]["pullRequestId"] = "seven"
    response = await post(client, payload)
    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["resource", "pullRequestId"]


async def test_other_routes_answer_json_errors(client: httpx.AsyncClient) -> None:
    missing = await client.get("/nowhere")
    assert missing.status_code == 404
    assert missing.json()["error"] == "not_found"
    wrong_method = await client.get("/hooks/ado-pr-review")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"] == "method_not_allowed"


async def test_bodies_no_downstream_consumer_could_store_are_refused_clearly() -> None:
    """Lone surrogate escapes and absurd nesting are 400s, never a 500 that Azure DevOps retries for 36 h."""
    from temporality_service import parse_json as _parse_json
    from temporality_trigger_gateway.errors import MalformedBody

    with pytest.raises(MalformedBody, match="surrogate"):
        _parse_json(b'{"resource": {"title": "\\ud800 broken"}}')
    with pytest.raises(MalformedBody, match="nested too deeply"):
        _parse_json(b"[" * 100_000 + b"]" * 100_000)
    assert _parse_json(b'{"ok": "\\ud83d\\ude00"}') == {"ok": "\U0001f600"}  # a proper pair is fine


def test_long_descriptions_are_cut_with_a_marker() -> None:
    from temporality_trigger_gateway.adapters.base import MAX_DESCRIPTION
    from temporality_trigger_gateway.adapters.base import clip as _clip

    assert _clip("short", MAX_DESCRIPTION) == "short"
    cut = _clip("x" * (MAX_DESCRIPTION + 10), MAX_DESCRIPTION)
    assert cut.startswith("x" * MAX_DESCRIPTION)
    assert cut.endswith("[... cut by Temporality: 10 more characters]")


# --------------------------------------------------------------------------- 415: the body is declared as not JSON
async def test_a_form_encoded_github_delivery_is_415_telling_to_choose_json(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    """GitHub sends ``application/x-www-form-urlencoded`` (``payload=<JSON>``) when the hook's content type says so:
    refused with 415 naming the accepted types and GitHub's setting, journaled (the signature was right)."""
    document = fixture_bytes("github-pr-opened.json").decode()
    raw = urllib.parse.urlencode({"payload": document}).encode()
    headers = {
        **github_headers(raw, "pull_request", "d-form"),
        "Content-Type": "application/x-www-form-urlencoded",
    }
    response = await client.post("/hooks/gh-review", content=raw, headers=headers)
    assert response.status_code == 415, response.text
    body = response.json()
    assert body["error"] == "unsupported_media_type"
    assert "'application/x-www-form-urlencoded'" in body["detail"]
    assert "application/json" in body["detail"]
    assert "Content type: application/json" in body["detail"]  # GitHub's webhook setting
    events = await journal(bus)
    assert types(events) == ["trigger.received", "trigger.rejected"]
    rejected = events[1].payload(TriggerRejected)
    assert rejected.reason == "invalid_payload"
    assert rejected.detail.startswith("415 unsupported_media_type: ")


async def test_an_unauthenticated_form_delivery_is_401_not_415(client: httpx.AsyncClient, bus: Bus) -> None:
    raw = b"payload=%7B%7D"
    headers = {"X-GitHub-Event": "push", "Content-Type": "application/x-www-form-urlencoded"}
    response = await client.post("/hooks/gh-review", content=raw, headers=headers)
    assert response.status_code == 401
    await _nothing_published(bus)


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        pytest.param(None, 202, id="none"),
        pytest.param("application/json", 202, id="json"),
        pytest.param("Application/JSON ; charset=UTF-8", 202, id="json-spelled-otherwise"),
        pytest.param("application/vnd.azure+json", 202, id="suffix-json"),
        pytest.param("text/json", 202, id="text-json"),
        pytest.param("text/plain", 415, id="text-plain"),
        pytest.param("multipart/form-data; boundary=x", 415, id="multipart"),
        pytest.param("application/xml", 415, id="xml"),
        pytest.param("", 415, id="empty"),
    ],
)
async def test_only_json_content_types_are_taken(
    client: httpx.AsyncClient, content_type: str | None, status: int
) -> None:
    headers = basic() | ({} if content_type is None else {"Content-Type": content_type})
    response = await client.post("/hooks/ado-pr-review", content=fixture_bytes("pr-created.json"), headers=headers)
    assert response.status_code == status, response.text
    if status == 415:
        assert response.json()["error"] == "unsupported_media_type"
        assert "application/json" in response.json()["detail"]
        assert "GitHub" not in response.json()["detail"]


@pytest.mark.parametrize(
    ("encoding", "status"),
    [
        pytest.param("gzip", 415, id="gzip"),
        pytest.param("GZIP, br", 415, id="two-codings"),
        pytest.param("identity", 202, id="identity"),
        pytest.param("", 202, id="empty"),
    ],
)
async def test_a_compressed_body_is_415_naming_its_coding(
    client: httpx.AsyncClient, bus: Bus, encoding: str, status: int
) -> None:
    """A user review: a gzip body got 400 "not UTF-8". A coding the gateway does not undo is 415 naming it (RFC 9110),
    journaled like any authenticated refusal; ``identity`` (or an empty header) is the body as it is."""
    raw = fixture_bytes("pr-created.json")
    body = gzip.compress(raw) if encoding.lower().startswith("gzip") else raw
    headers = basic() | {"Content-Type": "application/json", "Content-Encoding": encoding}
    response = await client.post("/hooks/ado-pr-review", content=body, headers=headers)
    assert response.status_code == status, response.text
    if status == 415:
        assert response.json() == {
            "error": "unsupported_media_type",
            "detail": f"the body is sent with Content-Encoding: {encoding.lower()!r}; webhooks take it uncompressed "
            "(no Content-Encoding, or identity)",
        }
        events = await journal(bus)
        assert types(events) == ["trigger.received", "trigger.rejected"]
        assert events[1].payload(TriggerRejected).detail.startswith("415 unsupported_media_type: ")


@pytest.mark.parametrize(
    ("content_type", "said"),
    [
        pytest.param("application/xml", "the body is declared as 'application/xml'", id="xml"),
        pytest.param(
            "application/x-www-form-urlencoded",
            "the body is declared as 'application/x-www-form-urlencoded'",
            id="form",
        ),
        pytest.param("", "the body is declared with an empty Content-Type", id="empty"),
    ],
)
async def test_an_xml_or_form_body_to_a_source_other_than_github_is_415_saying_json_is_taken(
    client: httpx.AsyncClient, bus: Bus, content_type: str, said: str
) -> None:
    """A user review: an XML or form body sent to Azure DevOps' trigger is 415 (not a 400 "not JSON" at its first
    character), saying what it was declared as and what is taken, with no GitHub advice; journaled."""
    raw = b'<?xml version="1.0"?><event id="1"/>' if "xml" in content_type else b"payload=%7B%7D"
    response = await client.post("/hooks/ado-pr-review", content=raw, headers=basic() | {"Content-Type": content_type})
    assert response.status_code == 415, response.text
    detail = response.json()["detail"]
    assert detail == f"{said}; webhooks take JSON: {ACCEPTED_MEDIA_TYPES}"
    await _refusal_journaled(bus, 415, "unsupported_media_type")


@pytest.mark.parametrize(
    ("trigger_id", "content_type", "said"),
    [
        pytest.param(
            "orders-bearer",
            "application/json; charset=iso-8859-1",
            " (the Content-Type declares charset=iso-8859-1; it is not decoded)",
            id="parsed-first",
        ),
        pytest.param(
            "ado-pr-review",
            'application/json; Charset="windows-1252"',
            " (the Content-Type declares charset=windows-1252; it is not decoded)",
            id="source-reads-raw",
        ),
        pytest.param("orders-bearer", "application/json", "", id="no-charset"),
    ],
)
async def test_a_body_in_another_charset_is_400_saying_utf8_is_required_whatever_is_declared(
    client: httpx.AsyncClient, bus: Bus, trigger_id: str, content_type: str, said: str
) -> None:
    """An integrator review: a Latin-1 body declared ``charset=iso-8859-1`` got 400 "the body is not UTF-8" while
    the 415 text says charset parameters are taken. The answer says UTF-8 is read whatever charset is declared
    (other charsets are not decoded: a signature is over the bytes as sent); journaled with the same words."""
    raw = json.dumps({"id": "evt-latin", "type": "order.created", "name": "José"}, ensure_ascii=False).encode("latin-1")
    auth = basic() if trigger_id.startswith("ado") else {"Authorization": f"Bearer {BEARER_TOKEN}"}
    response = await client.post(f"/hooks/{trigger_id}", content=raw, headers=auth | {"Content-Type": content_type})
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "malformed_json"
    expected = f"the body is not UTF-8: webhooks take UTF-8 JSON whatever charset is declared{said}"
    assert response.json()["detail"] == expected
    events = await journal(bus)
    assert types(events) == ["trigger.received", "trigger.rejected"]
    assert events[1].payload(TriggerRejected).detail == f"400 malformed_json: {expected}"
    assert "whatever charset is declared" in ACCEPTED_MEDIA_TYPES
