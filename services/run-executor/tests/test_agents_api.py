"""The agent cards API (``GET /agents``, ``GET /agents/{id}``, the admin's ``GET /agents/{id}/prompt``) of the real
service, started through the runtime on a free port with a real nats-server and a real MCP server: role tokens, the
views, and no secret or environment value in any answer but the admin's prompt read."""

from __future__ import annotations

import hashlib
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
from temporality_testing.events import EventLog
from temporality_testing.inprocess import serving

VIEWER = ApiToken(name="dashboard", role=Role.viewer, token="viewer-token-0123456789abcdef")
OPERATOR = ApiToken(name="on-call", role=Role.operator, token="operator-token-0123456789abcdef")
ADMIN = ApiToken(name="root-bot", role=Role.admin, token="admin-token-0123456789abcdef01")
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
                    "base_url": "https://llm.example.com:8443/v1?api-key=k-123#frag",
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
    tokens.write_text(dump_tokens([VIEWER, OPERATOR, ADMIN]), encoding="utf-8")
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
        given = "TOP-SECRET-PROMPT\n\n## Skill: api-contracts\nskill-instructions-secret"
        assert reviewer["system_prompt_sha256"] == hashlib.sha256(given.encode()).hexdigest()
        assert architect["system_prompt_sha256"] == hashlib.sha256(b"TOP-SECRET-PROMPT").hexdigest()

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


def _bearer(token: ApiToken) -> dict[str, str]:
    return {"Authorization": f"Bearer {token.token.get_secret_value()}"}


async def test_only_an_admin_reads_a_card_s_prompt_with_the_digest_runs_name(
    executor_url: str, event_log: EventLog, capfd: pytest.CaptureFixture[str]
) -> None:
    """RUN-1: an admin reads the prompt a run of the card is given, its skills' instructions and the SHA-256 that
    run.started's agent card names; a viewer or operator gets 403 (audited: the runtime's refusals), nobody
    without a token gets anything; each read is logged with the admin's name, never the prompt."""
    async with httpx.AsyncClient(base_url=executor_url, timeout=10) as client:
        for who in (VIEWER, OPERATOR):
            refused = await client.get("/agents/reviewer/prompt", headers=_bearer(who))
            assert refused.status_code == 403, who.name
            assert refused.json()["error"] == "forbidden"
            _no_secret(refused.text)
        assert (await client.get("/agents/reviewer/prompt")).status_code == 401
        for who in (VIEWER, OPERATOR):  # each refusal is in the audit trail, by the token's name
            refusal = (
                await event_log.wait_for(
                    "api.access_refused", where=lambda e, name=who.name: e.data.get("principal") == name, timeout_s=30
                )
            )[0]
            assert (refusal.data["status"], refusal.data["path"], refusal.data["role_needed"]) == (
                403,
                "/agents/reviewer/prompt",
                "admin",
            )

        read = await client.get("/agents/reviewer/prompt", headers=_bearer(ADMIN))
        assert read.status_code == 200
        given = "TOP-SECRET-PROMPT\n\n## Skill: api-contracts\nskill-instructions-secret"
        assert read.json() == {
            "id": "reviewer",
            "system_prompt": "TOP-SECRET-PROMPT",
            "skills": [
                {"name": "api-contracts", "description": "API changes", "instructions": "skill-instructions-secret"}
            ],
            "instructions": given,
            "sha256": hashlib.sha256(given.encode("utf-8")).hexdigest(),
        }
        card = (await client.get("/agents/reviewer", headers=_bearer(VIEWER))).json()
        assert card["system_prompt_sha256"] == read.json()["sha256"]
        # the admin's answer holds the prompt, never the provider's or an MCP server's secrets
        architect = await client.get("/agents/architect/prompt", headers=_bearer(ADMIN))
        assert architect.status_code == 200
        assert architect.json()["skills"] == []
        leaked = [s for s in SECRETS if s in architect.text and s != "TOP-SECRET-PROMPT"]
        assert not leaked

        for path in ("/agents/nobody/prompt", "/agents/Reviewer/prompt", "/agents/" + "x" * 5000 + "/prompt"):
            missing = await client.get(path, headers=_bearer(ADMIN))
            assert missing.status_code == 404, path
            assert missing.json()["error"] == "agent_not_found"
    logged = capfd.readouterr()
    lines = [line for line in (logged.out + logged.err).splitlines() if "agents.prompt_read" in line]
    assert len(lines) == 2, lines
    assert all("root-bot" in line for line in lines)
    assert not any("TOP-SECRET-PROMPT" in line or "skill-instructions-secret" in line for line in lines)
