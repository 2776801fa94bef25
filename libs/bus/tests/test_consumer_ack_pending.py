"""Each durable gets the catalogue's ``max_ack_pending`` (``ConsumerSpec``), also a durable made by an older
release with the former fixed 1,000: the journal's batches of 1,000 need 2,000 (one batch handled, the next one
fetched), and the batch path takes half of whatever the server says."""

from __future__ import annotations

from dataclasses import replace

from temporality_bus import Bus
from temporality_protocol.catalog import CONSUMERS


async def test_the_journal_s_durable_allows_two_batches_and_an_older_durable_is_updated_in_place(bus: Bus) -> None:
    journal = CONSUMERS["journal"]
    assert journal.max_ack_pending == 2000
    assert {spec.max_ack_pending for name, spec in CONSUMERS.items() if name != "journal"} == {1000}
    await bus.ensure_consumer(replace(journal, max_ack_pending=1000))  # as an older release made it
    older = await bus.js.consumer_info(journal.stream, journal.durable)
    assert older.config.max_ack_pending == 1000
    await bus.ensure_consumer(journal)
    info = await bus.js.consumer_info(journal.stream, journal.durable)
    assert info.config.max_ack_pending == 2000
    assert info.created == older.created  # the same durable, updated in place (its position kept), not made anew
