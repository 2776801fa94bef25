"""Repository-wide pytest set-up: the shared fixtures, and how ``make test`` spreads tests over workers.

``make test`` runs pytest-xdist with ``--dist loadgroup``. A test that uses a module- or session-scoped
fixture of ours (a real Synapse, a stack started once per module, a rendered Helm chart) is put in
one group with every other user of that fixture, so each such fixture is set up once per run, on one
worker, exactly as in a plain ``pytest`` run.

The key of a shared fixture is the file that defines it (a conftest, a test module: its fixtures often
build on one another), except for the fixtures of ``temporality_testing`` — the plugin every conftest
loads — whose key is the fixture itself, so that its users are not all herded onto one worker. Tests
that share any key are one group (keys that meet in one test are merged), so a fixture never ends up
in two groups.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import structlog

from temporality_testing.modules import conftest_imports, describe, same_basenames

pytest_plugins = ["temporality_testing.fixtures"]

# The tests publish events as no service (source `/test`, ...): the consumers check only a claimed service
# (temporality_bus.provenance). Services the tests start inherit it; the tests of the check set `strict`.
os.environ.setdefault("TEMPORALITY_NATS_SOURCE_CHECK", "claimed")

_SHARED_SCOPES = {"module", "package", "session"}
_FOREIGN_PREFIXES = ("_pytest", "pytest", "xdist")
_PER_FIXTURE_PREFIXES = ("temporality_testing",)


def _fixture_key(definition: pytest.FixtureDef[object], rootdir: Path) -> str | None:
    """The group key of one fixture definition, or None if it is not a shared fixture of ours."""
    module = getattr(definition.func, "__module__", "") or ""
    if definition.scope not in _SHARED_SCOPES or module.startswith(_FOREIGN_PREFIXES):
        return None
    if module.startswith(_PER_FIXTURE_PREFIXES):
        return f"{definition.scope}:{module}:{definition.argname}"
    code = getattr(definition.func, "__code__", None)
    where = Path(code.co_filename) if code is not None else None
    if where is not None and where.is_relative_to(rootdir):
        # The defining file, not its module name: every conftest.py is imported as ``conftest``.
        return f"{definition.scope}:{where.relative_to(rootdir).as_posix()}"
    return f"{definition.scope}:{module}"


def _shared_fixture_keys(item: pytest.Item, rootdir: Path) -> set[str]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    keys = (_fixture_key(definitions[-1], rootdir) for definitions in info.name2fixturedefs.values())
    return {key for key in keys if key is not None}


def shared_fixture_groups(items: list[pytest.Item], rootdir: Path) -> dict[str, str]:
    """Each item's xdist group by node id (items without a shared fixture of ours are absent): the keys
    that meet in one item are joined (union-find); a group is named after its session key with the most
    users (a session fixture costs the most), else its module key with the most users."""
    parent: dict[str, str] = {}
    users: Counter[str] = Counter()

    def find(key: str) -> str:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    per_item: dict[str, set[str]] = {}
    for item in items:
        keys = _shared_fixture_keys(item, rootdir)
        if not keys:
            continue
        per_item[item.nodeid] = keys
        users.update(keys)
        first, *others = sorted(keys)
        parent.setdefault(first, first)
        for key in others:
            parent.setdefault(key, key)
            parent[find(key)] = find(first)
    members: dict[str, list[str]] = {}
    for key in parent:
        members.setdefault(find(key), []).append(key)
    name = {
        root: min(keys, key=lambda k: (not k.startswith("session:"), -users[k], k)) for root, keys in members.items()
    }
    return {nodeid: name[find(next(iter(keys)))] for nodeid, keys in per_item.items()}


def pytest_configure(config: pytest.Config) -> None:
    """structlog's default output for the services run inside the test process, with plain tracebacks: its
    default renders an exception with rich, locals included, synchronously on the event loop -- seconds on
    a loaded machine, longer than the tests' 2 s ack_wait, so a consumer logging a handled exception had its
    messages redelivered (a journal test saw a dead-lettered event come back). The services' own processes
    configure their logging themselves (``temporality_service.logs``: plain tracebacks too)."""
    processors = list(structlog.get_config()["processors"])
    if processors and isinstance(processors[-1], structlog.dev.ConsoleRenderer):
        processors[-1] = structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback)
        structlog.configure(processors=processors)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Before collection: two test modules (or helper modules beside tests) with one basename stop the run
    with a message naming both paths (pytest would refuse the second at collection, less clearly), and so
    does a module that imports a conftest by name;
    tests/test_module_basenames.py is the check's specification."""
    root, testpaths = Path(session.config.rootpath), session.config.getini("testpaths") or ["."]
    duplicates, importers = same_basenames(root, testpaths), conftest_imports(root, testpaths)
    if duplicates or importers:
        raise pytest.UsageError(describe(duplicates, importers))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: an xdist worker turns the markers into its groups in its own pytest_collection_modifyitems,
    # registered after this conftest and so (without tryfirst) called before it, seeing no marker at all.
    # xdist then appends "@<group>" to the legacy node id, which pytest 9.2 no longer reads (hence pytest<9.2
    # in pyproject, pytest-dev/pytest-xdist#1386); tests/test_xdist_grouping.py fails when grouping stops.
    groups = shared_fixture_groups(items, Path(config.rootpath))
    for item in items:
        # xdist honours one group per item.
        group = groups.get(item.nodeid)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
