"""A finished run's checkpoint does not stay in KV forever (issue 11); its record does.

First the pure machine, one decision at a time: every ending arms the retention once the end is committed;
its firing removes the checkpoint only of a run still finished; every path that meets a finished run
without its checkpoint (a late answer or agent message, a replayed ``run.requested``, a late watchdog
firing, a dead letter, a cancel, a second firing) behaves as before, and one that meets it *with* its
checkpoint arms the retention again (a driver that died between the end and the arm). Then the service
itself over a real nats-server, wired by ``__main__``: a run completes with a retention of 1 s, its
checkpoint disappears, its record stays, and a late answer still gives ``run.input_after_end``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from executor_support import REVIEWER, executor_main, handled, keep_v1, run_record, run_requested, settled, write_run
from machine_support import T0, late_agent_answer, make_checkpoint, make_run

from temporality_bus import Bus, NatsSettings
from temporality_protocol import (
    CONTENT_TYPE,
    Envelope,
    HumanAnswered,
    HumanPolicy,
    HumanRequested,
    RunCancelRequested,
    RunCreated,
    RunInputAfterEnd,
    RunRequested,
    RunState,
    derive_id,
    encode,
    make_event,
)
from temporality_protocol.catalog import (
    BUCKET_CHECKPOINTS,
    CONSUMERS,
    DLQ_STREAM,
    SERVICES,
    TIMER_FIRED_PREFIX,
    TIMER_NS_RUN_RETENTION,
    TIMER_SCHEDULE_PREFIX,
    TIMERS_STREAMS,
)
from temporality_run_executor.machine import (
    Agent,
    ArmRetention,
    Boundary,
    CancelRecorded,
    CancelRequested,
    DeadLettered,
    Decision,
    DisarmWatchdog,
    FlagCancel,
    Incoming,
    MarkPublished,
    Note,
    ProviderReplied,
    Publish,
    RemoveCheckpoint,
    Requested,
    RetentionFired,
    Transition,
    WatchdogFired,
    decide,
    flagged,
    human_outcome,
)
from temporality_run_executor.providers import AssistantTurn
from temporality_run_executor.records import CancelRequest, Checkpoint, RunRecord
from temporality_run_executor.retention import DEFAULT_RETENTION_S, RetentionPayload
from temporality_run_executor.settings import Settings
from temporality_run_executor.tools import BUILTIN_TOOLS, ToolRegistry
from temporality_run_executor.watchdog import WatchdogPayload
from temporality_testing.events import EventLog
from temporality_testing.inprocess import serving
from temporality_testing.timers import armed_schedules
from temporality_testing.waiting import stays

RUN_ID = "run-ret-1"
AGENT = Agent(REVIEWER, ToolRegistry(BUILTIN_TOOLS))
REQUEST_ID = derive_id("hr", RUN_ID, "1", "0")
FINISHED = (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED)
RETENTION = CONSUMERS["run-executor-retention"]


_run = partial(make_run, RUN_ID, human=HumanPolicy(allowed_recipients=["user:alice"], default_timeout_s=600))


_ckpt = partial(make_checkpoint, RUN_ID)


def _decide(run: RunRecord | None, ckpt: Checkpoint | None, incoming: Incoming) -> Decision:
    return decide(run, ckpt, AGENT, incoming, now=T0 + timedelta(minutes=5))


def _acts(decision: Decision) -> list[Any]:
    """The effects that do something (log lines left out)."""
    return [e for e in decision.effects if not isinstance(e, Note)]


def _answered() -> HumanAnswered:
    return keep_v1(RUN_ID, REQUEST_ID, waited_s=30.0)


def _fired(run_id: str = RUN_ID) -> RetentionFired:
    return RetentionFired(RetentionPayload(run_id=run_id, ended_at=T0, deadline=T0 + timedelta(seconds=1)))


# --------------------------------------------------------------------------- armed at every ending
def _completed() -> Decision:
    reply = AssistantTurn(content="LGTM")
    return _decide(_run(RunState.RUNNING), _ckpt(), ProviderReplied(turn=2, reply=reply, elapsed_s=0.5))


def _failed() -> Decision:  # the watchdog: no progress since the arm
    payload = WatchdogPayload(run_id=RUN_ID, turn=1, armed_at=T0, deadline=T0 + timedelta(seconds=1200))
    return _decide(_run(RunState.RUNNING), _ckpt(), WatchdogFired(payload, grace_s=300.0))


def _cancelled() -> Decision:  # a parked run asked to stop
    cancel = CancelRequest(reason="wrong PR", requested_by="on-call", requested_at=T0, event_id="evt-c")
    return _decide(_run(RunState.WAITING_FOR_HUMAN, cancel=cancel), _ckpt(), CancelRecorded("on-call"))


@pytest.mark.parametrize(
    ("ending", "state"),
    [(_completed, RunState.COMPLETED), (_failed, RunState.FAILED), (_cancelled, RunState.CANCELLED)],
    ids=["completed", "failed", "cancelled"],
)
def test_every_ending_arms_the_retention_once_the_end_is_committed(
    ending: Callable[[], Decision], state: RunState
) -> None:
    decision = ending()
    acts = _acts(decision)
    kinds = [type(e).__name__ for e in acts]
    assert kinds.count("ArmRetention") == 1
    (move,) = [e for e in acts if isinstance(e, Transition)]
    assert move.target is state
    # after the move: a timer armed first could fire on a run that is still going, and find nothing to do
    assert kinds.index("ArmRetention") > kinds.index("Transition")
    assert acts[-3:] == [DisarmWatchdog(), ArmRetention(), MarkPublished()]  # the mark once they are acknowledged
    assert decision.then is None
    assert not any(isinstance(e, RemoveCheckpoint) for e in acts)  # the firing removes it, never the ending


def test_no_decision_on_a_run_still_going_arms_it() -> None:
    running, ckpt = _run(RunState.RUNNING), _ckpt()
    for incoming in (Boundary(), human_outcome("human.answered", "evt-a", _answered())):
        assert not any(isinstance(e, ArmRetention) for e in _decide(running, ckpt, incoming).effects)
    waiting = _run(RunState.WAITING_FOR_HUMAN, waiting_request_id="hr-other")
    assert not any(isinstance(e, ArmRetention) for e in _decide(waiting, ckpt, _fired()).effects)


# --------------------------------------------------------------------------- the firing
@pytest.mark.parametrize("state", FINISHED)
def test_a_firing_removes_the_checkpoint_of_a_finished_run_and_a_repeat_does_nothing(state: RunState) -> None:
    assert _acts(_decide(_run(state), _ckpt(), _fired())) == [RemoveCheckpoint()]
    again = _decide(_run(state), None, _fired())  # redelivered (or a second arm's firing): removed already
    assert (_acts(again), again.then) == ([], None)
    assert [n.event for n in again.effects if isinstance(n, Note)] == ["retention.already_removed"]


@pytest.mark.parametrize("state", [RunState.PENDING, RunState.RUNNING, RunState.WAITING_FOR_HUMAN, RunState.RESUMING])
def test_a_firing_never_removes_the_checkpoint_of_a_run_not_finished(state: RunState) -> None:
    decision = _decide(_run(state), _ckpt(), _fired())
    assert (_acts(decision), decision.then) == ([], None)
    (note,) = decision.effects
    assert isinstance(note, Note)
    assert (note.event, note.level) == ("retention.run_not_finished", "warning")
    unknown = _decide(None, None, _fired("run-nobody"))
    assert (_acts(unknown), unknown.then) == ([], None)


# --------------------------------------------------------------------------- a finished run without its checkpoint
def _requested() -> Requested:
    return Requested(request=run_requested(RUN_ID).payload(RunRequested), correlation_id=RUN_ID)


def _late_watchdog() -> Incoming:
    payload = WatchdogPayload(run_id=RUN_ID, turn=1, armed_at=T0, deadline=T0 + timedelta(seconds=1200))
    return WatchdogFired(payload, grace_s=300.0)


def _dead_letter() -> Incoming:
    return DeadLettered("run.requested", "evt-rr", None, deliveries=8, error="TransientError: boom")


#: What each of them does to a finished run, checkpoint or not: the same effects but the retention's.
AFTER_END: dict[str, tuple[Callable[[], Incoming], list[type]]] = {
    "late-answer": (lambda: human_outcome("human.answered", "evt-late", _answered()), [Publish]),
    "late-agent-answer": (partial(late_agent_answer, RUN_ID), [Publish]),
    "replayed-run-requested": (_requested, [Publish]),
    "late-watchdog-firing": (_late_watchdog, []),
    "dead-letter": (_dead_letter, []),
    "cancel-recorded": (lambda: CancelRecorded("on-call"), []),
}


@pytest.mark.parametrize("state", FINISHED)
@pytest.mark.parametrize("name", list(AFTER_END))
def test_a_finished_run_without_its_checkpoint_behaves_as_before(name: str, state: RunState) -> None:
    make, effects = AFTER_END[name]
    gone = _decide(_run(state), None, make())
    assert [type(e) for e in _acts(gone)] == effects
    assert gone.then is None  # nothing retried, created or driven: the checkpoint is not looked for
    kept = _decide(_run(state), _ckpt(), make())
    assert _acts(kept) == [*_acts(gone), ArmRetention()]  # still there: armed again, nothing else differs
    assert kept.then is None


@pytest.mark.parametrize("state", FINISHED)
def test_a_late_input_is_journaled_and_a_replayed_request_is_a_duplicate(state: RunState) -> None:
    (after,) = _acts(_decide(_run(state), None, human_outcome("human.answered", "evt-late", _answered())))
    assert isinstance(after, Publish)
    assert after.data == RunInputAfterEnd(
        run_id=RUN_ID,
        state=state.value,
        input_type="human.answered",
        input_id="evt-late",
        request_id=REQUEST_ID,
        sender="user:alice",
        detail=f"run {RUN_ID} is {state.value}: the answer to {REQUEST_ID} was not applied",
    )
    (agent,) = _acts(_decide(_run(state), None, late_agent_answer(RUN_ID)))
    assert isinstance(agent, Publish)
    assert isinstance(agent.data, RunInputAfterEnd)
    replay = _decide(_run(state), None, _requested())
    (created,) = _acts(replay)
    assert isinstance(created, Publish)
    assert isinstance(created.data, RunCreated)  # its deterministic id: a deduplicated repeat
    assert [n.event for n in replay.effects if isinstance(n, Note)] == ["run.requested.duplicate"]


@pytest.mark.parametrize("state", FINISHED)
def test_a_cancel_for_a_finished_run_without_its_checkpoint_is_ignored(state: RunState) -> None:
    cancel = CancelRequested(run_id=RUN_ID, reason="late", requested_by="on-call", event_id="evt-cancel")
    first = _decide(_run(state), None, cancel)
    (flag,) = _acts(first)
    assert isinstance(flag, FlagCancel)
    assert flagged(_run(state), flag.request, T0) is None  # a finished record is not rewritten
    assert first.then == CancelRecorded("on-call")
    ignored = _decide(_run(state), None, CancelRecorded("on-call"))
    assert (_acts(ignored), ignored.then) == ([], None)
    assert [n.event for n in ignored.effects if isinstance(n, Note)] == ["run.cancel.ignored"]


def test_a_driver_that_died_between_the_end_and_the_arm_is_repaired_by_its_redelivery() -> None:
    """The cancel's handler moved the run to cancelled and died before arming; its message comes back."""
    ending = _cancelled()
    upto = [type(e) for e in ending.effects].index(Transition) + 1
    assert ArmRetention() not in ending.effects[:upto]  # what the dead driver got done: the end, no timer
    cancelled = _run(RunState.CANCELLED, cancel=None)
    redelivered = CancelRequested(run_id=RUN_ID, reason="wrong PR", requested_by="on-call", event_id="evt-c")
    flag = _decide(cancelled, _ckpt(), redelivered)
    assert flag.then == CancelRecorded("on-call")
    assert ArmRetention() in _decide(cancelled, _ckpt(), CancelRecorded("on-call")).effects


