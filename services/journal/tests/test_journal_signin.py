"""OIDC sign-in (issue 9) over real HTTP: the journal service on a real port, a real OIDC provider emulator
(``temporality_testing.oidc_emulator``: discovery, JWKS, authorize, token, keys made here), the real
human-interaction service for the inbox, a real bus. The ID token checks themselves are Authlib's.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from journal_support import (
    BOB_INBOX,
    OPERATOR,
    VIEWER,
    ServedJournal,
    approve,
    eventually,
    serve_gateway,
    serve_human,
    serve_journal,
    served_settings,
    start_login,
)
from journal_support import oidc_sign_in as sign_in
from playwright.async_api import BrowserContext, expect
from pydantic import ValidationError
from starlette.requests import Request
from wizard_support import Choose, save, walk_wizard

from temporality_bus import Bus, NatsSettings
from temporality_embedded.processes import free_port
from temporality_journal import Settings
from temporality_journal.database import Database
from temporality_journal.revocation import Revocations
from temporality_journal.signin import SESSION_COOKIE, SignIn, role_of
from temporality_service import PRINCIPAL_HEADER, VOUCH_HEADER, ApiAuthSettings, PrincipalVoucher, Role, Voucher
from temporality_testing.oidc_emulator import OidcEmulator

CONSOLE = {"X-Temporality-Console": "1"}
ROLE_MAP = {"temporality-operators": "operator", "temporality-admins": "admin", "staff": "viewer"}
PEOPLE = {
    "alice": {"preferred_username": "alice", "name": "Alice Example", "groups": ["staff", "temporality-operators"]},
    "bob": {"preferred_username": "bob", "name": "Bob Example", "groups": ["elsewhere"]},
    "carol": {"name": "Carol Without Username", "groups": ["temporality-admins"]},
    "dana": {"preferred_username": "dana", "name": "Dana Admin", "groups": ["temporality-admins"]},
}


@dataclass
class SignInStack:
    journal: ServedJournal
    idp: OidcEmulator
    human_url: str
    vouch_secret: str
    gateway_url: str


def oidc_settings(
    tmp_path: Path,
    nats_settings: NatsSettings,
    idp: OidcEmulator,
    human_url: str | None,
    gateway_url: str | None = None,
    database_url: str | None = None,
) -> Settings:
    """The served journal's settings with OIDC sign-in against ``idp`` and the vouch secrets of ``tmp_path``
    (the inbox's, and the API's when ``gateway_url`` is given: the gateway admits who the journal vouches for);
    SQLite unless ``database_url``."""
    port = free_port()
    (tmp_path / "client-secret").write_text(idp.client_secret, encoding="utf-8")
    (tmp_path / "session-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    base = served_settings(tmp_path, nats_settings, database_url, human_url=human_url, gateway_url=gateway_url)
    api_vouch = tmp_path / "api-vouch-secret" if gateway_url is not None else None
    return Settings(
        nats=base.nats,
        port=port,
        database_url=base.database_url,
        api=ApiAuthSettings(tokens_file=base.api.tokens_file, vouch_secret_file=api_vouch),
        human_url=human_url,
        gateway_url=gateway_url,
        oidc_issuer=idp.issuer,
        oidc_client_id=idp.client_id,
        oidc_client_secret_file=tmp_path / "client-secret",
        oidc_redirect_base_url=f"http://127.0.0.1:{port}",
        oidc_provider_name="Test IdP",
        oidc_user_claim="preferred_username",
        oidc_role_map=ROLE_MAP,
        session_secret_file=tmp_path / "session-secret",
        inbox_vouch_secret_file=tmp_path / "vouch-secret",
    )


@pytest.fixture
async def stack(tmp_path: Path, nats_settings: NatsSettings, bus: Bus) -> AsyncIterator[SignInStack]:
    vouch_secret = secrets.token_urlsafe(32)
    (tmp_path / "vouch-secret").write_text(vouch_secret, encoding="utf-8")
    (tmp_path / "api-vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    async with (
        OidcEmulator(people=PEOPLE).serve() as idp,
        serve_human(tmp_path, nats_settings, vouch_secret_file=tmp_path / "vouch-secret") as human_url,
        serve_gateway(tmp_path, nats_settings, vouch_secret_file=tmp_path / "api-vouch-secret") as gateway_url,
    ):
        settings = oidc_settings(tmp_path, nats_settings, idp, human_url, gateway_url)
        idp.redirect_uris = [f"http://127.0.0.1:{settings.port}/auth/callback"]
        idp.post_logout_redirect_uris = [f"http://127.0.0.1:{settings.port}/console/"]
        async with serve_journal(settings, bus) as journal:
            yield SignInStack(journal, idp, human_url, vouch_secret, gateway_url)


@pytest.fixture
async def browser_http(stack: SignInStack) -> AsyncIterator[httpx.AsyncClient]:
    """A cookie-keeping client, as a browser is (redirects followed by hand)."""
    async with httpx.AsyncClient(base_url=stack.journal.url, timeout=10) as client:
        yield client


def session_cookie(response: httpx.Response) -> str:
    header = next(v for k, v in response.headers.multi_items() if k == "set-cookie" and SESSION_COOKIE in v)
    return header.lower()


# --------------------------------------------------------------------------- the flow
async def test_operator_signs_in_with_pkce_state_and_nonce_and_uses_the_api(
    stack: SignInStack, browser_http: httpx.AsyncClient
) -> None:
    answer = await sign_in(browser_http, stack.idp, "alice")
    assert answer.status_code == 302, answer.text
    assert answer.headers["location"] == "/console/#/runs"
    cookie = session_cookie(answer)
    assert "httponly" in cookie
    assert "samesite=lax" in cookie
    assert "secure" not in cookie  # the redirect base URL is plain http
    asked = stack.idp.authorizations[-1]
    assert asked["code_challenge_method"] == "S256"
    assert asked["code_challenge"]
    assert asked["nonce"]
    assert asked["state"]
    assert asked["redirect_uri"] == f"http://127.0.0.1:{stack.journal.runtime.settings.port}/auth/callback"

    me = (await browser_http.get("/whoami")).json()
    assert me["kind"] == "person"
    assert me["user"] == "alice"
    assert me["name"] == "Alice Example"
    assert me["role"] == "operator"  # staff (viewer) and temporality-operators: the highest
    assert (await browser_http.get("/runs")).status_code == 200
    # A call that changes something: the console header is required with the cookie ...
    refused = await browser_http.post("/runs/run-x/cancel", json={"reason": "test"})
    assert refused.status_code == 403
    assert refused.json()["error"] == "console_header_missing"
    # ... and with it, the role admits the call (the run is unknown: a 404, past the check).
    admitted = await browser_http.post("/runs/run-x/cancel", json={"reason": "test"}, headers=CONSOLE)
    assert admitted.status_code == 404, admitted.text
    assert admitted.json()["error"] == "run_not_found"
    # The operator's audit trail too.
    assert (await browser_http.get("/audit")).status_code == 200
    # A bearer, when sent, is what counts (not the cookie).
    assert (await browser_http.get("/whoami", headers=VIEWER)).json() == {
        "name": "board",
        "role": "viewer",
        "kind": "token",
        "user": None,
        "expires_at": None,
    }


async def test_a_person_without_a_role_mapping_gets_only_their_own_inbox(
    stack: SignInStack, browser_http: httpx.AsyncClient
) -> None:
    answer = await sign_in(browser_http, stack.idp, "bob")
    assert answer.status_code == 302, answer.text
    assert answer.headers["location"] == "/console/#/inbox"
    me = (await browser_http.get("/whoami")).json()
    assert (me["user"], me["role"]) == ("bob", None)
    runs = await browser_http.get("/runs")
    assert runs.status_code == 403
    assert "no role" in runs.json()["detail"]
    # The inbox: human-interaction believes the journal's signed assertion, and shows bob his own.
    inbox = await browser_http.get("/human/inbox")
    assert inbox.status_code == 200, inbox.text
    assert inbox.json()["user"] == "user:bob"
    # Nor the trigger admin API: a clear 403 from the journal (nothing forwarded), not a 401 that would sign the
    # console out.
    triggers = await browser_http.get("/gateway/triggers")
    assert triggers.status_code == 403
    assert "no role" in triggers.json()["detail"]
    # An answer with the cookie needs the console header too (refused before it leaves the journal).
    posted = await browser_http.post("/human/requests/req-1/answer", json={"option_id": "yes"})
    assert posted.status_code == 403
    assert posted.json()["error"] == "console_header_missing"
    posted = await browser_http.post("/human/requests/req-1/answer", json={"option_id": "yes"}, headers=CONSOLE)
    assert posted.status_code == 404  # human-interaction's own answer: no such request
    assert posted.json()["error"] == "unknown_request"


async def test_logout_needs_the_console_header_and_ends_the_session(
    stack: SignInStack, browser_http: httpx.AsyncClient
) -> None:
    assert (await sign_in(browser_http, stack.idp, "alice")).status_code == 302
    refused = await browser_http.post("/auth/logout")
    assert refused.status_code == 403
    assert (await browser_http.get("/whoami")).status_code == 200  # still signed in
    out = await browser_http.post("/auth/logout", headers=CONSOLE)
    assert out.status_code == 200, out.text
    assert (await browser_http.get("/whoami")).status_code == 401
    assert (await browser_http.get("/human/inbox")).status_code == 401
    # where the browser goes next: the provider's end_session_endpoint (RP-initiated logout)
    provider_logout = httpx.URL(out.json()["provider_logout"])
    assert str(provider_logout.copy_with(query=None)) == f"{stack.idp.issuer}/end_session"
    params = dict(provider_logout.params)
    assert params["post_logout_redirect_uri"] == f"{stack.journal.url}/console/"
    assert params["client_id"] == stack.idp.client_id
    assert params["id_token_hint"].count(".") == 2  # the sign-in's ID token (the provider checks it)
    # signed out already: a second logout ends nothing and sends nobody to the provider
    again = await browser_http.post("/auth/logout", headers=CONSOLE)
    assert again.json() == {"provider_logout": None}


async def test_a_copy_of_a_signed_out_cookie_is_refused_by_every_replica(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, database_url: str
) -> None:
    """Two journal replicas on one database (SQLite file / PostgreSQL) and one bus: alice signs in at the first,
    a copy of her cookie works at both; she signs out at the first; from then on the copy is a 401 at both,
    and the answer clears it."""
    (tmp_path / "vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    async with OidcEmulator(people=PEOPLE).serve() as idp:
        settings = oidc_settings(tmp_path, nats_settings, idp, None, database_url=database_url)
        idp.redirect_uris = [f"http://127.0.0.1:{settings.port}/auth/callback"]
        other = settings.model_copy(update={"port": free_port()})
        async with (
            serve_journal(settings, bus) as one,
            serve_journal(other, bus) as two,
            httpx.AsyncClient(base_url=one.url, timeout=10) as browser,
            httpx.AsyncClient(timeout=10) as thief,
        ):
            assert (await sign_in(browser, idp, "alice")).status_code == 302
            copy = {"Cookie": f"{SESSION_COOKIE}={browser.cookies[SESSION_COOKIE]}"}
            for replica in (one, two):
                me = await thief.get(f"{replica.url}/whoami", headers=copy)
                assert me.status_code == 200, me.text
                assert me.json()["user"] == "alice"

            out = await browser.post("/auth/logout", headers=CONSOLE)
            assert out.status_code == 200, out.text

            for replica in (one, two):  # recorded before the logout answered: no waiting, on either replica
                refused = await thief.get(f"{replica.url}/whoami", headers=copy)
                assert refused.status_code == 401, refused.text
                assert "expires=thu, 01 jan 1970" in session_cookie(refused)  # and told to drop it
                assert (await thief.get(f"{replica.url}/runs", headers=copy)).status_code == 401
                # a revoked session ends nothing more and is not "signed out" twice
                again = await thief.post(f"{replica.url}/auth/logout", headers={**copy, **CONSOLE})
                assert again.status_code == 200
                assert again.json() == {"provider_logout": None}
            # signing in again is a new session, admitted at both replicas
            assert (await sign_in(browser, idp, "alice")).status_code == 302
            fresh = {"Cookie": f"{SESSION_COOKIE}={browser.cookies[SESSION_COOKIE]}"}
            assert (await thief.get(f"{two.url}/whoami", headers=fresh)).json()["user"] == "alice"
            assert (await thief.get(f"{two.url}/whoami", headers=copy)).status_code == 401
            # signing in again while signed in replaces the session: the one before is revoked too
            assert (await sign_in(browser, idp, "alice")).status_code == 302
            assert (await thief.get(f"{two.url}/whoami", headers=fresh)).status_code == 401
            latest = {"Cookie": f"{SESSION_COOKIE}={browser.cookies[SESSION_COOKIE]}"}
            assert (await thief.get(f"{two.url}/whoami", headers=latest)).json()["user"] == "alice"


async def test_sign_outs_survive_a_rebuild_and_expired_ones_are_deleted(database: Database) -> None:
    revocations = Revocations(database)
    now = time.time()
    await revocations.revoke("live-session", now + 3600)
    await revocations.revoke("live-session", now + 3600)  # idempotent
    await revocations.revoke("old-session", now - 1)  # past its expiry: deleted by the next sign-out
    await revocations.revoke("other-session", now + 60)
    assert await revocations.revoked("live-session")
    assert await revocations.revoked("other-session")
    assert not await revocations.revoked("old-session")
    assert not await revocations.revoked("never-signed-out")
    # the rebuild's first half drops the read model; the sign-outs are in no stream, so they stay
    await database.reset_read_model(await database.last_position())
    assert await revocations.revoked("live-session")
    assert not await revocations.revoked("never-signed-out")


async def test_provider_logout_ends_the_providers_session_too_and_returns_to_the_console(
    stack: SignInStack, browser_http: httpx.AsyncClient
) -> None:
    """A provider that remembers who signed in (SSO) signs them in again without asking, until the journal's
    logout sends the browser to its end_session_endpoint with the ID token as hint."""
    stack.idp.sso = True
    assert (await sign_in(browser_http, stack.idp, "alice")).status_code == 302
    assert stack.idp.signed_in_here() == ["alice"]
    # signed in at the provider: the next login goes straight back with a code, no login page
    again = await browser_http.get("/auth/login")
    straight = await browser_http.get(again.headers["location"])
    assert straight.status_code == 302, straight.text
    assert straight.headers["location"].startswith(f"{stack.journal.url}/auth/callback?")
    assert (await browser_http.get(straight.headers["location"])).status_code == 302

    out = await browser_http.post("/auth/logout", headers=CONSOLE)
    assert out.status_code == 200, out.text
    at_provider = await browser_http.get(out.json()["provider_logout"])
    assert at_provider.status_code == 302, at_provider.text  # the provider accepted the ID token as hint
    assert at_provider.headers["location"] == f"{stack.journal.url}/console/"
    assert [entry["login"] for entry in stack.idp.logouts] == ["alice"]
    assert stack.idp.signed_in_here() == []
    assert (await browser_http.get("/whoami")).status_code == 401
    # the provider asks again: its login page, not a code
    await start_login(browser_http, stack.idp)
    # a forged hint is refused by the provider
    forged = await browser_http.get(f"{stack.idp.issuer}/end_session", params={"id_token_hint": "a.b.c"})
    assert forged.status_code == 400


async def test_an_unreachable_provider_is_a_502_naming_it_at_login_and_at_the_callback(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> None:
    idp = OidcEmulator(people=PEOPLE, port=free_port())  # its port is known, nothing listens there yet
    (tmp_path / "vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    settings = oidc_settings(tmp_path, nats_settings, idp, human_url=None)
    async with (
        serve_journal(settings, bus) as journal,
        httpx.AsyncClient(base_url=journal.url, timeout=20) as client,
    ):
        down = await client.get("/auth/login")
        assert down.status_code == 502, down.text
        body = down.json()
        assert body["error"] == "provider_unreachable"
        assert idp.issuer in body["detail"]
        assert "discovery document" in body["detail"]
        assert "set-cookie" not in down.headers  # nothing is set
        async with AsyncExitStack() as provider:
            await provider.enter_async_context(idp.serve())  # the provider comes up: the sign-in works
            callback = await approve(client, idp, await start_login(client, idp), "alice")
            await provider.aclose()  # ... and goes away between its login page and the callback
            gone = await client.get(callback)
        assert gone.status_code == 502, gone.text
        assert gone.json()["error"] == "provider_unreachable"
        assert "token endpoint" in gone.json()["detail"]
        assert (await client.get("/whoami")).status_code == 401  # nobody signed in
        assert (await client.get("/healthz")).status_code == 200


async def test_a_tampered_session_cookie_admits_nothing(stack: SignInStack, browser_http: httpx.AsyncClient) -> None:
    assert (await sign_in(browser_http, stack.idp, "alice")).status_code == 302
    stolen = browser_http.cookies.get(SESSION_COOKIE)
    assert stolen
    # The session (person, role, absolute expiry) is signed: a changed cookie fails the signature.
    tampered = stolen[:-2] + ("AA" if not stolen.endswith("AA") else "BB")
    async with httpx.AsyncClient(base_url=stack.journal.url, cookies={SESSION_COOKIE: tampered}) as other:
        assert (await other.get("/whoami")).status_code == 401
    async with httpx.AsyncClient(base_url=stack.journal.url, cookies={SESSION_COOKIE: stolen}) as same:
        assert (await same.get("/whoami")).status_code == 200


# --------------------------------------------------------------------------- the console, in a real Chromium
WAIT_MS = 20_000


async def test_console_sign_in_with_the_provider_through_to_the_signed_in_console_and_inbox(
    stack: SignInStack, browser_context: BrowserContext
) -> None:
    page = await browser_context.new_page()
    await page.goto(f"{stack.journal.url}/console/")
    button = page.get_by_role("link", name="Sign in with Test IdP")
    await expect(button).to_be_visible(timeout=WAIT_MS)
    await expect(page.locator("#token")).to_be_visible()  # the API token sign-in stays
    await button.click()
    await page.get_by_role("button", name="Sign in as alice").click()  # the provider's own page
    await expect(page.locator("#who")).to_have_text("Alice Example (operator)", timeout=WAIT_MS)
    await expect(page.locator("#nav")).to_be_visible()
    assert page.url.startswith(f"{stack.journal.url}/console/#/runs")
    # The cookie is HttpOnly: the page's script cannot read it.
    assert SESSION_COOKIE not in await page.evaluate("document.cookie")
    assert not await page.evaluate("sessionStorage.length")  # no token kept in the tab

    # Her own inbox, without an inbox token: the journal vouches for her.
    await page.locator("a[data-nav=inbox]").click()
    await expect(page.locator("#inbox-who")).to_have_text("Signed in to the inbox as alice", timeout=WAIT_MS)
    await expect(page.locator("#inbox .empty")).to_have_text("No questions are waiting for you.")

    # Sign out: the journal's session ends, then the provider's (RP-initiated logout), back to the console.
    await page.locator("#sign-out").click()
    await eventually(lambda: _logged_out_at_provider(stack.idp, "alice"), what="the provider's logout")
    await expect(page).to_have_url(f"{stack.journal.url}/console/", timeout=WAIT_MS)  # post_logout_redirect_uri
    await expect(page.get_by_role("link", name="Sign in with Test IdP")).to_be_visible(timeout=WAIT_MS)
    status = await page.evaluate("fetch('/whoami').then((r) => r.status)")
    assert status == 401


async def _logged_out_at_provider(idp: OidcEmulator, login: str) -> bool | None:
    return True if any(entry["login"] == login for entry in idp.logouts) else None


async def test_trigger_wizard_of_an_admin_signed_in_with_the_provider_creates_a_trigger_that_fires(
    stack: SignInStack, browser_context: BrowserContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The six-step wizard in Chromium for a person signed in through the provider's page (no API token
    anywhere in the browser): the journal vouches for them to the gateway, which records them as the author;
    the new webhook trigger then accepts a delivery."""
    monkeypatch.setenv("SIGNIN_HOOK_TOKEN", "a-bearer-token-the-gateway-reads")  # the gateway resolves *_env
    page = await browser_context.new_page()
    await page.goto(f"{stack.journal.url}/console/#/triggers")
    await page.get_by_role("link", name="Sign in with Test IdP").click()
    await page.get_by_role("button", name="Sign in as dana").click()  # the provider's own page
    await expect(page.locator("#who")).to_have_text("Dana Admin (admin)", timeout=WAIT_MS)
    assert page.url.endswith("#/triggers")
    assert not await page.evaluate("sessionStorage.length")  # no token in the tab: the session cookie only

    defs = page.locator("#trigger-defs")
    await expect(defs.locator('tr[data-trigger-id="seeded-hook"]')).to_contain_text("webhook", timeout=WAIT_MS)
    await page.get_by_role("link", name="New trigger").click()
    source = {"Id": "signed-in-orders", "Name": "Orders, set up by Dana", "Adapter": "generic"}
    await walk_wizard(
        page,
        [
            {**source, "Auth type": Choose("bearer"), "Secret environment variable": "SIGNIN_HOOK_TOKEN"},
            {"Event types": "order.created"},
            {"Agent": "reviewer"},
            {
                "Input mapping": "order = payload.order_id",
                "Sample payload (JSON)": '{"type": "order.created", "id": "o-1", "data": {"order_id": 7}}',
            },
        ],
    )
    await expect(page.locator("#preview-input")).to_contain_text('"order": 7', timeout=WAIT_MS)  # Next previewed it
    await walk_wizard(page, [{"Allowed recipients": "user:alice"}, {}], first=5)
    await save(page, "signed-in-orders")
    row = defs.locator('tr[data-trigger-id="signed-in-orders"]')
    await expect(row.locator("td.enabled")).to_have_text("yes", timeout=WAIT_MS)
    await expect(row).to_contain_text("user:dana")  # changed by the person, not a token

    async with httpx.AsyncClient(timeout=10) as client:
        # journaled as hers
        async def created_by() -> str | None:
            answer = await client.get(
                f"{stack.journal.url}/events", params={"type": "trigger.created"}, headers=OPERATOR
            )
            events = answer.json()["events"]
            return next((e["actor"] for e in events if e["data"].get("trigger_id") == "signed-in-orders"), None)

        assert await eventually(created_by, what="trigger.created journaled") == "user:dana"
        # it fires: the gateway accepts a delivery on the new webhook, and the journal records it
        hook = await client.post(
            f"{stack.gateway_url}/hooks/signed-in-orders",
            json={"type": "order.created", "id": "order-7", "data": {"order_id": 7}},
            headers={"Authorization": "Bearer a-bearer-token-the-gateway-reads"},
        )
        assert hook.status_code in (200, 202), hook.text

        async def accepted() -> list[Any] | None:
            answer = await client.get(f"{stack.journal.url}/triggers/signed-in-orders/deliveries", headers=VIEWER)
            found = [d for d in answer.json()["deliveries"] if d["outcome"] == "accepted"]
            return found or None

        assert await eventually(accepted, what="the delivery journaled as accepted")


