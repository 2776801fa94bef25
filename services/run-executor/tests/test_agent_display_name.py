"""The asking agent's display name (its card's ``display_name``) reaches the person's question: the run-executor
puts it on ``human.requested`` (``agent_display_name``); a card without one asks with ``None`` (the id shows).
Over a real nats-server, the scripted reviewer asking ``ask_human``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from executor_support import REVIEWER, RunExecutor, run_requested

from temporality_bus import Bus
from temporality_protocol import HumanRequested
from temporality_run_executor.agents import AgentCard, load_agents
from temporality_testing.events import EventLog


@pytest.mark.parametrize("display_name", ["Rita the Reviewer", None])
async def test_the_question_carries_the_cards_display_name(
    bus: Bus, event_log: EventLog, executor: RunExecutor, display_name: str | None
) -> None:
    await executor(cards=[REVIEWER.model_copy(update={"display_name": display_name})])
    event = run_requested()
    await bus.publish(event)
    (requested,) = await event_log.wait_for("human.requested", run_id=event.runid)
    request = requested.payload(HumanRequested)
    assert request.agent == "reviewer"
    assert request.agent_display_name == display_name


def test_a_card_file_reads_the_display_name_and_refuses_an_empty_one(tmp_path: Path) -> None:
    card = {
        "id": "reviewer",
        "role": "Code reviewer",
        "system_prompt": "x",
        "provider": {"kind": "scripted", "script": "reviewer"},
    }
    agents = tmp_path / "agents.yaml"
    for given, expected in ((card, None), (card | {"display_name": "Rita"}, "Rita")):  # cards before it load as-is
        agents.write_text(json.dumps({"agents": [given]}), encoding="utf-8")  # JSON is YAML
        loaded = load_agents(agents).get("reviewer")
        assert loaded is not None
        assert loaded.display_name == expected
    with pytest.raises(ValueError, match="display_name"):
        AgentCard.model_validate(card | {"display_name": ""})
