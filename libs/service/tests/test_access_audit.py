"""Refusals into the audit trail (:mod:`temporality_service.audit`): every 401/403 of the shared token check is an
``api.access_refused`` of the service that refused, rate-limited per caller and window, never with the token; the
OpenAPI document needs the viewer role; a NATS permissions violation is told apart from any other error."""

from __future__ import annotations

import json

import httpx
import nats.errors
from fastapi import FastAPI
from pydantic import SecretStr

from temporality_bus import Bus
from temporality_service import AccessAudit, ApiAuth, ApiToken, AsOperator, AsViewer, Role, install_error_handlers
from temporality_service.audit import RefusedRequest, permission_violation
from temporality_testing.events import EventLog

BAD_TOKEN = "a-token-nobody-issued-0123456789abcdef"
OPERATOR = "o" * 24 + "-operator"
VIEWER = "v" * 24 + "-viewer"


def _app(bus: Bus) -> FastAPI:
    app = FastAPI(title="probe")
    install_error_handlers(app)
    ApiAuth(
        [
            ApiToken(name="oncall", role=Role.operator, token=SecretStr(OPERATOR)),
            ApiToken(name="board", role=Role.viewer, token=SecretStr(VIEWER)),
        ]
    ).install(app)
    app.state.access_audit = AccessAudit(bus, "probe")  # what the service runtime sets on the app it serves

    @app.get("/things")
    async def things(who: AsViewer) -> dict[str, str]:
        return {"name": who.name}

    @app.post("/things/{thing_id}/stop")
    async def stop(thing_id: str, who: AsOperator) -> dict[str, str]:
        return {"name": who.name}

    return app


async def test_each_refusal_of_the_shared_check_is_an_audit_event_without_the_token(
    bus: Bus, event_log: EventLog
) -> None:
    app = _app(bus)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://probe") as client:
        assert (await client.get("/things")).status_code == 401
        bad = await client.get("/things", headers={"Authorization": f"Bearer {BAD_TOKEN}"})
        assert bad.status_code == 401  # the same address, another reason: an event of its own
        again = await client.get("/things", headers={"Authorization": f"Bearer {BAD_TOKEN}"})
        assert again.status_code == 401  # the same address, path and reason in the same window: counted only
        forbidden = await client.post("/things/t-1/stop", headers={"Authorization": f"Bearer {VIEWER}"})
        assert forbidden.status_code == 403
        assert (await client.get("/things", headers={"Authorization": f"Bearer {VIEWER}"})).status_code == 200
    events = await event_log.wait_for("api.access_refused", count=3)
    by_reason = {e.data["reason"]: e for e in events}
    unauthorized, denied = by_reason["unauthorized"], by_reason["forbidden"]
    assert by_reason["invalid_token"].actor == "address:127.0.0.1"
    assert unauthorized.source == "/temporality/probe"
    assert unauthorized.actor == "address:127.0.0.1"
    assert (unauthorized.data["service"], unauthorized.data["reason"], unauthorized.data["path"]) == (
        "probe",
        "unauthorized",
        "/things",
    )
    assert denied.actor == "token:board"
    assert (denied.data["principal"], denied.data["role_needed"], denied.data["path"]) == (
        "board",
        "operator",
        "/things/t-1/stop",
    )
    await app.state.access_audit.drain()
    app.state.access_audit.flush()
    await app.state.access_audit.drain()
    await event_log.caught_up()
    assert len(event_log.of_type("api.access_refused")) == 3  # the repeated one is in its window's total
    assert not [e for e in event_log.events if BAD_TOKEN in json.dumps(e.data) or VIEWER in json.dumps(e.data)]


async def test_the_openapi_document_needs_the_viewer_role_and_no_docs_pages_are_served(
    bus: Bus, event_log: EventLog
) -> None:
    app = _app(bus)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://probe") as client:
        anonymous = await client.get("/openapi.json")
        assert anonymous.status_code == 401, anonymous.text
        assert anonymous.headers["WWW-Authenticate"] == "Bearer"
        assert anonymous.json()["error"] == "unauthorized"
        document = await client.get("/openapi.json", headers={"Authorization": f"Bearer {VIEWER}"})
        assert document.status_code == 200, document.text
        assert set(document.json()["paths"]) == {"/things", "/things/{thing_id}/stop"}  # not itself
        for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            assert (await client.get(page)).status_code == 404, page
    (refused,) = await event_log.wait_for("api.access_refused", count=1)
    assert refused.data["path"] == "/openapi.json"
    ApiAuth().install(app)  # installing again keeps one guarded route
    assert [getattr(r, "path", None) for r in app.router.routes].count("/openapi.json") == 1


