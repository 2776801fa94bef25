"""Sign-in with a directory account's password (issue 9) over real HTTP: the journal service on a real port, the
real human-interaction service (its users file holding Argon2id hashes and console roles) answering the password
check over a real bus, headless Chromium for the console's form."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from journal_support import (
    OPERATOR,
    RunStory,
    ServedJournal,
    console_screenshot,
    eventually,
    oidc_sign_in,
    publish_recorded,
    serve_human,
    serve_journal,
    served_settings,
)
from playwright.async_api import BrowserContext, expect

from temporality_bus import Bus, NatsSettings
from temporality_embedded.processes import free_port
from temporality_human_interaction.passwords import hash_password
from temporality_journal import Settings
from temporality_journal.access import NOT_SIGNED_IN, SESSION_ENDED
from temporality_journal.passwords import AttemptLimits, Exhausted, Failures, limit_key
from temporality_journal.signin import SESSION_COOKIE
from temporality_protocol.catalog import BUCKET_SIGNIN_FAILURES
from temporality_service.settings import ProcessSettings
from temporality_testing.oidc_emulator import OidcEmulator

CONSOLE = {"X-Temporality-Console": "1"}
ALICE_PASSWORD = "alice-operator-password"
BOB_PASSWORD = "bob-inbox-only-password"
WAIT_MS = 20_000
REFUSED = {"error": "sign_in_refused", "detail": "unknown user or wrong password"}


@cache
def users_file() -> str:
    """alice: an operator; bob: a password but no console role; dana: a role but no password."""
    return f"""users:
  alice:
    display_name: Alice Example
    inbox_token: alice-inbox-token
    preferred: web
    channels: {{web: {{}}}}
    console_role: operator
    password_hash: "{hash_password(ALICE_PASSWORD)}"
  bob:
    display_name: Bob Example
    inbox_token: bob-inbox-token
    preferred: web
    channels: {{web: {{}}}}
    password_hash: "{hash_password(BOB_PASSWORD)}"
  dana:
    display_name: Dana Admin
    inbox_token: dana-inbox-token
    preferred: web
    channels: {{web: {{}}}}
    console_role: admin
