"""docker compose's way to the model provider's API key (an agent card's ``api_key_env``): the env file
``deploy/compose/executor.env`` (or ``$EXECUTOR_ENV_FILE``) is read by the run-executor only, ships nothing set
(the shipped cards use the scripted provider), and its examples name the variables the documented cards read."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXECUTOR_ENV = ROOT / "deploy" / "compose" / "executor.env"
REFERENCE = "${EXECUTOR_ENV_FILE:-./deploy/compose/executor.env}"


def test_compose_gives_the_executor_env_file_to_the_run_executor_only_and_it_ships_nothing_set() -> None:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    readers = {name for name, service in doc["services"].items() if REFERENCE in (service.get("env_file") or [])}
    assert readers == {"run-executor"}
    text = EXECUTOR_ENV.read_text(encoding="utf-8")
    live = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert live == [], "as shipped, no key: the shipped agent cards use the scripted provider"


def test_the_example_names_the_variable_the_documented_card_reads() -> None:
    examples = re.findall(r"^# ([A-Z][A-Z0-9_]*)='[^']*'$", EXECUTOR_ENV.read_text(encoding="utf-8"), re.MULTILINE)
    documented = set(re.findall(r"api_key_env: ([A-Z][A-Z0-9_]*)", (ROOT / "docs" / "agents.md").read_text("utf-8")))
    assert examples == ["OPENAI_API_KEY", "AZURE_OPENAI_API_KEY"]
    assert documented == set(examples)  # every variable a documented card reads has its commented example
