"""A request with a form (``answer_schema``: an MCP elicitation's requested schema) takes only an answer that
fits it: human-interaction reads it as the run-executor will (``temporality_protocol.forms``) and refuses a
misfit at the channel -- 422 with the field and what is wrong on the inbox API -- before anything is bound or
announced; the person can then answer again. (Telegram: ``test_human_telegram.py``.)"""

from __future__ import annotations

from typing import Any

import httpx
from directory_support import VIEWER
from human_support import ALICE, events_of, requested, stored

from temporality_bus import Bus
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import HumanOption, HumanRequestState, OptionAnswer, TextAnswer

#: Two typed fields, as a tool's elicitation asks them.
FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "description": "How many replicas"},
        "region": {"type": "string", "enum": ["eu", "us"]},
    },
    "required": ["replicas", "region"],
}
DECLINE = HumanOption(id="decline", label="Decline", consequence="the tool is told you declined")
#: One closed field: asked as options (the run-executor renders yes / no / decline).
APPROVAL: dict[str, Any] = {"type": "object", "properties": {"approve": {"type": "boolean"}}, "required": ["approve"]}


async def _answer(client: httpx.AsyncClient, request_id: str, body: dict[str, str]) -> httpx.Response:
    return await client.post(f"/requests/{request_id}/answer", json=body, headers=ALICE)


async def test_a_misfit_answer_is_refused_with_the_field_and_a_fitting_one_binds(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    event = requested(answer_schema=FORM, options=[DECLINE])
    await handler.handle(event)
    request_id = str(event.data["request_id"])

    for text, field, words in (
        ("replicas: many\nregion: eu", "replicas", "is not of type 'integer'"),
        ("replicas: 30\nregion: eu", "replicas", "is greater than the maximum of 10"),
        ("replicas: 3\nregion: mars", "region", "is not one of ['eu', 'us']"),
        ("replicas: 3", "", "'region' is a required property"),
        ("colour: blue", "", "is not a line 'name: value' for a field of the form"),
        ('{"replicas": 3, "region": ', "", "it looks like JSON but is not"),
    ):
        refused = await _answer(client, request_id, {"text": text})
        assert refused.status_code == 422, (text, refused.text)
        body = refused.json()
        assert body["error"] == "invalid_answer"
        assert body["detail"].startswith("the answer does not fit the form: "), body
        assert words in body["detail"], (text, body)
        if field:
            assert f"field {field!r}" in body["detail"], body
    record = await stored(bus, request_id)
    assert record is not None
    assert record.status is HumanRequestState.PENDING  # nothing bound, nothing recorded
    assert record.late_answers == []
    assert await events_of(bus, "human.answered") == []
    assert await events_of(bus, "human.answer_refused") == []  # a misfit is the person's to retry

    accepted = await _answer(client, request_id, {"text": "replicas: 3\nregion: eu"})
    assert accepted.status_code == 200, accepted.text
    record = await stored(bus, request_id)
    assert record is not None
    assert record.answer == TextAnswer(value="replicas: 3\nregion: eu")
    [answered] = await events_of(bus, "human.answered")
    assert answered.data["answer"] == {"type": "text", "value": "replicas: 3\nregion: eu"}


async def test_declining_and_options_of_a_closed_form_fit_and_a_form_less_request_takes_any_text(
    bus: Bus, client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    declined = requested(answer_schema=FORM, options=[DECLINE])
    options = [HumanOption(id="yes", label="Yes"), HumanOption(id="no", label="No"), DECLINE]
    approval = requested(answer_schema=APPROVAL, options=options, allow_free_text=False)
    plain = requested()  # no form: free text is free
    for event in (declined, approval, plain):
        await handler.handle(event)
    ids = [str(e.data["request_id"]) for e in (declined, approval, plain)]

    assert (await _answer(client, ids[0], {"option_id": "decline"})).status_code == 200
    assert (await _answer(client, ids[1], {"option_id": "no"})).status_code == 200
    assert (await _answer(client, ids[2], {"text": "replicas: many"})).status_code == 200
    answers = [(await stored(bus, i)) for i in ids]
    assert [a.answer if a is not None else None for a in answers] == [
        OptionAnswer(option_id="decline", label="Decline"),
        OptionAnswer(option_id="no", label="No"),
        TextAnswer(value="replicas: many"),
    ]


async def test_the_inbox_shows_the_form_a_request_asks_for_and_the_openapi_document_declares_it(
    client: httpx.AsyncClient, handler: RequestHandler
) -> None:
    form, plain = requested(answer_schema=FORM, options=[DECLINE]), requested()
    for event in (form, plain):
        await handler.handle(event)
    form_id, plain_id = str(form.data["request_id"]), str(plain.data["request_id"])
    listed = await client.get("/inbox", headers=ALICE)
    assert listed.status_code == 200, listed.text
    items = {item["id"]: item for item in listed.json()["requests"]}
    assert items[form_id]["answer_schema"] == FORM
    assert items[form_id]["form"] == [
        {
            "name": "replicas",
            "type": "integer",
            "required": True,
            "title": None,
            "description": "How many replicas",
            "choices": None,
        },
        {
            "name": "region",
            "type": "string",
            "required": True,
            "title": None,
            "description": None,
            "choices": [{"value": "eu", "label": "eu"}, {"value": "us", "label": "us"}],
        },
    ]
    assert (items[plain_id]["answer_schema"], items[plain_id]["form"]) == (None, [])
    one = await client.get(f"/requests/{form_id}", headers=ALICE)
    assert one.status_code == 200, one.text
    assert one.json()["form"] == items[form_id]["form"]

    approval = requested(answer_schema=APPROVAL)
    await handler.handle(approval)
    shown = (await client.get(f"/requests/{approval.data['request_id']}", headers=ALICE)).json()
    assert shown["form"][0]["choices"] == [{"value": True, "label": "Yes"}, {"value": False, "label": "No"}]

    document = (await client.get("/openapi.json", headers=VIEWER)).json()
    schemas = document["components"]["schemas"]
    assert {"answer_schema", "form"} <= set(schemas["InboxItem"]["properties"])
    assert {"answer_schema", "form"} <= set(schemas["RequestView"]["properties"])
    assert {"name", "type", "required", "title", "description", "choices"} == set(schemas["FormField"]["properties"])
