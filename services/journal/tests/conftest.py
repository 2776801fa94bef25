"""Journal test fixtures: a database per test (SQLite file and PostgreSQL), a journal wired to a real bus
(its consumer in batch mode, as the service runs it), the journal service served on a real port
(``served_journal``), and a real headless Chromium (``browser_context``).

Environment variables of the PostgreSQL variants (``database_url[postgres]``):

``TEMPORALITY_TEST_POSTGRES_URL``
    The server to create the per-test databases on (default ``postgresql://postgres@127.0.0.1:5432/postgres``).
``TEMPORALITY_REQUIRE_POSTGRES``
    Unset (a developer's machine): when that server is unreachable, the PostgreSQL variants are
    *skipped*. ``1`` (CI sets it): they *fail* instead, with the reason, so a broken database
    service in CI cannot pass the suite unnoticed on SQLite alone.
``TEMPORALITY_REQUIRE_CHROMIUM``
    Unset: the browser tests (``browser_context``) are skipped, with the reason, when Debian's chromium
    is not installed. ``1``: they fail instead.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from journal_support import (
    OPERATOR,
    VIEWER,
    RunStory,
    ServedJournal,
    api_auth,
    serve_gateway,
    serve_human,
    serve_journal,
    served_settings,
)
from playwright.async_api import BrowserContext, async_playwright

from temporality_bus import Bus, Consumer, Delivery, NatsSettings
from temporality_journal import Database, Recorder, Settings, create_app
from temporality_protocol import (
    Envelope,
)
from temporality_protocol.catalog import CONSUMERS
from temporality_testing.postgres import fresh_postgres_database


@pytest.fixture
def story() -> Callable[..., RunStory]:
    def _make(run_id: str | None = None, **kwargs: object) -> RunStory:
        return RunStory(run_id=run_id or f"run-{uuid.uuid4().hex[:12]}", **kwargs)  # type: ignore[arg-type]

    return _make


# --------------------------------------------------------------------------- databases
@pytest.fixture(params=["sqlite", "postgres"])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh, empty database: a SQLite file, or a new PostgreSQL database dropped afterwards.

    PostgreSQL unreachable: skipped, or failed under ``TEMPORALITY_REQUIRE_POSTGRES=1`` (see the module docstring).
    """
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'journal' / 'journal.db'}"
        return
    async with fresh_postgres_database("journal") as url:
        yield url


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    async with Database.open(database_url) as db:
        yield db


# --------------------------------------------------------------------------- the journal on a real bus
async def _not_wired() -> None:
    raise RuntimeError("the journal has no consumer")


class Journal:
    """The journal's consumer on the real bus plus an HTTP client of its API (in-process ASGI).

    ``client`` sends the viewer token (``journal_support.VIEWER``); pass ``headers=`` for another role.
    """

    def __init__(self, bus: Bus, database: Database, client: httpx.AsyncClient) -> None:
        self.bus = bus
        self.database = database
        self.client = client
        self.recorder = Recorder(database)
        self.handled: Counter[str] = Counter()
        self.fail_after_commit: set[str] = set()
        #: The ids of every batch handed to :meth:`handle_batch`, committed or not.
        self.batches: list[list[str]] = []
        self._changed = asyncio.Condition()
        #: Starts the consumer (the ``idle_journal`` fixture leaves that to the test).
        self.start: Callable[[], Awaitable[None]] = _not_wired

    async def handle(self, event: Envelope, delivery: Delivery) -> None:
        try:
            await self.recorder.handle(event, delivery)
            if event.id in self.fail_after_commit:  # a crash after the commit, before the ack
                self.fail_after_commit.discard(event.id)
                raise RuntimeError("simulated crash after commit")
        finally:
            async with self._changed:
                self.handled[event.id] += 1
                self._changed.notify_all()

    async def handle_batch(self, batch: list[tuple[Envelope, Delivery]]) -> None:
        """The batch handler: counts each event once the batch committed (a failed batch counts nothing:
        the runner then hands its events to :meth:`handle` one by one)."""
        self.batches.append([event.id for event, _ in batch])
        await self.recorder.handle_batch(batch)
        if any(event.id in self.fail_after_commit for event, _ in batch):
            raise RuntimeError("simulated crash after the batch's commit")
        async with self._changed:
            for event, _ in batch:
                self.handled[event.id] += 1
            self._changed.notify_all()

    async def wait_handled(self, event_id: str, times: int = 1, within_s: float = 30.0) -> None:
        async with asyncio.timeout(within_s), self._changed:
            await self._changed.wait_for(lambda: self.handled[event_id] >= times)

    async def wait_type(self, event_type: str, within_s: float = 30.0) -> str:
        """Wait until an event of ``event_type`` was handled; return its id."""

        async def _seen() -> str | None:
            # as the operator: a viewer's /events leaves the audit trail's events out
            response = await self.client.get("/events", params={"type": event_type, "limit": 1}, headers=OPERATOR)
            events = response.json()["events"]
            return str(events[0]["id"]) if events else None

        async with asyncio.timeout(within_s):
            while True:
                async with self._changed:
                    found = await _seen()
                    if found is not None:
                        return found
                    await self._changed.wait()

    async def send(self, *events: Envelope) -> None:
        """Publish each event and wait until the journal has handled it."""
        for event in events:
            await self.bus.publish(event)
            await self.wait_handled(event.id)

    async def run(self, run_id: str) -> dict[str, object]:
        response = await self.client.get(f"/runs/{run_id}")
        assert response.status_code == 200, response.text
        body: dict[str, object] = response.json()
        return body


