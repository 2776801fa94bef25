"""The directory store and its API (HUM-2, AP-11): role tokens, ETags, validation naming the field, live
changes on every replica without a restart, the file seeding only what the store lacks, and audit events
that never carry a secret."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx
import yaml
from directory_support import (
    ADMIN,
    CAROL_TOKEN,
    OPERATOR,
    TOKENS,
    USERS,
    VIEWER,
    carol,
    replica,
)
from human_support import USERS_FILE, exactly
from jsonschema import Draft202012Validator

from temporality_bus import Bus
from temporality_human_interaction.__main__ import seed_directory
from temporality_human_interaction.api import create_app
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.directory_api import GroupView, UserView
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.settings import Settings
from temporality_human_interaction.store import DirectoryStore
from temporality_protocol import encode
from temporality_protocol.events import HumanDirectoryChanged
from temporality_service import ApiAuth

CAROL = {"Authorization": f"Bearer {CAROL_TOKEN}"}


def _etag(response: httpx.Response) -> str:
    etag = response.headers["ETag"]
    assert etag.startswith('"')
    assert etag.endswith('"')
    return etag


async def test_each_role_may_do_what_it_should_and_no_more(bus: Bus) -> None:
    async with replica(bus) as r:
        c = r.client
        for method, path in [
            ("GET", "/directory/users"),
            ("GET", "/directory/users/alice"),
            ("POST", "/directory/users"),
            ("PUT", "/directory/users/alice"),
            ("DELETE", "/directory/users/alice"),
            ("GET", "/directory/groups"),
            ("POST", "/directory/groups"),
            ("DELETE", "/directory/groups/api-owners"),
        ]:
            for headers in (
                {},
                {"Authorization": "Bearer alice-demo-inbox-token-change-me"},
            ):  # no token; an inbox token
                refused = await c.request(method, path, json=carol(), headers=headers)
                assert refused.status_code == 401, (method, path, refused.text)
                assert refused.json()["error"] in ("unauthorized", "invalid_token")

        listed = await c.get("/directory/users", headers=VIEWER)
        assert listed.status_code == 200
        assert [u["id"] for u in listed.json()["users"]] == ["alice", "bob"]
        alice = (await c.get("/directory/users/alice", headers=VIEWER)).json()
        assert alice["display_name"] == "Alice Example"
        assert alice["inbox_token_set"] is True
        assert alice["origin"] == "file"
        assert alice["groups"] == ["api-owners"]
        assert not {"inbox_token", "inbox_token_sha256"} & set(alice)

        for who in (VIEWER, OPERATOR):
            forbidden = await c.post("/directory/users", json=carol(), headers=who)
            assert forbidden.status_code == 403
            assert "admin" in forbidden.json()["detail"]
            gone = await c.delete("/directory/users/bob", headers=who)
            assert gone.status_code == 403

        created = await c.post("/directory/users", json=carol(), headers=ADMIN)
        assert created.status_code == 201, created.text
        assert created.headers["Location"] == "/directory/users/carol"
        assert created.json()["inbox_token_set"] is True
        assert created.json()["updated_by"] == "ci-bot"
        assert CAROL_TOKEN not in created.text
        assert hashlib.sha256(CAROL_TOKEN.encode()).hexdigest() not in created.text
        assert (await c.post("/directory/users", json=carol(), headers=ADMIN)).json()["error"] == "user_exists"

        read = await c.get("/directory/users/carol", headers=VIEWER)
        assert read.headers["ETag"] == created.headers["ETag"]
        assert (await c.get("/directory/users/nobody", headers=VIEWER)).status_code == 404
        assert (await c.get("/directory/groups/nobody", headers=VIEWER)).json()["error"] == "group_not_found"


async def test_validation_names_the_field_and_preconditions_are_enforced(bus: Bus) -> None:
    async with replica(bus) as r:
        c = r.client

        async def refused(body: object, field: str, path: str = "/directory/users") -> None:
            response = await c.post(path, json=body, headers=ADMIN)
            assert response.status_code == 422, response.text
            fields = [e["field"] for e in response.json()["errors"]]
            assert field in fields, fields
            assert field in response.json()["detail"]
            assert CAROL_TOKEN not in response.text

        await refused(carol(channels={"web": {}, "telegram": {"chat_id": "not-a-number"}}), "channels.telegram.chat_id")
        await refused(carol(preferred="matrix"), "preferred")
        await refused(carol(colour="blue"), "colour")
        await refused(carol(id="bad id"), "id")
        await refused(carol(inbox_token="short"), "inbox_token")
        await refused(carol(inbox_token=None), "inbox_token")  # the web channel needs one
        await refused(carol(inbox_token="alice-demo-inbox-token-change-me"), "inbox_token")  # another user's
        await refused(carol(inbox_token=None, inbox_token_env="UNSET_FOR_THIS_TEST_42"), "inbox_token_env")
        unknown_member = {"id": "reviewers", "display_name": "Reviewers", "members": ["alice", "zed"]}
        response = await c.post("/directory/groups", json=unknown_member, headers=ADMIN)
        assert response.status_code == 422
        assert response.json()["error"] == "invalid_group"
        assert response.json()["errors"] == [{"field": "members[1]", "message": "'zed' is not a user of the directory"}]
        await refused({"id": "empty", "display_name": "Nobody", "members": []}, "members", "/directory/groups")
        # an unknown key names the keys its object takes (and the closest), not pydantic's "Extra inputs ..."
        typo = await c.post("/directory/users", json={**carol(), "prefered": "web"}, headers=ADMIN)
        (message,) = [e["message"] for e in typo.json()["errors"] if e["field"] == "prefered"]
        assert message.startswith("unknown key 'prefered' (did you mean 'preferred'?); allowed here: ")
        assert {"display_name", "channels", "preferred", "password", "id"} <= set(message.split(": ")[-1].split(", "))
        nested = await c.post(
            "/directory/users", json=carol(channels={"web": {}, "telegram": {"chat": 1}}), headers=ADMIN
        )
        (message,) = [e["message"] for e in nested.json()["errors"] if e["field"] == "channels.telegram.chat"]
        assert message == "unknown key 'chat' (did you mean 'chat_id'?); allowed here: chat_id"
        assert (await c.post("/directory/users", content=b"{", headers=ADMIN)).json()["error"] == "malformed_json"

        read = await c.get("/directory/users/bob", headers=VIEWER)
        body = {**read.json(), "display_name": "Robert"}  # what it read, sent back: the token is kept
        no_match = await c.put("/directory/users/bob", json=body, headers=ADMIN)
        assert no_match.status_code == 428
        stale = await c.put("/directory/users/bob", json=body, headers={**ADMIN, "If-Match": '"1"'})
        assert stale.status_code == 412
        assert stale.json()["error"] == "precondition_failed"
        # a digit that is not ASCII ("²".isdigit(), but int("²") raises) is a 412, not the 500 it was
        superscript = {**ADMIN, b"If-Match": '"\u00b2"'.encode("latin-1")}
        for method in ("PUT", "DELETE"):
            odd = await c.request(method, "/directory/users/bob", json=body, headers=superscript)
            assert (odd.status_code, odd.json()["error"]) == (412, "precondition_failed"), (method, odd.text)
        unknown = {"display_name": "X", "preferred": "web", "channels": {"web": {}}, "inbox_token": "x" * 12}
        assert (
            await c.put("/directory/users/zed", json=unknown, headers={**ADMIN, "If-Match": "*"})
        ).status_code == 404
        replaced = await c.put("/directory/users/bob", json=body, headers={**ADMIN, "If-Match": _etag(read)})
        assert replaced.status_code == 200, replaced.text
        assert replaced.json()["display_name"] == "Robert"
        assert replaced.json()["inbox_token_set"] is True
        assert (
            r.directory.user_for_token("bob-demo-inbox-token-change-me") == "bob"
        )  # the kept token still opens the inbox
        anyway = await c.put(
            "/directory/users/bob", json={**body, "display_name": "Bob"}, headers={**ADMIN, "If-Match": "*"}
        )
        assert anyway.status_code == 200  # "*": whatever the revision (Store.modify)
        assert int(anyway.headers["ETag"].strip('"')) > int(replaced.headers["ETag"].strip('"'))

        in_group = await c.delete("/directory/users/alice", headers=ADMIN)
        assert in_group.status_code == 409
        assert in_group.json()["error"] == "user_in_group"
        assert "api-owners" in in_group.json()["detail"]
        stale_delete = await c.delete("/directory/users/bob", headers={**ADMIN, "If-Match": _etag(read)})
        assert stale_delete.status_code == 412
        assert (await c.delete("/directory/users/bob", headers=ADMIN)).status_code == 204
        assert (await c.get("/directory/users/bob", headers=VIEWER)).status_code == 404
        assert (await c.delete("/directory/users/bob", headers=ADMIN)).status_code == 404


async def test_a_change_reaches_a_second_replica_and_its_web_inbox_without_a_restart(bus: Bus) -> None:
    async with replica(bus) as a, replica(bus) as b:
        assert (await b.client.get("/inbox", headers=CAROL)).status_code == 401
        created = await a.client.post("/directory/users", json=carol(), headers=ADMIN)
        assert created.status_code == 201
        revision = int(created.headers["ETag"].strip('"'))
        assert await b.directory.wait_for_revision("user.carol", revision, timeout_s=5)
        inbox = await b.client.get("/inbox", headers=CAROL)
        assert inbox.status_code == 200
        assert inbox.json() == {"user": "user:carol", "requests": []}

        body = carol(display_name="Carol C.", inbox_token="carol-rotated-inbox-token-43")
        body.pop("id")
        rotated = await a.client.put("/directory/users/carol", json=body, headers={**ADMIN, "If-Match": _etag(created)})
        assert rotated.status_code == 200
        assert await b.directory.wait_for_revision("user.carol", int(rotated.headers["ETag"].strip('"')), timeout_s=5)
        profile = b.directory.get("carol")
        assert profile is not None
        assert profile.display_name == "Carol C."
        assert (await b.client.get("/inbox", headers=CAROL)).status_code == 401  # the old token no longer opens it
        assert (
            await b.client.get("/inbox", headers={"Authorization": "Bearer carol-rotated-inbox-token-43"})
        ).status_code == 200

        group = {"id": "reviewers", "display_name": "Reviewers", "members": ["alice", "carol"]}
        made = await a.client.post("/directory/groups", json=group, headers=ADMIN)
        assert made.status_code == 201, made.text
        assert await b.directory.wait_for_revision("group.reviewers", int(made.headers["ETag"].strip('"')), timeout_s=5)
        seen = b.directory.group("reviewers")
        assert seen is not None
        assert seen.members == ["alice", "carol"]
        assert (await a.client.delete("/directory/groups/reviewers", headers=ADMIN)).status_code == 204
        deleted = await a.store.get_any("group", "reviewers")
        assert deleted is not None
        assert await b.directory.wait_for_revision("group.reviewers", deleted.revision, timeout_s=5)
        assert b.directory.group("reviewers") is None


async def test_the_file_seeds_once_and_api_edits_survive_a_restart(bus: Bus) -> None:
    async with replica(bus) as first:
        read = await first.client.get("/directory/users/alice", headers=VIEWER)
        body = {**read.json(), "display_name": "Alice (edited through the API)"}
        edited = await first.client.put("/directory/users/alice", json=body, headers={**ADMIN, "If-Match": _etag(read)})
        assert edited.status_code == 200
        assert (await first.client.delete("/directory/users/bob", headers=ADMIN)).status_code == 204
    await exactly(bus, "human.directory.changed", 5, settle_s=0.3)  # 3 seeded + 1 edit + 1 delete

    changed_file = json.loads(json.dumps(USERS))
    changed_file["users"]["alice"]["display_name"] = "Alice from the file"
    async with replica(bus, changed_file) as again:  # a restart: the same bucket, the file seeds again
        alice = again.directory.get("alice")
        assert alice is not None
        assert alice.display_name == "Alice (edited through the API)"  # the API's edit wins over the file
        assert again.directory.get("bob") is None  # deleted through the API: the file does not bring it back
        assert again.directory.user_for_token("bob-demo-inbox-token-change-me") is None
        listed = (await again.client.get("/directory/users", headers=VIEWER)).json()["users"]
        assert [(u["id"], u["origin"], u["updated_by"]) for u in listed] == [("alice", "api", "ci-bot")]
        restored = await again.client.post(
            # (a new token: the file's 14-character one is a legacy token the API no longer takes)
            "/directory/users",
            json={**USERS["users"]["bob"], "id": "bob", "inbox_token": "bob-restored-inbox-token-01"},
            headers=ADMIN,
        )
        assert restored.status_code == 201  # re-created over its tombstone
    await exactly(bus, "human.directory.changed", 6, settle_s=0.3)  # the restart seeded nothing


async def test_every_change_is_audited_with_who_and_what_and_no_secret(bus: Bus) -> None:
    store = await DirectoryStore.open(bus)
    async with replica(bus) as r:
        created = await r.client.post("/directory/users", json=carol(), headers=ADMIN)
        body = carol(preferred="web", display_name="Carol C.", inbox_token="carol-rotated-inbox-token-43")
        body.pop("id")
        updated = await r.client.put("/directory/users/carol", json=body, headers={**ADMIN, "If-Match": _etag(created)})
        assert updated.status_code == 200
        group = {"id": "reviewers", "display_name": "Reviewers", "members": ["carol"]}
        assert (await r.client.post("/directory/groups", json=group, headers=ADMIN)).status_code == 201
        assert (await r.client.delete("/directory/groups/reviewers", headers=ADMIN)).status_code == 204
        assert (await r.client.delete("/directory/users/carol", headers=ADMIN)).status_code == 204

    events = await exactly(bus, "human.directory.changed", 8, settle_s=0.3)
    changes = [e.payload(HumanDirectoryChanged) for e in events]
    seeded, api = changes[:3], changes[3:]
    assert {(c.kind, c.entry_id, c.changed_by) for c in seeded} == {
        ("user", "alice", "file:test-users.yaml"),
        ("user", "bob", "file:test-users.yaml"),
        ("group", "api-owners", "file:test-users.yaml"),
    }
    assert [(c.kind, c.entry_id, c.action) for c in api] == [
        ("user", "carol", "created"),
        ("user", "carol", "updated"),
        ("group", "reviewers", "created"),
        ("group", "reviewers", "deleted"),
        ("user", "carol", "deleted"),
    ]
    assert all((c.changed_by, c.role) == ("ci-bot", "admin") for c in api)
    assert all(e.actor == "token:ci-bot" for e in events[3:])
    assert api[1].changed_fields == ["display_name", "inbox_token"]
    assert api[1].after is not None
    assert api[1].after["inbox_token_set"] is True
    assert api[2].after == {"id": "reviewers", "display_name": "Reviewers", "members": ["carol"]}
    assert api[4].after is None
    for secret in (
        "carol-secret-inbox-token-42",
        "carol-rotated-inbox-token-43",
        "alice-demo-inbox-token-change-me",
        "bob-demo-inbox-token-change-me",
    ):
        for event in events:
            wire = encode(event).decode()
            assert secret not in wire
            assert hashlib.sha256(secret.encode()).hexdigest() not in wire
    for key in await store.store.keys():  # nor is a literal token ever stored
        got = await store.store.get(key)
        assert got is not None
        assert 'inbox_token":"' not in got.value.model_dump_json().replace(" ", "")


async def test_a_token_the_replica_has_not_seen_yet_is_still_refused(bus: Bus) -> None:
    """The shared-token check reads the store, not only this replica's directory (which follows the store
    through a watch and may lag it: just seeded, or written by another replica). Here the replica's
    directory stays empty, as one that has not caught up, while the store already holds alice."""
    store = await DirectoryStore.open(bus)
    await seed_directory(bus, store, USERS, by="file:test-users.yaml")
    behind = Directory()  # no watch: it has seen nothing
    app = create_app(
        Settings(bus_timeout_s=2.0), bus, behind, AnswerRouter(bus, behind, {}), store=store, auth=ApiAuth(TOKENS)
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://human.test") as c:
        taken = await c.post(
            "/directory/users", json=carol(inbox_token="alice-demo-inbox-token-change-me"), headers=ADMIN
        )
        assert taken.status_code == 422, taken.text
        assert [e["field"] for e in taken.json()["errors"]] == ["inbox_token"]
        assert "alice-demo-inbox-token-change-me" not in taken.text
        own = await c.post("/directory/users", json=carol(), headers=ADMIN)
        assert own.status_code == 201, own.text


def _documented(document: dict[str, Any], path: str, method: str, status: int) -> dict[str, Any]:
    """The JSON Schema the OpenAPI document gives for that answer (its refs resolvable: the components beside)."""
    content = document["paths"][path][method]["responses"][str(status)]["content"]["application/json"]
    schema = content["schema"]
    assert schema.get("$ref", "").startswith("#/components/schemas/"), schema  # a model, not "anything"
    return {**schema, "components": document["components"]}


async def test_every_directory_answer_matches_its_documented_response_model(bus: Bus) -> None:
    """The routes build their bodies by hand: the response models in the OpenAPI document must describe them
    (what schemathesis's response-schema check compares), with no field left out or left over."""
    async with replica(bus) as r:
        c = r.client
        document = (await c.get("/openapi.json", headers=VIEWER)).json()
        created = await c.post("/directory/users", json=carol(), headers=ADMIN)
        replaced = await c.put(
            "/directory/users/carol",
            json={**carol(), "display_name": "Carol C."},
            headers={**ADMIN, "If-Match": _etag(created)},
        )
        group = {"id": "reviewers", "display_name": "Reviewers", "members": ["alice", "carol"]}
        group_created = await c.post("/directory/groups", json=group, headers=ADMIN)
        group_replaced = await c.put(
            "/directory/groups/reviewers",
            json={**group, "members": ["carol"]},
            headers={**ADMIN, "If-Match": _etag(group_created)},
        )
        answers = [
            (created, "/directory/users", "post", 201),
            (replaced, "/directory/users/{user_id}", "put", 200),
            (await c.get("/directory/users", headers=VIEWER), "/directory/users", "get", 200),
            (await c.get("/directory/users/carol", headers=VIEWER), "/directory/users/{user_id}", "get", 200),
            (group_created, "/directory/groups", "post", 201),
            (group_replaced, "/directory/groups/{group_id}", "put", 200),
            (await c.get("/directory/groups", headers=VIEWER), "/directory/groups", "get", 200),
            (await c.get("/directory/groups/reviewers", headers=VIEWER), "/directory/groups/{group_id}", "get", 200),
        ]
        for response, path, method, status in answers:
            assert response.status_code == status, (path, method, response.text)
            schema = _documented(document, path, method, status)
            errors = list(Draft202012Validator(schema).iter_errors(response.json()))
            assert errors == [], (path, method, [e.message for e in errors])
            body = response.json()
            kind = "users" if path.startswith("/directory/users") else "groups"
            listing = method == "get" and path == f"/directory/{kind}"
            model = UserView if kind == "users" else GroupView
            for view in body[kind] if listing else [body]:  # no field the models do not name
                model.model_validate(view)
        users = (await c.get("/directory/users", headers=VIEWER)).json()["users"]
        assert {u["id"] for u in users} == {"alice", "bob", "carol"}


async def test_the_documented_example_runs_on_the_shipped_directory_and_keeps_its_demo_entries(bus: Bus) -> None:
    """docs/human-interaction.md's ``curl`` example of the directory API, over the shipped ``config/users.yaml``:
    every call does what its comment says, and the demo's users and group are there after it."""
    shipped = yaml.safe_load(USERS_FILE.read_text())
    async with replica(bus, shipped) as r:
        c = r.client
        assert (await c.get("/directory/users", headers=ADMIN)).status_code == 200
        body = {
            "id": "carol",
            "display_name": "Carol Example",
            "inbox_token": "a-long-random-inbox-token",
            "preferred": "telegram",
            "fallback": ["web"],
            "channels": {"telegram": {"chat_id": 5550001}, "web": {}},
        }
        assert (await c.post("/directory/users", json=body, headers=ADMIN)).status_code == 201
        etag = _etag(await c.get("/directory/users/carol", headers=ADMIN))
        edited = {"display_name": "Carol C.", "preferred": "web", "channels": {"web": {}}}
        assert (
            await c.put("/directory/users/carol", json=edited, headers={**ADMIN, "If-Match": etag})
        ).status_code == 200
        group = {"id": "release-managers", "display_name": "Release managers", "members": ["alice", "carol"]}
        assert (await c.post("/directory/groups", json=group, headers=ADMIN)).status_code == 201
        assert (await c.delete("/directory/groups/release-managers", headers=ADMIN)).status_code == 204
        # the seeded group is not the example's to create (nor to delete)
        taken = await c.post("/directory/groups", json={**group, "id": "api-owners"}, headers=ADMIN)
        assert taken.status_code == 409
        groups = (await c.get("/directory/groups", headers=ADMIN)).json()["groups"]
        assert [g["id"] for g in groups] == sorted(shipped["groups"])
        users = {u["id"] for u in (await c.get("/directory/users", headers=ADMIN)).json()["users"]}
        assert users == {*shipped["users"], "carol"}
