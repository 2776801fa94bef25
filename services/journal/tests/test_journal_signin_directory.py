"""Issue 9's sign-in gaps, over real HTTP and a real bus: a change in the directory (a role, a password, the
account's removal, made through human-interaction's directory API) ends the sessions it signed in, on the
person's next request; the password attempt limits are shared by two journal replicas (NATS KV)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from journal_support import ADMIN, ServedJournal, eventually, oidc_sign_in, serve_human, serve_journal
from test_journal_password_signin import (
    ALICE_PASSWORD,
    BOB_PASSWORD,
    PEOPLE,
    REFUSED,
    password_settings,
    sign_in,
    users_file,
    with_oidc,
)

from temporality_bus import Bus, NatsSettings
from temporality_journal.directory_sessions import DirectoryEntry, DirectorySessions, changed, directory_mark
from temporality_journal.passwords import PasswordChecker
from temporality_journal.signin import SESSION_COOKIE
from temporality_service import Unavailable
from temporality_testing.oidc_emulator import OidcEmulator

#: How long a journal here reuses the directory's answer (the default is 2 s).
CHECK_S = 0.5


@dataclass
class Directory:
    """human-interaction's directory API, as an admin."""

    url: str

    async def change(self, user: str, **fields: Any) -> None:
        async with httpx.AsyncClient(base_url=self.url, headers=ADMIN, timeout=30) as admin:
            found = await admin.get(f"/directory/users/{user}")
            assert found.status_code == 200, found.text
            body = {**found.json(), **fields}
            changed = await admin.put(
                f"/directory/users/{user}", json=body, headers={"If-Match": found.headers["etag"]}
            )
            assert changed.status_code == 200, changed.text

    async def remove(self, user: str) -> None:
        async with httpx.AsyncClient(base_url=self.url, headers=ADMIN, timeout=30) as admin:
            removed = await admin.delete(f"/directory/users/{user}")
            assert removed.status_code == 204, removed.text


@dataclass
class Stack:
    journal: ServedJournal
    directory: Directory