async def test_rate_limited_per_caller_and_window(bus: Bus, event_log: EventLog) -> None:
    now = [1_000_020.0]  # window 16667 of 60 s, second 0
    audit = AccessAudit(bus, "journal", window_s=60, max_callers=2, clock=lambda: now[0])
    scanner = RefusedRequest("GET", "/runs", "10.0.0.9")
    for _ in range(500):  # a scanner: one event at once, then its total when the window ends
        audit.refused(status=401, reason="invalid_token", request=scanner)
    audit.refused(
        status=403, reason="forbidden", request=RefusedRequest("POST", "/runs/r/cancel", "10.0.0.1"), principal="b"
    )
    for n in range(50):  # more callers than max_callers: one event for all of them
        audit.refused(status=401, reason="unauthorized", request=RefusedRequest("GET", "/", f"10.1.0.{n}"))
    # a webhook's refusals from the scanner's address are counted apart from its API refusals
    audit.refused(
        status=401, reason="bad_signature", request=RefusedRequest("POST", "/hooks/t", "10.0.0.9"), channel="webhook"
    )
    await audit.drain()
    firsts = await event_log.wait_for("api.access_refused", count=4)
    assert sorted((e.data["address"], e.data["count"], e.data["reason"]) for e in firsts) == [
        ("*", 1, "many_callers"),
        ("10.0.0.1", 1, "forbidden"),
        ("10.0.0.9", 1, "bad_signature"),
        ("10.0.0.9", 1, "invalid_token"),
    ]
    now[0] += 60  # the window ended: the totals of those with more refusals than reported
    audit.flush()
    await audit.drain()
    events = await event_log.wait_for("api.access_refused", count=6)
    totals = sorted((e.data["address"], e.data["count"], e.data["reason"]) for e in events[4:])
    assert totals == [("*", 50, "many_callers"), ("10.0.0.9", 500, "invalid_token")]
    await event_log.caught_up()
    assert len(event_log.of_type("api.access_refused")) == 6  # 552 refusals, 6 events
    # the next window: the scanner gets one event again
    audit.refused(status=401, reason="invalid_token", request=scanner)
    await audit.drain()
    (again,) = [e for e in await event_log.wait_for("api.access_refused", count=7) if e not in events]
    assert (again.data["address"], again.data["count"]) == ("10.0.0.9", 1)


async def test_one_address_is_counted_per_path_and_reason(bus: Bus, event_log: EventLog) -> None:
    """An integrator review: behind an ingress every sender has one address, and a window's total kept the first
    refusal's path and reason -- a wrong Azure DevOps password, 3 wrong GitLab tokens and 2 bad mindmap signatures
    were one line "401 bad_credentials POST /hooks/ado-pr (6 times)". Each (path, reason) is counted apart; past
    ``max_paths`` of one address, the rest are one ``many_paths`` event (the flood bound is unchanged)."""
    now = [1_000_020.0]
    audit = AccessAudit(bus, "trigger-gateway", window_s=60, max_paths=3, clock=lambda: now[0])

    def hook(path: str, reason: str) -> None:
        audit.refused(status=401, reason=reason, request=RefusedRequest("POST", path, "10.0.0.5"), channel="webhook")

    hook("/hooks/ado-pr", "bad_credentials")
    for _ in range(3):
        hook("/hooks/gl-mr", "bad_credentials")
    for _ in range(2):
        hook("/hooks/mm", "bad_signature")
    await audit.drain()
    firsts = await event_log.wait_for("api.access_refused", count=3)
    assert sorted((e.data["path"], e.data["reason"], e.data["count"]) for e in firsts) == [
        ("/hooks/ado-pr", "bad_credentials", 1),
        ("/hooks/gl-mr", "bad_credentials", 1),
        ("/hooks/mm", "bad_signature", 1),
    ]
    for n in range(20):  # a fourth and further paths of the same address: one event for them all
        hook(f"/hooks/other-{n}", "bad_credentials")
    await audit.drain()
    (many,) = (await event_log.wait_for("api.access_refused", count=4))[3:]
    assert (many.data["address"], many.data["path"], many.data["reason"]) == ("10.0.0.5", "*", "many_paths")
    now[0] += 60
    audit.flush()
    await audit.drain()
    events = await event_log.wait_for("api.access_refused", count=7)
    totals = sorted((e.data["path"], e.data["reason"], e.data["count"]) for e in events[4:])
    assert totals == [
        ("*", "many_paths", 20),
        ("/hooks/gl-mr", "bad_credentials", 3),
        ("/hooks/mm", "bad_signature", 2),
    ]
    await event_log.caught_up()
    assert len(event_log.of_type("api.access_refused")) == 7


async def test_permissions_violations_are_counted_per_subject_and_other_errors_ignored(
    bus: Bus, event_log: EventLog
) -> None:
    now = [2_000_040.0]
    audit = AccessAudit(bus, "trigger-gateway", window_s=60, clock=lambda: now[0])
    violation = nats.errors.Error('nats: Permissions Violation for Publish to "temporality.events.human.answered"')
    for _ in range(3):
        audit.nats_error(violation)
    audit.nats_error(nats.errors.Error('nats: Permissions Violation for Subscription to "_INBOX.x.>" using queue "q"'))
    audit.nats_error(nats.errors.Error("nats: Maximum Payload Violation"))  # not a refusal of the permissions
    own = 'nats: Permissions Violation for Publish to "temporality.events.bus.permission_refused"'
    audit.nats_error(nats.errors.Error(own))
    await audit.drain()
    firsts = await event_log.wait_for("bus.permission_refused", count=2)
    assert sorted((e.data["operation"], e.data["subject"], e.data["queue"]) for e in firsts) == [
        ("publish", "temporality.events.human.answered", None),
        ("subscribe", "_INBOX.x.>", "q"),
    ]
    assert {e.data["service"] for e in firsts} == {"trigger-gateway"}
    now[0] += 60
    audit.flush()
    await audit.drain()
    (total,) = [e for e in await event_log.wait_for("bus.permission_refused", count=3) if e not in firsts]
    assert (total.data["subject"], total.data["count"]) == ("temporality.events.human.answered", 3)
    await event_log.caught_up()
    assert len(event_log.of_type("bus.permission_refused")) == 3  # the audit's own subject: logged only
    assert permission_violation('nats: Permissions Violation for Publish with Reply of "_INBOX.a.b"') == (
        "publish",
        "_INBOX.a.b",
        None,
    )
    assert permission_violation("nats: Authorization Violation") is None
