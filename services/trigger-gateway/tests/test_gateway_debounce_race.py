"""Debounce under real concurrency (issue 7): events of one concurrency key posted at the same time, to two
replicas, inside one debounce window, start exactly one run -- the key's latest -- never none, never two.

The race this provokes: each delivery compare-and-sets itself as its key's latest event, then arms the key's
timer (one message schedule per key: the last arm replaces the others). Those two steps are not atomic, so
the arms can land in another order than the compare-and-sets did: the key's one schedule can then belong to
an older event. Its firing must not be dropped as "a newer event re-armed the window" (the newer event's own
arm is gone): it re-arms the window for the key's latest. Real nats-server, the real gateway replicas
in-process (``gateway_support.replicas``), real HTTP requests sent concurrently.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from gateway_support import AGENTS, AS_ADMIN, fixture_json, post, replicas, until_served, webhook_spec

from temporality_bus import Bus, Timers
from temporality_protocol import run_id_for_delivery
from temporality_protocol.catalog import BUCKET_CONCURRENCY, TIMER_NS_TRIGGER_DEBOUNCE
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays
from temporality_trigger_gateway import Settings
from temporality_trigger_gateway.concurrency import DebounceTimer, KeyState, QueuedLaunch, launch_key, state_key
from temporality_trigger_gateway.deliveries import Deliveries
from temporality_trigger_gateway.launch import Launcher
from temporality_trigger_gateway.store import validate_spec

KEY = "join('/', [payload.repository.id, to_string(payload.pull_request.id)])"
REPO_ID = "9e3c4b1a-7d2f-4c6e-8a5b-1f0e2d3c4b5a"  # the repository of pr-created.json
TRIGGER = "pr-race"
PULL_REQUESTS = (11, 12, 13, 14)
EVENTS_PER_PR = 12  # more than the store's default 8 attempts: a key's state takes KEY_ATTEMPTS (32)


def _push(pr: int, n: int) -> dict[str, Any]:
    body = fixture_json("pr-created.json")
    body["id"] = f"race-evt-{pr}-{n}"
    body["resource"]["pullRequestId"] = pr
    return body


async def _state(bus: Bus, pr: int) -> KeyState | None:
    found = await (await bus.store(BUCKET_CONCURRENCY, KeyState)).get(state_key(TRIGGER, f"{REPO_ID}/{pr}"))
    return None if found is None else found.value


async def test_concurrent_events_of_a_key_inside_the_window_start_exactly_the_latest(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 2) as (a, b):
        spec = webhook_spec(
            TRIGGER,
            events=["git.pullrequest.created", "git.pullrequest.updated"],
            concurrency={"key": KEY, "policy": "supersede", "debounce_s": 2},
        )
        created = await a.post("/triggers", json=spec, headers=AS_ADMIN)
        assert created.status_code == 201, created.text
        await until_served(b, TRIGGER)

        async def deliver(client: httpx.AsyncClient, pr: int, n: int) -> httpx.Response:
            return await post(client, _push(pr, n), TRIGGER)

        # every event of every key at once, alternating the replicas: the compare-and-sets and the arms interleave
        answers = await asyncio.gather(
            *(deliver((a, b)[n % 2], pr, n) for pr in PULL_REQUESTS for n in range(EVENTS_PER_PR))
        )
        for answer in answers:
            assert answer.status_code == 202, answer.text
            assert answer.json()["status"] == "debounced", answer.text

        runs_of = {
            pr: {run_id_for_delivery(TRIGGER, f"race-evt-{pr}-{n}") for n in range(EVENTS_PER_PR)}
            for pr in PULL_REQUESTS
        }

        def started(pr: int) -> list[str]:
            return [e.runid for e in event_log.of_type("run.requested") if e.runid in runs_of[pr]]

        for pr in PULL_REQUESTS:  # the window is 2 s; the schedule fires server-side, a stale firing re-arms
            await event_log.wait_for("run.requested", timeout_s=60, where=lambda e, pr=pr: e.runid in runs_of[pr])
        await event_log.caught_up()
        await stays(
            lambda: all(len(started(pr)) == 1 for pr in PULL_REQUESTS),
            settle_s=4,  # two more windows: a second firing would have started a second run by then
            what="one run per key",
        )
        for pr in PULL_REQUESTS:
            (run_id,) = started(pr)
            state = await _state(bus, pr)
            assert state is not None
            assert state.debounced is None  # nothing left waiting for a window that will never fire
            assert state.active is not None
            assert state.active.run_id == run_id
            refused = [
                e
                for e in event_log.of_type("trigger.rejected")
                if e.data["reason"] == "debounced"
                and e.data["trigger_id"] == TRIGGER
                and e.data["source_event_id"]
                and e.data["source_event_id"].startswith(f"race-evt-{pr}-")
            ]
            # every other event of the key was replaced by a newer one, once each
            assert len(refused) == EVENTS_PER_PR - 1, [e.data for e in refused]


async def test_an_older_events_arm_landing_last_still_starts_the_keys_latest(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    """The interleaving the concurrent test can hit, made to happen every time: event 1 and event 2 of one key
    are each compare-and-set as the key's latest (2 after 1), but event 1's arm of the key's timer lands after
    event 2's -- replayed here by publishing event 1's arm again once event 2 was answered (without its msg
    id, which the stream's duplicate window would swallow; event 1's own arm was the first of that id). The
    key's one schedule is then event 1's: its firing must start event 2, the key's latest, exactly once."""
    async with replicas(gateway_settings, 2) as (a, b):
        spec = webhook_spec(
            "pr-late-arm",
            events=["git.pullrequest.created", "git.pullrequest.updated"],
            concurrency={"key": KEY, "policy": "supersede", "debounce_s": 2},
        )
        created = await a.post("/triggers", json=spec, headers=AS_ADMIN)
        assert created.status_code == 201, created.text
        await until_served(b, "pr-late-arm")  # before event 1: the two events must land in one window
        first = await post(a, _push(21, 1), "pr-late-arm")
        second = await post(b, _push(21, 2), "pr-late-arm")
        assert [first.status_code, second.status_code] == [202, 202], (first.text, second.text)
        older, latest = first.json()["run_id"], second.json()["run_id"]
        where = state_key("pr-late-arm", f"{REPO_ID}/21")
        state = await (await bus.store(BUCKET_CONCURRENCY, KeyState)).get(where)
        assert state is not None
        assert state.value.debounced is not None
        assert state.value.debounced.run_id == latest  # event 2 is the key's latest

        # event 1's arm, landing last: the key's schedule now fires event 1's timer (at its own window's end)
        late = DebounceTimer(trigger_id="pr-late-arm", state_key=where, run_id=older)
        await Timers(bus, TIMER_NS_TRIGGER_DEBOUNCE).arm(
            where, datetime.now(UTC) + timedelta(seconds=2), late.model_dump_json().encode()
        )

        (started,) = await event_log.wait_for("run.requested", run_id=latest, timeout_s=60)
        assert started.data["launch"]["delivery_id"] == second.json()["delivery_id"]
        await event_log.caught_up()
        await stays(
            lambda: [e.runid for e in event_log.of_type("run.requested") if e.runid in (older, latest)] == [latest],
            settle_s=4,
            what="one run, of the key's latest event",
        )
        final = await (await bus.store(BUCKET_CONCURRENCY, KeyState)).get(where)
        assert final is not None
        assert final.value.debounced is None
        assert final.value.active is not None
        assert final.value.active.run_id == latest


