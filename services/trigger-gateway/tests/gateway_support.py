"""Helpers for the trigger-gateway tests (a uniquely named module: services' tests share one sys.path)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest.mock import patch

import httpx
import yaml
from standardwebhooks.webhooks import Webhook

from temporality_bus import Bus, BusError, Pipeline, PublishResult
from temporality_bus.pipeline import Write
from temporality_protocol import Envelope, RunRequested, decode
from temporality_protocol.catalog import EVENTS_PREFIX, EVENTS_STREAM
from temporality_service import Runtime, run_until
from temporality_testing.waiting import eventually as eventually  # re-exported for the gateway tests
from temporality_trigger_gateway import Settings, TriggerConfig, parse_triggers
from temporality_trigger_gateway.__main__ import SPEC, configure
from temporality_trigger_gateway.adapters import WebhookRequest

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[3]
PASSWORD = "s3cret-for-tests"
GITHUB_SECRET = "gh-hook-secret-for-tests"
GITLAB_TOKEN = "gl-token-for-tests"
BEARER_TOKEN = "bearer-token-for-tests"
#: A Standard Webhooks key (``whsec_`` + base64 of 24 bytes), the project's own.
SW_SECRET = "whsec_" + base64.b64encode(b"temporality-test-key-0001").decode()
#: Every secret the test triggers read from the environment.
ENVIRON = {
    "TEST_GATEWAY_PASSWORD": PASSWORD,
    "TEST_GITHUB_SECRET": GITHUB_SECRET,
    "TEST_GITLAB_TOKEN": GITLAB_TOKEN,
    "TEST_BEARER_TOKEN": BEARER_TOKEN,
    "TEST_SW_SECRET": SW_SECRET,
}
MAX_BODY = 16 * 1024

TRIGGERS_YAML = """
triggers:
  - id: ado-pr-review
    name: Review Azure DevOps pull requests
    type: webhook
    enabled: true
    adapter: azure_devops.pull_request
    events: [git.pullrequest.created]
    agent: reviewer
    tenant: fabrikam
    auth: {type: basic, username: azure, password_env: TEST_GATEWAY_PASSWORD}
    deduplication: {ttl_days: 7}
    human:
      allowed_recipients: [user:alice]
      default_timeout_s: 3600
      on_timeout: {action: default, default_option: keep-v1}
  - id: ado-pr-all
    name: Every pull request event, no tenant override
    type: webhook
    adapter: azure_devops.pull_request
    events: [git.pullrequest.created, git.pullrequest.updated, git.pullrequest.merged]
    agent: reviewer
    auth: {type: basic, username: azure, password_env: TEST_GATEWAY_PASSWORD}
  - id: ado-pr-disabled
    name: Switched off
    type: webhook
    enabled: false
    adapter: azure_devops.pull_request
    events: [git.pullrequest.created]
    agent: reviewer
    auth: {type: basic, username: azure, password_env: TEST_GATEWAY_PASSWORD}
  - id: ado-work-items
    name: Triage Azure DevOps work items
    type: webhook
    adapter: azure_devops.work_item
    events: [workitem.created, workitem.updated, workitem.commented, workitem.deleted, workitem.restored]
    agent: triager
    auth: {type: basic, username: azure, password_env: TEST_GATEWAY_PASSWORD}
  - id: gh-review
    name: Review GitHub pull requests
    type: webhook
    adapter: github
    events: [pull_request.opened, pull_request.synchronize, pull_request.closed, issues.opened, push]
    agent: reviewer
    auth: {type: github, secret_env: TEST_GITHUB_SECRET}
  - id: gl-review
    name: Review GitLab merge requests
    type: webhook
    adapter: gitlab
    events: [merge_request.open, merge_request.update, push]
    agent: reviewer
    auth: {type: gitlab, secret_env: TEST_GITLAB_TOKEN}
  - id: orders-signed
    name: Orders from a Standard Webhooks sender
    type: webhook
    adapter: generic
    events: [order.created]
    agent: reviewer
    tenant: shop
    auth: {type: standard_webhooks, secret_env: TEST_SW_SECRET}
  - id: orders-bearer
    name: Orders with a bearer token
    type: webhook
    adapter: generic
    events: [order.created]
    agent: reviewer
    auth: {type: bearer, token_env: TEST_BEARER_TOKEN}
  - id: nightly-digest
    name: Nightly digest
    type: schedule
    cron: "0 3 * * *"
    agent: reviewer
