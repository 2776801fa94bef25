"""Run only by tests/test_xdist_grouping.py (in a pytest of its own): tests sharing a module fixture."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def shared() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "none")


@pytest.mark.parametrize("n", range(6))
def test_uses_the_shared_fixture(shared: str, n: int) -> None:
    assert shared == os.environ.get("PYTEST_XDIST_WORKER", "none")  # set up on this test's own worker


@pytest.mark.parametrize("n", range(6))
def test_alone(n: int) -> None:
    assert n >= 0
