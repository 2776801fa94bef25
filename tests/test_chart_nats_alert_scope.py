"""``TemporalityNatsConsumerPendingGrowing`` leaves out the gateway's on-demand durable (docs/operations.md#alerts).

``trigger-gateway-events`` is pulled only while an event trigger or a concurrency key needs it
(services/trigger-gateway ``ondemand.py``); meanwhile the server counts every event of its filter as pending, so the
alert fired after ~1,000 run ends on a stack with no event trigger, and its runbook then said to delete the durable
(the event triggers' cursor). An on-call review reproduced the growth with the default config.
"""

from __future__ import annotations

from typing import Any

import promql_parser
from test_deploy_files import _embedded, _merge, _render

from temporality_protocol.catalog import CONSUMERS

ON_DEMAND = CONSUMERS["trigger-gateway-events"].durable
MONITORING = {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}}


def _pending_selectors(expr: str) -> list[Any]:
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name == "jetstream_consumer_num_pending":
            found.append(node)
        for name in ("expr", "lhs", "rhs", "vector_selector", "param"):
            child = getattr(node, name, None)
            if child is not None and not isinstance(child, (str, int, float)):
                visit(child)
        for arg in getattr(node, "args", None) or ():
            visit(arg)

    visit(promql_parser.parse(expr))
    return found


def test_the_pending_alert_reads_every_durable_but_the_gateway_s_on_demand_one() -> None:
    values = _merge(_embedded(1, nats={"embedded": {"exporter": {"enabled": True}}}), MONITORING)
    [rule] = [d for d in _render(values) if d["kind"] == "PrometheusRule"]
    [alert] = [
        r
        for group in rule["spec"]["groups"]
        for r in group["rules"]
        if r.get("alert") == "TemporalityNatsConsumerPendingGrowing"
    ]
    selectors = _pending_selectors(alert["expr"])
    assert len(selectors) == 2, alert["expr"]  # the count and its growth
    for selector in selectors:
        excluded = [
            m.value
            for m in selector.matchers.matchers
            if m.name == "consumer_name" and str(m.op) in ("MatchOp.NotEqual", "!=")
        ]
        assert excluded == [ON_DEMAND], str(selector)
