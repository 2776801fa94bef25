"""Azure OpenAI's classic deployment URLs take the API key in an ``api-key`` header, not ``Authorization: Bearer``:
``provider.api_key_header: api-key`` sends it so (over real HTTP against the endpoint emulator, which serves the
classic ``/openai/deployments/<name>/chat/completions`` path too), with no ``Authorization`` header; the default
stays ``Authorization: Bearer``. In a run (real nats-server) the key is never in an event, the run record or the
executor's log, even when the endpoint echoes it in its refusal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from executor_support import REVIEWER, RunExecutor, run_record, run_requested
from pydantic import ValidationError
from structlog.testing import capture_logs

from temporality_bus import Bus
from temporality_protocol import RunState
from temporality_run_executor.__main__ import configure
from temporality_run_executor.agents import AgentCard, ProviderConfig, load_agents
from temporality_run_executor.providers import OpenAICompatible
from temporality_run_executor.records import Message
from temporality_run_executor.settings import Settings
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, assistant_text, error_reply

SECRET = "azure-key-0123456789abcdef"
HI = [Message(role="user", content="hi")]


@pytest.fixture
async def azure(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[OpenAIEmulator]:
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", SECRET)
    async with OpenAIEmulator().serve() as emu:
        yield emu


async def test_api_key_header_sends_the_key_as_api_key_and_no_authorization(azure: OpenAIEmulator) -> None:
    azure.replies += [assistant_text("one"), assistant_text("two")]
    provider = OpenAICompatible(
        base_url=azure.azure_deployment_url("gpt-4o"), model="gpt-4o", api_key=SECRET, api_key_header="api-key"
    )
    try:
        assert (await provider.complete(HI, [])).content == "one"
        assert (await provider.complete(HI, [])).content == "two"
    finally:
        await provider.aclose()
    assert azure.paths == ["/openai/deployments/gpt-4o/chat/completions"] * 2
    assert azure.queries == [{"api-version": "2024-10-21"}] * 2
    assert azure.api_keys == [SECRET] * 2
    assert azure.authorizations == [None, None]


async def test_the_default_stays_authorization_bearer(azure: OpenAIEmulator) -> None:
    azure.replies.append(assistant_text("one"))
    provider = OpenAICompatible(base_url=azure.base_url, model="m", api_key=SECRET)
    try:
        await provider.complete(HI, [])
    finally:
        await provider.aclose()
    assert (azure.authorizations, azure.api_keys) == ([f"Bearer {SECRET}"], [None])


CARD = """
agents:
  - id: azure-coder
    role: Coder
    system_prompt: You write code.
    provider:
      kind: openai
      base_url: "https://my-resource.openai.azure.com/openai/deployments/gpt-4o?api-version=2024-10-21"
      model: gpt-4o
      api_key_env: AZURE_OPENAI_API_KEY
      api_key_header: api-key
"""


def test_a_card_names_the_header_and_only_openai_takes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", SECRET)
    path = tmp_path / "agents.yaml"
    path.write_text(CARD, encoding="utf-8")
    configure(Settings(agents_file=path))  # the executor starts with it
    (card,) = load_agents(path).cards()
    assert card.provider.api_key_header == "api-key"
    with pytest.raises(ValidationError, match="api_key_header"):
        ProviderConfig(kind="openai", base_url="http://127.0.0.1:1/v1", model="m", api_key_header="x-api-key")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="api_key_header is for the openai provider, not scripted"):
        ProviderConfig(kind="scripted", script="reviewer", api_key_header="api-key")


def _card(azure: OpenAIEmulator) -> AgentCard:
    provider = ProviderConfig(
        kind="openai",
        base_url=azure.azure_deployment_url("gpt-4o"),
        model="gpt-4o",
        api_key_env="AZURE_OPENAI_API_KEY",
        api_key_header="api-key",
        max_retries=0,
    )
    return REVIEWER.model_copy(update={"provider": provider})


async def test_a_run_sends_api_key_and_never_shows_it(
    bus: Bus, event_log: EventLog, executor: RunExecutor, azure: OpenAIEmulator
) -> None:
    azure.replies += [
        assistant_text("Reviewed."),
        error_reply(401, f"Access denied due to invalid subscription key {SECRET}.", kind="invalid_request_error"),
    ]
    with capture_logs() as logs:
        await executor(cards=[_card(azure)])
        done, refused = run_requested(), run_requested()
        await bus.publish(done)
        await event_log.wait_for("run.completed", run_id=done.runid)
        await bus.publish(refused)
        (failed,) = await event_log.wait_for("run.failed", run_id=refused.runid)
        assert refused.runid is not None
        record = await run_record(bus, refused.runid, lambda r: r.state is RunState.FAILED)
    assert azure.api_keys == [SECRET] * 2
    assert azure.authorizations == [None, None]
    assert failed.data["reason"] == "provider_error"
    assert "(401)" in failed.data["error"]
    assert "sent as api-key" in failed.data["error"], failed.data["error"]
    assert "[redacted]" in failed.data["error"]
    # the key is in no event of either run, nor in the record or the log
    events = [e.model_dump_json() for e in event_log.events if e.runid in (done.runid, refused.runid)]
    assert events
    assert not [e for e in events if SECRET in e]
    assert SECRET not in (record.error or "")
    assert logs
    assert SECRET not in repr(logs)