# --------------------------------------------------------------------------- the service, over a real nats-server
async def _checkpoint(bus: Bus, run_id: str) -> Checkpoint | None:
    got = await (await bus.store(BUCKET_CHECKPOINTS, Checkpoint)).get(run_id)
    return got.value if got is not None else None


async def _until(check: Callable[[], Awaitable[bool]], what: str, *, timeout_s: float = 30) -> None:
    """Wait (bounded) until ``check`` holds; AssertionError naming ``what`` otherwise."""
    try:
        async with asyncio.timeout(timeout_s):
            while not await check():  # noqa: ASYNC110 - polling the server's view
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {timeout_s}s") from None


async def _gone(bus: Bus, run_id: str) -> None:
    async def removed() -> bool:
        return await _checkpoint(bus, run_id) is None

    await _until(removed, f"the checkpoint of {run_id} removed")


async def _again(bus: Bus, event: Envelope) -> int:
    """The very same CloudEvent once more (a replay past the duplicate window); its stream sequence."""
    headers = {"Nats-Msg-Id": f"{event.id}#again", "Content-Type": CONTENT_TYPE, "Ce-Type": event.type}
    return (await bus.publish_raw(event.nats_subject, encode(event), headers)).seq


async def _dead_letters(bus: Bus) -> int:
    return (await bus.js.stream_info(DLQ_STREAM.name)).state.messages


