"""JMESPath input mapping (TRG-8) and the mapping preview: compiled once, applied per delivery, previewed
without starting or publishing anything."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from gateway_support import (
    AGENTS,
    AS_ADMIN,
    AS_VIEWER,
    ENVIRON,
    GITHUB_SECRET,
    PASSWORD,
    TRIGGERS_YAML,
    basic,
    fixture_bytes,
    fixture_json,
    journal,
    load_triggers_yaml,
    tokens_file,
    webhook_spec,
)

from temporality_bus import Bus
from temporality_protocol import NormalizedEvent, run_id_for_delivery
from temporality_protocol.catalog import EVENTS_STREAM
from temporality_service import ApiAuth, ApiAuthSettings
from temporality_trigger_gateway import Settings, TriggerConfigError, create_app, parse_triggers
from temporality_trigger_gateway.mapping import MappingFailed, agent_input, compile_mapping
from temporality_trigger_gateway.preview import PREVIEW_DELIVERY_ID
from temporality_trigger_gateway.store import TriggerRegistry, TriggerStore

EVENT = NormalizedEvent(
    id="e-1",
    type="generic.order.created",
    source="https://shop.example",
    timestamp=datetime(2026, 1, 2, tzinfo=UTC),
    payload={"order": {"id": 7, "lines": [{"sku": "a"}, {"sku": "b"}]}},
    metadata={"project": "shop"},
)


# --------------------------------------------------------------------------- the mapping itself
def test_expressions_are_evaluated_over_the_normalized_event_and_the_trigger_context() -> None:
    compiled = compile_mapping(
        {
            "order": "payload.order.id",
            "skus": "payload.order.lines[].sku",
            "project": "metadata.project",
            "missing": "payload.nothing.here",
            "team": "context.team",
            "count": "length(payload.order.lines)",
        }
    )
    assert agent_input(EVENT, compiled, {"team": "ops"}) == {
        "order": 7,
        "skus": ["a", "b"],
        "project": "shop",
        "missing": None,
        "team": "ops",
        "count": 2,
    }


def test_without_a_mapping_the_input_is_the_payload_plus_the_context() -> None:
    assert agent_input(EVENT, None, {}) == EVENT.payload
    assert agent_input(EVENT, None, {"team": "ops"}) == {**EVENT.payload, "context": {"team": "ops"}}


def test_an_invalid_expression_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"input\.author: not a valid JMESPath expression"):
        compile_mapping({"repository": "payload.repository", "author": "actor.[id"})
    with pytest.raises(ValueError, match=r"input\.empty: the expression is empty"):
        compile_mapping({"empty": "  "})


@pytest.mark.parametrize("expression", ["&payload", "[&id]", "{k: &id}", "not_null(&id)", "sort_by(@, &not_null(&a))"])
def test_an_expression_reference_outside_its_functions_is_refused(expression: str) -> None:
    """``&x`` evaluates to a function object, which no JSON can hold: refused when the trigger is saved."""
    with pytest.raises(ValueError, match=r"input\.x: `&…` \(an expression reference\) may only be an argument of"):
        compile_mapping({"x": expression})


def test_expression_references_as_arguments_of_their_functions_map_to_values() -> None:
    mapped = agent_input(EVENT, compile_mapping({"ids": "map(&id, [payload.order])"}), {})
    json.dumps(mapped)  # a value, not a function object
    assert mapped == {"ids": [EVENT.payload["order"]["id"]]}


def test_an_expression_that_fails_on_this_event_names_the_field() -> None:
    with pytest.raises(MappingFailed) as caught:
        agent_input(EVENT, compile_mapping({"n": "length(payload.order.id)"}), {})
    assert caught.value.field == "n"


def test_the_triggers_file_refuses_an_invalid_mapping_at_start() -> None:
    text = f"""
triggers:
  - id: t
    name: t
    type: webhook
    adapter: azure_devops.pull_request
    events: [git.pullrequest.created]
    agent: reviewer
    auth: {{type: basic, username: azure, password: {PASSWORD}}}
    input: {{author: "actor.[id"}}
