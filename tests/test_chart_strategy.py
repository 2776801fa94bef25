"""Each service's Deployment ``strategy``: ``services.<name>.strategy``, else the global ``strategy``, else none
(Kubernetes' default rolling update). ``{type: Recreate}`` is what docs/operations.md's upgrade notes mean by an
upgrade "without overlap"; the notes point at it, and the chart's version is the one its upgrade notes name.
Rendered with the Helm SDK and read as YAML, as tests/test_deploy_files.py does; no cluster, no helm binary."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_deploy_files import CHART, SERVICES, _merge, _render, _validate

ROOT = Path(__file__).resolve().parents[1]
RECREATE = {"type": "Recreate"}
ONE_AT_A_TIME = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def _strategies(values: dict[str, Any] | None) -> dict[str, Any]:
    """Each service's Deployment ``spec.strategy`` (``None``: not rendered), by component."""
    found: dict[str, Any] = {}
    for doc in _render(values):
        if doc["kind"] == "Deployment":
            component = doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
            if component in SERVICES:
                found[component] = doc["spec"].get("strategy")
    return found


def _values_errors(extra: dict[str, Any]) -> list[str]:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return _validate(schema, _merge(values, extra))


def test_by_default_only_the_sqlite_journal_is_recreated_and_with_postgresql_none_sets_a_strategy() -> None:
    """Without PostgreSQL the journal's database is its pod's emptyDir: in a rolling update the old pod goes on
    pulling from the shared durable and takes events into a database about to be thrown away, so it is replaced
    without overlap (Recreate) unless a strategy is set. With PostgreSQL every service keeps Kubernetes' default."""
    assert _strategies(None) == {name: RECREATE if name == "journal" else None for name in SERVICES}
    assert _strategies({"postgres": {"url": "postgresql://journal@db:5432/journal"}}) == dict.fromkeys(SERVICES)
    assert _strategies({"services": {"journal": {"strategy": ONE_AT_A_TIME}}})["journal"] == ONE_AT_A_TIME


def test_the_global_strategy_reaches_every_service_and_a_service_s_own_replaces_it() -> None:
    strategies = _strategies({"strategy": RECREATE, "services": {"journal": {"strategy": ONE_AT_A_TIME}}})
    assert strategies == {name: ONE_AT_A_TIME if name == "journal" else RECREATE for name in SERVICES}


def test_one_service_alone_upgraded_without_overlap() -> None:
    """The upgrade notes' case: the run-executor alone on Recreate for one upgrade, the others as they were."""
    strategies = _strategies({"services": {"run-executor": {"strategy": RECREATE}}})
    assert strategies == {name: RECREATE if name in ("run-executor", "journal") else None for name in SERVICES}


@pytest.mark.parametrize(
    "extra",
    [
        {"strategy": RECREATE},
        {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "50%", "maxUnavailable": 0}}},
        {"services": {"run-executor": {"strategy": RECREATE}}},
        {"services": {"journal": {"strategy": ONE_AT_A_TIME}}},
    ],
)
def test_the_values_schema_takes_a_strategy(extra: dict[str, Any]) -> None:
    assert _values_errors(extra) == []


@pytest.mark.parametrize(
    "extra",
    [
        {"strategy": {"type": "recreate"}},  # Recreate or RollingUpdate
        {"strategy": "Recreate"},  # an object, as the Deployment's
        {"strategy": {"type": "Recreate", "rollingUpdate": {"maxSurge": 0}}},  # the API server refuses it
        {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "1.5"}}},
        {"services": {"journal": {"strategy": {"type": "Recreate", "maxUnavailable": 1}}}},
    ],
)
def test_the_values_schema_refuses_a_wrong_strategy(extra: dict[str, Any]) -> None:
    assert _values_errors(extra)


def test_the_values_yaml_strategy_examples_validate() -> None:
    """The examples in values.yaml's ``strategy`` comment (YAML flow values in backquotes) are accepted."""
    text = (CHART / "values.yaml").read_text(encoding="utf-8")
    lines = text.split("\nstrategy: {}", 1)[0].rsplit("\n# -- The `strategy`", 1)[1].splitlines()
    comment = " ".join(line.removeprefix("# ") for line in lines)
    examples = [yaml.safe_load(e) for e in re.findall(r"`(\{type:[^`]*\})`", comment)]
    assert RECREATE in examples
    assert ONE_AT_A_TIME in examples
    for example in examples:
        assert _values_errors({"strategy": example}) == [], example


def test_every_upgrade_note_asking_for_no_overlap_names_the_strategy_value() -> None:
    """docs/operations.md's and the chart README's notes that ask for an upgrade without overlap say how, with
    this chart: the ``strategy`` value."""
    for path in (ROOT / "docs" / "operations.md", CHART / "README.md"):
        paragraphs = re.split(r"\n\s*\n", path.read_text(encoding="utf-8"))
        asking = [p for p in paragraphs if "without overlap" in p and not p.startswith("#")]
        assert asking, path
        for paragraph in asking:
            assert "strategy" in paragraph, f"{path.name}: {paragraph[:200]}"


def test_the_chart_version_is_the_one_its_upgrade_notes_name() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    major, minor, _patch = (int(part) for part in chart["version"].split("."))
    assert (major, minor) >= (0, 2), chart["version"]  # 0.2.0: the first with `strategy`
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    assert f"chart {chart['version']}" in readme
