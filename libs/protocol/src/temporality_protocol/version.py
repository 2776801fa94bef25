"""Protocol versions and their negotiation (PRO-3, AP-10).

Every envelope carries ``protocolversion``. Two parties each declare the versions they speak;
:func:`negotiate` picks the highest common one or refuses explicitly with
:class:`~temporality_protocol.errors.IncompatibleProtocolVersion`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from temporality_protocol.errors import IncompatibleProtocolVersion

__all__ = ["PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "is_supported", "negotiate", "parse_version"]

#: The version this code writes.
PROTOCOL_VERSION = "1.0"
#: Every version this code can read, newest first. Old versions stay here for their deprecation period.
SUPPORTED_VERSIONS: tuple[str, ...] = ("1.0",)


#: ASCII digits only: ``str.isdigit`` took ``"\u0661.\u0660"`` (Arabic-Indic digits, which ``int`` reads as 1.0), so such an
#: envelope was read as 1.0. Leading zeros stay the same number (``"01.0"`` is 1.0), as before.
_VERSION = re.compile(r"([0-9]+)\.([0-9]+)")


def parse_version(version: str) -> tuple[int, int]:
    """``"1.0"`` -> ``(1, 0)``; anything else is a :class:`ValueError`."""
    match = _VERSION.fullmatch(version)
    if match is None:
        raise ValueError(f"protocol version must look like MAJOR.MINOR, got {version[:40]!r}")
    return int(match[1]), int(match[2])


def negotiate(ours: Iterable[str], theirs: Iterable[str]) -> str:
    """Return the highest version both sides declare, or refuse explicitly."""
    our_set = {parse_version(v): v for v in ours}
    their_set = {parse_version(v) for v in theirs}
    common = sorted(set(our_set) & their_set)
    if not common:
        raise IncompatibleProtocolVersion(sorted(our_set.values()), sorted(".".join(map(str, v)) for v in their_set))
    return our_set[common[-1]]


def is_supported(version: str) -> bool:
    try:
        negotiate(SUPPORTED_VERSIONS, [version])
    except (IncompatibleProtocolVersion, ValueError):
        return False
    return True
