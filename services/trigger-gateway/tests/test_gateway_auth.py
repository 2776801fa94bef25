"""The verifiers (``auth.type``): published test vectors, our own vectors, and their refusals over HTTP.

A refusal is 401 with the scheme's challenge and publishes nothing; a body-signed trigger reads the
body before it can authenticate, so a body over the limit is 413 there, and not journaled either.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from gateway_support import (
    BEARER_TOKEN,
    GITHUB_SECRET,
    GITLAB_TOKEN,
    MAX_BODY,
    SW_SECRET,
    fixture_bytes,
    github_headers,
    journal,
    load_triggers_yaml,
    post,
    standard_headers,
    types,
)

from temporality_bus import Bus
from temporality_service import AccessAudit
from temporality_testing.events import EventLog
from temporality_testing.fixtures import require_shared
from temporality_trigger_gateway import WebhookTrigger
from temporality_trigger_gateway.api import create_app
from temporality_trigger_gateway.auth import (
    GitHubAuth,
    HmacSha256Auth,
    StandardWebhooksAuth,
    hmac_sha256_matches,
    standard_webhooks_matches,
)
from temporality_trigger_gateway.errors import TriggerConfigError, Unauthorized
from temporality_trigger_gateway.settings import Settings
from temporality_trigger_gateway.triggers import TriggerConfig


def _vectors() -> dict[str, Any]:
    path = require_shared() / "fixtures/webhooks/signatures/published-test-vectors.json"
    if not path.is_file():
        pytest.skip(f"{path} not present; published signature vectors not checked")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


_EVENTS = {"github": "push", "azure_devops.pull_request": "git.pullrequest.created"}


def _auth(yaml_auth: str, adapter: str = "generic", **environ: str) -> Any:
    (trigger,) = load_triggers_yaml(
        f"""
triggers:
  - id: t
    name: t
    type: webhook
    adapter: {adapter}
    events: [{_EVENTS.get(adapter, "order.created")}]
    agent: reviewer
    auth: {yaml_auth}
