"""Console passwords (issue 9): the Argon2id hashes of the directory, the check the journal asks for, and
``temporality-human-interaction hash-password``.

Human-interaction is the only holder of the hashes (in the directory store, :mod:`.directory`); the journal's
password sign-in asks it over NATS request/reply (``temporality.rpc.human.verify_password``, only the journal's
NATS user may send it) whether a password signs a user in, and gets the user's display name and console role
back -- never the hash.

Hashing is **argon2-cffi**'s ``PasswordHasher`` (Argon2id, its RFC 9106 low-memory defaults: 64 MiB, 3 passes,
4 lanes): :func:`hash_password`, :func:`verify_password`. Nothing here implements a hash.

:class:`PasswordResponder` answers the check (queue group ``human-interaction``: replicas share it):

==========================================  =====================================================
the request                                 the reply
==========================================  =====================================================
the user's password                         ``ok``, the user id, display name and console role
an unknown user, a user without a           ``ok: false`` -- the same for all three, and as slow:
password, a wrong password                  an unknown user's password is checked against a dummy
                                            hash, so the time does not tell whether the user exists
malformed, no common protocol version,      ``ok: false`` with ``error`` (the journal answers 503)
a failure
==========================================  =====================================================

The check runs in a worker thread (Argon2 is CPU- and memory-bound; the event loop goes on), at most
``max_inflight`` at once. Logged: ``passwords.verified`` (user id, role) and ``passwords.refused``: for a user
of the directory its id and whether it has a password; for anything else only ``user_known: false`` -- what was
typed is not logged (people type their password into the user id field; the journal's log and audit event of the
same attempt carry a keyed digest of it instead). Never a password or a hash.
Attempt limits are the journal's (it sees the caller's address).

:class:`ConsoleRoleResponder` answers ``temporality.rpc.human.console_role``: a user's ``console_role`` (null for
an unknown user or none), which the journal asks for a person signed in with the OIDC provider whose groups
give no role, when ``TEMPORALITY_JOURNAL_OIDC_DIRECTORY_ROLES`` is on -- and, every few seconds, for each person
signed in with a password or with a directory role, to end their sessions once the directory changed.

Both replies carry the user's :func:`fingerprint` (a digest of the user id, console role and password hash; null
for an unknown user): a role change, a new or removed password, or the user's removal changes it, and the journal
then ends the sessions signed in with the old one.

``temporality-human-interaction hash-password`` reads a password (twice from a terminal, else the first line of
standard input) and prints its hash, for ``password_hash`` in the users file.
"""

from __future__ import annotations

import asyncio
import getpass
import hashlib
import secrets
import sys
from functools import cache
from typing import TYPE_CHECKING, TextIO

import structlog

from temporality_bus import Bus, Failure, Request, Responder
from temporality_human_interaction.directory import Directory, UserProfile
from temporality_protocol import ConsoleRoleQuery, ConsoleRoleReply, PasswordCheck, PasswordCheckReply
from temporality_protocol.catalog import RPC_HUMAN_CONSOLE_ROLE, RPC_HUMAN_VERIFY_PASSWORD

if TYPE_CHECKING:
    from argon2 import PasswordHasher

__all__ = [
    "MAX_PASSWORD",
    "MIN_PASSWORD",
    "QUEUE_GROUP",
    "ConsoleRoleResponder",
    "PasswordResponder",
    "PasswordTooShort",
    "hash_password",
    "hash_password_main",
    "verify_password",
]

log = structlog.get_logger(__name__)

#: Replicas share the subject through this queue group.
QUEUE_GROUP = "human-interaction"
#: A console password shorter than this is refused when it is set (API, ``hash-password``).
MIN_PASSWORD = 12
MAX_PASSWORD = 1024


class PasswordTooShort(ValueError):
    """A password to set is shorter than :data:`MIN_PASSWORD` or longer than :data:`MAX_PASSWORD`."""


@cache
def _hasher() -> PasswordHasher:
    from argon2 import PasswordHasher  # lazily: only a replica that hashes or checks loads it

    return PasswordHasher()


def hash_password(password: str) -> str:
    """The Argon2id hash (PHC string) of ``password``; :class:`PasswordTooShort` outside the allowed lengths."""
    if not MIN_PASSWORD <= len(password) <= MAX_PASSWORD:
        raise PasswordTooShort(f"a console password has {MIN_PASSWORD} to {MAX_PASSWORD} characters")
    return _hasher().hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    """Whether ``password`` is the one ``password_hash`` was made of (a malformed hash: False)."""
    from argon2.exceptions import InvalidHashError, VerificationError

    try:
        return _hasher().verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


@cache
def _dummy_hash() -> str:
    """A hash of a random password: what an unknown user's password is checked against (same cost)."""
    return _hasher().hash(secrets.token_urlsafe(24))


