"""Role tokens and the served journal for the journal's tests (its own module name: every conftest.py is
called conftest)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Generic, TypeVar

import httpx
from playwright.async_api import BrowserContext, Page, expect
from pydantic import SecretStr

from temporality_bus import Bus, NatsSettings
from temporality_human_interaction import Settings as HumanSettings
from temporality_human_interaction.__main__ import SPEC as HUMAN_SPEC
from temporality_human_interaction.__main__ import configure as human_configure
from temporality_journal import RunSnapshot, Settings, project
from temporality_journal.__main__ import SPEC, configure
from temporality_protocol import (
    AgentSummary,
    Envelope,
    EventData,
    HumanAnswered,
    HumanNotified,
    HumanPolicy,
    HumanRequested,
    HumanWithdrawn,
    LaunchSource,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunRequested,
    RunResumed,
    RunStarted,
    TextAnswer,
    derive_id,
    make_event,
)
from temporality_protocol.catalog import ServiceSpec
from temporality_protocol.events import HumanAskKind, RunUsage
from temporality_service import (
    ApiAuth,
    ApiAuthSettings,
    ApiToken,
    FailureLimiter,
    HttpServiceSettings,
    Role,
    Runtime,
    Setup,
    run_until,
)
from temporality_service.auth import dump_tokens
from temporality_testing.oidc_emulator import OidcEmulator
from temporality_testing.waiting import eventually as eventually  # re-exported for the journal tests
from temporality_trigger_gateway import Settings as GatewaySettings
from temporality_trigger_gateway.__main__ import SPEC as GATEWAY_SPEC
from temporality_trigger_gateway.__main__ import configure as gateway_configure

VIEWER_TOKEN = "journal-test-viewer-token-0123456789"
OPERATOR_TOKEN = "journal-test-operator-token-0123456789"
ADMIN_TOKEN = "journal-test-admin-token-0123456789"
TOKENS = [
    ApiToken(name="board", role=Role.viewer, token=SecretStr(VIEWER_TOKEN)),
    ApiToken(name="oncall", role=Role.operator, token=SecretStr(OPERATOR_TOKEN)),
    ApiToken(name="root", role=Role.admin, token=SecretStr(ADMIN_TOKEN)),
]
VIEWER = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def api_auth() -> ApiAuth:
    """The journal's token set in the tests: ``board`` (viewer), ``oncall`` (operator), ``root`` (admin). Its limit
    of wrong tokens per address is out of the way (these tests send many from the one ASGI client; the limit's own
    tests are libs/service's test_api_auth_limits.py)."""
    return ApiAuth(TOKENS, failures=FailureLimiter(1_000_000))


def write_tokens(path: Path) -> Path:
    """Write :data:`TOKENS` as a ``TEMPORALITY_API_TOKENS_FILE``."""
    path.write_text(dump_tokens(TOKENS), encoding="utf-8")
    return path


@dataclass
class ServedJournal:
    """The real journal service (``configure`` + ``setup``, run by the runtime in-process) on a real port."""

    url: str
    bus: Bus
    runtime: Runtime[Settings]
    #: Set it to stop the service (SIGTERM's path); ``task`` then ends.
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def wait_recorded(self, event_id: str, within_s: float = 60.0) -> None:
        """Wait until the journal's database holds ``event_id`` (its own consumer recorded it)."""
        async with httpx.AsyncClient(base_url=self.url, headers=OPERATOR, timeout=20) as client:

            async def _has() -> bool:
                try:
                    events = (await client.get("/events", params={"limit": 1000})).json()["events"]
                except httpx.TimeoutException:  # a loaded machine's slow answer: not yet, ask again within the bound
                    return False
                return any(e["id"] == event_id for e in events)

            async with asyncio.timeout(within_s):  # another task's commits: poll the API, bounded
                for _ in range(int(within_s / 0.05) + 1):
                    if await _has():
                        return
                    await asyncio.sleep(0.05)
            raise AssertionError(f"event {event_id} not recorded within {within_s}s")

    async def ask(self, request: HumanRequested, *, trigger_id: str = "t", time: datetime | None = None) -> None:
        """Publish ``request`` as human-interaction receives a question: its run's ``run.requested`` first (whom
        the run may ask comes from there, SEC-1), then the ``human.requested`` (at ``time``); wait until the
        journal has recorded it."""
        run_id = request.run_id
        launch = LaunchSource(kind="webhook", trigger_id=trigger_id, delivery_id=f"dlv-{run_id}")
        requested = RunRequested(
            run_id=run_id, agent=request.agent, title=request.title, launch=launch, human=request.policy
        )
        await self.bus.publish(
            make_event(requested, source="/t", id=derive_id("evt", run_id, "requested"), run_id=run_id)
        )
        event = make_event(
            request, source="/temporality/test", id=derive_id("evt", request.request_id), run_id=run_id, time=time
        )
        await self.bus.publish(event)
        await self.wait_recorded(event.id)


def served_settings(
    tmp_path: Path,
    nats_settings: NatsSettings,
    database_url: str | None = None,
    gateway_url: str | None = None,
    human_url: str | None = None,
) -> Settings:
    """The journal's settings for :func:`serve_journal`: a free port, the test tokens, SQLite unless given,
    the trigger-gateway at ``gateway_url`` and human-interaction at ``human_url`` (unset: none)."""
    return Settings(
        nats=nats_settings,
        port=0,
        database_url=database_url or f"sqlite+aiosqlite:///{tmp_path / 'served' / 'journal.db'}",
        api=ApiAuthSettings(tokens_file=write_tokens(tmp_path / "tokens.json")),
        gateway_url=gateway_url,
        human_url=human_url,
    )


# --------------------------------------------------------------------------- the trigger-gateway, served
#: The gateway's triggers file in these tests: one webhook trigger of the generic source, no auth.
GATEWAY_TRIGGERS = """triggers:
  - id: seeded-hook
    name: Seeded by the file
    type: webhook
    adapter: generic
    events: [order.created]
    agent: reviewer
    auth: {type: none}
"""


@asynccontextmanager
async def serve_gateway(
    tmp_path: Path, nats_settings: NatsSettings, vouch_secret_file: Path | None = None
) -> AsyncIterator[str]:
    """The real trigger-gateway (its own ``configure``/``setup``) in-process on 127.0.0.1 and a free port,
    admitting the journal's test tokens (:data:`TOKENS`) and, with ``vouch_secret_file``, the principals the
    journal vouches for; agents ``reviewer`` and ``triager``; yields its URL."""
    directory = tmp_path / "gateway"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "triggers.yaml").write_text(GATEWAY_TRIGGERS, encoding="utf-8")
    (directory / "agents.yaml").write_text("agents:\n  - {id: reviewer}\n  - {id: triager}\n", encoding="utf-8")
    settings = GatewaySettings(
        nats=nats_settings,
        host="127.0.0.1",
        port=0,
        triggers_file=directory / "triggers.yaml",
        api=ApiAuthSettings(tokens_file=write_tokens(directory / "tokens.json"), vouch_secret_file=vouch_secret_file),
    )
    async with serve_service(GATEWAY_SPEC, settings, gateway_configure(settings)) as running:
        server = running.runtime.server
        assert server is not None
        yield server.url


