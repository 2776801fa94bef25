"""``examples/mcp-server``: the example MCP stdio server (the installed ``mcp`` SDK's API) in a real run, and its
card as the docs show it. The server is started over stdio by the executor's MCP pool; ``deploy`` asks the
person through MCP elicitation, the run parks on an ordinary ``human.requested`` and the answer (published on
the bus as human-interaction does) completes the call."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from executor_support import RunExecutor, run_record, run_requested

from temporality_bus import Bus
from temporality_protocol import HumanAnswered, HumanRequested, OptionAnswer, RunState, make_event
from temporality_run_executor.agents import AgentCard, McpServer, Sandbox, load_agents
from temporality_run_executor.mcp_servers import McpPool, list_card_tools
from temporality_testing.events import EventLog

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples/mcp-server"


@pytest.fixture
async def pool() -> AsyncIterator[McpPool]:
    pool = McpPool()
    try:
        yield pool
    finally:
        await pool.aclose()


def _example_card(work: Path) -> AgentCard:
    """The example's card, its server started with this interpreter (it has the SDK) and by absolute path."""
    (card,) = load_agents(EXAMPLE / "agents.yaml").cards()
    server = McpServer(name="deploy", command=sys.executable, args=[str(EXAMPLE / "deploy_server.py")])
    return card.model_copy(update={"mcp_servers": [server], "sandbox": Sandbox(working_dir=work)})


async def _answer(bus: Bus, requested: HumanRequested, option: str) -> None:
    answered = HumanAnswered(
        request_id=requested.request_id,
        run_id=requested.run_id,
        recipient=requested.recipient,
        responder=requested.recipient,
        answer=OptionAnswer(option_id=option),
        channel="web",
        waited_s=1.0,
    )
    await bus.publish(make_event(answered, source="/test", id=f"evt-ans-{requested.request_id}"))


@pytest.mark.parametrize(("option", "result"), [("yes", "deployed orders-api to staging"), ("decline", "not deployed")])
async def test_the_example_server_asks_before_it_deploys(
    bus: Bus, event_log: EventLog, executor: RunExecutor, pool: McpPool, tmp_path: Path, option: str, result: str
) -> None:
    card = _example_card(tmp_path)
    tools = await list_card_tools(card, pool)
    assert sorted(t.name for t in tools) == ["deploy__deploy", "deploy__list_environments"]
    await executor(cards=[card], card_tools={card.id: tools})
    event = run_requested(agent=card.id)
    await bus.publish(event)
    (found,) = await event_log.wait_for("human.requested", run_id=event.runid, timeout_s=120)
    requested = found.payload(HumanRequested)
    assert requested.question == "Deploy orders-api to staging?"
    assert [o.id for o in requested.options] == ["yes", "no", "decline"]
    await run_record(bus, event.runid, RunState.WAITING_FOR_HUMAN)
    assert not (tmp_path / "deployments.log").exists()  # nothing done while the question waits
    await _answer(bus, requested, option)
    (completed,) = await event_log.wait_for("run.completed", run_id=event.runid, timeout_s=120)
    assert completed.data["result"].startswith(result)
    deployed = (tmp_path / "deployments.log").read_text(encoding="utf-8") if option == "yes" else None
    assert deployed == ("orders-api -> staging\n" if option == "yes" else None)
    await event_log.caught_up()
    called = {e.data["tool"]: e.data for e in event_log.of_type("run.tool_called", event.runid)}
    assert "staging" in called["deploy__list_environments"]["result_preview"]  # a tool without parameters


def test_the_example_card_is_the_docs_card() -> None:
    """docs/agents.md shows the example's card; the example file is what the test above runs."""
    card = yaml.safe_load((EXAMPLE / "agents.yaml").read_text(encoding="utf-8"))["agents"][0]
    docs = (REPO / "docs/agents.md").read_text(encoding="utf-8")
    assert "examples/mcp-server/deploy_server.py" in docs
    assert card["mcp_servers"][0]["args"] == ["examples/mcp-server/deploy_server.py"]


def _check(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "temporality_run_executor", "check-agents", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
        env=env,
    )


def test_check_agents_accepts_the_example_and_the_shipped_cards() -> None:
    done = _check("examples/mcp-server/agents.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("examples/mcp-server/agents.yaml: 1 agent card(s) valid: deployer\n")
    assert "not checked: the tools of 1 MCP server(s)" in done.stdout
    shipped = _check()  # TEMPORALITY_EXECUTOR_AGENTS_FILE unset: config/agents.yaml, as the executor
    assert shipped.returncode == 0, shipped.stderr
    assert shipped.stdout.startswith("config/agents.yaml: ")


def test_check_agents_refuses_with_the_executor_s_message(tmp_path: Path) -> None:
    bad = tmp_path / "agents.yaml"
    bad.write_text(
        "agents:\n  - id: coder\n    role: Coder\n    system_prompt: x\n"
        "    provider: {kind: openai, base_url: 'https://ci:hunter2@example.test/v1', model: m}\n",
        encoding="utf-8",
    )
    done = _check(str(bad))
    assert done.returncode == 1
    assert done.stdout == ""
    message = "agents[0] (coder): provider.base_url: Value error, base_url must not carry a user name or password"
    assert done.stderr.startswith(f"error: {bad}: ")
    assert message in done.stderr
    # the executor itself stops with the same message (config.invalid, exit 2)
    started = subprocess.run(
        [sys.executable, "-m", "temporality_run_executor"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "TEMPORALITY_EXECUTOR_AGENTS_FILE": str(bad), "TEMPORALITY_LOG_FORMAT": "console"},
    )
    assert started.returncode == 2
    assert done.stderr.removeprefix("error: ").strip() in started.stderr.replace("\\n", "\n")


def test_check_agents_usage(tmp_path: Path) -> None:
    missing = _check(str(tmp_path / "nope.yaml"))
    assert missing.returncode == 1
    assert "nope.yaml" in missing.stderr
    helped = _check("--help")
    assert helped.returncode == 0
    assert helped.stdout.startswith("usage: temporality-run-executor check-agents [PATH]")
    extra = _check("a.yaml", "b.yaml")
    assert extra.returncode == 2
    assert "unexpected argument(s): check-agents a.yaml b.yaml" in extra.stderr