async def test_a_firing_overtaken_by_a_newer_event_refuses_nothing(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    """The interleaving the concurrent test hit on a loaded machine, made to happen every time: event 1's window
    ends and its firing reads the key (event 1 its latest), but event 2 is compare-and-set as the latest before
    the firing's own compare-and-set. The firing passes: event 2's delivery refused event 1 (debounced) and event
    2's window decides the key. It must not refuse event 1 again as a concurrency skip: that rejection has the
    same event id as the debounced one (so only the first of the two is stored) and rewrote event 1's delivery
    record."""
    spec = webhook_spec(
        "pr-overtaken",
        events=["git.pullrequest.created", "git.pullrequest.updated"],
        concurrency={"key": KEY, "policy": "supersede", "debounce_s": 60},  # no window ends during the test
    )
    async with replicas(gateway_settings, 1) as (a,):
        created = await a.post("/triggers", json=spec, headers=AS_ADMIN)
        assert created.status_code == 201, created.text
        first = await post(a, _push(31, 1), "pr-overtaken")
        second = await post(a, _push(31, 2), "pr-overtaken")
    assert [first.json()["status"], second.json()["status"]] == ["debounced", "debounced"], (first.text, second.text)
    older, latest = first.json()["run_id"], second.json()["run_id"]
    key = f"{REPO_ID}/31"
    found = await (await bus.store(BUCKET_CONCURRENCY, QueuedLaunch)).get(launch_key(older))
    assert found is not None
    trigger = validate_spec(spec, environ={}, agents=AGENTS)

    # event 1's firing, its compare-and-set after event 2's (as if it had read the key just before event 2 came)
    await Launcher(bus, retry_after_s=1).launch_debounced(found.value, trigger, key)

    record = await Deliveries(bus).get("pr-overtaken", first.json()["delivery_id"])
    assert record is not None
    assert (record.state, record.reason) == ("rejected", "debounced")
    await event_log.caught_up()
    (refused,) = [e for e in event_log.of_type("trigger.rejected") if e.data["delivery_id"] == record.delivery_id]
    assert refused.data["reason"] == "debounced"
    assert not [e for e in event_log.of_type("run.requested") if e.runid in (older, latest)]
    state = await (await bus.store(BUCKET_CONCURRENCY, KeyState)).get(state_key("pr-overtaken", key))
    assert state is not None
    assert state.value.debounced is not None
    assert state.value.debounced.run_id == latest  # still event 2's window to decide
    assert state.value.active is None
