"""The egress policy's pure parts (HUM-5, SEC-1): one test per built-in secret pattern, truncation, and the
configuration checks. The channel round trips are in test_human_egress_channels.py."""

from __future__ import annotations

import pytest
from human_support import requested

from temporality_human_interaction.__main__ import egress_policy
from temporality_human_interaction.egress import (
    _MEMO_SIZE,
    _MEMO_TEXT,
    BUILTIN_PATTERNS,
    DEFAULT_POLICY,
    EgressPolicy,
    PatternError,
    truncate,
)
from temporality_human_interaction.records import HumanRequestRecord
from temporality_human_interaction.settings import Settings
from temporality_protocol import HumanOption, HumanRequested, SourceLink, TextAnswer
from temporality_protocol.redaction import Redactor
from temporality_service import ConfigError

# Built from pieces so no scanner mistakes this file for a leak.
GITHUB = "ghp_" + "A1b2C3d4E5f6G7h8I9j0" * 2
GITHUB_PAT = "github_pat_" + "11ABCDEFG0" * 3
GITLAB = "glpat-" + "x1Y2z3W4v5U6t7S8r9Q0"
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"
SLACK = "xoxb-" + "123456789012-abcdefABCDEF"
STRIPE = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
GOOGLE = "AIza" + "SyA1234567890abcdefghijklmnopqrstuv"
WHSEC = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
NPM = "npm_" + "a1B2c3D4e5F6g7H8i9J0" + "k1L2m3N4o5P6q7R8"
SLACK_HOOK = "https://hooks.slack.com/services/" + "T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"
OPENAI = "sk-proj-" + "abcdefghijklmnopqrstuvwxyz012345"
JWT = "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0" + ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
BEARER = "Zm9vYmFyYmF6cXV4cXV1eDEyMzQ1Njc4"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1c2V\nq8ZyX0a7b2c3\n-----END RSA PRIVATE KEY-----"

#: (kind, text containing the secret, the secret itself, what must survive around it)
CASES = [
    ("private_key", f"deploy key:\n{PEM}\nthanks", "MIIEowIBAAKCAQEA1c2V", "thanks"),
    (
        "private_key",
        "deploy:\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA",
        "b3BlbnNzaC1rZXktdjEAAAAA",
        "deploy",
    ),
    ("jwt", f"the session cookie is {JWT} (expired?)", JWT, "(expired?)"),
    (
        "url_credentials",
        "DATABASE_URL postgres://app:s3cr3t-pw@db.internal:5432/orders",
        "s3cr3t-pw",
        "db.internal:5432",
    ),
    (
        "url_credentials",
        "clone https://ci-bot:hunter2hunter2@dev.azure.com/org/repo",
        "hunter2hunter2",
        "dev.azure.com",
    ),
    ("github_token", f"it logs {GITHUB} in CI", GITHUB, "in CI"),
    ("github_token", f"fine-grained {GITHUB_PAT}", GITHUB_PAT, "fine-grained"),
    ("gitlab_token", f"runner uses {GITLAB}", GITLAB, "runner uses"),
    ("aws_access_key_id", f"key id {AWS_ID} found", AWS_ID, "found"),
    ("aws_secret_access_key", f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET, "aws_secret_access_key"),
    ("slack_token", f"webhook bot {SLACK}", SLACK, "webhook bot"),
    ("stripe_key", f"billing uses {STRIPE}", STRIPE, "billing"),
    ("google_api_key", f"maps key {GOOGLE}", GOOGLE, "maps key"),
    ("webhook_secret", f"the svix signing key is {WHSEC} now", WHSEC, "signing key is"),
    ("npm_token", f"publish with {NPM} from CI", NPM, "from CI"),
    ("slack_webhook_url", f"alerts post to {SLACK_HOOK} (channel #ops)", "XXXXXXXXXXXXXXXXXXXXXXXX", "(channel #ops)"),
    ("api_key", f"OPENAI {OPENAI} is in the diff", OPENAI, "is in the diff"),
    ("authorization_header", f"curl -H 'Authorization: Bearer {BEARER}' ...", BEARER, "Authorization"),
    (
        "secret_assignment",
        "the .env sets DB_PASSWORD=correct-horse-battery and PORT=5432",
        "correct-horse-battery",
        "PORT=5432",
    ),
    ("secret_assignment", 'config: {"api_key": "k-98765-abcdef"}', "k-98765-abcdef", "config"),
    ("secret_assignment", "Server=db;User Id=sa;Password=P@ssw0rd!;", "P@ssw0rd!", "User Id=sa"),
    ("secret_assignment", "GET /cb?code=1&access_token=tok-abc-123&state=x", "tok-abc-123", "state=x"),
]