""",
        **environ,
    )
    assert isinstance(trigger, WebhookTrigger)
    return trigger.auth


# --------------------------------------------------------------------------- published vectors
def test_github_published_vector() -> None:
    vector = _vectors()["github_x_hub_signature_256"]
    body = vector["payload"].encode()
    auth = _auth("{type: github, secret_env: S}", adapter="github", S=vector["secret"])
    assert isinstance(auth, GitHubAuth)
    auth.verify(httpx.Headers({"X-Hub-Signature-256": vector["header_X-Hub-Signature-256"]}), body)
    assert hmac_sha256_matches(vector["secret"].encode(), body, vector["header_X-Hub-Signature-256"], prefix="sha256=")
    with pytest.raises(Unauthorized):
        auth.verify(httpx.Headers({"X-Hub-Signature-256": vector["header_X-Hub-Signature-256"]}), body + b" ")


def test_standard_webhooks_published_vector_at_its_own_time() -> None:
    vector = _vectors()["standard_webhooks_svix"]
    headers = httpx.Headers({k: vector[k] for k in ("webhook-id", "webhook-timestamp", "webhook-signature")})
    body = vector["payload"].encode()
    sent = datetime.fromtimestamp(int(vector["webhook-timestamp"]), tz=UTC)
    assert standard_webhooks_matches(vector["secret"], headers, body, now=sent, tolerance_s=300) is None
    assert standard_webhooks_matches(vector["secret"], headers, body + b" ", now=sent, tolerance_s=300) is not None
    # Today that delivery is years old: a replay, refused by the real verifier.
    auth = _auth("{type: standard_webhooks, secret_env: S}", S=vector["secret"])
    with pytest.raises(Unauthorized, match="away from now"):
        auth.verify(headers, body)


# --------------------------------------------------------------------------- our own vectors
def test_standard_webhooks_tolerance_is_five_minutes_both_ways() -> None:
    body = b'{"type": "order.created"}'
    now = datetime.now(UTC)
    stamp = int(now.timestamp())
    for offset, ok in ((-299, True), (299, True), (-301, False), (301, False)):
        headers = httpx.Headers(standard_headers(body, "msg_1", at=stamp + offset))
        result = standard_webhooks_matches(SW_SECRET, headers, body, now=now, tolerance_s=300)
        assert (result is None) is ok, offset


def test_standard_webhooks_accepts_any_of_several_signatures_for_key_rotation() -> None:
    body = b'{"type": "order.created"}'
    auth = _auth("{type: standard_webhooks, secret_env: S}", S=SW_SECRET)
    assert isinstance(auth, StandardWebhooksAuth)
    good = standard_headers(body, "msg_2")
    old_key = "whsec_" + base64.b64encode(b"the-previous-key-000000").decode()
    stale = standard_headers(body, "msg_2", secret=old_key)["webhook-signature"]
    rotated = {**good, "webhook-signature": f"{stale} v2,ignored {good['webhook-signature']}"}
    auth.verify(httpx.Headers(rotated), body)
    with pytest.raises(Unauthorized, match="no webhook-signature"):
        auth.verify(httpx.Headers({**good, "webhook-signature": stale}), body)
    with pytest.raises(Unauthorized, match="requires"):
        auth.verify(httpx.Headers({"webhook-id": "msg_2"}), body)
    with pytest.raises(Unauthorized, match="Unix time"):
        auth.verify(httpx.Headers({**good, "webhook-timestamp": "soon"}), body)
    with pytest.raises(Unauthorized):  # the id is signed too
        auth.verify(httpx.Headers({**good, "webhook-id": "msg_3"}), body)


def test_hmac_sha256_hex_and_base64_with_a_prefix() -> None:
    body = b'{"type": "order.created", "id": "1"}'
    digest = hmac.new(b"k3y", body, hashlib.sha256).digest()
    hex_auth = _auth("{type: hmac_sha256, header: X-Signature, secret_env: S}", S="k3y")
    assert isinstance(hex_auth, HmacSha256Auth)
    hex_auth.verify(httpx.Headers({"x-signature": digest.hex().upper()}), body)  # hex is case-insensitive
    b64_auth = _auth("{type: hmac_sha256, header: X-Sig, prefix: 'v1=', encoding: base64, secret_env: S}", S="k3y")
    b64_auth.verify(httpx.Headers({"X-Sig": "v1=" + base64.b64encode(digest).decode()}), body)
    for wrong in ("", base64.b64encode(digest).decode(), "v1=not base64!", "v1=" + digest.hex()):
        with pytest.raises(Unauthorized):
            b64_auth.verify(httpx.Headers({"X-Sig": wrong} if wrong else {}), body)


def test_header_secret_and_bearer() -> None:
    header = _auth("{type: header, header: X-Api-Key, secret_env: S}", S="abc")
    header.verify(httpx.Headers({"x-api-key": "abc"}), b"")
    for wrong in ({}, {"X-Api-Key": "abd"}, {"X-Api-Key": "ab"}):
        with pytest.raises(Unauthorized):
            header.verify(httpx.Headers(wrong), b"")
    bearer = _auth("{type: bearer, token_env: S}", S="tok")
    bearer.verify(httpx.Headers({"Authorization": "Bearer tok"}), b"")
    for wrong in ({}, {"Authorization": "Bearer tak"}, {"Authorization": "Basic tok"}, {"Authorization": "Bearer"}):
        with pytest.raises(Unauthorized) as refused:
            bearer.verify(httpx.Headers(wrong), b"")
        assert refused.value.headers()["WWW-Authenticate"].startswith("Bearer")


def test_basic_accepts_the_header_as_sent_and_every_other_valid_spelling() -> None:
    """The header as a sender writes it is one comparison; any other spelling of the same credentials is
    decoded and accepted as before, and a near miss is refused either way."""
    basic = _auth("{type: basic, username: ado, password_env: S}", adapter="azure_devops.pull_request", S="pä:ss")
    token = base64.b64encode("ado:pä:ss".encode()).decode()
    for right in (f"Basic {token}", f"basic {token}", f"BASIC   {token}  "):
        basic.verify(httpx.Headers({"Authorization": right}), b"")
    near = base64.b64encode(b"ado:p\xc3\xa4:sS").decode()
    for wrong in (
        {},
        {"Authorization": f"Basic {near}"},
        {"Authorization": f"Basic {token}x"},
        {"Authorization": token},
    ):
        with pytest.raises(Unauthorized) as refused:
            basic.verify(httpx.Headers(wrong), b"")
        assert refused.value.headers()["WWW-Authenticate"].startswith("Basic")


ADO = "azure_devops.pull_request"


def test_basic_refuses_at_load_a_user_name_with_a_colon_and_a_secret_that_is_not_utf8() -> None:
    """RFC 7617 ends the user id at the first colon: no sender could send one that has it (the header as written
    would match while every other spelling failed). A secret that is not UTF-8 (an environment's stray byte) is
    refused at load, its message quoting no character of it."""
    with pytest.raises(TriggerConfigError, match="username"):
        _auth('{type: basic, username: "a:b", password_env: S}', adapter=ADO, S="c")
    with pytest.raises(TriggerConfigError, match="not valid UTF-8") as refused:
        _auth("{type: basic, username: ado, password_env: S}", adapter=ADO, S="p\udcffss")
    assert "udcff" not in str(refused.value)
    assert "position" not in str(refused.value)


def test_basic_refuses_a_header_that_cannot_be_encoded() -> None:
    """A header string with a lone surrogate (no HTTP server hands one on, a direct caller may) is refused with
    401 like any other header that is not HTTP Basic, not an error."""
    basic = _auth("{type: basic, username: ado, password_env: S}", adapter=ADO, S="pass")
    with pytest.raises(Unauthorized, match="not valid HTTP Basic"):
        basic.verify({"authorization": "Basic \ud800"}, b"")


# --------------------------------------------------------------------------- over HTTP
@pytest.mark.parametrize(
    ("trigger_id", "headers", "challenge"),
    [
        pytest.param("gh-review", {}, "Signature", id="github-missing"),
        pytest.param(
            "gh-review",
            github_headers(fixture_bytes("github-pr-opened.json"), "pull_request", "d-1", secret="wrong"),
            "Signature",
            id="github-wrong-secret",
        ),
        pytest.param("gl-review", {"X-Gitlab-Token": GITLAB_TOKEN + "x"}, "Signature", id="gitlab-wrong"),
        pytest.param("gl-review", {}, "Signature", id="gitlab-missing"),
        pytest.param("orders-bearer", {"Authorization": f"Bearer {BEARER_TOKEN}x"}, "Bearer", id="bearer-wrong"),
        pytest.param(
            "orders-signed",
            standard_headers(fixture_bytes("generic-order.json"), "msg_x", at=int(time.time()) - 3600),
            "Signature",
            id="standard-webhooks-replayed",
        ),
    ],
)
async def test_refused_credentials_are_401_and_publish_nothing(
    client: httpx.AsyncClient, bus: Bus, trigger_id: str, headers: dict[str, str], challenge: str
) -> None:
    body = fixture_bytes("github-pr-opened.json" if trigger_id.startswith("gh") else "generic-order.json")
    response = await post(client, body, trigger_id=trigger_id, headers=headers)
    assert response.status_code == 401, response.text
    assert response.json()["error"] == "unauthorized"
    assert response.headers["WWW-Authenticate"].startswith(challenge)
    for secret in (GITHUB_SECRET, GITLAB_TOKEN, BEARER_TOKEN, SW_SECRET):
        assert secret not in response.text
    assert await journal(bus) == []


async def test_refused_credentials_are_in_the_audit_trail_without_them(
    bus: Bus, event_log: EventLog, settings: Settings, triggers: list[TriggerConfig]
) -> None:
    """Issue 11: a refused webhook authentication is an ``api.access_refused`` of the gateway (reason
    ``bad_signature`` for the body's signature, ``bad_credentials`` for the headers'), with the sender's address,
    never the credential or signature; still no trigger event."""
    app = create_app(settings, bus, triggers)
    app.state.access_audit = AccessAudit(bus, "trigger-gateway")  # what the service runtime sets on its app
    body = fixture_bytes("github-pr-opened.json")
    forged = github_headers(body, "pull_request", "d-1", secret="wrong")
    senders = {"10.0.0.1": ("gh-review", forged), "10.0.0.2": ("orders-bearer", {"Authorization": "Bearer nope"})}
    for address, (trigger_id, headers) in senders.items():
        transport = httpx.ASGITransport(app=app, client=(address, 4711))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
            assert (await post(client, body, trigger_id=trigger_id, headers=headers)).status_code == 401
    events = await event_log.wait_for("api.access_refused", count=2)
    seen = {e.data["address"]: e for e in events}
    assert (seen["10.0.0.1"].data["reason"], seen["10.0.0.1"].data["path"]) == ("bad_signature", "/hooks/gh-review")
    assert (seen["10.0.0.2"].data["reason"], seen["10.0.0.2"].data["path"]) == (
        "bad_credentials",
        "/hooks/orders-bearer",
    )
    assert {(e.data["service"], e.data["status"], e.data["method"], e.actor) for e in events} == {
        ("trigger-gateway", 401, "POST", "address:10.0.0.1"),
        ("trigger-gateway", 401, "POST", "address:10.0.0.2"),
    }
    wire = json.dumps([e.data for e in events])
    assert forged["X-Hub-Signature-256"] not in wire
    assert "nope" not in wire
    assert [e.type for e in await journal(bus)] == ["api.access_refused"] * 2  # nothing else


def _signed_at(raw: bytes, msg_id: str, stamp: str) -> dict[str, str]:
    """Standard Webhooks headers signed at any ``webhook-timestamp`` text (the library helper takes a datetime,
    which a far-off time cannot be)."""
    key = base64.b64decode(SW_SECRET.removeprefix("whsec_"))
    digest = hmac.new(key, f"{msg_id}.{stamp}.".encode() + raw, hashlib.sha256).digest()
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": stamp,
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }


@pytest.mark.parametrize(
    "stamp",
    [
        pytest.param("999999999999", id="12-digits-year-33658"),  # was a 500: datetime.fromtimestamp raised
        pytest.param("253402300800", id="year-10000"),
        pytest.param("9" * 13, id="13-digits"),
        pytest.param("9" * 5000, id="more-digits-than-int-reads"),
        pytest.param("0", id="1970"),
        pytest.param(str(int(time.time()) - 3600), id="an-hour-ago"),
    ],
)
async def test_a_far_off_webhook_timestamp_is_401_like_any_stale_one(
    client: httpx.AsyncClient, bus: Bus, stamp: str
) -> None:
    """Correctly signed, at a time far from now: refused as a replay, with the same body whatever the distance."""
    raw = fixture_bytes("generic-order.json")
    response = await post(client, raw, trigger_id="orders-signed", headers=_signed_at(raw, "msg_far", stamp))
    assert response.status_code == 401, response.text
    assert response.json() == {
        "error": "unauthorized",
        "detail": "webhook-timestamp is more than 300 s away from now (replay, or a clock off)",
    }
    assert await journal(bus) == []


async def test_a_body_signed_trigger_refuses_an_oversized_body_without_journaling_it(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    response = await post(client, b" " * (MAX_BODY + 1), trigger_id="gh-review", headers={})
    assert response.status_code == 413
    assert await journal(bus) == []


async def test_a_signed_but_malformed_body_is_journaled_as_invalid_payload(client: httpx.AsyncClient, bus: Bus) -> None:
    raw = b"{not json"
    response = await post(client, raw, trigger_id="gh-review", headers=github_headers(raw, "push", "d-bad"))
    assert response.status_code == 400
    assert types(await journal(bus)) == ["trigger.received", "trigger.rejected"]
