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
import sys
from pathlib import Path

from temporality_service.secret_files import ensure_ed25519_key as ensure_reply_key

__all__ = ["ensure_reply_key", "main"]


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
        sys.stderr.write(f"{exc}\n")  # it names the file
        return 2
    except OSError as exc:
        sys.stderr.write(f"{args.path}: {exc.strerror or exc}\n")
        return 2
    sys.stderr.write(f"agent-collab's reply key: {args.path}; its public key (an agent's --collab-public-key):\n")
    sys.stdout.write(public + "\n")  # alone on stdout: PUBLIC_KEY=$(docker compose run --rm collab-reply-key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
