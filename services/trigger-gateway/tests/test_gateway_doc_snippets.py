"""Every trigger snippet in docs/triggers.md and docs/webhook-senders.md validates with the real trigger model.

An integrator review: the Azure DevOps, GitHub and GitLab snippets, ``nightly-digest`` and ``mm-tests`` left
out the required ``name`` and failed when copy-pasted. A ```yaml or ```json block of the docs whose items have
an ``id`` and a trigger ``type`` is a trigger snippet (a list under ``triggers:``, as printed, or one mapping);
each is parsed as a triggers file, its ``*_env`` variables set.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import yaml
from gateway_support import REPO

from temporality_trigger_gateway import parse_triggers

DOCS = ("docs/triggers.md", "docs/webhook-senders.md")
TYPES = frozenset({"webhook", "schedule", "event"})
_BLOCK = re.compile(r"^```(yaml|json)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


class _AnyEnviron(Mapping[str, str]):
    """Every environment variable set, to a value each secret kind takes (a ``whsec_`` key is a fine password)."""

    VALUE = "whsec_" + base64.b64encode(b"doc-snippet-test-key-000").decode()

    def __getitem__(self, key: str) -> str:
        return self.VALUE

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _is_trigger(item: Any) -> bool:
    return isinstance(item, dict) and "id" in item and item.get("type") in TYPES


def _snippets() -> Iterator[Any]:
    for doc in DOCS:
        text = (REPO / doc).read_text(encoding="utf-8")
        for found in _BLOCK.finditer(text):
            kind, body = found.groups()
            line = text.count("\n", 0, found.start()) + 1
            try:
                data = json.loads(body) if kind == "json" else yaml.safe_load(body)
            except (json.JSONDecodeError, yaml.YAMLError):
                continue  # not a document (a request line, an elided shape): not a trigger snippet
            if isinstance(data, dict) and isinstance(data.get("triggers"), list):
                data = data["triggers"]
            if isinstance(data, dict) and isinstance(data.get("trigger"), dict):  # an admin API body
                data = data["trigger"]
            items = data if isinstance(data, list) else [data]
            triggers = [item for item in items if _is_trigger(item)]
            if triggers:
                yield pytest.param(triggers, id=f"{doc}:{line}")


SNIPPETS = list(_snippets())


def test_the_docs_have_trigger_snippets() -> None:
    """The extraction finds them (so the test below cannot pass by finding none)."""
    ids = {t["id"] for param in SNIPPETS for t in param.values[0]}
    assert {"ado-pr-review", "gh-pr-review", "gl-mr-review", "nightly-digest", "mm-tests"} <= ids


@pytest.mark.parametrize("triggers", SNIPPETS)
def test_a_doc_snippet_is_a_valid_trigger(triggers: list[dict[str, Any]]) -> None:
    parsed = parse_triggers({"triggers": triggers}, source="doc snippet", environ=_AnyEnviron())
    assert [t.id for t in parsed] == [t["id"] for t in triggers]
