"""Property tests (hypothesis, issue 7): random bodies and headers through the webhook endpoint (the
verifiers, then the adapters) never reach a 500 -- a 4xx with an ``{"error", "detail"}`` body, or an
answer with a ``status``; and the JMESPath side (expressions, truthiness, the mapping) fails only in the
ways it documents. Bounded (``max_examples``, no deadline) so they add little time. The webhook cases run
against the app over the real-nats ``bus`` (``client`` fixture)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import jmespath
from gateway_support import (
    BEARER_TOKEN,
    ENVIRON,
    SW_SECRET,
    basic,
    fixture_json,
    github_headers,
    load_triggers_yaml,
    webhook_request,
)
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from temporality_protocol import NormalizedEvent
from temporality_trigger_gateway.adapters import ADAPTERS
from temporality_trigger_gateway.auth import Auth, Verifier
from temporality_trigger_gateway.errors import InvalidPayload, Unauthorized
from temporality_trigger_gateway.mapping import (
    MappingFailed,
    agent_input,
    compile_expression,
    is_truthy,
)

#: Reproducible (a fixed seed per test, no example database written into the checkout).
_FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
_QUICK = settings(max_examples=150, deadline=None, derandomize=True, database=None)
#: JSON values (nested a little), as a sender might put anywhere in a body.
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
#: Header values httpx can send (printable ASCII, no line breaks).
_VALUE = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60)
_HEADER_NAMES = st.sampled_from(
    [
        "Content-Type",
        "X-GitHub-Event",
        "X-GitHub-Delivery",
        "X-Hub-Signature-256",
        "X-Gitlab-Event",
        "X-Gitlab-Token",
        "Idempotency-Key",
        "X-Gitlab-Event-UUID",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "X-Custom",
    ]
)
_HEADERS = st.dictionaries(_HEADER_NAMES, _VALUE, max_size=5)
_FIXTURES = {
    "ado-pr-review": "pr-created.json",
    "ado-work-items": "ado-workitem-updated-bom.json",
    "gh-review": "github-pr-opened.json",
    "gl-review": "gitlab-mr-open.json",
    "orders-signed": "generic-order.json",
    "orders-bearer": "generic-order.json",
}


@st.composite
def _mutated(draw: st.DrawFn, document: Any) -> Any:
    """``document`` with a few of its values (at any depth) replaced by random JSON, or removed."""
    for _ in range(draw(st.integers(0, 3))):
        node = document
        path: list[Any] = []
        while isinstance(node, dict | list) and node and (not path or draw(st.integers(0, 3)) > 0):
            key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
            path.append(key)
            node = node[key]
        if not path:
            return draw(_JSON)  # the whole body replaced (an empty document, or a scalar)
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(_JSON)
    return document


#: ``webhook-timestamp`` values: now, near it, far from it (past year 9999 too), more digits than int() reads,
#: and text that is no number.
_STAMPS = st.one_of(
    st.just("now"),
    st.integers(-400, 400).map(lambda offset: str(int(time.time()) + offset)),
    st.integers(0, 10**20).map(str),
    st.integers(253402300800, 10**12 - 1).map(str),  # year 10000 to twelve digits: was a 500 (ValueError)
    st.integers(1, 5000).map(lambda digits: "9" * digits),
    _VALUE,
)


def _standard_signed(raw: bytes, msg_id: str, stamp: str = "now") -> dict[str, str]:
    """Standard Webhooks headers over any bytes (the library helper needs text), signed at ``stamp``."""
    stamp = str(int(time.time())) if stamp == "now" else stamp
    key = base64.b64decode(SW_SECRET.removeprefix("whsec_"))
    digest = hmac.new(key, msg_id.encode() + b"." + stamp.encode() + b"." + raw, hashlib.sha256).digest()
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": stamp,
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }


@st.composite
def _delivery(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    """A delivery to one of the test triggers: a mutated real sample or random bytes, correctly
    authenticated or not, with random headers on top."""
    trigger_id = draw(st.sampled_from(sorted(_FIXTURES)))
    if draw(st.integers(0, 4)) == 0:
        raw = draw(st.binary(max_size=200))
    else:
        body = draw(_mutated(fixture_json(_FIXTURES[trigger_id])))
        raw = json.dumps(body).encode()
    headers: dict[str, str] = {"Content-Type": "application/json"}
    if draw(st.integers(0, 3)) > 0:  # as the source signs it; otherwise only what the random headers say
        if trigger_id.startswith("ado-"):
            headers |= basic()
        elif trigger_id == "gh-review":
            headers |= github_headers(raw, draw(st.sampled_from(["pull_request", "push", "ping", "issues"])), "d-1")
        elif trigger_id == "gl-review":
            headers |= {"X-Gitlab-Token": ENVIRON["TEST_GITLAB_TOKEN"], "X-Gitlab-Event": "Merge Request Hook"}
        elif trigger_id == "orders-signed":
            headers |= _standard_signed(raw, draw(st.sampled_from(["msg-1", "msg-2", ""])), draw(_STAMPS))
        else:
            headers |= {"Authorization": f"Bearer {ENVIRON['TEST_BEARER_TOKEN']}"}
    if draw(st.booleans()):
        headers |= draw(_HEADERS)
    return trigger_id, raw, headers


@_FUZZ
@given(case=_delivery())
async def test_random_deliveries_never_reach_a_500(
    client: httpx.AsyncClient, case: tuple[str, bytes, dict[str, str]]
) -> None:
    trigger_id, raw, headers = case
    answer = await client.post(f"/hooks/{trigger_id}", content=raw, headers=headers)
    event(f"{answer.status_code} {answer.json().get('status') or answer.json().get('error')}")
    assert answer.status_code < 500, answer.text
    body = answer.json()
    if answer.status_code >= 400:
        assert set(body) >= {"error", "detail"}, body
        assert isinstance(body["detail"], str)
        assert body["detail"]
    else:
        assert body["status"] in {"accepted", "duplicate", "ignored", "queued", "debounced", "skipped"}, body


def _verifier(**auth: str) -> Verifier:
    """A verifier with literal secrets (an auth type is checked against its source only in a trigger)."""
    keyed = auth if {"password", "token"} & set(auth) and auth["type"] != "mindmap" else {"secret": SW_SECRET, **auth}
    verifier: Verifier = TypeAdapter(Auth).validate_python(keyed)
    return verifier


#: One verifier of every ``auth.type``.
_VERIFIERS: dict[str, Verifier] = {
    "basic": _verifier(type="basic", username="u", password=SW_SECRET),
    "bearer": _verifier(type="bearer", token=SW_SECRET),
    "header": _verifier(type="header", header="X-Custom"),
    "gitlab": _verifier(type="gitlab"),
    "hmac_hex": _verifier(type="hmac_sha256", header="X-Custom", prefix="sha256="),
    "hmac_base64": _verifier(type="hmac_sha256", header="X-Custom", encoding="base64"),
    "github": _verifier(type="github"),
    "standard_webhooks": _verifier(type="standard_webhooks"),
    "mindmap": _verifier(type="mindmap", token=BEARER_TOKEN),
}
#: Header values as an HTTP server hands them on (any byte, read as latin-1), and the timestamps above.
_ANY_VALUE = st.text(st.characters(max_codepoint=255), max_size=40) | _STAMPS
_AUTH_HEADERS = st.dictionaries(
    st.sampled_from(
        [
            "authorization",
            "x-custom",
            "x-hub-signature-256",
            "x-gitlab-token",
            "x-mindmap-token",
            "x-mindmap-signature",
            "webhook-id",
            "webhook-timestamp",
            "webhook-signature",
        ]
    ),
    _ANY_VALUE,
    max_size=6,
)


@_QUICK
@given(verifier=st.sampled_from(sorted(_VERIFIERS)), headers=_AUTH_HEADERS, body=st.binary(max_size=64))
def test_every_verifier_accepts_or_refuses_with_401_whatever_the_headers(
    verifier: str, headers: dict[str, str], body: bytes
) -> None:
    """No header value (a number out of range, a time past year 9999, text that is none) makes a verifier raise
    anything but :class:`Unauthorized`."""
    refused: Unauthorized | None = None
    try:
        _VERIFIERS[verifier].verify(headers, body)
    except Unauthorized as exc:
        refused = exc
    assert refused is None or refused.detail


@_QUICK
@given(msg_id=_ANY_VALUE, stamp=_STAMPS, signature=_ANY_VALUE, signed=st.booleans(), body=st.binary(max_size=64))
def test_standard_webhooks_refuses_any_timestamp_but_a_near_one_with_401(
    msg_id: str, stamp: str, signature: str, signed: bool, body: bytes
) -> None:
    """All three Standard Webhooks headers present, the signature right (``signed``) or random: accepted only when
    the timestamp is a number within 300 s of now, refused with 401 otherwise, never another error."""
    headers = _standard_signed(body, msg_id, stamp) if signed else {}
    headers = {"webhook-id": msg_id, "webhook-timestamp": stamp, "webhook-signature": signature} | headers
    try:
        _VERIFIERS["standard_webhooks"].verify(headers, body)
    except Unauthorized as refused:
        event(refused.detail[:40])
        return
    near = headers["webhook-timestamp"].isdigit() and abs(int(headers["webhook-timestamp"]) - time.time()) <= 301
    assert signed
    assert near
    assert msg_id


@_QUICK
@given(body=_JSON, headers=_HEADERS, adapter=st.sampled_from(sorted(ADAPTERS)))
def test_every_adapter_normalizes_or_refuses_with_invalid_payload(
    body: Any, headers: dict[str, str], adapter: str
) -> None:
    source = ADAPTERS[adapter]
    request = webhook_request(body, headers)
    refused: InvalidPayload | None = None
    try:
        source.identify(request)
        event = source.normalize(request, tenant=None)
    except InvalidPayload as exc:
        refused = exc
    if refused is not None:
        assert refused.detail
        return
    assert isinstance(event, NormalizedEvent)
    json.dumps(event.model_dump(mode="json"))  # publishable as JSON


# --------------------------------------------------------------------------- JMESPath
_EXPRESSION = st.text(st.sampled_from(list("abxyz.[]*|&!=<>'`(),@0123 {}:?-")), min_size=1, max_size=30)


@_QUICK
@given(expression=_EXPRESSION, document=_JSON)
@example(expression="&a", document=None)  # found by this test: an expression reference is no JSON value
@example(expression="not_null(&a)", document=None)
def test_an_expression_compiles_or_is_refused_and_evaluates_or_fails_as_documented(
    expression: str, document: Any
) -> None:
    problem: str | None = None
    try:
        compiled = compile_expression(expression, "input.x")
    except ValueError as exc:
        problem = str(exc)
    if problem is not None:
        assert problem.startswith("input.x: ")
        return
    event = _event({"doc": document})
    failed: MappingFailed | None = None
    try:
        mapped = agent_input(event, {"x": compiled}, {})
    except MappingFailed as exc:
        failed = exc
    if failed is not None:
        assert failed.where == "input.x"
        return
    json.dumps(mapped)


def _event(payload: dict[str, Any]) -> NormalizedEvent:
    return NormalizedEvent(id="e-1", type="order.created", source="/test", timestamp=datetime.now(UTC), payload=payload)


@_QUICK
@given(value=_JSON)
def test_truthiness_agrees_with_jmespaths_not(value: Any) -> None:
    assert is_truthy(value) is (jmespath.search("!x", {"x": value}) is False)


_TRIGGERS = load_triggers_yaml(
    """
triggers:
  - id: keyed
    name: A condition, a mapping and a concurrency key over any payload
    type: webhook
    adapter: generic
    events: [order.created]
    agent: reviewer
    auth: {type: none}
    when: "payload.total > `10` || contains(keys(payload), 'vip')"
    input:
      total: payload.total
      first: payload.items[0].sku
      n: length(payload.items)
    concurrency: {key: payload.customer, policy: skip}
""",
)


@_QUICK
@given(payload=st.dictionaries(st.sampled_from(["total", "items", "customer", "vip"]), _JSON, max_size=4))
def test_a_trigger_decides_on_any_payload_or_names_the_failing_expression(payload: dict[str, Any]) -> None:
    (trigger,) = _TRIGGERS
    event = _event(payload)
    failed: MappingFailed | None = None
    try:
        filtered = trigger.filtered(event)
        mapped = trigger.agent_input(event)
        key = trigger.concurrency_key(event)
    except MappingFailed as exc:
        failed = exc
    if failed is not None:
        assert failed.where in {"when", "input.total", "input.first", "input.n", "concurrency.key"}
        return
    assert filtered is None or "when" in filtered
    assert set(mapped) == {"total", "first", "n"}
    assert key is None or isinstance(key, str)
