"""The console when a service does not do what it should -- in a real headless Chromium (Playwright driving
Debian's chromium) against the journal service on a real port, fed through a real nats-server:

- the trigger-gateway behind the journal's ``/gateway/`` proxy refuses a token the journal takes (it has not
  loaded a newly added token yet: a restart, a rollout): said in the section that asked, nobody signed out;
- the journal stops answering (as under ``kill -STOP``: connections accepted, nothing answered -- a real TCP proxy
  in front of it that stops passing bytes): the banner says so once the live tail missed more than two pings,
  a table says "Loading…" and then that it was not loaded, an action's button says it is under way and then that
  nothing is known of it; once the journal answers again, the banner, the message and the stale rows go.

The page's clock is Playwright's (``page.clock``): the 15 s timeouts and the 40 s of missed pings are jumped over
instead of waited for. Every browser assertion waits on its condition with a timeout (Playwright's ``expect``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit

import pytest
from journal_support import (
    ADMIN_TOKEN,
    GATEWAY_TRIGGERS,
    OPERATOR_TOKEN,
    TOKENS,
    ServedJournal,
    publish_recorded,
    serve_journal,
    serve_service,
    served_settings,
)
from playwright.async_api import BrowserContext, Page, expect

from temporality_bus import Bus, NatsSettings
from temporality_service import ApiAuthSettings
from temporality_service.auth import dump_tokens
from temporality_trigger_gateway import Settings as GatewaySettings
from temporality_trigger_gateway.__main__ import SPEC as GATEWAY_SPEC
from temporality_trigger_gateway.__main__ import configure as gateway_configure

MakeStory = Callable[..., Any]  # journal_support.RunStory
WAIT_MS = 20_000
pytestmark = pytest.mark.timeout(180)


class FrozenJournal:
    """A TCP proxy in front of the journal whose ``freeze()`` stops it passing bytes either way -- what a browser
    sees of a journal stopped with SIGSTOP: new connections are accepted, requests go out, nothing comes back --
    and ``thaw()`` passes them again (what was held included, as a resumed process answers its backlog)."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def freeze(self) -> None:
        self.flowing.clear()

    def thaw(self) -> None:
        self.flowing.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(self.host, self.port)
            await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                await self.flowing.wait()  # frozen: held here, passed on once thawed
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.close()


async def _sign_in(page: Page, url: str, token: str, hash_: str) -> None:
    await page.goto(f"{url}/console/{hash_}")
    await page.get_by_label("API token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#who")).not_to_have_text("", timeout=WAIT_MS)


async def test_a_stuck_journal_is_said_an_action_shows_it_waits_and_everything_clears_once_it_answers(
    served_journal: ServedJournal, browser_context: BrowserContext, story: MakeStory
) -> None:
    s = story(title="Review PR 42")
    await publish_recorded(served_journal, s.requested(), s.created(), s.started(), s.human_requested())
    async with FrozenJournal(served_journal.url) as journal:
        page = await browser_context.new_page()
        await page.clock.install()
        await _sign_in(page, journal.url, OPERATOR_TOKEN, f"#/runs/{s.run_id}")
        badge, banner, alert = page.locator("#live"), page.locator("#journal-state"), page.locator("#message")
        cancel = page.locator("#cancel-run")
        await expect(cancel).to_be_visible(timeout=WAIT_MS)
        await expect(badge).to_have_attribute("data-live", "on", timeout=WAIT_MS)
        await expect(banner).to_be_hidden()

        journal.freeze()
        # more than two of the journal's 15 s pings missed: the tail is dropped and /readyz gets no answer
        await page.clock.fast_forward(45_000)
        await expect(banner).to_have_attribute("data-state", "no-answer", timeout=WAIT_MS)
        await expect(page.locator("#journal-state-text")).to_contain_text("The journal does not answer since")
        await expect(badge).to_have_text("not live")
        await page.screenshot(path=_shot("stuck-banner"))

        # an action says it is under way, then that its outcome is not known
        await page.get_by_label("Reason").fill("the PR was closed")
        await cancel.click()
        await expect(cancel).to_have_text("Cancelling…")
        await expect(cancel).to_be_disabled()
        await expect(cancel).to_have_attribute("aria-busy", "true")
        await page.clock.fast_forward(16_000)
        await expect(alert).to_contain_text("The journal did not answer within 15 s", timeout=WAIT_MS)
        await expect(alert).to_contain_text("it is not known whether this was done")
        await expect(cancel).to_have_text("Cancel run")
        await expect(cancel).to_be_enabled()

        # a table says it is loading, not that it is empty; then that it was not loaded
        await page.get_by_role("link", name="Runs", exact=True).click()
        await expect(page.locator("#runs tbody tr.loading")).to_have_text("Loading…", timeout=WAIT_MS)
        await page.screenshot(path=_shot("stuck-loading"))
        await page.clock.fast_forward(16_000)
        await expect(page.locator("#runs tbody tr.not-loaded")).to_contain_text("Not loaded", timeout=WAIT_MS)
        await expect(alert).to_contain_text("what you see may be out of date")
        assert "Failed to fetch" not in await alert.inner_text()

        # the journal answers again: the next check (every 10 s) sees it, the page re-reads, and what said
        # otherwise goes -- the banner, the message, the "not loaded" row
        journal.thaw()
        await page.clock.fast_forward(11_000)
        await expect(page.locator(f'#runs tr[data-run-id="{s.run_id}"]')).to_be_visible(timeout=WAIT_MS)
        await expect(banner).to_be_hidden(timeout=WAIT_MS)
        await expect(alert).to_be_hidden(timeout=WAIT_MS)
        await expect(badge).to_have_attribute("data-live", "on", timeout=WAIT_MS)
        await expect(page.locator("#runs tbody tr.not-loaded")).to_have_count(0)


