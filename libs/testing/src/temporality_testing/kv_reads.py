"""Which KV key a JetStream read request reads, whichever way the services' ``Store`` sends it.

A bucket of one copy is read with a direct get (``$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>``, no body);
a replicated one, or one made before direct reads, with ``$JS.API.STREAM.MSG.GET.KV_<bucket>`` and the key in a
``{"last_by_subj": ...}`` body (``temporality_bus.Store``). Tests that count a service's reads count both, so a
count of zero cannot pass only because the reads went the other way.
"""

from __future__ import annotations

import json

__all__ = ["kv_read_key", "kv_read_subjects"]


def kv_read_key(subject: str, payload: bytes, bucket: str) -> str | None:
    """The key of ``bucket`` that the request (``subject``, ``payload``) reads; ``None`` if it is no read of it."""
    direct = f".DIRECT.GET.KV_{bucket}.$KV.{bucket}."
    at = subject.find(direct)
    if at >= 0 and subject.startswith("$JS."):
        return subject[at + len(direct) :]
    if subject.startswith("$JS.") and subject.endswith(f".STREAM.MSG.GET.KV_{bucket}"):
        last = json.loads(payload or b"{}").get("last_by_subj", "")
        prefix = f"$KV.{bucket}."
        return last[len(prefix) :] if isinstance(last, str) and last.startswith(prefix) else None
    return None


def kv_read_subjects(bucket: str, api_prefix: str = "$JS.API") -> tuple[str, str]:
    """The subjects a core subscription needs to see every read of ``bucket`` (both forms)."""
    return f"{api_prefix}.STREAM.MSG.GET.KV_{bucket}", f"{api_prefix}.DIRECT.GET.KV_{bucket}.>"
