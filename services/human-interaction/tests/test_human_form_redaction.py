"""A request's form (``answer_schema``) passes the same redaction as the rest of the request (HUM-5, SEC-1):
the texts a person is shown -- titles, descriptions, defaults, examples, enum labels -- never carry a secret
to the web inbox, while the machine values an answer is checked against (field names, enum values) stay, so
an answer that fits the form still binds. The run-executor redacts the form before it publishes it
(``Redactor.human_requested``), human-interaction again when it stores the request and when the inbox
shows one (a record an older version stored unredacted)."""

from __future__ import annotations

import json
from typing import Any

import httpx
from human_support import ALICE, requested, stored

from temporality_bus import Bus
from temporality_human_interaction.records import HumanRequestRecord, open_store
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import HumanOption, HumanRequested, HumanRequestState, TextAnswer
from temporality_protocol.redaction import Redactor

GITHUB = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
DB_URL_PASSWORD = "s3cr3t-pw"
AWS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRETS = (GITHUB, DB_URL_PASSWORD, AWS_KEY_ID, "hunter2-db-pass", "tok-in-an-example")

#: A form whose texts hold secrets at every place a person reads one; its machine values hold none.
FORM: dict[str, Any] = {
    "type": "object",
    "title": f"Deploy with {GITHUB}",
    "description": f"connect to postgres://app:{DB_URL_PASSWORD}@db.internal/orders",
    "properties": {
        "region": {
            "type": "string",
            "title": "Region",
            "enum": ["eu", "us"],
            "enumNames": [f"Europe ({AWS_KEY_ID})", "United States"],
            "default": "eu",
        },
        "dsn": {
            "type": "string",
            "description": "the database to use",
            "default": "DB_PASSWORD=hunter2-db-pass",
            "examples": ["api_key=tok-in-an-example"],
        },
        "size": {
            "type": "string",
            "oneOf": [
                {"const": "small", "title": f"Small, billed to {GITHUB}"},
                {"const": "large", "title": "Large"},
            ],
        },
    },
    "required": ["region", "dsn", "size"],
}
DECLINE = HumanOption(id="decline", label="Decline", consequence="the tool is told you declined")


def _leaks(value: Any) -> list[str]:
    text = json.dumps(value)
    return [secret for secret in SECRETS if secret in text]


def _machine_values_kept(schema: dict[str, Any]) -> None:
    props = schema["properties"]
    assert list(props) == ["region", "dsn", "size"]
    assert props["region"]["enum"] == ["eu", "us"]
    assert [o["const"] for o in props["size"]["oneOf"]] == ["small", "large"]
    assert schema["required"] == ["region", "dsn", "size"]


async def test_the_inbox_shows_a_form_with_its_secrets_redacted_and_a_fitting_answer_still_binds(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    event = requested(answer_schema=FORM, options=[DECLINE])
    await handler.handle(event)
    request_id = str(event.data["request_id"])

    record = await stored(bus, request_id)
    assert record is not None
    assert record.answer_schema is not None
    assert _leaks(record.answer_schema) == []  # never stored
    _machine_values_kept(record.answer_schema)
    # counted with the rest of the request's redactions (human.notified.redacted carries them)
    assert record.redactions == {
        "aws_access_key_id": 1,
        "github_token": 2,
        "secret_assignment": 2,
        "url_credentials": 1,
    }

    listed = await client.get("/inbox", headers=ALICE)
    assert listed.status_code == 200, listed.text
    [item] = [i for i in listed.json()["requests"] if i["id"] == request_id]
    one = await client.get(f"/requests/{request_id}", headers=ALICE)
    assert one.status_code == 200, one.text
    for shown in (item, one.json()):
        assert _leaks(shown["answer_schema"]) == [], shown["answer_schema"]
        assert _leaks(shown["form"]) == [], shown["form"]
        schema = shown["answer_schema"]
        _machine_values_kept(schema)
        assert schema["title"] == "Deploy with [REDACTED:github_token]"
        assert schema["description"] == "connect to postgres://app:[REDACTED:url_credentials]@db.internal/orders"
        assert schema["properties"]["dsn"]["default"] == "DB_PASSWORD=[REDACTED:secret_assignment]"
        assert schema["properties"]["dsn"]["examples"] == ["api_key=[REDACTED:secret_assignment]"]
        fields = {f["name"]: f for f in shown["form"]}
        assert fields["region"]["choices"] == [
            {"value": "eu", "label": "Europe ([REDACTED:aws_access_key_id])"},
            {"value": "us", "label": "United States"},
        ]
        assert fields["size"]["choices"] == [
            {"value": "small", "label": "Small, billed to [REDACTED:github_token]"},
            {"value": "large", "label": "Large"},
        ]

    answer = json.dumps({"region": "eu", "dsn": "orders-ro", "size": "small"})
    bound = await client.post(f"/requests/{request_id}/answer", json={"text": answer}, headers=ALICE)
    assert bound.status_code == 200, bound.text
    assert _leaks(bound.json()["answer_schema"]) == []
    record = await stored(bus, request_id)
    assert record is not None
    assert (record.status, record.answer) == (HumanRequestState.ANSWERED, TextAnswer(value=answer))


async def test_a_form_an_older_version_stored_unredacted_is_shown_redacted(bus: Bus, client: httpx.AsyncClient) -> None:
    # stored as a version before form redaction stored it: the record holds the secrets
    event = requested(answer_schema=FORM, options=[DECLINE])
    payload = event.payload(HumanRequested)
    store = await open_store(bus)
    await store.create(payload.request_id, HumanRequestRecord.from_requested(event, payload, []))
    raw = await stored(bus, payload.request_id)
    assert raw is not None
    assert raw.answer_schema is not None
    assert _leaks(raw.answer_schema) != []

    one = await client.get(f"/requests/{payload.request_id}", headers=ALICE)
    assert one.status_code == 200, one.text
    assert _leaks(one.json()) == [], one.json()["answer_schema"]
    _machine_values_kept(one.json()["answer_schema"])


def test_the_run_executor_publishes_the_form_redacted() -> None:
    published = Redactor().human_requested(requested(answer_schema=FORM).payload(HumanRequested))
    assert published.answer_schema is not None
    assert _leaks(published.answer_schema) == []
    _machine_values_kept(published.answer_schema)
    assert published.answer_schema["properties"]["region"]["enumNames"] == [
        "Europe ([REDACTED:aws_access_key_id])",
        "United States",
    ]
    # a field named like a keyword is a name, not a text; values that are not text stay as they are
    odd = {"type": "object", "properties": {"title": {"type": "integer", "default": 3, "title": GITHUB}}}
    plain = requested(answer_schema=odd).payload(HumanRequested)
    assert Redactor().human_requested(plain).answer_schema == {
        "type": "object",
        "properties": {"title": {"type": "integer", "default": 3, "title": "[REDACTED:github_token]"}},
    }
    assert Redactor().human_requested(requested().payload(HumanRequested)).answer_schema is None


#: A form asking to pick among secrets: by a field's name (as ``DB_PASSWORD=…`` in a text), by its schema
#: (``format: password``, ``writeOnly``), and a value a pattern finds on its own in an ordinary field.
SECRET_VALUES = ("hunter2-prod", "correct-horse-staging", "4711-pin", "vault-root-s3cr3t")
SECRET_FIELDS_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "db_password": {"type": "string", "enum": ["hunter2-prod", "correct-horse-staging"], "default": "hunter2-prod"},
        "pin": {"type": "string", "format": "password", "oneOf": [{"const": "4711-pin", "title": "the usual one"}]},
        "unlock": {"type": "string", "writeOnly": True, "examples": ["vault-root-s3cr3t"]},
        "deploy_with": {"type": "string", "enum": ["eu", GITHUB]},
        "replicas": {"type": "integer", "enum": [1, 3]},
    },
}


