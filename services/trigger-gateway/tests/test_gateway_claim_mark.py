"""The claim's ``published`` mark is the claim's JSON as written with its state replaced (launch._published):
byte for byte what the claim copied in state ``published`` encodes to, whatever its ids hold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from temporality_trigger_gateway.launch import DedupeRecord, _published


@pytest.mark.parametrize(
    "source_event_id",
    [
        "evt-1",
        'x","state":"claimed',  # the state's own text inside an id: escaped, never the key
        '"state":"claimed"',
        "state:claimed ü \\ \u2028",
    ],
)
def test_the_mark_is_the_claim_encoded_in_state_published(source_event_id: str) -> None:
    now = datetime(2026, 12, 6, 1, 2, 3, 456789, tzinfo=UTC)
    claim = DedupeRecord(
        trigger_id='t-"claimed"',
        source_event_id=source_event_id,
        run_id="run-1",
        delivery_id="dlv-1",
        accepted_at=now,
        expires_at=now + timedelta(days=7),
        state="claimed",
        claimed_at=now,
    )
    encoded = claim.__pydantic_serializer__.to_json(claim)  # as the launch writes the claim
    assert encoded == claim.model_dump_json().encode()
    expected = claim.model_copy(update={"state": "published"}).model_dump_json().encode()
    assert _published(claim, encoded) == expected
    assert _published(claim, None) == expected  # a claim written by the store (a takeover): encoded here
    # JSON that does not read as expected (another spelling of the key): encoded from the model, never unmarked
    assert _published(claim, encoded.replace(b'"state":"claimed"', b'"state": "claimed"')) == expected
    assert DedupeRecord.model_validate_json(_published(claim, encoded)) == claim.model_copy(
        update={"state": "published"}
    )
