"""agent-collab's reply key in the embedded stack: made once per data dir (mode 0600), reused, handed to agent-collab."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from temporality_embedded.stack import COLLAB_REPLY_KEY_ID, Stack, StackConfig, ensure_reply_key


def test_the_key_is_made_once_kept_private_and_its_public_key_written_next_to_it(tmp_path: Path) -> None:
    path = tmp_path / "data" / "collab-reply-key.pem"
    public = ensure_reply_key(path)
    assert path.stat().st_mode & 0o077 == 0, "the reply key is readable by others"
    key = load_pem_private_key(path.read_bytes(), password=None)
    assert isinstance(key, Ed25519PrivateKey)
    assert base64.b64decode(public) == key.public_key().public_bytes_raw()
    assert path.with_suffix(".pub").read_text(encoding="utf-8") == public + "\n"
    pem = path.read_bytes()
    path.with_suffix(".pub").unlink()  # the public key is derived: written again from the kept key
    assert ensure_reply_key(path) == public
    assert path.read_bytes() == pem, "the key must be reused, not replaced"
    assert path.with_suffix(".pub").read_text(encoding="utf-8") == public + "\n"
    # made through a private temporary file linked into place: nothing else is left beside the key
    assert sorted(p.name for p in path.parent.iterdir()) == ["collab-reply-key.pem", "collab-reply-key.pub"]


@pytest.mark.parametrize("content", [b"not a key", b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"])
def test_an_unreadable_key_file_is_refused_not_replaced(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "collab-reply-key.pem"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"collab-reply-key\.pem"):
        ensure_reply_key(path)
    assert path.read_bytes() == content


def test_agent_collab_gets_the_key_only_when_asked(tmp_path: Path) -> None:
    signed = Stack(StackConfig(data_dir=tmp_path / "data", config_dir=tmp_path, collab_reply_key=True))
    env = signed.env_for("agent-collab")
    assert env["TEMPORALITY_COLLAB_REPLY_KEY_FILE"] == str(signed.collab_reply_key_file)
    assert env["TEMPORALITY_COLLAB_REPLY_KEY_ID"] == COLLAB_REPLY_KEY_ID
    assert "TEMPORALITY_COLLAB_REPLY_KEY_FILE" not in signed.env_for("journal")
    plain = Stack(StackConfig(data_dir=tmp_path / "data", config_dir=tmp_path))
    assert "TEMPORALITY_COLLAB_REPLY_KEY_FILE" not in plain.env_for("agent-collab")
