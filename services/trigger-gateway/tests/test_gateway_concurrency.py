"""Flow control per trigger (issue 7): a concurrency key with the policies ``supersede``, ``skip`` and
``queue``. Real nats-server; the gateways are the real ``configure`` + ``run_until`` in-process
(``gateway_support.replicas``); a run's end is published on the bus as the run-executor publishes it. A failed
delivery is simulated as the intake tests do: the bus's publish patched to refuse the launch."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from gateway_support import (
    AGENTS,
    AS_ADMIN,
    AS_OPERATOR,
    AS_VIEWER,
    basic,
    events_not_acked,
    eventually,
    fixture_json,
    post,
    replicas,
    until_served,
    webhook_spec,
)

from temporality_bus import Bus, Delivery, TransientError
from temporality_protocol import (
    CONTENT_TYPE,
    Envelope,
    RunCompleted,
    RunFailed,
    decode,
    derive_id,
    encode,
    make_event,
    run_id_for_delivery,
)
from temporality_protocol.catalog import BUCKET_CONCURRENCY, CONSUMERS, EVENTS_STREAM
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays
from temporality_trigger_gateway import Settings, TriggerConfig
from temporality_trigger_gateway.concurrency import KeyState, launch_key, state_key
from temporality_trigger_gateway.deliveries import Deliveries
from temporality_trigger_gateway.events import EventTriggers
from temporality_trigger_gateway.launch import Launcher, dedupe_key
from temporality_trigger_gateway.redrive import DeliveryAccepted, redrive
from temporality_trigger_gateway.store import TriggerRegistry, TriggerStore

KEY = "join('/', [payload.repository.id, to_string(payload.pull_request.id)])"
#: The key of the pull request in ``pr-created.json`` (repository id / pull request id).
PR_KEY = "9e3c4b1a-7d2f-4c6e-8a5b-1f0e2d3c4b5a/7"
EVENTS_DURABLE = "trigger-gateway-events"


def _spec(trigger_id: str, policy: str, **concurrency: Any) -> dict[str, Any]:
    return webhook_spec(
        trigger_id,
        events=["git.pullrequest.created", "git.pullrequest.updated"],
        concurrency={"key": KEY, "policy": policy, **concurrency},
    )


def _push(n: int, pr: int = 7) -> dict[str, Any]:
    """The n-th Azure DevOps delivery about pull request ``pr`` (its own event id)."""
    body = fixture_json("pr-created.json")
    body["id"] = f"ado-evt-{pr}-{n}"
    body["resource"]["pullRequestId"] = pr
    return body


def _run_of(trigger_id: str, n: int, pr: int = 7) -> str:
    return run_id_for_delivery(trigger_id, f"ado-evt-{pr}-{n}")


def _ended(run_id: str, kind: type[RunCompleted] | type[RunFailed] = RunCompleted) -> Envelope:
    """``run.completed`` (or ``run.failed``) as the run-executor publishes it."""
    data = (
        RunCompleted(run_id=run_id, result="done", turns=1)
        if kind is RunCompleted
        else RunFailed(run_id=run_id, reason="error", error="boom")
    )
    return make_event(
        data,
        source="/temporality/run-executor",
        id=derive_id("evt", run_id, data.EVENT_TYPE),
        run_id=run_id,
        actor="agent:reviewer",
    )


def _expect(answer: httpx.Response, status_code: int, status: str) -> dict[str, Any]:
    """The answer's body, once it is ``status_code`` with ``status``."""
    assert answer.status_code == status_code, answer.text
    body: dict[str, Any] = answer.json()
    assert body["status"] == status, body
    return body


async def _create(client: httpx.AsyncClient, spec: dict[str, Any]) -> None:
    created = await client.post("/triggers", json=spec, headers=AS_ADMIN)
    assert created.status_code == 201, created.text


async def _state(bus: Bus, trigger_id: str, key: str = PR_KEY) -> KeyState | None:
    found = await (await bus.store(BUCKET_CONCURRENCY, KeyState)).get(state_key(trigger_id, key))
    return None if found is None else found.value


async def _active_is(bus: Bus, trigger_id: str, run_id: str | None, key: str = PR_KEY) -> bool:
    state = await _state(bus, trigger_id, key)
    return state is not None and (state.active.run_id if state.active else None) == run_id