async def test_console_of_a_person_without_a_role_is_their_inbox_only(
    stack: SignInStack, browser_context: BrowserContext
) -> None:
    page = await browser_context.new_page()
    await page.goto(f"{stack.journal.url}/console/#/waiting")
    await page.get_by_role("link", name="Sign in with Test IdP").click()
    await page.get_by_role("button", name="Sign in as bob").click()
    await expect(page.locator("#inbox-who")).to_have_text("Signed in to the inbox as bob", timeout=WAIT_MS)
    await expect(page.locator("#who")).to_have_text("Bob Example (inbox only)")
    await expect(page.locator("#nav")).to_be_hidden()
    await page.evaluate("location.hash = '#/runs'")
    await expect(page).to_have_url(re.compile(r"#/inbox$"), timeout=WAIT_MS)


# --------------------------------------------------------------------------- refusals
async def test_anonymous_requests_are_refused_but_health_and_sign_in_config(stack: SignInStack) -> None:
    async with httpx.AsyncClient(base_url=stack.journal.url) as client:
        for path in ("/whoami", "/runs", "/events", "/human/inbox", "/gateway/triggers"):
            answer = await client.get(path)
            assert answer.status_code == 401, (path, answer.text)
        assert (await client.post("/runs/x/cancel", json={"reason": "r"}, headers=CONSOLE)).status_code == 401
        assert (await client.get("/healthz")).status_code == 200
        config = await client.get("/auth/config")
        assert config.json() == {"oidc": {"provider": "Test IdP", "login": "/auth/login"}, "password": None}


