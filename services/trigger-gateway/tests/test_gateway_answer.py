"""The webhook's answer (api._JsonAnswer) is what ``Response(outcome.model_dump_json(exclude_none=True),
media_type="application/json")`` sends: the same body, the same headers, in the same order."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import BaseModel
from starlette.responses import Response

from temporality_trigger_gateway.api import _JsonAnswer
from temporality_trigger_gateway.intake import Accepted, Debounced, Duplicate, Ignored, Queued, Skipped

OUTCOMES: list[tuple[BaseModel, int]] = [
    (Accepted(delivery_id="dlv-1", run_id="run-1"), 202),
    (Accepted(delivery_id="dlv-1", run_id="run-1", superseded_run_id="run-0"), 202),
    (Queued(delivery_id="dlv-2", run_id="run-2", position=3, active_run_id=None), 202),
    (Debounced(delivery_id="dlv-3", run_id="run-3", until=datetime(2026, 12, 6, tzinfo=UTC)), 202),
    (Duplicate(delivery_id="dlv-4", run_id="run-4"), 200),
    (Ignored(delivery_id="dlv-5", reason="filtered", detail='ü "quoted" \u2028'), 200),
    (Skipped(delivery_id="dlv-6", detail="busy", active_run_id="run-5"), 200),
]


@pytest.mark.parametrize(("outcome", "status"), OUTCOMES)
async def test_the_answer_sends_what_a_json_response_of_the_outcome_sends(outcome: BaseModel, status: int) -> None:
    expected = Response(outcome.model_dump_json(exclude_none=True), status_code=status, media_type="application/json")

    async def sent_by(response: Response) -> list[dict[str, object]]:
        messages: list[dict[str, object]] = []

        async def send(message: dict[str, object]) -> None:
            messages.append(message)

        await response({"type": "http"}, None, send)  # type: ignore[arg-type]
        return messages

    assert await sent_by(_JsonAnswer(outcome, status)) == await sent_by(expected)