"""


def load_triggers_yaml(text: str, **environ: str) -> list[TriggerConfig]:
    return parse_triggers(yaml.safe_load(text), source="test.yaml", environ=environ)


def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def fixture_json(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(fixture_bytes(name).decode("utf-8-sig"))
    return data


def webhook_request(body: Any, headers: dict[str, str] | None = None, raw: bytes | None = None) -> WebhookRequest:
    """What a source adapter receives, built directly (the adapter tests need no HTTP)."""
    content = raw if raw is not None else json.dumps(body).encode()
    return WebhookRequest("POST", httpx.Headers(headers or {}), content, body)


def github_headers(raw: bytes, event: str, delivery: str, secret: str = GITHUB_SECRET) -> dict[str, str]:
    signature = hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
    return {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery, "X-Hub-Signature-256": f"sha256={signature}"}


def standard_headers(raw: bytes, msg_id: str, secret: str = SW_SECRET, at: int | None = None) -> dict[str, str]:
    stamp = int(time.time()) if at is None else at
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(stamp, tz=UTC), raw.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(stamp), "webhook-signature": signature}


def basic(username: str = "azure", password: str = PASSWORD) -> dict[str, str]:
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


async def post(
    client: httpx.AsyncClient,
    body: bytes | dict[str, Any],
    trigger_id: str = "ado-pr-review",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Content-Type": "application/json; charset=utf-8", **(basic() if headers is None else headers)}
    return await client.post(f"/hooks/{trigger_id}", content=content, headers=sent)


async def journal(bus: Bus) -> list[Envelope]:
    """Every event in the journal stream, in order, read back through a pull subscription."""
    expected = (await bus.js.stream_info(EVENTS_STREAM.name)).state.messages
    if expected == 0:
        return []
    sub = await bus.js.pull_subscribe(f"{EVENTS_PREFIX}.>", stream=EVENTS_STREAM.name)
    events: list[Envelope] = []
    try:
        while len(events) < expected:
            for msg in await sub.fetch(batch=expected - len(events), timeout=5):
                await msg.ack()
                events.append(decode(msg.data))
    finally:
        await sub.unsubscribe()  # before the bus drains (TEST-PEERS.md: the drain gotcha)
    return events


def types(events: list[Envelope]) -> list[str]:
    return [e.type for e in events]


async def run_requested(bus: Bus) -> RunRequested:
    """The data of the one ``run.requested`` in the journal."""
    (event,) = [e for e in await journal(bus) if e.type == "run.requested"]
    return event.payload(RunRequested)


@contextlib.contextmanager
def events_not_acked(event_type: str, error: BusError | BaseException) -> Iterator[None]:
    """Every pipelined batch holding a ``event_type`` event: its events are not sent and each is answered
    ``error`` (a :class:`BusError`: not acknowledged), while its other writes -- the delivery's record, which the
    launch sends with its events -- go out for real; any other ``error`` is raised before anything is sent (the
    process dying there)."""
    real_send = Pipeline.send

    async def send(self: Pipeline, writes: Sequence[Write], **kw: Any) -> list[PublishResult | BusError]:
        if not any(w.headers.get("Ce-Type") == event_type for w in writes):
            return await real_send(self, writes, **kw)
        if not isinstance(error, BusError):
            raise error
        kv = [w for w in writes if w.bucket is not None]
        stored = iter(await real_send(self, kv, **kw) if kv else [])
        return [error if w.bucket is None else next(stored) for w in writes]

    with patch.object(Pipeline, "send", send):
        yield


# --------------------------------------------------------------------------- the trigger store and admin API
ADMIN_TOKEN = "admin-token-for-gateway-tests-0001"
OPERATOR_TOKEN = "operator-token-for-gateway-tests-01"
VIEWER_TOKEN = "viewer-token-for-gateway-tests-0001"
#: The agent ids the admin tests know (as if read from an agent cards file).
AGENTS = frozenset({"reviewer", "triager"})


def tokens_file(directory: Path) -> Path:
    path = directory / "api-tokens.yaml"
    path.write_text(
        f"- {{name: ci-bot, role: admin, token: {ADMIN_TOKEN}}}\n"
        f"- {{name: on-call, role: operator, token: {OPERATOR_TOKEN}}}\n"
        f"- {{name: board, role: viewer, token: {VIEWER_TOKEN}}}\n",
        encoding="utf-8",
    )
    return path


def agents_file(directory: Path) -> Path:
    path = directory / "agents.yaml"
    path.write_text(
        "agents:\n  - {id: reviewer, role: Reviewer, extra_key_of_the_executor: 1}\n  - {id: triager}\n",
        encoding="utf-8",
    )
    return path


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


AS_ADMIN = bearer(ADMIN_TOKEN)
AS_OPERATOR = bearer(OPERATOR_TOKEN)
AS_VIEWER = bearer(VIEWER_TOKEN)


def webhook_spec(trigger_id: str = "api-pr", **changes: Any) -> dict[str, Any]:
    """A valid ``webhook`` trigger as the admin API takes it (JSON), every TRG-1 field given."""
    spec: dict[str, Any] = {
        "id": trigger_id,
        "name": "PR review managed through the API",
        "type": "webhook",
        "enabled": True,
        "adapter": "azure_devops.pull_request",
        "events": ["git.pullrequest.created"],
        "agent": "reviewer",
        "tenant": "fabrikam",
        "auth": {"type": "basic", "username": "azure", "password": PASSWORD},
        "deduplication": {"ttl_days": 3},
        "retry": {"retry_after_s": 30},
        "input": {
            "repository": "payload.repository.name",
            "pull_request": "payload.pull_request.id",
            "source_branch": "payload.source_branch",
            "target_branch": "payload.target_branch",
            "author": "actor.display_name || actor.id",
            "team": "context.team",
        },
        "context": {"team": "web"},
        "human": {
            "allowed_recipients": ["user:alice"],
            "default_timeout_s": 600,
            "on_timeout": {"action": "default", "default_option": "keep-v1"},
        },
    }
    spec.update(changes)
    return spec


async def until_served(client: httpx.AsyncClient, trigger_id: str, timeout_s: float = 10) -> None:
    """Wait until the replica behind ``client`` serves ``trigger_id`` as stored (``GET /triggers/<id>``:
    ``served``), a read with no side effect. Each replica applies a store change through its own watch: another
    replica's 201 only says that one serves it, so a webhook posted here straight away could still be 404."""

    async def served() -> bool:
        found = await client.get(f"/triggers/{trigger_id}", headers=AS_VIEWER)
        return found.status_code == 200 and found.json()["served"] is True

    await eventually(served, timeout_s=timeout_s, what=f"{client.base_url} serving trigger {trigger_id!r}")


