"""Agent cards (RUN-1): the full card loads, every mistake is refused at start naming the agent and the field
(exit status 2 from the real process), and skills reach the run's system prompt and run.started."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from executor_support import REVIEWER, RunExecutor, run_requested

from temporality_bus import Bus
from temporality_protocol import AgentSummary, RunStarted, SandboxSummary
from temporality_protocol.catalog import BUCKET_CHECKPOINTS
from temporality_run_executor.__main__ import configure
from temporality_run_executor.agents import AgentsFileError, Sandbox, Skill, load_agents, prompt_digest
from temporality_run_executor.records import Checkpoint
from temporality_run_executor.settings import Settings
from temporality_service import ConfigError
from temporality_testing.events import EventLog

CONFIG = Path(__file__).resolve().parents[3] / "config" / "agents.yaml"

FULL = f"""
skills:
  contracts: {{description: API rules, instructions: Ask before breaking a public API.}}
  terse: Answer in three sentences at most.
agents:
  - id: full
    role: Reviewer
    system_prompt: You review.
    skills: [contracts, {{name: local, instructions: Mention the ticket.}}, terse]
    tools: {{allow: [get_input, ask_human, "files__*"], deny: [files__delete]}}
    provider: {{kind: openai, base_url: "http://127.0.0.1:9/v1", model: m, api_key_env: KEY}}
    limits: {{max_turns: 5, max_tokens: 1000, max_compute_s: 30}}
    mcp_servers:
      - name: files
        command: {sys.executable}
        args: ["-m", "some_server"]
        env: {{LOG_LEVEL: debug}}
    sandbox: {{working_dir: work, env: [GITHUB_TOKEN], network: false}}
"""


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable FULL's provider.api_key_env names (an unset one stops the start)."""
    monkeypatch.setenv("KEY", "sk-test")


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "work").mkdir(exist_ok=True)
    path = tmp_path / "agents.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_full_card_loads_with_its_skills_servers_and_sandbox(tmp_path: Path) -> None:
    (card,) = load_agents(_write(tmp_path, FULL)).cards()
    assert [s.name for s in card.skills] == ["contracts", "local", "terse"]
    assert card.skills[2] == Skill(name="terse", instructions="Answer in three sentences at most.")
    assert card.instructions() == (
        "You review.\n\n## Skill: contracts\nAsk before breaking a public API.\n\n"
        "## Skill: local\nMention the ticket.\n\n## Skill: terse\nAnswer in three sentences at most."
    )
    (server,) = card.mcp_servers
    assert (server.name, server.transport, server.args, server.env) == (
        "files",
        "stdio",
        ["-m", "some_server"],
        {"LOG_LEVEL": "debug"},
    )
    assert card.sandbox.working_dir == tmp_path / "work"  # relative to the agents file
    assert (card.sandbox.env, card.sandbox.network) == (["GITHUB_TOKEN"], False)
    assert (card.limits.max_turns, card.limits.max_tokens, card.limits.max_compute_s) == (5, 1000, 30.0)
    configure(Settings(agents_file=tmp_path / "agents.yaml"))  # `files__*` names tools the server will list


