"""``TEMPORALITY_METRICS_ENABLED`` across the five service processes (``temporality up --no-metrics``): on, every
service's ``/metrics`` answers with its own samples; off, every one answers 404 and the services work as before
(a webhook's run reaches its question)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from e2e_support import ALICE, eventually, example_pr, make_stack, post_hook
from prometheus_client.parser import text_string_to_metric_families

from temporality_embedded import Stack
from temporality_embedded.cli import build_parser, stack_config
from temporality_protocol.catalog import SERVICES

pytestmark = pytest.mark.e2e


def test_up_no_metrics_turns_them_off_in_every_service(tmp_path: Path) -> None:
    on = Stack(stack_config(build_parser().parse_args(["up", "--data-dir", str(tmp_path)])))
    off = Stack(stack_config(build_parser().parse_args(["up", "--data-dir", str(tmp_path), "--no-metrics"])))
    assert (on.config.metrics, off.config.metrics) == (True, False)
    for name in SERVICES:
        assert "TEMPORALITY_METRICS_ENABLED" not in on.env_for(name)  # the default: on
        assert off.env_for(name)["TEMPORALITY_METRICS_ENABLED"] == "false"


def _urls(stack: Stack) -> dict[str, str]:
    """Where each service serves ``/metrics`` (the workers on their health port, named by their ready file)."""
    urls = {"trigger-gateway": stack.gateway_url, "human-interaction": stack.human_url, "journal": stack.journal_url}
    for name, url in (("run-executor", stack.executor_url), ("agent-collab", stack.collab_url)):
        assert url is not None, f"{name} serves no HTTP"
        urls[name] = url
    assert set(urls) == set(SERVICES)
    return urls


def _services_reported(text: str) -> set[str]:
    return {
        sample.labels["service"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "temporality_service_info"
    }


@pytest.mark.timeout(240)
@pytest.mark.parametrize("metrics", [True, False], ids=["on", "off"])
async def test_metrics_on_and_off_in_every_service_process(
    tmp_path: Path, http: httpx.AsyncClient, metrics: bool
) -> None:
    stack = make_stack(tmp_path, metrics=metrics)
    await asyncio.to_thread(stack.start)
    try:
        accepted = await post_hook(http, stack, example_pr())
        assert accepted.status_code == 202, accepted.text
        run_id = accepted.json()["run_id"]

        async def asked() -> bool:
            response = await http.get(f"{stack.human_url}/inbox", headers=ALICE)
            return response.status_code == 200 and any(r["run_id"] == run_id for r in response.json()["requests"])

        await eventually(asked, 60, f"run {run_id}'s question in alice's inbox")
        for name, url in _urls(stack).items():
            assert (await http.get(f"{url}/healthz")).status_code == 200, name
            scraped = await http.get(f"{url}/metrics")
            if metrics:
                assert scraped.status_code == 200, name
                assert _services_reported(scraped.text) == {name}
            else:
                assert scraped.status_code == 404, name
                assert "temporality_" not in scraped.text, name
        if metrics:  # the gateway counted the webhook it accepted
            text = (await http.get(f"{stack.gateway_url}/metrics")).text
            assert 'route="/hooks/{trigger_id}",service="trigger-gateway",status="202"' in text
    finally:
        await asyncio.to_thread(stack.stop)
