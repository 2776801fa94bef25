"""Rerun (``POST …/deliveries/{d}/redrive`` with ``{"rerun": n}``): an accepted delivery's event run again as a
new run, explicitly and idempotently, e.g. once the agent's card that made its run fail is fixed. A plain re-drive
of an accepted delivery stays 409 and names the rerun. Real nats-server; two gateway replicas in-process (each
its own runtime and NATS connection, ``gateway_support.replicas``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from gateway_support import (
    AS_ADMIN,
    AS_OPERATOR,
    AS_VIEWER,
    eventually,
    fixture_json,
    post,
    replicas,
    until_served,
    webhook_spec,
)

from temporality_bus import Bus
from temporality_protocol import NormalizedEvent, RunFailed, derive_id, make_event, run_id_for_delivery
from temporality_protocol.catalog import BUCKET_CONCURRENCY
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays
from temporality_trigger_gateway import Settings
from temporality_trigger_gateway.concurrency import KeyState, QueuedLaunch, state_key
from temporality_trigger_gateway.redrive import rerun_delivery_id

URL = "/triggers/api-pr/deliveries/{}/redrive"


def _pull_request(n: int) -> dict[str, Any]:
    body = fixture_json("pr-created.json")
    body["id"] = f"ado-evt-rerun-{n}"
    return body


async def _listed(client: httpx.AsyncClient, delivery_id: str) -> dict[str, Any] | None:
    """``delivery_id``'s row as ``client``'s replica lists the trigger's deliveries (``None``: not yet)."""
    page = (await client.get("/triggers/api-pr/deliveries", headers=AS_VIEWER)).json()
    return next((row for row in page["deliveries"] if row["delivery_id"] == delivery_id), None)


async def _accepted_on(client: httpx.AsyncClient, delivery_id: str) -> dict[str, Any] | None:
    row = await _listed(client, delivery_id)
    return row if row is not None and row["state"] == "accepted" else None


def _failed(run_id: str) -> Any:
    """``run.failed`` as the run-executor publishes it when the provider refused the agent's configuration."""
    data = RunFailed(run_id=run_id, reason="error", error="provider answered 401: no API key")
    return make_event(
        data,
        source="/temporality/run-executor",
        id=derive_id("evt", run_id, "run.failed"),
        run_id=run_id,
        actor="agent:reviewer",
    )


