"""docker-compose.yml turns on the console's password sign-in like ``temporality up`` does (issue 9): the
one-shot ``signin-secrets`` makes the session key and the inbox/API vouch secrets in a volume the journal,
human-interaction and the trigger-gateway mount read-only, and their settings point at those files.

No Docker here (as in ``tests/test_deploy_files.py``): the compose file is read as YAML, its ``${VAR:-default}``
values resolved as compose does, the one-shot's own command run on a directory standing for the volume, and each
service's settings -- the journal's sign-in itself -- built from the environment compose gives it, with the
mount point standing for that directory."""

from __future__ import annotations

import io
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from temporality_human_interaction.directory import Directory
from temporality_human_interaction.passwords import verify_password
from temporality_human_interaction.settings import Settings as HumanSettings
from temporality_journal import Settings as JournalSettings
from temporality_journal.signin import SignIn
from temporality_journal.signin_secrets import main
from temporality_service import ApiAuthSettings, Voucher
from temporality_service.secret_files import SIGN_IN_SECRETS as SECRETS

ROOT = Path(__file__).resolve().parents[1]
ONE_SHOT = "signin-secrets"
MOUNT = "/run/secrets/signin"
SIGNED_IN_SERVICES = ("journal", "human-interaction", "trigger-gateway")
#: ``${VAR:-default}`` and ``${VAR}`` in a compose value.
_VARIABLE = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(?::-([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    return doc


def resolved(value: str, environ: Mapping[str, str] | None = None) -> str:
    """A compose value as compose resolves it from ``environ`` (empty: every default)."""
    environ = environ or {}
    return _VARIABLE.sub(lambda m: environ.get(m[1]) or (m[2] or ""), value)


def environment(service: dict[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env = service.get("environment", {})
    assert isinstance(env, dict), "use the mapping form of environment"
    return {str(k): resolved(str(v), environ) for k, v in env.items()}


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> source[:mode] of a service's volumes (short syntax)."""
    found = {}
    for volume in service.get("volumes", []):
        match = re.fullmatch(r"(.*?):(/[^:]*)(:\w+)?", str(volume))  # the source may hold ${VAR:-default}
        assert match, volume
        found[match[2]] = match[1] + (match[3] or "")
    return found


def test_the_one_shot_makes_the_secrets_in_the_volume_the_services_mount(compose: dict[str, Any]) -> None:
    services = compose["services"]
    one_shot = services[ONE_SHOT]
    assert one_shot["image"] == services["journal"]["image"], "the journal's image runs it"
    assert one_shot["build"] == services["journal"]["build"]
    assert one_shot["restart"] == "no"
    assert one_shot["command"] == ["python", "-m", "temporality_journal.signin_secrets", "/app/.temporality"]
    # written where the image's user owns the directory (a new named volume there is that user's)
    assert mounts(one_shot) == {"/app/.temporality": "${SIGNIN_SECRETS_DIR:-signin-secrets}"}
    assert "signin-secrets" in compose["volumes"]
    for name in SIGNED_IN_SERVICES:
        service = services[name]
        assert mounts(service)[MOUNT] == "${SIGNIN_SECRETS_DIR:-signin-secrets}:ro", name  # the same, read-only
        assert service["depends_on"][ONE_SHOT] == {"condition": "service_completed_successfully"}, name
        assert service["depends_on"]["nats"] == {"condition": "service_healthy"}, name
    assert services["journal"]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    for name in set(services) - {*SIGNED_IN_SERVICES, ONE_SHOT}:  # no other service gets the secrets
        assert MOUNT not in mounts(services[name]), name


def test_the_one_shot_s_command_makes_private_secrets_once_and_keeps_them(tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    out, err = io.StringIO(), io.StringIO()
    assert main([str(volume)], out, err) == 0, err.getvalue()
    made = {name: (volume / name).read_text(encoding="utf-8") for name in SECRETS}
    assert len(set(made.values())) == len(SECRETS), "each secret its own"
    for name, secret in made.items():
        assert len(secret.strip()) >= 32, name
        assert stat.S_IMODE((volume / name).stat().st_mode) == 0o600, name
        assert secret.strip() not in out.getvalue(), "a secret is never printed"
    assert out.getvalue().splitlines() == [f"made {volume / name}" for name in SECRETS]

    again = io.StringIO()
    assert main([str(volume)], again, err) == 0
    assert {name: (volume / name).read_text(encoding="utf-8") for name in SECRETS} == made, "the next up keeps them"
    assert again.getvalue().splitlines() == [f"kept {volume / name}" for name in SECRETS]

    (volume / "api-vouch").write_text("short\n", encoding="utf-8")  # an operator's own, too short: said, exit 2
    refused = io.StringIO()
    assert main([str(volume)], io.StringIO(), refused) == 2
    assert "api-vouch" in refused.getvalue()
    assert "32" in refused.getvalue()
    assert main([], io.StringIO(), io.StringIO()) == 2


def _in_volume(value: str, volume: Path) -> str:
    return value.replace(MOUNT, str(volume)) if value.startswith(MOUNT) else value


def _apply(env: dict[str, str], volume: Path, monkeypatch: pytest.MonkeyPatch, prefixes: tuple[str, ...]) -> None:
    for key, value in env.items():
        if key.startswith(prefixes):
            monkeypatch.setenv(key, _in_volume(value, volume))


def test_compose_s_environment_signs_people_in_with_the_secrets_made(
    compose: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal's settings from compose's defaults: password sign-in on, the cookie not Secure (plain-http
    loopback), every secret file in the mount; its sign-in starts from them (the session key, the inbox
    vouching); human-interaction checks the same inbox vouch file and the gateway the same API vouch file."""
    volume = tmp_path / "volume"
    assert main([str(volume)], io.StringIO(), io.StringIO()) == 0
    services = compose["services"]
    journal = environment(services["journal"])
    assert journal["TEMPORALITY_JOURNAL_PASSWORD_SIGNIN"] == "true"
    assert journal["TEMPORALITY_JOURNAL_SESSION_COOKIE_SECURE"] == "false"
    files = {
        "TEMPORALITY_JOURNAL_SESSION_SECRET_FILE": f"{MOUNT}/session-secret",
        "TEMPORALITY_INBOX_VOUCH_SECRET_FILE": f"{MOUNT}/inbox-vouch",
        "TEMPORALITY_API_VOUCH_SECRET_FILE": f"{MOUNT}/api-vouch",
    }
    assert {k: journal[k] for k in files} == files
    assert {Path(v).name for v in files.values()} == set(SECRETS), "every file the one-shot makes is used"
    human = environment(services["human-interaction"])
    assert human["TEMPORALITY_INBOX_VOUCH_SECRET_FILE"] == files["TEMPORALITY_INBOX_VOUCH_SECRET_FILE"]
    gateway = environment(services["trigger-gateway"])
    assert gateway["TEMPORALITY_API_VOUCH_SECRET_FILE"] == files["TEMPORALITY_API_VOUCH_SECRET_FILE"]

    _apply(journal, volume, monkeypatch, ("TEMPORALITY_JOURNAL_PASSWORD_", "TEMPORALITY_JOURNAL_SESSION_"))
    _apply(journal, volume, monkeypatch, ("TEMPORALITY_INBOX_", "TEMPORALITY_API_VOUCH"))
    settings = JournalSettings()
    assert settings.password_signin is True
    assert settings.session_cookie_secure is False
    assert settings.oidc_issuer is None, "signin.env as shipped sets no provider"
    signin = SignIn.from_settings(settings)  # reads the session key and the inbox vouch secret
    assert signin is not None
    assert signin.secure is False
    assert signin.voucher is not None
    assert Voucher.from_file(ApiAuthSettings().vouch_secret_file or Path()) is not None  # the wizard's vouching
    assert HumanSettings().inbox_vouch_secret_file == volume / "inbox-vouch"

    # turned off from the shell or ./.env; the cookie Secure behind a TLS proxy
    off = environment(services["journal"], {"CONSOLE_PASSWORD_SIGNIN": "false", "CONSOLE_COOKIE_SECURE": "true"})
    _apply(off, volume, monkeypatch, ("TEMPORALITY_JOURNAL_PASSWORD_", "TEMPORALITY_JOURNAL_SESSION_"))
    assert JournalSettings().password_signin is False
    assert JournalSettings().session_cookie_secure is True


def test_the_oidc_example_and_the_secrets_dir_agree_with_the_mount(compose: dict[str, Any]) -> None:
    """signin.env, the OIDC example, names files in the same mount, ships nothing set (compose's environment
    then holds every password sign-in setting), and the journal reads it."""
    text = (ROOT / "deploy" / "compose" / "signin.env").read_text(encoding="utf-8")
    assert [line for line in text.splitlines() if line.strip() and not line.startswith("#")] == []
    for path in re.findall(r"TEMPORALITY_\w+_FILE=(\S+)", text):
        assert path.startswith(f"{MOUNT}/"), path
    assert "${SIGNIN_ENV_FILE:-./deploy/compose/signin.env}" in compose["services"]["journal"]["env_file"]


def test_the_shipped_directory_gives_the_demo_users_console_passwords() -> None:
    """The users file compose mounts: alice (operator) and bob (no role: his inbox) sign in with the documented
    DEMO passwords (config/users.yaml's header; docs/console.md)."""
    directory = Directory.from_yaml(ROOT / "config" / "users.yaml")
    alice, bob = directory.get("alice"), directory.get("bob")
    assert alice is not None
    assert bob is not None
    assert (alice.console_role, bob.console_role) == ("operator", None)
    assert alice.password_hash is not None
    assert bob.password_hash is not None
    assert verify_password(alice.password_hash, "alice-demo-password")
    assert verify_password(bob.password_hash, "bob-demo-password")
    assert not verify_password(alice.password_hash, "bob-demo-password")
