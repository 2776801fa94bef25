"""A service process does not import at start what only some configurations use (docs/operations.md,
"Start-up cost"): human-interaction's chat clients (python-telegram-bot, matrix-nio, with the cryptography they
pull in) load when that channel is configured, and jsonschema with the first form answer it checks.

Each service's entry module is imported in a fresh interpreter, the way ``python -m <package>`` does, and its
channels built from settings with no chat channel configured: none of the packages below may be imported by
then. No timing is asserted: the guard is what is imported, which the loaded machine cannot make flaky.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from temporality_protocol.catalog import SERVICES

#: Per service, what only some configurations (or only some requests) use, imported when first needed.
LATER = {
    "human-interaction": ("telegram", "nio", "jsonschema"),  # a configured chat channel, a form's answer
    "trigger-gateway": ("telegram", "nio", "jsonschema"),
    "agent-collab": ("telegram", "nio", "jsonschema"),
    "journal": ("telegram", "nio", "jsonschema"),
    "run-executor": ("telegram", "nio"),  # its tools validate arguments with jsonschema at every call
}

PROBE = """
import json, sys
import {package}.__main__
imported = [name for name in {names!r} if name in sys.modules]
print(json.dumps({{"imported": imported}}))
"""

#: human-interaction with only the web inbox: its adapters built as at start.
HUMAN_PROBE = """
import json, sys
from temporality_human_interaction.__main__ import build_adapters
from temporality_human_interaction.settings import Settings
adapters = build_adapters(Settings(), bus=None)
assert [type(a).__name__ for a in adapters] == ["WebInboxAdapter"], adapters
imported = [name for name in {names!r} if name in sys.modules]
print(json.dumps({{"imported": imported}}))
"""


def _package(name: str) -> str:
    return "temporality_" + name.replace("-", "_")


def _probe(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    imported: list[str] = json.loads(done.stdout.strip().splitlines()[-1])["imported"]
    return imported


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_service_imports_nothing_it_does_not_use_yet(name: str) -> None:
    assert set(LATER) == set(SERVICES)
    imported = _probe(PROBE.format(package=_package(name), names=LATER[name]))
    assert imported == [], f"{name} imports {imported} at start"


def test_human_interaction_loads_no_chat_client_without_its_channel() -> None:
    imported = _probe(HUMAN_PROBE.format(names=LATER["human-interaction"]))
    assert imported == [], f"human-interaction with the web inbox only imports {imported}"
