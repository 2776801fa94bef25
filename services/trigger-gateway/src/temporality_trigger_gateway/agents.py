"""The agent ids a trigger may name, read from the run-executor's agent cards file (``config/agents.yaml``).

Only ``agents[].id`` matters here; every other key of a card is the run-executor's and is ignored, so the
cards can grow without the gateway noticing. The gateway never imports the run-executor: it reads the file.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from temporality_trigger_gateway.errors import TriggerConfigError

__all__ = ["load_agent_ids"]


def load_agent_ids(path: Path) -> frozenset[str]:
    """The ``id`` of every card in ``path``; :class:`TriggerConfigError` naming the file when it is unusable."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8-sig"))
    except OSError as exc:
        raise TriggerConfigError(f"{path}: cannot read the agent cards file: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise TriggerConfigError(f"{path}: not valid YAML: {exc}") from None
    cards = data.get("agents") if isinstance(data, dict) else None
    if not isinstance(cards, list):
        raise TriggerConfigError(f"{path}: expected a mapping with an 'agents' list")
    ids: set[str] = set()
    for index, card in enumerate(cards):
        agent_id = card.get("id") if isinstance(card, dict) else None
        if not isinstance(agent_id, str) or not agent_id:
            raise TriggerConfigError(f"{path}: agents[{index}] has no string 'id'")
        ids.add(agent_id)
    return frozenset(ids)