#: The directory human-interaction reads in these tests: alice and bob answer on the web.
HUMAN_USERS = """users:
  alice:
    display_name: Alice Example
    inbox_token: alice-inbox-token
    preferred: web
    channels: {web: {}}
  bob:
    display_name: Bob Example
    inbox_token: bob-inbox-token
    preferred: web
    channels: {web: {}}
"""
ALICE_INBOX = {"Authorization": "Bearer alice-inbox-token"}
BOB_INBOX = {"Authorization": "Bearer bob-inbox-token"}


@asynccontextmanager
async def serve_human(
    tmp_path: Path, nats_settings: NatsSettings, vouch_secret_file: Path | None = None, users: str = HUMAN_USERS
) -> AsyncIterator[str]:
    """The real human-interaction service (its own ``configure``/``setup``) in-process on 127.0.0.1 and a free
    port, with ``users`` (the users file: :data:`HUMAN_USERS`, web inbox only) and the journal's vouch secret
    when given; yields its URL."""
    directory = tmp_path / "human"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "users.yaml").write_text(users, encoding="utf-8")
    settings = HumanSettings(
        nats=nats_settings,
        host="127.0.0.1",
        port=0,
        users_file=directory / "users.yaml",
        api=ApiAuthSettings(tokens_file=write_tokens(directory / "tokens.json")),
        inbox_vouch_secret_file=vouch_secret_file,
    )
    async with serve_service(HUMAN_SPEC, settings, human_configure(settings)) as running:
        server = running.runtime.server
        assert server is not None
        yield server.url


