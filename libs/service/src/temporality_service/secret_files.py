"""Secret files made when missing, one implementation for ``temporality up`` and docker compose's one-shots.

The console sign-in's secrets (:func:`ensure_secret_file`; ``temporality up`` makes them in ``<data-dir>/signin``,
compose with ``python -m temporality_journal.signin_secrets DIR``):

===================  ===================================================================================
``session-secret``   signs the journal's session cookie (``TEMPORALITY_JOURNAL_SESSION_SECRET_FILE``)
``inbox-vouch``      the journal vouches for a signed-in person's inbox calls; human-interaction checks
                     (``TEMPORALITY_INBOX_VOUCH_SECRET_FILE``, both services)
``api-vouch``        the journal vouches for a signed-in person's role to the trigger-gateway (the wizard)
                     (``TEMPORALITY_API_VOUCH_SECRET_FILE``, both services)
===================  ===================================================================================

agent-collab's reply signing key (:func:`ensure_ed25519_key`; ``temporality up`` in its data dir, compose with
``python -m temporality_agent_collab.reply_key PATH``).
"""

from __future__ import annotations

import base64
import os
import secrets
from pathlib import Path
from typing import Literal

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)

__all__ = ["MIN_SECRET_LENGTH", "SIGN_IN_SECRETS", "ensure_ed25519_key", "ensure_secret_file", "load_ed25519_key"]

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


def load_ed25519_key(pem: bytes) -> Ed25519PrivateKey:
    """An Ed25519 private key from PEM (PKCS#8, unencrypted); :class:`ValueError` otherwise."""
    try:
        key = load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise ValueError(f"not a readable unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"a {type(key).__name__.removesuffix('PrivateKey').lstrip('_')} key, not Ed25519")
    return key


def ensure_ed25519_key(path: Path) -> str:
    """The Ed25519 key in ``path`` (PEM, PKCS#8, unencrypted, mode 0600), made when the file is missing; its public
    key (raw 32 bytes, standard base64) is (re)written to ``path`` with the suffix ``.pub`` and returned.

    Made whole or not at all, and create-only: the key is written to a private temporary file and hard-linked into
    place, so a crash never leaves half a key and two makers at once end up with the same one (the second uses the
    first's). A file already there is never replaced: ``ValueError`` (naming ``path``) when it holds no such key."""
    if not path.exists():
        key = Ed25519PrivateKey.generate()
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = path.with_name(f"{path.name}.{secrets.token_hex(8)}.new")
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
                file.flush()
                os.fsync(file.fileno())
            try:
                os.link(fresh, path)
            except FileExistsError:  # made meanwhile by another maker: that one is the key
                pass
        finally:
            fresh.unlink(missing_ok=True)
    try:
        key = load_ed25519_key(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode("ascii")
    public_file = path.with_suffix(".pub")
    if not public_file.exists() or public_file.read_text(encoding="utf-8").strip() != public:
        public_file.write_text(public + "\n", encoding="utf-8")
    return public
