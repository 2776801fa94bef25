"""The agent cards API (``GET /agents``, ``GET /agents/{id}``) of the real service, started through the
runtime on a free port with a real nats-server and a real MCP server: role tokens, the views, and no
secret or environment value in any answer."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from executor_support import executor_main

from temporality_bus import NatsSettings
from temporality_run_executor.settings import Settings
from temporality_service.auth import ApiToken, Role, dump_tokens
from temporality_testing.inprocess import serving

VIEWER = ApiToken(name="dashboard", role=Role.viewer, token="viewer-token-0123456789abcdef")
NOTES = str(Path(__file__).with_name("mcp_notes_server.py"))
#: Values that must never come out of the API.
SECRETS = (
    "TOP-SECRET-PROMPT",
    "hunter2-pass",
    "k-123",
    "ARCHITECT_KEY_VAR",
    "sk-the-real-key",
    "mcp-env-secret",
    "NOTES_TOKEN",
    "NOTES_PASS_THROUGH",
    NOTES,
    "skill-instructions-secret",
)


def _files(tmp_path: Path) -> tuple[Path, Path]:
    cards = {
        "skills": {"api-contracts": {"description": "API changes", "instructions": "skill-instructions-secret"}},
        "agents": [
            {
                "id": "reviewer",
                "display_name": "Rita the Reviewer",
                "role": "Code reviewer",
                "description": "Reviews pull requests.",
                "system_prompt": "TOP-SECRET-PROMPT",
                "skills": ["api-contracts"],
                "tools": {"allow": ["get_input", "ask_human"]},
                "provider": {"kind": "scripted", "script": "reviewer"},
            },
            {
                "id": "architect",
                "role": "Architect",
                "system_prompt": "TOP-SECRET-PROMPT",
                "tools": {"allow": ["get_input", "notes__*"], "deny": ["notes__boom"]},
                "provider": {
                    "kind": "openai",
                    "base_url": "https://ci:hunter2-pass@llm.example.com:8443/v1?api-key=k-123#frag",
                    "model": "gpt-test",
                    "api_key_env": "ARCHITECT_KEY_VAR",
                },
                "limits": {"max_turns": 7, "max_tokens": 5000},
                "mcp_servers": [
                    {
                        "name": "notes",
                        "command": sys.executable,
                        "args": [NOTES],
                        "env": {"NOTES_TOKEN": "mcp-env-secret"},
                    }
                ],
                "sandbox": {"env": ["NOTES_PASS_THROUGH"]},
            },
        ],
    }
    agents = tmp_path / "agents.yaml"
    agents.write_text(json.dumps(cards), encoding="utf-8")  # JSON is YAML
    tokens = tmp_path / "api-tokens.json"
    tokens.write_text(dump_tokens([VIEWER]), encoding="utf-8")
    return agents, tokens


@pytest.fixture
async def executor_url(
    nats_settings: NatsSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[str]:
    monkeypatch.setenv("ARCHITECT_KEY_VAR", "sk-the-real-key")
    agents, tokens = _files(tmp_path)
    ready_file = tmp_path / "ready"
    settings = Settings.model_validate(
        {
            "nats": nats_settings,
            "agents_file": agents,
            "port": 0,
            "api": {"tokens_file": tokens},
            "process": {"ready_file": ready_file},
        }
    )
    async with serving(("run-executor", executor_main(settings))):
        url = ready_file.read_text(encoding="utf-8").splitlines()[1]
        yield url.replace("0.0.0.0", "127.0.0.1")


def _no_secret(text: str) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, f"the API showed {leaked}"


async def test_the_cards_are_listed_to_viewers_without_secrets(executor_url: str) -> None:
    viewer = {"Authorization": f"Bearer {VIEWER.token.get_secret_value()}"}
    async with httpx.AsyncClient(base_url=executor_url, timeout=10) as client:
        listed = await client.get("/agents", headers=viewer)
        assert listed.status_code == 200
        _no_secret(listed.text)
        agents = listed.json()["agents"]
        assert [a["id"] for a in agents] == ["architect", "reviewer"]
        architect, reviewer = agents
        assert architect["provider"] == {
            "kind": "openai",
            "model": "gpt-test",
            "base_url": "https://llm.example.com:8443/v1",
            "script": None,
        }
        assert architect["tools"] == ["get_input", "notes__read_note", "notes__whoami", "notes__can_connect"]
        assert architect["tool_policy"] == {"allow": ["get_input", "notes__*"], "deny": ["notes__boom"]}
        assert (architect["limits"]["max_turns"], architect["limits"]["max_tokens"]) == (7, 5000)
        assert (architect["mcp_servers"], architect["sandbox_network"]) == (["notes"], True)
        assert (reviewer["display_name"], architect["display_name"]) == ("Rita the Reviewer", None)
        assert reviewer["skills"] == [{"name": "api-contracts", "description": "API changes"}]
        assert reviewer["provider"] == {"kind": "scripted", "model": None, "base_url": None, "script": "reviewer"}
        assert reviewer["tools"] == ["get_input", "ask_human"]

        one = await client.get("/agents/reviewer", headers=viewer)
        assert one.status_code == 200
        assert one.json() == reviewer
        _no_secret(one.text)

        for path in ("/agents/nobody", "/agents/" + "x" * 5000, "/agents/Reviewer"):
            missing = await client.get(path, headers=viewer)
            assert missing.status_code == 404, path
            assert missing.json()["error"] == "agent_not_found"
            assert "x" * 200 not in missing.text  # the detail never echoes a long input
        traversal = await client.get("/agents/..%2F..%2Fetc", headers=viewer)  # no route: the runtime's 404
        assert traversal.status_code == 404
        assert set(traversal.json()) >= {"error", "detail"}

        for headers in ({}, {"Authorization": "Bearer not-a-token-at-all-0123456789"}, {"Authorization": "Basic x"}):
            denied = await client.get("/agents", headers=headers)
            assert denied.status_code == 401
            assert set(denied.json()) >= {"error", "detail"}
        wrong = await client.post("/agents", headers=viewer)
        assert wrong.status_code == 405
        assert set(wrong.json()) >= {"error", "detail"}
        assert (await client.get("/healthz")).status_code == 200