"""


def password_settings(tmp_path: Path, nats_settings: NatsSettings, human_url: str | None, **limits: Any) -> Settings:
    (tmp_path / "session-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    base = served_settings(tmp_path, nats_settings, human_url=human_url)
    return base.model_copy(
        update={
            "password_signin": True,
            "session_secret_file": tmp_path / "session-secret",
            "session_cookie_secure": False,  # plain http on loopback
            "inbox_vouch_secret_file": tmp_path / "vouch-secret",
            **limits,
        }
    )


@dataclass
class Stack:
    journal: ServedJournal


@pytest.fixture
async def stack(tmp_path: Path, nats_settings: NatsSettings, bus: Bus) -> AsyncIterator[Stack]:
    (tmp_path / "vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    async with serve_human(tmp_path, nats_settings, tmp_path / "vouch-secret", users=users_file()) as human_url:
        settings = password_settings(
            tmp_path, nats_settings, human_url, password_max_failures=3, password_max_failures_per_address=5
        )
        async with serve_journal(settings, bus) as journal:
            yield Stack(journal)


async def sign_in(client: httpx.AsyncClient, user: str, password: str) -> httpx.Response:
    return await client.post("/auth/password", json={"user": user, "password": password}, headers=CONSOLE)


async def test_an_operator_signs_in_with_the_directory_password_and_signs_out(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.journal.url, timeout=20) as browser:
        config = await browser.get("/auth/config")
        assert config.json() == {"oidc": None, "password": {"login": "/auth/password"}}
        signed_in = await sign_in(browser, "alice", ALICE_PASSWORD)
        assert signed_in.status_code == 200, signed_in.text
        assert signed_in.json() == {"user": "alice", "name": "Alice Example", "role": "operator", "next": "#/runs"}
        cookie = next(v for k, v in signed_in.headers.multi_items() if k == "set-cookie" and SESSION_COOKIE in v)
        assert "httponly" in cookie.lower()
        assert ALICE_PASSWORD not in cookie
        who = (await browser.get("/whoami")).json()
        assert (who["kind"], who["user"], who["role"], who["name"]) == ("person", "alice", "operator", "Alice Example")
        assert (await browser.get("/runs")).status_code == 200
        assert (await browser.get("/audit")).status_code == 200  # operator
        inbox = await browser.get("/human/inbox")  # the journal vouches for her to human-interaction
        assert inbox.status_code == 200, inbox.text
        copied = browser.cookies.get(SESSION_COOKIE)
        assert copied is not None

        out = await browser.post("/auth/logout", headers=CONSOLE)
        assert out.json() == {"provider_logout": None}
        assert (await browser.get("/whoami")).status_code == 401
    async with httpx.AsyncClient(base_url=stack.journal.url, cookies={SESSION_COOKIE: copied}) as thief:
        assert (await thief.get("/runs")).status_code == 401  # the same revocation as an OIDC session


async def test_a_password_without_a_console_role_opens_only_the_inbox(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.journal.url, timeout=20) as browser:
        signed_in = await sign_in(browser, "bob", BOB_PASSWORD)
        assert signed_in.status_code == 200, signed_in.text
        assert (signed_in.json()["role"], signed_in.json()["next"]) == (None, "#/inbox")
        assert (await browser.get("/runs")).status_code == 403
        assert (await browser.get("/human/inbox")).status_code == 200


async def test_every_refusal_is_the_same_401_and_is_audited_without_the_password(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.journal.url, timeout=20) as client:
        refusals = [
            await sign_in(client, "alice", "not-alices-password"),  # a wrong password
            await sign_in(client, "nobody", ALICE_PASSWORD),  # no such user
            await sign_in(client, "dana", "dana-has-no-password"),  # a user without a password
        ]
        assert [(r.status_code, r.json()) for r in refusals] == [(401, REFUSED)] * 3
        assert client.cookies.get(SESSION_COOKIE) is None  # nobody was signed in

        async def audited() -> list[dict[str, Any]] | None:
            answer = await client.get("/audit", params={"kind": "access_refusal"}, headers=OPERATOR)
            entries = [e for e in answer.json()["entries"] if e["details"]["reason"] == "password_refused"]
            return entries if len(entries) >= 3 else None

        entries = await eventually(audited, what="the three refused sign-ins in /audit")
        # directory users by their id; "nobody" names no one: a keyed digest of what was typed, never the text
        principals = sorted(e["details"]["principal"] for e in entries)
        assert principals[1:] == ["user:alice", "user:dana"]
        assert re.fullmatch(r"unknown-user:[0-9a-f]{12}", principals[0]), principals
        assert sorted(e["actor"] for e in entries) == principals  # a person (or an unknown id), no token
        assert {(e["details"]["status"], e["details"]["path"], e["details"]["address"]) for e in entries} == {
            (401, "/auth/password", "127.0.0.1")
        }
        trail = (await client.get("/audit", headers=OPERATOR)).text
        for secret in ("not-alices-password", ALICE_PASSWORD, "dana-has-no-password", "$argon2id$"):
            assert secret not in trail


async def test_a_password_typed_as_the_user_id_is_recorded_nowhere(
    stack: Stack, capfd: pytest.CaptureFixture[str]
) -> None:
    """The review's finding: a password typed into the user id field was journaled (``user:<it>``) and logged by
    both services. Now only a keyed digest of it is: the same for the same text, so probes still group."""
    typed = "Sup3r-S3cret-Passw0rd!"
    with structlog.testing.capture_logs() as logs:
        async with httpx.AsyncClient(base_url=stack.journal.url, timeout=20) as client:
            for _ in range(2):
                assert (await sign_in(client, typed, "x")).status_code == 401
            assert (await sign_in(client, f"{typed}2", "x")).status_code == 401
            assert (await sign_in(client, typed, "x")).status_code == 401  # its third: the user limit (3 here)
            limited = await sign_in(client, typed, "x")
            assert limited.status_code == 429, limited.text

            async def audited() -> list[dict[str, Any]] | None:
                answer = await client.get("/audit", params={"kind": "access_refusal"}, headers=OPERATOR)
                entries = [e for e in answer.json()["entries"] if e["details"]["reason"] == "password_refused"]
                return entries if len(entries) >= 2 else None

            entries = await eventually(audited, what="the refused sign-ins in /audit")
            names = {e["details"]["principal"] for e in entries}
            assert len(names) == 2, names
            assert all(re.fullmatch(r"unknown-user:[0-9a-f]{12}", n) for n in names), names
            first = next(e for e in entries if e["details"]["count"] == 1 and e["details"]["principal"] in names)
            assert first["actor"] == first["details"]["principal"]
            events = (await client.get("/events", params={"type": "api.access_refused"}, headers=OPERATOR)).text
            trail = (await client.get("/audit", headers=OPERATOR)).text
    refused = [e for e in logs if e["event"] in ("signin.password_refused", "signin.password_rate_limited")]
    assert [e["event"] for e in refused].count("signin.password_refused") == 4
    assert {e["user"] for e in refused} == names
    human = [e for e in logs if e["event"] == "passwords.refused"]
    assert len(human) == 4, human
    assert all(e["user_known"] is False and "user_id" not in e for e in human), human
    written = capfd.readouterr()
    for where, text in {
        "/audit": trail,
        "/events": events,
        "the logs": repr(logs),
        "stdout": written.out,
        "stderr": written.err,
    }.items():
        assert typed not in text, f"the typed text is in {where}"


async def test_the_consoles_whoami_probe_is_not_audited_and_an_ended_session_says_so(stack: Stack) -> None:
    """Every console load asks /whoami with no credential: a 401, not journaled as a refusal; a bad token there
    still is. A session signed out in another tab (a copy of its cookie) is a 401 session_ended, not "send a
    bearer token"."""
    audit = stack.journal.runtime.access_audit
    assert audit is not None
    counted: list[tuple[str, str]] = []  # what the journal told its audit (one window's refusals share one event)
    told = audit.refused

    def spy(**refusal: Any) -> None:
        counted.append((refusal["request"].path, refusal["reason"]))
        told(**refusal)

    audit.refused = spy  # type: ignore[method-assign]
    async with (
        httpx.AsyncClient(base_url=stack.journal.url, timeout=20) as tab,
        httpx.AsyncClient(base_url=stack.journal.url, timeout=20) as other_tab,
    ):
        for _ in range(3):
            probe = await tab.get("/whoami")
            assert (probe.status_code, probe.json()) == (401, {"error": "unauthorized", "detail": NOT_SIGNED_IN})
        bad = await tab.get("/whoami", headers={"Authorization": "Bearer not-a-valid-token-0123456789"})
        assert (bad.status_code, bad.json()["error"]) == (401, "invalid_token")
        anonymous = await tab.get("/runs")
        assert (anonymous.status_code, anonymous.json()["error"]) == (401, "unauthorized")

        assert (await sign_in(tab, "alice", ALICE_PASSWORD)).status_code == 200
        other_tab.cookies.set(SESSION_COOKIE, tab.cookies[SESSION_COOKIE])  # the same browser's other tab
        assert (await tab.post("/auth/logout", headers=CONSOLE)).status_code == 200
        cancel = await other_tab.post("/runs/run-1/cancel", json={"reason": "stop it"}, headers=CONSOLE)
        assert cancel.status_code == 401, cancel.text
        assert cancel.json() == {"error": "session_ended", "detail": SESSION_ENDED}
        assert "sign in again" in SESSION_ENDED

        assert counted == [
            ("/whoami", "invalid_token"),
            ("/runs", "unauthorized"),
            ("/runs/run-1/cancel", "session_ended"),
        ]

        async def audited() -> list[dict[str, Any]] | None:  # the first of the window is in the trail at once
            answer = await tab.get("/audit", params={"kind": "access_refusal"}, headers=OPERATOR)
            entries = [e["details"] for e in answer.json()["entries"] if e["details"]["path"] == "/whoami"]
            return entries or None

        entries = await eventually(audited, what="the bad token's refusal in /audit")
        assert {e["reason"] for e in entries} == {"invalid_token"}  # (a window's total may follow, same first)


