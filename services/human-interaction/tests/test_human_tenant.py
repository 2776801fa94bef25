"""Every event about a request carries its run's tenant (the ``tenant`` of its ``human.requested``).

An acceptance review found ``human.notified`` and ``human.answered`` journaled with ``tenant: null`` while the run's
``human.requested`` had one: an event trigger's ``project`` filter never matched an answer, a trigger with a tenant of
its own stamped an answer from another tenant's run with it, and a subscriber filtering by tenant lost the
notification and answer steps. Over a real nats-server with the service's consumers running.
"""

from __future__ import annotations

import httpx
import pytest
from human_support import ALICE, events_of, requested, wait_for_record

from temporality_bus import Bus


@pytest.mark.usefixtures("consumers")
async def test_notified_and_answered_carry_the_run_s_tenant(bus: Bus, client: httpx.AsyncClient) -> None:
    event = requested(tenant="fabrikam")
    request_id = str(event.data["request_id"])
    await bus.publish(event)
    [notified] = await events_of(bus, "human.notified", wait_for=1)
    assert notified.tenant == "fabrikam"
    await wait_for_record(bus, request_id, lambda r: r.tenant == "fabrikam")
    answered = await client.post(f"/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
    assert answered.status_code == 200, answered.text
    [answer] = await events_of(bus, "human.answered", wait_for=1)
    assert answer.tenant == "fabrikam"


@pytest.mark.usefixtures("consumers")
async def test_an_expiry_carries_it_and_a_run_without_one_stays_without(bus: Bus) -> None:
    await bus.publish(requested(tenant="contoso", expires_in_s=1))
    [expired] = await events_of(bus, "human.expired", wait_for=1)
    assert expired.tenant == "contoso"

    untenanted = requested()
    await bus.publish(untenanted)
    notified = await events_of(bus, "human.notified", wait_for=2)
    [mine] = [e for e in notified if e.runid == untenanted.runid]
    assert mine.tenant is None