def _schedule_subject(run_id: str) -> str:
    return f"{TIMER_SCHEDULE_PREFIX}.{TIMER_NS_RUN_RETENTION}.{run_id}"


@pytest.fixture
def serve_executor(nats_settings: NatsSettings, tmp_path: Path) -> Callable[[float], Any]:
    agents = tmp_path / "agents.yaml"
    agents.write_text(json.dumps({"agents": [REVIEWER.model_dump(mode="json")]}), encoding="utf-8")  # JSON is YAML

    def serve(retention_s: float) -> Any:
        settings = Settings(nats=nats_settings, agents_file=agents, checkpoint_retention_s=retention_s)
        return serving(("run-executor", executor_main(settings)))

    return serve


def test_the_executor_declares_the_retention_timers_and_their_consumer() -> None:
    spec = SERVICES["run-executor"]
    assert TIMER_NS_RUN_RETENTION in spec.timers
    assert RETENTION.durable in spec.consumers
    assert RETENTION.filter_subjects == (f"{TIMER_FIRED_PREFIX}.{TIMER_NS_RUN_RETENTION}.>",)
    assert RETENTION.stream == TIMERS_STREAMS["run-executor"].name
    assert RETENTION.max_deliver == -1  # a firing is never dead-lettered for a bus failure
    assert Settings().checkpoint_retention_s == DEFAULT_RETENTION_S == 3 * 24 * 3600