S = TypeVar("S", bound=HttpServiceSettings)


@dataclass
class Running(Generic[S]):
    """A service run in-process by :func:`serve_service`: set ``stop`` to stop it (SIGTERM's path); ``task``
    then ends."""

    runtime: Runtime[S]
    stop: asyncio.Event
    task: asyncio.Task[None]


@asynccontextmanager
async def serve_service(spec: ServiceSpec, settings: S, setup: Setup[S]) -> AsyncIterator[Running[S]]:
    """Run one service (its ``setup``, as its ``configure`` made it) in-process by the service runtime until
    the block ends; yields it once it is ready (raises why it stopped, if it did)."""
    runtimes: list[Runtime[S]] = []

    async def _setup(rt: Runtime[S]) -> None:
        await setup(rt)
        runtimes.append(rt)

    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run_until(spec, settings, _setup, stop, ready=ready))
    try:
        waiter = asyncio.ensure_future(ready.wait())
        done, _ = await asyncio.wait({waiter, task}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            waiter.cancel()
            task.result()  # raises why it stopped
        assert ready.is_set(), f"{spec.name} was not ready within 60 s"
        yield Running(runtimes[0], stop, task)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


@asynccontextmanager
async def serve_journal(settings: Settings, bus: Bus) -> AsyncIterator[ServedJournal]:
    """Run the journal service (its own ``configure``/``setup``) in-process until the block ends."""
    async with serve_service(SPEC, settings, configure(settings)) as running:
        server = running.runtime.server
        assert server is not None
        yield ServedJournal(url=server.url, bus=bus, runtime=running.runtime, stop=running.stop, task=running.task)


# --------------------------------------------------------------------------- events of one run
@dataclass
class RunStory:
    """Builds the events of one run with deterministic ids; ``at`` moves the event clock."""

    run_id: str
    agent: str = "reviewer"
    title: str = "Review PR 42"
    trigger_id: str = "ado-pr"
    request_id: str = ""
    at: datetime = field(default_factory=lambda: datetime.now(UTC) - timedelta(minutes=30))

    def __post_init__(self) -> None:
        self.request_id = self.request_id or f"hreq-{self.run_id}"

    def _event(self, data: EventData, name: str, *, time: datetime | None = None) -> Envelope:
        self.at += timedelta(seconds=1)
        return make_event(
            data,
            source="/temporality/test",
            id=derive_id("evt", self.run_id, name),
            run_id=self.run_id,
            actor="service:test",
            time=time or self.at,
        )

    def requested(self) -> Envelope:
        launch = LaunchSource(kind="webhook", trigger_id=self.trigger_id, delivery_id="dlv-1")
        return self._event(
            RunRequested(run_id=self.run_id, agent=self.agent, title=self.title, launch=launch), "requested"
        )

    def created(self) -> Envelope:
        launch = LaunchSource(kind="webhook", trigger_id=self.trigger_id, delivery_id="dlv-1")
        return self._event(RunCreated(run_id=self.run_id, agent=self.agent, title=self.title, launch=launch), "created")

    def started(self, name: str = "started", card: AgentSummary | None = None) -> Envelope:
        data = RunStarted(run_id=self.run_id, agent=self.agent, role="reviewer", title=self.title, agent_card=card)
        return self._event(data, name)

    def human_requested(
        self,
        *,
        recipient: str = "user:alice",
        question: str = "Merge it?",
        time: datetime | None = None,
        turn: int = 1,
        reason: str | None = None,
        reason_kind: HumanAskKind | None = None,
    ) -> Envelope:
        expires = (time or self.at) + timedelta(hours=1)
        return self._event(
            HumanRequested(
                request_id=self.request_id,
                run_id=self.run_id,
                agent=self.agent,
                title=self.title,
                recipient=recipient,
                question=question,
                timeout_s=3600,
                expires_at=expires,
                policy=HumanPolicy(allowed_recipients=[recipient]),
                turn=turn,
                reason=reason,
                reason_kind=reason_kind,
            ),
            f"human.requested.{self.request_id}",
            time=time,
        )

    def notified(self, channel: str = "matrix", *, request_id: str | None = None) -> Envelope:
        rid = request_id or self.request_id
        return self._event(
            HumanNotified(request_id=rid, run_id=self.run_id, recipient="user:alice", channel=channel),
            f"notified.{rid}.{channel}",
        )

    def answered(
        self,
        responder: str = "user:alice",
        channel: str = "matrix",
        waited_s: float = 60,
        *,
        display_name: str | None = None,
    ) -> Envelope:
        return self._event(
            HumanAnswered(
                request_id=self.request_id,
                run_id=self.run_id,
                recipient=responder,
                responder=responder,
                responder_display_name=display_name,
                answer=TextAnswer(value="yes"),
                channel=channel,
                waited_s=waited_s,
            ),
            f"answered.{self.request_id}",
        )

    def resumed(self) -> Envelope:
        return self._event(
            RunResumed(run_id=self.run_id, reason="answer", from_turn=1, request_id=self.request_id, waited_s=60),
            f"resumed.{self.request_id}",
        )

    def completed(self, result: str = "merged", *, usage: RunUsage | None = None) -> Envelope:
        return self._event(RunCompleted(run_id=self.run_id, result=result, turns=2, usage=usage), "completed")

    def failed(self, *, usage: RunUsage | None = None) -> Envelope:
        return self._event(RunFailed(run_id=self.run_id, reason="tool_error", error="boom", usage=usage), "failed")

    def cancelled(self, *, usage: RunUsage | None = None) -> Envelope:
        return self._event(RunCancelled(run_id=self.run_id, reason="by user:bob", usage=usage), "cancelled")

    def withdrawn(
        self, reason: str = "run_cancelled", *, channel: str | None = "web", waited_s: float = 120
    ) -> Envelope:
        """``human.withdrawn`` as human-interaction publishes it for the story's question (its id derived from the
        request id, as human-interaction's is)."""
        at = self.at + timedelta(seconds=1)  # the event's time (``_event`` moves the clock by one second)
        data = HumanWithdrawn.model_validate(
            {
                "request_id": self.request_id,
                "run_id": self.run_id,
                "recipient": "user:alice",
                "channel": channel,
                "reason": reason,
                "run_reason": "by user:bob" if reason == "run_cancelled" else None,
                "asked_at": at - timedelta(seconds=waited_s),
                "withdrawn_at": at,
                "waited_s": waited_s,
            }
        )
        event = self._event(data, f"withdrawn.{self.request_id}")
        return event.model_copy(update={"id": derive_id("evt", self.request_id, "withdrawn")})


def rerun_events(original: RunStory, rerun_id: str, *, by: str = "oncall", n: int = 1) -> tuple[Envelope, Envelope]:
    """What a rerun of ``original``'s delivery publishes: the gateway's ``run.requested`` and the executor's
    ``run.created``, both with ``launch.rerun_of`` and ``launch.requested_by``."""
    launch = LaunchSource(
        kind="webhook",
        trigger_id=original.trigger_id,
        delivery_id=f"dlv-1-rerun-{n}",
        rerun_of=original.run_id,
        requested_by=by,
    )
    requested = make_event(
        RunRequested(run_id=rerun_id, agent=original.agent, title=original.title, launch=launch),
        source="/temporality/trigger-gateway",
        id=derive_id("evt", rerun_id, "requested"),
        run_id=rerun_id,
        actor="service:trigger-gateway",
    )
    created = make_event(
        RunCreated(run_id=rerun_id, agent=original.agent, title=original.title, launch=launch),
        source="/temporality/run-executor",
        id=derive_id("evt", rerun_id, "created"),
        run_id=rerun_id,
        actor="service:run-executor",
    )
    return requested, created


# --------------------------------------------------------------------------- an OIDC sign-in, by HTTP
async def start_login(client: httpx.AsyncClient, idp: OidcEmulator) -> str:
    """``/auth/login`` -> the provider's login page; returns the page's pending authorization id."""
    login = await client.get("/auth/login")
    assert login.status_code == 302, login.text
    assert login.headers["location"].startswith(f"{idp.issuer}/authorize?")
    page = await client.get(login.headers["location"])
    assert page.status_code == 200, page.text
    found = re.search(r'name="pending" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


async def approve(client: httpx.AsyncClient, idp: OidcEmulator, pending: str, login: str) -> str:
    """The person presses "Sign in as <login>" at the provider; returns the callback URL it redirects to."""
    answer = await client.post(f"{idp.issuer}/authorize", data={"pending": pending, "login": login})
    assert answer.status_code == 302, answer.text
    return answer.headers["location"]


async def oidc_sign_in(client: httpx.AsyncClient, idp: OidcEmulator, login: str) -> httpx.Response:
    """``login`` signs in with the provider, from ``/auth/login`` to the journal's callback (its answer)."""
    callback = await approve(client, idp, await start_login(client, idp), login)
    return await client.get(callback)


#: Where the browser tests save the docs' screenshots (``docs/img``) when set; unset: none are taken.
SCREENSHOTS = os.environ.get("TEMPORALITY_CONSOLE_SCREENSHOTS")


async def console_screenshot(page: Page, name: str) -> None:
    """Save the page as ``console-<name>.png`` under :data:`SCREENSHOTS`, when set."""
    if SCREENSHOTS:
        await page.screenshot(path=Path(SCREENSHOTS) / f"console-{name}.png", full_page=True)


async def publish_recorded(served: ServedJournal, *events: Envelope) -> None:
    """Publish ``events`` and wait until the journal has recorded the last of them."""
    for event in events:
        await served.bus.publish(event)
    await served.wait_recorded(events[-1].id)


async def viewer_page(context: BrowserContext, served: ServedJournal, hash_: str, wait_ms: int = 20_000) -> Page:
    """A console page at ``hash_`` signed in with the viewer token (``board (viewer)`` shown once it is)."""
    page = await context.new_page()
    await page.goto(f"{served.url}/console/{hash_}")
    await page.get_by_label("API token").fill(VIEWER_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#who")).to_have_text("board (viewer)", timeout=wait_ms)
    return page


def replay_states(events: list[Envelope], start: RunSnapshot | None = None, first_seq: int = 1) -> list[RunSnapshot]:
    """The run as the journal projects it after each of ``events`` (numbered from ``first_seq``), starting from
    ``start``: what a test of the projection alone reads, without a database."""
    run = start
    states: list[RunSnapshot] = []
    for seq, event in enumerate(events, start=first_seq):
        run = project(run, event, seq) or run
        assert run is not None, f"{event.type} made no run"
        states.append(run)
    return states


def replay(events: list[Envelope], start: RunSnapshot | None = None, first_seq: int = 1) -> RunSnapshot:
    """The run after ``events`` (:func:`replay_states`'s last)."""
    states = replay_states(events, start, first_seq)
    assert states or start is not None, "no events and no run to start from"
    return states[-1] if states else start  # type: ignore[return-value]