def refused_reply(failure: Failure) -> PasswordCheckReply:
    """The reply to a request the responder could not check (never echoes the request)."""
    if failure.kind == "malformed":
        return PasswordCheckReply(ok=False, error=f"malformed request: {failure.detail[:300]}")
    if failure.kind == "unsupported_version":
        return PasswordCheckReply(ok=False, error=failure.detail[:300])
    return PasswordCheckReply(ok=False, error=f"internal error: {failure.detail[:300]}")


class PasswordResponder(Responder[PasswordCheck, PasswordCheckReply]):
    """Answers ``temporality.rpc.human.verify_password`` from ``directory`` (the store's live view)."""

    def __init__(self, bus: Bus, directory: Directory, *, queue: str = QUEUE_GROUP, max_inflight: int = 4) -> None:
        self.directory = directory

        async def handle(request: Request[PasswordCheck]) -> PasswordCheckReply:
            return await self.check(request.body, request.version)

        super().__init__(
            bus,
            RPC_HUMAN_VERIFY_PASSWORD,
            request_model=PasswordCheck,
            handler=handle,
            on_error=refused_reply,
            queue=queue,
            max_inflight=max_inflight,
        )

    async def start(self) -> None:
        await asyncio.to_thread(_dummy_hash)  # made once, before the first unknown user needs it
        await super().start()

    async def check(self, query: PasswordCheck, version: str | None = None) -> PasswordCheckReply:
        profile = self.directory.get(query.user_id)
        stored = profile.password_hash if profile is not None else None
        matches = await asyncio.to_thread(verify_password, stored or _dummy_hash(), query.password)
        if profile is None:  # what was typed may be anything -- a password in the wrong field: never logged
            log.info("passwords.refused", user_known=False)
            return PasswordCheckReply(ok=False, protocol_version=version)
        if stored is None or not matches:
            log.info("passwords.refused", user_id=query.user_id, user_known=True, user_has_password=stored is not None)
            return PasswordCheckReply(ok=False, protocol_version=version)
        log.info("passwords.verified", user_id=query.user_id, role=profile.console_role)
        return PasswordCheckReply(
            ok=True,
            user_id=query.user_id,
            display_name=profile.display_name,
            role=profile.console_role,
            fingerprint=fingerprint(query.user_id, profile),
            protocol_version=version,
        )


def fingerprint(user_id: str, profile: UserProfile) -> str:
    """What the user's console sign-in depends on, as one opaque value: a SHA-256 of the user id, the console
    role and the password hash (the hash is salted, so a new password -- even the same one again -- changes it;
    the digest does not give the hash back). The journal ends a password sign-in's session when it changes."""
    parts = (user_id, profile.console_role or "", profile.password_hash or "")
    return hashlib.sha256("\0".join(("temporality-directory-v1", *parts)).encode()).hexdigest()[:32]


def _role_error(failure: Failure) -> ConsoleRoleReply:
    query = failure.request if isinstance(failure.request, ConsoleRoleQuery) else None
    return ConsoleRoleReply(user_id=query.user_id if query is not None else "", error=refused_reply(failure).error)


class ConsoleRoleResponder(Responder[ConsoleRoleQuery, ConsoleRoleReply]):
    """Answers ``temporality.rpc.human.console_role`` from ``directory``."""

    def __init__(self, bus: Bus, directory: Directory, *, queue: str = QUEUE_GROUP, max_inflight: int = 8) -> None:
        async def handle(request: Request[ConsoleRoleQuery]) -> ConsoleRoleReply:
            user_id = request.body.user_id
            profile = directory.get(user_id)
            if profile is None:
                return ConsoleRoleReply(user_id=user_id, protocol_version=request.version)
            return ConsoleRoleReply(
                user_id=user_id,
                role=profile.console_role,
                fingerprint=fingerprint(user_id, profile),
                protocol_version=request.version,
            )

        super().__init__(
            bus,
            RPC_HUMAN_CONSOLE_ROLE,
            request_model=ConsoleRoleQuery,
            handler=handle,
            on_error=_role_error,
            queue=queue,
            max_inflight=max_inflight,
        )


def _read_password(stdin: TextIO) -> str:
    if stdin.isatty():
        first = getpass.getpass("console password: ")
        if getpass.getpass("again: ") != first:
            raise PasswordTooShort("the two passwords differ")
        return first
    return stdin.readline().rstrip("\r\n")


def hash_password_main(stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout, stderr: TextIO = sys.stderr) -> int:
    """``temporality-human-interaction hash-password``: the hash of the password read, on standard output."""
    try:
        stdout.write(hash_password(_read_password(stdin)) + "\n")
    except PasswordTooShort as exc:
        stderr.write(f"hash-password: {exc}\n")
        return 2
    return 0