async def test_callback_with_a_wrong_state_is_refused_and_signs_nobody_in(
    stack: SignInStack, browser_http: httpx.AsyncClient
) -> None:
    callback = await approve(browser_http, stack.idp, await start_login(browser_http, stack.idp), "alice")
    forged = re.sub(r"state=[^&]+", "state=forged-state", callback)
    answer = await browser_http.get(forged)
    assert answer.status_code == 400
    assert answer.json()["error"] == "sign_in_failed"
    assert (await browser_http.get("/whoami")).status_code == 401
    # A callback from another browser (no session holding the state) is refused as well.
    async with httpx.AsyncClient(base_url=stack.journal.url) as stranger:
        answer = await stranger.get(callback)
        assert answer.status_code == 400
        assert answer.json()["error"] == "sign_in_failed"


@pytest.mark.parametrize(
    ("tamper", "other_key"),
    [
        pytest.param({"nonce": "not-the-nonce-sent"}, False, id="nonce"),
        pytest.param({"iss": "http://127.0.0.1:1/another-issuer"}, False, id="issuer"),
        pytest.param({"aud": "another-client"}, False, id="audience"),
        pytest.param({"exp": 1_000_000_000}, False, id="expired"),
        pytest.param({}, True, id="signature"),
    ],
)
async def test_id_tokens_the_library_finds_invalid_are_refused(
    stack: SignInStack, browser_http: httpx.AsyncClient, tamper: dict[str, Any], other_key: bool
) -> None:
    stack.idp.tamper = tamper
    stack.idp.sign_with_other_key = other_key
    answer = await sign_in(browser_http, stack.idp, "alice")
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "sign_in_failed"
    assert (await browser_http.get("/whoami")).status_code == 401


