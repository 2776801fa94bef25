"""Channel plumbing without a transport: which adapters start from the settings, the rendered question, the
channel bindings in KV, and identities in the directory."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from human_support import OPTIONS
from pydantic import ValidationError

from temporality_bus import Bus
from temporality_human_interaction.__main__ import build_adapters, check_channel_settings
from temporality_human_interaction.answers import InvalidAnswer, NotRecipient, refusal_for
from temporality_human_interaction.channels.lease import lease_key
from temporality_human_interaction.channels.matrix import MatrixAdapter, option_for_reaction
from temporality_human_interaction.channels.refs import ChannelRefs, ref_key
from temporality_human_interaction.channels.render import (
    TELEGRAM_TEXT_LIMIT,
    clip_message,
    fitted,
    option_named,
    outcome_text,
    question_html,
    question_text,
    refusal_text,
    telegram_size,
)
from temporality_human_interaction.channels.telegram import TelegramAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.egress import DEFAULT_POLICY
from temporality_human_interaction.records import HumanRequestRecord, SentCopy
from temporality_human_interaction.settings import Settings
from temporality_protocol import (
    Escalate,
    HumanOption,
    HumanPolicy,
    HumanRequestState,
    OptionAnswer,
    SourceLink,
    TextAnswer,
    TimeoutPolicy,
)
from temporality_protocol.events import DeliveryAttempt
from temporality_service import ConfigError


def _record(**changes: object) -> HumanRequestRecord:
    base = HumanRequestRecord(
        request_id="hreq-1",
        run_id="run-1",
        agent="reviewer",
        title="PR #1842 in repo X",
        recipient="user:alice",
        question="Keep v1 <for now>?",
        context="x" * 2000,
        options=OPTIONS,
        created_at=datetime(2026, 12, 1, 12, 0, tzinfo=UTC),
        expires_at=datetime(2026, 12, 1, 14, 30, tzinfo=UTC),
        policy=HumanPolicy(on_timeout=TimeoutPolicy(action="default", default_option="keep-v1")),
    )
    return base.model_copy(update=changes)


def test_only_configured_chat_adapters_start(bus: Bus) -> None:
    assert [a.name for a in build_adapters(Settings(), bus)] == ["web"]
    both = Settings(
        telegram_token="123:abc",  # type: ignore[arg-type]
        matrix_homeserver="http://127.0.0.1:1",
        matrix_user_id="@bot:localhost",
        matrix_access_token="tok",  # type: ignore[arg-type]
    )
    adapters = build_adapters(both, bus)
    assert [a.name for a in adapters] == ["web", "telegram", "matrix"]
    assert isinstance(adapters[1], TelegramAdapter)
    assert isinstance(adapters[2], MatrixAdapter)
    assert "123:abc" not in repr(both)  # secrets are SecretStr: never in a log line
    # issue 11: each chat adapter's inbound side is leased per account (one replica polls / syncs it)
    assert adapters[1]._lease is not None
    assert adapters[1]._lease.key == "lease.telegram.123"
    assert adapters[2]._lease is not None
    assert adapters[2]._lease.key == lease_key("matrix", "@bot:localhost")
    assert adapters[2]._lease.key.startswith("lease.matrix.")
    assert (adapters[1]._lease.ttl_s, adapters[1]._lease.renew_s) == (15.0, 3.0)


def test_a_lease_renewed_too_rarely_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="under half of channel_lease_ttl_s"):
        Settings(channel_lease_ttl_s=4, channel_lease_renew_s=2)


@pytest.mark.parametrize(
    "env",
    [
        {"matrix_homeserver": "http://hs"},
        {"matrix_homeserver": "http://hs", "matrix_user_id": "@bot:hs"},
    ],
)
def test_a_half_configured_matrix_is_a_config_error(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="TEMPORALITY_HUMAN_MATRIX_"):
        check_channel_settings(Settings(**env))  # type: ignore[arg-type]


def test_the_question_is_compact_and_says_what_happens_without_an_answer() -> None:
    record, truncated = DEFAULT_POLICY.for_channel(_record(), "telegram")  # as the adapter renders it (egress)
    text = question_text(record)
    assert text.startswith("❓ PR #1842 in repo X")
    assert "x" * 900 not in text  # long context is cut to the channel's limit (800), with a marker
    assert "more characters)" in text
    assert truncated == ["context"]
    assert "2. Drop v1 — The review approves the removal" in text
    assert "No answer by 2026-12-01 14:30 UTC → I go with “Keep the v1 API”." in text
    html = question_html(record)
    assert "Keep v1 &lt;for now&gt;?" in html  # escaped
    answered = _record(
        status=HumanRequestState.ANSWERED,
        answer=OptionAnswer(option_id="drop-v1", label="Drop v1"),
        responder="user:alice",
        answered_at=datetime(2026, 12, 1, 13, 5, tzinfo=UTC),
    )
    assert outcome_text(answered, responder_name="Alice") == "✅ Answered by Alice: “Drop v1” 13:05 UTC"
    assert outcome_text(_record(status=HumanRequestState.EXPIRED)) == (
        "⌛ Expired at 2026-12-01 14:30 UTC without an answer — the run went ahead with the default: “Keep the v1 API”."
    )
    assert "🤖 reviewer (agent) asks:\nKeep v1 <for now>?" in text  # who asks
    assert "🤖 reviewer (agent) asks: Keep v1 &lt;for now&gt;?" in html


def test_the_expired_outcome_says_what_the_run_did() -> None:
    expired = {"status": HumanRequestState.EXPIRED}
    cancel = HumanPolicy(on_timeout=TimeoutPolicy(action="cancel"))
    assert outcome_text(_record(**expired, policy=cancel)).endswith("without an answer — the run was cancelled.")
    fail = HumanPolicy(on_timeout=TimeoutPolicy(action="fail", escalate=Escalate(to="user:bob", after_s=60)))
    escalated = _record(**expired, policy=fail, escalated_to="user:bob")
    assert outcome_text(escalated).endswith("— the run stopped without an answer (it had been escalated to user:bob).")


def test_chat_refusals_are_said_for_people_and_the_api_detail_stays() -> None:
    answered = _record(
        status=HumanRequestState.ANSWERED,
        answer=OptionAnswer(option_id="drop-v1", label="Drop v1"),
        responder="user:alice",
        responder_name="Alice Example",
        answered_at=datetime(2026, 12, 1, 5, 10, 30, 123456, tzinfo=UTC),
    )
    refused = refusal_for(answered)
    assert refused.detail.startswith("already answered by Alice Example (user:alice) at 2026-12-01T05:10:30.123456")
    assert refusal_text(refused, "user:alice") == (
        "Not recorded: you already answered “PR #1842 in repo X”: “Drop v1”, at 2026-12-01 05:10 UTC."
    )
    assert refusal_text(refused, "user:bob") == (
        "Not recorded: “PR #1842 in repo X” was already answered by Alice Example: “Drop v1”, at 2026-12-01 05:10 UTC."
    )
    text = _record(**{**answered.model_dump(), "answer": TextAnswer(value="y" * 500)})
    assert "“" + "y" * 199 + "…”" in refusal_text(refusal_for(text), "user:alice")  # a long answer is quoted cut
    expired = refusal_for(_record(status=HumanRequestState.EXPIRED))
    assert refusal_text(expired, "user:alice") == (
        "Not recorded: expired at 2026-12-01 14:30 UTC without an answer — "
        "the run went ahead with the default: “Keep the v1 API”."
    )
    cancelled = refusal_for(_record(status=HumanRequestState.CANCELLED))
    assert refusal_text(cancelled) == (
        "Not recorded: the request is cancelled, “PR #1842 in repo X” no longer needs an answer."
    )
    assert refusal_text(NotRecipient("only the recipient may answer")) == (
        "Not recorded: only the recipient may answer."
    )
    assert refusal_text(InvalidAnswer("this request takes one of its options, not free text")).endswith("free text.")


def test_a_question_over_the_limit_is_cut_least_important_first_options_and_how_to_answer_kept() -> None:
    options = [HumanOption(id=f"o{n}", label=f"Option {n}", consequence="c" * 700) for n in range(1, 11)]
    link = SourceLink(href="https://git.example.org/pr/42", label="PR 42")
    record = _record(options=options, context="x" * 800, question="q" * 300, source_link=link)

    def render(r: HumanRequestRecord, note: str | None) -> str:
        return question_text(r, hint="tap an option below", note=note)

    assert telegram_size(render(record, None)) > TELEGRAM_TEXT_LIMIT
    text = fitted(record, render, telegram_size, TELEGRAM_TEXT_LIMIT, inbox_url="https://t.example/#/inbox")
    assert telegram_size(text) <= TELEGRAM_TEXT_LIMIT
    assert "x" * 10 not in text  # the context went first, whole
    assert "q" * 300 in text  # the question stays while cutting the consequences suffices
    assert "https://git.example.org/pr/42" in text
    for n in range(1, 11):
        assert f"\n{n}. Option {n} — ccc" in text  # every option, each consequence cut to the same length
    assert text.count("c…\n") == 10
    assert "…(cut; full question in the inbox: https://t.example/#/inbox)" in text
    assert (
        "To answer: tap an option below, or reply to this message with your own answer (while it is your only open"
        in text
    )

    small = fitted(_record(), render, telegram_size, TELEGRAM_TEXT_LIMIT)
    assert small == render(_record(), None)  # what fits is not touched: no note

    many = _record(options=[HumanOption(id=f"o{n}", label="L" * 200) for n in range(60)], context="")
    cut = fitted(many, render, telegram_size, TELEGRAM_TEXT_LIMIT)  # only the labels are left to cut
    assert telegram_size(cut) <= TELEGRAM_TEXT_LIMIT
    assert "\n60. LLL" in cut
    assert "…(cut to fit this chat's message limit)" in cut

    html = fitted(record, lambda r, note: question_html(r, note=note), len, 3000)
    assert len(html) <= 3000
    assert html.count("<li>") == 10


def test_clip_message_counts_utf16_units() -> None:
    assert clip_message("ok", 200) == "ok"
    cut = clip_message("😀" * 150, 200)  # 300 UTF-16 units
    assert telegram_size(cut) <= 200
    assert cut.endswith("…")


def test_options_are_named_by_number_id_label_or_keycap() -> None:
    record = _record()
    assert option_named(record, " 2. ") == OPTIONS[1]
    assert option_named(record, "KEEP-V1") == OPTIONS[0]
    assert option_named(record, "drop v1") == OPTIONS[1]
    assert option_named(record, "3") is None
    assert option_named(record, "maybe later") is None
    assert option_for_reaction(OPTIONS, "2️⃣") == OPTIONS[1]
    assert option_for_reaction(OPTIONS, "👍") is None
    # digits int() refuses are no number (they raised ValueError in the channel's handler)
    for odd in ("\u00b2", "\u2460", "9" * 5000):
        assert option_named(record, odd) is None, odd
        assert option_for_reaction(OPTIONS, odd) is None, odd


async def test_channel_refs_claim_once_and_hash_unsafe_key_parts(bus: Bus) -> None:
    refs = ChannelRefs(bus)
    key = ref_key("matrix", "event", "$abc:example.org")
    assert key.startswith("matrix.event.")
    assert "$" not in key
    assert ref_key("telegram", "msg", 1001, 7) == "telegram.msg.1001.7"
    assert await refs.claim(key, "hreq-1") == "hreq-1"
    assert await refs.claim(key, "hreq-2") == "hreq-1"  # a second writer gets the first value
    assert await refs.get(key) == "hreq-1"
    assert await refs.get(ref_key("nothing")) is None


def test_identities_map_to_people() -> None:
    directory = Directory.from_mapping(
        {
            "users": {
                "alice": {
                    "display_name": "Alice",
                    "preferred": "matrix",
                    "fallback": ["telegram"],
                    "channels": {"matrix": {"user_id": "@alice:hs"}, "telegram": {"chat_id": 42}},
                }
            }
        }
    )
    assert directory.user_for_identity("matrix", "@alice:hs") == "alice"
    assert directory.user_for_identity("telegram", "42") == "alice"
    assert directory.user_for_identity("web", "alice") == "alice"
    assert directory.user_for_identity("matrix", "@mallory:hs") is None
    assert directory.user_for_identity("telegram", "43") is None


def test_sent_copies_and_failed_attempts_survive_the_kv_round_trip() -> None:
    record = _record(
        deliveries=[SentCopy(channel="telegram", reference="7", address="1001", sent_at=datetime.now(UTC))],
        failed_deliveries=[DeliveryAttempt(channel="matrix", error="cannot open a DM")],
    )
    back = HumanRequestRecord.model_validate_json(record.model_dump_json())
    assert back == record
    assert back.copy_on("telegram") == record.deliveries[0]
    assert back.copy_on("matrix") is None
    old = HumanRequestRecord.model_validate_json(_record().model_dump_json(exclude={"deliveries", "failed_deliveries"}))
    assert old.deliveries == []  # a record written before these fields existed still loads
