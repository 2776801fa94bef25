"""The question links to its source (HUM-5): the run's ``source_link`` (the PR's web page, from the launch
event) is shown on every channel -- the web inbox JSON, Telegram's text (through the Bot API emulator),
Matrix's body and ``formatted_body`` (a real Synapse) -- and never past the channel's egress limits: a link
too long for a channel is left out there, one holding a secret is dropped when the request is stored."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from human_support import ALICE, TG_ALICE, events_of, requested, stored
from matrix_support import MatrixPerson, alice_on_matrix

from temporality_bus import Bus
from temporality_human_interaction.api import create_app
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.channels.render import question_html, question_text
from temporality_human_interaction.channels.telegram import TelegramAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.egress import EgressPolicy
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.records import HumanRequestRecord
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.settings import Settings
from temporality_protocol import Envelope, HumanNotified, HumanRequested, SourceLink, decode, encode, make_event
from temporality_testing.synapse import MatrixAccount, Synapse
from temporality_testing.telegram_emulator import TelegramEmulator

PR = SourceLink(href="https://dev.azure.com/fabrikam/Fabrikam/_git/orders-service/pullrequest/42", label="PR #42")
POLICY = EgressPolicy.build(limits={"telegram": 120})


def _asking(link: SourceLink | None = PR, **kw: object) -> Envelope:
    event = requested(**kw)  # type: ignore[arg-type]
    payload = event.payload(HumanRequested).model_copy(update={"source_link": link})
    return make_event(payload, source="/temporality/run-executor", run_id=payload.run_id, id=event.id)


def _record(link: SourceLink | None) -> HumanRequestRecord:
    event = _asking(link)
    return HumanRequestRecord.from_requested(event, event.payload(HumanRequested))


# ------------------------------------------------------------------------------------------- protocol, egress
def test_a_human_requested_from_before_the_field_still_parses_without_a_link() -> None:
    wire = json.loads(encode(_asking(None)))
    wire["data"].pop("source_link", None)
    old = decode(json.dumps(wire).encode())
    assert old.payload(HumanRequested).source_link is None
    assert HumanRequestRecord.from_requested(old, old.payload(HumanRequested)).source_link is None
    stored_before = _record(PR).model_dump(mode="json")
    stored_before.pop("source_link")
    assert HumanRequestRecord.model_validate(stored_before).source_link is None


@pytest.mark.parametrize(
    "href",
    [
        "javascript:alert(1)",
        "ftp://files.example/x",
        "https://user:pw@git.example/pr/1",
        "https://ex ample.org/a",
        "/x",
    ],
)
def test_only_http_links_without_credentials_are_source_links(href: str) -> None:
    with pytest.raises(ValueError, match="http"):
        SourceLink(href=href)


def test_the_link_is_kept_within_each_channel_s_limit() -> None:
    long = SourceLink(href="https://git.example/pr/1?" + "x" * 200, label="PR #1")
    record = POLICY.redact_record(_record(long))
    on_telegram, cut = POLICY.for_channel(record, "telegram")
    assert on_telegram.source_link is None  # 225 characters > 120: a cut URL opens nothing, so it is left out
    assert cut == ["source_link"]
    on_web, cut = POLICY.for_channel(record, "web")
    assert on_web.source_link == long
    assert cut == []

    wordy = SourceLink(href="https://git.example/pr/1", label="PR #1 " + "in a long repository name " * 7)
    on_telegram, cut = POLICY.for_channel(POLICY.redact_record(_record(wordy)), "telegram")
    assert on_telegram.source_link is not None
    assert on_telegram.source_link.href == wordy.href
    assert on_telegram.source_link.label is not None
    assert on_telegram.source_link.label.endswith("more characters)")
    assert cut == ["source_link"]


def test_a_link_holding_a_secret_is_dropped_when_the_request_is_stored() -> None:
    leaky = SourceLink(href="https://ci.example/build/7?access_token=s3cr3tvalue1234", label="Build 7")
    record = POLICY.redact_record(_record(leaky))
    assert record.source_link is None
    assert record.redactions == {"secret_assignment": 1}
    assert "s3cr3tvalue1234" not in record.model_dump_json()


def test_both_renderings_carry_the_link() -> None:
    record = _record(SourceLink(href="https://git.example/pr/1?a=1&b=<2>", label="PR #1 <in> repo"))
    text = question_text(record)
    assert "🔗 PR #1 <in> repo: https://git.example/pr/1?a=1&b=<2>" in text
    assert '<p>🔗 <a href="https://git.example/pr/1?a=1&amp;b=&lt;2&gt;">PR #1 &lt;in&gt; repo</a></p>' in (
        question_html(record)
    )
    assert "🔗" not in question_text(_record(None))


# ------------------------------------------------------------------------------------------- web inbox
async def test_the_web_inbox_shows_the_link(bus: Bus, directory: Directory) -> None:
    async with WebInboxAdapter() as web:
        event = _asking()
        await RequestHandler(bus, directory, {web.name: web}).handle(event)
    request_id = str(event.data["request_id"])
    record = await stored(bus, request_id)
    assert record is not None
    assert record.source_link == PR
    app = create_app(Settings(bus_timeout_s=2.0), bus, directory)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://human.test") as client:
        inbox = await client.get("/inbox", headers=ALICE)
        one = await client.get(f"/requests/{request_id}", headers=ALICE)
    [item] = [r for r in inbox.json()["requests"] if r["id"] == request_id]
    assert item["source_link"] == {"href": PR.href, "label": "PR #42"}
    assert one.json()["source_link"] == {"href": PR.href, "label": "PR #42"}


# ------------------------------------------------------------------------------------------- Telegram
async def test_telegram_shows_the_link_or_leaves_it_out_past_its_limit(bus: Bus) -> None:
    directory = Directory.from_mapping(
        {
            "users": {
                "alice": {
                    "display_name": "Alice Example",
                    "preferred": "telegram",
                    "channels": {"telegram": {"chat_id": TG_ALICE.id}},
                }
            }
        }
    )
    async with TelegramEmulator().serve() as tg:
        adapters: dict[str, ChannelAdapter] = {}
        bot = TelegramAdapter(bus, token=tg.token, base_url=tg.base_url, poll_timeout_s=1)
        bot.attach(AnswerRouter(bus, directory, adapters))
        bot.egress = POLICY
        async with bot:
            adapters[bot.name] = bot
            handler = RequestHandler(bus, directory, adapters, egress=POLICY)
            await handler.handle(_asking(allowed=("user:alice",)))
            message = await tg.wait_for_message(TG_ALICE.id)
            assert f"🔗 PR #42: {PR.href}" in message["text"]

            too_long = SourceLink(href="https://git.example/pr/2?" + "q" * 150, label="PR #2")
            await handler.handle(_asking(too_long, allowed=("user:alice",)))
            second = await tg.wait_for_message(TG_ALICE.id, lambda m: m["message_id"] != message["message_id"])
            assert "🔗" not in second["text"]
            assert "q" * 150 not in json.dumps(list(tg.messages.values()))
    notified = [e.payload(HumanNotified) for e in await events_of(bus, "human.notified", wait_for=2)]
    assert sorted(n.truncated for n in notified) == [[], ["source_link"]]


# ------------------------------------------------------------------------------------------- Matrix
@pytest.fixture
async def matrix_bot(
    bus: Bus, synapse: Synapse, matrix_accounts: dict[str, MatrixAccount]
) -> AsyncIterator[RequestHandler]:
    async with alice_on_matrix(bus, synapse, matrix_accounts) as handler:
        yield handler


async def test_matrix_shows_the_link_in_the_body_and_as_an_anchor(
    bus: Bus, matrix_bot: RequestHandler, synapse: Synapse, matrix_accounts: dict[str, MatrixAccount]
) -> None:
    alice = await MatrixPerson(synapse.url, matrix_accounts["alice"]).start()
    try:
        event = _asking(allowed=("user:alice",))
        payload = event.payload(HumanRequested).model_copy(update={"title": "Link to PR 42"})
        await matrix_bot.handle(make_event(payload, source="/temporality/run-executor", run_id=payload.run_id))
        _, question = await alice.wait_for_question(matrix_accounts["bot"].user_id, "Link to PR 42")
    finally:
        await alice.close()
    content = question["content"]
    assert f"🔗 PR #42: {PR.href}" in content["body"]
    assert f'<a href="{PR.href}">PR #42</a>' in content["formatted_body"]
