from __future__ import annotations

import pytest

from temporality_protocol import (
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    IncompatibleProtocolVersion,
    derive_id,
    is_supported,
    negotiate,
    run_id_for_delivery,
)
from temporality_protocol.version import parse_version


def test_highest_common_version_wins() -> None:
    assert negotiate(["1.0", "1.1", "2.0"], ["1.1", "1.0"]) == "1.1"
    assert negotiate(["1.10", "1.9"], ["1.9", "1.10"]) == "1.10"  # numeric, not lexical


def test_no_common_version_is_an_explicit_refusal() -> None:
    with pytest.raises(IncompatibleProtocolVersion) as info:
        negotiate(["1.0"], ["2.0", "3.1"])
    assert info.value.ours == ["1.0"]
    assert info.value.theirs == ["2.0", "3.1"]


def test_malformed_versions_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR"):
        negotiate(["1.0"], ["v1"])
    assert not is_supported("one")
    assert not is_supported("9.0")
    assert is_supported(PROTOCOL_VERSION)
    assert PROTOCOL_VERSION in SUPPORTED_VERSIONS


@pytest.mark.parametrize(
    "version",
    ["\u0661.\u0660", "1.\u0660", "\uff11.0", "1.0 ", " 1.0", "1.0\n", "+1.0", "1_0.0", "1.", ".0", "1.0.0"],
)
def test_only_ascii_digits_make_a_version(version: str) -> None:
    """``str.isdigit`` took Arabic-Indic and full-width digits, which ``int`` reads as 1.0."""
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR"):
        parse_version(version)
    assert not is_supported(version)


def test_versions_parse_to_numbers() -> None:
    assert parse_version("1.0") == (1, 0)
    assert parse_version("10.9999") == (10, 9999)
    assert parse_version("01.00") == (1, 0)  # the same number spelt otherwise, as before
    assert is_supported("1.00")


def test_deterministic_ids() -> None:
    a = run_id_for_delivery("ado-pr", "evt-1")
    assert a == run_id_for_delivery("ado-pr", "evt-1")
    assert a != run_id_for_delivery("ado-pr", "evt-2")
    assert a != run_id_for_delivery("ado-pr2", "evt-1")
    # the separator keeps ("a", "bc") and ("ab", "c") apart
    assert derive_id("x", "a", "bc") != derive_id("x", "ab", "c")
    assert a.startswith("run-")
    assert len(a) == 4 + 24
