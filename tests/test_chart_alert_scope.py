"""Every alert of the chart's PrometheusRule reads this install's series only, and says which install it is about.

A Prometheus shared by several installs (other namespaces, or another release beside this one) evaluates every
release's rules over all their series: only ``TemporalityTargetDown`` had a namespace matcher, so each install's
``TemporalityDeadLetters`` (and the rest) fired for every other install's consumers, and the alerts, aggregated
without ``namespace``, could not say which install it was. Rendered with the Helm SDK as tests/test_deploy_files.py
does, in a namespace of its own; each expression parsed with the PromQL parser.
"""

from __future__ import annotations

from typing import Any

import promql_parser
import pytest
import yaml
from test_deploy_files import CHART, _embedded, _helm, _merge

NAMESPACE = "team-a"
MONITORING = {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}}
NATS_ALERTS = _merge(_embedded(1, nats={"embedded": {"exporter": {"enabled": True}}}), MONITORING)


def _rules(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    chart = _helm().Chart.load(CHART)
    try:
        manifests: dict[str, str] = chart.render(values, name="t", namespace=NAMESPACE, is_install=True)
    finally:
        chart.close()
    docs = [d for path, text in manifests.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def _nodes(expr: str) -> list[Any]:
    found: list[Any] = []
    promql_parser.walk(promql_parser.parse(expr), pre_visit=found.append)
    return found


def _matchers(selector: Any) -> dict[str, tuple[str, str]]:
    return {m.name: (str(m.op), m.value) for m in selector.matchers.matchers}


@pytest.mark.parametrize("values", [MONITORING, NATS_ALERTS], ids=["services", "with-nats-alerts"])
def test_every_selector_is_the_release_s_and_every_aggregation_keeps_the_namespace(values: dict[str, Any]) -> None:
    rules = _rules(values)
    assert len(rules) >= 9
    for alert, rule in rules.items():
        nodes = _nodes(rule["expr"])
        selectors = [n for n in nodes if isinstance(n, promql_parser.VectorSelector)]
        assert selectors, alert
        for selector in selectors:
            matchers = _matchers(selector)
            assert matchers.get("namespace") == ("MatchOp.Equal", NAMESPACE), (alert, str(selector))
            # this release's pods, not another release's in the same namespace
            pods = [m.value for m in selector.matchers.matchers if m.name == "pod" and str(m.op) == "MatchOp.Re"]
            assert pods, (alert, str(selector))
            assert all(p.startswith("t-temporality-") for p in pods), (alert, str(selector))
        for aggregation in (n for n in nodes if isinstance(n, promql_parser.AggregateExpr)):
            assert aggregation.modifier is not None, f"{alert}: {aggregation} drops every label"
            assert str(aggregation.modifier.type) == "AggModifierType.By", (alert, str(aggregation))
            assert "namespace" in aggregation.modifier.labels, (alert, str(aggregation))
        assert "$labels.namespace" in rule["annotations"]["summary"], alert


def test_a_target_selector_narrows_every_service_alert_within_the_namespace() -> None:
    values = _merge(MONITORING, {"metrics": {"prometheusRule": {"targetSelector": 'job="temporality"'}}})
    for alert, rule in _rules(values).items():
        for selector in (n for n in _nodes(rule["expr"]) if isinstance(n, promql_parser.VectorSelector)):
            matchers = _matchers(selector)
            assert matchers.get("namespace") == ("MatchOp.Equal", NAMESPACE), alert
            assert matchers.get("job") == ("MatchOp.Equal", "temporality"), alert


def test_the_overdue_description_counts_this_release_s_questions_only() -> None:
    description = _rules(MONITORING)["TemporalityHumanRequestOverdue"]["annotations"]["description"]
    query = description.split('query "', 1)[1].split('" }}', 1)[0]
    [selector] = [n for n in _nodes(query) if isinstance(n, promql_parser.VectorSelector)]
    assert _matchers(selector)["namespace"] == ("MatchOp.Equal", NAMESPACE)
