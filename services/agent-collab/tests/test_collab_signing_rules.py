"""The signing rules of the Agent Protocol (AP-11, PRO-4) as plain data: the signing input, the key formats the
allow-list takes, and every refusal :func:`verify` makes. No bus (the scenarios over NATS are in
``test_collab_signed_messages.py``)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from temporality_agent_collab.external import load_allow_list
from temporality_agent_collab.signing import (
    Keyring,
    MessageRefused,
    ReplyKey,
    load_private_key,
    load_public_key,
    public_key_text,
    sign,
    signing_input,
    verify,
    verify_reply,
)
from temporality_service import ConfigError

SUBJECT = "temporality.rpc.agents.triage-bot.deregister"
BODY = b'{"agent_id":"triage-bot","protocol_version":"1.0"}'
#: The published test vector (docs/agent-collaboration.md): private key bytes 0x00..0x1f.
VECTOR_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
VECTOR_PUBLIC = "A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg="
VECTOR_SIGNATURE = "kFPaGzEKfKl5RIVqnpDRm/b7AGs3iYjI71BDKfCKKKJhqzxUoGYJx2MecZL7+ERK2onkFZ+cuMB7xrAn1gn/Bw=="
VECTOR_AT = 1764614400
NONCE = "n0nce-0000000001"
NOW = datetime.fromtimestamp(VECTOR_AT, UTC)


def keyring(*, unsigned_ok: frozenset[str] = frozenset()) -> Keyring:
    return Keyring(
        keys={"triage-bot": VECTOR_KEY.public_key()},
        unsigned_ok=unsigned_ok,
        listed=frozenset({"triage-bot", "dev-bot", "keyless-bot"}),
    )


def refusal(
    headers: dict[str, str] | None,
    body: bytes = BODY,
    *,
    now: datetime = NOW,
    unsigned_ok: frozenset[str] = frozenset(),
) -> MessageRefused:
    with pytest.raises(MessageRefused) as caught:
        verify(keyring(unsigned_ok=unsigned_ok), SUBJECT, headers, body, now=now, window_s=120)
    return caught.value


def signed(body: bytes = BODY, *, key: Ed25519PrivateKey = VECTOR_KEY, key_id: str = "triage-bot") -> dict[str, str]:
    return sign(key, SUBJECT, key_id, body, timestamp=VECTOR_AT, nonce=NONCE)


# --------------------------------------------------------------------------- the signing input
def test_the_signing_input_is_the_documented_bytes() -> None:
    assert signing_input(SUBJECT, "triage-bot", "1764614400", NONCE, BODY) == (
        b"temporality-agent-signature-v1\n"
        b"temporality.rpc.agents.triage-bot.deregister\n"
        b"triage-bot\n"
        b"1764614400\n"
        b"n0nce-0000000001\n"
        b'{"agent_id":"triage-bot","protocol_version":"1.0"}'
    )


def test_the_published_test_vector() -> None:
    """What an implementation in another language checks itself against (Ed25519 signatures are deterministic)."""
    assert public_key_text(VECTOR_KEY.public_key()) == VECTOR_PUBLIC
    headers = signed()
    assert headers == {
        "Temporality-Key-Id": "triage-bot",
        "Temporality-Timestamp": "1764614400",
        "Temporality-Nonce": NONCE,
        "Temporality-Signature": VECTOR_SIGNATURE,
    }
    verified = verify(keyring(), SUBJECT, headers, BODY, now=NOW, window_s=120)
    assert (verified.agent_id, verified.signed is not None) == ("triage-bot", True)
    assert verified.signed is not None
    assert verified.signed.nonce == NONCE


def test_header_names_are_matched_case_insensitively() -> None:
    headers = {k.lower(): v for k, v in signed().items()}
    assert verify(keyring(), SUBJECT, headers, BODY, now=NOW, window_s=120).agent_id == "triage-bot"


# --------------------------------------------------------------------------- refusals
def test_unsigned_is_refused_unless_the_agent_is_marked_allow_unsigned() -> None:
    assert refusal(None).reason == "unsigned"
    assert refusal({}).reason == "unsigned"
    dev = BODY.replace(b"triage-bot", b"dev-bot")
    dev_subject = SUBJECT.replace("triage-bot", "dev-bot")  # its own
    with pytest.raises(MessageRefused) as dev_unsigned:
        verify(keyring(), dev_subject, None, dev, now=NOW, window_s=120)
    assert dev_unsigned.value.reason == "unsigned"
    accepted = verify(keyring(unsigned_ok=frozenset({"dev-bot"})), dev_subject, None, dev, now=NOW, window_s=120)
    assert (accepted.agent_id, accepted.signed) == ("dev-bot", None)
    # without agent_id in the body the sender is named by the key-id header; another one than the body's: no
    listing = b'{"protocol_versions":["1.0"]}'
    as_dev = {"Temporality-Key-Id": "dev-bot"}
    ok = verify(keyring(unsigned_ok=frozenset({"dev-bot"})), dev_subject, as_dev, listing, now=NOW, window_s=120)
    assert ok.agent_id == "dev-bot"
    triage_body = {"Temporality-Key-Id": "dev-bot"}
    with pytest.raises(MessageRefused) as mismatch:  # dev-bot's subject and key id, triage-bot's body
        verify(keyring(unsigned_ok=frozenset({"dev-bot"})), dev_subject, triage_body, BODY, now=NOW, window_s=120)
    assert mismatch.value.reason == "key_mismatch"
    assert refusal(None, listing).reason == "unsigned"  # nobody named at all


def test_an_unlisted_agent_is_unknown() -> None:
    """On its own subject (what NATS lets an unlisted agent's user send on, if anything)."""
    body = BODY.replace(b"triage-bot", b"mallory")
    theirs = SUBJECT.replace("triage-bot", "mallory")
    mallory = Ed25519PrivateKey.generate()

    def refused(headers: dict[str, str] | None, body: bytes, subject: str) -> MessageRefused:
        with pytest.raises(MessageRefused) as caught:
            verify(keyring(), subject, headers, body, now=NOW, window_s=120)
        return caught.value

    unsigned = refused(None, body, theirs)
    assert (unsigned.reason, unsigned.agent_id) == ("unknown_agent", "mallory")
    headers = sign(mallory, theirs, "mallory", body, timestamp=VECTOR_AT, nonce=NONCE)
    by_key = refused(headers, body, theirs)
    assert (by_key.reason, by_key.key_id) == ("unknown_key", "mallory")
    keyless = BODY.replace(b"triage-bot", b"keyless-bot")
    keyless_subject = SUBJECT.replace("triage-bot", "keyless-bot")
    headers = sign(mallory, keyless_subject, "keyless-bot", keyless, timestamp=VECTOR_AT, nonce=NONCE)
    assert refused(headers, keyless, keyless_subject).reason == "unknown_key"


def test_a_claim_other_than_the_subjects_agent_is_a_subject_mismatch_of_that_agent() -> None:
    """Checked first: the subject's agent (NATS permissions say who may send there) sent it, whatever it claims --
    the refusal is that agent's, the claimed id kept apart (the audit trail names the sender)."""
    for claim in (b"mallory", b"dev-bot"):  # not listed, or listed: the same
        unsigned = refusal(None, BODY.replace(b"triage-bot", claim))
        assert (unsigned.reason, unsigned.agent_id, unsigned.claimed) == (
            "subject_mismatch",
            "triage-bot",
            claim.decode(),
        )
    as_other = refusal({"Temporality-Key-Id": "dev-bot"}, b'{"protocol_versions":["1.0"]}')
    assert (as_other.reason, as_other.agent_id, as_other.claimed) == ("subject_mismatch", "triage-bot", "dev-bot")
    # signed with another agent's key (valid or not): still the subject's agent's refusal, with the signature kept
    body = BODY.replace(b"triage-bot", b"dev-bot")
    forged = refusal(signed(body, key=Ed25519PrivateKey.generate(), key_id="dev-bot"), body)
    assert (forged.reason, forged.agent_id, forged.claimed, forged.key_id) == (
        "subject_mismatch",
        "triage-bot",
        "dev-bot",
        "dev-bot",
    )
    assert forged.signed is not None


def test_a_wrong_key_or_any_changed_byte_is_a_bad_signature() -> None:
    wrong = refusal(signed(key=Ed25519PrivateKey.generate()))
    assert (wrong.reason, wrong.agent_id) == ("bad_signature", "triage-bot")
    headers = signed()
    assert refusal(headers, BODY.replace(b"1.0", b"1.1")).reason == "bad_signature"  # the body
    assert refusal(headers, BODY + b" ").reason == "bad_signature"  # even insignificant whitespace
    with pytest.raises(MessageRefused, match="does not verify") as other_subject:
        verify(keyring(), "temporality.rpc.agents.triage-bot.heartbeat", headers, BODY, now=NOW, window_s=120)
    assert other_subject.value.reason == "bad_signature"
    assert refusal({**headers, "Temporality-Nonce": "n0nce-0000000002"}).reason == "bad_signature"
    assert refusal({**headers, "Temporality-Timestamp": str(VECTOR_AT + 1)}).reason == "bad_signature"


def test_signed_for_another_agent_is_a_key_mismatch() -> None:
    body = BODY.replace(b"triage-bot", b"dev-bot")
    mismatch = refusal(signed(body), body)  # triage-bot's valid key, dev-bot's body
    assert (mismatch.reason, mismatch.agent_id) == ("key_mismatch", "triage-bot")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"Temporality-Key-Id": "not an id"}, "Key-Id"),
        ({"Temporality-Timestamp": "2026-12-01T00:00:00Z"}, "Unix seconds"),
        ({"Temporality-Nonce": "short"}, "16-128"),
        ({"Temporality-Nonce": "has a space in it, sixteen+"}, "16-128"),
        ({"Temporality-Signature": "!!"}, "base64"),
        ({"Temporality-Signature": base64.b64encode(b"x" * 10).decode()}, "64-byte"),
    ],
)
def test_unreadable_signature_headers_are_a_bad_signature(change: dict[str, str], says: str) -> None:
    refused = refusal({**signed(), **change})
    assert refused.reason == "bad_signature"
    assert says in refused.detail


