"""The trigger admin API (TRG-1) over HTTP (ASGI) on a real nats-server: roles, ETags, validation, audit.

The app is the one a replica serves: a registry watching the real ``trigger-definitions`` bucket.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_support import (
    AGENTS,
    AS_ADMIN,
    AS_OPERATOR,
    AS_VIEWER,
    PASSWORD,
    basic,
    fixture_bytes,
    journal,
    journal_of,
    tokens_file,
    webhook_spec,
)
from pydantic import BaseModel

from temporality_bus import Bus
from temporality_protocol import TriggerChange
from temporality_protocol.trigger_admin import (
    DeliveryPage,
    DeliveryView,
    PreviewAnswer,
    PreviewFieldError,
    PreviewIgnored,
    RedriveAnswer,
    TriggerList,
    TriggerView,
)
from temporality_service import ApiAuth, ApiAuthSettings
from temporality_trigger_gateway import Settings, create_app
from temporality_trigger_gateway.deliveries import DeliveryRecord
from temporality_trigger_gateway.store import TriggerRegistry, TriggerStore


@pytest.fixture
async def admin(bus: Bus, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    store = await TriggerStore.open(bus)
    registry = TriggerRegistry(environ={"GW_HOOK_PASSWORD": PASSWORD}, agents=AGENTS)
    auth = ApiAuth.from_settings(ApiAuthSettings(tokens_file=tokens_file(tmp_path)))
    async with registry.watching(store):
        app = create_app(Settings(max_body_bytes=64 * 1024), bus, registry, store=store, auth=auth)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as c:
            yield c


async def _create(client: httpx.AsyncClient, spec: dict[str, Any]) -> httpx.Response:
    return await client.post("/triggers", json=spec, headers=AS_ADMIN)


# --------------------------------------------------------------------------- roles
async def test_no_token_is_401_and_a_low_role_is_403(admin: httpx.AsyncClient) -> None:
    assert (await _create(admin, webhook_spec())).status_code == 201
    for method, path in [
        ("GET", "/triggers"),
        ("GET", "/triggers/api-pr"),
        ("POST", "/triggers/api-pr/disable"),
        ("DELETE", "/triggers/api-pr"),
    ]:
        refused = await admin.request(method, path)
        assert refused.status_code == 401, (method, path)
        assert refused.headers["WWW-Authenticate"] == "Bearer"
        assert refused.json()["error"] == "unauthorized"
    wrong = await admin.get("/triggers", headers={"Authorization": "Bearer not-a-token-of-this-gateway"})
    assert wrong.status_code == 401
    assert wrong.json()["error"] == "invalid_token"

    assert (await admin.get("/triggers", headers=AS_VIEWER)).status_code == 200
    assert (await admin.get("/triggers/api-pr", headers=AS_VIEWER)).status_code == 200
    viewer_switch = await admin.post("/triggers/api-pr/disable", headers=AS_VIEWER)
    assert viewer_switch.status_code == 403
    assert "operator" in viewer_switch.json()["detail"]
    for method, path, body in [
        ("POST", "/triggers", webhook_spec("other")),
        ("PUT", "/triggers/api-pr", webhook_spec()),
        ("DELETE", "/triggers/api-pr", None),
    ]:
        refused = await admin.request(method, path, json=body, headers={**AS_OPERATOR, "If-Match": '"1"'})
        assert refused.status_code == 403, (method, path)
        assert "admin" in refused.json()["detail"]
    assert (await admin.post("/triggers/api-pr/disable", headers=AS_OPERATOR)).status_code == 200
    assert (await admin.post("/triggers/api-pr/enable", headers=AS_OPERATOR)).status_code == 200


# --------------------------------------------------------------------------- create / read / list
async def test_create_returns_every_field_but_never_a_secret(admin: httpx.AsyncClient, bus: Bus) -> None:
    created = await _create(admin, webhook_spec())
    assert created.status_code == 201, created.text
    assert created.headers["Location"] == "/triggers/api-pr"
    assert created.headers["ETag"] == f'"{created.json()["revision"]}"'
    read = await admin.get("/triggers/api-pr", headers=AS_VIEWER)
    assert read.headers["ETag"] == created.headers["ETag"]
    body = read.json()
    trigger = body["trigger"]
    for field in ("id", "name", "type", "enabled", "agent", "input", "context", "auth", "deduplication", "retry"):
        assert field in trigger, field
    assert trigger["human"]["allowed_recipients"] == ["user:alice"]
    assert trigger["human"]["on_timeout"] == {
        "action": "default",
        "default_option": "keep-v1",
        "renotify": None,
        "escalate": None,
    }
    assert trigger["retry"] == {"retry_after_s": 30}
    assert trigger["auth"] == {"type": "basic", "username": "azure"}
    assert body["write_only_set"] == ["auth.password"]
    assert body["served"] is True
    assert body["origin"] == "api"
    assert body["updated_by"] == "ci-bot"
    listed = (await admin.get("/triggers", headers=AS_VIEWER)).json()["triggers"]
    assert [t["trigger"]["id"] for t in listed] == ["api-pr"]
    for text in (created.text, read.text, json.dumps(listed), json.dumps([e.data for e in await journal(bus)])):
        assert PASSWORD not in text
    again = await _create(admin, webhook_spec())
    assert again.status_code == 409
    assert again.json()["error"] == "trigger_exists"
    missing = await admin.get("/triggers/nope", headers=AS_VIEWER)
    assert missing.status_code == 404
    assert missing.json()["error"] == "trigger_not_found"


async def test_every_change_is_journaled_with_the_principal(admin: httpx.AsyncClient, bus: Bus) -> None:
    etag = (await _create(admin, webhook_spec())).headers["ETag"]
    replaced = await admin.put(
        "/triggers/api-pr", json=webhook_spec(name="Renamed"), headers={**AS_ADMIN, "If-Match": etag}
    )
    assert replaced.status_code == 200, replaced.text
    assert (await admin.post("/triggers/api-pr/disable", headers=AS_OPERATOR)).status_code == 200
    assert (await admin.post("/triggers/api-pr/disable", headers=AS_OPERATOR)).status_code == 200  # no change
    assert (await admin.post("/triggers/api-pr/enable", headers=AS_OPERATOR)).status_code == 200
    assert (await admin.delete("/triggers/api-pr", headers=AS_ADMIN)).status_code == 204
    events = [e for e in await journal(bus) if e.type.startswith("trigger.")]
    assert [e.type for e in events] == [
        "trigger.created",
        "trigger.updated",
        "trigger.disabled",
        "trigger.enabled",
        "trigger.deleted",
    ]
    changes = [TriggerChange.model_validate(e.data) for e in events]
    assert [c.changed_by for c in changes] == ["ci-bot", "ci-bot", "on-call", "on-call", "ci-bot"]
    assert {c.trigger_id for c in changes} == {"api-pr"}
    assert [c.revision for c in changes] == sorted(c.revision for c in changes)
    assert [e.actor for e in events] == ["token:ci-bot"] * 2 + ["token:on-call"] * 2 + ["token:ci-bot"]
    assert (await admin.get("/triggers/api-pr", headers=AS_VIEWER)).status_code == 404
    assert (await _create(admin, webhook_spec())).status_code == 201  # an id can be created again after delete


# --------------------------------------------------------------------------- optimistic concurrency
async def test_replace_needs_the_current_etag(admin: httpx.AsyncClient) -> None:
    etag = (await _create(admin, webhook_spec())).headers["ETag"]
    missing = await admin.put("/triggers/api-pr", json=webhook_spec(), headers=AS_ADMIN)
    assert missing.status_code == 428
    assert missing.json()["error"] == "precondition_required"
    stale = await admin.put("/triggers/api-pr", json=webhook_spec(), headers={**AS_ADMIN, "If-Match": '"999"'})
    assert stale.status_code == 412
    assert stale.json()["error"] == "precondition_failed"
    garbage = await admin.put("/triggers/api-pr", json=webhook_spec(), headers={**AS_ADMIN, "If-Match": "x"})
    assert garbage.status_code == 412
    # a digit that is not ASCII ("²".isdigit(), but int("²") raises) is a 412 too, on every route that reads
    # If-Match -- it was a 500 (found by schemathesis-style header fuzzing)
    superscript = {**AS_ADMIN, b"If-Match": '"\u00b2"'.encode("latin-1")}
    for method, path in [
        ("PUT", "/triggers/api-pr"),
        ("POST", "/triggers/api-pr/disable"),
        ("DELETE", "/triggers/api-pr"),
    ]:
        odd = await admin.request(method, path, json=webhook_spec(), headers=superscript)
        assert (odd.status_code, odd.json()["error"]) == (412, "precondition_failed"), (method, odd.text)
    other_id = await admin.put("/triggers/api-pr", json=webhook_spec("other"), headers={**AS_ADMIN, "If-Match": etag})
    assert other_id.status_code == 422
    assert other_id.json()["errors"][0]["field"] == "id"
    # the read-back body (no secret in it) can be sent as is: the stored password is kept
    shown = (await admin.get("/triggers/api-pr", headers=AS_VIEWER)).json()["trigger"]
    kept = await admin.put(
        "/triggers/api-pr", json={**shown, "name": "Round trip"}, headers={**AS_ADMIN, "If-Match": etag}
    )
    assert kept.status_code == 200, kept.text
    assert kept.headers["ETag"] != etag
    assert kept.json()["write_only_set"] == ["auth.password"]
    assert (await admin.put("/triggers/api-pr", json=shown, headers={**AS_ADMIN, "If-Match": etag})).status_code == 412


async def test_concurrent_replaces_with_one_etag_one_wins(admin: httpx.AsyncClient) -> None:
    etag = (await _create(admin, webhook_spec())).headers["ETag"]
    answers = await asyncio.gather(
        *(
            admin.put("/triggers/api-pr", json=webhook_spec(name=f"Writer {i}"), headers={**AS_ADMIN, "If-Match": etag})
            for i in range(4)
        )
    )
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200, 412, 412, 412], [a.text for a in answers]
    (winner,) = [a for a in answers if a.status_code == 200]
    assert (await admin.get("/triggers/api-pr", headers=AS_VIEWER)).json()["trigger"]["name"] == winner.json()[
        "trigger"
    ]["name"]


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"agent": "ghost"}, "agent", "unknown agent 'ghost'"),
        ({"adapter": "svn"}, "adapter", "unknown adapter 'svn'"),
        ({"events": ["git.push"]}, "events", "cannot handle git.push"),
        ({"input": {"author": "actor.[id"}}, "input", "input.author: not a valid JMESPath expression"),
        ({"input": {"bad key": "id"}}, "input.bad key", "String should match pattern"),
        ({"auth": {"type": "basic", "username": "azure", "password_env": "GW_UNSET_VAR"}}, "auth", "GW_UNSET_VAR"),
        ({"auth": {"type": "github", "secret": "x"}}, "auth", "cannot authenticate"),
        ({"human": {"allowed_recipients": ["alice"]}}, "human.allowed_recipients[0]", "String should match"),
        ({"retry": {"retry_after_s": 0}}, "retry.retry_after_s", "greater than or equal to 1"),
        ({"colour": "red"}, "colour", "unknown key 'colour'; allowed here: adapter, agent, auth, concurrency"),
        (
            {"adapter": "gitlab", "events": ["push"], "auth": {"type": "gitlab", "token": "x"}},
            "auth.token",
            "unknown key 'token'; allowed here: secret, secret_env, type",
        ),
        (
            {"auth": {"type": "basic", "username": "azure", "passwrd": "x"}},
            "auth.passwrd",
            "allowed here: password, password_env, type, username (did you mean 'password'?)",
        ),
        ({"auth": {"type": "gitlabb"}}, "auth.type", "unknown type 'gitlabb'; one of: 'none', 'basic'"),
        ({"auth": ["basic"]}, "auth", "must be a JSON object, not an array"),
        ({"id": "Bad Id"}, "id", "String should match pattern"),
    ],
)
async def test_an_invalid_webhook_trigger_is_422_naming_the_field(
    admin: httpx.AsyncClient, changes: dict[str, Any], field: str, message: str
) -> None:
    refused = await _create(admin, webhook_spec(**changes))
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["error"] == "invalid_trigger"
    assert any(e["field"] == field and message in e["message"] for e in body["errors"]), body
    assert message in body["detail"]
    assert "Value error" not in refused.text  # a validator's sentence as it is, without pydantic's prefix
    assert "Extra inputs" not in refused.text
    assert (await admin.get("/triggers", headers=AS_VIEWER)).json()["triggers"] == []


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        (
            {"id": "nightly", "name": "n", "type": "schedule", "agent": "reviewer", "cron": "61 * * * *"},
            "cron",
            "not a valid cron expression",
        ),
        (
            {"id": "on-done", "name": "n", "type": "event", "agent": "reviewer", "event_type": "run.completed",
             "filter": {"colour": "red"}},
            "filter",
            "unknown filter key(s) colour",
        ),
        ({"id": "x", "name": "n", "type": "carrier-pigeon", "agent": "reviewer"}, "type", "unknown type 'carrier-pigeon'; one of: 'webhook'"),
    ],
)  # fmt: skip
async def test_invalid_schedule_and_event_triggers_are_422(
    admin: httpx.AsyncClient, spec: dict[str, Any], field: str, message: str
) -> None:
    refused = await _create(admin, spec)
    assert refused.status_code == 422, refused.text
    assert any(e["field"] == field and message in e["message"] for e in refused.json()["errors"]), refused.json()


async def test_bodies_that_are_not_a_trigger_are_refused(admin: httpx.AsyncClient) -> None:
    not_json = await admin.post("/triggers", content=b"{nope", headers=AS_ADMIN)
    assert not_json.status_code == 400
    assert not_json.json()["error"] == "malformed_json"
    a_list = await admin.post("/triggers", json=[1, 2], headers=AS_ADMIN)
    assert a_list.status_code == 422
    assert a_list.json()["errors"] == [{"field": "<body>", "message": "a trigger is a JSON object"}]
    huge = await admin.post("/triggers", content=b"{" + b" " * (65 * 1024) + b"}", headers=AS_ADMIN)
    assert huge.status_code == 413


async def test_a_trigger_created_through_the_api_serves_its_webhook_with_its_mapping(
    admin: httpx.AsyncClient, bus: Bus
) -> None:
    assert (await _create(admin, webhook_spec())).status_code == 201
    accepted = await admin.post("/hooks/api-pr", content=fixture_bytes("pr-created.json"), headers=basic())
    assert accepted.status_code == 202, accepted.text
    (requested,) = await journal_of(bus, "run.requested")
    assert requested.data["input"] == {
        "repository": "payments-api",
        "pull_request": 7,
        "source_branch": "fix/refund-retries",
        "target_branch": "develop",
        "author": "Rosa Marquez",
        "team": "web",
    }
    assert requested.data["human"]["default_timeout_s"] == 600


HOSTILE_BODIES = [
    b"",
    b"   ",
    b"\xef\xbb\xbf",
    b"\x00\x00",
    b"\xff\xfe{",
    b'{"id": "\\ud800"}',
    b"[" * 10_000 + b"]" * 10_000,
    b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
    b'{"id": "x", "type": "webhook"',
    json.dumps({"id": "x" * 10_000, "type": "webhook", "name": 1}).encode(),
    json.dumps({"trigger": {"id": "t", "type": "webhook", "input": {"x": "(" * 400 + "a" + ")" * 400}}}).encode(),
    json.dumps({"trigger_id": "a>b c*", "payload": {}}).encode(),
    json.dumps({"trigger": webhook_spec(), "payload": [1] * 1000, "headers": {"X-\u00e9": "1"}}).encode(),
    json.dumps({"trigger": webhook_spec(), "payload": {"id": 1, "eventType": None, "resource": []}}).encode(),
    json.dumps(webhook_spec(context={"deep": [[[[[[[[[[1]]]]]]]]]]}, input={"q": "context.deep[0][0][0]"})).encode(),
]


@pytest.mark.parametrize("body", HOSTILE_BODIES, ids=range(len(HOSTILE_BODIES)))
@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/triggers"), ("PUT", "/triggers/api-pr"), ("POST", "/triggers/preview")],
)
async def test_hostile_bodies_get_a_json_4xx_never_a_5xx(
    admin: httpx.AsyncClient, method: str, path: str, body: bytes
) -> None:
    if path == "/triggers/api-pr":
        await _create(admin, webhook_spec())
    headers = {**AS_ADMIN, "Content-Type": "application/json", "If-Match": '"1"'}
    answer = await admin.request(method, path, content=body, headers=headers)
    assert answer.status_code < 500, answer.text
    if answer.status_code >= 400:
        assert set(answer.json()) >= {"error", "detail"}


@pytest.mark.parametrize("path", ["/triggers/a%3Eb", "/triggers/%00", "/triggers/" + "x" * 5000, "/triggers/a.b"])
async def test_hostile_ids_are_404(admin: httpx.AsyncClient, path: str) -> None:
    for method in ("GET", "PUT", "DELETE"):
        answer = await admin.request(method, path, headers={**AS_ADMIN, "If-Match": '"1"'}, json=webhook_spec())
        assert answer.status_code in (404, 422), (method, answer.text)
    assert (await admin.post(path + "/enable", headers=AS_OPERATOR)).status_code == 404


# --------------------------------------------------------------------------- documented answers
def _documented(model: type[BaseModel], body: Any) -> None:
    """``body`` is ``model`` (the OpenAPI response body) exactly: it validates, and holds no undocumented field."""
    model.model_validate(body)
    assert set(body) <= set(model.model_fields), f"undocumented fields: {set(body) - set(model.model_fields)}"


def test_a_delivery_view_is_its_record_without_the_event() -> None:
    # DeliveryView documents DeliveryRecord.view(): the same fields, but the event, plus has_event
    record_fields = set(DeliveryRecord.model_fields) - {"event"}
    assert set(DeliveryView.model_fields) == record_fields | {"has_event"}
    for name in record_fields:
        assert DeliveryView.model_fields[name].annotation == DeliveryRecord.model_fields[name].annotation, name


async def test_every_admin_answer_is_the_body_its_openapi_document_names(admin: httpx.AsyncClient) -> None:
    document = (await admin.get("/openapi.json", headers=AS_VIEWER)).json()

    def named(path: str, method: str, status: str) -> str:
        schema = document["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]
        return str(schema["$ref"]).rsplit("/", 1)[1]

    assert named("/triggers", "get", "200") == "TriggerList"
    assert named("/triggers", "post", "201") == "TriggerView"
    for method in ("get", "put"):
        assert named("/triggers/{trigger_id}", method, "200") == "TriggerView"
    for switch in ("enable", "disable"):
        assert named(f"/triggers/{{trigger_id}}/{switch}", "post", "200") == "TriggerView"
    assert named("/triggers/{trigger_id}/deliveries", "get", "200") == "DeliveryPage"
    redrive_path = "/triggers/{trigger_id}/deliveries/{delivery_id}/redrive"
    assert named(redrive_path, "post", "200") == named(redrive_path, "post", "202") == "RedriveAnswer"
    assert named("/triggers/preview", "post", "200") == "PreviewAnswer"

    created = await _create(admin, webhook_spec())
    assert created.status_code == 201, created.text
    _documented(TriggerView, created.json())
    listed = await admin.get("/triggers", headers=AS_VIEWER)
    _documented(TriggerList, listed.json())
    for view in listed.json()["triggers"]:
        _documented(TriggerView, view)
    disabled = await admin.post("/triggers/api-pr/disable", headers=AS_OPERATOR)
    _documented(TriggerView, disabled.json())
    ignored = await admin.post("/hooks/api-pr", content=fixture_bytes("pr-created.json"), headers=basic())
    assert ignored.status_code == 200, ignored.text
    assert ignored.json()["status"] == "ignored"
    enabled = await admin.post("/triggers/api-pr/enable", headers=AS_OPERATOR)
    _documented(TriggerView, enabled.json())
    replaced = await admin.put(
        "/triggers/api-pr", json=webhook_spec(), headers={**AS_ADMIN, "If-Match": enabled.headers["etag"]}
    )
    _documented(TriggerView, replaced.json())
    _documented(TriggerView, (await admin.get("/triggers/api-pr", headers=AS_VIEWER)).json())

    page = (await admin.get("/triggers/api-pr/deliveries", headers=AS_VIEWER)).json()
    _documented(DeliveryPage, page)
    (delivery,) = page["deliveries"]
    _documented(DeliveryView, delivery)
    assert delivery["state"] == "rejected"
    assert delivery["has_event"] is True
    redriven = await admin.post(f"/triggers/api-pr/deliveries/{delivery['delivery_id']}/redrive", headers=AS_OPERATOR)
    assert redriven.status_code == 202, redriven.text
    _documented(RedriveAnswer, redriven.json())
    again = await admin.post(f"/triggers/api-pr/deliveries/{delivery['delivery_id']}/redrive", headers=AS_OPERATOR)
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "duplicate"
    _documented(RedriveAnswer, again.json())

    sample = json.loads(fixture_bytes("pr-created.json").decode("utf-8-sig"))
    for body in (
        {"trigger_id": "api-pr", "payload": sample},
        {"trigger": webhook_spec(enabled=False), "payload": sample},
        {"trigger_id": "api-pr", "payload": {"not": "an azure devops event"}},
        {"trigger": {"id": "x", "type": "webhook"}, "payload": sample},
    ):
        preview = await admin.post("/triggers/preview", json=body, headers=AS_VIEWER)
        assert preview.status_code == 200, preview.text
        _documented(PreviewAnswer, preview.json())
        if preview.json()["ok"] is False:
            for error in preview.json()["errors"]:
                _documented(PreviewFieldError, error)
        elif preview.json()["would_start_run"] is False:
            _documented(PreviewIgnored, preview.json()["ignored"])