async def test_an_accepted_delivery_is_rerun_as_a_new_run_once_per_number_across_replicas(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 2) as (a, b):
        created = await a.post("/triggers", json=webhook_spec(), headers=AS_ADMIN)
        assert created.status_code == 201, created.text
        await until_served(b, "api-pr")
        first = await post(a, _pull_request(1), "api-pr")
        assert first.status_code == 202, first.text
        original_id = first.json()["delivery_id"]
        original_run = run_id_for_delivery("api-pr", "ado-evt-rerun-1")
        assert first.json()["run_id"] == original_run
        (requested,) = await event_log.wait_for("run.requested", run_id=original_run, timeout_s=10)
        await bus.publish(_failed(original_run))  # the run failed on the agent's configuration
        await eventually(lambda: _accepted_on(b, original_id), timeout_s=10, what="b listing the accepted delivery")

        # a plain re-drive stays 409 (never a second run by accident) and names the rerun; so does the sender's copy
        plain = await b.post(URL.format(original_id), headers=AS_OPERATOR)
        assert plain.status_code == 409, plain.text
        assert plain.json()["error"] == "delivery_accepted"
        assert 'rerun it: POST this with the body {"rerun": 1}' in plain.json()["detail"]
        assert (await post(a, _pull_request(1), "api-pr")).json()["status"] == "duplicate"

        # the trigger is fixed meanwhile (here its context): the rerun runs the event through it as it is now
        fixed = await a.put(
            "/triggers/api-pr",
            json=webhook_spec(context={"team": "platform"}),
            headers={**AS_ADMIN, "If-Match": created.headers["ETag"]},
        )
        assert fixed.status_code == 200, fixed.text
        await until_served(b, "api-pr")

        assert (await b.post(URL.format(original_id), json={"rerun": 1}, headers=AS_VIEWER)).status_code == 403
        rerun = await b.post(URL.format(original_id), json={"rerun": 1}, headers=AS_OPERATOR)
        assert rerun.status_code == 202, rerun.text
        answer = rerun.json()
        rerun_run = derive_id("run", "api-pr", original_id, "rerun", "1")
        assert answer == {
            "redrive_of": original_id,
            "delivery_id": rerun_delivery_id(original_id, 1),
            "rerun": 1,
            "rerun_of": original_run,
            "status": "accepted",
            "run_id": rerun_run,
        }
        (again,) = await event_log.wait_for("run.requested", run_id=rerun_run, timeout_s=10)
        assert again.data["launch"] == {
            "kind": "webhook",
            "trigger_id": "api-pr",
            "delivery_id": answer["delivery_id"],
            "depth": 0,
            "rerun_of": original_run,
            "requested_by": "on-call",
        }
        assert again.data["event"]["id"] == requested.data["event"]["id"] == "ado-evt-rerun-1"
        assert again.data["input"] == {**requested.data["input"], "team": "platform"}
        assert requested.data["launch"]["rerun_of"] is None

        # the same rerun retried, on the other replica: the same run, whether a sees b's record yet or not
        retried = await a.post(URL.format(original_id), json={"rerun": 1}, headers=AS_OPERATOR)
        assert retried.status_code in (200, 202), retried.text
        assert retried.json()["status"] in ("accepted", "duplicate")
        assert retried.json()["run_id"] == rerun_run
        await eventually(
            lambda: _accepted_on(a, answer["delivery_id"]), timeout_s=10, what="a listing the rerun's delivery"
        )
        duplicate = await a.post(URL.format(original_id), json={"rerun": 1}, headers=AS_OPERATOR)
        assert duplicate.status_code == 200, duplicate.text
        assert duplicate.json()["status"] == "duplicate"
        assert duplicate.json()["run_id"] == rerun_run
        assert 'send {"rerun": 2}' in duplicate.json()["detail"]
        skipped = await a.post(URL.format(original_id), json={"rerun": 3}, headers=AS_OPERATOR)
        assert skipped.status_code == 409, skipped.text
        assert skipped.json()["error"] == "rerun_out_of_order"
        assert '{"rerun": 2}' in skipped.json()["detail"]

        # the next number is the next run
        second = await a.post(URL.format(original_id), json={"rerun": 2}, headers=AS_OPERATOR)
        assert second.status_code == 202, second.text
        second_run = derive_id("run", "api-pr", original_id, "rerun", "2")
        assert second.json()["run_id"] == second_run
        await event_log.wait_for("run.requested", run_id=second_run, timeout_s=10)
        await event_log.caught_up()
        await stays(
            lambda: (
                sorted(e.runid or "" for e in event_log.of_type("run.requested"))
                == sorted([original_run, rerun_run, second_run])
            ),
            settle_s=0.3,
            what="three runs: the original and two reruns, never a fourth",
        )

        # the deliveries link them both ways
        original = await eventually(
            lambda: _with_reruns(b, original_id, 2), timeout_s=10, what="b listing the original with its reruns"
        )
        assert original["run_id"] == original_run
        assert original["rerun"] is None
        row = await _listed(b, answer["delivery_id"])
        assert row is not None
        assert (row["state"], row["run_id"], row["redrive_of"], row["rerun"], row["rerun_of"]) == (
            "accepted",
            rerun_run,
            original_id,
            1,
            original_run,
        )


async def _with_reruns(client: httpx.AsyncClient, delivery_id: str, count: int) -> dict[str, Any] | None:
    row = await _listed(client, delivery_id)
    return row if row is not None and len(row["redriven_as"]) >= count else None


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"rerun": True}, "rerun is the rerun's number"),
        ({"rerun": 0}, "rerun is the rerun's number"),
        ({"rerun": "1"}, "rerun is the rerun's number"),
        ({"rerun": 1, "force": True}, 'the body is empty (a re-drive) or {"rerun": n}'),
        ([1], 'the body is empty (a re-drive) or {"rerun": n}'),
    ],
)
async def test_a_malformed_rerun_is_422(gateway_settings: Settings, body: Any, says: str) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        assert (await a.post("/triggers", json=webhook_spec(), headers=AS_ADMIN)).status_code == 201
        answer = await a.post(URL.format(rerun_delivery_id("dlv-x", 1)), json=body, headers=AS_OPERATOR)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"] == "invalid_request"
        assert says in answer.json()["detail"]