async def test_a_finished_runs_checkpoint_is_removed_after_its_retention_and_its_record_stays(
    bus: Bus, event_log: EventLog, serve_executor: Callable[[float], Any]
) -> None:
    async with serve_executor(1.0):
        event = run_requested()
        run_id = event.runid
        assert run_id
        await bus.publish(event)
        (requested,) = await event_log.wait_for("human.requested", run_id=run_id)
        await run_record(bus, run_id, RunState.WAITING_FOR_HUMAN)
        parked = await _checkpoint(bus, run_id)
        assert parked is not None  # a parked run keeps it (it resumes from it)
        assert parked.pending is not None
        assert await armed_schedules(bus, _schedule_subject(run_id)) == 0  # not finished: nothing armed
        request_id = requested.payload(HumanRequested).request_id
        answered = keep_v1(run_id, request_id)
        await bus.publish(make_event(answered, source="/test", id=f"evt-ans-{run_id}", run_id=run_id))
        await event_log.wait_for("run.completed", run_id=run_id)
        # finished, and its event marked published on it (the record's last change)
        done = await run_record(bus, run_id, lambda r: r.ending is not None and r.ending.published)
        assert done.state is RunState.COMPLETED

        await _gone(bus, run_id)  # 1 s after the end (schedules fire on whole seconds)
        assert await run_record(bus, run_id, RunState.COMPLETED) == done  # the record stays, unchanged
        dead = await _dead_letters(bus)

        # a late answer (another event for the same request): journaled, not applied, nothing dead-lettered
        late = make_event(answered, source="/test", id=f"evt-ans-late-{run_id}", run_id=run_id)
        await bus.publish(late)
        (after,) = await event_log.wait_for("run.input_after_end", run_id=run_id)
        data = after.payload(RunInputAfterEnd)
        assert (data.state, data.input_id, data.request_id) == ("completed", late.id, request_id)
        # a replayed run.requested: a duplicate, not a second run (the record is what says so)
        replay = await _again(bus, event)
        await handled(bus, "run-executor-requests", replay)
        # a second firing of the retention (a redelivery): nothing to do
        payload = RetentionPayload(run_id=run_id, ended_at=done.updated_at, deadline=done.updated_at)
        fired = await bus.publish_raw(
            f"{TIMER_FIRED_PREFIX}.{TIMER_NS_RUN_RETENTION}.{run_id}", payload.model_dump_json().encode(), {}
        )
        await handled(bus, RETENTION.durable, fired.seq, stream=TIMERS_STREAMS["run-executor"].name)
        await settled(bus)
        await event_log.caught_up()
        assert len(event_log.of_type("run.started", run_id)) == 1
        assert len(event_log.of_type("run.completed", run_id)) == 1
        assert await run_record(bus, run_id, RunState.COMPLETED) == done
        assert await _checkpoint(bus, run_id) is None  # nothing brought it back
        assert await _dead_letters(bus) == dead
        assert event_log.of_type("bus.dead_lettered") == []