@asynccontextmanager
async def _journal(bus: Bus, database: Database, *, started: bool) -> AsyncIterator[Journal]:
    app = create_app(Settings(), database, bus, api_auth())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://journal", headers=VIEWER
    ) as client:
        jr = Journal(bus, database, client)
        consumer = Consumer(
            bus,
            CONSUMERS["journal"],
            handler=jr.handle,
            batch_handler=jr.handle_batch,
            batch_size=64,
            fetch_timeout_s=0.2,
        )
        stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []

        async def start() -> None:
            tasks.append(asyncio.create_task(consumer.run(stop)))
            await asyncio.wait_for(consumer.running.wait(), 10)

        jr.start = start
        if started:
            await start()
        try:
            yield jr
        finally:
            stop.set()
            if tasks:
                await asyncio.wait_for(tasks[0], 10)


@pytest.fixture
async def journal(bus: Bus, database: Database) -> AsyncIterator[Journal]:
    async with _journal(bus, database, started=True) as jr:
        yield jr


@pytest.fixture
async def idle_journal(bus: Bus, database: Database) -> AsyncIterator[Journal]:
    """The journal with its consumer not started yet: ``await idle_journal.start()`` (publish first, to
    have the events fetched together in one batch)."""
    async with _journal(bus, database, started=False) as jr:
        yield jr


# --------------------------------------------------------------------------- the journal service, served
@pytest.fixture
async def served_journal(tmp_path: Path, nats_settings: NatsSettings, bus: Bus) -> AsyncIterator[ServedJournal]:
    """The journal as the service runs it (recorder, live tail, API, console) on 127.0.0.1 and a free port,
    SQLite, the test tokens (``journal_support``)."""
    async with serve_journal(served_settings(tmp_path, nats_settings), bus) as served:
        yield served


@pytest.fixture
async def served_journal_with_gateway(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> AsyncIterator[ServedJournal]:
    """:func:`served_journal` with the real trigger-gateway beside it (``journal_support.serve_gateway``,
    the same tokens) as its ``TEMPORALITY_JOURNAL_GATEWAY_URL``: the console's trigger wizard works."""
    async with serve_gateway(tmp_path, nats_settings) as gateway_url:
        settings = served_settings(tmp_path, nats_settings, gateway_url=gateway_url)
        async with serve_journal(settings, bus) as served:
            yield served


@pytest.fixture
async def served_journal_with_human(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> AsyncIterator[ServedJournal]:
    """:func:`served_journal` with the real human-interaction service beside it (``journal_support.serve_human``:
    alice and bob on the web inbox) as its ``TEMPORALITY_JOURNAL_HUMAN_URL``: the console's inbox works."""
    async with serve_human(tmp_path, nats_settings) as human_url:
        settings = served_settings(tmp_path, nats_settings, human_url=human_url)
        async with serve_journal(settings, bus) as served:
            yield served


# --------------------------------------------------------------------------- a real headless Chromium
#: Debian's chromium (``apt-get install chromium``); the binary itself first (skips the shell wrapper).
CHROMIUM_CANDIDATES = (Path("/usr/lib/chromium/chromium"), Path("/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
async def browser_context() -> AsyncIterator[BrowserContext]:
    """A fresh context of a real headless Chromium (Playwright driving Debian's ``chromium``; never
    ``playwright install``). Skipped, saying why, when chromium is not installed -- failed instead under
    ``TEMPORALITY_REQUIRE_CHROMIUM=1``. Uncaught page errors fail the test."""
    executable = next((p for p in CHROMIUM_CANDIDATES if p.exists()), None)
    if executable is None:
        reason = f"Debian chromium not found at {' or '.join(map(str, CHROMIUM_CANDIDATES))} (apt-get install chromium)"
        if os.environ.get("TEMPORALITY_REQUIRE_CHROMIUM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(executable), headless=True, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1366, "height": 900}, locale="en-GB")
            errors: list[str] = []
            context.on("weberror", lambda error: errors.append(str(error.error)))
            yield context
            assert errors == [], f"uncaught errors in the page: {errors}"
        finally:
            await browser.close()