async def test_a_token_without_the_user_claim_or_a_denied_login_signs_nobody_in(
    stack: SignInStack, browser_http: httpx.AsyncClient
) -> None:
    answer = await sign_in(browser_http, stack.idp, "carol")  # no preferred_username
    assert answer.status_code == 400
    assert "preferred_username" in answer.json()["detail"]
    denied = await approve(browser_http, stack.idp, await start_login(browser_http, stack.idp), "")
    answer = await browser_http.get(denied)
    assert answer.status_code == 400
    assert "access_denied" in answer.json()["detail"]
    assert (await browser_http.get("/whoami")).status_code == 401


async def test_human_interaction_believes_no_user_id_it_cannot_verify(stack: SignInStack) -> None:
    async with httpx.AsyncClient(base_url=stack.human_url) as human:
        assert (await human.get("/inbox", headers={VOUCH_HEADER: "alice"})).status_code == 401
        other = Voucher(secrets.token_urlsafe(32)).vouch("alice")  # signed, with another secret
        assert (await human.get("/inbox", headers={VOUCH_HEADER: other})).status_code == 401
        stale = Voucher(stack.vouch_secret)
        assert (await human.get("/inbox", headers={VOUCH_HEADER: stale.vouch("mallory")})).status_code == 401
        good = await human.get("/inbox", headers={VOUCH_HEADER: stale.vouch("alice")})
        assert good.status_code == 200
        assert good.json()["user"] == "user:alice"
    # The journal never passes a caller's own vouch header on: with bob's inbox token it is bob's inbox.
    async with httpx.AsyncClient(base_url=stack.journal.url) as client:
        forged = {VOUCH_HEADER: Voucher(stack.vouch_secret).vouch("alice"), **BOB_INBOX}
        assert (await client.get("/human/inbox", headers=forged)).json()["user"] == "user:bob"
        alone = await client.get("/human/inbox", headers={VOUCH_HEADER: Voucher(stack.vouch_secret).vouch("alice")})
        assert alone.status_code == 401  # no session, no bearer: refused by the journal


