"""agent-collab's reply key for a deployment: ``python -m temporality_agent_collab.reply_key PATH``.

Makes the Ed25519 private key that signs agent-collab's replies to external agents
(``TEMPORALITY_COLLAB_REPLY_KEY_FILE``, docs/agent-collaboration.md#signed-replies) in ``PATH`` (PEM, PKCS#8,
unencrypted, mode 0600) when the file is missing, reuses it when it is there, writes its public key -- raw 32
bytes, standard base64: what an external agent checks replies with -- to ``PATH`` with the suffix ``.pub`` and
prints it (alone on stdout). docker compose runs it once before agent-collab starts (its service ``collab-reply-key``, on a named
volume), so the key is made on the first ``up`` and kept afterwards. Exit 2 for a file that holds no Ed25519
private key (it is never replaced) or a place it cannot be written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from temporality_agent_collab.signing import load_private_key, public_key_text

__all__ = ["ensure_reply_key", "main"]


def ensure_reply_key(path: Path) -> str:
    """The key in ``path``, made (mode 0600, create-only) when missing; its public key is written next to it
    (``.pub``) and returned. :class:`ValueError` for a file that holds no Ed25519 private key."""
    if path.exists():
        key = load_private_key(path.read_bytes())
    else:
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # made meanwhile by another run: use that one
            return ensure_reply_key(path)
        with os.fdopen(fd, "wb") as file:
            file.write(pem)
    public = public_key_text(key.public_key())
    public_file = path.with_suffix(".pub")
    if not public_file.exists() or public_file.read_text(encoding="utf-8").strip() != public:
        public_file.write_text(public + "\n", encoding="utf-8")
    return public


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m temporality_agent_collab.reply_key",
        description="Make (first time) or reuse agent-collab's reply signing key; print its public key.",
    )
    parser.add_argument("path", type=Path, help="the private key's file (PEM); the public key goes to <path>.pub")
    args = parser.parse_args(argv)
    try:
        public = ensure_reply_key(args.path)
    except ValueError as exc:
        sys.stderr.write(f"{args.path}: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"{args.path}: {exc.strerror or exc}\n")
        return 2
    sys.stderr.write(f"agent-collab's reply key: {args.path}; its public key (an agent's --collab-public-key):\n")
    sys.stdout.write(public + "\n")  # alone on stdout: PUBLIC_KEY=$(docker compose run --rm collab-reply-key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
