"""What a security review reproduced, over real HTTP (the journal on a real port, human-interaction checking passwords
over a real bus):

* the client address the sign-in limits and the audit trail use is the TCP peer unless the peer is a proxy named in
  ``TEMPORALITY_FORWARDED_ALLOW_IPS``: a forged ``X-Forwarded-For`` neither rotates past the per-address limit nor
  names another address in the trail;
* the audit trail's events are the operator's on every read path: a viewer's ``/events`` and ``/events/stream``
  leave them out, and ``/events/stream?audited=true`` is a 403 for a viewer, as ``/audit`` is;
* a live tail opened with a sign-in session ends once the session is signed out (before the next batch, and by
  the periodic re-check while idle);
* a request body trickled slower than ``TEMPORALITY_HTTP_BODY_TIMEOUT_S`` is a 408 and the connection is closed.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from journal_support import OPERATOR, VIEWER, ServedJournal, eventually, publish_recorded, serve_human, serve_journal
from test_journal_password_signin import ALICE_PASSWORD, CONSOLE, password_settings, sign_in, users_file
from test_journal_tail import SseReader

from temporality_bus import Bus, NatsSettings
from temporality_journal import tail as tail_module
from temporality_journal.api import OPERATOR_ONLY_TYPES
from temporality_journal.signin import SESSION_COOKIE
from temporality_service.settings import ProcessSettings

MakeStory = Any  # journal_support.RunStory


@asynccontextmanager
async def journal_with_passwords(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, **process: Any
) -> AsyncIterator[ServedJournal]:
    """The journal with password sign-in (alice: operator), a per-address limit of 3 failures, and ``process``
    (``TEMPORALITY_*``: the proxies believed, the body deadline)."""
    (tmp_path / "vouch-secret").write_text(secrets.token_urlsafe(32), encoding="utf-8")
    async with serve_human(tmp_path, nats_settings, tmp_path / "vouch-secret", users=users_file()) as human_url:
        settings = password_settings(
            tmp_path, nats_settings, human_url, password_max_failures=50, password_max_failures_per_address=3
        )
        settings = settings.model_copy(update={"process": ProcessSettings(**process)})
        async with serve_journal(settings, bus) as journal:
            yield journal


async def _wrong(client: httpx.AsyncClient, user: str, forwarded_for: str) -> int:
    answer = await client.post(
        "/auth/password",
        json={"user": user, "password": "guess-guess-guess"},
        headers={**CONSOLE, "X-Forwarded-For": forwarded_for},
    )
    return answer.status_code


async def _refusal_addresses(client: httpx.AsyncClient, at_least: int) -> set[str]:
    async def audited() -> set[str] | None:
        answer = await client.get("/audit", params={"kind": "access_refusal"}, headers=OPERATOR)
        entries = [e for e in answer.json()["entries"] if e["details"]["reason"] == "password_refused"]
        return {e["details"]["address"] for e in entries} if len(entries) >= at_least else None

    return await eventually(audited, what=f"{at_least} refused sign-ins in /audit")


async def test_a_forged_x_forwarded_for_changes_nothing_by_default(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> None:
    async with (
        journal_with_passwords(tmp_path, nats_settings, bus) as journal,
        httpx.AsyncClient(base_url=journal.url, timeout=20) as client,
    ):
        # three failures, each "from" another address: all are 127.0.0.1's, the fourth attempt is refused
        assert [await _wrong(client, f"user{i}", f"198.51.100.{i}") for i in range(3)] == [401] * 3
        assert await _wrong(client, "user9", "198.51.100.9") == 429
        limited = await client.post(
            "/auth/password",
            json={"user": "alice", "password": ALICE_PASSWORD},
            headers={**CONSOLE, "X-Forwarded-For": "203.0.113.77"},
        )
        assert limited.status_code == 429  # the address is blocked, whatever the header says
        assert await _refusal_addresses(client, 3) == {"127.0.0.1"}  # the trail names the real peer
        # the audit's actor of an anonymous refusal: the peer too
        await client.get("/runs", headers={"X-Forwarded-For": "203.0.113.5", "Authorization": "Bearer wrong"})

        async def bad_token() -> list[dict[str, Any]] | None:
            answer = await client.get("/audit", params={"kind": "access_refusal"}, headers=OPERATOR)
            found = [e for e in answer.json()["entries"] if e["details"]["path"] == "/runs"]
            return found or None

        assert {e["actor"] for e in await eventually(bad_token, what="the refused token")} == {"address:127.0.0.1"}


async def test_a_named_proxy_s_x_forwarded_for_is_the_client_address(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> None:
    async with (
        journal_with_passwords(tmp_path, nats_settings, bus, forwarded_allow_ips="127.0.0.1") as journal,
        httpx.AsyncClient(base_url=journal.url, timeout=20) as client,
    ):
        # behind the proxy each person is their own address: four failures from four, none limited
        assert [await _wrong(client, f"user{i}", f"198.51.100.{i}") for i in range(4)] == [401] * 4
        # ... and one address is limited on its own
        assert [await _wrong(client, f"other{i}", "203.0.113.8") for i in range(4)] == [401, 401, 401, 429]
        signed_in = await client.post(
            "/auth/password",
            json={"user": "alice", "password": ALICE_PASSWORD},
            headers={**CONSOLE, "X-Forwarded-For": "203.0.113.9"},
        )
        assert signed_in.status_code == 200, signed_in.text  # another person behind the same proxy is not
        addresses = await _refusal_addresses(client, 7)
        assert addresses == {f"198.51.100.{i}" for i in range(4)} | {"203.0.113.8"}


async def test_a_viewer_never_reads_the_audit_trail(served_journal: ServedJournal, story: MakeStory) -> None:
    async with httpx.AsyncClient(base_url=served_journal.url, timeout=20) as client:
        s = story()
        await publish_recorded(served_journal, s.requested())
        assert (await client.get("/audit", headers=VIEWER)).status_code == 403  # audited: api.access_refused

        async def refused() -> list[dict[str, Any]] | None:
            answer = await client.get("/events", params={"type": "api.access_refused"}, headers=OPERATOR)
            return answer.json()["events"] or None

        await eventually(refused, what="the viewer's refusal in the operator's /events")
        as_viewer = await client.get("/events", params={"type": "api.access_refused"}, headers=VIEWER)
        assert as_viewer.status_code == 200
        assert as_viewer.json()["events"] == []
        everything = (await client.get("/events", params={"limit": 1000}, headers=VIEWER)).json()["events"]
        assert s.run_id in {e["run_id"] for e in everything}  # the run's events still are the viewer's
        assert not {e["type"] for e in everything} & {"api.access_refused", "human.directory.changed"}
        assert {"api.access_refused", "human.directory.changed", "bus.permission_refused"} <= set(OPERATOR_ONLY_TYPES)
        # what /triggers and a run's timeline show a viewer anyway stays theirs (the console's live pages follow it),
        # and the dead letters (the runbook's GET /events?type=bus.dead_lettered)
        viewers = {
            "trigger.created",
            "run.cancel_requested",
            "run.requested",
            "human.answer_refused",
            "bus.dead_lettered",
        }
        assert not viewers & set(OPERATOR_ONLY_TYPES)

        audited_tail = await client.get("/events/stream", params={"audited": "true"}, headers=VIEWER)
        assert audited_tail.status_code == 403
        assert audited_tail.json()["error"] == "forbidden"

        # the whole history, replayed: the viewer's tail leaves the trail out, the operator's has it
        async def replayed(headers: dict[str, str], until_type: str) -> list[str]:
            async with client.stream("GET", "/events/stream", params={"after": 0}, headers=headers) as response:
                assert response.status_code == 200
                reader = SseReader(response)
                await reader.next()  # ": tail after 0"
                types: list[str] = []
                while until_type not in types:
                    types.append((await reader.next_event()).event or "")
                return types

        marker = s.started()
        await publish_recorded(served_journal, marker)
        viewer_types = await replayed(VIEWER, marker.type)
        assert not set(viewer_types) & set(OPERATOR_ONLY_TYPES), viewer_types
        assert "api.access_refused" in await replayed(OPERATOR, "api.access_refused")


@asynccontextmanager
async def signed_in_tail(journal: ServedJournal) -> AsyncIterator[tuple[httpx.AsyncClient, SseReader, str]]:
    async with httpx.AsyncClient(base_url=journal.url, timeout=30) as browser:
        assert (await sign_in(browser, "alice", ALICE_PASSWORD)).status_code == 200
        cookie = browser.cookies.get(SESSION_COOKIE)
        assert cookie is not None
        async with browser.stream("GET", "/events/stream", headers=CONSOLE) as response:
            assert response.status_code == 200
            reader = SseReader(response)
            assert ((await reader.next()).comment or "").startswith("tail after")
            yield browser, reader, cookie


async def _sign_out(journal: ServedJournal, cookie: str) -> None:
    async with httpx.AsyncClient(base_url=journal.url, cookies={SESSION_COOKIE: cookie}, timeout=20) as other_tab:
        assert (await other_tab.post("/auth/logout", headers=CONSOLE)).status_code == 200


async def _ended(reader: SseReader) -> list[Any]:
    """What the stream still sends until it ends; it must end with the comment ``session ended``."""
    seen: list[Any] = []
    async with asyncio.timeout(20):
        while True:
            try:
                item = await reader.next(20)
            except AssertionError:  # "the stream ended"
                return seen
            seen.append(item)


async def test_a_signed_out_session_s_tail_ends_before_its_next_batch(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, story: MakeStory
) -> None:
    async with journal_with_passwords(tmp_path, nats_settings, bus) as journal, signed_in_tail(journal) as opened:
        browser, reader, cookie = opened
        s = story()
        await journal.bus.publish(s.requested())
        assert (await reader.next_event()).data["run_id"] == s.run_id  # the session holds: delivered
        await _sign_out(journal, cookie)
        await asyncio.sleep(1.1)  # past the least time between two checks before batches (1 s)
        await publish_recorded(journal, s.started())
        seen = await _ended(reader)
        assert [item.comment for item in seen] == ["session ended"], seen  # and not the event
        again = await browser.get("/events/stream", headers=CONSOLE)  # the console's reconnect
        assert (again.status_code, again.json()["error"]) == (401, "session_ended")


async def test_an_idle_tail_ends_at_the_periodic_check_once_its_session_is_signed_out(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tail_module, "RECHECK_S", 1.0)  # 30 s in service
    async with journal_with_passwords(tmp_path, nats_settings, bus) as journal, signed_in_tail(journal) as opened:
        _, reader, cookie = opened
        await _sign_out(journal, cookie)
        started = time.monotonic()
        assert [item.comment for item in await _ended(reader)] == ["session ended"]
        assert time.monotonic() - started < 15


def _trickle_sign_in(port: int, every_s: float, give_up_s: float) -> tuple[bytes, bool]:
    """A slow-loris client: the headers of an 8 KB sign-in at once (under its 8 KiB limit), then one byte every ``every_s``."""
    with socket.create_connection(("127.0.0.1", port), timeout=give_up_s) as sock:
        sock.sendall(
            b"POST /auth/password HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"X-Temporality-Console: 1\r\nContent-Length: 8000\r\n\r\n"
        )
        sock.settimeout(every_s)
        started, received = time.monotonic(), b""
        while not received and time.monotonic() - started < give_up_s:
            try:
                sock.sendall(b" ")
                received = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return b"", True
        sock.settimeout(5)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            return received, False
        except OSError:
            pass
        return received, True


async def test_a_body_trickled_byte_by_byte_is_a_408_and_the_connection_closed(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> None:
    async with journal_with_passwords(tmp_path, nats_settings, bus, http_body_timeout_s=1.0) as journal:
        port = int(journal.url.rsplit(":", 1)[1])
        answer, closed = await asyncio.to_thread(_trickle_sign_in, port, 0.2, 20)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer[:300]
        assert json.loads(body)["error"] == "body_timeout"
        assert closed
