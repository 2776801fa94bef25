"""Where the JetStream API is, with or without a JetStream domain (leaf nodes, hubs).

A client reaches the JetStream of its own server's domain at ``$JS.API.>``; one of a named domain ``hub`` at
``$JS.hub.API.>`` (the server maps that prefix onto its own ``$JS.API.>``, and a leaf node routes it to the hub).
A KV write goes to ``$KV.<bucket>.<key>`` in the client's own domain and to ``$JS.hub.API.$KV.<bucket>.<key>``
in the domain ``hub`` (what nats.go sends; nats-py's KV client does not, so the bus rewrites its writes). The
subjects a KV stream stores (``$KV.<bucket>.<key>``: a get's ``last_by_subj``, a watch's filter) and the
server's own reply subjects (``$JS.ACK...``, ``$JS.FC...``) are the same in every domain.

``TEMPORALITY_NATS_JETSTREAM_DOMAIN`` (``NatsSettings.jetstream_domain``) names the domain; the services'
NATS permissions follow it (:meth:`temporality_protocol.permissions.Permissions.in_domain`).
"""

from __future__ import annotations

import re

__all__ = ["DEFAULT_API_PREFIX", "DOMAIN_PATTERN", "api_prefix", "kv_write_subject"]

#: The JetStream API of the client's own domain.
DEFAULT_API_PREFIX = "$JS.API"
#: A JetStream domain: one subject token (nats-server refuses anything else in ``jetstream { domain }``).
DOMAIN_PATTERN = re.compile(r"[A-Za-z0-9_-]+")


def api_prefix(domain: str | None) -> str:
    """``$JS.API`` without a domain, ``$JS.<domain>.API`` with one."""
    if domain is None:
        return DEFAULT_API_PREFIX
    if not DOMAIN_PATTERN.fullmatch(domain):
        raise ValueError(f"JetStream domain {domain!r}: letters, digits, '_' and '-' only (one subject token)")
    return f"$JS.{domain}.API"


def kv_write_subject(subject: str, domain: str | None) -> str:
    """The subject a write of the KV subject ``subject`` (``$KV.<bucket>.<key>``) is published to in ``domain``."""
    return subject if domain is None else f"{api_prefix(domain)}.{subject}"
