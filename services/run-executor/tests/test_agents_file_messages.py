"""The agents file's mistakes are each said once, naming the file and the place: a repeated agent id, a skill bundle
with a key it does not have, ``skills`` given as a list; a ``sandbox.env`` variable that is not set is a warning
naming it (the start goes on: the server gets nothing for it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from temporality_run_executor.agents import AgentsFileError, load_agents

CARD = """
  - id: {id}
    role: Reviewer
    system_prompt: You review.
    provider: {{kind: scripted, script: reviewer}}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agents.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_repeated_agent_id_names_the_file_the_id_and_both_places(tmp_path: Path) -> None:
    path = _write(tmp_path, "agents:" + CARD.format(id="a") + CARD.format(id="b") + CARD.format(id="a"))
    with pytest.raises(AgentsFileError) as caught:
        load_agents(path)
    assert str(caught.value) == (
        f"{path}: agent id 'a' is used twice (agents[0] and agents[2]); each agent needs its own id"
    )


def test_a_skill_bundle_with_an_extra_key_is_said_once(tmp_path: Path) -> None:
    text = "skills:\n  terse: {instructions: Be brief., colour: blue}\nagents:" + CARD.format(id="a")
    path = _write(tmp_path, text)
    with pytest.raises(AgentsFileError) as caught:
        load_agents(path)
    message = str(caught.value)
    assert message == (
        f"{path}: skills.terse: colour: Extra inputs are not permitted (a skill is its instructions, or "
        "{description, instructions})"
    )


def test_skills_given_as_a_list_say_they_must_be_a_mapping(tmp_path: Path) -> None:
    text = "skills: [a]\nagents:" + CARD.format(id="x").replace("system_prompt", "skills: [a]\n    system_prompt")
    path = _write(tmp_path, text)
    with pytest.raises(AgentsFileError) as caught:
        load_agents(path)
    assert str(caught.value).startswith(f"{path}: skills must be a mapping of a skill's name to its instructions")
    assert "not a list" in str(caught.value)


def test_an_unset_sandbox_variable_is_a_warning_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_TOKEN_FOR_TEST", raising=False)
    monkeypatch.setenv("SET_TOKEN_FOR_TEST", "x")
    text = "agents:" + CARD.format(id="a") + "    sandbox: {env: [NO_SUCH_TOKEN_FOR_TEST, SET_TOKEN_FOR_TEST]}\n"
    path = _write(tmp_path, text)
    with capture_logs() as logs:
        (card,) = load_agents(path).cards()
    assert card.id == "a"
    warned = [entry for entry in logs if entry["event"] == "agents.sandbox_env_unset"]
    assert warned == [
        {
            "event": "agents.sandbox_env_unset",
            "log_level": "warning",
            "file": str(path),
            "agent": "a",
            "variable": "NO_SUCH_TOKEN_FOR_TEST",
        }
    ]