async def _deliveries(
    client: httpx.AsyncClient, trigger_id: str, *, at_least: int = 0, including: str | None = None
) -> dict[str, Any] | None:
    """The first page of the trigger's deliveries as ``client``'s replica lists them, once it lists at least
    ``at_least`` rows and the delivery ``including`` (else ``None``: not yet)."""
    listed = await client.get(f"/triggers/{trigger_id}/deliveries", headers=AS_VIEWER)
    assert listed.status_code == 200, listed.text
    page: dict[str, Any] = listed.json()
    rows = page["deliveries"]
    if len(rows) < at_least or (including is not None and all(r["delivery_id"] != including for r in rows)):
        return None
    return page


def _requested(log: EventLog, run_id: str) -> list[Envelope]:
    return log.of_type("run.requested", run_id)


# --------------------------------------------------------------------------- validation
async def test_a_bad_concurrency_config_is_refused_naming_the_field(gateway_settings: Settings) -> None:
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"key": "payload.[[", "policy": "skip"}, "concurrency.key", "not a valid JMESPath expression"),
        ({"key": "  ", "policy": "skip"}, "concurrency.key", "empty"),
        ({"key": KEY, "policy": "drop"}, "concurrency.policy", "'queue', 'skip' or 'supersede'"),
        ({"key": KEY}, "concurrency.policy", "Field required"),
        ({"key": KEY, "policy": "queue", "max_queued": 0}, "concurrency.max_queued", "greater than or equal to 1"),
        (
            {"key": KEY, "policy": "queue", "colour": 1},
            "concurrency.colour",
            "allowed here: debounce_s, key, max_queued, policy",
        ),
    ]
    async with replicas(gateway_settings, 1) as (a,):
        for concurrency, field, message in cases:
            answer = await a.post("/triggers", json=webhook_spec(concurrency=concurrency), headers=AS_ADMIN)
            assert answer.status_code == 422, (concurrency, answer.text)
            body = answer.json()
            assert body["error"] == "invalid_trigger"
            assert any(e["field"] == field and message in e["message"] for e in body["errors"]), (concurrency, body)
        created = await a.post("/triggers", json=_spec("ok-flow", "supersede"), headers=AS_ADMIN)
        assert created.status_code == 201, created.text
        assert created.json()["trigger"]["concurrency"] == {
            "key": KEY,
            "policy": "supersede",
            "max_queued": 20,
            "debounce_s": None,
        }
        none_yet = await a.get("/triggers/ok-flow/deliveries", headers=AS_VIEWER)
        assert none_yet.status_code == 200, none_yet.text
        assert none_yet.json() == {"deliveries": [], "next_cursor": None}


# --------------------------------------------------------------------------- supersede
async def test_five_pushes_to_one_pull_request_leave_one_run_and_cancel_the_four_older_ones(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 2) as (a, b):
        await _create(a, _spec("pr-latest", "supersede"))
        await until_served(b, "pr-latest")
        for n in range(1, 6):
            answer = await post((a, b)[n % 2], _push(n), "pr-latest")
            assert answer.status_code == 202, answer.text
            body = answer.json()
            assert body["status"] == "accepted"
            assert body["run_id"] == _run_of("pr-latest", n)
            assert body.get("superseded_run_id") == (None if n == 1 else _run_of("pr-latest", n - 1))
        other = await post(a, _push(1, pr=8), "pr-latest")  # another pull request: its own key
        _expect(other, 202, "accepted")
        assert "superseded_run_id" not in other.json()
        # the same webhook again (a sender's retry) and an older one: duplicates, never a second supersede
        for n in (5, 3):
            again = await post(b, _push(n), "pr-latest")
            _expect(again, 200, "duplicate")

        cancels = await event_log.wait_for("run.cancel_requested", count=4, timeout_s=10)
        assert sorted(e.data["run_id"] for e in cancels) == sorted(_run_of("pr-latest", n) for n in range(1, 5))
        assert {e.data["reason"] for e in cancels} == {"superseded"}
        assert {e.data["requested_by"] for e in cancels} == {"service:trigger-gateway"}
        assert await _active_is(bus, "pr-latest", _run_of("pr-latest", 5))
        await event_log.caught_up()
        await stays(
            lambda: len(event_log.of_type("run.cancel_requested")) == 4, settle_s=0.3, what="four cancellations"
        )
        assert len(event_log.of_type("run.requested")) == 6

        # the superseded runs end (cancelled): the key stays with the newest run
        for n in range(1, 5):
            await bus.publish(_ended(_run_of("pr-latest", n)))
        await eventually(lambda: _no_pending(bus), timeout_s=10, what="every run end handled")
        assert await _active_is(bus, "pr-latest", _run_of("pr-latest", 5))
        await bus.publish(_ended(_run_of("pr-latest", 5)))
        await eventually(lambda: _active_is(bus, "pr-latest", None), timeout_s=10, what="the key released")


