"""COL-9 in the journal: the ``agent.*`` events projected onto asks, ``/asks``, ``/runs/{id}/asks``, relay run ids."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from temporality_journal import Recorder
from temporality_journal.asks import ask_rank, project_ask
from temporality_journal.models import AskSnapshot
from temporality_protocol import Envelope, EventData, RunCompleted, RunStarted, derive_id, make_event
from temporality_protocol.events import (
    AgentAnswerReceived,
    AgentAsked,
    AgentAskExpired,
    AgentAskUndeliverable,
    AgentMessageReceived,
    AgentReplied,
    AgentReplyUndeliverable,
)
from temporality_protocol.states import AGENT_ASK, AgentAskState

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal
T0 = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)
SAGA = "saga-1"


def _ev(data: EventData, run_id: str, at: float, name: str = "") -> Envelope:
    return make_event(
        data,
        source="/temporality/test",
        id=derive_id("evt", data.EVENT_TYPE, getattr(data, "request_id", ""), run_id, name),
        run_id=run_id,
        correlation_id=SAGA,
        time=T0 + timedelta(seconds=at),
    )


def _asked(rid: str, asker: str, to: str, *, mode: str = "async", at: float = 0) -> Envelope:
    data = AgentAsked(
        request_id=rid, asker_run_id=asker, asker_agent="planner", to=to, mode=mode, message="Is PR 42 safe?"
    )
    return _ev(data, asker, at)


def _received(rid: str, asker: str, target: str, recipient: str, *, at: float = 1, relay: bool = False) -> Envelope:
    data = AgentMessageReceived(
        request_id=rid,
        asker_run_id=asker,
        asker_agent="planner",
        to="agent:reviewer",
        resolved_run_id=target,
        resolved_agent="reviewer",
        recipient_run_id=recipient,
        mode="async",
        timeout_s=300,
        message="Is PR 42 safe?",
        relay=relay,
        relay_run=recipient if relay else None,
    )
    return _ev(data, recipient, at)


def _replied(rid: str, replier: str, *, at: float = 2, outcome: str = "answer") -> Envelope:
    data = AgentReplied(
        request_id=rid, replier_run_id=replier, replier_agent="reviewer", outcome=outcome, answer="Yes, merge it"
    )
    return _ev(data, replier, at)


def _answered(rid: str, asker: str, replier: str, *, at: float = 3, late: bool = False) -> Envelope:
    data = AgentAnswerReceived(
        request_id=rid,
        asker_run_id=asker,
        replier_run_id=replier,
        replier_agent="reviewer",
        outcome="answer",
        answer="Yes, merge it",
        mode="async",
        late=late,
        waited_s=2.0,
    )
    return _ev(data, asker, at)


def _apply(events: list[Envelope]) -> AskSnapshot | None:
    ask: AskSnapshot | None = None
    for seq, event in enumerate(events, start=1):
        ask = project_ask(ask, event, seq) or ask
    return ask


# --------------------------------------------------------------------------- the pure projection
def test_the_rank_only_grows_along_the_protocols_state_machine() -> None:
    for state, targets in AGENT_ASK.transitions.items():
        for target in targets:
            assert ask_rank(target) > ask_rank(state), (state, target)


def test_a_wait_ask_that_expired_and_was_answered_late() -> None:
    asked = _asked("req-a", "run-p", "agent:reviewer", mode="wait")
    expired = _ev(
        AgentAskExpired(
            request_id="req-a", asker_run_id="run-p", recipient_run_id="run-r", timeout_s=300, waited_s=300
        ),
        "run-p",
        301,
    )
    events = [asked, _received("req-a", "run-p", "run-r", "run-r"), expired, _replied("req-a", "run-r", at=400)]
    ask = _apply([*events, _answered("req-a", "run-p", "run-r", at=401, late=True)])
    assert ask is not None
    assert ask.state == AgentAskState.ANSWERED
    assert (ask.to_address, ask.resolved_run_id, ask.recipient_run_id) == ("agent:reviewer", "run-r", "run-r")
    assert (ask.late, ask.outcome, ask.answer, ask.correlation_id) == (True, "answer", "Yes, merge it", SAGA)
    assert ask.expired_at == T0 + timedelta(seconds=301)
    assert ask.finished_at == T0 + timedelta(seconds=401)
    # every event again, in any order: nothing changes
    for seq, event in enumerate([*events, _answered("req-a", "run-p", "run-r", at=401, late=True)], start=1):
        assert project_ask(ask, event, seq) is None


def test_out_of_order_events_never_move_an_ask_back() -> None:
    ask = _apply([_answered("req-b", "run-p", "run-r"), _received("req-b", "run-p", "run-r", "run-r")])
    assert ask is not None
    assert ask.state == AgentAskState.ANSWERED
    assert ask.resolved_run_id == "run-r"  # the late event still fills what was blank
    assert ask.asked_at == T0 + timedelta(seconds=1)
    late_ask = project_ask(ask, _asked("req-b", "run-p", "agent:reviewer", at=0), 3)
    assert late_ask is not None
    assert late_ask.state == AgentAskState.ANSWERED
    assert late_ask.asked_at == T0


def test_refusals_of_replies_move_an_ask_only_when_the_asker_had_finished() -> None:
    delivered = _apply([_asked("req-c", "run-p", "agent:reviewer"), _received("req-c", "run-p", "run-r", "run-r")])
    assert delivered is not None
    wrong = _replied("req-c", "run-x")  # not the recipient: agent-collab refuses it
    assert project_ask(delivered, wrong, 3) is None
    for reason in ("unknown_request", "not_received", "already_answered", "request_closed"):
        refusal = AgentReplyUndeliverable(request_id="req-c", replier_run_id="run-x", reason=reason, detail="no")
        assert project_ask(delivered, _ev(refusal, "run-x", 4, reason), 4) is None
        assert project_ask(None, _ev(refusal, "run-x", 4, reason), 4) is None
    finished = AgentReplyUndeliverable(
        request_id="req-c", replier_run_id="run-r", asker_run_id="run-p", reason="asker_finished", detail="gone"
    )
    after = _apply([_asked("req-c", "run-p", "agent:reviewer"), _replied("req-c", "run-r"), _ev(finished, "run-r", 5)])
    assert after is not None
    assert after.state == AgentAskState.REPLY_UNDELIVERABLE
    assert (after.reason, after.answer, after.replier_run_id) == ("asker_finished", "Yes, merge it", "run-r")


# --------------------------------------------------------------------------- the table and the API
async def _record(recorder: Recorder, *events: Envelope) -> None:
    await recorder.record_batch([(e, 10_000 + i) for i, e in enumerate(events)])


async def test_asks_are_projected_and_served_per_run_and_filtered(journal: Journal, story: MakeStory) -> None:
    asker, target = story(agent="planner"), story()
    relay = f"{target.run_id}/ask/01"
    relay_started = make_event(
        RunStarted(run_id=relay, agent="reviewer", role="reviewer", title="Relay"),
        source="/temporality/test",
        id=derive_id("evt", relay, "started"),
        run_id=relay,
    )
    relay_completed = make_event(
        RunCompleted(run_id=relay, result="answered", turns=1),
        source="/temporality/test",
        id=derive_id("evt", relay, "completed"),
        run_id=relay,
    )
    undeliverable = AgentAskUndeliverable(
        request_id="req-nobody",
        asker_run_id=asker.run_id,
        to="agent:ghost",
        reason="unknown_addressee",
        detail="no agent or run 'agent:ghost' in your saga",
    )
    await _record(
        journal.recorder,
        asker.requested(),
        asker.started(),
        target.requested(),
        target.started(),
        target.completed(),
        _asked("req-relay", asker.run_id, "agent:reviewer"),
        relay_started,
        _received("req-relay", asker.run_id, target.run_id, relay, relay=True),
    )
    # the same events again (a redelivered batch), then the rest one by one: the same rows as in one batch
    await _record(journal.recorder, _asked("req-relay", asker.run_id, "agent:reviewer"))
    for event in (
        _replied("req-relay", relay),
        _answered("req-relay", asker.run_id, relay),
        relay_completed,
        _asked("req-nobody", asker.run_id, "agent:ghost", at=10),
        _ev(undeliverable, asker.run_id, 11),
    ):
        await journal.recorder.record(event, 20_000)
    client = journal.client

    sent = (await client.get(f"/runs/{asker.run_id}/asks")).json()
    assert [(a["request_id"], a["state"]) for a in sent["sent"]] == [
        ("req-relay", "answered"),
        ("req-nobody", "undeliverable"),
    ]
    relayed, nobody = sent["sent"]
    assert relayed["relay"] is True
    assert relayed["relay_run"] == relay
    assert relayed["resolved_run_id"] == target.run_id
    assert relayed["answer"] == "Yes, merge it"
    assert relayed["replier_run_id"] == relay
    assert relayed["saga_id"] == SAGA
    assert nobody["to"] == "agent:ghost"
    assert nobody["reason"] == "unknown_addressee"
    assert nobody["detail"]
    assert sent["received"] == []

    # relay run ids contain "/": every run route takes them, raw or percent-encoded
    for path in (relay, quote(relay, safe="")):
        mine = (await client.get(f"/runs/{path}/asks")).json()
        assert [a["request_id"] for a in mine["received"]] == ["req-relay"]
        assert mine["sent"] == []
        run = await client.get(f"/runs/{path}")
        assert run.status_code == 200
        assert run.json()["run_id"] == relay
        assert run.json()["state"] == "completed"
        events = (await client.get(f"/runs/{path}/events")).json()
        assert events["run_id"] == relay
        assert [e["type"] for e in events["events"]] == [
            "run.started",
            "agent.message.received",
            "agent.replied",
            "run.completed",
        ]
    target_asks = (await client.get(f"/runs/{target.run_id}/asks")).json()
    assert [a["request_id"] for a in target_asks["received"]] == ["req-relay"]  # answered for it by the relay
    assert (await client.get(f"/runs/{quote(relay, safe='')}/asks/x")).status_code == 404
    gone = await client.get("/runs/run-nope/ask/01/asks")
    assert gone.status_code == 404
    assert gone.json()["error"] == "run_not_found"

    async def ids(**params: Any) -> list[str]:
        response = await client.get("/asks", params=params)
        assert response.status_code == 200, response.text
        return [a["request_id"] for a in response.json()["asks"]]

    assert await ids() == ["req-nobody", "req-relay"]
    assert await ids(state="undeliverable") == ["req-nobody"]
    assert await ids(agent="reviewer") == ["req-relay"]
    assert await ids(agent="planner", saga_id=SAGA) == ["req-nobody", "req-relay"]
    assert await ids(saga_id="saga-other") == []
    assert await ids(run_id=relay) == ["req-relay"]
    first = (await client.get("/asks", params={"limit": 1})).json()
    assert [a["request_id"] for a in first["asks"]] == ["req-nobody"]
    assert first["next_before"]
    assert await ids(limit=1, before=first["next_before"]) == ["req-relay"]
    bad = await client.get("/asks", params={"state": "lost"})
    assert bad.status_code == 422
    assert "state" in bad.text
