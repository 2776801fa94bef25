"""The embedded NATS's prometheus-nats-exporter sidecar (``nats.embedded.exporter``), its PodMonitor and the NATS alerts
of the PrometheusRule (docs/operations.md#alerts).

Rendered with the Helm SDK as tests/test_deploy_files.py does. Every alert expression is parsed with a PromQL parser
and may read only the exporter's metrics (:data:`EXPORTER_METRICS`, the names its collectors define, read from
prometheus-nats-exporter 0.20.1's ``collector/healthz.go`` and ``collector/jsz.go``: static names, not derived from
the server's JSON) and Prometheus's own ``up``. The exporter cannot run here (no container engine), so what it reads
is checked on the real thing instead: the rendered nats-server config, run, answers ``/healthz`` and
``/jsz?consumers=true&config=true&raft=true`` (what ``-healthz`` and ``-jsz=consumers`` fetch) with the fields those
metrics are made of."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from test_deploy_files import (
    NATS_NAME,
    _embedded,
    _journal_bus,
    _kinds,
    _merge,
    _render,
    _selected,
    _serving_rendered_nats,
    _validate,
)

from temporality_protocol.catalog import CONSUMERS, EVENTS_STREAM, subject_for

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "temporality"
#: The metric names prometheus-nats-exporter 0.20.1 defines for the endpoints the sidecar turns on (``-healthz``,
#: ``-jsz=consumers``): collector/healthz.go (``<system>_<endpoint>_status[_value]``) and collector/jsz.go.
EXPORTER_METRICS = {
    "gnatsd_healthz_status",
    "gnatsd_healthz_status_value",
    "jetstream_server_jetstream_disabled",
    "jetstream_server_total_streams",
    "jetstream_server_total_consumers",
    "jetstream_server_total_messages",
    "jetstream_server_total_message_bytes",
    "jetstream_server_max_memory",
    "jetstream_server_max_storage",
    "jetstream_stream_total_messages",
    "jetstream_stream_total_bytes",
    "jetstream_stream_first_seq",
    "jetstream_stream_last_seq",
    "jetstream_stream_consumer_count",
    "jetstream_consumer_delivered_consumer_seq",
    "jetstream_consumer_delivered_stream_seq",
    "jetstream_consumer_num_ack_pending",
    "jetstream_consumer_num_redelivered",
    "jetstream_consumer_num_waiting",
    "jetstream_consumer_num_pending",
    "jetstream_consumer_ack_floor_stream_seq",
    "jetstream_consumer_ack_floor_consumer_seq",
}
NATS_ALERTS = {
    "TemporalityNatsServerDown",
    "TemporalityNatsNotScraped",
    "TemporalityNatsStorageNearLimit",
    "TemporalityNatsConsumerPendingGrowing",
}
MONITORING = {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}}


def _schema_errors(values: dict[str, Any]) -> list[str]:
    """``values`` over the chart's defaults, against values.schema.json (as ``helm install`` checks them)."""
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return _validate(schema, _merge(defaults, values))


def _exporter(replicas: int = 1, **extra: Any) -> dict[str, Any]:
    return _merge(_embedded(replicas, nats={"embedded": {"exporter": {"enabled": True}}}), extra)


def _nats_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = _kinds(docs)[("StatefulSet", NATS_NAME)]["spec"]["template"]
    return pod