async def _no_pending(bus: Bus) -> bool:
    info = await bus.js.consumer_info("TEMPORALITY_EVENTS", "trigger-gateway-events")
    return bool(info.num_pending == 0 and info.num_ack_pending == 0)


# --------------------------------------------------------------------------- skip
async def test_skip_refuses_a_delivery_while_a_run_of_its_key_is_active(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        await _create(a, _spec("pr-once", "skip"))
        first = await post(a, _push(1), "pr-once")
        _expect(first, 202, "accepted")
        skipped = await post(a, _push(2), "pr-once")
        body = _expect(skipped, 200, "skipped")
        assert body["reason"] == "concurrency_skip"
        assert body["active_run_id"] == _run_of("pr-once", 1)
        (rejected,) = await event_log.wait_for("trigger.rejected", timeout_s=10)
        assert rejected.data["reason"] == "concurrency_skip"
        assert rejected.data["delivery_id"] == body["delivery_id"]
        assert _run_of("pr-once", 1) in rejected.data["detail"]
        assert not _requested(event_log, _run_of("pr-once", 2))

        await bus.publish(_ended(_run_of("pr-once", 1)))
        await eventually(lambda: _active_is(bus, "pr-once", None), timeout_s=10, what="the key released")
        # the skipped event's claim was given back: its retry now starts a run
        retried = await post(a, _push(2), "pr-once", headers=basic())
        _expect(retried, 202, "accepted")
        await event_log.wait_for("run.requested", run_id=_run_of("pr-once", 2), timeout_s=10)


# --------------------------------------------------------------------------- queue
async def test_queue_starts_the_next_run_once_the_active_one_ended_exactly_once_with_two_replicas(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 2) as (a, b):
        await _create(a, _spec("pr-queue", "queue", max_queued=2))
        await until_served(b, "pr-queue")
        one, two, three = (_run_of("pr-queue", n) for n in (1, 2, 3))
        assert (await post(a, _push(1), "pr-queue")).json()["status"] == "accepted"
        queued = await post(b, _push(2), "pr-queue")
        assert queued.status_code == 202, queued.text
        assert queued.json() == {**queued.json(), "status": "queued", "position": 1, "active_run_id": one}
        assert (await post(a, _push(3), "pr-queue")).json()["position"] == 2
        full = await post(b, _push(4), "pr-queue")
        _expect(full, 200, "skipped")
        assert "full" in full.json()["detail"]
        duplicate = await post(b, _push(2), "pr-queue")  # a retry of a queued delivery: it will start, once
        _expect(duplicate, 200, "duplicate")
        await event_log.caught_up()
        assert not _requested(event_log, two)
        assert not _requested(event_log, three)

        ended = _ended(one)
        await bus.publish(ended)
        await bus.publish_raw(  # the same end again, past JetStream's duplicate window (another Nats-Msg-Id)
            ended.nats_subject, encode(ended), {"Nats-Msg-Id": ended.id + "-again", "Content-Type": CONTENT_TYPE}
        )
        (started,) = await event_log.wait_for("run.requested", run_id=two, timeout_s=10)
        assert started.data["launch"]["delivery_id"] == queued.json()["delivery_id"]
        assert started.data["input"]["pull_request"] == 7  # the queued delivery's own mapped input
        await eventually(lambda: _no_pending(bus), timeout_s=10, what="both copies handled")
        await event_log.caught_up()
        await stays(
            lambda: len(_requested(event_log, two)) == 1 and not _requested(event_log, three),
            settle_s=0.3,
            what="the second run started once, the third still waiting",
        )
        assert len(event_log.of_type("trigger.accepted", two)) == 1
        assert await _active_is(bus, "pr-queue", two)

        await bus.publish(_ended(two, RunFailed))
        await event_log.wait_for("run.requested", run_id=three, timeout_s=10)
        await bus.publish(_ended(three))
        await eventually(lambda: _active_is(bus, "pr-queue", None), timeout_s=10, what="the key released")


async def test_an_event_without_a_key_value_is_launched_without_flow_control(gateway_settings: Settings) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        spec = webhook_spec("no-key", concurrency={"key": "payload.nothing_here", "policy": "skip"})
        await _create(a, spec)
        for n in (1, 2):
            answer = await post(a, _push(n), "no-key")
            _expect(answer, 202, "accepted")
            assert "superseded_run_id" not in answer.json()


# --------------------------------------------------------------------------- debounce
async def test_debounce_starts_the_latest_event_once_the_key_was_quiet_for_the_window(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 2) as (a, b):
        # 3 s: the three posts must land inside one window; with 1 s a stall of the loaded machine between two
        # posts let the first window end and start the first event (seen once in CI)
        await _create(a, _spec("pr-quiet", "supersede", debounce_s=3))
        await until_served(b, "pr-quiet")  # before the first post: the wait must not eat into the window
        bodies = []
        for n in (1, 2, 3):
            bodies.append(_expect(await post((a, b)[n % 2], _push(n), "pr-quiet"), 202, "debounced"))
        _expect(await post(a, _push(3), "pr-quiet"), 200, "duplicate")  # a retry of the latest: still one
        latest = _run_of("pr-quiet", 3)
        assert bodies[-1]["run_id"] == latest
        (started,) = await event_log.wait_for("run.requested", run_id=latest, timeout_s=15)
        assert started.data["launch"]["delivery_id"] == bodies[-1]["delivery_id"]
        assert started.data["input"]["pull_request"] == 7
        await event_log.caught_up()
        refused = [e for e in event_log.of_type("trigger.rejected") if e.data["reason"] == "debounced"]
        assert sorted(e.data["delivery_id"] for e in refused) == sorted(b["delivery_id"] for b in bodies[:2])
        await stays(
            lambda: [e.runid for e in event_log.of_type("run.requested")] == [latest],
            settle_s=0.3,
            what="one run, of the latest event",
        )
        assert not event_log.of_type("run.cancel_requested")  # nothing was running: nothing superseded
        assert await _active_is(bus, "pr-quiet", latest)


# --------------------------------------------------------------------------- deliveries and re-drive
async def test_the_deliveries_api_shows_each_state_and_a_rejected_delivery_can_be_redriven(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 2) as (a, b):
        await _create(a, _spec("pr-drive", "skip"))
        await until_served(b, "pr-drive")
        first = _expect(await post(a, _push(1), "pr-drive"), 202, "accepted")
        skipped = _expect(await post(b, _push(2), "pr-drive"), 200, "skipped")
        copy = _expect(await post(a, _push(1), "pr-drive"), 200, "duplicate")

        # each replica writes its delivery records behind its answers: b lists a's a round trip later
        listed = await eventually(
            lambda: _deliveries(b, "pr-drive", at_least=3), timeout_s=10, what="b listing the three deliveries"
        )
        rows = listed["deliveries"]
        assert [r["delivery_id"] for r in rows] == [copy["delivery_id"], skipped["delivery_id"], first["delivery_id"]]
        assert [(r["state"], r["reason"]) for r in rows] == [
            ("rejected", "duplicate"),
            ("rejected", "concurrency_skip"),
            ("accepted", None),
        ]
        assert rows[2]["run_id"] == _run_of("pr-drive", 1)
        assert rows[1]["source_event_id"] == "ado-evt-7-2"
        assert all(r["has_event"] for r in rows)
        assert listed["next_cursor"] is None
        page = (await a.get("/triggers/pr-drive/deliveries?limit=2", headers=AS_VIEWER)).json()
        assert len(page["deliveries"]) == 2
        rest = await a.get(f"/triggers/pr-drive/deliveries?limit=2&cursor={page['next_cursor']}", headers=AS_VIEWER)
        assert [r["delivery_id"] for r in rest.json()["deliveries"]] == [first["delivery_id"]]
        assert rest.json()["next_cursor"] is None
        bad = await a.get("/triggers/pr-drive/deliveries?cursor=nope", headers=AS_VIEWER)
        assert bad.status_code == 422
        assert bad.json()["error"] == "invalid_cursor"
        assert (await a.get("/triggers/nope/deliveries", headers=AS_VIEWER)).status_code == 404

        # re-drive: an accepted delivery never (409); a skipped one once its key is free
        url = "/triggers/pr-drive/deliveries/{}/redrive"
        accepted = await a.post(url.format(first["delivery_id"]), headers=AS_OPERATOR)
        assert accepted.status_code == 409, accepted.text
        assert accepted.json()["error"] == "delivery_accepted"
        assert (await a.post(url.format(skipped["delivery_id"]), headers=AS_VIEWER)).status_code == 403
        assert (await a.post(url.format("dlv-" + "0" * 24), headers=AS_OPERATOR)).json()["error"] == (
            "delivery_not_found"
        )
        still_busy = _expect(await b.post(url.format(skipped["delivery_id"]), headers=AS_OPERATOR), 200, "skipped")
        assert still_busy["redrive_of"] == skipped["delivery_id"]
        await bus.publish(_ended(_run_of("pr-drive", 1)))
        await eventually(lambda: _active_is(bus, "pr-drive", None), timeout_s=10, what="the key released")
        redriven = _expect(await a.post(url.format(skipped["delivery_id"]), headers=AS_OPERATOR), 202, "accepted")
        assert redriven["run_id"] == _run_of("pr-drive", 2)  # the original event id: the same run
        await event_log.wait_for("run.requested", run_id=_run_of("pr-drive", 2), timeout_s=10)
        await eventually(  # a writes the re-drive's record behind its answer: b finds it a round trip later
            lambda: _deliveries(b, "pr-drive", including=redriven["delivery_id"]),
            timeout_s=10,
            what="b listing the re-driven delivery",
        )
        again = await b.post(url.format(redriven["delivery_id"]), headers=AS_OPERATOR)
        assert again.status_code == 409, again.text
        # a duplicate's re-drive is a duplicate again: never a second run of the accepted event
        _expect(await b.post(url.format(copy["delivery_id"]), headers=AS_OPERATOR), 200, "duplicate")

        final = await _deliveries(b, "pr-drive")
        assert final is not None
        rows = final["deliveries"]
        by_id = {r["delivery_id"]: r for r in rows}
        assert by_id[redriven["delivery_id"]]["state"] == "accepted"
        assert by_id[redriven["delivery_id"]]["redrive_of"] == skipped["delivery_id"]
        assert redriven["delivery_id"] in by_id[skipped["delivery_id"]]["redriven_as"]
        await event_log.caught_up()
        assert len(event_log.of_type("run.requested")) == 2


async def test_a_schedule_trigger_with_a_key_skips_its_ticks_while_its_run_is_active(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        spec = {
            "id": "every-second",
            "name": "Every second, one at a time",
            "type": "schedule",
            "cron": "* * * * * *",
            "agent": "reviewer",
            "context": {"lane": "nightly"},
            "concurrency": {"key": "context.lane", "policy": "skip"},
        }
        await _create(a, spec)
        (rejected,) = await event_log.wait_for(
            "trigger.rejected", where=lambda e: e.data["trigger_id"] == "every-second", timeout_s=10
        )
        assert rejected.data["reason"] == "concurrency_skip"
        (started,) = await event_log.wait_for("run.requested", timeout_s=10)  # the first tick's run holds the key
        assert started.data["launch"]["kind"] == "schedule"
        assert started.runid is not None
        assert started.runid in rejected.data["detail"]
        assert (await a.post("/triggers/every-second/disable", headers=AS_OPERATOR)).status_code == 200
        rows = (await a.get("/triggers/every-second/deliveries", headers=AS_VIEWER)).json()["deliveries"]
        assert {r["state"] for r in rows} >= {"accepted", "rejected"}


async def test_a_copy_of_an_older_event_never_takes_the_key_back_from_a_newer_run(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 2) as (a, b):
        spec = {
            "id": "on-failure",
            "name": "One triage at a time",
            "type": "event",
            "event_type": "run.failed",
            "agent": "triager",
            "concurrency": {"key": "'all failures'", "policy": "supersede"},
        }
        await _create(a, spec)
        await until_served(b, "on-failure")  # b may take the events (one shared consumer)
        older, newer = _ended("run-x1", RunFailed), _ended("run-x2", RunFailed)
        await bus.publish(older)
        older_run = run_id_for_delivery("on-failure", older.id)
        await event_log.wait_for("run.requested", run_id=older_run, timeout_s=10)
        await bus.publish(newer)
        (cancel,) = await event_log.wait_for("run.cancel_requested", timeout_s=10)
        assert cancel.data["run_id"] == older_run
        await bus.publish_raw(  # the older event again, past JetStream's duplicate window
            older.nats_subject, encode(older), {"Nats-Msg-Id": older.id + "-again", "Content-Type": CONTENT_TYPE}
        )
        await eventually(lambda: _no_pending(bus), timeout_s=10, what="every event handled")
        await event_log.caught_up()
        await stays(
            lambda: len(event_log.of_type("run.cancel_requested")) == 1, settle_s=0.3, what="one supersede only"
        )
        assert await _active_is(bus, "on-failure", run_id_for_delivery("on-failure", newer.id), key="all failures")


async def test_a_failed_delivery_is_recorded_as_failed_and_its_redrive_starts_the_run_once(
    client: httpx.AsyncClient, bus: Bus, triggers: list[TriggerConfig], event_log: EventLog
) -> None:
    with events_not_acked("run.requested", TransientError("simulated: no ack")):  # NATS does not acknowledge the launch
        refused = await post(client, _push(1), "ado-pr-review")
    assert refused.status_code == 503
    deliveries = Deliveries(bus)
    (record,) = (await deliveries.newest("ado-pr-review", before=None, limit=10))[0]
    assert record.state == "failed"
    assert record.detail is not None
    assert "retries" in record.detail
    assert record.event is not None
    assert record.event.id == "ado-evt-7-1"

    trigger = next(t for t in triggers if t.id == "ado-pr-review")
    launcher = Launcher(bus, retry_after_s=7)
    answer = await redrive(launcher, trigger, record)
    assert answer["status"] == "accepted"
    assert answer["redrive_of"] == record.delivery_id
    run_id = run_id_for_delivery("ado-pr-review", "ado-evt-7-1")
    assert answer["run_id"] == run_id
    await event_log.wait_for("run.requested", run_id=run_id, timeout_s=10)
    # the sender's own retry of that event now is a duplicate: one run, whoever retried first
    _expect(await post(client, _push(1), "ado-pr-review"), 200, "duplicate")
    original = await deliveries.get("ado-pr-review", record.delivery_id)
    assert original is not None
    assert original.redriven_as == [answer["delivery_id"]]
    redriven = await deliveries.get("ado-pr-review", answer["delivery_id"])
    assert redriven is not None
    assert redriven.state == "accepted"
    with pytest.raises(DeliveryAccepted):
        await redrive(launcher, trigger, redriven)
    await event_log.caught_up()
    assert len(event_log.of_type("run.requested")) == 1


async def test_a_replica_behind_the_trigger_store_keeps_a_queued_launch_for_the_redelivery(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    """The active run's end reaches a replica whose watch has not served the trigger yet: it must not take the
    queued launch of a trigger it does not know for one that is gone (dropped for good), but have the end
    redelivered; once its watch caught up, the redelivery starts the queued run."""
    async with replicas(gateway_settings, 1) as (a,):
        await _create(a, _spec("pr-lag", "queue", max_queued=2))
        one, two = (_run_of("pr-lag", n) for n in (1, 2))
        assert (await post(a, _push(1), "pr-lag")).json()["status"] == "accepted"
        assert (await post(a, _push(2), "pr-lag")).json()["status"] == "queued"
    ended = _ended(one)
    await bus.publish(ended)
    store = await TriggerStore.open(bus)
    registry = TriggerRegistry(environ={}, agents=AGENTS)  # not watching yet: behind the store
    handler = EventTriggers(registry, Launcher(bus, retry_after_s=1), store=store, store_wait_s=0.2)
    sub = await bus.js.pull_subscribe_bind(durable=CONSUMERS[EVENTS_DURABLE].durable, stream=EVENTS_STREAM.name)
    try:
        while True:  # what the stopped replica left unhandled (none expected) is not this test's
            (msg,) = await sub.fetch(batch=1, timeout=10)
            if decode(msg.data).id == ended.id:
                break
            await msg.ack()
        delivery = Delivery(msg)
        with pytest.raises(TransientError, match="redelivered"):
            await handler.handle(decode(msg.data), delivery)
        assert await _active_is(bus, "pr-lag", one)  # nothing released, nothing dropped
        delivery.num_delivered = 2
        async with registry.watching(store):  # caught up: the redelivery releases the key, the queued run starts
            await handler.handle(decode(msg.data), delivery)
        await msg.ack()
    finally:
        await sub.unsubscribe()
    (started,) = await event_log.wait_for("run.requested", run_id=two, timeout_s=10)
    assert started.data["input"]["pull_request"] == 7
    assert await _active_is(bus, "pr-lag", two)


# --------------------------------------------------------------------------- a waiting delivery that cannot start
async def _claim_state(bus: Bus, trigger_id: str, event_id: str) -> str | None:
    found = await (await Launcher(bus, retry_after_s=1).dedupe()).get(dedupe_key(trigger_id, event_id))
    return None if found is None else found.value.state


async def _record_state(bus: Bus, trigger_id: str, delivery_id: str) -> tuple[str, str | None] | None:
    found = await Deliveries(bus).get(trigger_id, delivery_id)
    return None if found is None else (found.state, found.reason)


async def test_a_queued_delivery_of_a_deleted_trigger_is_rejected_and_its_event_can_be_sent_again(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    """The trigger is deleted while a delivery waits in its key's queue: when the active run ends, the waiting
    one is journaled ``trigger.rejected(disabled)``, recorded ``rejected``, and its dedupe claim released -- so
    the same event sent again to the trigger created anew starts a run, instead of ``duplicate`` for ever."""
    async with replicas(gateway_settings, 1) as (a,):
        await _create(a, _spec("pr-gone", "queue"))
        one, two = (_run_of("pr-gone", n) for n in (1, 2))
        _expect(await post(a, _push(1), "pr-gone"), 202, "accepted")
        waiting = _expect(await post(a, _push(2), "pr-gone"), 202, "queued")
        assert (await a.delete("/triggers/pr-gone", headers=AS_ADMIN)).status_code == 204
        await bus.publish(_ended(one))
        (rejected,) = await event_log.wait_for(
            "trigger.rejected", where=lambda e: e.data["delivery_id"] == waiting["delivery_id"], timeout_s=15
        )
        assert rejected.data["reason"] == "disabled"
        assert "deleted" in rejected.data["detail"]
        assert rejected.causationid == derive_id("evt", waiting["delivery_id"], "received")
        await eventually(lambda: _claim_state_is(bus, "pr-gone", "ado-evt-7-2", "released"), what="claim released")
        assert await _record_state(bus, "pr-gone", waiting["delivery_id"]) == ("rejected", "disabled")
        # the key is released after the drop (release's next round): waited for, not read once
        await eventually(lambda: _active_is(bus, "pr-gone", None), what="the key released")
        assert not _requested(event_log, two)

        await _create(a, _spec("pr-gone", "queue"))  # created anew: the same event is a new delivery now
        again = _expect(await post(a, _push(2), "pr-gone"), 202, "accepted")
        assert again["run_id"] == two
        await event_log.wait_for("run.requested", run_id=two, timeout_s=10)


async def _claim_state_is(bus: Bus, trigger_id: str, event_id: str, state: str) -> bool:
    return await _claim_state(bus, trigger_id, event_id) == state


async def test_a_debounced_delivery_of_a_deleted_trigger_is_rejected_when_its_window_ends(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        await _create(a, _spec("pr-quiet-gone", "supersede", debounce_s=1))
        held = _expect(await post(a, _push(1), "pr-quiet-gone"), 202, "debounced")
        assert (await a.delete("/triggers/pr-quiet-gone", headers=AS_ADMIN)).status_code == 204
        (rejected,) = await event_log.wait_for(
            "trigger.rejected", where=lambda e: e.data["delivery_id"] == held["delivery_id"], timeout_s=15
        )
        assert rejected.data["reason"] == "disabled"
        await eventually(
            lambda: _claim_state_is(bus, "pr-quiet-gone", "ado-evt-7-1", "released"), what="claim released"
        )
        assert await _record_state(bus, "pr-quiet-gone", held["delivery_id"]) == ("rejected", "disabled")
        assert not event_log.of_type("run.requested")


async def test_a_queued_delivery_whose_launch_is_gone_is_rejected_launch_lost_and_the_next_one_starts(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    """Its stored launch expired (deleted here): ``trigger.rejected(launch_lost)`` is journaled from its delivery
    record (the source event id, caused by its ``trigger.received``), the record becomes ``rejected`` /
    ``launch_lost`` (an operator can re-drive it), its claim is released; the delivery queued behind it starts."""
    async with replicas(gateway_settings, 1) as (a,):
        await _create(a, _spec("pr-lost", "queue"))
        one, two, three = (_run_of("pr-lost", n) for n in (1, 2, 3))
        _expect(await post(a, _push(1), "pr-lost"), 202, "accepted")
        lost = _expect(await post(a, _push(2), "pr-lost"), 202, "queued")
        _expect(await post(a, _push(3), "pr-lost"), 202, "queued")
        await (await bus.kv(BUCKET_CONCURRENCY)).delete(launch_key(two))
        await bus.publish(_ended(one))
        (rejected,) = await event_log.wait_for(
            "trigger.rejected", where=lambda e: e.data["delivery_id"] == lost["delivery_id"], timeout_s=15
        )
        assert rejected.data["reason"] == "launch_lost"
        assert rejected.data["trigger_id"] == "pr-lost"
        assert rejected.data["source_event_id"] == "ado-evt-7-2"
        assert two in rejected.data["detail"]
        assert "re-drive" in rejected.data["detail"]
        assert rejected.causationid == derive_id("evt", lost["delivery_id"], "received")
        assert rejected.id == derive_id("evt", lost["delivery_id"], "rejected")
        await event_log.wait_for("run.requested", run_id=three, timeout_s=15)
        await eventually(lambda: _claim_state_is(bus, "pr-lost", "ado-evt-7-2", "released"), what="claim released")
        assert await _record_state(bus, "pr-lost", lost["delivery_id"]) == ("rejected", "launch_lost")
        assert not _requested(event_log, two)
        redriven = await a.post(f"/triggers/pr-lost/deliveries/{lost['delivery_id']}/redrive", headers=AS_OPERATOR)
        assert redriven.status_code == 202, redriven.text  # from its record's event, under the policy again
        assert redriven.json()["run_id"] == two


async def test_a_debounced_delivery_whose_launch_is_gone_is_rejected_launch_lost_when_its_window_ends(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        await _create(a, _spec("pr-quiet-lost", "supersede", debounce_s=3))
        held = _expect(await post(a, _push(1), "pr-quiet-lost"), 202, "debounced")
        await (await bus.kv(BUCKET_CONCURRENCY)).delete(launch_key(_run_of("pr-quiet-lost", 1)))
        (rejected,) = await event_log.wait_for(
            "trigger.rejected", where=lambda e: e.data["delivery_id"] == held["delivery_id"], timeout_s=15
        )
        assert rejected.data["reason"] == "launch_lost"
        assert "debounced" in rejected.data["detail"]
        await eventually(
            lambda: _claim_state_is(bus, "pr-quiet-lost", "ado-evt-7-1", "released"), what="claim released"
        )
        assert await _record_state(bus, "pr-quiet-lost", held["delivery_id"]) == ("rejected", "launch_lost")
        assert not event_log.of_type("run.requested")


async def test_a_queued_delivery_starts_when_its_trigger_drops_its_concurrency_key(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        await _create(a, _spec("pr-unkeyed", "queue"))
        one, two = (_run_of("pr-unkeyed", n) for n in (1, 2))
        _expect(await post(a, _push(1), "pr-unkeyed"), 202, "accepted")
        _expect(await post(a, _push(2), "pr-unkeyed"), 202, "queued")
        shown = await a.get("/triggers/pr-unkeyed", headers=AS_VIEWER)
        unkeyed = {k: v for k, v in _spec("pr-unkeyed", "queue").items() if k != "concurrency"}
        replaced = await a.put(
            "/triggers/pr-unkeyed", json=unkeyed, headers={**AS_ADMIN, "If-Match": shown.headers["ETag"]}
        )
        assert replaced.status_code == 200, replaced.text
        await until_served(a, "pr-unkeyed")
        await bus.publish(_ended(one))
        await event_log.wait_for("run.requested", run_id=two, timeout_s=15)
        assert not [e for e in event_log.of_type("trigger.rejected") if e.data["trigger_id"] == "pr-unkeyed"]


async def test_a_debounced_event_skipped_when_its_window_ends_can_be_sent_again(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    """Policy ``skip`` refuses a debounced event whose window ends while a run of its key is active; its claim is
    given back as a webhook's skip gives it back, so the same event sent again decides again (not a duplicate)."""
    async with replicas(gateway_settings, 1) as (a,):
        await _create(a, _spec("pr-quiet-skip", "skip", debounce_s=1))
        _expect(await post(a, _push(1), "pr-quiet-skip"), 202, "debounced")
        await event_log.wait_for("run.requested", run_id=_run_of("pr-quiet-skip", 1), timeout_s=15)
        skipped = _expect(await post(a, _push(2), "pr-quiet-skip"), 202, "debounced")
        (rejected,) = await event_log.wait_for(
            "trigger.rejected", where=lambda e: e.data["delivery_id"] == skipped["delivery_id"], timeout_s=15
        )
        assert rejected.data["reason"] == "concurrency_skip"
        await eventually(
            lambda: _claim_state_is(bus, "pr-quiet-skip", "ado-evt-7-2", "released"), what="claim released"
        )
        _expect(await post(a, _push(2), "pr-quiet-skip"), 202, "debounced")  # decides again
