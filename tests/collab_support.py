"""Shared steps of the cross-process collaboration scenarios (``tests/test_agent_collaboration.py``,
``tests/test_external_agent_asks.py``, ``tests/test_collab_executor_kill9.py``): a run requested into a saga the
way the gateway requests one, and a person's answer that lets a scripted run parked on ``ask_human`` go on."""

from __future__ import annotations

from temporality_bus import Bus
from temporality_protocol import (
    HumanAnswered,
    HumanPolicy,
    HumanRequested,
    LaunchSource,
    OptionAnswer,
    RunRequested,
    make_event,
)

__all__ = ["let_go", "request_run"]


async def request_run(bus: Bus, run_id: str, agent: str, saga: str) -> str:
    """``run.requested`` for ``run_id`` of ``agent`` in ``saga`` (alice may be asked); returns ``run_id``."""
    data = RunRequested(
        run_id=run_id,
        agent=agent,
        title=f"{agent} in the saga",
        launch=LaunchSource(kind="webhook", trigger_id="t"),
        human=HumanPolicy(allowed_recipients=["user:alice"]),
    )
    await bus.publish(make_event(data, source="/test", id=f"evt-rr-{run_id}", run_id=run_id, correlation_id=saga))
    return run_id


async def let_go(bus: Bus, held: HumanRequested, run_id: str, *, waited_s: float = 1.0) -> None:
    """The person answers ``held`` with the option ``go`` on the web inbox (``human.answered``, a derived id)."""
    answered = HumanAnswered(
        request_id=held.request_id,
        run_id=run_id,
        recipient=held.recipient,
        responder=held.recipient,
        answer=OptionAnswer(option_id="go"),
        channel="web",
        waited_s=waited_s,
    )
    await bus.publish(make_event(answered, source="/test", id=f"evt-ans-{held.request_id}", run_id=run_id))
