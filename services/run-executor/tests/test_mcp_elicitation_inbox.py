"""An MCP tool's question answered by the person in the web inbox (issue 6): the run-executor (its consumers in
this loop), a real MCP server over stdio (``mcp_notes_server.py --elicit-tools``) and human-interaction served
in-process on a real port (its own ``configure``, the shipped user directory) on the same nats-server. The
answer travels inbox HTTP API -> human-interaction -> ``human.answered`` -> the run, not a test's publish."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from executor_support import REVIEWER, RunExecutor, run_requested

from temporality_bus import Bus, NatsSettings
from temporality_human_interaction import Settings as HumanSettings
from temporality_human_interaction.__main__ import SPEC, configure
from temporality_run_executor.agents import AgentCard, McpServer, ProviderConfig, Sandbox
from temporality_run_executor.mcp_servers import McpPool, list_card_tools
from temporality_run_executor.providers.script import Script
from temporality_run_executor.tools import ToolPolicy
from temporality_service import ApiAuthSettings, Runtime, run_until
from temporality_service.auth import dump_tokens
from temporality_testing.events import EventLog
from temporality_testing.waiting import eventually

ROOT = Path(__file__).resolve().parents[3]
ALICE = {"Authorization": "Bearer alice-demo-inbox-token-change-me"}  # her inbox token in config/users.yaml
SERVER = McpServer(
    name="notes", command=sys.executable, args=[str(Path(__file__).with_name("mcp_notes_server.py")), "--elicit-tools"]
)


@asynccontextmanager
async def human_interaction(settings: HumanSettings) -> AsyncIterator[str]:
    """human-interaction served in this loop until the block ends; yields its URL."""
    runtimes: list[Runtime[HumanSettings]] = []
    setup = configure(settings)

    async def _setup(rt: Runtime[HumanSettings]) -> None:
        await setup(rt)
        runtimes.append(rt)

    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run_until(SPEC, settings, _setup, stop, ready=ready))
    try:
        waiter = asyncio.ensure_future(ready.wait())
        await asyncio.wait({waiter, task}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            waiter.cancel()
            task.result()
        assert ready.is_set(), "human-interaction was not ready within 60 s"
        server = runtimes[0].server
        assert server is not None
        yield server.url
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


@pytest.fixture
async def inbox(nats_settings: NatsSettings, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of a running human-interaction, signed in as nobody (send :data:`ALICE`)."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(dump_tokens([]), encoding="utf-8")
    settings = HumanSettings(
        nats=nats_settings,
        host="127.0.0.1",
        port=0,
        users_file=ROOT / "config" / "users.yaml",
        api=ApiAuthSettings(tokens_file=tokens),
    )
    async with human_interaction(settings) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        yield client


@pytest.fixture
async def pool() -> AsyncIterator[McpPool]:
    pool = McpPool()
    try:
        yield pool
    finally:
        await pool.aclose()


async def _start(executor: RunExecutor, pool: McpPool, tool: str, args: dict[str, Any], work: Path) -> None:
    script = {
        "steps": [
            {"id": "call", "call": {"tool": f"notes__{tool}", "args": args}},
            {"id": "done", "answer": "{{ results.call.result }}"},
        ]
    }
    card: AgentCard = REVIEWER.model_copy(
        update={
            "provider": ProviderConfig(kind="scripted", script=Script.model_validate(script)),
            "tools": ToolPolicy(allow=[f"notes__{tool}"]),
            "mcp_servers": [SERVER],
            "sandbox": Sandbox(working_dir=work),
        }
    )
    await executor(cards=[card], card_tools={card.id: await list_card_tools(card, pool)})


async def _in_inbox(inbox: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    """alice's one pending request of the run, once human-interaction has delivered it to her inbox."""

    async def pending() -> dict[str, Any] | None:
        response = await inbox.get("/inbox", headers=ALICE)
        assert response.status_code == 200, response.text
        mine = [r for r in response.json()["requests"] if r["run_id"] == run_id]
        return mine[0] if mine else None

    return await eventually(pending, what=f"alice's inbox to show a request of {run_id}")


async def test_a_form_answer_that_does_not_fit_is_refused_by_the_inbox_then_a_fitting_one_completes_the_call(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, inbox: httpx.AsyncClient, tmp_path: Path
) -> None:
    await _start(executor, pool, "book", {"room": "atrium"}, tmp_path)
    event = run_requested()
    await bus.publish(event)
    request = await _in_inbox(inbox, str(event.runid))
    url = f"/requests/{request['id']}/answer"
    refused = await inbox.post(url, json={"text": "day: monday\nhours: 12"}, headers=ALICE)
    assert refused.status_code == 422, refused.text
    assert "field 'hours': 12 is greater than the maximum of 8" in refused.json()["detail"]
    answered = await inbox.post(url, json={"text": "day: tuesday\nhours: 3"}, headers=ALICE)
    assert answered.status_code == 200, answered.text
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    assert completed.data["result"] == "booked atrium on tuesday for 3h"
    await event_log.caught_up()
    assert len(event_log.of_type("human.requested", event.runid)) == 1  # refused at the channel: never re-asked


async def test_a_url_mode_elicitation_shows_the_link_in_the_inbox_and_done_completes_the_call(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, inbox: httpx.AsyncClient, tmp_path: Path
) -> None:
    await _start(executor, pool, "connect", {"service": "calendar"}, tmp_path)
    event = run_requested()
    await bus.publish(event)
    request = await _in_inbox(inbox, str(event.runid))
    assert "Open this link: https://auth.example.test/calendar/login?state=s1" in request["question"]
    answered = await inbox.post(f"/requests/{request['id']}/answer", json={"option_id": "done"}, headers=ALICE)
    assert answered.status_code == 200, answered.text
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=60)
    assert completed.data["result"] == "connected calendar"
