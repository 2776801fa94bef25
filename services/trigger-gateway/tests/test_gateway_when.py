"""Boolean trigger conditions (``when``, TRG-5/6, issue 7): a JMESPath expression over the delivery's
document, compiled once, evaluated after the source match; a delivery it does not hold for is ``filtered``
(journaled, recorded, no run). Real nats-server; the gateways are the real ``configure`` + ``run_until``
in-process (``gateway_support.replicas``)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from gateway_support import (
    AGENTS,
    AS_ADMIN,
    AS_OPERATOR,
    AS_VIEWER,
    eventually,
    fixture_json,
    post,
    replicas,
    webhook_request,
    webhook_spec,
)

from temporality_bus import Bus
from temporality_protocol import RunCompleted, TriggerRejected, derive_id, make_event, run_id_for_delivery
from temporality_protocol.catalog import EVENTS_STREAM
from temporality_testing.events import EventLog
from temporality_trigger_gateway import Settings, parse_triggers
from temporality_trigger_gateway.adapters import ADAPTERS
from temporality_trigger_gateway.errors import TriggerConfigError
from temporality_trigger_gateway.events import normalize
from temporality_trigger_gateway.mapping import MappingFailed, is_truthy
from temporality_trigger_gateway.store import validate_spec
from temporality_trigger_gateway.triggers import EventTrigger, WebhookTrigger

#: Only pull requests into main: the fixture's target branch is ``develop``.
INTO_MAIN = "payload.target_branch == 'main'"


def _pr(event_id: str, target: str = "develop") -> dict[str, Any]:
    body = fixture_json("pr-created.json")
    body["id"] = event_id
    body["resource"]["targetRefName"] = f"refs/heads/{target}"
    return body


def _completed(run_id: str, turns: int) -> Any:
    return make_event(
        RunCompleted(run_id=run_id, result=f"findings of {run_id}", turns=turns),
        source="/temporality/run-executor",
        id=derive_id("evt", run_id, "run.completed"),
        run_id=run_id,
        actor="agent:reviewer",
        tenant="fabrikam",
    )


def _event_spec(trigger_id: str = "long-reviews", **changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "id": trigger_id,
        "name": "Look again at long reviews",
        "type": "event",
        "event_type": "run.completed",
        "filter": {"actor_id": "reviewer"},
        "when": "payload.turns > `2`",
        "agent": "triager",
    }
    spec.update(changes)
    return spec


# --------------------------------------------------------------------------- pure
@pytest.mark.parametrize(
    ("value", "truthy"),
    [
        (False, False),
        (None, False),
        ("", False),
        ([], False),
        ({}, False),
        (True, True),
        (0, True),  # JMESPath, unlike Python: a number is true
        (0.0, True),
        ("false", True),
        ([False], True),
        ({"a": None}, True),
    ],
)
def test_truthiness_is_jmespaths(value: Any, truthy: bool) -> None:
    assert is_truthy(value) is truthy


def test_the_condition_is_compiled_once_and_evaluated_on_the_event_document() -> None:
    trigger = validate_spec(webhook_spec(when="payload.pull_request.id"), environ={}, agents=AGENTS)
    assert isinstance(trigger, WebhookTrigger)
    adapter = ADAPTERS["azure_devops.pull_request"]
    event = adapter.normalize(webhook_request(_pr("e-1")), tenant=None)
    assert trigger.filtered(event) is None  # 7: a number, true
    for when, matches in [
        (INTO_MAIN, False),
        ("payload.target_branch == 'develop'", True),
        ("payload.reviewers", True),
        ("payload.nothing_here", False),  # null
        ("payload.pull_request.description", False),  # ""
        ("context.team == 'web'", True),  # the trigger's context is in the document, as for the mapping
        ("actor.type == 'user' && contains(payload.source_branch, 'fix/')", True),
    ]:
        changed = validate_spec(webhook_spec(when=when), environ={}, agents=AGENTS)
        assert (changed.filtered(event) is None) is matches, when
    failing = validate_spec(webhook_spec(when="length(payload.pull_request.id) > `1`"), environ={}, agents=AGENTS)
    with pytest.raises(MappingFailed) as failed:
        failing.filtered(event)
    assert failed.value.where == "when"


def test_an_event_triggers_filter_and_when_are_one_condition() -> None:
    trigger = validate_spec(_event_spec(), environ={}, agents=AGENTS)
    assert isinstance(trigger, EventTrigger)
    assert trigger.filtered(normalize(_completed("run-1", turns=3))) is None
    short = trigger.filtered(normalize(_completed("run-1", turns=2)))
    assert short is not None
    assert "when" in short
    other = validate_spec(_event_spec(filter={"actor_id": "triager"}), environ={}, agents=AGENTS)
    refused = other.filtered(normalize(_completed("run-1", turns=3)))
    assert refused is not None
    assert "filter actor_id" in refused


def test_an_invalid_condition_in_the_file_is_a_config_error_naming_it() -> None:
    text = yaml.safe_dump({"triggers": [_event_spec(when="payload.[[")]})
    with pytest.raises(TriggerConfigError) as refused:
        parse_triggers(yaml.safe_load(text), source="t.yaml", agents=AGENTS)
    assert "triggers[0] (long-reviews).when" in str(refused.value)
    assert "not a valid JMESPath expression" in str(refused.value)


# --------------------------------------------------------------------------- webhooks
async def test_a_webhook_the_condition_refuses_is_filtered_journaled_listed_and_starts_no_run(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        invalid = await a.post("/triggers", json=webhook_spec("pr-main", when="payload.[["), headers=AS_ADMIN)
        assert invalid.status_code == 422, invalid.text
        assert [e["field"] for e in invalid.json()["errors"]] == ["when"]
        created = await a.post("/triggers", json=webhook_spec("pr-main", when=INTO_MAIN), headers=AS_ADMIN)
        assert created.status_code == 201, created.text
        assert created.json()["trigger"]["when"] == INTO_MAIN

        refused = await post(a, _pr("evt-develop"), "pr-main")
        assert refused.status_code == 200, refused.text
        body = refused.json()
        assert (body["status"], body["reason"]) == ("ignored", "filtered")
        accepted = await post(a, _pr("evt-main", target="main"), "pr-main")
        assert accepted.status_code == 202, accepted.text
        assert accepted.json()["run_id"] == run_id_for_delivery("pr-main", "evt-main")

        (rejected,) = await event_log.wait_for("trigger.rejected", timeout_s=10)
        data = rejected.payload(TriggerRejected)
        assert (data.trigger_id, data.reason, data.source_event_id) == ("pr-main", "filtered", "evt-develop")
        assert data.delivery_id == body["delivery_id"]
        await event_log.wait_for("run.requested", run_id=accepted.json()["run_id"], timeout_s=10)
        received = await event_log.wait_for("trigger.received", count=2, timeout_s=10)
        assert {e.data["delivery_id"] for e in received} == {body["delivery_id"], accepted.json()["delivery_id"]}

        rows = (await a.get("/triggers/pr-main/deliveries", headers=AS_VIEWER)).json()["deliveries"]
        assert [(r["delivery_id"], r["state"], r["reason"]) for r in rows] == [
            (accepted.json()["delivery_id"], "accepted", None),
            (body["delivery_id"], "rejected", "filtered"),
        ]
        assert rows[1]["has_event"] is True  # kept: it can be re-driven once the condition changed

        # the condition fails on this event (length of a number): 422 naming it, journaled, no run
        spec = webhook_spec("pr-broken", when="length(payload.pull_request.id) > `1`")
        assert (await a.post("/triggers", json=spec, headers=AS_ADMIN)).status_code == 201
        broken = await post(a, _pr("evt-broken"), "pr-broken")
        assert broken.status_code == 422, broken.text
        assert broken.json()["error"] == "mapping_failed"
        assert "when" in broken.json()["detail"]

        # re-drive of the filtered delivery, as the trigger is now: filtered again, then accepted once changed
        url = f"/triggers/pr-main/deliveries/{body['delivery_id']}/redrive"
        again = await a.post(url, headers=AS_OPERATOR)
        assert again.status_code == 200, again.text
        assert (again.json()["status"], again.json()["reason"]) == ("ignored", "filtered")
        current = await a.get("/triggers/pr-main", headers=AS_VIEWER)
        changed = await a.put(
            "/triggers/pr-main",
            json=webhook_spec("pr-main", when="payload.target_branch != 'main'"),
            headers={**AS_ADMIN, "If-Match": current.headers["ETag"]},
        )
        assert changed.status_code == 200, changed.text
        redriven = await a.post(url, headers=AS_OPERATOR)
        assert redriven.status_code == 202, redriven.text
        assert redriven.json()["run_id"] == run_id_for_delivery("pr-main", "evt-develop")


async def test_a_webhook_refused_by_its_condition_never_fires_an_event_trigger_on_refusals(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 1) as (a,):
        on_refusals = _event_spec("on-refusals", event_type="trigger.rejected", filter={}, when=None)
        assert (await a.post("/triggers", json=on_refusals, headers=AS_ADMIN)).status_code == 201
        spec = webhook_spec("pr-main", when=INTO_MAIN)
        assert (await a.post("/triggers", json=spec, headers=AS_ADMIN)).status_code == 201
        refused = await post(a, _pr("evt-develop"), "pr-main")
        assert (refused.status_code, refused.json()["reason"]) == (200, "filtered")
        await event_log.wait_for("trigger.rejected", timeout_s=10)

        async def settled() -> bool:
            info = await bus.js.consumer_info(EVENTS_STREAM.name, "trigger-gateway-events")
            return bool(info.num_pending == 0 and info.num_ack_pending == 0 and info.delivered.stream_seq > 0)

        await eventually(settled, timeout_s=10, what="the refusal handed to the event consumer")
        await event_log.caught_up()
        # a condition's refusal would only echo refusals: it fires no trigger
        assert not [e for e in event_log.of_type("trigger.received") if e.data["trigger_id"] == "on-refusals"]
        rows = (await a.get("/triggers/on-refusals/deliveries", headers=AS_VIEWER)).json()["deliveries"]
        assert rows == []


async def test_the_preview_shows_whether_the_sample_matches(gateway_settings: Settings) -> None:
    async with replicas(gateway_settings, 1) as (a,):

        async def preview(**body: Any) -> dict[str, Any]:
            answer = await a.post("/triggers/preview", json=body, headers=AS_VIEWER)
            assert answer.status_code == 200, answer.text
            found: dict[str, Any] = answer.json()
            return found

        no = await preview(trigger=webhook_spec(when=INTO_MAIN), payload=_pr("e-1"))
        assert (no["ok"], no["matches"], no["would_start_run"]) == (True, False, False)
        assert no["ignored"]["reason"] == "filtered"
        assert no["input"]["target_branch"] == "develop"  # the mapping is shown either way
        yes = await preview(trigger=webhook_spec(when=INTO_MAIN), payload=_pr("e-1", target="main"))
        assert (yes["matches"], yes["would_start_run"]) == (True, True)
        failing = await preview(trigger=webhook_spec(when="length(payload.pull_request.id) > `1`"), payload=_pr("e"))
        assert (failing["ok"], failing["stage"], failing["errors"][0]["field"]) == (False, "mapping", "when")
        invalid = await preview(trigger=webhook_spec(when="payload.[["), payload=_pr("e"))
        assert (invalid["stage"], invalid["errors"][0]["field"]) == ("trigger", "when")

        sample = _completed("run-9", turns=1).model_dump(mode="json", exclude_none=True)
        short = await preview(trigger=_event_spec(), payload=sample)
        assert (short["matches"], short["would_start_run"], short["ignored"]["reason"]) == (False, False, "filtered")
        sample["data"]["turns"] = 5
        long = await preview(trigger=_event_spec(), payload=sample)
        assert (long["matches"], long["would_start_run"]) == (True, True)


# --------------------------------------------------------------------------- event triggers on the bus
async def test_an_event_trigger_fires_only_when_its_condition_holds(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    async with replicas(gateway_settings, 2) as (a, b):
        assert (await a.post("/triggers", json=_event_spec(), headers=AS_ADMIN)).status_code == 201
        short, long = _completed("run-short", turns=1), _completed("run-long", turns=4)
        await bus.publish(short)
        await bus.publish(long)

        (run,) = await event_log.wait_for(
            "run.requested", where=lambda e: e.data["launch"].get("trigger_id") == "long-reviews", timeout_s=10
        )
        assert run.runid == run_id_for_delivery("long-reviews", long.id)

        async def listed() -> list[tuple[str | None, str, str | None]]:
            answer = await b.get("/triggers/long-reviews/deliveries", headers=AS_VIEWER)
            return [(r["source_event_id"], r["state"], r["reason"]) for r in answer.json()["deliveries"]]

        async def only_the_match_listed() -> bool:
            return await listed() == [(long.id, "accepted", None)]

        await eventually(only_the_match_listed, timeout_s=10, what="the matching delivery listed")

        async def settled() -> bool:
            info = await bus.js.consumer_info(EVENTS_STREAM.name, "trigger-gateway-events")
            return bool(info.num_pending == 0 and info.num_ack_pending == 0)

        await eventually(settled, timeout_s=10, what="every event handled")
        await event_log.caught_up()
        # the condition is a subscription filter: the short review is skipped, nothing journaled for it
        assert not event_log.of_type("trigger.rejected")
        assert [e.data["source_event_id"] for e in event_log.of_type("trigger.received")] == [long.id]
        assert await listed() == [(long.id, "accepted", None)]