def test_an_assertion_expires() -> None:
    voucher = Voucher("x" * 32)
    assertion = voucher.vouch("alice")
    assert voucher.vouched(assertion) == "alice"
    assert voucher.vouched(assertion, max_age_s=-1) is None
    # tampered inside the signature, not at its last character: the last base64 character can carry padding bits
    # only, and swapping it may leave the decoded signature unchanged (a valid assertion, the test failing by luck)
    at = len(assertion) - 5
    swapped = "A" if assertion[at] != "A" else "B"
    assert voucher.vouched(assertion[:at] + swapped + assertion[at + 1 :]) is None


def test_a_session_past_its_absolute_expiry_signs_nobody_in(tmp_path: Path, nats_settings: NatsSettings) -> None:
    idp = OidcEmulator(people=PEOPLE, port=1)
    (tmp_path / "vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    signin = SignIn.from_settings(oidc_settings(tmp_path, nats_settings, idp, "http://127.0.0.1:1"))
    assert signin is not None

    def request(expires_at: float) -> Request:
        person = {"id": "alice", "name": "Alice", "role": "operator", "exp": expires_at, "sid": "s-1"}
        return Request({"type": "http", "method": "GET", "headers": [], "session": {"person": person}})

    now = time.time()
    live = signin.person(request(now + 60))
    assert live is not None
    assert live.role is Role.operator
    assert signin.person(request(now - 1)) is None
    assert not signin.ended(request(now + 60))
    expired = request(now - 1)
    assert signin.ended(expired)  # the API's 401 says "your session ended" ...
    assert expired.session == {}  # ... and the answer drops the cookie
    assert signin.ended(expired)


# --------------------------------------------------------------------------- configuration and the role rule
def test_role_rule_is_the_highest_mapped_value_and_none_without_a_match() -> None:
    assert role_of(["staff", "temporality-admins"], ROLE_MAP) is Role.admin
    assert role_of("staff", ROLE_MAP) is Role.viewer
    assert role_of(["elsewhere"], ROLE_MAP) is None
    assert role_of(None, ROLE_MAP) is None
    assert role_of(42, ROLE_MAP) is None


def test_an_issuer_without_the_rest_of_the_settings_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="TEMPORALITY_JOURNAL_OIDC_CLIENT_ID"):
        Settings(oidc_issuer="https://idp.example.org", oidc_client_secret_file=tmp_path / "s")
    with pytest.raises(ValidationError, match="viewer"):
        Settings(oidc_role_map={"g": "superuser"})