def _alerts(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    [rule] = [d for d in _render(values) if d["kind"] == "PrometheusRule"]
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def test_off_by_default_nothing_of_it_renders() -> None:
    docs = _render(_merge(_embedded(1), MONITORING))
    pod = _nats_pod(docs)
    assert [c["name"] for c in pod["spec"]["containers"]] == ["nats"]
    assert "prometheus.io/scrape" not in pod["metadata"]["annotations"]
    assert ("PodMonitor", "t-temporality-nats") not in _kinds(docs)
    assert not NATS_ALERTS & set(_alerts(_merge(_embedded(1), MONITORING)))
    # an external NATS is yours to watch: no sidecar, no NATS alerts, even with the value on
    external = _merge(MONITORING, {"nats": {"embedded": {"exporter": {"enabled": True}}}})
    assert not NATS_ALERTS & set(_alerts(external))


@pytest.mark.parametrize("replicas", [1, 3])
def test_the_sidecar_reads_its_own_server_on_localhost_and_serves_metrics(replicas: int) -> None:
    values = _exporter(replicas)
    assert _schema_errors(values) == []
    pod = _nats_pod(_render(values))
    nats, exporter = pod["spec"]["containers"]
    assert (nats["name"], exporter["name"]) == ("nats", "exporter")
    image, _, tag = exporter["image"].rpartition(":")
    assert image == "natsio/prometheus-nats-exporter"
    assert re.fullmatch(r"\d+\.\d+\.\d+", tag), "a pinned release: the alerts read its metric names"
    assert exporter["args"] == [
        "-port=7777",
        "-healthz",
        "-varz",
        "-jsz=consumers",
        "-use_internal_server_name",
        "http://localhost:8222",  # the server's monitoring port, in the same pod
    ]
    assert {p["name"]: p["containerPort"] for p in nats["ports"]}["monitor"] == 8222
    assert exporter["ports"] == [{"name": "metrics", "containerPort": 7777, "protocol": "TCP"}]
    assert exporter["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert "volumeMounts" not in exporter, "it reads nothing but the monitoring port"
    annotations = pod["metadata"]["annotations"]
    assert (annotations["prometheus.io/scrape"], annotations["prometheus.io/port"]) == ("true", "7777")
    off = _nats_pod(_render(_exporter(replicas, metrics={"podAnnotations": False})))
    assert "prometheus.io/scrape" not in off["metadata"]["annotations"]


def test_its_port_is_a_value_and_cannot_take_the_server_s() -> None:
    exporter = _nats_pod(_render(_exporter(nats={"embedded": {"exporter": {"port": 9100}}})))["spec"]["containers"][1]
    assert exporter["args"][0] == "-port=9100"
    assert exporter["ports"][0]["containerPort"] == 9100
    for port in (4222, 6222, 8222):
        assert _schema_errors(_exporter(nats={"embedded": {"exporter": {"port": port}}})), port
    assert _schema_errors(_exporter(nats={"embedded": {"exporter": {"enable": True}}}))


def test_a_pod_monitor_scrapes_the_sidecars() -> None:
    docs = _kinds(_render(_merge(_exporter(3), MONITORING)))
    monitor = docs[("PodMonitor", "t-temporality-nats")]["spec"]
    assert monitor["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "temporality",
        "app.kubernetes.io/instance": "t",
        "app.kubernetes.io/component": "nats",
    }
    assert monitor["podMetricsEndpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    assert ("PodMonitor", "t-temporality-workers") in docs, "the services' monitors stay"


def test_network_policy_opens_the_metrics_port_to_the_scrapers() -> None:
    def exporter_rules(values: dict[str, Any]) -> list[dict[str, Any]]:
        policy = _kinds(_render(values))[("NetworkPolicy", NATS_NAME)]["spec"]
        return [r for r in policy["ingress"] if r["ports"] == [{"port": 7777, "protocol": "TCP"}]]

    assert exporter_rules(_exporter(networkPolicy={"enabled": True})) == [
        {"ports": [{"port": 7777, "protocol": "TCP"}]}  # metricsFrom empty: from anywhere, as the workers' /metrics
    ]
    scrapers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert exporter_rules(_exporter(networkPolicy={"enabled": True, "metricsFrom": scrapers})) == [
        {"from": scrapers, "ports": [{"port": 7777, "protocol": "TCP"}]}
    ]
    assert exporter_rules(_embedded(1, networkPolicy={"enabled": True})) == []


def test_the_nats_alerts_parse_and_read_only_the_exporter_s_metrics() -> None:
    alerts = _alerts(_merge(_exporter(3), MONITORING))
    assert NATS_ALERTS <= set(alerts)
    nats_pods = 'pod=~"t-temporality-nats-[0-9]+"'
    for name in NATS_ALERTS:
        rule = alerts[name]
        read = _selected(rule["expr"])  # raises on a syntax error
        assert read, name
        assert read <= EXPORTER_METRICS | {"up"}, f"{name} reads {sorted(read - EXPORTER_METRICS)}"
        assert rule["expr"].count(nats_pods) == rule["expr"].count("{"), f"{name}: every selector is the NATS pods'"
        assert 'namespace="default"' in rule["expr"], name
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        assert rule["annotations"]["summary"], name
        assert len(rule["annotations"]["description"]) > 150, f"{name}: say what to look at"
    assert alerts["TemporalityNatsServerDown"]["labels"]["severity"] == "critical"
    assert _selected(alerts["TemporalityNatsServerDown"]["expr"]) == {"up", "gnatsd_healthz_status_value"}
    assert alerts["TemporalityNatsNotScraped"]["expr"].startswith("absent(up{")
    # the services' target-down alert leaves the NATS pods to these
    target_down = alerts["TemporalityTargetDown"]["expr"]
    assert 'pod!~"t-temporality-nats-[0-9]+"' in target_down


def test_the_nats_thresholds_come_from_the_values() -> None:
    values = _merge(
        _merge(_exporter(), MONITORING),
        {
            "metrics": {
                "prometheusRule": {
                    "natsStorageRatio": 0.9,
                    "natsConsumerPending": 50,
                    "natsConsumerPendingFor": "30m",
                    "alertLabels": {"team": "platform"},
                }
            }
        },
    )
    alerts = _alerts(values)
    assert alerts["TemporalityNatsStorageNearLimit"]["expr"].endswith(") > 0.9")
    pending = alerts["TemporalityNatsConsumerPendingGrowing"]
    assert "jetstream_consumer_num_pending" in pending["expr"]
    assert ") > 50)" in pending["expr"]
    assert "[30m]" in pending["expr"]
    assert pending["for"] == "30m"
    assert "more than 50 messages" in pending["annotations"]["description"]
    for name in NATS_ALERTS:
        assert alerts[name]["labels"]["team"] == "platform", name
    bad = _merge(values, {"metrics": {"prometheusRule": {"natsStorageRatio": 1.5, "natsConsumerPendingFor": "soon"}}})
    assert _schema_errors(values) == []
    assert len(_schema_errors(bad)) == 2


@pytest.mark.parametrize("kube", ["1.25.0", "latest"])
def test_the_statefulset_with_its_sidecar_is_a_valid_kubernetes_object(kube: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.latest_version() if kube == "latest" else kube
    docs = _kinds(_render(_exporter(3, networkPolicy={"enabled": True})))
    for key in (("StatefulSet", NATS_NAME), ("NetworkPolicy", NATS_NAME)):
        kubernetes_validate.validate(docs[key], version, strict=True)


async def _get(url: str) -> Any:
    async with httpx.AsyncClient(timeout=5) as client:
        answer = await client.get(url)
        answer.raise_for_status()
        return answer.json()


@pytest.mark.timeout(120)
async def test_the_rendered_server_answers_what_the_exporter_reads(tmp_path: Path) -> None:
    """The rendered config, run: ``/healthz`` says ok, and ``/jsz`` with consumers has the server's stored bytes and
    storage limit and each durable's pending count -- the fields of the metrics the alerts read."""
    docs = _render(_exporter())
    async with _serving_rendered_nats(docs, tmp_path / "nats") as (server, passwords):
        async with _journal_bus(server, passwords) as bus:
            spec = CONSUMERS["journal"]
            await bus.js.pull_subscribe(spec.filter_subjects[0], durable="journal", stream=spec.stream)
            for n in range(3):  # an event the journal may send
                await bus.publish_raw(subject_for("bus.dead_lettered"), b"{}", {"Nats-Msg-Id": f"m{n}"})
        assert (await _get(f"{server.monitoring}/healthz"))["status"] == "ok"  # gnatsd_healthz_status_value 1
        jsz = await _get(f"{server.monitoring}/jsz?consumers=true&config=true&raft=true")
        assert jsz["bytes"] > 0  # jetstream_server_total_message_bytes
        assert jsz["config"]["max_storage"] > jsz["bytes"]  # jetstream_server_max_storage
        consumers = {
            (stream["name"], consumer["name"]): consumer
            for account in jsz["account_details"]
            for stream in account["stream_detail"]
            for consumer in stream.get("consumer_detail", [])
        }
        assert consumers[(EVENTS_STREAM.name, "journal")]["num_pending"] == 3  # jetstream_consumer_num_pending
