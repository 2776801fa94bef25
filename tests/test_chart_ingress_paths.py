"""The Ingresses of the journal (the console) and of human-interaction route every path their app serves, and not
``/metrics``.

Every service serves ``/metrics`` without authentication on its one HTTP port, for the scrapers inside the cluster;
an Ingress routing ``/`` (every path) published it, and with it run counts, consumer names, channel failures, to
whoever reached the console's host. The Ingresses name the apps' paths one by one instead. Each app is built as its
service builds it, with every optional part that adds routes (the journal: sign-in, the /gateway/ and /human/
proxies; human-interaction: the directory), on a real SQLite database; its routes come from its OpenAPI document
and the routes outside it (the console's files, the sign-in, the proxies' catch-alls, the runtime's probes). A new
route under a new first path segment fails here until the chart routes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from test_deploy_files import CHART, _helm

from temporality_human_interaction.api import create_app as human_app
from temporality_human_interaction.settings import Settings as HumanSettings
from temporality_journal import Settings as JournalSettings
from temporality_journal.api import create_app as journal_app
from temporality_journal.database import Database
from temporality_journal.signin import SignIn
from temporality_service.auth import ApiAuth

INGRESSES = {
    "ingress": {
        "journal": {"enabled": True, "host": "temporality.example.org"},
        "human-interaction": {"enabled": True, "host": "inbox.example.org"},
    }
}
#: Served outside each app's OpenAPI document: by the runtime (every service), and by the journal itself.
RUNTIME = {"/healthz", "/readyz", "/metrics", "/openapi.json"}
JOURNAL_UNLISTED = {
    "/",
    "/console",
    "/console/",
    "/auth/login",
    "/auth/callback",
    "/auth/password",
    "/gateway/x",
    "/human/x",
}


def _paths(name: str) -> list[dict[str, Any]]:
    chart = _helm().Chart.load(CHART)
    try:
        manifests: dict[str, str] = chart.render(INGRESSES, name="t", namespace="default", is_install=True)
    finally:
        chart.close()
    docs = [d for path, text in manifests.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    [ingress] = [d for d in docs if d.get("kind") == "Ingress" and d["metadata"]["name"] == f"t-temporality-{name}"]
    [rule] = ingress["spec"]["rules"]
    paths: list[dict[str, Any]] = rule["http"]["paths"]
    return paths


def _routed(path: str, paths: list[dict[str, Any]]) -> bool:
    """Kubernetes' Ingress matching: Exact is the whole path; Prefix by whole path elements."""
    for rule in paths:
        if rule["pathType"] == "Exact" and path == rule["path"]:
            return True
        if rule["pathType"] == "Prefix":
            prefix = rule["path"].rstrip("/")
            if prefix == "" or path == prefix or path.startswith(prefix + "/"):
                return True
    return False


async def _journal_paths(tmp_path: Path) -> set[str]:
    async with Database.open(f"sqlite+aiosqlite:///{tmp_path}/journal.db") as database:
        settings = JournalSettings()
        async with httpx.AsyncClient() as gateway, httpx.AsyncClient() as human:
            app = journal_app(
                settings,
                database,
                None,  # type: ignore[arg-type]  # the bus: not used to build the routes
                ApiAuth(),
                gateway=gateway,
                human=human,
                signin=SignIn(settings, None, "s" * 40, None),
            )
            return set(app.openapi()["paths"])


async def test_the_console_s_ingress_routes_every_journal_path_but_metrics(tmp_path: Path) -> None:
    served = await _journal_paths(tmp_path)
    assert {"/runs", "/events", "/gateway/triggers", "/human/inbox", "/auth/logout"} <= served  # all parts built
    paths = _paths("journal")
    for path in sorted((served | RUNTIME | JOURNAL_UNLISTED) - {"/metrics"}):
        assert _routed(path.replace("{", "x").replace("}", ""), paths), f"the journal's {path} is not routed"
    for path in ("/metrics", "/metrics/", "/metricsx", "/x"):
        assert not _routed(path, paths), path


def test_human_interaction_s_ingress_routes_every_path_of_its_api_but_metrics() -> None:
    app = human_app(HumanSettings(), None, None, store=object())  # type: ignore[arg-type]
    served = set(app.openapi()["paths"])
    assert {"/inbox", "/directory/users"} <= served
    paths = _paths("human-interaction")
    for path in sorted((served | RUNTIME) - {"/metrics"}):
        assert _routed(path.replace("{", "x").replace("}", ""), paths), f"human-interaction's {path} is not routed"
    assert not _routed("/metrics", paths)


@pytest.mark.parametrize("name", ["journal", "human-interaction"])
def test_no_ingress_path_reaches_metrics(name: str) -> None:
    """No rule names /metrics, and / (the journal's redirect to the console) only as itself, never as a prefix."""
    for rule in _paths(name):
        assert not rule["path"].startswith("/metrics"), rule
        assert rule["path"] != "/" or rule["pathType"] == "Exact", rule
