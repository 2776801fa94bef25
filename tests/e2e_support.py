"""Helpers for the cross-service tests (a module name of its own: every conftest.py is called conftest)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from temporality_embedded import Stack, StackConfig, free_port
from temporality_service import ApiToken, Role
from temporality_service.auth import dump_tokens
from temporality_testing.waiting import eventually as eventually  # re-exported: the e2e tests import it from here

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config"
EXAMPLE_PR = ROOT / "examples" / "azure-devops" / "git.pullrequest.created.json"
HOOK_AUTH = "Basic " + base64.b64encode(b"azure:change-me").decode()
ALICE = {"Authorization": "Bearer alice-demo-inbox-token-change-me"}
#: The role tokens of every test stack (``TEMPORALITY_API_TOKENS_FILE``); JOURNAL reads the journal.
API_TOKENS = [
    ApiToken(name="e2e-viewer", role=Role.viewer, token=SecretStr("e2e-viewer-token-0123456789abcdef")),
    ApiToken(name="e2e-operator", role=Role.operator, token=SecretStr("e2e-operator-token-0123456789abcdef")),
    ApiToken(name="e2e-admin", role=Role.admin, token=SecretStr("e2e-admin-token-0123456789abcdef")),
]
JOURNAL = {"Authorization": f"Bearer {API_TOKENS[0].token.get_secret_value()}"}
#: The operator's token: what the audit trail lists (dead letters, refusals) is left out of a viewer's /events.
JOURNAL_OPERATOR = {"Authorization": f"Bearer {API_TOKENS[1].token.get_secret_value()}"}


#: How often :class:`FreePortStack` starts again on new ports when a port was taken before its server bound it.
PORT_ATTEMPTS = 3


class FreePortStack(Stack):
    """A stack on ports :func:`free_port` picked: a port is free when picked and bound by the service a moment
    later, so another test's server (another xdist worker's free_port picking the same one in that moment) can
    take it first -- the service then exits with "Address already in use" (seen in CI: the journal of the
    Matrix e2e stack). Such a start is stopped and started again on newly picked ports, at most
    :data:`PORT_ATTEMPTS` times; any other failure is raised at once."""

    def start(self, timeout: float = 60.0) -> None:
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                super().start(timeout)  # (a failed start has stopped what it started)
                return
            except RuntimeError as exc:
                if "Address already in use" not in str(exc) or attempt == PORT_ATTEMPTS:
                    raise
            self.config = dataclasses.replace(
                self.config, gateway_port=free_port(), human_port=free_port(), journal_port=free_port()
            )


def make_stack(
    tmp_path: Path,
    *,
    config_dir: Path = CONFIG,
    nats_auth: bool = False,
    replicas: Mapping[str, int] | None = None,
    nats_url: str | None = None,
    metrics: bool = True,
    **extra_env: str,
) -> Stack:
    """The five services as processes on free ports, with the test role tokens (:data:`API_TOKENS`);
    ``nats_auth``: each service its own NATS user; ``replicas``: processes per service; ``nats_url``: a NATS
    the test runs (a cluster) instead of the embedded one; ``metrics``: ``/metrics`` served (else 404)."""
    tokens_file = tmp_path / "api-tokens.json"
    tokens_file.parent.mkdir(parents=True, exist_ok=True)
    tokens_file.write_text(dump_tokens(API_TOKENS), encoding="utf-8")
    return FreePortStack(
        StackConfig(
            data_dir=tmp_path / "stack",
            config_dir=config_dir,
            gateway_port=free_port(),
            human_port=free_port(),
            journal_port=free_port(),
            log_format="json",
            api_tokens_file=tokens_file,
            nats_auth=nats_auth,
            replicas=replicas or {},
            nats_url=nats_url,
            metrics=metrics,
            extra_env={
                "TEMPORALITY_NATS_ACK_WAIT_S": "3",
                "TEMPORALITY_LOG_LEVEL": "debug",
                # the tests expect each webhook's own answer: on a loaded CI machine a delivery can take longer
                # than the 5 s default after which the sender gets a 503 (tested in test_gateway_bus_stall.py)
                "TEMPORALITY_GATEWAY_INTAKE_TIMEOUT_S": "60",
                **extra_env,
            },
        )
    )


def example_pr(**changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(EXAMPLE_PR.read_text(encoding="utf-8-sig"))
    payload.update(changes)
    return payload


async def post_hook(
    http: httpx.AsyncClient,
    stack: Stack,
    payload: dict[str, Any] | bytes,
    *,
    trigger: str = "ado-pr-review",
    **headers: str,
) -> httpx.Response:
    """POST ``payload`` to the webhook of ``trigger`` (the shipped one by default) with its Basic auth."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return await http.post(
        f"{stack.gateway_url}/hooks/{trigger}",
        content=body,
        headers={"Authorization": HOOK_AUTH, "Content-Type": "application/json", **headers},
    )


async def stop_processes(*processes: asyncio.subprocess.Process | None) -> None:
    """Kill each process a test started that still runs, and reap it (the teardown of agents and helpers)."""
    for process in processes:
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()
