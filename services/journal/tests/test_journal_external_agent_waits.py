"""A run whose card's agent is external (AP-5) is parked ``waiting_for_agent`` while that agent works on a turn:
``agent.task.offered`` parks it on the turn's wait id (``<task id>.turn-<n>``), ``agent.task.acted`` for that turn
wakes it (``resuming``, then ``run.resumed`` -> ``running``); the agent taking the task again (AP-8's
``run.resumed`` ``recovery``) leaves it waiting. Pure projection first, then the real consumer on a real bus
(SQLite and PostgreSQL) with ``GET /runs?state=waiting_for_agent`` and ``GET /runs/waiting``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from journal_support import replay_states

from temporality_protocol import (
    AgentTask,
    AgentTaskActed,
    AgentTaskOffered,
    AgentTaskTaken,
    Envelope,
    EventData,
    RunResumed,
    RunState,
    derive_id,
    make_event,
)
from temporality_protocol.agent_tasks import task_id_for, turn_wait_id

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal

AGENT = "ext-triager"


def _event(s: Any, data: EventData, name: str, *, with_run_id: bool = True) -> Envelope:
    s.at += timedelta(seconds=1)
    event_id = derive_id("evt", s.run_id, name)
    if with_run_id:
        return make_event(data, source="/temporality/test", id=event_id, run_id=s.run_id, time=s.at)
    return make_event(data, source="/temporality/test", id=event_id, time=s.at)  # data.run_id names the run


def _offered(s: Any, turn: int = 1) -> Envelope:
    task_id = task_id_for(s.run_id)
    task = AgentTask(
        run_id=s.run_id,
        task_id=task_id,
        objective=s.title,
        context={"input": {"pr": 42}},
        constraints={"tools": ["ask_human"], "max_turns": 10, "max_compute_s": 600},
        acceptance_criteria=[],
        timeout_s=600,
        priority="normal",
    )
    data = AgentTaskOffered(run_id=s.run_id, task_id=task_id, agent_id=AGENT, turn=turn, task=task)
    return _event(s, data, f"offered.{turn}")


def _taken(s: Any, turn: int = 1, take: int = 1) -> Envelope:
    data = AgentTaskTaken(
        run_id=s.run_id,
        task_id=task_id_for(s.run_id),
        agent_id=AGENT,
        turn=turn,
        take=take,
        session_id=f"s{take}",
        resumed=take > 1,
    )
    return _event(s, data, f"taken.{turn}.{take}", with_run_id=False)


def _acted(s: Any, turn: int = 1, kind: Literal["tool_calls", "result"] = "tool_calls") -> Envelope:
    data = AgentTaskActed(
        run_id=s.run_id,
        task_id=task_id_for(s.run_id),
        agent_id=AGENT,
        turn=turn,
        action_id=f"act-{turn}",
        kind=kind,
        tools=["ask_human"] if kind == "tool_calls" else [],
    )
    return _event(s, data, f"acted.{turn}", with_run_id=False)  # agent-collab's: the run in data.run_id


def _resumed(s: Any, reason: Literal["recovery", "agent_action"], turn: int, name: str) -> Envelope:
    wait = turn_wait_id(task_id_for(s.run_id), turn) if reason == "agent_action" else None
    data = RunResumed(run_id=s.run_id, reason=reason, from_turn=turn - 1, request_id=wait, waited_s=3.0)
    return _event(s, data, f"resumed.{name}")


def test_an_offered_turn_parks_the_run_on_its_external_agent_and_the_action_wakes_it(story: MakeStory) -> None:
    s = story(title="Triage issue 7")
    offered_at = s.at + timedelta(seconds=3)
    states = replay_states(
        [
            s.requested(),
            s.started(),
            _offered(s),
            _taken(s),
            _acted(s),
            _resumed(s, "agent_action", 1, "acted.1"),
            s.completed(),
        ]
    )
    parked = states[2]
    assert parked.state is RunState.WAITING_FOR_AGENT
    assert parked.waiting_request_id == turn_wait_id(task_id_for(s.run_id), 1)
    assert parked.waiting_recipient == f"agent:{AGENT}"
    assert parked.waiting_question == "Triage issue 7"
    assert parked.waiting_since == offered_at
    assert parked.waiting_channel is None
    assert parked.agent == "reviewer"  # the card's name stays the run's agent, not the external agent's id
    assert states[3] == parked  # agent.task.taken moves nothing
    assert [r.state for r in states[4:]] == [RunState.RESUMING, RunState.RUNNING, RunState.COMPLETED]
    assert all(r.waiting_request_id is None and r.waiting_since is None for r in states[4:])


def test_the_agent_taking_the_task_again_leaves_the_run_waiting_and_each_turn_parks_anew(story: MakeStory) -> None:
    s = story()
    states = replay_states(
        [
            s.requested(),
            s.started(),
            _offered(s, 1),
            _acted(s, 1),
            _resumed(s, "agent_action", 1, "acted.1"),
            s.human_requested(),
            s.answered(),
            s.resumed(),
            _offered(s, 2),
            _taken(s, 2, take=2),
            _resumed(s, "recovery", 2, "take.2"),  # AP-8: announced with the offer, before the park
        ]
    )
    assert states[5].state is RunState.WAITING_FOR_HUMAN
    assert states[7].state is RunState.RUNNING
    second = states[8]
    assert second.state is RunState.WAITING_FOR_AGENT
    assert second.waiting_request_id == turn_wait_id(task_id_for(s.run_id), 2)
    after_recovery = states[-1]
    assert after_recovery.state is RunState.WAITING_FOR_AGENT
    assert (after_recovery.waiting_request_id, after_recovery.waiting_since) == (
        second.waiting_request_id,
        second.waiting_since,
    )


def test_an_action_for_another_turn_or_a_late_one_leaves_the_run_alone(story: MakeStory) -> None:
    s = story()
    states = replay_states([s.requested(), s.started(), _offered(s, 2), _acted(s, 1)])
    assert states[-1].state is RunState.WAITING_FOR_AGENT
    t = story()
    ended = replay_states([t.requested(), t.started(), _offered(t), t.cancelled(), _acted(t)])
    assert [r.state for r in ended[-2:]] == [RunState.CANCELLED, RunState.CANCELLED]
    assert ended[-1].waiting_request_id is None


def test_a_recovery_of_a_run_waiting_on_another_agents_answer_still_resumes_it(story: MakeStory) -> None:
    """``ask_agent`` waits (COL-2) are not the run's own agent: ``run.resumed`` moves them on as before."""
    from test_journal_agent_waits import _asked

    s = story()
    states = replay_states([s.requested(), s.started(), _asked(s), _resumed(s, "recovery", 2, "recovery")])
    assert [r.state for r in states[-2:]] == [RunState.WAITING_FOR_AGENT, RunState.RUNNING]


