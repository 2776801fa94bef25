"""The agent cards file is re-read while the gateway runs: a card added to it can get a trigger, no restart.

A real gateway process (real NATS, real HTTP): ``POST /triggers`` naming an agent not in the file is 422 naming
the file; the card appended, the same request is 201; the file broken, the ids read before stay and the 422 says
the file's current content is refused. Plus :class:`AgentCards` alone with a controlled clock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from gateway_support import AS_ADMIN, agents_file, tokens_file, webhook_spec
from test_gateway_main import _serving_url, _wait_for

from temporality_testing import NatsServer
from temporality_trigger_gateway.agents import AgentCards
from temporality_trigger_gateway.errors import TriggerConfigError


def _post_until(http: httpx.Client, spec: dict[str, object], status: int, timeout: float = 15.0) -> httpx.Response:
    """POST /triggers until the answer is ``status`` (the file is looked at once a second at most)."""
    deadline = time.monotonic() + timeout
    while True:
        response = http.post("/triggers", json=spec, headers=AS_ADMIN)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


def test_a_card_added_to_the_file_gets_a_trigger_without_a_restart(tmp_path: Path, nats_server: NatsServer) -> None:
    cards = agents_file(tmp_path)
    triggers = tmp_path / "triggers.yaml"
    triggers.write_text("triggers: []\n")
    ready, log = tmp_path / "ready", tmp_path / "gateway.log"
    env = {
        **os.environ,
        "TEMPORALITY_NATS_URL": nats_server.url,
        "TEMPORALITY_GATEWAY_PORT": "0",
        "TEMPORALITY_GATEWAY_TRIGGERS_FILE": str(triggers),
        "TEMPORALITY_READY_FILE": str(ready),
        "TEMPORALITY_LOG_FORMAT": "json",
        "TEMPORALITY_API_TOKENS_FILE": str(tokens_file(tmp_path)),
    }
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "temporality_trigger_gateway"], env=env, stderr=stderr, stdin=subprocess.DEVNULL
        )
    try:
        _wait_for(ready, proc)
        with httpx.Client(base_url=_serving_url(log), timeout=10) as http:
            future = webhook_spec("future-pr", agent="rn-future")
            refused = http.post("/triggers", json=future, headers=AS_ADMIN)
            assert refused.status_code == 422, refused.text
            assert f"unknown agent 'rn-future' (not in the agent cards file {cards}; known: reviewer, triager)" in (
                refused.text
            )
            cards.write_text(cards.read_text() + "  - {id: rn-future}\n", encoding="utf-8")
            created = _post_until(http, future, 201)
            assert created.status_code == 201, created.text
            # a broken file keeps the ids read before, and the refusal of an unknown agent says so
            cards.write_text("agents: [\n", encoding="utf-8")
            ghost = webhook_spec("ghost-pr", agent="ghost")
            deadline = time.monotonic() + 15
            while (
                "its current content is refused"
                not in (answer := http.post("/triggers", json=ghost, headers=AS_ADMIN)).text
            ):
                assert time.monotonic() < deadline, answer.text
                time.sleep(0.2)
            assert answer.status_code == 422
            assert "not valid YAML" in answer.text
            assert "known: reviewer, rn-future, triager" in answer.text
            kept = webhook_spec("future-pr-2", agent="rn-future")
            assert http.post("/triggers", json=kept, headers=AS_ADMIN).status_code == 201
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert '"triggers.agents_reloaded"' in text
    assert text.count('"triggers.agents_file_invalid"') == 1  # told once per state of the file


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_agent_cards_look_at_the_file_once_a_second_and_keep_the_last_good_ids(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text("agents:\n  - {id: a}\n")
    clock = _Clock()
    cards = AgentCards(path, clock=clock)
    assert cards.current() == {"a"}
    path.write_text("agents:\n  - {id: a}\n  - {id: b}\n")
    assert cards.current() == {"a"}  # looked at less than a second ago
    clock.now += 1.0
    assert cards.current() == {"a", "b"}
    assert cards.current().where == f"the agent cards file {path}"
    path.write_text("agents: {}\n")
    clock.now += 1.0
    kept = cards.current()
    assert kept == {"a", "b"}
    assert "current content is refused" in kept.where
    assert "expected a mapping with an 'agents' list" in kept.where
    path.unlink()
    clock.now += 1.0
    assert cards.current() == {"a", "b"}
    assert "cannot read the agent cards file" in cards.current(force=True).where
    path.write_text("agents:\n  - {id: c}\n")
    assert cards.current(force=True) == {"c"}
    assert cards.current().where == f"the agent cards file {path}"


def test_agent_cards_refuse_an_unusable_file_at_start(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text("agents:\n  - {role: x}\n")
    with pytest.raises(TriggerConfigError, match="has no string 'id'"):
        AgentCards(path, clock=_Clock())
