"""``python -m temporality_journal.signin_secrets DIR``: the console sign-in's secret files, made when missing.

docker compose runs it once before the services start (its one-shot ``signin-secrets``, in the journal's
image), as ``temporality up`` makes them in ``<data-dir>/signin``: in ``DIR`` each of :data:`SECRETS` that is
missing is written with 64 random URL-safe characters, mode 0600; one already there is kept (checked to hold at
least 32 characters). The secrets never reach standard output or a log -- only which files were made or kept.

===================  ===================================================================================
``session-secret``   signs the journal's session cookie (``TEMPORALITY_JOURNAL_SESSION_SECRET_FILE``)
``inbox-vouch``      the journal vouches for a signed-in person's inbox calls; human-interaction checks
                     (``TEMPORALITY_INBOX_VOUCH_SECRET_FILE``, both services)
``api-vouch``        the journal vouches for a signed-in person's role to the trigger-gateway (the wizard)
                     (``TEMPORALITY_API_VOUCH_SECRET_FILE``, both services)
===================  ===================================================================================

Exit 0 when every file is there, 2 when ``DIR`` cannot be written or a kept file is too short (said on
standard error).
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import TextIO

__all__ = ["MIN_LENGTH", "SECRETS", "ensure_secrets", "main"]

#: The files made, in this order.
SECRETS = ("session-secret", "inbox-vouch", "api-vouch")
#: The fewest characters the services accept in any of them.
MIN_LENGTH = 32


def ensure_secrets(directory: Path) -> dict[str, str]:
    """Each of :data:`SECRETS` in ``directory``, made when missing: ``{name: "made" | "kept"}``; ``ValueError``
    for a kept file shorter than :data:`MIN_LENGTH`, ``OSError`` when it cannot be written."""
    directory.mkdir(parents=True, exist_ok=True)
    done: dict[str, str] = {}
    for name in SECRETS:
        path = directory / name
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if len(path.read_text(encoding="utf-8").strip()) < MIN_LENGTH:
                raise ValueError(
                    f"{path}: holds fewer than {MIN_LENGTH} characters; remove it to have one made"
                ) from None
            done[name] = "kept"
            continue
        with os.fdopen(fd, "w", encoding="ascii") as file:
            file.write(secrets.token_urlsafe(48) + "\n")
        done[name] = "made"
    return done


def main(argv: list[str] | None = None, stdout: TextIO = sys.stdout, stderr: TextIO = sys.stderr) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        stderr.write("usage: python -m temporality_journal.signin_secrets DIR\n")
        return 2
    try:
        done = ensure_secrets(Path(args[0]))
    except (OSError, ValueError) as exc:
        stderr.write(f"signin_secrets: {exc}\n")
        return 2
    for name, what in done.items():
        stdout.write(f"{what} {Path(args[0]) / name}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