async def test_the_real_consumer_shows_a_run_parked_on_its_external_agent_as_waiting(
    journal: Journal, story: MakeStory
) -> None:
    """The defect: a run of an external agent that nobody works on read ``running``, ``waiting: null`` for its whole
    budget and ``GET /runs?state=waiting_for_agent`` was empty. Through the real consumer on a real bus."""
    now = datetime.now(UTC)
    parked = story(run_id="run-external-parked", title="Triage issue 7", at=now - timedelta(minutes=10))
    woken = story(run_id="run-external-woken", at=now - timedelta(minutes=5))
    await journal.send(
        parked.requested(),
        parked.started(),
        _offered(parked),
        woken.requested(),
        woken.started(),
        _offered(woken),
        _acted(woken),
    )
    waiting = (await journal.client.get("/runs", params={"state": "waiting_for_agent"})).json()["runs"]
    assert [r["run_id"] for r in waiting] == ["run-external-parked"]
    listed = (await journal.client.get("/runs/waiting")).json()["runs"]
    assert [(r["run_id"], r["state"]) for r in listed] == [("run-external-parked", "waiting_for_agent")]
    view = listed[0]["waiting"]
    wait_id = turn_wait_id(task_id_for(parked.run_id), 1)
    assert (view["request_id"], view["recipient"], view["channel"], view["question"]) == (
        wait_id,
        f"agent:{AGENT}",
        None,
        "Triage issue 7",
    )
    assert view["waiting_s"] > 5 * 60
    assert [(r["request_id"], r["status"]) for r in view["requests"]] == [(wait_id, "pending")]
    assert (await journal.run("run-external-woken"))["state"] == "resuming"

    # the agent acts at last: the run leaves the waiting list, and runs on
    await journal.send(_acted(parked), _resumed(parked, "agent_action", 1, "acted.1"))
    run = await journal.run("run-external-parked")
    assert (run["state"], run["waiting"]) == ("running", None)
    assert (await journal.client.get("/runs/waiting")).json()["runs"] == []