def test_a_missing_header_of_a_signed_message_is_a_bad_signature() -> None:
    for name in ("Temporality-Key-Id", "Temporality-Timestamp", "Temporality-Nonce"):
        headers = {k: v for k, v in signed().items() if k != name}
        refused = refusal(headers)
        assert (refused.reason, name in refused.detail) == ("bad_signature", True)


def test_a_timestamp_outside_the_window_is_stale_either_way() -> None:
    headers = signed()
    assert verify(keyring(), SUBJECT, headers, BODY, now=NOW + timedelta(seconds=120), window_s=120)
    assert verify(keyring(), SUBJECT, headers, BODY, now=NOW - timedelta(seconds=120), window_s=120)
    late = refusal(headers, now=NOW + timedelta(seconds=121))
    early = refusal(headers, now=NOW - timedelta(seconds=121))
    assert (late.reason, early.reason) == ("stale_timestamp", "stale_timestamp")
    assert late.signed is not None
    assert late.signed.signed_at == NOW


# --------------------------------------------------------------------------- keys in the allow-list
def test_public_keys_are_read_as_base64_or_pem() -> None:
    public = Ed25519PrivateKey.generate().public_key()
    pem = public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
    der_b64 = "".join(pem.strip().splitlines()[1:-1])
    url_safe = base64.urlsafe_b64encode(public.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode().rstrip("=")
    for text in (public_key_text(public), pem, der_b64, url_safe):
        assert load_public_key(text) == public


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("abc", "32 bytes"),
        ("not base64 at all!", "neither PEM nor base64"),
        ("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----", "PEM"),
    ],
)
def test_an_unreadable_key_is_a_config_error_naming_the_agent(tmp_path: Path, key: str, says: str) -> None:
    path = tmp_path / "external-agents.yaml"
    path.write_text(f"agents:\n  - id: ok-bot\n    allow_unsigned: true\n  - id: broken-bot\n    public_key: {key!r}\n")
    with pytest.raises(ConfigError, match="broken-bot") as caught:
        load_allow_list(path)
    assert says in str(caught.value)