async def test_a_signed_in_operator_manages_triggers_through_the_journal_vouching_for_them(
    stack: SignInStack, browser_http: httpx.AsyncClient
) -> None:
    """The trigger wizard's calls (``/gateway/…``) of a person signed in with the provider: the journal sends the
    gateway their principal and role, signed (``X-Temporality-Vouched-Principal``); the gateway checks the role."""
    assert (await sign_in(browser_http, stack.idp, "alice")).status_code == 302  # an operator
    listed = await browser_http.get("/gateway/triggers")
    assert listed.status_code == 200, listed.text
    assert "seeded-hook" in listed.text
    one = await browser_http.get("/gateway/triggers/seeded-hook")
    assert one.status_code == 200, one.text
    switch = {**CONSOLE, "If-Match": one.headers["etag"]}
    refused = await browser_http.post(
        "/gateway/triggers/seeded-hook/disable", headers={"If-Match": one.headers["etag"]}
    )
    assert refused.status_code == 403  # a change with the cookie needs the console header, as everywhere
    assert refused.json()["error"] == "console_header_missing"
    disabled = await browser_http.post("/gateway/triggers/seeded-hook/disable", headers=switch)
    assert disabled.status_code == 200, disabled.text
    assert disabled.json()["trigger"]["enabled"] is False
    # deleting needs admin: the gateway says so, naming the person and their role
    gone = await browser_http.request("DELETE", "/gateway/triggers/seeded-hook", headers={**CONSOLE, "If-Match": "*"})
    assert gone.status_code == 403, gone.text
    assert "user:alice has operator" in gone.json()["detail"]

    async with httpx.AsyncClient(base_url=stack.journal.url, timeout=10) as other:
        # the change is journaled as the person's
        async def disabled_by() -> str | None:
            answer = await other.get("/events", params={"type": "trigger.disabled"}, headers=OPERATOR)
            events = answer.json()["events"]
            return next((e["actor"] for e in events if e["data"].get("trigger_id") == "seeded-hook"), None)

        assert await eventually(disabled_by, what="trigger.disabled journaled") == "user:alice"
        # a principal header a caller sends itself is never passed on (the journal forwards allow-listed headers)
        claim = PrincipalVoucher(secrets.token_urlsafe(32)).vouch_principal("user:mallory", "admin")
        alone = await other.get("/gateway/triggers", headers={PRINCIPAL_HEADER: claim})
        assert alone.status_code == 401  # no token, no session: refused by the journal, nothing forwarded
        with_viewer = await other.request(
            "DELETE", "/gateway/triggers/seeded-hook", headers={PRINCIPAL_HEADER: claim, "If-Match": "*", **VIEWER}
        )
        assert with_viewer.status_code == 403, with_viewer.text  # the gateway saw the viewer token only
        assert "board" in with_viewer.json()["detail"]