async def test_repeated_failures_are_a_429_with_retry_after_per_user_and_per_address(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.journal.url, timeout=20) as client:
        for _ in range(3):  # TEMPORALITY_JOURNAL_PASSWORD_MAX_FAILURES=3 here
            assert (await sign_in(client, "alice", "guess-guess-guess")).status_code == 401
        limited = await sign_in(client, "alice", ALICE_PASSWORD)  # even the right one: not checked now
        assert limited.status_code == 429, limited.text
        assert limited.json()["error"] == "too_many_attempts"
        assert 1 <= int(limited.headers["Retry-After"]) <= 900
        assert client.cookies.get(SESSION_COOKIE) is None
        # another user from the same address may still sign in ...
        assert (await sign_in(client, "bob", BOB_PASSWORD)).status_code == 200
        # ... until the address has its five failures (MAX_FAILURES_PER_ADDRESS=5 here)
        assert (await sign_in(client, "bob", "guess-guess-guess")).status_code == 401
        assert (await sign_in(client, "dana", "guess-guess-guess")).status_code == 401
        blocked = await sign_in(client, "dana", "guess-guess-guess")
        assert blocked.status_code == 429
        assert "Retry-After" in blocked.headers


async def test_someone_else_s_failures_do_not_lock_a_person_out_of_their_own_address_and_spread_ones_are_bounded(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> None:
    """The review: five wrong passwords for alice from anywhere locked alice out for 15 minutes from every address.
    Now the hard block is per user id and address; across addresses the user id has ten times as many."""
    (tmp_path / "vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    async with serve_human(tmp_path, nats_settings, tmp_path / "vouch-secret", users=users_file()) as human_url:
        settings = password_settings(
            tmp_path, nats_settings, human_url, password_max_failures=2, password_max_failures_per_address=100
        )
        settings = settings.model_copy(update={"process": ProcessSettings(forwarded_allow_ips="127.0.0.1")})
        async with (
            serve_journal(settings, bus) as journal,
            httpx.AsyncClient(base_url=journal.url, timeout=20) as client,
        ):

            async def attempt(password: str, address: str) -> httpx.Response:
                client.cookies.clear()
                return await client.post(
                    "/auth/password",
                    json={"user": "alice", "password": password},
                    headers={**CONSOLE, "X-Forwarded-For": address},
                )

            guesser, alice_desk = "203.0.113.66", "198.51.100.7"
            assert [(await attempt("guess-guess-guess", guesser)).status_code for _ in range(3)] == [401, 401, 429]
            assert (await attempt(ALICE_PASSWORD, guesser)).status_code == 429  # blocked there, even the right one
            mine = await attempt(ALICE_PASSWORD, alice_desk)
            assert mine.status_code == 200, mine.text  # ... but alice at her own desk signs in
            # guesses spread over addresses: 2 per address, 20 (10 x 2) for alice in all, the first two included
            statuses = [(await attempt("guess-guess-guess", f"192.0.2.{n // 2}")).status_code for n in range(18)]
            assert statuses == [401] * 18
            spread = await attempt("guess-guess-guess", "192.0.2.200")
            assert spread.status_code == 429, spread.text
            assert 1 <= int(spread.headers["Retry-After"]) <= 900
            assert (await attempt(ALICE_PASSWORD, alice_desk)).status_code == 429  # bounded: alice waits too
            # bob is not affected by any of it
            bob = await client.post(
                "/auth/password",
                json={"user": "bob", "password": BOB_PASSWORD},
                headers={**CONSOLE, "X-Forwarded-For": guesser},
            )
            assert bob.status_code == 200, bob.text


async def test_malformed_sign_ins_and_those_without_the_console_header_are_refused(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.journal.url, timeout=20) as client:
        no_header = await client.post("/auth/password", json={"user": "alice", "password": ALICE_PASSWORD})
        assert no_header.status_code == 403
        assert no_header.json() == {
            "error": "console_header_missing",
            "detail": "signing in needs the header X-Temporality-Console: 1 (the console sends it)",
        }
        form = await client.post(  # a form another site could post: no console header, refused the same
            "/auth/password", data={"user": "alice", "password": ALICE_PASSWORD}
        )
        assert form.status_code == 403
        bodies: list[object] = [{"user": "alice"}, {"user": "", "password": "x"}, {"user": "alice", "password": 5}, []]
        for body in bodies:
            bad = await client.post("/auth/password", json=body, headers=CONSOLE)
            assert bad.status_code == 422, (body, bad.text)
            assert bad.json()["error"] in ("invalid_body", "invalid_json")
        assert client.cookies.get(SESSION_COOKIE) is None


async def test_human_interaction_unreachable_is_a_503_and_signs_nobody_in(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> None:
    (tmp_path / "vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    async with (
        serve_journal(password_settings(tmp_path, nats_settings, None), bus) as journal,
        httpx.AsyncClient(base_url=journal.url, timeout=30) as client,
    ):
        answer = await sign_in(client, "alice", ALICE_PASSWORD)
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"] == "directory_unreachable"
        assert "human-interaction" in answer.json()["detail"]
        assert answer.headers["Retry-After"] == "5"
        assert client.cookies.get(SESSION_COOKIE) is None


def test_password_sign_in_needs_a_session_secret(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="TEMPORALITY_JOURNAL_SESSION_SECRET_FILE"):
        Settings(password_signin=True)


async def test_console_sign_in_with_the_directory_account_by_keyboard(
    stack: Stack, browser_context: BrowserContext
) -> None:
    page = await browser_context.new_page()
    await page.goto(f"{stack.journal.url}/console/")
    user = page.get_by_label("User id")
    await expect(user).to_be_visible(timeout=WAIT_MS)
    await expect(user).to_be_focused()
    await expect(page.locator("#token")).to_be_visible()  # the API token sign-in stays

    await user.fill("alice")
    await page.keyboard.press("Tab")
    await page.keyboard.type("a-wrong-password")
    await page.keyboard.press("Enter")
    await expect(page.locator("#message")).to_have_text("Not signed in: unknown user or wrong password.")
    await expect(page.get_by_label("Password", exact=True)).to_be_focused()
    await expect(page.get_by_label("Password", exact=True)).to_have_value("")
    await console_screenshot(page, "signin-directory")

    await page.keyboard.type(ALICE_PASSWORD)
    await page.keyboard.press("Enter")
    await expect(page.locator("#who")).to_have_text("Alice Example (operator)", timeout=WAIT_MS)
    await expect(page.locator("#nav")).to_be_visible()
    await expect(page).to_have_url(re.compile(r"#/runs$"))
    assert SESSION_COOKIE not in await page.evaluate("document.cookie")  # HttpOnly
    assert not await page.evaluate("sessionStorage.length")  # nothing kept in the tab

    await page.locator("#sign-out").click()
    await expect(page.get_by_label("User id")).to_be_visible(timeout=WAIT_MS)
    assert await page.evaluate("fetch('/whoami').then((r) => r.status)") == 401


async def test_console_session_ended_in_another_tab_signs_in_again_back_to_the_run_with_the_reason_kept(
    stack: Stack, browser_context: BrowserContext, story: Callable[..., RunStory]
) -> None:
    """The review's path: alice, signed in with her directory account, types a cancel reason on a run; she has
    signed out in another tab; "Cancel run" says her session ended (not "send a bearer token"), she signs in
    again and is back on that run with her reason still typed. Also her Audit page and the wizard's words."""
    s = story(title="Review PR 77")
    await publish_recorded(stack.journal, s.requested(), s.created(), s.started())
    page = await browser_context.new_page()
    await page.goto(f"{stack.journal.url}/console/#/runs/{s.run_id}")
    await page.get_by_label("User id").fill("alice")
    await page.get_by_label("Password", exact=True).fill(ALICE_PASSWORD)
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(re.compile(rf"#/runs/{s.run_id}$"), timeout=WAIT_MS)
    reason = page.get_by_label("Reason")
    await reason.fill("the PR was closed upstream")

    other = await browser_context.new_page()  # the same browser: the same cookie
    await other.goto(f"{stack.journal.url}/console/#/runs")
    await expect(other.locator("#who")).to_have_text("Alice Example (operator)", timeout=WAIT_MS)
    await other.locator("#sign-out").click()
    await expect(other.get_by_label("User id")).to_be_visible(timeout=WAIT_MS)
    await other.close()

    await page.get_by_role("button", name="Cancel run").click()
    alert = page.get_by_role("alert")
    await expect(alert).to_have_text(
        "Your session ended (signed out, expired, or changed in the directory): sign in again.", timeout=WAIT_MS
    )
    await expect(page.get_by_label("User id")).to_be_visible()
    await expect(page).to_have_url(re.compile(rf"#/runs/{s.run_id}$"))  # still her run's address
    await page.get_by_label("User id").fill("alice")
    await page.get_by_label("Password", exact=True).fill(ALICE_PASSWORD)
    await page.keyboard.press("Enter")
    await expect(page.locator("#who")).to_have_text("Alice Example (operator)", timeout=WAIT_MS)
    await expect(page).to_have_url(re.compile(rf"#/runs/{s.run_id}$"))
    await expect(page.get_by_label("Reason")).to_have_value("the PR was closed upstream", timeout=WAIT_MS)
    await expect(alert).to_be_hidden()
    assert await page.evaluate("sessionStorage.length") == 0  # the kept reason is back in its field, not kept

    # the wizard speaks of roles to a person, not of tokens
    await page.goto(f"{stack.journal.url}/console/#/wizard")
    await expect(page.locator("#view")).to_contain_text(
        "Creating and changing triggers needs the admin role.", timeout=WAIT_MS
    )

    # the Audit page (operators): her own refused sign-in is there; filtered and opened by keyboard
    assert (
        await page.request.post(
            f"{stack.journal.url}/auth/password", data={"user": "dana", "password": "not-danas"}, headers=CONSOLE
        )
    ).status == 401
    await page.get_by_role("link", name="Audit").click()
    await expect(page).to_have_url(re.compile(r"#/audit$"), timeout=WAIT_MS)
    await page.get_by_label("Kind").focus()
    await page.get_by_label("Kind").select_option("access_refusal")
    await page.get_by_label("Who").focus()
    await page.keyboard.type("user:dana")
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(re.compile(r"#/audit\?kind=access_refusal&actor=user%3Adana$"), timeout=WAIT_MS)
    rows = page.locator("#audit tbody tr[data-id]")
    await expect(rows).to_have_count(1, timeout=WAIT_MS)
    await expect(rows.first).to_contain_text("refused API access and sign-ins")
    await expect(rows.first).to_contain_text("user:dana")
    await expect(rows.first).to_contain_text("password_refused")
    details = rows.first.locator("details")
    await details.locator("summary").focus()
    await page.keyboard.press("Enter")
    await expect(details.locator("pre")).to_be_visible()
    await expect(details.locator("pre")).to_contain_text('"principal": "user:dana"')
    assert "not-danas" not in await page.locator("#audit").inner_text()
    await console_screenshot(page, "audit")


async def test_console_of_a_directory_account_without_a_role_is_its_inbox(
    stack: Stack, browser_context: BrowserContext
) -> None:
    page = await browser_context.new_page()
    await page.goto(f"{stack.journal.url}/console/#/inbox")
    await page.get_by_label("User id").fill("bob")
    await page.get_by_label("Password", exact=True).fill(BOB_PASSWORD)
    await page.get_by_role("button", name="Sign in with your directory account").click()
    await expect(page.locator("#inbox-who")).to_have_text("Signed in to the inbox as bob", timeout=WAIT_MS)
    await expect(page.locator("#who")).to_have_text("Bob Example (inbox only)")
    await expect(page.locator("#nav")).to_be_hidden()


# --------------------------------------------------------------------------- OIDC: the directory's role as fallback
#: At the provider: alice is in a mapped group (viewer), dana and bob in none.
PEOPLE = {
    "alice": {"preferred_username": "alice", "name": "Alice Example", "groups": ["staff"]},
    "dana": {"preferred_username": "dana", "name": "Dana Admin", "groups": ["elsewhere"]},
    "bob": {"preferred_username": "bob", "name": "Bob Example", "groups": []},
}


def with_oidc(settings: Settings, tmp_path: Path, idp: OidcEmulator, directory_roles: bool) -> Settings:
    port = free_port()
    (tmp_path / "client-secret").write_text(idp.client_secret, encoding="utf-8")
    idp.redirect_uris = [f"http://127.0.0.1:{port}/auth/callback"]
    return settings.model_copy(
        update={
            "port": port,
            "password_signin": False,
            "oidc_issuer": idp.issuer,
            "oidc_client_id": idp.client_id,
            "oidc_client_secret_file": tmp_path / "client-secret",
            "oidc_redirect_base_url": f"http://127.0.0.1:{port}",
            "oidc_user_claim": "preferred_username",
            "oidc_role_map": {"staff": "viewer"},
            "oidc_directory_roles": directory_roles,
        }
    )


async def _role_after_oidc_sign_in(journal: ServedJournal, idp: OidcEmulator, login: str) -> str | None:
    async with httpx.AsyncClient(base_url=journal.url, timeout=20) as browser:
        answer = await oidc_sign_in(browser, idp, login)
        assert answer.status_code == 302, answer.text
        role: str | None = (await browser.get("/whoami")).json()["role"]
        return role


@pytest.mark.parametrize("directory_roles", [True, False])
async def test_an_oidc_sign_in_without_a_mapped_role_takes_the_directory_role_when_configured(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, directory_roles: bool
) -> None:
    (tmp_path / "vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    async with (
        OidcEmulator(people=PEOPLE).serve() as idp,
        serve_human(tmp_path, nats_settings, tmp_path / "vouch-secret", users=users_file()) as human_url,
    ):
        settings = with_oidc(password_settings(tmp_path, nats_settings, human_url), tmp_path, idp, directory_roles)
        async with serve_journal(settings, bus) as journal:
            roles = {login: await _role_after_oidc_sign_in(journal, idp, login) for login in PEOPLE}
    if directory_roles:
        # the map's role wins even when the directory's is higher (alice: operator there); dana: none mapped,
        # admin in the directory; bob: neither
        assert roles == {"alice": "viewer", "dana": "admin", "bob": None}
    else:
        assert roles == {"alice": "viewer", "dana": None, "bob": None}


async def test_directory_roles_without_human_interaction_give_no_role(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> None:
    (tmp_path / "vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    async with OidcEmulator(people=PEOPLE).serve() as idp:
        settings = with_oidc(password_settings(tmp_path, nats_settings, None), tmp_path, idp, True)
        async with serve_journal(settings, bus) as journal:
            assert await _role_after_oidc_sign_in(journal, idp, "dana") is None  # least privilege: the inbox
            assert await _role_after_oidc_sign_in(journal, idp, "alice") == "viewer"  # the map needs nobody


async def test_attempt_limits_slide_with_the_window_and_a_success_clears_the_user_at_its_address(bus: Bus) -> None:
    now = [1000.0]
    limits = AttemptLimits(
        bus,
        max_per_user=2,
        max_per_address=3,
        window_s=60,
        clock=lambda: now[0],
        key_secret=b"k" * 32,
        max_per_user_anywhere=4,
    )

    async def wait(user: str, address: str | None) -> int | None:
        """Seconds to wait, or None: the attempt was counted (and then taken back, to keep the counts)."""
        try:
            attempt = await limits.reserve(user, address)
        except Exhausted as full:
            return full.retry_after_s
        await limits.release(attempt)
        return None

    await limits.reserve("alice", "10.0.0.1")  # an attempt never taken back is a failure
    now[0] += 10
    assert await wait("alice", "10.0.0.1") is None
    await limits.reserve("Alice", "10.0.0.1")  # the same user id, however it is capitalised
    assert await wait("alice", "10.0.0.1") == 50  # until the first failure is 60 s old
    assert await wait("alice", "10.0.0.2") is None  # from elsewhere (alice's own desk) she is not blocked
    now[0] += 50
    assert await wait("alice", "10.0.0.1") is None  # it left the window
    # the user id across addresses: 4 here (default 10x the per-address limit), whatever the addresses
    for n in range(3):
        await limits.reserve("alice", f"10.1.0.{n}")
    assert await wait("alice", "10.1.0.9") == 10  # 1010 and three now: full until 1010 + 60
    assert await wait("alice", "10.0.0.2") == 10
    now[0] += 10
    assert await wait("alice", "10.1.0.9") is None
    for user in ("bob", "ivan", "judy"):  # the address's failures within the window: three now
        await limits.reserve(user, "10.0.0.1")
    assert await wait("carol", "10.0.0.1") == 60
    assert await wait("carol", "10.0.0.9") is None
    # a limit reached refuses the attempt without counting it against the others
    await limits.reserve("dana", "10.0.0.7")
    await limits.reserve("dana", "10.0.0.7")
    assert await wait("dana", "10.0.0.7") == 60
    assert await wait("erin", "10.0.0.7") is None  # the address holds only dana's two
    assert await wait("dana", "10.0.0.8") is None  # dana's count across addresses: two
    # a success clears the user at its address and takes its own attempt back from the other counts
    await limits.reserve("frank", "10.0.0.5")
    await limits.reserve("frank", "10.0.0.6")
    success = await limits.reserve("frank", "10.0.0.5")
    await limits.succeeded(success)
    assert await wait("frank", "10.0.0.5") is None
    await limits.reserve("frank", "10.0.0.5")
    assert await wait("frank", "10.0.0.5") is None  # one at 10.0.0.5 (the failure before the success is gone)
    await limits.reserve("frank", "10.0.0.9")
    assert await wait("frank", "10.0.0.3") == 60  # four across addresses: the success did not clear the others'
    assert await wait("gina", "10.0.0.5") is None  # 10.0.0.5 holds two: frank's success is not among them


async def test_attempt_limit_keys_are_keyed_digests_of_the_typed_id(bus: Bus) -> None:
    """A typed user id (sometimes a password typed into the wrong field) is in the shared bucket only as a digest
    keyed with the journal's secret: not the plain SHA-256 anyone could compute from a guess, and another secret
    gives other keys."""
    typed = "Sup3r-S3cret-Passw0rd!"
    await AttemptLimits(bus, 5, 5, 60, key_secret=b"a" * 32).reserve(typed, "10.0.0.1")
    await AttemptLimits(bus, 5, 5, 60, key_secret=b"b" * 32).reserve(typed, "10.0.0.1")
    store = await bus.store(BUCKET_SIGNIN_FAILURES, Failures)
    keys = set(await store.keys())
    keyed = {limit_key("user", typed.casefold(), secret) for secret in (b"a" * 32, b"b" * 32)}
    assert len(keyed) == 2  # one per secret
    assert keyed <= keys
    plain = hashlib.sha256(typed.casefold().encode()).hexdigest()[:40]
    assert f"user.{plain}" not in keys
    assert all(typed.casefold() not in k and plain not in k for k in keys)