async def test_only_an_accepted_delivery_is_rerun(gateway_settings: Settings, event_log: EventLog) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        assert (await a.post("/triggers", json=webhook_spec(), headers=AS_ADMIN)).status_code == 201
        assert (await post(a, _pull_request(2), "api-pr")).status_code == 202
        copy = await post(a, _pull_request(2), "api-pr")
        assert copy.json()["status"] == "duplicate"
        refused = await a.post(URL.format(copy.json()["delivery_id"]), json={"rerun": 1}, headers=AS_OPERATOR)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == "not_rerunnable"
        assert "re-drive this one without rerun" in refused.json()["detail"]
        # an empty body, or {}, is the plain re-drive it always was (a duplicate of the accepted event here)
        for content in (b"", b"{}"):
            plain = await a.post(URL.format(copy.json()["delivery_id"]), content=content, headers=AS_OPERATOR)
            assert plain.status_code == 200, plain.text
            assert plain.json()["status"] == "duplicate"
        await event_log.caught_up()
        assert len(event_log.of_type("run.requested")) == 1


async def _key_free(bus: Bus, trigger_id: str, key: str) -> bool:
    found = await (await bus.store(BUCKET_CONCURRENCY, KeyState)).get(state_key(trigger_id, key))
    return found is None or found.value.active is None


async def test_a_rerun_skipped_by_its_busy_key_is_decided_again_when_retried(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    """A rerun takes the trigger's flow control like any delivery; a skip gives its own claim back (never the
    original event's), so the same rerun retried once the key is free starts its run."""
    key = "payload.repository.name"
    async with replicas(gateway_settings, 2) as (a, b):
        spec = webhook_spec(concurrency={"key": key, "policy": "skip"})
        assert (await a.post("/triggers", json=spec, headers=AS_ADMIN)).status_code == 201
        await until_served(b, "api-pr")
        first = await post(a, _pull_request(3), "api-pr")
        assert first.status_code == 202, first.text
        original_id, original_run = first.json()["delivery_id"], first.json()["run_id"]
        await eventually(lambda: _accepted_on(b, original_id), timeout_s=10, what="b listing the accepted delivery")

        busy = await b.post(URL.format(original_id), json={"rerun": 1}, headers=AS_OPERATOR)
        assert busy.status_code == 200, busy.text
        assert busy.json()["status"] == "skipped"
        assert busy.json()["active_run_id"] == original_run

        await bus.publish(_failed(original_run))  # the original run ends: its key is free
        await eventually(lambda: _key_free(bus, "api-pr", "payments-api"), timeout_s=10, what="the key released")
        started = await a.post(URL.format(original_id), json={"rerun": 1}, headers=AS_OPERATOR)
        assert started.status_code == 202, started.text
        rerun_run = derive_id("run", "api-pr", original_id, "rerun", "1")
        assert started.json()["run_id"] == rerun_run
        (requested,) = await event_log.wait_for("run.requested", run_id=rerun_run, timeout_s=10)
        assert requested.data["launch"]["rerun_of"] == original_run
        assert not await _key_free(bus, "api-pr", "payments-api")  # the rerun's run holds the key now
        await event_log.caught_up()
        assert sorted(e.runid or "" for e in event_log.of_type("run.requested")) == sorted([original_run, rerun_run])


def test_only_a_reruns_queued_launch_stores_the_rerun_fields() -> None:
    """An earlier gateway (a rolling upgrade) forbids unknown fields: every other queued launch is stored as before."""
    event = NormalizedEvent(id="e-1", type="t", source="/s", timestamp=datetime(2026, 12, 6, tzinfo=UTC), payload={})
    plain = QueuedLaunch(
        trigger_id="t",
        delivery_id="dlv-1",
        kind="webhook",
        adapter="generic",
        source_event_id="e-1",
        source_event_type="t",
        run_id="run-1",
        title="x",
        event=event,
        input={},
    )
    assert not {"rerun", "rerun_of", "requested_by"} & set(json.loads(plain.model_dump_json()))
    rerun = plain.model_copy(update={"rerun": 1, "rerun_of": "run-0", "requested_by": "on-call"})
    assert QueuedLaunch.model_validate_json(rerun.model_dump_json()) == rerun
