"""TEMPORALITY_NATS_DLQ_MAX_AGE_DAYS on a real nats-server: the dead-letter stream's owner applies it at every
ensure (30 days by default, the catalogue's; 0 keeps dead letters forever), and it touches no other stream."""

from __future__ import annotations

import pytest

from temporality_bus import Bus, NatsSettings
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS, DLQ_STREAM, EVENTS_STREAM, TIMERS_STREAMS

DAY = 24 * 3600


def test_the_default_is_the_catalogue_s() -> None:
    assert NatsSettings().dlq_max_age_days * DAY == DLQ_STREAM.max_age_s


def test_a_negative_age_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPORALITY_NATS_DLQ_MAX_AGE_DAYS", "-1")
    with pytest.raises(ValueError, match="dlq_max_age_days"):
        NatsSettings()


async def test_the_dead_letters_retention_is_applied_and_changed_in_place(nats_settings: NatsSettings) -> None:
    async with Bus.connect(nats_settings.model_copy(update={"dlq_max_age_days": 7}), name="dlq-week") as b:
        await b.ensure(ALL_STREAMS, ALL_BUCKETS)
        dlq = await b.js.stream_info(DLQ_STREAM.name)
        events = await b.js.stream_info(EVENTS_STREAM.name)
        timers = [await b.js.stream_info(stream.name) for stream in TIMERS_STREAMS.values()]
    assert dlq.config.max_age == 7 * DAY
    assert not events.config.max_age  # the events keep theirs (TEMPORALITY_NATS_EVENTS_MAX_AGE_DAYS, 0: forever)
    assert all(t.config.max_age == TIMERS_STREAMS["human-interaction"].max_age_s for t in timers)
    async with Bus.connect(nats_settings.model_copy(update={"dlq_max_age_days": 0}), name="dlq-forever") as b:
        await b.ensure(ALL_STREAMS, ALL_BUCKETS)
        assert not (await b.js.stream_info(DLQ_STREAM.name)).config.max_age
    async with Bus.connect(nats_settings, name="dlq-default") as b:
        await b.ensure(ALL_STREAMS, ALL_BUCKETS)
        assert (await b.js.stream_info(DLQ_STREAM.name)).config.max_age == DLQ_STREAM.max_age_s
