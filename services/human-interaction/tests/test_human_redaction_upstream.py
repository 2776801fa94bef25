"""The redaction the publisher applies (SEC-1): ``temporality_protocol.redaction`` is what the run-executor
runs over every ``human.requested`` before it goes on the bus (so neither the bus nor the journal holds a
secret), with the same built-in and configured patterns human-interaction's egress policy uses; what the
publisher already redacted is still counted in the stored request and in ``human.notified.redacted``."""

from __future__ import annotations

import pytest
from human_support import events_of, requested, stored

from temporality_bus import Bus
from temporality_human_interaction.channels import WebInboxAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.egress import EgressPolicy
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import HumanNotified, HumanOption, HumanRequested, SourceLink, make_event
from temporality_protocol.redaction import REDACT_PATTERNS_ENV, PatternError, Redactor, process_redactor

GITHUB = "ghp_" + "Qw8Er7Ty6Ui5Op4As3Df" * 2
TICKET = "TKT-0123456789abcdef"
EXTRA = {"ticket_secret": r"TKT-(?P<secret>[0-9a-f]{16})"}


def _leaky() -> HumanRequested:
    data = requested().payload(HumanRequested)
    return data.model_copy(
        update={
            "title": f"Rotate {GITHUB}",
            "question": f"Revoke {GITHUB} and {TICKET}?",
            "context": f"postgres://app:hunter2-pw@db/orders; DB_PASSWORD=also-secret {TICKET}",
            "options": [HumanOption(id="revoke", label=f"Revoke {TICKET}", consequence=f"{GITHUB} stops working")],
            "source_link": SourceLink(href="https://ci.example/b/1?access_token=abcdefabcdef", label="Build 1"),
        }
    )


def test_the_publisher_redacts_every_text_a_person_reads() -> None:
    leaky = _leaky()
    clean = Redactor.build(EXTRA).human_requested(leaky)
    dumped = clean.model_dump_json()
    for secret in (GITHUB, "0123456789abcdef", "hunter2-pw", "also-secret", "abcdefabcdef"):
        assert secret not in dumped
    assert clean.title == "Rotate [REDACTED:github_token]"
    assert clean.question == "Revoke [REDACTED:github_token] and TKT-[REDACTED:ticket_secret]?"
    assert "postgres://app:[REDACTED:url_credentials]@db/orders" in clean.context
    assert clean.options[0].id == "revoke"  # machine values untouched
    assert clean.options[0].label == "Revoke TKT-[REDACTED:ticket_secret]"
    assert clean.source_link is None  # a URL with a secret opens nothing once redacted: dropped
    assert (clean.request_id, clean.recipient, clean.policy) == (leaky.request_id, "user:alice", leaky.policy)


def test_without_the_configured_pattern_only_the_built_in_kinds_go() -> None:
    clean = Redactor().human_requested(_leaky())
    assert TICKET in clean.question
    assert GITHUB not in clean.question


def test_the_process_redactor_reads_the_same_variable_as_human_interaction(monkeypatch: pytest.MonkeyPatch) -> None:
    process_redactor.cache_clear()
    try:
        monkeypatch.setenv(REDACT_PATTERNS_ENV, '{"ticket_secret": "TKT-(?P<secret>[0-9a-f]{16})"}')
        assert TICKET not in process_redactor().human_requested(_leaky()).question
        for bad, says in (("{not json", "not JSON"), ('["x"]', "JSON object"), ('{"t": "("}', "[t]: not a valid")):
            process_redactor.cache_clear()
            monkeypatch.setenv(REDACT_PATTERNS_ENV, bad)
            with pytest.raises(PatternError, match=REDACT_PATTERNS_ENV.replace("[", r"\[")) as caught:
                process_redactor()
            assert says in str(caught.value)
        process_redactor.cache_clear()
        monkeypatch.delenv(REDACT_PATTERNS_ENV)
        assert process_redactor() == Redactor()
    finally:
        process_redactor.cache_clear()


async def test_what_the_publisher_redacted_is_counted_when_stored_and_notified(bus: Bus, directory: Directory) -> None:
    data = Redactor.build(EXTRA).human_requested(_leaky())
    policy = EgressPolicy.build(extra_patterns=EXTRA)
    async with WebInboxAdapter() as web:
        web.egress = policy
        await RequestHandler(bus, directory, {web.name: web}, egress=policy).handle(
            make_event(data, source="/temporality/run-executor", run_id=data.run_id)
        )
    record = await stored(bus, data.request_id)
    assert record is not None
    assert record.redactions == {
        "github_token": 3,
        "secret_assignment": 1,
        "ticket_secret": 3,
        "url_credentials": 1,
    }
    [notified] = await events_of(bus, "human.notified", wait_for=1)
    assert notified.payload(HumanNotified).redacted == record.redactions