async def test_a_database_that_cannot_record_or_check_a_sign_out_is_a_503_never_a_silent_pass(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> None:
    """The journal's real SQLite refusing the revocation write (a trigger), then the read (the table renamed): a
    sign-out, and a sign-in that replaces a session, answer 503 ``sign_out_unrecorded`` and leave the person
    signed in; a request whose session cannot be checked is a 503 ``session_check_failed``, not admitted."""
    import sqlite3

    db_file = tmp_path / "journal" / "journal.db"
    (tmp_path / "vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    async with OidcEmulator(people=PEOPLE).serve() as idp:
        settings = oidc_settings(tmp_path, nats_settings, idp, None, database_url=f"sqlite+aiosqlite:///{db_file}")
        idp.redirect_uris = [f"http://127.0.0.1:{settings.port}/auth/callback"]
        async with (
            serve_journal(settings, bus) as journal,
            httpx.AsyncClient(base_url=journal.url, timeout=10) as browser,
        ):
            assert (await sign_in(browser, idp, "alice")).status_code == 302
            cookie = browser.cookies[SESSION_COOKIE]

            def sql(statement: str) -> None:
                with sqlite3.connect(db_file) as conn:
                    conn.execute(statement)

            sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON revoked_sessions "
                "BEGIN SELECT RAISE(ABORT, 'the disk is full'); END"
            )
            out = await browser.post("/auth/logout", headers=CONSOLE)
            assert out.status_code == 503, out.text
            assert out.json()["error"] == "sign_out_unrecorded"
            assert (await browser.get("/whoami")).json()["user"] == "alice"  # still signed in: may retry
            again = await sign_in(browser, idp, "alice")  # a sign-in that would replace the session
            assert again.status_code == 503, again.text
            assert again.json()["error"] == "sign_out_unrecorded"
            # the session before stands, unreplaced (the login's own state was added to it, nothing else)
            assert (await browser.get("/whoami")).json()["user"] == "alice"
            async with httpx.AsyncClient(base_url=journal.url, cookies={SESSION_COOKIE: cookie}) as copy:
                assert (await copy.get("/whoami")).json()["user"] == "alice"

            sql("ALTER TABLE revoked_sessions RENAME TO revoked_sessions_gone")
            unchecked = await browser.get("/whoami")
            assert unchecked.status_code == 503, unchecked.text
            assert unchecked.json()["error"] == "session_check_failed"
            assert (await browser.get("/runs")).status_code == 503
            # a request without a session is not checked at all
            async with httpx.AsyncClient(base_url=journal.url) as anonymous:
                assert (await anonymous.get("/healthz")).status_code == 200

            sql("ALTER TABLE revoked_sessions_gone RENAME TO revoked_sessions")
            sql("DROP TRIGGER refuse")
            done = await browser.post("/auth/logout", headers=CONSOLE)
            assert done.status_code == 200, done.text
            assert (await browser.get("/whoami")).status_code == 401
