"""The embedded stack's NATS passwords: random per data dir, mode 0600, reused across restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from temporality_embedded.stack import NATS_ADMIN, Stack, StackConfig, ensure_nats_passwords
from temporality_protocol.catalog import SERVICES


def test_passwords_are_made_once_kept_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "data" / "nats-users.json"
    first = ensure_nats_passwords(path, ["journal", "sub-audit"])
    assert path.stat().st_mode & 0o077 == 0, "the passwords file is readable by others"
    assert len(set(first.values())) == 2
    assert all(len(p) >= 24 for p in first.values())
    again = ensure_nats_passwords(path, ["journal", "sub-audit", "sub-new"])
    assert {k: again[k] for k in first} == first, "kept passwords must be reused"
    assert ensure_nats_passwords(path, ["sub-new"]) == {"sub-new": again["sub-new"]}
    assert path.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("content", ["not json", '["a list"]', '{"journal": 3}', '{"journal": ""}'])
def test_an_unreadable_passwords_file_is_refused_not_replaced(tmp_path: Path, content: str) -> None:
    path = tmp_path / "nats-users.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=r"nats-users\.json"):
        ensure_nats_passwords(path, ["journal"])
    assert path.read_text(encoding="utf-8") == content


def test_every_service_and_the_subscribers_get_a_user_only_with_nats_auth(tmp_path: Path) -> None:
    plain = Stack(StackConfig(data_dir=tmp_path / "plain", config_dir=tmp_path))
    assert "TEMPORALITY_NATS_USER" not in plain.env_for("journal")
    assert plain.nats_admin is None
    assert plain.subscriber("example") is None
    assert not (tmp_path / "plain" / "nats-users.json").exists()
    stack = Stack(
        StackConfig(data_dir=tmp_path / "d", config_dir=tmp_path, nats_auth=True, nats_subscribers=("audit",))
    )
    for name in SERVICES:
        env = stack.env_for(name)
        assert env["TEMPORALITY_NATS_USER"] == name
        assert env["TEMPORALITY_NATS_PASSWORD"]
    assert stack.nats_admin is not None
    assert stack.nats_admin[0] == NATS_ADMIN
    assert stack.subscriber("audit") == ("sub-audit", stack._nats_passwords["sub-audit"], "_INBOX.sub-audit")
    assert stack.subscriber("example") is None  # not configured
    reopened = Stack(
        StackConfig(data_dir=tmp_path / "d", config_dir=tmp_path, nats_auth=True, nats_subscribers=("audit",))
    )
    assert reopened.subscriber("audit") == stack.subscriber("audit"), "the same data dir, the same passwords"
    with pytest.raises(ValueError, match="subscriber name"):
        Stack(StackConfig(data_dir=tmp_path / "x", config_dir=tmp_path, nats_auth=True, nats_subscribers=("a.b",)))
