"""NATS nkeys and JWTs made here, for a real nats-server that authenticates by nkey or in operator (JWT) mode.

Without ``nsc``: an operator, its system account, an application account with JetStream and a user are nkeys
(the ``nkeys`` package nats-py uses), their JWTs are signed here the way ``nsc`` signs them (header
``{"typ":"JWT","alg":"ed25519-nkey"}``, each claim set signed by its issuer: the accounts by the operator, the user
by its account), and the server trusts the operator's JWT and has the accounts preloaded (``resolver: MEMORY``).
The user's ``.creds`` file is in the layout ``nsc generate creds`` writes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]

__all__ = ["NkeyUser", "OperatorSetup", "creds_text", "new_keypair", "nkey_auth_config", "nkey_user"]

#: An account's limits: none, and JetStream on (``-1``: unlimited), as ``nsc edit account --js-enable 1`` gives.
_ACCOUNT_LIMITS: dict[str, Any] = {
    "subs": -1,
    "conn": -1,
    "leaf": -1,
    "imports": -1,
    "exports": -1,
    "data": -1,
    "payload": -1,
    "wildcards": True,
}
_JETSTREAM_LIMITS: dict[str, Any] = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


def new_keypair(prefix: int) -> Any:
    """A fresh nkey of the kind ``prefix`` (``nkeys.PREFIX_BYTE_USER``, ``_ACCOUNT``, ``_OPERATOR``)."""
    return nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), prefix)))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _public(keypair: Any) -> str:
    return str(keypair.public_key.decode())


def _jwt(subject: Any, name: str, nats: dict[str, Any], issuer: Any) -> str:
    claims: dict[str, Any] = {"sub": _public(subject), "name": name, "iat": int(time.time()), "iss": _public(issuer)}
    claims["nats"] = {**nats, "version": 2}
    claims["jti"] = base64.b32encode(hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()).decode()
    signed = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode()) + "." + _b64(json.dumps(claims).encode())
    return f"{signed}.{_b64(issuer.sign(signed.encode()))}"


def creds_text(user_jwt: str, user_seed: str) -> str:
    """A ``.creds`` file's content, as ``nsc generate creds`` writes it."""
    return (
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user_seed}\n------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


@dataclass(frozen=True)
class NkeyUser:
    """A user nkey: its seed file (``SU...``) and public key (``U...``) for the server's ``authorization``."""

    seed_file: Path
    public_key: str


def nkey_user(directory: Path, name: str) -> NkeyUser:
    """A new user nkey, its seed written to ``directory/<name>.nk`` (mode 0600)."""
    keypair = new_keypair(nkeys.PREFIX_BYTE_USER)
    directory.mkdir(parents=True, exist_ok=True)
    seed_file = directory / f"{name}.nk"
    seed_file.write_bytes(bytes(keypair.seed) + b"\n")
    seed_file.chmod(0o600)
    return NkeyUser(seed_file, _public(keypair))


class OperatorSetup:
    """An operator with a system account and one application account (JetStream enabled), and the server config
    that trusts them (:meth:`write_config`); :meth:`user_creds` makes a user of the application account."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.operator = new_keypair(nkeys.PREFIX_BYTE_OPERATOR)
        self.system = new_keypair(nkeys.PREFIX_BYTE_ACCOUNT)
        self.account = new_keypair(nkeys.PREFIX_BYTE_ACCOUNT)
        self.operator_jwt = _jwt(
            self.operator,
            "temporality-test",
            {"type": "operator", "system_account": _public(self.system)},
            self.operator,
        )
        self.system_jwt = _jwt(self.system, "SYS", {"type": "account", "limits": _ACCOUNT_LIMITS}, self.operator)
        self.account_jwt = _jwt(
            self.account,
            "TEMPORALITY",
            {"type": "account", "limits": {**_ACCOUNT_LIMITS, **_JETSTREAM_LIMITS}},
            self.operator,
        )

    def write_config(self) -> Path:
        """The server config (operator mode, accounts preloaded in memory): pass it as ``NatsServer(config_file=)``."""
        operator_file = self.directory / "operator.jwt"
        operator_file.write_text(self.operator_jwt, encoding="utf-8")
        config = self.directory / "nats-operator.conf"
        config.write_text(
            f"operator: {json.dumps(str(operator_file))}\n"
            f"system_account: {_public(self.system)}\n"
            "resolver: MEMORY\n"
            "resolver_preload: {\n"
            f"  {_public(self.system)}: {json.dumps(self.system_jwt)}\n"
            f"  {_public(self.account)}: {json.dumps(self.account_jwt)}\n"
            "}\n",
            encoding="utf-8",
        )
        return config

    def user_creds(self, name: str, *, signer: Any = None) -> Path:
        """A user of the application account (full access), its ``.creds`` file ``directory/<name>.creds``
        (mode 0600). ``signer``: another account's key signs it instead (a user the server does not know)."""
        user = new_keypair(nkeys.PREFIX_BYTE_USER)
        user_jwt = _jwt(user, name, {"type": "user", "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1},
                        signer or self.account)  # fmt: skip
        path = self.directory / f"{name}.creds"
        path.write_text(creds_text(user_jwt, bytes(user.seed).decode()), encoding="utf-8")
        path.chmod(0o600)
        return path


def nkey_auth_config(path: Path, users: list[tuple[NkeyUser, dict[str, Any] | None]]) -> Path:
    """Write a nats-server config at ``path`` whose users are known by their public nkeys only, each with its
    permissions block (``None``: full access); returns ``path``."""
    entries: list[dict[str, Any]] = []
    for user, permissions in users:
        entry: dict[str, Any] = {"nkey": user.public_key}
        if permissions is not None:
            entry["permissions"] = permissions
        entries.append(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("authorization: " + json.dumps({"users": entries}) + "\n", encoding="utf-8")
    return path
