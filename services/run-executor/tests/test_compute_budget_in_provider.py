"""A run whose compute budget runs out in a provider call fails ``compute_timeout`` (the card's limit), as the
failure table promises, not ``provider_error``. Over a real nats-server, the model behind the OpenAI emulator (real
HTTP), slow on purpose."""

from __future__ import annotations

from executor_support import REVIEWER, RunExecutor, run_requested

from temporality_bus import Bus
from temporality_run_executor.agents import AgentCard, Limits, ProviderConfig
from temporality_run_executor.tools import ToolPolicy
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, assistant_text, assistant_tool_call, error_reply, hang


def _card(emulator: OpenAIEmulator) -> AgentCard:
    provider = ProviderConfig(
        kind="openai", base_url=emulator.base_url, model="gpt-emu", timeout_s=3, retry_backoff_s=0.01
    )
    return REVIEWER.model_copy(
        update={"provider": provider, "tools": ToolPolicy(allow=["get_input"]), "limits": Limits(max_compute_s=4)}
    )


async def test_a_provider_call_cut_short_by_the_budget_fails_compute_timeout(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies += [hang(2.5, assistant_tool_call("c1", "get_input", {})), hang(2.5), hang(2.5)]
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid, timeout_s=60)
    assert failed.data["reason"] == "compute_timeout"
    error = failed.data["error"]
    assert error.startswith("the run's compute budget ran out in the provider call (1.")
    assert "timed out after 1." in error


async def test_a_retry_past_the_budget_fails_compute_timeout(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    """A 503 asking to retry after 10 s, with 4 s of budget: the retry would pass it."""
    emulator.replies += [error_reply(503, "busy", retry_after="10"), assistant_text("late")]
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid, timeout_s=60)
    assert failed.data["reason"] == "compute_timeout"
    assert "not retried: waiting 10.0s more would pass the run's remaining compute budget" in failed.data["error"]


async def test_a_refused_call_is_still_provider_error(
    bus: Bus, event_log: EventLog, executor: RunExecutor, emulator: OpenAIEmulator
) -> None:
    emulator.replies.append(error_reply(400, "bad request", kind="invalid_request_error"))
    await executor(cards=[_card(emulator)])
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid, timeout_s=60)
    assert failed.data["reason"] == "provider_error"