async def test_the_retention_is_armed_at_the_end_plus_the_setting_and_the_checkpoint_kept_meanwhile(
    bus: Bus, event_log: EventLog, serve_executor: Callable[[float], Any]
) -> None:
    pr = json.loads(json.dumps(run_requested().payload(RunRequested).input))
    pr["pull_request"]["title"], pr["pull_request"]["description"] = "Fix typo", "Spelling."  # nothing to ask
    async with serve_executor(DEFAULT_RETENTION_S):
        event = run_requested(pr=pr)
        run_id = event.runid
        assert run_id
        await bus.publish(event)
        await event_log.wait_for("run.completed", run_id=run_id)
        done = await run_record(bus, run_id, RunState.COMPLETED)

        async def armed() -> bool:
            return await armed_schedules(bus, _schedule_subject(run_id)) == 1

        await _until(armed, f"the retention of {run_id} armed")  # right after the end's move
        schedule = await bus.js.get_last_msg(TIMERS_STREAMS["run-executor"].name, _schedule_subject(run_id))
        payload = RetentionPayload.model_validate_json(schedule.data or b"")
        assert (payload.run_id, payload.ended_at) == (run_id, done.updated_at)
        assert payload.deadline - payload.ended_at == timedelta(seconds=DEFAULT_RETENTION_S)

        async def kept() -> bool:
            return await _checkpoint(bus, run_id) is not None

        await stays(kept, settle_s=2.0, what=f"the checkpoint of {run_id}")


async def test_a_finished_run_left_with_its_checkpoint_and_no_timer_loses_it_when_a_message_reaches_it(
    bus: Bus, event_log: EventLog, serve_executor: Callable[[float], Any]
) -> None:
    """A driver that died between the end and the arm, or a run that finished before retention existed:
    nothing armed; the next message for the run (here a cancel, as a redelivery would be) arms it."""
    async with serve_executor(1.0):
        run_id = "run-ret-left"
        await write_run(bus, run_id, RunState.FAILED, turn=3)  # updated_at = now: the deadline is 1 s out
        running = "run-ret-running"
        await write_run(bus, running, RunState.RUNNING, turn=1)

        async def kept(rid: str) -> bool:
            return await _checkpoint(bus, rid) is not None

        await stays(lambda: kept(run_id), settle_s=1.5, what="an unarmed checkpoint")  # no timer: kept
        cancel = RunCancelRequested(run_id=run_id, reason="late", requested_by="on-call")
        await bus.publish(make_event(cancel, source="/test", run_id=run_id))
        await _gone(bus, run_id)
        assert (await run_record(bus, run_id, RunState.FAILED)).cancel is None

        # a firing for a run not finished (never armed so in the service: a run id used twice) removes nothing
        now = datetime.now(UTC)
        payload = RetentionPayload(run_id=running, ended_at=now, deadline=now)
        fired = await bus.publish_raw(
            f"{TIMER_FIRED_PREFIX}.{TIMER_NS_RUN_RETENTION}.{running}", payload.model_dump_json().encode(), {}
        )
        await handled(bus, RETENTION.durable, fired.seq, stream=TIMERS_STREAMS["run-executor"].name)
        assert await kept(running)
        await run_record(bus, running, RunState.RUNNING)
