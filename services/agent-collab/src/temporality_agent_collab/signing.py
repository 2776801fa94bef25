"""Signed messages of the Agent Protocol (AP-11, PRO-4), pure: the signing input, the headers, the checks.

Every request an external agent sends on one of its own subjects, ``temporality.rpc.agents.<agent id>.<operation>``,
carries four NATS headers, and agent-collab verifies them against the Ed25519 public key its allow-list lists for the
agent (:mod:`temporality_agent_collab.external`) before it reads the body:

=========================  ==========================================================================
header                     value
=========================  ==========================================================================
``Temporality-Key-Id``     the agent id whose key signed it (for register/heartbeat/deregister: the
                           body's ``agent_id``)
``Temporality-Timestamp``  when it was signed: Unix time in whole seconds, decimal ASCII (``1764614400``)
``Temporality-Nonce``      16-128 characters of ``A-Z a-z 0-9 _ -``, new for every message (e.g. 16
                           random bytes as base64url without padding)
``Temporality-Signature``  the 64-byte Ed25519 signature of the signing input, standard base64
=========================  ==========================================================================

The **signing input** is these bytes, fields joined by one line feed (``0x0A``), the body last and
unchanged (none of the other fields can contain a line feed, so it is unambiguous)::

    temporality-agent-signature-v1 LF <subject> LF <key id> LF <timestamp> LF <nonce> LF <body bytes>

``subject`` is the exact subject the request is published on; ``body bytes`` the exact payload sent
(whatever its JSON formatting). :func:`signing_input` builds it.

Checks, in order (the first failing one is the refusal's reason): a message whose claimed sender -- its
``Temporality-Key-Id``, else its body's ``agent_id`` -- is not the agent its subject names (``subject_mismatch``,
journaled as coming from the subject's agent, whom NATS permissions let send there, with the claimed id as
``claimed_agent_id``: the audit trail names the agent that sent it, not the one it pretended to be); a signature
whose key id names no
allow-listed agent with a key (``unknown_key``); a body whose ``agent_id`` is not the key id
(``key_mismatch``); a signature that does not verify (``bad_signature``: wrong key, a changed body,
subject or header); a timestamp further than the window from agent-collab's clock (``stale_timestamp``);
then, in
:mod:`temporality_agent_collab.gate`, a nonce the agent already used (``replayed_nonce``). A message without
``Temporality-Signature`` is ``unsigned`` unless the allow-list marks the agent ``allow_unsigned: true``
(development only; its id is its ``Temporality-Key-Id``, else its body's ``agent_id``, else the subject's, and
must be the subject's too); an unsigned message from an agent not listed at all is ``unknown_agent``.

**Replies** are signed too, when agent-collab has a reply key (``TEMPORALITY_COLLAB_REPLY_KEY_FILE``): three
headers, ``Temporality-Key-Id`` (agent-collab's key id), ``Temporality-Timestamp`` and ``Temporality-Signature``,
over (:func:`reply_signing_input`)::

    temporality-agent-reply-v1 LF <request subject> LF <reply subject> LF <key id> LF <timestamp> LF <body bytes>

The reply subject is the requester's inbox for that one request, so a reply is good for the request it answers
only; an agent checks it with agent-collab's public key (:func:`verify_reply`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)

from temporality_agent_collab.hints import claimed
from temporality_protocol.catalog import subject_agent
from temporality_protocol.events import AgentMessageRefusalReason
from temporality_service.secret_files import load_ed25519_key as load_private_key

__all__ = [
    "KEY_ID_HEADER",
    "NONCE_HEADER",
    "REPLY_SCHEME",
    "SCHEME",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "Keyring",
    "MessageRefused",
    "ReplyKey",
    "Signed",
    "Verified",
    "body_digest",
    "load_private_key",
    "load_public_key",
    "public_key_text",
    "reply_signing_input",
    "sign",
    "signing_input",
    "verify",
    "verify_reply",
]

SIGNATURE_HEADER = "Temporality-Signature"
KEY_ID_HEADER = "Temporality-Key-Id"
TIMESTAMP_HEADER = "Temporality-Timestamp"
NONCE_HEADER = "Temporality-Nonce"
#: The first line of the signing input: names the scheme, so a signature for anything else never verifies.
SCHEME = "temporality-agent-signature-v1"
#: The first line of a reply's signing input (a request's signature never verifies as a reply's, nor back).
REPLY_SCHEME = "temporality-agent-reply-v1"
_NONCE = re.compile(r"^[A-Za-z0-9_-]{16,128}$")
_TIMESTAMP = re.compile(r"^[0-9]{1,10}$")
#: DER SubjectPublicKeyInfo of an Ed25519 key, up to the 32 key bytes (RFC 8410).
_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
_KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def signing_input(subject: str, key_id: str, timestamp: str, nonce: str, body: bytes) -> bytes:
    """The bytes an agent signs (see the module docstring)."""
    head = "\n".join((SCHEME, subject, key_id, timestamp, nonce, ""))
    return head.encode("utf-8") + body


def sign(
    key: Ed25519PrivateKey, subject: str, key_id: str, body: bytes, *, timestamp: int, nonce: str
) -> dict[str, str]:
    """The four headers of a signed message (what an agent does; tests and the bench use it)."""
    stamp = str(timestamp)
    signature = key.sign(signing_input(subject, key_id, stamp, nonce, body))
    return {
        KEY_ID_HEADER: key_id,
        TIMESTAMP_HEADER: stamp,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: base64.b64encode(signature).decode("ascii"),
    }


def reply_signing_input(request_subject: str, reply_subject: str, key_id: str, timestamp: str, body: bytes) -> bytes:
    """The bytes agent-collab signs for a reply (see the module docstring)."""
    head = "\n".join((REPLY_SCHEME, request_subject, reply_subject, key_id, timestamp, ""))
    return head.encode("utf-8") + body


@dataclass(frozen=True)
class ReplyKey:
    """agent-collab's own Ed25519 key, which signs its replies to external agents."""

    key_id: str
    key: Ed25519PrivateKey

    def headers(self, request_subject: str, reply_subject: str, body: bytes, *, timestamp: int) -> dict[str, str]:
        stamp = str(timestamp)
        signature = self.key.sign(reply_signing_input(request_subject, reply_subject, self.key_id, stamp, body))
        return {
            KEY_ID_HEADER: self.key_id,
            TIMESTAMP_HEADER: stamp,
            SIGNATURE_HEADER: base64.b64encode(signature).decode("ascii"),
        }


