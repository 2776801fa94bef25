"""OBS-1: ``human.requested``'s optional ``reason`` (a short phrase) and ``reason_kind`` (a small vocabulary). An
event from an executor before them validates (model and committed schema) and reads with both ``None``; one with
them validates; a reason over :data:`MAX_REASON` characters or a kind outside the vocabulary is refused by both;
the redactor treats the reason as text a person reads."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args

import pytest
from jsonschema import Draft202012Validator, ValidationError
from pydantic import ValidationError as ModelError

from temporality_protocol import MAX_REASON, HumanAskKind, HumanRequested
from temporality_protocol.redaction import Redactor

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas" / "events"
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


def _validator() -> Draft202012Validator:
    schema = json.loads((SCHEMAS / "human.requested.schema.json").read_text(encoding="utf-8"))
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def test_a_request_from_before_the_reason_reads_with_none() -> None:
    _validator().validate(REQUESTED)
    requested = HumanRequested.model_validate(REQUESTED)
    assert (requested.reason, requested.reason_kind) == (None, None)


@pytest.mark.parametrize("kind", get_args(HumanAskKind))
def test_a_request_with_a_reason_and_each_kind_validates(kind: str) -> None:
    data = REQUESTED | {"reason": "breaking API change needs sign-off", "reason_kind": kind}
    _validator().validate(data)
    requested = HumanRequested.model_validate(data)
    assert requested.model_dump(mode="json")["reason"] == "breaking API change needs sign-off"
    assert requested.reason_kind == kind


@pytest.mark.parametrize(
    "extra",
    [{"reason": "x" * (MAX_REASON + 1)}, {"reason": ""}, {"reason_kind": "curiosity"}],
    ids=["too-long", "empty", "unknown-kind"],
)
def test_a_bad_reason_is_refused_by_the_model_and_the_schema(extra: dict[str, Any]) -> None:
    with pytest.raises(ModelError):
        HumanRequested.model_validate(REQUESTED | extra)
    with pytest.raises(ValidationError):
        _validator().validate(REQUESTED | extra)


def test_the_redactor_redacts_the_reason_and_keeps_none() -> None:
    secret = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    redactor = Redactor()
    cleaned = redactor.human_requested(HumanRequested.model_validate(REQUESTED | {"reason": f"token {secret} leaked"}))
    assert cleaned.reason is not None
    assert secret not in cleaned.reason
    assert redactor.human_requested(HumanRequested.model_validate(REQUESTED)).reason is None
