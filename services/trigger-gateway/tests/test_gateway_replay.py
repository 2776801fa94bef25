"""A captured signed body re-sent under another delivery id (GitHub's ``X-Hub-Signature-256`` covers the body only,
never ``X-GitHub-Delivery``) is a ``duplicate`` of the run the body started: the trigger dedupes on the body's
SHA-256 as well as on the event id (``launch.body_key``, claimed in the same round trip). Real nats-server; two
gateway replicas in-process where the order across replicas matters, the ASGI app over the real bus elsewhere."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from typing import Any
from unittest.mock import patch

import httpx
import pytest
from gateway_support import (
    AS_ADMIN,
    AS_OPERATOR,
    AS_VIEWER,
    GITHUB_SECRET,
    events_not_acked,
    eventually,
    fixture_bytes,
    fixture_json,
    github_headers,
    journal_of,
    load_triggers_yaml,
    post,
    replicas,
    until_served,
    webhook_spec,
)

from temporality_bus import Bus, TransientError
from temporality_protocol import TriggerRejected, derive_id, run_id_for_delivery
from temporality_testing.events import EventLog
from temporality_testing.waiting import stays
from temporality_trigger_gateway import Settings, TriggerConfig, create_app, intake
from temporality_trigger_gateway.adapters import ADAPTERS
from temporality_trigger_gateway.redrive import rerun_delivery_id
from temporality_trigger_gateway.triggers import WebhookTrigger

HMAC_SECRET = "hmac-secret-for-replay-tests"
EXTRA = f"""
triggers:
  - id: gh-replay
    name: GitHub, replay-guarded
    type: webhook
    adapter: github
    events: [pull_request.opened, pull_request.synchronize]
    agent: reviewer
    auth: {{type: github, secret: {GITHUB_SECRET}}}
  - id: generic-hmac
    name: A generic sender signing its body only
    type: webhook
    adapter: generic
    events: [order.created]
    agent: reviewer
    auth: {{type: hmac_sha256, header: X-Signature, prefix: "sha256=", secret: {HMAC_SECRET}}}