def verify_reply(
    key: Ed25519PublicKey,
    key_id: str,
    request_subject: str,
    reply_subject: str,
    headers: Mapping[str, str] | None,
    body: bytes,
    *,
    now: datetime,
    window_s: float,
) -> None:
    """An agent's check of a reply (what the example agent does in its own code): ``ValueError`` saying why
    it is not agent-collab's reply to this request."""
    if _header(headers, SIGNATURE_HEADER) is None:
        raise ValueError("the reply is unsigned")
    if _header(headers, KEY_ID_HEADER) != key_id:
        raise ValueError(f"the reply is signed by {_header(headers, KEY_ID_HEADER)!r}, not {key_id!r}")
    stamp = _header(headers, TIMESTAMP_HEADER) or ""
    if not _TIMESTAMP.match(stamp):
        raise ValueError(f"the reply's {TIMESTAMP_HEADER} is not Unix seconds")
    try:
        signature = base64.b64decode(_header(headers, SIGNATURE_HEADER) or "", validate=True)
        key.verify(signature, reply_signing_input(request_subject, reply_subject, key_id, stamp, body))
    except (binascii.Error, ValueError, InvalidSignature):
        raise ValueError("the reply's signature does not verify") from None
    if abs((now - datetime.fromtimestamp(int(stamp), UTC)).total_seconds()) > window_s:
        raise ValueError("the reply's timestamp is outside the window")


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


