"""HUM-7 in the run projection: a turn that asks several questions at once parks the run once.

The run-executor publishes one ``human.requested`` per question and resumes the run (``run.resumed``)
when its continuation policy says so: every question answered (``wait_for: all``), or the first answer
(``wait_for: first``). The journal's row shows the run waiting until then, whatever order the answers
come in, and nothing waiting after it resumed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from journal_support import replay

from temporality_journal import RunSnapshot, project
from temporality_protocol import RunState

MakeStory = Callable[..., Any]  # journal_support.RunStory


def _cleared(run: RunSnapshot) -> bool:
    fields = (run.waiting_request_id, run.waiting_recipient, run.waiting_channel, run.waiting_since)
    return all(v is None for v in (*fields, run.waiting_question))


def test_two_questions_answered_in_reverse_order_keep_the_run_waiting_until_it_resumes(story: MakeStory) -> None:
    alice = story(request_id="hreq-a")
    bob = story(run_id=alice.run_id, request_id="hreq-b")
    asked_a = alice.human_requested(recipient="user:alice", question="Ship v2?")
    run = replay([alice.requested(), alice.started(), asked_a, alice.notified("web")])
    assert (run.state, run.waiting_request_id, run.waiting_channel) == (RunState.WAITING_FOR_HUMAN, "hreq-a", "web")

    run = replay([bob.human_requested(recipient="user:bob", question="Keep v1?")], run, first_seq=5)
    # several at once: no single request is "the" one; whom and what are all shown, since when unchanged
    assert run.state == RunState.WAITING_FOR_HUMAN
    assert run.waiting_request_id is None
    assert run.waiting_recipient == "user:alice, user:bob"
    assert run.waiting_question == "Ship v2? | Keep v1?"
    assert run.waiting_since == asked_a.time
    assert run.waiting_channel is None
    assert project(run, bob.notified("web"), 6) is None  # which request it is for is not known here

    # bob answers first, then alice: neither answer moves the run, the executor's run.resumed does
    for seq, answer in ((7, bob.answered()), (8, alice.answered())):
        assert project(run, answer, seq) is None, answer.data["request_id"]
    resumed = replay([alice.resumed()], run, first_seq=9)
    assert resumed.state == RunState.RUNNING
    assert _cleared(resumed)
    done = replay([alice.completed("both answered")], resumed, first_seq=10)
    assert (done.state, done.result) == (RunState.COMPLETED, "both answered")
    assert _cleared(done)


def test_first_answer_resumes_and_a_late_answer_to_the_other_question_changes_nothing(story: MakeStory) -> None:
    alice = story(request_id="hreq-a")
    bob = story(run_id=alice.run_id, request_id="hreq-b")
    run = replay(
        [
            alice.requested(),
            alice.started(),
            alice.human_requested(recipient="user:alice"),
            bob.human_requested(recipient="user:bob"),
            bob.answered(),
            bob.resumed(),
        ]
    )
    assert run.state == RunState.RUNNING
    assert _cleared(run)
    assert project(run, alice.answered(), 7) is None  # not needed any more: the run has moved on
    assert project(run, alice.notified("web"), 8) is None


def test_one_person_asked_twice_is_shown_once(story: MakeStory) -> None:
    first = story(request_id="hreq-1")
    second = story(run_id=first.run_id, request_id="hreq-2")
    run = replay(
        [
            first.requested(),
            first.started(),
            first.human_requested(recipient="user:alice", question="Q1"),
            second.human_requested(recipient="user:alice", question="Q2"),
        ]
    )
    assert (run.waiting_recipient, run.waiting_question) == ("user:alice", "Q1 | Q2")


def test_the_same_second_request_projected_again_changes_nothing(story: MakeStory) -> None:
    alice = story(request_id="hreq-a")
    bob = story(run_id=alice.run_id, request_id="hreq-b")
    asked_b = bob.human_requested(recipient="user:bob", question="Keep v1?")
    run = replay([alice.requested(), alice.started(), alice.human_requested(), asked_b])
    assert project(run, asked_b, 4) is None  # redelivered: not newer than what the row has seen
    again = project(run, asked_b, 5)  # even as a newer copy: already shown, once
    assert again is not None
    assert (again.waiting_recipient, again.waiting_question) == (run.waiting_recipient, run.waiting_question)


def test_a_single_question_still_moves_through_resuming(story: MakeStory) -> None:
    s = story()
    run = replay([s.requested(), s.started(), s.human_requested(), s.answered()])
    assert run.state == RunState.RESUMING
    assert _cleared(replay([s.resumed()], run, first_seq=5))


# --------------------------------------------------------------------------- the API: each question of the wait
Journal = Any  # conftest.Journal


async def test_the_api_lists_each_question_of_a_several_wait_with_its_channel_and_outcome(
    journal: Journal, story: MakeStory
) -> None:
    first = story(request_id="hreq-t1")  # turn 1: one question, answered; the run went on
    alice = story(run_id=first.run_id, request_id="hreq-a2")  # turn 2: two at once
    bob = story(run_id=first.run_id, request_id="hreq-b2")
    single = story(request_id="hreq-s")  # another run: one question
    await journal.send(
        first.requested(),
        first.started(),
        first.human_requested(recipient="user:alice", question="Old question?"),
        first.answered(),
        first.resumed(),
        alice.human_requested(recipient="user:alice", question="Ship v2?", turn=2),
        bob.human_requested(recipient="user:bob", question="Keep v1?", turn=2),
        alice.notified("web"),
        bob.notified("matrix"),
        bob.answered(responder="user:bob", channel="matrix"),
        single.requested(),
        single.started(),
        single.human_requested(recipient="user:carol", question="Deploy?"),
        single.notified("telegram"),
    )

    def questions(run: dict[str, Any]) -> list[tuple[Any, ...]]:
        assert run["state"] == "waiting_for_human", run
        return [
            (q["request_id"], q["recipient"], q["question"], q["channel"], q["status"], q["responder"])
            for q in run["waiting"]["requests"]
        ]

    several = [
        ("hreq-a2", "user:alice", "Ship v2?", "web", "pending", None),
        ("hreq-b2", "user:bob", "Keep v1?", "matrix", "answered", "user:bob"),
    ]
    one = [("hreq-s", "user:carol", "Deploy?", "telegram", "pending", None)]
    run = await journal.run(first.run_id)
    assert run["waiting"]["request_id"] is None  # the row's summary says "several"; the list says which
    assert questions(run) == several  # turn 1's question is not part of this wait
    assert questions(await journal.run(single.run_id)) == one

    waiting = (await journal.client.get("/runs/waiting")).json()["runs"]
    assert {r["run_id"]: questions(r) for r in waiting} == {first.run_id: several, single.run_id: one}
    listed = (await journal.client.get("/runs", params={"state": "waiting_for_human"})).json()["runs"]
    assert {r["run_id"]: questions(r) for r in listed} == {first.run_id: several, single.run_id: one}

    # the run resumes (wait_for: all, alice answered too): nothing waits any more
    await journal.send(alice.answered(channel="web"), alice.resumed())
    resumed = await journal.run(first.run_id)
    assert (resumed["state"], resumed["waiting"]) == ("running", None)