def test_the_shipped_agents_file_loads() -> None:
    (card,) = load_agents(CONFIG).cards()
    assert card.id == "reviewer"
    assert "## Skill: api-contracts" in card.instructions()
    configure(Settings(agents_file=CONFIG))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("skills: [contracts", "skills: [contract"), "agents[0] (full): skills[0]: no skill named 'contract'"),
        (("working_dir: work", "working_dir: nowhere"), "agents[0] (full): sandbox: Value error, working_dir"),
        (
            (f"command: {sys.executable}", "command: no-such-mcp-server"),
            "agents[0] (full): mcp_servers[0]: Value error, command 'no-such-mcp-server'",
        ),
        (
            ("env: [GITHUB_TOKEN]", "env: [GITHUB-TOKEN]"),
            "agents[0] (full): sandbox.env[0]: String should match pattern",
        ),
        (("max_turns: 5", "max_turns: 0"), "agents[0] (full): limits.max_turns: Input should be greater than 0"),
        (("network: false", "network: off-ish"), "agents[0] (full): sandbox.network: Input should be a valid boolean"),
        (
            ("role: Reviewer", "role: Reviewer\n    colour: blue"),
            "agents[0] (full): colour: Extra inputs are not permitted",
        ),
        (("name: files", "name: Files"), "agents[0] (full): mcp_servers[0].name: String should match pattern"),
        (
            ("        command:", "        transport: sse\n        command:"),
            "mcp_servers[0].transport: Input should be 'stdio'",
        ),
    ],
)
def test_a_mistake_is_refused_naming_the_agent_and_the_field(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    old, new = change
    assert old in FULL
    text = FULL.replace(old, new)
    with pytest.raises(AgentsFileError) as caught:
        load_agents(_write(tmp_path, text))
    assert message in str(caught.value)


def test_repeated_mcp_server_names_are_refused(tmp_path: Path) -> None:
    text = FULL.replace("    sandbox:", f"      - {{name: files, command: {sys.executable}}}\n    sandbox:")
    with pytest.raises(
        AgentsFileError, match=r"agents\[0\] \(full\): Value error, mcp_servers: names repeat: \['files'\]"
    ):
        load_agents(_write(tmp_path, text))


def test_unknown_tools_are_refused_unless_an_mcp_server_may_list_them(tmp_path: Path) -> None:
    text = FULL.replace('"files__*"', '"files__read", "github__read"')
    with pytest.raises(ConfigError, match=r"agent full: tools names unknown tools \['github__read'\]"):
        configure(Settings(agents_file=_write(tmp_path, text)))


def test_the_process_exits_2_naming_the_field(tmp_path: Path) -> None:
    path = _write(tmp_path, FULL.replace("max_turns: 5", "max_turns: 0"))
    env = {**os.environ, "TEMPORALITY_EXECUTOR_AGENTS_FILE": str(path), "TEMPORALITY_LOG_FORMAT": "json"}
    done = subprocess.run(
        [sys.executable, "-m", "temporality_run_executor"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "agents[0] (full): limits.max_turns: Input should be greater than 0" in done.stdout + done.stderr


async def test_skills_are_appended_to_the_run_s_system_prompt(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    card = REVIEWER.model_copy(update={"skills": [Skill(name="contracts", instructions="Ask before breaking.")]})
    await executor(cards=[card])
    event = run_requested()
    await bus.publish(event)
    await event_log.wait_for("human.requested", run_id=event.runid)
    (started,) = event_log.of_type("run.started", event.runid)
    given = "You review pull requests.\n\n## Skill: contracts\nAsk before breaking."
    assert started.payload(RunStarted).agent_card == AgentSummary(
        provider="scripted",
        skills=["contracts"],
        tools=["get_input", "ask_human"],
        max_turns=20,
        max_compute_s=900.0,
        # RUN-1: which prompt (its digest: the prompt itself stays in the card) and which sandbox
        system_prompt_sha256=hashlib.sha256(given.encode()).hexdigest(),
        sandbox=SandboxSummary(kind="process", network=True, working_dir_set=False),
    )  # RUN-1: what the run was started with, in the journal
    checkpoints = await bus.store(BUCKET_CHECKPOINTS, Checkpoint)
    async with asyncio.timeout(10):
        ckpt = await checkpoints.get(str(event.runid))
    assert ckpt is not None
    system = ckpt.value.messages[0]
    assert (system.role, system.content) == ("system", given)


async def test_run_started_names_the_prompt_by_digest_and_the_sandbox_without_its_variables(
    bus: Bus, event_log: EventLog, executor: RunExecutor, tmp_path: Path
) -> None:
    """RUN-1: run.started tells the digest of the exact prompt the run was given (the checkpoint's system message)
    and what its sandbox is; never the prompt, the pass-through variables' names, nor the working directory."""
    secret = "PROMPT-SECRET-d41d8cd9"
    card = REVIEWER.model_copy(
        update={
            "system_prompt": f"You review. Internal key: {secret}",
            "sandbox": Sandbox(working_dir=tmp_path, env=["GITHUB_TOKEN_FOR_TOOLS"], network=True),
        }
    )
    await executor(cards=[card])
    event = run_requested()
    await bus.publish(event)
    await event_log.wait_for("human.requested", run_id=event.runid)
    (started,) = event_log.of_type("run.started", event.runid)
    summary = started.payload(RunStarted).agent_card
    assert summary is not None
    assert summary.sandbox == SandboxSummary(kind="process", network=True, working_dir_set=True)
    checkpoints = await bus.store(BUCKET_CHECKPOINTS, Checkpoint)
    async with asyncio.timeout(10):
        ckpt = await checkpoints.get(str(event.runid))
    assert ckpt is not None
    given = ckpt.value.messages[0].content
    assert given is not None
    assert summary.system_prompt_sha256 == hashlib.sha256(given.encode("utf-8")).hexdigest()
    assert summary.system_prompt_sha256 == prompt_digest(card.instructions())
    wire = json.dumps(started.data)
    for hidden in (secret, "GITHUB_TOKEN_FOR_TOOLS", str(tmp_path)):
        assert hidden not in wire