# --------------------------------------------------------------------------- keys
def load_public_key(text: str) -> Ed25519PublicKey:
    """An Ed25519 public key from the allow-list: PEM (``-----BEGIN PUBLIC KEY-----``, SubjectPublicKeyInfo)
    or base64 (standard or URL-safe, padding optional) of the raw 32 bytes or of that PEM's DER.
    :class:`ValueError` otherwise."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        try:
            key = load_pem_public_key(text.encode("ascii"))
        except (ValueError, UnsupportedAlgorithm, UnicodeEncodeError) as exc:
            raise ValueError(f"not a readable PEM public key ({exc})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"a {type(key).__name__.removesuffix('PublicKey').lstrip('_')} key, not Ed25519")
        return key
    compact = text.replace("-", "+").replace("_", "/")
    try:
        raw = base64.b64decode(compact + "=" * (-len(compact) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("neither PEM nor base64") from None
    if len(raw) == len(_SPKI_PREFIX) + 32 and raw.startswith(_SPKI_PREFIX):
        raw = raw[len(_SPKI_PREFIX) :]  # the DER of a PEM block without its armour
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, this is {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def public_key_text(key: Ed25519PublicKey) -> str:
    """The raw public key in standard base64: what ``public_key:`` in the allow-list takes."""
    return base64.b64encode(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode("ascii")


@dataclass(frozen=True)
class Keyring:
    """Who may send what, from the allow-list: the public key of each agent that has one, and the agents
    whose unsigned messages are accepted (``allow_unsigned``)."""

    keys: Mapping[str, Ed25519PublicKey]
    unsigned_ok: frozenset[str]
    #: Every allow-listed agent id.
    listed: frozenset[str]


# --------------------------------------------------------------------------- the checks
class MessageRefused(Exception):
    """A message that did not prove who sent it; journaled as ``agent.message_refused``."""

    def __init__(
        self,
        reason: AgentMessageRefusalReason,
        detail: str,
        *,
        agent_id: str | None,
        signed: Signed | None = None,
        key_id: str | None = None,
        claimed: str | None = None,
    ) -> None:
        super().__init__(detail)
        #: ``subject_mismatch``: who the message claimed to be (``agent_id`` is the subject's agent).
        self.claimed = claimed
        self.reason: AgentMessageRefusalReason = reason
        self.detail = detail
        self.agent_id = agent_id
        self.signed = signed
        self.key_id = key_id if signed is None else signed.key_id


@dataclass(frozen=True)
class Signed:
    """The signature headers of a message, read (not yet verified)."""

    key_id: str
    timestamp: str
    nonce: str
    signature: bytes

    @property
    def signed_at(self) -> datetime:
        return datetime.fromtimestamp(int(self.timestamp), UTC)


@dataclass(frozen=True)
class Verified:
    """Who a message is from. ``signed`` is ``None`` for an accepted unsigned message (``allow_unsigned``)."""

    agent_id: str | None
    signed: Signed | None


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    value = headers.get(name)
    if value is None:  # header names are matched case-insensitively, like HTTP's
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    return value


def _claimed_agent(body: bytes) -> str | None:
    """The body's ``agent_id``, if it has one (a request that is not JSON is refused later, as malformed)."""
    return claimed(body, "agent_id", limit=128) or None


def _read(headers: Mapping[str, str] | None, claimed: str | None) -> Signed:
    """The signature headers of a message that has ``Temporality-Signature``; :class:`MessageRefused` when
    one is missing or unreadable."""

    def refuse(detail: str, key_id: str | None = None) -> MessageRefused:
        return MessageRefused("bad_signature", detail, agent_id=key_id or claimed, key_id=key_id)

    key_id = _header(headers, KEY_ID_HEADER)
    if key_id is None or not _KEY_ID.match(key_id):
        raise refuse(f"{KEY_ID_HEADER} is missing or not an agent id", key_id[:128] if key_id else None)
    for name in (TIMESTAMP_HEADER, NONCE_HEADER):
        if _header(headers, name) is None:
            raise refuse(f"a signed message needs {name}", key_id)
    timestamp, nonce = _header(headers, TIMESTAMP_HEADER) or "", _header(headers, NONCE_HEADER) or ""
    if not _TIMESTAMP.match(timestamp):
        raise refuse(f"{TIMESTAMP_HEADER} must be Unix seconds in decimal digits", key_id)
    if not _NONCE.match(nonce):
        raise refuse(f"{NONCE_HEADER} must be 16-128 characters of A-Z a-z 0-9 _ -", key_id)
    try:
        signature = base64.b64decode(_header(headers, SIGNATURE_HEADER) or "", validate=True)
    except (binascii.Error, ValueError):
        raise refuse(f"{SIGNATURE_HEADER} is not base64", key_id) from None
    if len(signature) != 64:
        raise refuse(f"{SIGNATURE_HEADER} must be a 64-byte Ed25519 signature, not {len(signature)} bytes", key_id)
    return Signed(key_id=key_id, timestamp=timestamp, nonce=nonce, signature=signature)


