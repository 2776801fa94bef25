"""A schema's ``pattern`` is matched in linear time (:mod:`temporality_protocol.schema_validation`): an MCP
server's badly written pattern cannot stall the process that checks a person's answer or a model's arguments."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from temporality_protocol import forms
from temporality_protocol.events import TextAnswer
from temporality_protocol.schema_validation import LinearValidator

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{1,4}$"},
        "email": {"type": "string", "pattern": "[a-z]+@[a-z]+\\.com"},
        "n": {"type": "integer", "minimum": 1},
    },
    "required": ["code"],
}


@settings(max_examples=400, deadline=None)
@given(
    st.fixed_dictionaries(
        {"code": st.from_regex(r"[A-Z]{2}-[0-9]{1,5}\n?", fullmatch=True) | st.text(max_size=8)},
        optional={"email": st.text(alphabet="ab@.com", max_size=12), "n": st.integers(-2, 3) | st.text(max_size=2)},
    )
)
def test_it_answers_as_jsonschema_does(instance: dict[str, Any]) -> None:
    """But for a final newline, where Python's ``$`` and ECMA-262's differ (below)."""
    if instance["code"].endswith("\n"):
        instance = {**instance, "code": instance["code"][:-1]}
    ours = [(list(e.absolute_path), e.message) for e in LinearValidator(SCHEMA).iter_errors(instance)]
    theirs = [(list(e.absolute_path), e.message) for e in Draft202012Validator(SCHEMA).iter_errors(instance)]
    assert sorted(ours) == sorted(theirs)


def test_the_error_reads_as_jsonschemas() -> None:
    (error,) = LinearValidator({"type": "string", "pattern": "^[0-9]+$"}).iter_errors("abc")
    assert error.message == "'abc' does not match '^[0-9]+$'"


def test_dollar_is_the_end_of_the_text_as_json_schema_says() -> None:
    """JSON Schema's patterns are ECMA-262: ``$`` does not match before a final newline, as Python's does."""
    schema = {"type": "string", "pattern": "^[a-z]+$"}
    assert not LinearValidator(schema).is_valid("abc\n")
    assert Draft202012Validator(schema).is_valid("abc\n")


def test_a_pattern_only_pythons_dialect_reads_is_matched_by_re() -> None:
    schema = {"type": "string", "pattern": "^(?P<word>[a-z]+)(?P=word)$"}  # a named backreference, Python's spelling
    assert LinearValidator(schema).is_valid("abab")
    assert not LinearValidator(schema).is_valid("abba")


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        ("^(\\w+\\s?)*$", "a" * 4000 + "!"),  # exponential under re: ~0.3 s at 22 characters, doubling per character
        ("[a-z]+@[a-z]+\\.com", "a" * 100_000),  # quadratic under re.search
    ],
)
def test_a_backtracking_pattern_is_answered_whole(pattern: str, text: str) -> None:
    """Under Python's ``re`` these would take longer than the age of the universe (the first) or minutes (the
    second); the suite's timeout stops a regression here."""
    assert not LinearValidator({"type": "string", "pattern": pattern}).is_valid(text)


def test_a_persons_form_answer_against_a_backtracking_pattern_is_refused_whole() -> None:
    """An elicitation form (an MCP server's ``requestedSchema``) read from a person's text answer."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^(\\w+\\s?)*$"}}}
    read = forms.read(schema, TextAnswer(type="text", value="a" * 4000 + "!"))
    assert read.action is None
    assert read.refused is not None
    assert "does not match" in read.refused
    assert forms.read(schema, TextAnswer(type="text", value="Ada Lovelace")).action == "accept"
