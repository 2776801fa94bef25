"""OBS-1: a question still open when its run is cancelled is withdrawn with a ``human.withdrawn`` of its own --
exactly one, through redelivered run ends and a restart of human-interaction -- and the journal counts it once.

Real parts: a real nats-server (the test's), the real human-interaction service and the real journal service, each
in-process on 127.0.0.1 and a free port, with their own consumers. The run's ``run.cancelled`` is published as the
run-executor would; everything else is the services' own doing. Every cross-process assertion waits on its condition
with a timeout.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from journal_support import ALICE_INBOX, OPERATOR, VIEWER, ServedJournal, eventually, serve_human

from temporality_bus import Bus, NatsSettings, evolve
from temporality_human_interaction.records import open_store
from temporality_protocol import HumanPolicy, HumanRequested, RunCancelled, derive_id, make_event
from temporality_protocol.catalog import EVENTS_STREAM, subject_for

pytestmark = pytest.mark.timeout(180)

WITHDRAWN = subject_for("human.withdrawn")


async def _on_stream(bus: Bus) -> int:
    """How many ``human.withdrawn`` messages the events stream holds (what every subscriber of ``human.>`` gets)."""
    info = await bus.js.stream_info(EVENTS_STREAM.name, subjects_filter=WITHDRAWN)
    return int(sum((info.state.subjects or {}).values()))


async def _stays_one(bus: Bus, settle_s: float = 1.5) -> None:
    """Exactly one ``human.withdrawn`` on the stream now and throughout a settle window."""
    loop = asyncio.get_running_loop()
    until = loop.time() + settle_s
    while loop.time() < until:
        assert await _on_stream(bus) == 1
        await asyncio.sleep(0.1)


def _run_end(run_id: str, n: int) -> Any:
    """The run's ``run.cancelled`` as the run-executor publishes it; ``n`` > 1: another copy (another id -- a
    redelivery within the duplicate window would be dropped by JetStream before anyone saw it)."""
    data = RunCancelled(run_id=run_id, reason="by user:bob")
    return make_event(data, source="/temporality/run-executor", id=derive_id("evt", run_id, "cancelled", str(n)))


async def test_a_cancelled_run_s_open_question_is_withdrawn_once_and_counted_once(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, served_journal: ServedJournal
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    request_id = f"hreq-{uuid.uuid4().hex[:12]}"
    asked = HumanRequested(
        request_id=request_id,
        run_id=run_id,
        agent="reviewer",
        title="Review PR 42",
        recipient="user:alice",
        question="Merge it?",
        timeout_s=3600,
        expires_at=datetime.now(UTC) + timedelta(hours=1),
        policy=HumanPolicy(allowed_recipients=["user:alice"]),
        turn=1,
    )
    async with httpx.AsyncClient(base_url=served_journal.url, timeout=20) as journal:

        async def withdrawn_in_journal() -> list[dict[str, Any]] | None:
            got = await journal.get("/events", params={"type": "human.withdrawn", "run_id": run_id}, headers=VIEWER)
            events = got.json()["events"] if got.status_code == 200 else []
            return events or None

        async with serve_human(tmp_path, nats_settings) as human_url:
            async with httpx.AsyncClient(base_url=human_url, timeout=20) as human:

                async def listed() -> bool:
                    inbox = await human.get("/inbox", headers=ALICE_INBOX)
                    return inbox.status_code == 200 and request_id in [r["id"] for r in inbox.json()["requests"]]

                await served_journal.ask(asked)
                await eventually(listed, what="alice's inbox to list the question")
                await served_journal.bus.publish(_run_end(run_id, 1))
                (event,) = await eventually(withdrawn_in_journal, what="the journal to record human.withdrawn")
                d = event["data"]
                assert event["id"] == derive_id("evt", request_id, "withdrawn")
                assert (d["request_id"], d["run_id"], d["recipient"], d["channel"]) == (
                    request_id,
                    run_id,
                    "user:alice",
                    "web",
                )
                assert (d["reason"], d["run_reason"]) == ("run_cancelled", "by user:bob")
                asked_at = datetime.fromisoformat(d["asked_at"])
                withdrawn_at = datetime.fromisoformat(d["withdrawn_at"])
                assert d["waited_s"] == pytest.approx((withdrawn_at - asked_at).total_seconds(), abs=0.01)
                assert 0 <= d["waited_s"] < 120
                assert event["causation_id"] is not None  # the human.requested it is about
                # the question is no longer answerable, nor listed
                assert not await listed()
                late = await human.post(f"/requests/{request_id}/answer", json={"text": "yes"}, headers=ALICE_INBOX)
                assert (late.status_code, late.json()["error"]) == (409, "cancelled")
                # another copy of the run's end (a redelivery past the duplicate window, another replica's): no
                # second event -- the request says it was announced
                await served_journal.bus.publish(_run_end(run_id, 2))
                await _stays_one(bus)

        # human-interaction stopped between its publish and the record's mark (a crash): the restarted service,
        # on the next delivery of the run's end, publishes the same event again -- one id, one message
        store = await open_store(bus)
        await store.modify(request_id, lambda r: evolve(r, withdrawal_published=False))
        async with serve_human(tmp_path, nats_settings):
            await served_journal.bus.publish(_run_end(run_id, 3))

            async def marked_again() -> bool:
                got = await store.get(request_id)
                return got is not None and got.value.withdrawal_published

            await eventually(marked_again, what="the restarted human-interaction to announce the withdrawal again")
            await _stays_one(bus)

        # the journal: one event, one withdrawn question, none pending, nothing counted twice
        assert len(await withdrawn_in_journal() or []) == 1
        analytics = await journal.get("/analytics/human", headers=OPERATOR)
        assert analytics.status_code == 200, analytics.text
        a = analytics.json()
        assert (a["requests_total"], a["withdrawn"], a["pending"], a["answered"]) == (1, 1, 0, 0)
