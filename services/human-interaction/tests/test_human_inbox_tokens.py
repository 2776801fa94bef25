"""Inbox tokens, as the security review found them, against the real service (its own ``configure``/``setup`` on a
real port and nats-server):

* wrong bearer tokens -- inbox tokens and API role tokens alike -- are limited per client address: past
  ``TEMPORALITY_API_MAX_FAILURES_PER_ADDRESS`` a 429 with ``Retry-After`` (the right token too), other addresses
  unaffected, the address the one ``TEMPORALITY_FORWARDED_ALLOW_IPS`` lets a proxy name;
* a new inbox token through the directory API has at least 24 characters, while a shorter one already in the
  users file (the floor was 8) still opens the inbox, with a warning.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from human_support import ALICE, ALICE_BOB_AND_API_OWNERS, BOB, service_settings
from replica_support import replica
from structlog.testing import capture_logs

from temporality_bus import NatsSettings
from temporality_human_interaction.directory import MIN_INBOX_TOKEN, Directory, DirectoryError
from temporality_service import ApiAuthSettings
from temporality_service.settings import ProcessSettings

OPS = {"Authorization": "Bearer human-test-admin-token-0123456789"}
LIMIT = 5


def _from(address: str, headers: dict[str, str] | None = None) -> dict[str, str]:
    return {**(headers or {}), "X-Forwarded-For": address}


@pytest.fixture
async def human(tmp_path: Path, nats_settings: NatsSettings) -> AsyncIterator[httpx.AsyncClient]:
    settings = service_settings(tmp_path, nats_settings, ALICE_BOB_AND_API_OWNERS)
    settings = settings.model_copy(
        update={
            "api": ApiAuthSettings(tokens_file=tmp_path / "tokens.json", max_failures_per_address=LIMIT),
            # the test client is the proxy: X-Forwarded-For names each client
            "process": ProcessSettings(forwarded_allow_ips="127.0.0.1"),
        }
    )
    async with replica(settings) as url, httpx.AsyncClient(base_url=url, timeout=20) as client:
        yield client


async def test_wrong_inbox_tokens_from_one_address_get_429_and_others_are_unaffected(
    human: httpx.AsyncClient,
) -> None:
    guesser = "203.0.113.7"
    wrong = {"Authorization": "Bearer guess-guess-guess"}
    for _ in range(LIMIT):  # the review's 200 wrong tokens in a row were all 401s
        answer = await human.get("/inbox", headers=_from(guesser, wrong))
        assert answer.status_code == 401
    for headers in (wrong, ALICE, OPS):  # the right inbox token, an API token: all 429 from there now
        limited = await human.get(
            "/inbox" if headers is not OPS else "/directory/users", headers=_from(guesser, headers)
        )
        assert limited.status_code == 429, limited.text
        assert limited.json()["error"] == "too_many_failures"
        assert 1 <= int(limited.headers["Retry-After"]) <= 300
    # alice and bob from their own addresses read their inboxes as before, the operator the directory
    assert (await human.get("/inbox", headers=_from("198.51.100.1", ALICE))).status_code == 200
    assert (await human.get("/inbox", headers=_from("198.51.100.2", BOB))).status_code == 200
    assert (await human.get("/directory/users", headers=_from("198.51.100.3", OPS))).status_code == 200
    # without a token from the guesser's address: the usual 401, not a 429
    assert (await human.get("/inbox", headers=_from(guesser))).status_code == 401


async def test_wrong_api_tokens_and_wrong_inbox_tokens_count_together(human: httpx.AsyncClient) -> None:
    scanner = "203.0.113.8"
    for _ in range(LIMIT - 2):
        refused = await human.get("/directory/users", headers=_from(scanner, {"Authorization": "Bearer " + "x" * 30}))
        assert refused.status_code == 401
    for _ in range(2):
        refused = await human.get("/inbox", headers=_from(scanner, {"Authorization": "Bearer not-an-inbox-token"}))
        assert refused.status_code == 401
    assert (await human.get("/inbox", headers=_from(scanner, ALICE))).status_code == 429
    assert (await human.get("/directory/users", headers=_from(scanner, OPS))).status_code == 429


async def test_the_directory_api_refuses_a_new_inbox_token_under_24_characters(human: httpx.AsyncClient) -> None:
    body = {"id": "carol", "display_name": "Carol", "preferred": "web", "channels": {"web": {}}}
    short = await human.post("/directory/users", json={**body, "inbox_token": "c" * 23}, headers=OPS)
    assert short.status_code == 422, short.text
    assert short.json()["errors"] == [{"field": "inbox_token", "message": "must be at least 24 characters"}]
    assert "c" * 23 not in short.text
    token = "carol-" + "k" * (MIN_INBOX_TOKEN - 6)
    created = await human.post("/directory/users", json={**body, "inbox_token": token}, headers=OPS)
    assert created.status_code in (200, 201), created.text
    assert (await human.get("/inbox", headers={"Authorization": f"Bearer {token}"})).status_code == 200
    # alice's token of the users file opens her inbox (a short one there is taken with a warning: the test below)
    assert (await human.get("/inbox", headers=ALICE)).status_code == 200
    # and an edit of her entry that leaves the stored token alone is not refused for want of one
    kept = await human.put(
        "/directory/users/alice",
        json={"display_name": "Alice E.", "preferred": "web", "channels": {"web": {}}},
        headers={**OPS, "If-Match": (await human.get("/directory/users/alice", headers=OPS)).headers["ETag"]},
    )
    assert kept.status_code == 200, kept.text


def test_a_short_legacy_token_in_the_users_file_or_environment_is_accepted_with_a_warning() -> None:
    raw = {
        "users": {
            "alice": {
                "display_name": "A",
                "inbox_token": "alice-legacy-tk",
                "preferred": "web",
                "channels": {"web": {}},
            },
            "bob": {"display_name": "B", "inbox_token_env": "BOB_TOKEN", "preferred": "web", "channels": {"web": {}}},
            "dana": {"display_name": "D", "inbox_token": "d" * 24, "preferred": "web", "channels": {"web": {}}},
        }
    }
    with capture_logs() as logs:
        directory = Directory.from_mapping(raw, environ={"BOB_TOKEN": "bob-legacy"})
    assert directory.user_for_token("alice-legacy-tk") == "alice"
    assert directory.user_for_token("bob-legacy") == "bob"
    warned = [e for e in logs if e["event"] == "directory.inbox_token_short"]
    assert {e["user_id"] for e in warned} == {"alice", "bob"}  # dana's is long enough
    assert {e["log_level"] for e in warned} == {"warning"}
    assert "alice-legacy-tk" not in str(logs)
    assert "bob-legacy" not in str(logs)
    with pytest.raises(DirectoryError, match="shorter than 24"):  # under the old floor: still refused
        Directory.from_mapping(raw, environ={"BOB_TOKEN": "short"})
