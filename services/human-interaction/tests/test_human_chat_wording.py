"""What a chat says and how it reads what a person typed, as pure functions (HUM-4, HUM-5): the option a message
names however it is typed, the refusal of a number that is no option, the confirmation's wording, the way to
answer, the run reference, a long question's head and tail, and the inbox's ``expired`` detail."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from temporality_human_interaction.answers import refusal_for
from temporality_human_interaction.channels.matrix import _HINT as MATRIX_HINT
from temporality_human_interaction.channels.render import (
    NoSuchOption,
    fitted,
    no_such_option_text,
    option_choice,
    question_name,
    question_text,
    recorded_as,
)
from temporality_human_interaction.egress import EgressPolicy, truncate_middle, was_truncated
from temporality_human_interaction.records import HumanRequestRecord
from temporality_protocol import HumanOption, HumanPolicy, HumanRequestState, TimeoutPolicy

OPTIONS = [
    HumanOption(id="keep-v1", label="Keep the v1 contract", consequence="v1 stays"),
    HumanOption(id="ship-v2", label="Ship it as a breaking v2"),
]


def _record(**changes: object) -> HumanRequestRecord:
    base = HumanRequestRecord(
        request_id="hreq-1",
        run_id="run-0f3bcc17970854cf4f26b2d6",
        agent="reviewer",
        title="Review PR #101",
        recipient="user:alice",
        question="Keep v1?",
        options=OPTIONS,
        created_at=datetime(2026, 12, 1, 12, 0, tzinfo=UTC),
        expires_at=datetime(2026, 12, 1, 14, 30, tzinfo=UTC),
        policy=HumanPolicy(on_timeout=TimeoutPolicy(action="default", default_option="keep-v1")),
    )
    return base.model_copy(update=changes)


@pytest.mark.parametrize(
    "typed",
    ["1", " 1. ", "1)", "(1)", "#1", "# 1", "1️⃣", "1\u20e3", "\uff11", "\uff03\uff11", "option 1", "Option #1",
     "opt 1", "choice 1", "keep-v1", "keep the v1 contract!", "  KEEP the   v1 contract.  ", "“Keep the v1 contract”"],
)  # fmt: skip
def test_an_option_is_named_however_people_type_it(typed: str) -> None:
    assert option_choice(_record(), typed) == OPTIONS[0]


@pytest.mark.parametrize("typed", ["2", "2️⃣", "ship it as a breaking v2", "option 2!"])
def test_the_second_option_likewise(typed: str) -> None:
    assert option_choice(_record(), typed) == OPTIONS[1]


@pytest.mark.parametrize(
    "typed",
    ["keep it for now", "1 more release please", "yes", "I meant 1, but keep the docs", "\u00b2", "\u2460", "9" * 5000],
)
def test_anything_else_is_free_text(typed: str) -> None:
    assert option_choice(_record(), typed) is None


def test_a_number_that_is_no_option_is_refused_with_the_options_and_how_to_answer_in_words() -> None:
    record = _record()
    for typed, number in (("3", 3), ("0", 0), ("option 7", 7), ("3️⃣", 3), ("\uff13", 3)):
        assert option_choice(record, typed) == NoSuchOption(number, 2), typed
    assert no_such_option_text(record, NoSuchOption(3, 2)) == (
        "Not recorded: there is no option 3 for “Review PR #101”; its options are 1\u20132."
        " To answer in your own words, write more than a number."
    )
    no_words = record.model_copy(update={"allow_free_text": False, "options": OPTIONS[:1]})
    assert no_such_option_text(no_words, NoSuchOption(2, 1)) == (
        "Not recorded: there is no option 2 for “Review PR #101”; its only option is 1."
    )
    assert option_choice(record.model_copy(update={"options": []}), "3") is None  # free text only: words
    form = {"type": "object", "properties": {"replicas": {"type": "integer"}}}
    assert option_choice(record.model_copy(update={"answer_schema": form}), "3") is None  # the form reads it


REPLICAS = [HumanOption(id="r3", label="3"), HumanOption(id="r5", label="5")]


def test_options_labelled_with_numbers_are_named_by_their_labels_first() -> None:
    """A question "how many replicas?" with options "3" and "5": "5" is the option labelled 5 (not a refusal: there is no
    option 5 by position); a number that is no label is a position ("1": option 1, "3"), and one that is neither is
    refused, the refusal saying the labels too."""
    record = _record(options=REPLICAS, title="Deploy 8: how many replicas")
    for typed in ("5", " 5. ", "5️⃣", "\uff15", "r5", "R5"):
        assert option_choice(record, typed) == REPLICAS[1], typed
    assert option_choice(record, "3") == REPLICAS[0]
    assert option_choice(record, "1") == REPLICAS[0]  # no label "1": the first option
    assert option_choice(record, "2") == REPLICAS[1]
    assert option_choice(record, "option 5") == NoSuchOption(5, 2)  # "option 5" is a position, and there is none
    assert option_choice(record, "7") == NoSuchOption(7, 2)
    assert no_such_option_text(record, NoSuchOption(7, 2)) == (
        "Not recorded: there is no option 7 for “Deploy 8: how many replicas”; its options are 1\u20132"
        " (or by label: “3”, “5”). To answer in your own words, write more than a number."
    )
    # a label that is another option's number: the label wins ("1" is the option labelled 1, which is option 2)
    swapped = [HumanOption(id="a", label="2"), HumanOption(id="b", label="1")]
    record = _record(options=swapped)
    assert option_choice(record, "1") == swapped[1]
    assert option_choice(record, "2") == swapped[0]
    assert option_choice(record, "option 1") == swapped[0]  # "option <n>" names no label: the position
    # an id that is a number names its option too
    ids = [HumanOption(id="10", label="ten"), HumanOption(id="20", label="twenty")]
    assert option_choice(_record(options=ids), "20") == ids[1]


def test_the_confirmation_says_how_the_answer_was_taken() -> None:
    record = _record()
    assert recorded_as(record, OPTIONS[1], "2") == "as option 2 “Ship it as a breaking v2”"
    assert recorded_as(record, None, "keep it for now") == "in your own words: “keep it for now”"
    long = recorded_as(record, None, "word " * 100)
    assert long.startswith("in your own words: “word word")
    assert long.endswith("…”")
    assert len(long) < 160


def test_the_way_to_answer_reads_once_and_names_the_run() -> None:
    text = question_text(_record(), hint="tap an option below")
    assert "To answer: tap an option below, or reply to this message with your own answer (while it is your only" in (
        text
    )
    assert text.endswith("\n(run 0f3bcc17)")
    matrix = question_text(_record(), hint=MATRIX_HINT)
    assert matrix.count("reply to this message") == 1
    assert "or reply to this message with the number or your own answer" in matrix
    assert question_name(_record(), with_run=True) == "“Review PR #101” (run 0f3bcc17)"


def test_a_long_question_keeps_its_head_and_its_tail() -> None:
    asked = "Background. " + "x" * 3000 + " So: keep v1?"
    cut, truncated = truncate_middle(asked, 800)
    assert truncated
    assert cut.startswith("Background. x")
    assert cut.endswith("x So: keep v1?")
    assert "… (truncated, 2,225 characters left out) …" in cut
    assert truncate_middle("short", 800) == ("short", False)


def test_a_field_the_egress_cut_adds_the_inbox_link_though_the_message_fits() -> None:
    shown, cut = EgressPolicy().for_channel(_record(context="c" * 2000), "telegram")
    assert cut == ["context"]
    assert was_truncated(shown)
    text = fitted(shown, lambda r, note: question_text(r, note=note), len, 4096, inbox_url="https://t.example/#/inbox")
    assert "Full question in the inbox: https://t.example/#/inbox" in text
    plain = fitted(_record(), lambda r, note: question_text(r, note=note), len, 4096, inbox_url="https://t.example")
    assert "inbox" not in plain


def test_the_inbox_expired_detail_says_what_the_run_did() -> None:
    expired = _record(status=HumanRequestState.EXPIRED)
    detail = refusal_for(expired).detail
    assert detail.startswith("expired at 2026-12-01T14:30:00+00:00 without an answer: ")
    assert detail.endswith("the run went ahead with the default: “Keep the v1 contract”")


def test_why_the_agent_asks_is_one_line_cut_after_the_context_and_consequences_before_the_question() -> None:
    """OBS-1: ``Why: <reason>`` only with a reason, on one line; a message over the limit loses the context and the
    consequences first, then the reason, and keeps the question's start."""
    reason = "Publishing is irreversible,\n  a person must approve"
    text = question_text(_record(reason=reason, reason_kind="approval"))
    assert "\nWhy: Publishing is irreversible, a person must approve\n" in text
    assert "Why" not in question_text(_record())
    assert "Why" not in question_text(_record(reason="  \n "))

    long = _record(reason="r" * 200, context="c" * 1000, question="Keep v1? " + "q" * 300)

    def render(r: HumanRequestRecord, note: str | None) -> str:
        return question_text(r, note=note)

    whole = render(long, None)
    # room for everything but 200 characters: the context goes, the reason stays whole
    kept = fitted(long, render, len, len(whole) - 200)
    assert "\nWhy: " + "r" * 200 + "\n" in kept
    assert "c" * 900 not in kept
    # room for much less: the context and the reason are gone, the question's start is still there
    short = fitted(long, render, len, len(whole) - 1300)
    assert "Why:" not in short
    assert "Keep v1? qqq" in short
    assert len(short) <= len(whole) - 1300


def test_the_egress_redacts_the_reason_and_names_it_when_it_cut_it() -> None:
    secret = "ghp_" + "Ww7Nc6Bv5Vc4Xz3Lk2Jh1" * 2
    policy = EgressPolicy.build(limits={"tiny": 50})
    stored = policy.redact_record(_record(reason=f"token {secret} leaked", reason_kind="approval"))
    assert stored.reason == "token [REDACTED:github_token] leaked"
    assert stored.redactions == {"github_token": 1}
    shown, cut = policy.for_channel(_record(reason="x" * 120), "tiny")
    assert cut == ["reason"]
    assert policy.truncated(_record(reason="x" * 120), "tiny") == ["reason"]
    assert shown.reason is not None
    assert was_truncated(shown)
    assert policy.for_channel(_record(), "tiny")[0].reason is None
