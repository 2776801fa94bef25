"""The console sign-in's secret files, made when missing: one implementation for ``temporality up`` (in
``<data-dir>/signin``) and docker compose's one-shot (``python -m temporality_journal.signin_secrets DIR``).

===================  ===================================================================================
``session-secret``   signs the journal's session cookie (``TEMPORALITY_JOURNAL_SESSION_SECRET_FILE``)
``inbox-vouch``      the journal vouches for a signed-in person's inbox calls; human-interaction checks
                     (``TEMPORALITY_INBOX_VOUCH_SECRET_FILE``, both services)
``api-vouch``        the journal vouches for a signed-in person's role to the trigger-gateway (the wizard)
                     (``TEMPORALITY_API_VOUCH_SECRET_FILE``, both services)
===================  ===================================================================================
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Literal

__all__ = ["MIN_SECRET_LENGTH", "SIGN_IN_SECRETS", "ensure_secret_file"]

#: The files of the console sign-in's secrets, in the order they are made.
SIGN_IN_SECRETS = ("session-secret", "inbox-vouch", "api-vouch")
#: The fewest characters the services accept in a secret file.
MIN_SECRET_LENGTH = 32


def ensure_secret_file(path: Path) -> Literal["made", "kept"]:
    """A random secret (64 URL-safe characters) in ``path``, mode 0600, written whole or not at all when the file
    is missing (``"made"``); one already there is kept (``"kept"``). ``ValueError`` for a kept file shorter than
    :data:`MIN_SECRET_LENGTH`, ``OSError`` when it cannot be written."""
    if path.exists():
        if len(path.read_text(encoding="utf-8").strip()) < MIN_SECRET_LENGTH:
            raise ValueError(f"{path}: holds fewer than {MIN_SECRET_LENGTH} characters; remove it to have one made")
        return "kept"
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = path.with_name(path.name + ".new")
    fresh.unlink(missing_ok=True)
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as file:
        file.write(secrets.token_urlsafe(48) + "\n")
    fresh.replace(path)
    return "made"