@pytest.fixture
async def stack(tmp_path: Path, nats_settings: NatsSettings, bus: Bus) -> AsyncIterator[Stack]:
    (tmp_path / "vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    async with serve_human(tmp_path, nats_settings, tmp_path / "vouch-secret", users=users_file()) as human_url:
        settings = password_settings(tmp_path, nats_settings, human_url, session_directory_check_s=CHECK_S)
        async with serve_journal(settings, bus) as journal:
            yield Stack(journal, Directory(human_url))


@asynccontextmanager
async def signed_in(stack: Stack, user: str, password: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.journal.url, timeout=30) as browser:
        answer = await sign_in(browser, user, password)
        assert answer.status_code == 200, answer.text
        yield browser


async def until_signed_out(browser: httpx.AsyncClient, what: str) -> None:
    async def refused() -> bool | None:
        return True if (await browser.get("/whoami")).status_code == 401 else None

    await eventually(refused, what=what)


async def test_a_role_change_in_the_directory_ends_the_session_for_good(stack: Stack) -> None:
    async with signed_in(stack, "alice", ALICE_PASSWORD) as browser:
        assert (await browser.get("/audit")).status_code == 200  # operator
        copied = browser.cookies.get(SESSION_COOKIE)
        assert copied is not None

        await stack.directory.change("alice", console_role="viewer")
        await until_signed_out(browser, "alice's operator session ending after her role changed")
        assert (await browser.get("/runs")).status_code == 401
        assert browser.cookies.get(SESSION_COOKIE) is None  # the answer cleared the cookie

        # the role given back, the old session stays ended: it was recorded as revoked
        await stack.directory.change("alice", console_role="operator")
        async with httpx.AsyncClient(base_url=stack.journal.url, cookies={SESSION_COOKIE: copied}) as thief:
            for _ in range(3):
                assert (await thief.get("/whoami")).status_code == 401

        again = await sign_in(browser, "alice", ALICE_PASSWORD)  # a new sign-in takes the directory's role now
        assert again.status_code == 200, again.text
        assert again.json()["role"] == "operator"
        assert (await browser.get("/audit")).status_code == 200


async def test_a_password_change_ends_the_session_and_only_the_new_password_signs_in(stack: Stack) -> None:
    async with signed_in(stack, "alice", ALICE_PASSWORD) as browser:
        await stack.directory.change("alice", password="alice-new-password-42")
        await until_signed_out(browser, "alice's session ending after her password changed")
        old = await sign_in(browser, "alice", ALICE_PASSWORD)
        assert (old.status_code, old.json()) == (401, REFUSED)
        new = await sign_in(browser, "alice", "alice-new-password-42")
        assert new.status_code == 200, new.text
        assert (await browser.get("/whoami")).json()["user"] == "alice"


async def test_removing_the_account_ends_its_sessions_and_others_stay(stack: Stack) -> None:
    async with (
        signed_in(stack, "bob", BOB_PASSWORD) as bob,
        signed_in(stack, "alice", ALICE_PASSWORD) as alice,
    ):
        assert (await bob.get("/human/inbox")).status_code == 200
        await stack.directory.remove("bob")
        await until_signed_out(bob, "bob's session ending after his account was removed")
        assert (await bob.get("/human/inbox")).status_code == 401
        for _ in range(3):  # alice's account did not change: her session goes on
            assert (await alice.get("/runs")).status_code == 200
        assert (await sign_in(bob, "bob", BOB_PASSWORD)).status_code == 401


async def test_an_unchanged_directory_keeps_the_session(stack: Stack) -> None:
    async with signed_in(stack, "alice", ALICE_PASSWORD) as browser:
        # a change to something the sign-in does not depend on leaves it alone
        await stack.directory.change("alice", display_name="Alice Renamed")
        for _ in range(5):
            assert (await browser.get("/runs")).status_code == 200


async def test_two_journal_replicas_share_the_attempt_limits(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> None:
    (tmp_path / "vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    limits = {"password_max_failures": 4, "password_max_failures_per_address": 50}
    for replica in ("a", "b"):  # each its own database; the bus, the session key and the vouch secret shared
        (tmp_path / replica).mkdir()
        (tmp_path / replica / "vouch-secret").write_bytes((tmp_path / "vouch-secret").read_bytes())
    async with serve_human(tmp_path, nats_settings, tmp_path / "vouch-secret", users=users_file()) as human_url:
        first = password_settings(tmp_path / "a", nats_settings, human_url, **limits)
        second = password_settings(tmp_path / "b", nats_settings, human_url, **limits)
        second = second.model_copy(update={"session_secret_file": first.session_secret_file})  # one key for all
        async with serve_journal(first, bus) as a, serve_journal(second, bus) as b:
            async with (
                httpx.AsyncClient(base_url=a.url, timeout=30) as to_a,
                httpx.AsyncClient(base_url=b.url, timeout=30) as to_b,
            ):
                # four failures, alternately on each replica: each saw only two
                for client in (to_a, to_b, to_a, to_b):
                    assert (await sign_in(client, "alice", "guess-guess-guess")).status_code == 401
                for client in (to_a, to_b):  # both refuse now, even the right password, before checking it
                    limited = await sign_in(client, "alice", ALICE_PASSWORD)
                    assert limited.status_code == 429, limited.text
                    assert limited.json()["error"] == "too_many_attempts"
                    assert 1 <= int(limited.headers["Retry-After"]) <= 900
                # another user is not limited, and a success on one replica clears that user on the other
                for _ in range(3):
                    assert (await sign_in(to_b, "bob", "guess-guess-guess")).status_code == 401
                assert (await sign_in(to_a, "bob", BOB_PASSWORD)).status_code == 200
                for _ in range(3):
                    assert (await sign_in(to_b, "bob", "guess-guess-guess")).status_code == 401
                assert (await sign_in(to_b, "bob", BOB_PASSWORD)).status_code == 200
                # twelve attempts at once, six on each replica: each is counted before its password is checked,
                # so exactly the limit's four are checked (and refused) and the other eight never are
                tries = await asyncio.gather(
                    *(sign_in(client, "mallory", "guess-guess-guess") for client in (to_a, to_b) * 6)
                )
                assert sorted(t.status_code for t in tries) == [401] * 4 + [429] * 8, [t.text for t in tries]


async def test_an_oidc_session_with_the_directory_s_role_ends_when_that_role_changes(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> None:
    (tmp_path / "vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    async with (
        OidcEmulator(people=PEOPLE).serve() as idp,
        serve_human(tmp_path, nats_settings, tmp_path / "vouch-secret", users=users_file()) as human_url,
    ):
        base = password_settings(tmp_path, nats_settings, human_url, session_directory_check_s=CHECK_S)
        async with (
            serve_journal(with_oidc(base, tmp_path, idp, True), bus) as journal,
            httpx.AsyncClient(base_url=journal.url, timeout=30) as dana,
            httpx.AsyncClient(base_url=journal.url, timeout=30) as alice,
        ):
            assert (await oidc_sign_in(dana, idp, "dana")).status_code == 302  # admin: the directory's role
            assert (await dana.get("/whoami")).json()["role"] == "admin"
            assert (await oidc_sign_in(alice, idp, "alice")).status_code == 302  # viewer: the provider's groups
            assert (await alice.get("/whoami")).json()["role"] == "viewer"
            directory = Directory(human_url)
            await directory.change("dana", console_role="viewer")
            await until_signed_out(dana, "dana's admin session ending after her directory role changed")
            await directory.change("alice", console_role="admin")  # not where her role came from: no effect
            for _ in range(3):
                assert (await alice.get("/whoami")).json()["role"] == "viewer"


async def test_the_last_answer_stands_in_briefly_when_human_interaction_does_not_answer(bus: Bus) -> None:
    """No responder on the bus: a known answer younger than stale_s stands in; past that, Unavailable (the
    middleware's 503 directory_unreachable); never an answer made up."""
    now = [100.0]
    sessions = DirectorySessions(PasswordChecker(bus, timeout_s=0.5), ttl_s=2, stale_s=60, clock=lambda: now[0])
    sessions.remember("alice", "operator", "fp-1")
    now[0] += 1
    assert (await sessions.entry("alice")).fingerprint == "fp-1"  # fresh: not asked
    now[0] += 30
    stale = await sessions.entry("alice")  # asked, no answer: the last one, 31 s old
    assert (stale.role, stale.fingerprint) == ("operator", "fp-1")
    now[0] += 40
    with pytest.raises(Unavailable) as refused:  # 71 s old: refused
        await sessions.entry("alice")
    assert refused.value.code == "directory_unreachable"
    with pytest.raises(Unavailable):  # never asked before: refused at once
        await sessions.entry("bob")


def test_what_ends_a_session_and_what_does_not() -> None:
    password = directory_mark("password", "operator", "fp-1")
    assert changed(password, DirectoryEntry("operator", "fp-1", 0)) is None
    assert changed(password, DirectoryEntry("operator", "fp-2", 0)) == "account"  # a new password
    assert changed(password, DirectoryEntry("viewer", "fp-3", 0)) == "role"
    assert changed(password, DirectoryEntry(None, None, 0)) == "role"  # removed
    # a human-interaction from before fingerprints (an upgrade under way): the role is all it tells
    assert changed(password, DirectoryEntry("operator", None, 0)) is None
    assert changed(password, DirectoryEntry("admin", None, 0)) == "role"
    no_role = directory_mark("password", None, "fp-1")
    assert changed(no_role, DirectoryEntry(None, None, 0)) == "account"  # removed: no fingerprint any more
    assert changed(no_role, DirectoryEntry(None, "fp-1", 0)) is None
    oidc = directory_mark("role", "admin", None)
    assert changed(oidc, DirectoryEntry("admin", "fp-9", 0)) is None  # a password change is not the provider's
    assert changed(oidc, DirectoryEntry(None, None, 0)) == "role"