def _shot(name: str) -> str:
    """Where this test's screenshots go (a scratch folder; not the docs' images)."""
    folder = Path("/tmp/console-outage-shots")
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder / f"{name}.png")


@asynccontextmanager
async def _gateway_without_the_admin_token(tmp_path: Path, nats_settings: NatsSettings) -> AsyncIterator[str]:
    """The real trigger-gateway whose tokens file lacks the journal's admin token (it was added to the journal's
    and the gateway has not read its file again yet); yields its URL."""
    directory = tmp_path / "gateway"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "triggers.yaml").write_text(GATEWAY_TRIGGERS, encoding="utf-8")
    (directory / "agents.yaml").write_text("agents:\n  - {id: reviewer}\n", encoding="utf-8")
    tokens = directory / "tokens.json"
    tokens.write_text(dump_tokens([t for t in TOKENS if t.token.get_secret_value() != ADMIN_TOKEN]), encoding="utf-8")
    settings = GatewaySettings(
        nats=nats_settings,
        host="127.0.0.1",
        port=0,
        triggers_file=directory / "triggers.yaml",
        api=ApiAuthSettings(tokens_file=tokens),
    )
    async with serve_service(GATEWAY_SPEC, settings, gateway_configure(settings)) as running:
        server = running.runtime.server
        assert server is not None
        yield server.url


async def test_a_token_the_trigger_gateway_does_not_take_yet_is_said_there_and_signs_nobody_out(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, browser_context: BrowserContext
) -> None:
    async with _gateway_without_the_admin_token(tmp_path, nats_settings) as gateway_url:
        settings = served_settings(tmp_path, nats_settings, gateway_url=gateway_url)
        async with serve_journal(settings, bus) as served:
            page = await browser_context.new_page()
            await _sign_in(page, served.url, ADMIN_TOKEN, "#/triggers")
            problem = page.locator("#definitions .section-problem")
            await expect(problem).to_contain_text(
                "The trigger-gateway does not accept this token (yet)", timeout=WAIT_MS
            )
            await expect(problem).to_contain_text("(401)")
            await expect(problem).to_contain_text("You are still signed in to the journal")
            await expect(page.locator("#who")).to_have_text("root (admin)")
            await expect(page.locator("#nav")).to_be_visible()
            await expect(page.locator('#triggers tr[data-trigger-id="seeded-hook"]')).to_be_visible()  # the journal's
            await expect(page.locator("#message")).to_be_hidden()
            await page.screenshot(path=_shot("gateway-401"), full_page=True)

            # a trigger's page: the gateway's section says it, the journal's deliveries are there
            await page.evaluate("location.hash = '#/triggers/seeded-hook'")
            await expect(page.locator("#processing-section .section-problem")).to_contain_text(
                "does not accept this token (yet)", timeout=WAIT_MS
            )
            await expect(page.locator("#deliveries")).to_contain_text("No deliveries.")
            # still signed in: another page opens without a sign-in
            await page.get_by_role("link", name="Runs", exact=True).click()
            await expect(page.locator("#runs")).to_contain_text("No runs.", timeout=WAIT_MS)
            await expect(page.get_by_label("API token")).to_have_count(0)
            assert await page.evaluate("sessionStorage.getItem('temporality.console.token')") == ADMIN_TOKEN