def _readable(headers: Mapping[str, str] | None, claimed: str | None) -> Signed | None:
    """The signature headers, when the message has readable ones (kept in the journaled refusal), else ``None``."""
    if _header(headers, SIGNATURE_HEADER) is None:
        return None
    try:
        return _read(headers, claimed)
    except MessageRefused:
        return None


def verify(
    keyring: Keyring,
    subject: str,
    headers: Mapping[str, str] | None,
    body: bytes,
    *,
    now: datetime,
    window_s: float,
) -> Verified:
    """Who sent this message, proven -- or :class:`MessageRefused` (the reason per the module docstring).
    The nonce is not checked here (it needs the shared store): the caller claims it after this passes."""
    claimed = _claimed_agent(body)
    on_behalf_of = subject_agent(subject)  # None: a subject that names no agent (checked by nobody else)
    key_id = _header(headers, KEY_ID_HEADER)
    who = key_id if key_id is not None and _KEY_ID.match(key_id) else claimed  # an unreadable key id: bad_signature
    if on_behalf_of is not None and who is not None and who != on_behalf_of:
        # the subject's agent is who sent it (NATS permissions); what it claims is unverified: checked first
        raise MessageRefused(
            "subject_mismatch",
            f"sent on {subject!r}, agent {on_behalf_of!r}'s subject, but it claims to be {who!r}: "
            f"an agent sends on its own subjects only, as itself",
            agent_id=on_behalf_of,
            signed=_readable(headers, claimed),
            key_id=key_id if key_id is not None and _KEY_ID.match(key_id) else None,
            claimed=who,
        )
    if _header(headers, SIGNATURE_HEADER) is None:
        agent = _header(headers, KEY_ID_HEADER) or claimed or on_behalf_of
        if agent is not None and agent not in keyring.listed:
            raise MessageRefused("unknown_agent", f"agent {agent!r} is not allowed here", agent_id=agent)
        if agent is not None and agent in keyring.unsigned_ok:
            if claimed is not None and claimed != agent:
                raise MessageRefused(
                    "key_mismatch", f"{KEY_ID_HEADER} is {agent!r}, the body speaks for {claimed!r}", agent_id=agent
                )
            _same_agent(subject, on_behalf_of, agent, None)
            return Verified(agent_id=agent, signed=None)
        raise MessageRefused(
            "unsigned",
            f"messages must be signed: send {KEY_ID_HEADER}, {TIMESTAMP_HEADER}, {NONCE_HEADER} and {SIGNATURE_HEADER}",
            agent_id=agent,
        )
    signed = _read(headers, claimed)
    key = keyring.keys.get(signed.key_id)
    if key is None:
        raise MessageRefused(
            "unknown_key", f"no public key is listed for {signed.key_id!r}", agent_id=signed.key_id, signed=signed
        )
    if claimed is not None and claimed != signed.key_id:
        raise MessageRefused(
            "key_mismatch",
            f"signed with the key of {signed.key_id!r}, but the body speaks for {claimed!r}",
            agent_id=signed.key_id,
            signed=signed,
        )
    try:
        key.verify(signed.signature, signing_input(subject, signed.key_id, signed.timestamp, signed.nonce, body))
    except InvalidSignature:
        raise MessageRefused(
            "bad_signature",
            f"the signature does not verify with {signed.key_id!r}'s public key for this subject, headers and body",
            agent_id=signed.key_id,
            signed=signed,
        ) from None
    skew = abs((now - signed.signed_at).total_seconds())
    if skew > window_s:
        raise MessageRefused(
            "stale_timestamp",
            f"{TIMESTAMP_HEADER} is {skew:.0f} s from agent-collab's clock; at most {window_s:g} s is accepted",
            agent_id=signed.key_id,
            signed=signed,
        )
    _same_agent(subject, on_behalf_of, signed.key_id, signed)
    return Verified(agent_id=signed.key_id, signed=signed)


def _same_agent(subject: str, on_behalf_of: str | None, agent_id: str, signed: Signed | None) -> None:
    """The agent the subject names is the one that signed (or, unsigned, the one the message says it is)."""
    if on_behalf_of is not None and on_behalf_of != agent_id:
        raise MessageRefused(
            "subject_mismatch",
            f"sent on {subject!r}, agent {on_behalf_of!r}'s subject, but it is from {agent_id!r}: "
            f"an agent sends on its own subjects only",
            agent_id=agent_id,
            signed=signed,
        )