def test_every_builtin_pattern_has_a_case() -> None:
    assert {p.kind for p in BUILTIN_PATTERNS} == {kind for kind, *_ in CASES}


@pytest.mark.parametrize(("kind", "text", "secret", "kept"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_secret_kind_is_redacted_and_the_text_around_it_kept(kind: str, text: str, secret: str, kept: str) -> None:
    done = DEFAULT_POLICY.redact(text)
    assert secret not in done.text
    assert f"[REDACTED:{kind}]" in done.text
    assert done.counts[kind] >= 1
    assert kept in done.text


def test_plain_prose_is_left_alone() -> None:
    text = (
        "The PR removes /v1; two internal clients still call it. See https://dev.azure.com/org/repo/pullrequest/42 "
        "and the token bucket limiter. Password policy is documented; the author is Bob."
    )
    done = DEFAULT_POLICY.redact(text)
    assert done.text == text
    assert not done.counts


def test_redaction_is_idempotent_and_counts_each_secret_once() -> None:
    once = DEFAULT_POLICY.redact(f"a {GITHUB} b postgres://u:pw12345@h/db c DB_PASSWORD=postgres://u:x1@h")
    again = DEFAULT_POLICY.redact(once.text)
    assert again.text == once.text
    assert not again.counts
    assert sum(once.counts.values()) == 3


def test_truncation_keeps_the_limit_and_says_how_much_was_left_out() -> None:
    text = "x" * 1234 + "y" * 1000
    cut, truncated = truncate(text, 1000)
    assert truncated
    assert cut == "x" * 1000 + "… (truncated, 1,234 more characters)"
    assert truncate("short", 1000) == ("short", False)


def _record(**changes: object) -> HumanRequestRecord:
    event = requested()
    payload = event.payload(HumanRequested).model_copy(update=changes)
    return HumanRequestRecord.from_requested(event, payload)


def test_a_record_is_redacted_in_every_field_a_person_sees() -> None:
    record = _record(
        title=f"PR 7 leaks {AWS_ID}",
        question=f"Is {GITHUB} revoked?",
        context=f"the diff adds DB_PASSWORD=hunter22 and {JWT}",
        options=[HumanOption(id="revoke", label=f"Revoke {SLACK}", consequence=f"rotates {STRIPE}")],
    )
    clean = DEFAULT_POLICY.redact_record(record)
    visible = " ".join([clean.title, clean.question, clean.context, *(o.label for o in clean.options)])
    visible += " ".join(o.consequence or "" for o in clean.options)
    for secret in (AWS_ID, GITHUB, "hunter22", JWT, SLACK, STRIPE):
        assert secret not in visible
    assert clean.options[0].id == "revoke"  # the machine value is kept
    assert clean.redactions == {
        "aws_access_key_id": 1,
        "github_token": 1,
        "jwt": 1,
        "secret_assignment": 1,
        "slack_token": 1,
        "stripe_key": 1,
    }


def test_each_channel_truncates_to_its_own_limit() -> None:
    policy = EgressPolicy.build(limits={"telegram": 100, "web": 500})
    record = _record(context="c" * 300, question="q" * 50)
    on_telegram, cut = policy.for_channel(record, "telegram")
    assert on_telegram.context.startswith("c" * 100 + "… (truncated, 200 more characters)")
    assert cut == ["context"]
    on_web, cut = policy.for_channel(record, "web")
    assert on_web.context == "c" * 300
    assert cut == []
    assert policy.limit_for("carrier-pigeon") == policy.default_limit


def test_a_free_text_answer_quoted_in_the_outcome_is_redacted() -> None:
    record = _record().model_copy(update={"answer": TextAnswer(value=f"use {GITHUB}")})
    shown, _ = DEFAULT_POLICY.for_channel(record, "telegram")
    assert isinstance(shown.answer, TextAnswer)
    assert GITHUB not in shown.answer.value


def test_an_extra_pattern_replaces_its_secret_group_or_its_match() -> None:
    policy = EgressPolicy.build(
        extra_patterns={"ticket_secret": r"TKT-(?P<secret>[0-9a-f]{16})", "codeword": r"\bpineapple-\d+\b"}
    )
    done = policy.redact("ticket TKT-0123456789abcdef and pineapple-42")
    assert done.text == "ticket TKT-[REDACTED:ticket_secret] and [REDACTED:codeword]"
    assert done.counts == {"ticket_secret": 1, "codeword": 1}


@pytest.mark.parametrize(
    ("patterns", "message"),
    [
        ({"broken": "([a-z"}, "TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS[broken]: not a valid regular expression"),
        ({"empty": "x*"}, "TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS[empty]: the pattern matches the empty string"),
        ({"Bad Name": "x"}, "TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS[Bad Name]: a pattern's name"),
    ],
)
def test_a_bad_extra_pattern_is_a_config_error_naming_its_key(patterns: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        egress_policy(Settings(egress_redact_patterns=patterns))


def test_the_settings_read_the_policy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPORALITY_HUMAN_EGRESS_MAX_CHARS", '{"telegram": 300}')
    monkeypatch.setenv("TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS", '{"codeword": "pineapple"}')
    policy = egress_policy(Settings())
    assert policy.limit_for("telegram") == 300
    assert policy.limit_for("web") == 4000  # the defaults stay for channels not named
    assert policy.redact_text("pineapple") == "[REDACTED:codeword]"
    monkeypatch.setenv("TEMPORALITY_HUMAN_EGRESS_MAX_CHARS", '{"telegram": 5}')
    with pytest.raises(ValueError, match=r"egress_max_chars\[telegram\]"):
        Settings()


def test_a_policy_error_is_a_value_error() -> None:
    assert issubclass(PatternError, ValueError)


def test_a_remembered_redaction_is_the_redaction() -> None:
    """The policy remembers the texts it redacted (a stored request is shown again and again): the second time
    gives what the patterns give, a caller's change to the counts it got never reaches the next caller, a
    deployment's extra pattern is remembered per policy, and the memory is bounded."""
    text = "deploy with DB_PASSWORD=hunter2hunter2 and token ghp_" + "a" * 36
    policy = EgressPolicy()
    fresh = Redactor(policy.patterns).redact(text)
    assert fresh.counts["secret_assignment"] == 1
    first = policy.redact(text)
    first.counts["secret_assignment"] += 10  # what redact_record's counting could do to it
    again = policy.redact(text)
    assert again == fresh
    assert again.counts == fresh.counts
    assert policy.redact_text("nothing secret") == "nothing secret"

    extra = EgressPolicy.build(extra_patterns={"ticket": r"TICKET-\d+"})
    assert extra.redact_text("see TICKET-42") == "see [REDACTED:ticket]"
    assert policy.redact_text("see TICKET-42") == "see TICKET-42"  # another policy, its own memory

    for n in range(_MEMO_SIZE + 10):
        policy.redact_text(f"question {n}")
    assert len(policy._memo) <= _MEMO_SIZE
    long = "x" * (_MEMO_TEXT + 1) + " DB_PASSWORD=hunter2hunter2"
    assert policy.redact_text(long).endswith("[REDACTED:secret_assignment]")
    assert long not in policy._memo  # a text longer than any request's is redacted, not kept


@pytest.mark.parametrize("channel", ["telegram", "matrix", "web", "carrier-pigeon"])
@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"context": "c" * 900, "question": "q" * 2500},
        {"title": "t" * 250, "options": [HumanOption(id="a", label="l" * 150, consequence="k" * 1200)]},
        {"title": f"leaks {AWS_ID}", "context": f"DB_PASSWORD=hunter22 {'x' * 3990}"},
        {"source_link": SourceLink(href="https://example.com/pr/7", label="L" * 150)},
        {"source_link": SourceLink(href="https://example.com/" + "p" * 1500, label="PR")},
        {"source_link": SourceLink(href=f"https://example.com/cb?access_token=tok-abc-123&x={'c' * 900}")},
    ],
    ids=["short", "long-texts", "long-title-and-option", "redacted-then-long", "long-label", "long-url", "secret-url"],
)
def test_the_truncated_fields_are_those_the_channel_s_copy_cuts(channel: str, changes: dict[str, object]) -> None:
    """The intake names what a channel's copy cut (``human.notified.truncated``) without building the copy: the
    same names in the same order as :meth:`EgressPolicy.for_channel` gives."""
    record = _record(**changes)
    for policy in (DEFAULT_POLICY, EgressPolicy.build(limits={"telegram": 120, "matrix": 1000})):
        assert policy.truncated(record, channel) == policy.for_channel(record, channel)[1]
    assert EgressPolicy.build(limits={"telegram": 120}).truncated(_record(title="t" * 150), "telegram") == ["title"]
