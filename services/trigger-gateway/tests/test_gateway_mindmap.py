"""The ``mindmap.test_case`` source (TRG-3): HMAC signature over the raw body + a per-trigger token +
a prompt template, on a real nats-server."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from gateway_support import fixture_bytes, journal_of, load_triggers_yaml, run_requested, webhook_request

from temporality_bus import Bus
from temporality_trigger_gateway import Settings, TriggerConfigError, create_app
from temporality_trigger_gateway.adapters import ADAPTERS

SIGNING_KEY = "mindmap-signing-key-for-tests"
TOKEN = "mindmap-trigger-token-for-tests"
TRIGGER = """
triggers:
  - id: mm-tests
    name: Automate test cases from the checkout map
    type: webhook
    adapter: mindmap.test_case
    events: [test_case.created, test_case.updated]
    agent: reviewer
    auth: {type: mindmap, secret_env: MM_KEY, token_env: MM_TOKEN}
    input:
      case_id: payload.test_case.id
      title: payload.test_case.title
      steps: payload.test_case.steps
      expected: payload.test_case.expected
      area: join(' > ', payload.test_case.path)
    prompt: |
      Write an automated test for "${title}" (${case_id}, ${area}).
      Steps:
      ${steps}
      Expected: ${expected}
"""


def _signed(raw: bytes, *, key: str = SIGNING_KEY, token: str = TOKEN) -> dict[str, str]:
    signature = hmac.new(key.encode(), raw, hashlib.sha256).hexdigest()
    return {"Content-Type": "application/json", "X-Mindmap-Signature": f"sha256={signature}", "X-Mindmap-Token": token}


@pytest.fixture
async def client(bus: Bus) -> AsyncIterator[httpx.AsyncClient]:
    triggers = load_triggers_yaml(TRIGGER, MM_KEY=SIGNING_KEY, MM_TOKEN=TOKEN)
    app = create_app(Settings(), bus, triggers)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as c:
        yield c


def test_the_sample_normalizes() -> None:
    raw = fixture_bytes("mindmap-test-case.json")
    request = webhook_request(json.loads(raw), raw=raw)
    adapter = ADAPTERS["mindmap.test_case"]
    assert adapter.identify(request).model_dump() == {"id": "mm-evt-0001", "type": "test_case.created"}
    event = adapter.normalize(request, tenant=None)
    assert event.type == "mindmap.test_case.created"
    assert event.source == "https://mindmap.example/maps/map-checkout"
    assert event.actor is not None
    assert event.actor.display_name == "Rosa Marquez"
    assert event.payload["test_case"]["steps"] == ["Open the order", "Click Refund", "Confirm"]
    assert event.metadata == {"event_type": "test_case.created", "map_id": "map-checkout", "test_case_id": "TC-17"}
    assert adapter.run_title(event) == "Test case TC-17: Refund a card payment twice"


async def test_a_signed_delivery_with_the_token_starts_a_run_with_the_rendered_prompt(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    raw = fixture_bytes("mindmap-test-case.json")
    accepted = await client.post("/hooks/mm-tests", content=raw, headers=_signed(raw))
    assert accepted.status_code == 202, accepted.text
    requested = await run_requested(bus)
    assert requested.input["case_id"] == "TC-17"
    assert requested.input["area"] == "Checkout > Payment > Refunds"
    assert requested.input["prompt"] == (
        'Write an automated test for "Refund a card payment twice" (TC-17, Checkout > Payment > Refunds).\n'
        "Steps:\n- Open the order\n- Click Refund\n- Confirm\n"
        "Expected: The second refund is refused with a clear message\n"
    )
    assert requested.title == "Test case TC-17: Refund a card payment twice"
    duplicate = await client.post("/hooks/mm-tests", content=raw, headers=_signed(raw))
    assert duplicate.json()["status"] == "duplicate"


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ({"X-Mindmap-Token": TOKEN}, "X-Mindmap-Signature header"),
        ({"X-Mindmap-Signature": "sha256=00"}, "X-Mindmap-Token header"),
        ("wrong-token", "wrong X-Mindmap-Token"),
        ("wrong-key", "does not match the body"),
        ("tampered", "does not match the body"),
    ],
)
async def test_a_delivery_without_both_proofs_is_401_and_journals_nothing(
    client: httpx.AsyncClient, bus: Bus, headers: dict[str, str] | str, detail: str
) -> None:
    raw = fixture_bytes("mindmap-test-case.json")
    if headers == "wrong-token":
        sent = _signed(raw, token="another-trigger-token")
    elif headers == "wrong-key":
        sent = _signed(raw, key="another-key")
    elif headers == "tampered":
        sent = _signed(raw)
        raw = raw.replace(b"TC-17", b"TC-18")
    else:
        assert isinstance(headers, dict)
        sent = {"Content-Type": "application/json", **headers}
    refused = await client.post("/hooks/mm-tests", content=raw, headers=sent)
    assert refused.status_code == 401
    assert detail in refused.json()["detail"]
    assert await journal_of(bus, "trigger.received") == []


async def test_a_body_that_is_not_a_test_case_is_422(client: httpx.AsyncClient) -> None:
    raw = b'{"id": "e-1", "event": "test_case.created", "map": {"id": "m"}}'
    refused = await client.post("/hooks/mm-tests", content=raw, headers=_signed(raw))
    assert refused.status_code == 422
    assert refused.json()["error"] == "invalid_payload"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("prompt: |", "prompt: 'Automate ${nothing}'\n    unused: |"), "unused: unknown key 'unused'; allowed here:"),
        (("${steps}", "${stepz}"), "prompt: the template uses stepz"),
        (("auth: {type: mindmap, secret_env: MM_KEY, token_env: MM_TOKEN}", "auth: {type: mindmap, secret_env: MM_KEY}"), "token_env"),
        (("auth: {type: mindmap, secret_env: MM_KEY, token_env: MM_TOKEN}", "auth: {type: github, secret_env: MM_KEY}"), "cannot authenticate mindmap.test_case"),
        (("events: [test_case.created, test_case.updated]", "events: [test_case.deleted]"), "cannot handle test_case.deleted"),
    ],
)  # fmt: skip
def test_a_misconfigured_mindmap_trigger_fails_naming_the_field(change: tuple[str, str], message: str) -> None:
    text = TRIGGER.replace(*change)
    with pytest.raises(TriggerConfigError, match=message):
        load_triggers_yaml(text, MM_KEY=SIGNING_KEY, MM_TOKEN=TOKEN)