def test_a_key_that_is_not_ed25519_is_a_config_error(tmp_path: Path) -> None:
    pem = generate_private_key(SECP256R1()).public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    path = tmp_path / "external-agents.yaml"
    indented = "\n".join("      " + line for line in pem.decode().strip().splitlines())
    path.write_text(f"agents:\n  - id: ec-bot\n    public_key: |\n{indented}\n")
    with pytest.raises(ConfigError, match=r"ec-bot.*not Ed25519"):
        load_allow_list(path)


def test_a_key_and_allow_unsigned_together_are_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "external-agents.yaml"
    key = public_key_text(Ed25519PrivateKey.generate().public_key())
    path.write_text(f"agents:\n  - id: both-bot\n    public_key: {key}\n    allow_unsigned: true\n")
    with pytest.raises(ConfigError, match=r"both-bot.*choose one"):
        load_allow_list(path)


def test_the_keyring_of_an_allow_list(tmp_path: Path) -> None:
    public = Ed25519PrivateKey.generate().public_key()
    path = tmp_path / "external-agents.yaml"
    path.write_text(
        f"agents:\n  - id: a-bot\n    public_key: {public_key_text(public)}\n"
        "  - id: b-bot\n    allow_unsigned: true\n  - id: c-bot\n"
    )
    ring = load_allow_list(path).keyring()
    assert dict(ring.keys) == {"a-bot": public}
    assert (ring.unsigned_ok, ring.listed) == (frozenset({"b-bot"}), frozenset({"a-bot", "b-bot", "c-bot"}))


