"""``python -m temporality_journal.signin_secrets DIR``: the console sign-in's secret files, made when missing.

docker compose runs it once before the services start (its one-shot ``signin-secrets``, in the journal's
image), as ``temporality up`` makes them in ``<data-dir>/signin``: in ``DIR`` each of
:data:`~temporality_service.secret_files.SIGN_IN_SECRETS` that is missing is written with 64 random URL-safe
characters, mode 0600; one already there is kept (checked to hold at least 32 characters). The secrets never
reach standard output or a log -- only which files were made or kept.

Exit 0 when every file is there, 2 when ``DIR`` cannot be written or a kept file is too short (said on
standard error).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from temporality_service.secret_files import SIGN_IN_SECRETS, ensure_secret_file

__all__ = ["ensure_secrets", "main"]


def ensure_secrets(directory: Path) -> dict[str, str]:
    """Each sign-in secret in ``directory``, made when missing: ``{name: "made" | "kept"}``; ``ValueError``
    for a kept file that is too short, ``OSError`` when it cannot be written."""
    return {name: ensure_secret_file(directory / name) for name in SIGN_IN_SECRETS}


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