def _secret_leaks(value: Any) -> list[str]:
    text = json.dumps(value)
    return [secret for secret in (*SECRET_VALUES, GITHUB) if secret in text]


def test_the_values_of_a_secret_field_are_redacted_and_other_machine_values_stay() -> None:
    published = Redactor().human_requested(requested(answer_schema=SECRET_FIELDS_FORM).payload(HumanRequested))
    schema = published.answer_schema
    assert schema is not None
    assert _secret_leaks(schema) == []
    props = schema["properties"]
    marker = "[REDACTED:secret_assignment]"
    assert props["db_password"]["enum"] == [marker, marker]
    assert props["db_password"]["default"] == marker
    assert props["pin"]["oneOf"] == [{"const": marker, "title": "the usual one"}]
    assert props["unlock"]["examples"] == [marker]
    assert props["deploy_with"]["enum"] == ["eu", "[REDACTED:github_token]"]  # found by its pattern
    assert props["replicas"]["enum"] == [1, 3]  # not text, not a secret field: kept
    assert list(props) == list(SECRET_FIELDS_FORM["properties"])  # field names stay
    # redacting again (human-interaction, after the run-executor) changes nothing
    again = Redactor().human_requested(published)
    assert again.answer_schema == schema


async def test_a_redacted_value_cannot_be_chosen_and_the_inbox_never_shows_a_secret_field_s_values(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    event = requested(answer_schema=SECRET_FIELDS_FORM, options=[DECLINE])
    await handler.handle(event)
    request_id = str(event.data["request_id"])
    record = await stored(bus, request_id)
    assert record is not None
    assert record.answer_schema is not None
    assert _secret_leaks(record.answer_schema) == []  # never stored
    assert record.redactions.get("secret_assignment", 0) >= 4
    one = await client.get(f"/requests/{request_id}", headers=ALICE)
    assert one.status_code == 200, one.text
    assert _secret_leaks(one.json()) == []
    fields = {f["name"]: f for f in one.json()["form"]}
    assert [c["value"] for c in fields["db_password"]["choices"]] == ["[REDACTED:secret_assignment]"] * 2

    # choosing what the person was shown in place of a secret is refused, saying why; nothing is bound
    pick = json.dumps({"db_password": "[REDACTED:secret_assignment]"})
    refused = await client.post(f"/requests/{request_id}/answer", json={"text": pick}, headers=ALICE)
    assert refused.status_code == 422, refused.text
    assert "'db_password'" in refused.json()["detail"]
    assert "redacted" in refused.json()["detail"]
    pending = await stored(bus, request_id)
    assert pending is not None
    assert pending.status is HumanRequestState.PENDING
    # the rest of the form still takes an answer
    fine = await client.post(
        f"/requests/{request_id}/answer", json={"text": json.dumps({"deploy_with": "eu"})}, headers=ALICE
    )
    assert fine.status_code == 200, fine.text