def test_a_message_on_another_agents_subject_is_a_subject_mismatch() -> None:
    """The agent id in the subject (whose NATS user may publish there) must be the one that signed."""
    theirs = "temporality.rpc.agents.dev-bot.list"
    listing = b'{"protocol_versions":["1.0"]}'  # no agent_id in the body: only the subject says for whom
    headers = sign(VECTOR_KEY, theirs, "triage-bot", listing, timestamp=VECTOR_AT, nonce=NONCE)
    with pytest.raises(MessageRefused, match="agent 'dev-bot''s subject") as caught:
        verify(keyring(), theirs, headers, listing, now=NOW, window_s=120)
    assert (caught.value.reason, caught.value.agent_id, caught.value.key_id, caught.value.claimed) == (
        "subject_mismatch",
        "dev-bot",  # the subject's agent sent it
        "triage-bot",
        "triage-bot",  # what it claimed
    )
    assert caught.value.signed is not None  # journaled with its nonce and timestamp
    # on its own subject the same listing is triage-bot's
    mine = "temporality.rpc.agents.triage-bot.list"
    own = sign(VECTOR_KEY, mine, "triage-bot", listing, timestamp=VECTOR_AT, nonce=NONCE)
    assert verify(keyring(), mine, own, listing, now=NOW, window_s=120).agent_id == "triage-bot"
    # an agent allowed unsigned messages is held to its own subjects too
    dev = b'{"agent_id":"dev-bot","protocol_version":"1.0"}'
    with pytest.raises(MessageRefused) as unsigned:
        verify(keyring(unsigned_ok=frozenset({"dev-bot"})), SUBJECT, None, dev, now=NOW, window_s=120)
    assert (unsigned.value.reason, unsigned.value.agent_id, unsigned.value.claimed) == (
        "subject_mismatch",
        "triage-bot",
        "dev-bot",
    )
    # an unsigned message naming nobody is the subject's agent's
    ok = verify(keyring(unsigned_ok=frozenset({"dev-bot"})), theirs, None, listing, now=NOW, window_s=120)
    assert ok.agent_id == "dev-bot"


def test_a_signed_reply_verifies_for_its_own_request_only() -> None:
    """agent-collab's reply signature binds the request's subject and the requester's inbox for it."""
    collab = ReplyKey(key_id="agent-collab", key=VECTOR_KEY)
    reply, inbox = b'{"accepted":true}', "_INBOX.triage-bot.abc.1"
    headers = collab.headers(SUBJECT, inbox, reply, timestamp=VECTOR_AT)
    assert set(headers) == {"Temporality-Key-Id", "Temporality-Timestamp", "Temporality-Signature"}
    public = VECTOR_KEY.public_key()

    def check(**changes: Any) -> None:
        args: dict[str, Any] = {
            "request_subject": SUBJECT,
            "reply_subject": inbox,
            "headers": headers,
            "body": reply,
            "now": NOW,
        } | changes
        verify_reply(public, "agent-collab", window_s=120, **args)

    check()
    for changed in (
        {"reply_subject": "_INBOX.triage-bot.abc.2"},  # the reply to another request
        {"request_subject": SUBJECT.replace("deregister", "heartbeat")},
        {"body": b'{"accepted":false}'},
        {"headers": None},
        {"headers": {**headers, "Temporality-Key-Id": "mallory"}},
        {"now": NOW + timedelta(seconds=600)},
    ):
        with pytest.raises(ValueError, match="reply"):
            check(**changed)
    # a request's signature is never a reply's (another scheme line)
    request = sign(VECTOR_KEY, SUBJECT, "agent-collab", reply, timestamp=VECTOR_AT, nonce=NONCE)
    with pytest.raises(ValueError, match="does not verify"):
        check(headers=request)


def test_the_reply_key_is_a_pem_ed25519_private_key() -> None:
    pem = VECTOR_KEY.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    assert load_private_key(pem).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) == (
        VECTOR_KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    )
    with pytest.raises(ValueError, match="not a readable"):
        load_private_key(b"not a key")
