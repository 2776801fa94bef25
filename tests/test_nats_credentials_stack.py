"""Every service, and the timers migration the stack runs first, on a NATS in operator (JWT) mode with one
``TEMPORALITY_NATS_CREDS_FILE``: a webhook's run asks alice, her answer completes it, the journal has it all."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import ALICE, JOURNAL, eventually, example_pr, make_stack, post_hook

from temporality_embedded import NatsServer
from temporality_testing.nats_auth import OperatorSetup

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


async def test_the_whole_stack_runs_on_a_nats_in_operator_mode_with_a_credentials_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    operator = OperatorSetup(tmp_path / "operator")
    server = NatsServer(tmp_path / "nats", config_file=operator.write_config())
    await asyncio.to_thread(server.start)
    # the shell's environment, as a deployment sets it: every service inherits it, and so does the timers
    # migration the stack runs in this process before the services start
    monkeypatch.setenv("TEMPORALITY_NATS_CREDS_FILE", str(operator.user_creds("temporality")))
    stack = make_stack(tmp_path, nats_url=server.url, TEMPORALITY_LOG_LEVEL="info")
    try:
        await asyncio.to_thread(stack.start, 180)
        async with httpx.AsyncClient(timeout=30) as http:
            accepted = await post_hook(http, stack, example_pr(id="creds-1"))
            assert accepted.status_code in (200, 202), accepted.text
            run_id = accepted.json()["run_id"]

            async def question() -> dict[str, Any] | None:
                inbox = (await http.get(f"{stack.human_url}/inbox", headers=ALICE)).json()
                return next((q for q in inbox.get("requests", []) if q["run_id"] == run_id), None)

            asked = await eventually(question, timeout_s=120, what="the run's question in alice's inbox")
            answered = await http.post(
                f"{stack.human_url}/requests/{asked['id']}/answer",
                json={"option_id": asked["options"][0]["id"]},
                headers=ALICE,
            )
            assert answered.status_code in (200, 202), answered.text

            async def completed() -> bool:
                run = await http.get(f"{stack.journal_url}/runs/{run_id}", headers=JOURNAL)
                return run.status_code == 200 and run.json().get("state") == "completed"

            await eventually(completed, timeout_s=120, what="the run completed in the journal")
        assert not stack.dead(), stack.dead()
        for name in ("journal", "trigger-gateway", "run-executor", "human-interaction", "agent-collab"):
            log = (stack.data_dir / "run" / f"{name}.log").read_text(encoding="utf-8")
            assert '"auth": "creds"' in log, f"{name} did not connect with the credentials file"
    finally:
        await asyncio.to_thread(stack.stop)
        await asyncio.to_thread(server.stop)
