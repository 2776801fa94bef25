"""Repository-wide pytest set-up: the shared fixtures, and how ``make test`` spreads tests over workers.

``make test`` runs pytest-xdist with ``--dist loadgroup``. A test that uses a module- or session-scoped
fixture of ours (a real Synapse, a stack started once per module, a rendered Helm chart) is put in
one group with every other user of that fixture, so each such fixture is set up once per run, on one
worker, exactly as in a plain ``pytest`` run.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["temporality_testing.fixtures"]

_SHARED_SCOPES = {"module", "package", "session"}
_FOREIGN_PREFIXES = ("_pytest", "pytest", "xdist")


def _shared_fixture_groups(item: pytest.Item) -> set[str]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    groups: set[str] = set()
    for definitions in info.name2fixturedefs.values():
        definition = definitions[-1]
        module = getattr(definition.func, "__module__", "") or ""
        if definition.scope in _SHARED_SCOPES and not module.startswith(_FOREIGN_PREFIXES):
            # Every shared fixture of one module (a conftest, a test file) lands in the module's group.
            groups.add(f"{definition.scope}:{module}")
    return groups


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        # xdist honours one group per item: a session fixture's group first (it costs the most).
        groups = sorted(_shared_fixture_groups(item), key=lambda g: (not g.startswith("session:"), g))
        if groups:
            item.add_marker(pytest.mark.xdist_group(groups[0]))