"""
    with pytest.raises(TriggerConfigError, match=r"triggers\[0\] \(t\)\.input: .*input\.author: not a valid JMESPath"):
        load_triggers_yaml(text)


def test_the_triggers_file_refuses_an_unknown_agent_when_the_cards_are_known() -> None:
    with pytest.raises(TriggerConfigError, match=r"\(ado-work-items\)\.agent: .*unknown agent 'triager'"):
        parse_triggers(yaml.safe_load(TRIGGERS_YAML), environ=ENVIRON, agents=frozenset({"reviewer"}))


# --------------------------------------------------------------------------- over HTTP
@pytest.fixture
async def admin(bus: Bus, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    store = await TriggerStore.open(bus)
    registry = TriggerRegistry(environ={}, agents=AGENTS)
    auth = ApiAuth.from_settings(ApiAuthSettings(tokens_file=tokens_file(tmp_path)))
    async with registry.watching(store):
        app = create_app(Settings(), bus, registry, store=store, auth=auth)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as c:
            yield c


async def _messages(bus: Bus) -> int:
    return (await bus.js.stream_info(EVENTS_STREAM.name)).state.messages


async def _preview(client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await client.post("/triggers/preview", json=body, headers=AS_VIEWER)


async def test_preview_of_a_draft_shows_the_event_and_the_input_and_changes_nothing(
    admin: httpx.AsyncClient, bus: Bus
) -> None:
    before = await _messages(bus)
    draft = webhook_spec(auth={"type": "basic", "username": "azure", "password_env": "NOT_SET_IN_THE_GATEWAY"})
    answer = await _preview(admin, {"trigger": draft, "payload": fixture_json("pr-created.json")})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["ok"] is True
    assert body["would_start_run"] is True
    assert body["event"]["type"] == "azure_devops.git.pullrequest.created"
    assert body["event"]["payload"]["repository"]["name"] == "payments-api"
    assert body["input"]["repository"] == "payments-api"
    assert body["input"]["team"] == "web"
    assert body["run_id"] == run_id_for_delivery("api-pr", body["event"]["id"])
    assert await _messages(bus) == before  # nothing published
    assert (await admin.get("/triggers", headers=AS_VIEWER)).json()["triggers"] == []  # nothing stored


async def test_preview_of_a_stored_trigger_and_of_an_ignored_event(admin: httpx.AsyncClient) -> None:
    assert (await admin.post("/triggers", json=webhook_spec(), headers=AS_ADMIN)).status_code == 201
    stored = await _preview(admin, {"trigger_id": "api-pr", "payload": fixture_json("pr-created.json")})
    assert stored.json()["ok"] is True
    assert stored.json()["input"]["pull_request"] == 7
    merged_only = webhook_spec(events=["git.pullrequest.merged"])
    ignored = (await _preview(admin, {"trigger": merged_only, "payload": fixture_json("pr-created.json")})).json()
    assert ignored["would_start_run"] is False
    assert ignored["ignored"]["reason"] == "unsupported_event"
    unknown = (await _preview(admin, {"trigger_id": "nope", "payload": {}})).json()
    assert unknown == {
        "ok": False,
        "stage": "trigger",
        "errors": [{"field": "trigger_id", "message": "no stored trigger has this id"}],
    }


async def test_preview_of_a_github_draft_reads_the_sample_headers(admin: httpx.AsyncClient) -> None:
    draft = {
        "id": "gh",
        "name": "GitHub",
        "type": "webhook",
        "adapter": "github",
        "events": ["pull_request.opened"],
        "agent": "reviewer",
        "auth": {"type": "github", "secret": GITHUB_SECRET},
        "input": {"title": "payload.pull_request.title", "sender": "actor.id"},
    }
    headers = {"X-GitHub-Event": "pull_request", "X-GitHub-Delivery": "d-1"}
    body = (
        await _preview(admin, {"trigger": draft, "payload": fixture_json("github-pr-opened.json"), "headers": headers})
    ).json()
    assert body["ok"] is True, body
    assert body["source_event"] == {"id": "d-1", "type": "pull_request.opened"}
    assert set(body["input"]) == {"title", "sender"}
    assert body["input"]["title"]


_GITHUB_DRAFT = {
    "id": "gh",
    "name": "GitHub",
    "type": "webhook",
    "adapter": "github",
    "events": ["pull_request.opened"],
    "agent": "reviewer",
    "auth": {"type": "github", "secret": GITHUB_SECRET},
}
_GITLAB_DRAFT = {
    "id": "gl",
    "name": "GitLab",
    "type": "webhook",
    "adapter": "gitlab",
    "events": ["merge_request.open"],
    "agent": "reviewer",
    "auth": {"type": "gitlab", "secret": "t"},
}


@pytest.mark.parametrize(
    ("draft", "sample", "headers", "header"),
    [
        (_GITHUB_DRAFT, "github-pr-opened.json", {"X-GitHub-Event": "pull_request"}, "X-GitHub-Delivery"),
        (_GITLAB_DRAFT, "gitlab-mr-open.json", {"X-Gitlab-Event": "Merge Request Hook"}, "X-Gitlab-Event-UUID"),
    ],
)
async def test_preview_of_a_sample_without_its_delivery_id_header_uses_a_placeholder_and_says_so(
    admin: httpx.AsyncClient, draft: dict[str, Any], sample: str, headers: dict[str, str], header: str
) -> None:
    """An integrator review: a GitHub or GitLab sample (from the sender's docs) needed an invented delivery id
    header, else ``ok: false``. A live sender always sends one; the preview supplies it and says so."""
    body = (await _preview(admin, {"trigger": draft, "payload": fixture_json(sample), "headers": headers})).json()
    assert body["ok"] is True, body
    assert body["would_start_run"] is True
    assert body["source_event"]["id"] == PREVIEW_DELIVERY_ID
    assert header in body["source_event"]["note"]
    assert PREVIEW_DELIVERY_ID in body["source_event"]["note"]
    given = {**headers, header: "d-7"}
    with_id = (await _preview(admin, {"trigger": draft, "payload": fixture_json(sample), "headers": given})).json()
    assert with_id["source_event"]["id"] == "d-7"
    assert "note" not in with_id["source_event"]


async def test_preview_of_a_github_ping_is_ignored_as_live(admin: httpx.AsyncClient) -> None:
    """An integrator review: previewing a ping answered ``ok: false`` "unsupported event" where the live hook
    answers 200 ignored. The preview reports it ignored, as the gateway would (no event: a ping normalizes to
    none)."""
    headers = {"X-GitHub-Event": "ping", "X-GitHub-Delivery": "d-ping"}
    payload = fixture_json("github-ping.json")
    body = (await _preview(admin, {"trigger": _GITHUB_DRAFT, "payload": payload, "headers": headers})).json()
    assert body["ok"] is True, body
    assert body["would_start_run"] is False
    assert body["ignored"]["reason"] == "unsupported_event"
    assert body["source_event"] == {"id": "d-ping", "type": "ping"}
    assert body["event"] is None
    disabled = {**_GITHUB_DRAFT, "enabled": False}
    off = (await _preview(admin, {"trigger": disabled, "payload": payload, "headers": headers})).json()
    assert off["ok"] is True, off
    assert off["ignored"]["reason"] == "disabled"


@pytest.mark.parametrize(
    ("changes", "payload", "stage", "field"),
    [
        ({"input": {"author": "actor.[id"}}, None, "trigger", "input"),
        ({"agent": "ghost"}, None, "trigger", "agent"),
        ({}, {"not": "azure devops"}, "payload", None),
        ({"input": {"n": "length(payload.pull_request.id)"}}, None, "mapping", "input.n"),
    ],
)
async def test_preview_reports_what_is_wrong_and_where(
    admin: httpx.AsyncClient, changes: dict[str, Any], payload: Any, stage: str, field: str | None
) -> None:
    sample = fixture_json("pr-created.json") if payload is None else payload
    body = (await _preview(admin, {"trigger": webhook_spec(**changes), "payload": sample})).json()
    assert body["ok"] is False
    assert body["stage"] == stage
    assert body["errors"]
    if field is not None:
        assert body["errors"][0]["field"] == field, body


@pytest.mark.parametrize(
    "request_body",
    [
        {"payload": {}},
        {"trigger": {}, "trigger_id": "x", "payload": {}},
        {"trigger": {}},
        {"trigger": {}, "payload": {}, "extra": 1},
        {"trigger": {}, "payload": {}, "headers": {"a": 1}},
    ],
)
async def test_a_malformed_preview_request_is_422(admin: httpx.AsyncClient, request_body: dict[str, Any]) -> None:
    answer = await _preview(admin, request_body)
    assert answer.status_code == 422
    assert answer.json()["error"] == "invalid_request"


async def test_preview_needs_a_token(admin: httpx.AsyncClient) -> None:
    answer = await admin.post("/triggers/preview", json={"trigger_id": "x", "payload": {}})
    assert answer.status_code == 401


async def test_a_mapping_that_fails_on_a_delivery_is_422_and_journaled(admin: httpx.AsyncClient, bus: Bus) -> None:
    spec = webhook_spec(input={"n": "length(payload.pull_request.id)"})
    assert (await admin.post("/triggers", json=spec, headers=AS_ADMIN)).status_code == 201
    refused = await admin.post("/hooks/api-pr", content=fixture_bytes("pr-created.json"), headers=basic())
    assert refused.status_code == 422
    assert refused.json()["error"] == "mapping_failed"  # the trigger's fault, not the payload's
    assert "input.n" in refused.json()["detail"]
    rejected = [e for e in await journal(bus) if e.type == "trigger.rejected"]
    assert [e.data["reason"] for e in rejected] == ["invalid_payload"]
    assert not [e for e in await journal(bus) if e.type == "run.requested"]


@pytest.mark.parametrize("expression", ["(" * 499 + "a" + ")" * 499, "[" * 999, "!" * 999, "a" + "|a" * 499])
def test_a_pathologically_nested_expression_is_refused_at_save(expression: str) -> None:
    with pytest.raises(ValueError, match=r"input\.x: the expression is nested too deeply"):
        compile_mapping({"x": expression})


# --------------------------------------------------------------------------- what fails on every event: refused at save
@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("foo(payload.pull_request.title)", r"unknown function foo\(\) \(JMESPath's functions: abs, avg, "),
        ("payload.reviewers[*].to_string(foo(@))", r"unknown function foo\(\)"),  # inside a projection
        ("length(payload.repository, payload.reviewers)", r"length\(\) takes 1 argument, not 2"),
        ("to_string()", r"to_string\(\) takes 1 argument, not 0"),
        ("merge()", r"merge\(\) takes at least 1 argument, not 0"),
        (
            "payload.nothing || length(`5`)",
            r"argument 1 of length\(\) must be string or array or object; it is the literal 5",
        ),
        ('join(`", "`, `[1, 2]`)', r"argument 2 of join\(\) must be array-string; it is the literal \[1, 2\]"),
        ("length(abs(payload.pull_request.id))", r"argument 1 of length\(\) must be .*; it is always number"),
        ("abs(payload.reviewers[*].id)", r"argument 1 of abs\(\) must be number; it is always array or null"),
        ("sort_by(payload.reviewers, display_name)", r"argument 2 of sort_by\(\) must be an expression reference"),
        ("ceil(`1e400`)", r"ceil\(\) fails whatever the event \(cannot convert float infinity to integer\)"),
    ],
)
def test_what_fails_on_every_event_is_refused_at_save(expression: str, says: str) -> None:
    """Evaluating on ``{}`` cannot tell these from a missing field's type error: they are found in the parsed tree."""
    with pytest.raises(ValueError, match=rf"^input\.x: {says}"):
        compile_mapping({"x": expression})


#: Functions of every kind, on the fields an Azure DevOps pull request really has (fixture pr-created.json).
FUNCTIONS_ON_A_PULL_REQUEST = {
    "title": "to_string(payload.pull_request.title)",
    "reviewer_count": "length(payload.reviewers)",
    "reviewers": "join(', ', payload.reviewers[].display_name)",
    "first_reviewer": "sort_by(payload.reviewers, &display_name)[0].unique_name",
    "ids": "map(&id, payload.reviewers)",
    "is_fix": "starts_with(payload.source_branch, 'fix/')",
    "to_develop": "contains(['develop', 'main'], payload.target_branch)",
    "pr_number": "abs(payload.pull_request.id)",
    "labels": "not_null(payload.labels, `[]`)",
    "keys": "sort(keys(payload.commits))",
    "merged": 'merge(payload.author, `{"role": "author"}`).role',
    "kind": "type(payload.pull_request.id)",
}


async def test_valid_expressions_with_functions_on_a_real_payload_save_and_map(
    admin: httpx.AsyncClient, bus: Bus
) -> None:
    spec = webhook_spec(input=FUNCTIONS_ON_A_PULL_REQUEST, when="length(payload.reviewers) > `0`")
    created = await admin.post("/triggers", json=spec, headers=AS_ADMIN)
    assert created.status_code == 201, created.text
    assert created.json()["problem"] is None
    assert created.json()["served"] is True
    answer = await admin.post("/hooks/api-pr", content=fixture_bytes("pr-created.json"), headers=basic())
    assert answer.status_code == 202, answer.text
    (requested,) = [e for e in await journal(bus) if e.type == "run.requested"]
    assert requested.data["input"] == {
        "title": "Retry idempotent refunds",
        "reviewer_count": 1,
        "reviewers": "Omar Haddad",
        "first_reviewer": "omar@contoso.example",
        "ids": ["8d7c6b5a-4e3f-4a1b-9c0d-e1f2a3b4c5d6"],
        "is_fix": True,
        "to_develop": True,
        "pr_number": 7,
        "labels": [],
        "keys": ["source", "target"],
        "merged": "author",
        "kind": "number",
    }


@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"input": {"pr": "foo(resource.title)"}}, "input.pr", "unknown function foo()"),
        ({"when": "bar(payload) == `1`"}, "when", "unknown function bar()"),
        ({"input": {"n": "length(payload.reviewers, `1`)"}}, "input.n", "length() takes 1 argument, not 2"),
    ],
)
async def test_an_expression_that_fails_on_every_event_is_422_at_save_and_in_the_preview(
    admin: httpx.AsyncClient, changes: dict[str, Any], field: str, says: str
) -> None:
    refused = await admin.post("/triggers", json=webhook_spec(**changes), headers=AS_ADMIN)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == "invalid_trigger"
    assert f"{field}: {says}" in refused.json()["detail"]
    assert (await admin.get("/triggers", headers=AS_VIEWER)).json()["triggers"] == []  # nothing stored
    stored = await admin.post("/triggers", json=webhook_spec(), headers=AS_ADMIN)
    assert stored.status_code == 201
    replaced = await admin.put(
        "/triggers/api-pr", json=webhook_spec(**changes), headers={**AS_ADMIN, "If-Match": stored.headers["ETag"]}
    )
    assert replaced.status_code == 422, replaced.text
    assert f"{field}: {says}" in replaced.json()["detail"]
    # the preview says so too, with or without a sample that would exercise the expression
    for sample in (fixture_json("pr-created.json"), {}):
        body = (await _preview(admin, {"trigger": webhook_spec(**changes), "payload": sample})).json()
        assert body["ok"] is False
        assert body["stage"] == "trigger"
        assert any(f"{field}: {says}" in e["message"] for e in body["errors"]), body
