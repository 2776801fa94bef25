"""Helpers for the cross-service tests (a module name of its own: every conftest.py is called conftest)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from temporality_embedded import Stack, StackConfig, free_port

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config"
EXAMPLE_PR = ROOT / "examples" / "azure-devops" / "git.pullrequest.created.json"
HOOK_AUTH = "Basic " + base64.b64encode(b"azure:change-me").decode()
ALICE = {"Authorization": "Bearer alice-demo-token"}
T = TypeVar("T")


def make_stack(tmp_path: Path, *, config_dir: Path = CONFIG, **extra_env: str) -> Stack:
    return Stack(
        StackConfig(
            data_dir=tmp_path / "stack",
            config_dir=config_dir,
            gateway_port=free_port(),
            human_port=free_port(),
            journal_port=free_port(),
            log_format="json",
            extra_env={"TEMPORALITY_NATS_ACK_WAIT_S": "3", "TEMPORALITY_LOG_LEVEL": "debug", **extra_env},
        )
    )


def example_pr(**changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(EXAMPLE_PR.read_text(encoding="utf-8-sig"))
    payload.update(changes)
    return payload


async def post_hook(
    http: httpx.AsyncClient, stack: Stack, payload: dict[str, Any] | bytes, **headers: str
) -> httpx.Response:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return await http.post(
        f"{stack.gateway_url}/hooks/ado-pr-review",
        content=body,
        headers={"Authorization": HOOK_AUTH, "Content-Type": "application/json", **headers},
    )


async def eventually(probe: Callable[[], Awaitable[T | None]], timeout_s: float = 30, what: str = "condition") -> T:
    """Poll ``probe`` until it returns something truthy; bounded, and says what it waited for."""
    last: T | None = None
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                last = await probe()
                if last:
                    return last
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last value: {last!r}") from None
