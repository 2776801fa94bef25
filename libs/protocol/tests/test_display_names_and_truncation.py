"""Three optional protocol additions stay backward compatible: ``human.answered``'s ``responder_display_name``,
``human.requested``'s ``agent_display_name`` and the ``output_truncated`` run-failure reason. An event from a
service before them validates (model and committed schema) and reads with the field ``None``; one with them
validates too."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator, ValidationError
from pydantic import ValidationError as ModelError

from temporality_protocol import RUN_FAILURE_REASONS
from temporality_protocol.events import HumanAnswered, HumanRequested, RunFailed

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas" / "events"

ANSWERED: dict[str, Any] = {
    "request_id": "hr-1",
    "run_id": "run-1",
    "recipient": "user:alice",
    "responder": "user:alice",
    "answer": {"type": "text", "value": "keep it"},
    "channel": "web",
    "waited_s": 12.5,
}
REQUESTED: dict[str, Any] = {
    "request_id": "hr-1",
    "run_id": "run-1",
    "agent": "reviewer",
    "title": "Review PR 42",
    "recipient": "user:alice",
    "question": "Keep v1?",
    "timeout_s": 600,
    "expires_at": datetime(2026, 12, 1, 10, tzinfo=UTC).isoformat(),
    "policy": {"allowed_recipients": ["user:alice"]},
    "turn": 1,
}


def _validator(event_type: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{event_type}.schema.json").read_text(encoding="utf-8"))
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def test_an_answer_from_before_the_display_name_reads_with_none() -> None:
    _validator("human.answered").validate(ANSWERED)
    assert HumanAnswered.model_validate(ANSWERED).responder_display_name is None


def test_an_answer_with_the_responders_display_name_validates_and_round_trips() -> None:
    data = ANSWERED | {"responder_display_name": "Alice Example"}
    _validator("human.answered").validate(data)
    answered = HumanAnswered.model_validate(data)
    assert answered.responder_display_name == "Alice Example"
    assert answered.model_dump(mode="json")["responder_display_name"] == "Alice Example"


def test_a_request_from_before_the_agent_display_name_reads_with_none() -> None:
    _validator("human.requested").validate(REQUESTED)
    assert HumanRequested.model_validate(REQUESTED).agent_display_name is None


def test_a_request_with_the_agents_display_name_validates() -> None:
    data = REQUESTED | {"agent_display_name": "Code Reviewer"}
    _validator("human.requested").validate(data)
    assert HumanRequested.model_validate(data).agent_display_name == "Code Reviewer"


@pytest.mark.parametrize(
    ("event_type", "model", "data"),
    [
        ("human.requested", HumanRequested, REQUESTED | {"agent_display_name": ""}),
        ("human.answered", HumanAnswered, ANSWERED | {"responder_display_name": ""}),
    ],
)
def test_an_empty_display_name_is_refused_by_model_and_schema(
    event_type: str, model: type[HumanRequested | HumanAnswered], data: dict[str, Any]
) -> None:
    with pytest.raises(ValidationError):
        _validator(event_type).validate(data)
    with pytest.raises(ModelError):
        model.model_validate(data)


def test_output_truncated_is_a_failure_reason_of_its_own() -> None:
    assert "output_truncated" in RUN_FAILURE_REASONS
    assert "provider_error" in RUN_FAILURE_REASONS  # still given for the provider's own failures
    failed = {"run_id": "run-1", "reason": "output_truncated", "error": "the final reply was cut off"}
    _validator("run.failed").validate(failed)
    assert RunFailed.model_validate(failed).reason == "output_truncated"


def test_an_older_truncation_failure_and_an_unknown_reason_still_read() -> None:
    """The reason stays a string: an older executor's ``provider_error`` + ``output_truncated:`` error and a
    newer executor's reason both validate."""
    for reason, error in (("provider_error", "output_truncated: the final reply ..."), ("brand_new", "x")):
        failed = {"run_id": "run-1", "reason": reason, "error": error}
        _validator("run.failed").validate(failed)
        assert RunFailed.model_validate(failed).reason == reason
