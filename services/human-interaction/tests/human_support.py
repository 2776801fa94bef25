"""Helpers for human-interaction tests: a ``human.requested`` builder and readers of the bus and KV."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporality_bus import Bus
from temporality_human_interaction.records import HumanRequestRecord, open_store
from temporality_protocol import (
    Envelope,
    HumanOption,
    HumanPolicy,
    HumanRequested,
    TimeoutPolicy,
    decode,
    make_event,
    new_id,
)
from temporality_protocol.catalog import EVENTS_STREAM, subject_for

USERS_FILE = Path(__file__).resolve().parents[3] / "config" / "users.yaml"
ALICE = {"Authorization": "Bearer alice-demo-token"}
BOB = {"Authorization": "Bearer bob-demo-token"}
OPTIONS = [
    HumanOption(id="keep-v1", label="Keep the v1 API", consequence="The PR is asked to restore v1"),
    HumanOption(id="drop-v1", label="Drop v1", consequence="The review approves the removal"),
]


def requested(
    *,
    recipient: str = "user:alice",
    allowed: tuple[str, ...] = ("user:alice", "user:bob"),
    expires_in_s: float = 3600,
    on_timeout: TimeoutPolicy | None = None,
    allow_free_text: bool = True,
    request_id: str | None = None,
    run_id: str | None = None,
) -> Envelope:
    """A ``human.requested`` as run-executor would publish it."""
    request_id = request_id or new_id("hreq")
    run_id = run_id or new_id("run")
    policy = HumanPolicy(allowed_recipients=list(allowed), on_timeout=on_timeout or TimeoutPolicy())
    data = HumanRequested(
        request_id=request_id,
        run_id=run_id,
        agent="reviewer",
        title="Review PR 42: remove the v1 API",
        recipient=recipient,
        question="Should the v1 API stay for one more release?",
        context="The PR removes /v1; two internal clients still call it.",
        options=OPTIONS,
        allow_free_text=allow_free_text,
        timeout_s=max(1, int(expires_in_s)),
        expires_at=datetime.now(UTC) + timedelta(seconds=expires_in_s),
        policy=policy,
        turn=3,
    )
    return make_event(data, source="/temporality/run-executor", run_id=run_id, id=new_id("evt"))


async def events_of(bus: Bus, event_type: str, *, wait_for: int = 0, within_s: float = 10.0) -> list[Envelope]:
    """Every ``event_type`` event in the journal stream; waits (bounded) until at least ``wait_for`` are there."""
    sub = await bus.js.pull_subscribe(subject_for(event_type), stream=EVENTS_STREAM.name)
    found: list[Envelope] = []
    try:
        deadline = asyncio.get_running_loop().time() + within_s
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                msgs = await sub.fetch(100, timeout=min(0.5, max(remaining, 0.05)))
            except TimeoutError:
                msgs = []
            for msg in msgs:
                await msg.ack()
                found.append(decode(msg.data))
            if not msgs and (len(found) >= wait_for or remaining <= 0):
                return found
    finally:
        await sub.unsubscribe()


async def stored(bus: Bus, request_id: str) -> HumanRequestRecord | None:
    got = await (await open_store(bus)).get(request_id)
    return got.value if got is not None else None
