"""Console passwords in the directory (issue 9): set by admins through the directory API, stored only as an
Argon2id hash, never shown by a view, an event or the store's copy of a literal; checked over the bus
(``temporality.rpc.human.verify_password``) for the journal's password sign-in; printed by ``hash-password``
for the users file."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from directory_support import ADMIN, OPERATOR, USERS, VIEWER, carol, replica
from human_support import exactly

from temporality_bus import Bus
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.passwords import (
    PasswordResponder,
    hash_password,
    hash_password_main,
    verify_password,
)
from temporality_protocol import PasswordCheck, PasswordCheckReply, encode
from temporality_protocol.catalog import RPC_HUMAN_VERIFY_PASSWORD
from temporality_protocol.events import HumanDirectoryChanged

PASSWORD = "carol-correct-horse-battery"
ROTATED = "carol-rotated-staple-ladder"


@asynccontextmanager
async def answering(bus: Bus, directory: Directory) -> AsyncIterator[PasswordResponder]:
    responder = PasswordResponder(bus, directory)
    await responder.start()
    try:
        yield responder
    finally:
        await responder.stop()


async def check(bus: Bus, user_id: str, password: str) -> PasswordCheckReply:
    raw = await bus.request(
        RPC_HUMAN_VERIFY_PASSWORD, PasswordCheck(user_id=user_id, password=password).model_dump_json().encode(), 20.0
    )
    return PasswordCheckReply.model_validate_json(raw)


async def test_a_password_is_set_by_an_admin_hashed_and_never_shown(bus: Bus) -> None:
    async with replica(bus) as r:
        c = r.client
        for who in (VIEWER, OPERATOR):
            refused = await c.post("/directory/users", json=carol(password=PASSWORD), headers=who)
            assert refused.status_code == 403
        short = await c.post("/directory/users", json=carol(password="too-short"), headers=ADMIN)
        assert short.status_code == 422
        assert [e["field"] for e in short.json()["errors"]] == ["password"]
        assert "too-short" not in short.text
        bad_role = await c.post("/directory/users", json=carol(console_role="root"), headers=ADMIN)
        assert bad_role.status_code == 422
        assert [e["field"] for e in bad_role.json()["errors"]] == ["console_role"]

        created = await c.post(
            "/directory/users", json=carol(password=PASSWORD, console_role="operator"), headers=ADMIN
        )
        assert created.status_code == 201, created.text
        view = created.json()
        assert (view["password_set"], view["console_role"]) == (True, "operator")
        assert not {"password", "password_hash"} & set(view)
        stored = await r.store.get("user", "carol")
        assert stored is not None
        assert stored.value.user is not None
        first_hash = stored.value.user.password_hash
        assert first_hash is not None
        assert first_hash.startswith("$argon2id$")
        assert verify_password(first_hash, PASSWORD)

        # a replace that does not name the password keeps it (a client sends back what it read) ...
        read = await c.get("/directory/users/carol", headers=VIEWER)
        kept = await c.put(
            "/directory/users/carol",
            json={**read.json(), "display_name": "Carol C."},
            headers={**ADMIN, "If-Match": read.headers["ETag"]},
        )
        assert kept.status_code == 200, kept.text
        assert kept.json()["password_set"] is True
        # ... a new one replaces it, and null removes it
        rotated = await c.put(
            "/directory/users/carol",
            json={**kept.json(), "password": ROTATED},
            headers={**ADMIN, "If-Match": kept.headers["ETag"]},
        )
        assert rotated.status_code == 200, rotated.text
        removed = await c.put(
            "/directory/users/carol",
            json={**rotated.json(), "password": None, "console_role": None},
            headers={**ADMIN, "If-Match": rotated.headers["ETag"]},
        )
        assert removed.status_code == 200, removed.text
        assert (removed.json()["password_set"], removed.json()["console_role"]) == (False, None)
        listed = await c.get("/directory/users", headers=VIEWER)
        second_hash = hash_password(ROTATED)  # (a hash of the same password differs: it is salted)

    events = await exactly(bus, "human.directory.changed", 3 + 4, settle_s=0.3)
    changes = [e.payload(HumanDirectoryChanged) for e in events[3:]]
    assert [c.action for c in changes] == ["created", "updated", "updated", "updated"]
    assert changes[1].changed_fields == ["display_name"]
    assert changes[2].changed_fields == ["password"]
    assert changes[3].changed_fields == ["console_role", "password"]
    for event in events:
        wire = encode(event).decode()
        for secret in (PASSWORD, ROTATED, first_hash, "$argon2id$"):
            assert secret not in wire
    assert "$argon2id$" not in listed.text
    assert second_hash != first_hash


async def test_the_password_check_over_the_bus_answers_the_role_and_refuses_alike(bus: Bus) -> None:
    users: dict[str, Any] = {
        "users": {
            **USERS["users"],
            "dana": {  # set up by a deployer with `hash-password`: the hash in the users file
                "display_name": "Dana Admin",
                "preferred": "web",
                "inbox_token": "dana-demo-token",
                "channels": {"web": {}},
                "console_role": "admin",
                "password_hash": hash_password("dana-first-admin-password"),
            },
        }
    }
    async with replica(bus, users) as r, answering(bus, r.directory):
        created = await r.client.post("/directory/users", json=carol(password=PASSWORD), headers=ADMIN)
        assert created.status_code == 201

        dana = await check(bus, "dana", "dana-first-admin-password")
        assert (dana.ok, dana.user_id, dana.display_name, dana.role, dana.error) == (
            True,
            "dana",
            "Dana Admin",
            "admin",
            None,
        )
        no_role = await check(bus, "carol", PASSWORD)  # a password but no console role: the inbox only
        assert (no_role.ok, no_role.role) == (True, None)

        refusals = [
            await check(bus, "carol", "carol-wrong-password"),
            await check(bus, "nobody", PASSWORD),
            await check(bus, "alice", "alice-has-no-password"),
        ]
        assert [(x.ok, x.user_id, x.role, x.error) for x in refusals] == [(False, None, None, None)] * 3

        malformed = PasswordCheckReply.model_validate_json(
            await bus.request(RPC_HUMAN_VERIFY_PASSWORD, b'{"user_id": "carol"}', 20.0)
        )
        assert malformed.ok is False
        assert malformed.error is not None
        assert malformed.error.startswith("malformed request")


def test_hash_password_prints_a_hash_of_the_password_read() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert hash_password_main(io.StringIO("a-deployer-password\n"), out, err) == 0
    printed = out.getvalue().strip()
    assert printed.startswith("$argon2id$")
    assert verify_password(printed, "a-deployer-password")
    assert not verify_password(printed, "another-password")
    Directory.from_mapping(  # the users file takes it as is
        {
            "users": {
                "dana": {
                    "display_name": "Dana",
                    "preferred": "web",
                    "inbox_token": "dana-demo-token",
                    "channels": {"web": {}},
                    "password_hash": printed,
                }
            }
        }
    )
    short_out, short_err = io.StringIO(), io.StringIO()
    assert hash_password_main(io.StringIO("short\n"), short_out, short_err) == 2
    assert short_out.getvalue() == ""
    assert "12 to 1024 characters" in short_err.getvalue()
