"""Issue 11: two human-interaction replicas with the same Matrix bot account against a real Synapse. One at a time
syncs (the inbound lease in ``human-channels``), both send; an answer is bound and acknowledged once (not once
per replica); when the syncing replica stops (releasing its lease), the other syncs on from the stored sync
token and binds the next answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import pytest
from human_support import exactly, requested, stored
from matrix_support import MatrixPerson
from test_human_matrix import _directory

from temporality_bus import Bus
from temporality_human_interaction.channels import ChannelAdapter
from temporality_human_interaction.channels.lease import InboundLease, lease_key
from temporality_human_interaction.channels.matrix import KEYCAPS, MatrixAdapter
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.requests import RequestHandler
from temporality_testing.synapse import MatrixAccount, Synapse
from temporality_testing.waiting import eventually, stays

TTL_S, RENEW_S = 3.0, 0.3


@dataclass
class Replica:
    name: str
    matrix: MatrixAdapter
    lease: InboundLease
    intake: RequestHandler
    stack: AsyncExitStack


async def _replica(bus: Bus, synapse: Synapse, accounts: dict[str, MatrixAccount], name: str) -> Replica:
    directory = _directory(accounts)
    adapters: dict[str, ChannelAdapter] = {}
    bot = accounts["bot"]
    lease = InboundLease(bus, lease_key("matrix", bot.user_id), holder=f"replica-{name}", ttl_s=TTL_S, renew_s=RENEW_S)
    matrix = MatrixAdapter(
        bus, homeserver=synapse.url, user_id=bot.user_id, password=bot.password, sync_timeout_s=1, lease=lease
    )
    matrix.attach(AnswerRouter(bus, directory, adapters))
    stack = AsyncExitStack()
    adapters[matrix.name] = await stack.enter_async_context(matrix)
    return Replica(name, matrix, lease, RequestHandler(bus, directory, adapters), stack)


@pytest.fixture
async def replicas(
    bus: Bus, synapse: Synapse, matrix_accounts: dict[str, MatrixAccount]
) -> AsyncIterator[tuple[Replica, Replica]]:
    a = await _replica(bus, synapse, matrix_accounts, "a")
    b = await _replica(bus, synapse, matrix_accounts, "b")
    try:
        yield a, b
    finally:
        await b.stack.aclose()
        await a.stack.aclose()


@pytest.fixture
async def alice(synapse: Synapse, matrix_accounts: dict[str, MatrixAccount]) -> AsyncIterator[MatrixPerson]:
    person = await MatrixPerson(synapse.url, matrix_accounts["alice"]).start()
    try:
        yield person
    finally:
        await person.close()


async def _true_if(value: bool) -> bool | None:
    return True if value else None


async def _ask_and_react(bus: Bus, sender: Replica, alice: MatrixPerson, bot_id: str, answered: int) -> None:
    """``sender`` asks Alice on Matrix; she reacts with option 2: bound once, told once."""
    event = requested()
    await sender.intake.handle(event)
    record = await stored(bus, str(event.data["request_id"]))
    assert record is not None
    copy = record.copy_on("matrix")
    assert copy is not None, "the question went out on Matrix"
    room_id, question = await alice.wait_for(lambda _r, e: e.get("event_id") == copy.reference, what="the question")
    reaction = await alice.react(room_id, str(question["event_id"]), KEYCAPS[1])
    await exactly(bus, "human.answered", answered)
    told = await alice.wait_for_reply_to(reaction, sender=bot_id)
    assert told["content"]["body"].endswith("Recorded: Drop v1")

    def replies() -> int:
        return sum(
            1
            for _room, e in alice.seen
            if e.get("sender") == bot_id
            and ((e.get("content") or {}).get("m.relates_to") or {}).get("m.in_reply_to", {}).get("event_id")
            == reaction
        )

    async def one_reply() -> bool:
        await alice._sync_once(200)
        return replies() == 1

    await stays(one_reply, settle_s=2.0, what="one acknowledgement (not one per replica)")


async def test_one_replica_syncs_both_send_and_the_other_takes_over_when_it_stops(
    bus: Bus, replicas: tuple[Replica, Replica], alice: MatrixPerson, matrix_accounts: dict[str, MatrixAccount]
) -> None:
    bot_id = matrix_accounts["bot"].user_id

    async def one_syncing() -> Replica | None:
        syncing = [r for r in replicas if r.matrix.syncing]
        return syncing[0] if len(syncing) == 1 and syncing[0].lease.held else None

    syncer = await eventually(one_syncing, timeout_s=TTL_S * 4, what="exactly one replica syncing")
    other = replicas[1] if syncer is replicas[0] else replicas[0]
    await stays(lambda: syncer.matrix.syncing and not other.matrix.syncing, settle_s=1.0, what="one syncs")
    assert other.matrix.available, "the replica that does not sync still sends"

    await _ask_and_react(bus, other, alice, bot_id, answered=1)

    await syncer.stack.aclose()  # releases the lease: the other syncs on from the stored token
    await eventually(lambda: _true_if(other.matrix.syncing), timeout_s=TTL_S * 2, what=f"replica {other.name} syncs")
    await _ask_and_react(bus, other, alice, bot_id, answered=2)