"""


@pytest.fixture
def triggers() -> list[TriggerConfig]:
    return load_triggers_yaml(EXTRA)


def _gh(raw: bytes, delivery: str) -> dict[str, str]:
    return github_headers(raw, "pull_request", delivery)


def _pr(number: int, **changes: Any) -> bytes:
    """A GitHub ``pull_request.opened`` body (the project's fixture), as GitHub would sign it."""
    body = json.loads(fixture_bytes("github-pr-opened.json"))
    body["pull_request"]["number"] = number
    body["pull_request"].update(changes)
    return json.dumps(body).encode()


def _spec() -> dict[str, Any]:
    return webhook_spec(
        "gh-api",
        adapter="github",
        events=["pull_request.opened"],
        auth={"type": "github", "secret": GITHUB_SECRET},
        input={"number": "payload.pull_request.number", "team": "context.team"},
    )


async def _row(client: httpx.AsyncClient, trigger_id: str, delivery_id: str) -> dict[str, Any] | None:
    page = (await client.get(f"/triggers/{trigger_id}/deliveries", headers=AS_VIEWER)).json()
    return next((row for row in page["deliveries"] if row["delivery_id"] == delivery_id), None)


def test_which_triggers_dedupe_on_the_body() -> None:
    """Only a body-only signature with an event id a header can give: GitHub, and generic with hmac_sha256."""
    cases = {
        "{adapter: github, events: [push], auth: {type: github, secret: s}}": True,
        "{adapter: generic, events: [x], auth: {type: hmac_sha256, header: X-S, secret: s}}": True,
        "{adapter: generic, events: [x], auth: {type: standard_webhooks, secret: whsec_dGVzdC1rZXktMDAwMQ==}}": False,
        "{adapter: generic, events: [x], auth: {type: bearer, token: t}}": False,
        "{adapter: gitlab, events: [push], auth: {type: gitlab, secret: s}}": False,
        "{adapter: mindmap.test_case, events: [test_case.created], auth: {type: mindmap, secret: s, token: t}}": False,
        "{adapter: azure_devops.pull_request, events: [git.pullrequest.created], "
        "auth: {type: basic, username: u, password: p}}": False,
    }
    for fields, guarded in cases.items():
        yaml_text = f"triggers:\n  - {{id: t, name: t, type: webhook, agent: reviewer, {fields[1:]}\n"
        (trigger,) = load_triggers_yaml(yaml_text)
        assert isinstance(trigger, WebhookTrigger)
        assert intake.replay_guarded(trigger, ADAPTERS[trigger.adapter]) is guarded, fields


async def test_the_reviewers_sequence_starts_one_run_on_any_replica(
    gateway_settings: Settings, bus: Bus, event_log: EventLog
) -> None:
    """d-1, d-1, d-2, d-3 with one signed body -> 202, then three duplicates of d-1's run; a re-drive of a replay is
    a duplicate too; a rerun of the accepted delivery is still a new run; GitHub's ping is ignored whatever its id."""
    async with replicas(gateway_settings, 2) as (a, b):
        created = await a.post("/triggers", json=_spec(), headers=AS_ADMIN)
        assert created.status_code == 201, created.text
        await until_served(b, "gh-api")
        raw = _pr(101)
        d1, d2, d3 = (f"d-{uuid.uuid4()}" for _ in range(3))
        run = run_id_for_delivery("gh-api", d1)

        answers = [await post(c, raw, "gh-api", _gh(raw, d)) for c, d in ((a, d1), (b, d1), (a, d2), (b, d3))]
        assert [(r.status_code, r.json()["status"]) for r in answers] == [
            (202, "accepted"),
            (200, "duplicate"),
            (200, "duplicate"),
            (200, "duplicate"),
        ], [r.text for r in answers]
        assert {r.json()["run_id"] for r in answers} == {run}  # the replays name the one run, not one of their own
        (requested,) = await event_log.wait_for("run.requested", timeout_s=10)
        assert requested.data["event"]["id"] == d1
        rejected = await event_log.wait_for("trigger.rejected", count=3, timeout_s=10)
        details = [e.payload(TriggerRejected) for e in rejected]
        assert all(r.reason == "duplicate" and r.run_id == run for r in details)
        replays = sorted(r.source_event_id or "" for r in details if "same signed body" in r.detail)
        assert replays == sorted([d2, d3])
        assert all(d1 in r.detail and "starts no run" in r.detail for r in details if "same signed body" in r.detail)

        # the replay's id again, on either replica: still that run's duplicate (its claim was marked so)
        again = await post(b, raw, "gh-api", _gh(raw, d2))
        assert (again.status_code, again.json()["status"], again.json()["run_id"]) == (200, "duplicate", run)

        # re-drive of a replay's delivery (its event id is d-2): a duplicate, never a run of its own
        replay_delivery = answers[2].json()["delivery_id"]
        row = await eventually(lambda: _row(a, "gh-api", replay_delivery), timeout_s=10, what="the replay's record")
        assert (row["state"], row["reason"], row["run_id"]) == ("rejected", "duplicate", run)
        redriven = await a.post(f"/triggers/gh-api/deliveries/{replay_delivery}/redrive", headers=AS_OPERATOR)
        assert redriven.status_code == 200, redriven.text
        assert (redriven.json()["status"], redriven.json()["run_id"]) == ("duplicate", run)

        # a rerun of the accepted delivery is unaffected: a new run, from the kept event
        accepted = answers[0].json()["delivery_id"]
        await eventually(lambda: _row(b, "gh-api", accepted), timeout_s=10, what="b listing the accepted delivery")
        rerun = await b.post(f"/triggers/gh-api/deliveries/{accepted}/redrive", json={"rerun": 1}, headers=AS_OPERATOR)
        assert rerun.status_code == 202, rerun.text
        rerun_run = derive_id("run", "gh-api", accepted, "rerun", "1")
        assert rerun.json()["run_id"] == rerun_run
        assert rerun.json()["delivery_id"] == rerun_delivery_id(accepted, 1)
        await event_log.wait_for("run.requested", run_id=rerun_run, timeout_s=10)

        # ping: ignored (no claim, no run) under any delivery id, the same body twice included
        ping = fixture_bytes("github-ping.json")
        for client in (a, b):
            pinged = await post(client, ping, "gh-api", github_headers(ping, "ping", str(uuid.uuid4())))
            assert (pinged.status_code, pinged.json()["status"]) == (200, "ignored")

        await stays(
            lambda: len(event_log.of_type("run.requested")) == 2, settle_s=1.0, what="two runs only: d-1's, its rerun"
        )


async def test_two_bodies_under_one_delivery_id_stay_one_event(client: httpx.AsyncClient, bus: Bus) -> None:
    """As documented before: one X-GitHub-Delivery is one event whatever the body. A body first seen as such a
    duplicate is that run's duplicate under any other id too."""
    first, second = _pr(201), _pr(201, title="Edited title")
    delivery = f"d-{uuid.uuid4()}"
    run = run_id_for_delivery("gh-replay", delivery)
    one = await post(client, first, "gh-replay", _gh(first, delivery))
    assert (one.status_code, one.json()["run_id"]) == (202, run), one.text
    two = await post(client, second, "gh-replay", _gh(second, delivery))
    assert (two.status_code, two.json()["status"], two.json()["run_id"]) == (200, "duplicate", run)
    (rejected,) = await journal_of(bus, "trigger.rejected")
    assert "already accepted as run" in rejected.payload(TriggerRejected).detail
    three = await post(client, second, "gh-replay", _gh(second, f"d-{uuid.uuid4()}"))
    assert (three.status_code, three.json()["status"], three.json()["run_id"]) == (200, "duplicate", run)
    # a different body under a new id is a new event, as ever
    other = _pr(202)
    four = await post(client, other, "gh-replay", _gh(other, f"d-{uuid.uuid4()}"))
    assert four.status_code == 202, four.text
    assert len(await journal_of(bus, "run.requested")) == 2


async def test_github_redeliver_after_a_503_starts_the_run_and_replays_stay_duplicates(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    """GitHub's Redeliver sends the same body under the same id: after a 503 (the body's key stays, naming that
    event's run) it starts the run; after a 202 it is a duplicate. A replay under another id is a duplicate of it."""
    raw = _pr(301)
    delivery = f"d-{uuid.uuid4()}"
    run = run_id_for_delivery("gh-replay", delivery)
    with events_not_acked("run.requested", TransientError("not acknowledged")):
        failed = await post(client, raw, "gh-replay", _gh(raw, delivery))
    assert failed.status_code == 503, failed.text
    redelivered = await post(client, raw, "gh-replay", _gh(raw, delivery))
    assert (redelivered.status_code, redelivered.json()["run_id"]) == (202, run), redelivered.text
    again = await post(client, raw, "gh-replay", _gh(raw, delivery))
    assert (again.status_code, again.json()["status"]) == (200, "duplicate")
    replay = await post(client, raw, "gh-replay", _gh(raw, f"d-{uuid.uuid4()}"))
    assert (replay.status_code, replay.json()["status"], replay.json()["run_id"]) == (200, "duplicate", run)
    assert [e.runid for e in await journal_of(bus, "run.requested")] == [run]


async def test_generic_hmac_replays_under_another_idempotency_key_are_duplicates(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    """``hmac_sha256`` signs the body only; ``Idempotency-Key`` (or ``webhook-id``) is an unsigned header."""
    raw = json.dumps(fixture_json("generic-order.json")).encode()
    signature = "sha256=" + hmac.new(HMAC_SECRET.encode(), raw, hashlib.sha256).hexdigest()
    answers = []
    for key in ("k-1", "k-2", "k-3"):
        answers.append(await post(client, raw, "generic-hmac", {"X-Signature": signature, "Idempotency-Key": key}))
    forged = await post(client, raw, "generic-hmac", {"X-Signature": signature, "webhook-id": "w-9"})
    assert [r.json()["status"] for r in (*answers, forged)] == ["accepted", "duplicate", "duplicate", "duplicate"]
    assert len(await journal_of(bus, "run.requested")) == 1


async def test_a_rolling_upgrade_never_launches_one_event_twice(
    bus: Bus, settings: Settings, triggers: list[TriggerConfig]
) -> None:
    """An old replica (no body key: ``replay_guarded`` false) and a new one share the event id's claim, so a
    delivery and its redelivery, on either in either order, make one run; replays through the new replica stop
    being runs once a body key exists (an old replica's replays still start runs: every replica must be upgraded)."""
    app = create_app(settings, bus, triggers)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as client:

        async def old(raw: bytes, delivery: str) -> httpx.Response:
            with patch.object(intake, "replay_guarded", lambda *_: False):
                return await post(client, raw, "gh-replay", _gh(raw, delivery))

        async def new(raw: bytes, delivery: str) -> httpx.Response:
            return await post(client, raw, "gh-replay", _gh(raw, delivery))

        first, second = _pr(401), _pr(402)
        d1, d2, d3 = (f"d-{uuid.uuid4()}" for _ in range(3))
        statuses = [
            (await old(first, d1)).json()["status"],  # the old replica takes the event
            (await new(first, d1)).json()["status"],  # GitHub's redelivery lands on the new one
            (await new(second, d2)).json()["status"],  # the new one takes another event
            (await old(second, d2)).json()["status"],  # and its redelivery lands on the old one
            (await new(second, d3)).json()["status"],  # a replay of it on the new one
        ]
        assert statuses == ["accepted", "duplicate", "accepted", "duplicate", "duplicate"]
        runs = [e.runid for e in await journal_of(bus, "run.requested")]
        assert runs == [run_id_for_delivery("gh-replay", d1), run_id_for_delivery("gh-replay", d2)]
