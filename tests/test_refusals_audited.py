"""Issue 11 (SEC-1/AP-11): what any service refuses is in the journal's audit trail, and nothing is anonymous but
health and metrics.

The five services run as their own processes, each on its own NATS user (``nats_auth``: the catalogue's
permissions, which must let each send ``api.access_refused`` and ``bus.permission_refused``). A refused token on
each service's API, a refused ``/openapi.json``, a webhook with a bad signature and a permissions violation of a
service's NATS connection each appear in the journal's ``GET /audit``, without the credential.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import httpx
import nats.errors
import pytest
from e2e_support import API_TOKENS, eventually, example_pr, make_stack, post_hook
from pydantic import SecretStr

from temporality_bus import NatsSettings
from temporality_embedded import Stack
from temporality_protocol.catalog import SERVICES, subject_for
from temporality_service.runtime import Runtime, run_until
from temporality_service.settings import ServiceSettings

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

VIEWER, OPERATOR, ADMIN = ({"Authorization": f"Bearer {t.token.get_secret_value()}"} for t in API_TOKENS)
BAD_TOKEN = "a-token-nobody-issued-0123456789abcdef"
SIGNING_SECRET = "signing-secret-of-the-refusals-test-0123"
FORGED = "sha256=" + "0" * 64
WRONG_PASSWORD = "Basic " + base64.b64encode(b"azure:not-the-password").decode()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = make_stack(tmp_path_factory.mktemp("refusals"), nats_auth=True)
    stack.start(120)
    try:
        yield stack
    finally:
        stack.stop()


async def _audit(http: httpx.AsyncClient, stack: Stack, kind: str) -> list[dict[str, Any]]:
    answer = await http.get(f"{stack.journal_url}/audit", params={"kind": kind, "limit": 500}, headers=OPERATOR)
    assert answer.status_code == 200, answer.text
    entries: list[dict[str, Any]] = answer.json()["entries"]
    return entries


async def test_every_services_refusals_are_in_the_journals_audit_trail(stack: Stack) -> None:
    assert stack.collab_url is not None
    assert stack.executor_url is not None
    protected = {
        "trigger-gateway": (stack.gateway_url, "/triggers"),
        "human-interaction": (stack.human_url, "/directory/users"),
        "journal": (stack.journal_url, "/runs"),
        "agent-collab": (stack.collab_url, "/agents"),
        "run-executor": (stack.executor_url, "/agents"),
    }
    async with httpx.AsyncClient(timeout=15) as http:
        for name, (url, path) in protected.items():
            refused = await http.get(f"{url}{path}", headers={"Authorization": f"Bearer {BAD_TOKEN}"})
            assert refused.status_code == 401, (name, refused.text)
            assert (await http.get(f"{url}{path}", headers=VIEWER)).status_code == 200, name
            # nothing anonymous but health and metrics: not even the API's description
            anonymous = await http.get(f"{url}/openapi.json")
            assert anonymous.status_code == 401, (name, anonymous.text)
            assert anonymous.json()["error"] == "unauthorized"
            document = await http.get(f"{url}/openapi.json", headers=VIEWER)
            assert document.status_code == 200, (name, document.text)
            assert path in document.json()["paths"], name
            for page in ("/docs", "/redoc"):
                assert (await http.get(f"{url}{page}")).status_code == 404, (name, page)
            assert (await http.get(f"{url}/healthz")).status_code == 200, name
        # a person's inbox token human-interaction does not know (the inbox's own check, not the role tokens')
        inbox = await http.get(f"{stack.human_url}/inbox", headers={"Authorization": f"Bearer {BAD_TOKEN}"})
        assert inbox.status_code == 401, inbox.text
        forbidden = await http.post(f"{stack.gateway_url}/triggers", json={}, headers=VIEWER)
        assert forbidden.status_code == 403, forbidden.text  # a viewer may not create triggers

        # a webhook whose signature does not match its body (a trigger signing with HMAC-SHA256, made here)
        spec = {
            "id": "signed-review",
            "name": "Signed review requests",
            "type": "webhook",
            "adapter": "generic",
            "events": ["review.requested"],
            "agent": "reviewer",
            "auth": {"type": "hmac_sha256", "header": "X-Signature", "prefix": "sha256=", "secret": SIGNING_SECRET},
            "human": {"allowed_recipients": ["user:alice"], "default_timeout_s": 3600},
        }
        created = await http.post(f"{stack.gateway_url}/triggers", json=spec, headers=ADMIN)
        assert created.status_code == 201, created.text
        body = json.dumps({"type": "review.requested", "id": "evt-1", "data": {"pr": 7}}).encode()
        bad = await post_hook(http, stack, body, trigger="signed-review", **{"X-Signature": FORGED})
        assert bad.status_code == 401, bad.text
        # from another address (one event per caller and window: 127.0.0.1's next refusals are only counted)
        transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        async with httpx.AsyncClient(timeout=15, transport=transport) as other:
            wrong_password = await post_hook(other, stack, example_pr(), Authorization=WRONG_PASSWORD)
        assert wrong_password.status_code == 401, wrong_password.text

        def found(entries: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
            return {(e["details"]["service"], e["details"]["path"], e["details"]["reason"]): e for e in entries}

        wanted = {
            *((name, path, "invalid_token") for name, (_url, path) in protected.items()),
            ("trigger-gateway", "/triggers", "forbidden"),
            ("human-interaction", "/inbox", "inbox_token"),
            ("trigger-gateway", "/hooks/signed-review", "bad_signature"),
            ("trigger-gateway", "/hooks/ado-pr-review", "bad_credentials"),
        }

        async def all_audited() -> dict[tuple[str, str, str], dict[str, Any]] | None:
            entries = found(await _audit(http, stack, "access_refusal"))
            return entries if wanted <= set(entries) else None

        entries = await eventually(all_audited, timeout_s=60, what=f"the refusals in the journal's /audit: {wanted}")
        assert entries[("trigger-gateway", "/triggers", "forbidden")]["actor"] == "token:e2e-viewer"
        signature = entries[("trigger-gateway", "/hooks/signed-review", "bad_signature")]
        assert signature["kind"] == "access_refusal"
        assert signature["details"]["status"] == 401
        assert signature["actor"] == "address:127.0.0.1"
        credentials = entries[("trigger-gateway", "/hooks/ado-pr-review", "bad_credentials")]
        assert credentials["actor"] == "address:127.0.0.2"
        assert credentials["summary"] == "trigger-gateway: 401 bad_credentials POST /hooks/ado-pr-review for 127.0.0.2"
        trail = (await http.get(f"{stack.journal_url}/audit", params={"limit": 500}, headers=OPERATOR)).text
        for secret in (
            BAD_TOKEN,
            FORGED,
            SIGNING_SECRET,
            "change-me",
            *(t.token.get_secret_value() for t in API_TOKENS),
        ):
            assert secret not in trail


async def test_a_permissions_violation_of_a_services_connection_is_in_the_audit_trail(stack: Stack) -> None:
    """The service runtime, connected as the trigger-gateway's NATS user (what the gateway process runs, its
    consumers and HTTP app left out), publishes an event only human-interaction may send: the server refuses it,
    and the runtime's audit publishes ``bus.permission_refused``, which the journal lists."""
    gateway = SERVICES["trigger-gateway"]
    spec = dataclasses.replace(gateway, consumers=(), timers=(), buckets=(), streams=(), http_port=None)
    env = stack.env_for("trigger-gateway")
    nats_settings = NatsSettings(
        url=stack.nats_url, user=env["TEMPORALITY_NATS_USER"], password=SecretStr(env["TEMPORALITY_NATS_PASSWORD"])
    )
    runtimes: list[Runtime[ServiceSettings]] = []

    async def setup(rt: Runtime[ServiceSettings]) -> None:
        runtimes.append(rt)

    stop, ready = asyncio.Event(), asyncio.Event()
    service = asyncio.create_task(run_until(spec, ServiceSettings(nats=nats_settings), setup, stop, ready=ready))
    try:
        await asyncio.wait_for(ready.wait(), 60)
        forged = subject_for("human.answered")
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await runtimes[0].bus.js.publish(forged, b"{}", timeout=2)
        async with httpx.AsyncClient(timeout=15) as http:

            async def audited() -> dict[str, Any] | None:
                entries = await _audit(http, stack, "bus_permission_refusal")
                return next((e for e in entries if e["details"]["subject"] == forged), None)

            entry = await eventually(audited, timeout_s=60, what="the permissions violation in the journal's /audit")
    finally:
        stop.set()
        await asyncio.wait_for(service, 30)
    assert entry["type"] == "bus.permission_refused"
    assert entry["actor"] == "service:trigger-gateway"
    assert (entry["details"]["service"], entry["details"]["operation"]) == ("trigger-gateway", "publish")
    assert entry["summary"] == f"trigger-gateway: NATS refused its publish on {forged}"
    assert env["TEMPORALITY_NATS_PASSWORD"] not in json.dumps(entry)
