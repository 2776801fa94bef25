"""What a body that was refused or failed validation claims, read for the reply that says so.

A refused body is never trusted: its ids are echoed only so the sender can tell which of its messages was refused.
Any bytes may arrive here, so nothing raises: not JSON, not UTF-8, not an object, or nested past the parser's
depth (``RecursionError``, which is not a ``ValueError``) all read as "nothing claimed".
"""

from __future__ import annotations

import json
from typing import Any


def json_field(raw: bytes, field: str) -> Any:
    """The top-level ``field`` of a JSON object body, or ``None``."""
    try:
        body: Any = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return body.get(field) if isinstance(body, dict) else None


def claimed(raw: bytes, field: str, *, limit: int = 64) -> str:
    """The string ``field`` the body claims, cut at ``limit`` characters; ``""`` when there is none."""
    value = json_field(raw, field)
    return value[:limit] if isinstance(value, str) else ""