async def journal_of(bus: Bus, event_type: str) -> list[Envelope]:
    return [e for e in await journal(bus) if e.type == event_type]


# --------------------------------------------------------------------------- in-process replicas
@contextlib.asynccontextmanager
async def replicas(settings: Settings, count: int = 2) -> AsyncIterator[list[httpx.AsyncClient]]:
    """``count`` gateway replicas in-process, all started at once; yields an HTTP client on each one's socket."""
    runtimes: dict[int, Runtime[Settings]] = {}
    stop = asyncio.Event()
    readies = [asyncio.Event() for _ in range(count)]

    def setup_of(index: int) -> Callable[[Runtime[Settings]], Awaitable[None]]:
        setup = configure(settings)

        async def wrapped(rt: Runtime[Settings]) -> None:
            await setup(rt)
            runtimes[index] = rt

        return wrapped

    setups = [setup_of(i) for i in range(count)]  # every configure before any connects, like processes
    tasks = [asyncio.create_task(run_until(SPEC, settings, setups[i], stop, ready=readies[i])) for i in range(count)]
    try:
        waiters = [asyncio.create_task(r.wait()) for r in readies]
        deadline = asyncio.get_running_loop().time() + 60
        while not all(r.is_set() for r in readies):
            failed = [t for t in tasks if t.done()]
            if failed:
                failed[0].result()  # raises why it failed
                raise AssertionError("a replica stopped before it was ready")
            assert asyncio.get_running_loop().time() < deadline, "replicas did not become ready"
            await asyncio.wait({*tasks, *waiters}, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        async with contextlib.AsyncExitStack() as clients:
            yielded = []
            for i in range(count):
                server = runtimes[i].server
                assert server is not None
                yielded.append(await clients.enter_async_context(httpx.AsyncClient(base_url=server.url, timeout=20)))
            yield yielded
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=30)
