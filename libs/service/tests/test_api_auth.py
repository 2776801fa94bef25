"""Role tokens: the file is validated at start, 401 without a valid token, 403 below the role, no token logged."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from temporality_service import (
    PRINCIPAL_HEADER,
    ApiAuth,
    ApiAuthSettings,
    ApiToken,
    PrincipalVoucher,
    Role,
    TokenFileError,
    Voucher,
    install_error_handlers,
)
from temporality_service.auth import AsAdmin, AsOperator, AsViewer, load_tokens

ADMIN = "a" * 24 + "-admin"
OPERATOR = "o" * 24 + "-operator"
VIEWER = "v" * 24 + "-viewer"


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tokens.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _tokens_file(tmp_path: Path) -> Path:
    return _file(
        tmp_path,
        f"- {{name: root, role: admin, token: {ADMIN}}}\n"
        f"- {{name: oncall, role: operator, token: {OPERATOR}}}\n"
        f"- {{name: board, role: viewer, token: {VIEWER}}}\n",
    )


def _app(auth: ApiAuth) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    auth.install(app)

    @app.get("/read")
    async def read(who: AsViewer) -> dict[str, str]:
        return {"name": who.name, "role": str(who.role)}

    @app.post("/toggle")
    async def toggle(who: AsOperator) -> dict[str, str]:
        return {"name": who.name}

    @app.delete("/thing")
    async def delete(who: AsAdmin) -> dict[str, str]:
        return {"name": who.name}

    return app


async def _call(app: FastAPI, method: str, path: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.request(method, path, headers=headers)


async def test_roles_are_ordered_and_enforced(tmp_path: Path) -> None:
    auth = ApiAuth.from_settings(ApiAuthSettings(tokens_file=_tokens_file(tmp_path)))
    app = _app(auth)
    assert (await _call(app, "GET", "/read", VIEWER)).json() == {"name": "board", "role": "viewer"}
    assert (await _call(app, "GET", "/read", ADMIN)).status_code == 200
    assert (await _call(app, "POST", "/toggle", OPERATOR)).status_code == 200
    refused = await _call(app, "POST", "/toggle", VIEWER)
    assert refused.status_code == 403
    assert refused.json()["error"] == "forbidden"
    assert "operator" in refused.json()["detail"]
    assert (await _call(app, "DELETE", "/thing", OPERATOR)).status_code == 403
    assert (await _call(app, "DELETE", "/thing", ADMIN)).status_code == 200


@pytest.mark.parametrize("header", [None, "", "Basic dXNlcjpwYXNz", "Bearer ", "Bearer wrong-token-of-enough-length"])
async def test_missing_or_wrong_token_is_401_with_a_challenge(tmp_path: Path, header: str | None) -> None:
    app = _app(ApiAuth.from_settings(ApiAuthSettings(tokens_file=_tokens_file(tmp_path))))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        response = await client.get("/read", headers={} if header is None else {"Authorization": header})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.json()["error"] in {"unauthorized", "invalid_token"}


async def test_no_tokens_configured_admits_nobody() -> None:
    auth = ApiAuth.from_settings(ApiAuthSettings())
    assert not auth.configured
    assert (await _call(_app(auth), "GET", "/read", VIEWER)).status_code == 401


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- {name: x, role: admin, token: short}\n", "at least 24"),
        (f"- {{name: x, role: boss, token: {ADMIN}}}\n", "unknown role 'boss'"),
        (f"- {{name: x, role: admin, token: {ADMIN}, extra: 1}}\n", "extra"),
        (f"- {{name: x, role: admin, token: {ADMIN}}}\n- {{name: x, role: viewer, token: {VIEWER}}}\n", "twice"),
        (f"- {{name: x, role: admin, token: {ADMIN}}}\n- {{name: y, role: viewer, token: {ADMIN}}}\n", "another"),
        ("{not: a list}\n", "list"),
        ("- [unclosed\n", "not YAML"),
    ],
)
def test_invalid_token_files_are_refused_naming_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TokenFileError, match=message) as caught:
        load_tokens(_file(tmp_path, text))
    assert ADMIN not in str(caught.value)  # a refused file never echoes a secret


@pytest.mark.parametrize(
    ("name", "prefix"),
    [
        ("user:alice", "user:"),
        ("USER:alice", "user:"),
        ("user:", "user:"),
        ("unknown-user:0123456789ab", "unknown-user:"),
        ("Unknown-User:x", "unknown-user:"),
    ],
)
def test_a_token_named_like_a_signed_in_person_is_refused_at_load(tmp_path: Path, name: str, prefix: str) -> None:
    # user:<id> is a person the journal vouches for, unknown-user:<digest> a refused sign-in's unknown id; a token
    # so named would be journaled as that person (or that attempt).
    text = f"- {{name: ci, role: viewer, token: {VIEWER}}}\n- {{name: '{name}', role: admin, token: {ADMIN}}}\n"
    with pytest.raises(TokenFileError, match=rf"entry 1\.name: .*starts with '{prefix}'") as caught:
        load_tokens(_file(tmp_path, text))
    assert ADMIN not in str(caught.value)
    with pytest.raises(ValidationError, match=f"starts with '{prefix}'"):
        ApiToken(name=name, role=Role.admin, token=ADMIN)  # type: ignore[arg-type]


def test_token_names_merely_containing_user_are_admitted(tmp_path: Path) -> None:
    text = f"- {{name: 'bot-user:x', role: viewer, token: {VIEWER}}}\n- {{name: users, role: admin, token: {ADMIN}}}\n"
    assert [t.name for t in load_tokens(_file(tmp_path, text))] == ["bot-user:x", "users"]


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenFileError, match="cannot read"):
        load_tokens(tmp_path / "absent.yaml")


def test_the_shipped_example_tokens_file_is_valid_and_covers_every_role() -> None:
    example = Path(__file__).resolve().parents[3] / "config" / "api-tokens.example.yaml"
    tokens = load_tokens(example)
    assert {t.role for t in tokens} == set(Role)
    assert all("demo" in t.token.get_secret_value() for t in tokens), "the shipped tokens must say they are demo ones"


# --------------------------------------------------------------------------- vouched principals
SECRET = "s" * 40


def _vouching(tmp_path: Path) -> ApiAuth:
    (tmp_path / "vouch").write_text(SECRET, encoding="utf-8")
    return ApiAuth.from_settings(
        ApiAuthSettings(tokens_file=_tokens_file(tmp_path), vouch_secret_file=tmp_path / "vouch")
    )


async def _vouched_call(app: FastAPI, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.request(method, path, headers=headers)


async def test_a_vouched_principal_is_admitted_with_its_role(tmp_path: Path) -> None:
    app = _app(_vouching(tmp_path))
    operator = {PRINCIPAL_HEADER: PrincipalVoucher(SECRET).vouch_principal("user:alice", "operator")}
    read = await _vouched_call(app, "GET", "/read", operator)
    assert read.status_code == 200, read.text
    assert read.json() == {"name": "user:alice", "role": "operator"}
    assert (await _vouched_call(app, "POST", "/toggle", operator)).status_code == 200
    below = await _vouched_call(app, "DELETE", "/thing", operator)
    assert below.status_code == 403
    assert "user:alice has operator" in below.json()["detail"]
    # a bearer, when sent, is what counts
    both = await _vouched_call(app, "GET", "/read", {**operator, "Authorization": f"Bearer {VIEWER}"})
    assert both.json() == {"name": "board", "role": "viewer"}


#: Assertions a caller could bring, made when the test runs (a signature holds the time: as parameters, the
#: ids would differ between xdist workers, which then refuse to run the suite).
FORGED = {
    "another-secret": lambda: PrincipalVoucher("x" * 40).vouch_principal("user:alice", "admin"),
    "the-inbox-salt": lambda: Voucher(SECRET).vouch('{"name":"user:alice","role":"admin"}'),
    "altered": lambda: PrincipalVoucher(SECRET).vouch_principal("user:alice", "admin") + "x",
    "no-such-role": lambda: PrincipalVoucher(SECRET).vouch_principal("user:alice", "root"),
    "not-a-principal": lambda: PrincipalVoucher(SECRET).vouch("alice"),
}


@pytest.mark.parametrize("forged", sorted(FORGED))
async def test_a_forged_or_foreign_assertion_is_401(tmp_path: Path, forged: str) -> None:
    assertion = FORGED[forged]()
    refused = await _vouched_call(_app(_vouching(tmp_path)), "GET", "/read", {PRINCIPAL_HEADER: assertion})
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"] == "invalid_vouch"


async def test_a_stale_assertion_is_401_and_without_the_setting_the_header_counts_for_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assertion = PrincipalVoucher(SECRET).vouch_principal("user:alice", "admin")
    monkeypatch.setattr("itsdangerous.timed.time.time", lambda: 10**10)  # far past MAX_AGE_S
    stale = await _vouched_call(_app(_vouching(tmp_path)), "GET", "/read", {PRINCIPAL_HEADER: assertion})
    assert stale.status_code == 401
    monkeypatch.undo()
    tokens_only = ApiAuth.from_settings(ApiAuthSettings(tokens_file=_tokens_file(tmp_path)))
    ignored = await _vouched_call(_app(tokens_only), "GET", "/read", {PRINCIPAL_HEADER: assertion})
    assert ignored.status_code == 401
    assert ignored.json()["error"] == "unauthorized"  # as without any header: tokens only


def test_an_unusable_vouch_secret_file_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "short").write_text("too short", encoding="utf-8")
    with pytest.raises(TokenFileError, match="TEMPORALITY_API_VOUCH_SECRET_FILE"):
        ApiAuth.from_settings(ApiAuthSettings(vouch_secret_file=tmp_path / "short"))
    with pytest.raises(TokenFileError, match="cannot read"):
        ApiAuth.from_settings(ApiAuthSettings(vouch_secret_file=tmp_path / "missing"))
