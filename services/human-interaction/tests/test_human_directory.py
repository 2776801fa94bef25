"""The user directory (HUM-2): the shipped file, strict parsing, token lookup, channel order."""

from __future__ import annotations

from pathlib import Path

import pytest
from human_support import USERS_FILE

from temporality_human_interaction.channels import WebInboxAdapter
from temporality_human_interaction.directory import (
    Directory,
    DirectoryError,
    group_id_of,
    hash_token,
    parse_directory,
    user_id_of,
)
from temporality_human_interaction.requests import ChannelChoice, channel_candidates


def _raw(**alice: object) -> dict[str, object]:
    profile: dict[str, object] = {
        "display_name": "Alice",
        "inbox_token": "alice-token-1",
        "preferred": "web",
        "channels": {"web": {}},
    }
    profile.update(alice)
    return {"users": {"alice": profile}}


def test_shipped_directory_has_alice_on_matrix_and_bob_on_web() -> None:
    directory = Directory.from_yaml(USERS_FILE)
    alice, bob = directory.get("alice"), directory.get("bob")
    assert alice is not None
    assert bob is not None
    assert alice.channel_order() == ["matrix", "web"]
    assert alice.channels.matrix is not None
    assert alice.channels.matrix.user_id == "@alice:example.org"
    assert bob.channel_order() == ["web"]
    assert directory.user_for_token("alice-demo-inbox-token-change-me") == "alice"
    assert directory.user_for_token("bob-demo-inbox-token-change-me") == "bob"
    assert directory.user_for_token("alice-demo-inbox-token-change-me ") is None
    assert directory.user_for_token("") is None


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(DirectoryError, match="colour"):
        Directory.from_mapping(_raw(colour="blue"))
    with pytest.raises(DirectoryError, match="signal"):
        Directory.from_mapping(_raw(channels={"web": {}, "signal": {}}))


def test_preferred_and_fallback_must_be_configured_channels() -> None:
    with pytest.raises(DirectoryError, match="telegram"):
        Directory.from_mapping(_raw(preferred="telegram"))
    with pytest.raises(DirectoryError, match="matrix"):
        Directory.from_mapping(_raw(fallback=["matrix"]))


def test_token_from_environment_and_missing_variable() -> None:
    raw = _raw(inbox_token=None, inbox_token_env="ALICE_TOKEN")
    directory = Directory.from_mapping(raw, environ={"ALICE_TOKEN": "from-the-env"})
    assert directory.user_for_token("from-the-env") == "alice"
    with pytest.raises(DirectoryError, match="ALICE_TOKEN"):
        Directory.from_mapping(raw, environ={})


def test_web_channel_without_an_inbox_token_is_refused() -> None:
    with pytest.raises(DirectoryError, match="channel 'web' is configured but the user has no inbox_token"):
        Directory.from_mapping(_raw(inbox_token=None))
    with pytest.raises(DirectoryError, match="no inbox_token"):
        Directory.from_mapping(
            _raw(
                inbox_token=None,
                preferred="matrix",
                fallback=["web"],
                channels={"matrix": {"user_id": "@a:b.org"}, "web": {}},
            )
        )
    # Without the web channel no token is needed: the person is reached (and answers) elsewhere.
    matrix_only = Directory.from_mapping(
        _raw(inbox_token=None, preferred="matrix", channels={"matrix": {"user_id": "@a:b.org"}})
    )
    assert "alice" in matrix_only


def test_unreadable_file_is_a_directory_error(tmp_path: Path) -> None:
    with pytest.raises(DirectoryError, match="cannot read"):
        Directory.from_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("users: [unclosed\n")
    with pytest.raises(DirectoryError, match="YAML"):
        Directory.from_yaml(bad)


def test_recipients_must_name_a_person() -> None:
    assert user_id_of("user:alice") == "alice"
    assert user_id_of("alice") is None
    assert user_id_of("user:") is None
    assert user_id_of("matrix:@alice:example.org") is None
    assert user_id_of("user:a b") is None


async def test_channel_choice_falls_back_when_the_preferred_adapter_is_missing_or_down() -> None:
    alice = Directory.from_yaml(USERS_FILE).get("alice")
    assert alice is not None
    web = WebInboxAdapter()
    assert channel_candidates(alice, {"web": web}) == []  # not initialized: unavailable
    async with web:
        assert channel_candidates(alice, {"web": web}) == [ChannelChoice("web", fallback_from="matrix")]
    assert not web.available


def test_groups_in_the_file_must_list_known_users_once() -> None:
    raw = _raw()
    directory = Directory.from_mapping({**raw, "groups": {"owners": {"display_name": "Owners", "members": ["alice"]}}})
    group = directory.group("owners")
    assert group is not None
    assert group.members == ["alice"]
    assert directory.groups_with("alice") == ["owners"]
    with pytest.raises(DirectoryError, match="zed"):
        Directory.from_mapping({**raw, "groups": {"owners": {"display_name": "Owners", "members": ["alice", "zed"]}}})
    with pytest.raises(DirectoryError, match="twice"):
        Directory.from_mapping({**raw, "groups": {"owners": {"display_name": "O", "members": ["alice", "alice"]}}})
    with pytest.raises(DirectoryError, match="members"):
        Directory.from_mapping({**raw, "groups": {"owners": {"display_name": "Owners", "members": []}}})


def test_a_literal_token_is_kept_only_as_its_hash() -> None:
    users, _ = parse_directory(_raw())
    alice = users["alice"]
    assert alice.inbox_token is None
    assert alice.inbox_token_sha256 == hash_token("alice-token-1")
    assert "alice-token-1" not in alice.model_dump_json()
    assert Directory(users).user_for_token("alice-token-1") == "alice"
    with pytest.raises(DirectoryError, match="inbox_token"):
        Directory.from_mapping(_raw(inbox_token="short"))


def test_ids_are_kv_safe_and_groups_are_recipients() -> None:
    for bad in ("a..b", ".a", "a.", "a b", "x" * 65):
        with pytest.raises(DirectoryError):
            Directory.from_mapping({"users": {bad: _raw()["users"]["alice"]}})  # type: ignore[index]
    assert "john.doe" in Directory.from_mapping({"users": {"john.doe": _raw()["users"]["alice"]}})  # type: ignore[index]
    assert group_id_of("group:api-owners") == "api-owners"
    assert group_id_of("user:alice") is None
    assert user_id_of("group:api-owners") is None
    assert group_id_of("group:a..b") is None
