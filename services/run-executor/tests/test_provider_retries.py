"""Provider retries, permanent errors and the card's provider block: the OpenAI-compatible provider over
real HTTP against the endpoint emulator. Backoff waits go through an injected sleep and clock, so the
tests assert what was waited, never how long anything took."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from pydantic import ValidationError

from temporality_embedded.processes import free_port
from temporality_run_executor.agents import Limits, ProviderConfig
from temporality_run_executor.providers import OpenAICompatible, PermanentProviderError
from temporality_run_executor.providers.openai import parse_retry_after
from temporality_run_executor.records import Message, ToolCall, Usage
from temporality_testing.openai_emulator import (
    OpenAIEmulator,
    assistant_text,
    error_reply,
    hang,
    malformed_tool_call,
    rate_limited,
    usage,
)

HI = [Message(role="user", content="hi")]


class FakeClock:
    """A monotonic clock that only the provider's backoff sleeps move."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _provider(base_url: str, clock: FakeClock, **kw: float | int | str | None) -> OpenAICompatible:
    options: dict[str, object] = {"model": "m", "api_key": "sk-secret-key-123", "max_retries": 4}
    options.update(kw)
    return OpenAICompatible(base_url=base_url, sleep=clock.sleep, clock=clock, **options)  # type: ignore[arg-type]


async def test_retry_after_seconds_is_honoured(emulator: OpenAIEmulator, clock: FakeClock) -> None:
    emulator.replies += [rate_limited(retry_after="7"), assistant_text("ok")]
    provider = _provider(emulator.base_url, clock)
    try:
        turn = await provider.complete(HI, [])
    finally:
        await provider.aclose()
    assert turn.content == "ok"
    assert len(emulator.requests) == 2
    assert clock.sleeps == [7.0]


async def test_retry_after_http_date_is_honoured(emulator: OpenAIEmulator, clock: FakeClock) -> None:
    when = datetime.now(UTC) + timedelta(seconds=40)
    emulator.replies += [rate_limited(retry_after=format_datetime(when, usegmt=True)), assistant_text("ok")]
    provider = _provider(emulator.base_url, clock)
    try:
        assert (await provider.complete(HI, [])).content == "ok"
    finally:
        await provider.aclose()
    (waited,) = clock.sleeps
    assert 0 < waited <= 40  # the date's distance from now, whole seconds


def test_parse_retry_after() -> None:
    now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("3", now=now) == 3.0
    assert parse_retry_after("Tue, 01 Dec 2026 12:00:30 GMT", now=now) == 30.0
    assert parse_retry_after("Tue, 01 Dec 2026 11:00:00 GMT", now=now) == 0.0  # in the past: at once
    assert parse_retry_after("-5", now=now) == 0.0
    assert parse_retry_after("99999", now=now) == 600.0  # capped
    assert parse_retry_after("soon", now=now) is None
    assert parse_retry_after(None) is None


async def test_429_without_retry_after_and_5xx_back_off_exponentially(
    emulator: OpenAIEmulator, clock: FakeClock
) -> None:
    emulator.replies += [
        rate_limited(),
        error_reply(500, "internal error"),
        error_reply(503, "overloaded"),
        assistant_text("ok"),
    ]
    provider = _provider(emulator.base_url, clock, backoff_s=1.0, backoff_max_s=30.0)
    try:
        assert (await provider.complete(HI, [])).content == "ok"
    finally:
        await provider.aclose()
    assert len(emulator.requests) == 4
    assert len(clock.sleeps) == 3
    # 1, 2, 4 s, each plus up to 1 s of jitter
    for waited, base in zip(clock.sleeps, (1.0, 2.0, 4.0), strict=True):
        assert base <= waited <= base + 1.0


async def test_retries_are_bounded_by_max_retries(emulator: OpenAIEmulator, clock: FakeClock) -> None:
    emulator.replies += [error_reply(503, "overloaded, try later")] * 5
    provider = _provider(emulator.base_url, clock, max_retries=2, backoff_s=0.5)
    try:
        with pytest.raises(PermanentProviderError) as info:
            await provider.complete(HI, [])
    finally:
        await provider.aclose()
    assert len(emulator.requests) == 3
    assert len(clock.sleeps) == 2
    assert "503: overloaded, try later" in str(info.value)
    assert "gave up after 3 attempt(s)" in str(info.value)


async def test_retries_are_bounded_by_the_remaining_compute_budget(emulator: OpenAIEmulator, clock: FakeClock) -> None:
    emulator.replies += [rate_limited(retry_after="120"), assistant_text("never asked for")]
    provider = _provider(emulator.base_url, clock)
    try:
        with pytest.raises(PermanentProviderError, match="remaining compute budget") as info:
            await provider.complete(HI, [], budget_s=60.0)
    finally:
        await provider.aclose()
    assert len(emulator.requests) == 1
    assert clock.sleeps == []
    assert "429" in str(info.value)


async def test_a_hang_past_the_timeout_is_retried(emulator: OpenAIEmulator, clock: FakeClock) -> None:
    # the first answer comes only after 60 s: the client gives up at its timeout and asks again
    emulator.replies += [hang(60), assistant_text("ok")]
    provider = _provider(emulator.base_url, clock, timeout_s=1.0, backoff_s=0.0)
    try:
        assert (await provider.complete(HI, [])).content == "ok"
    finally:
        await provider.aclose()
    assert len(emulator.requests) == 2
    assert len(clock.sleeps) == 1


async def test_connection_errors_are_retried_then_reported(clock: FakeClock) -> None:
    provider = _provider(f"http://127.0.0.1:{free_port()}/v1", clock, max_retries=2, backoff_s=0.1)
    try:
        with pytest.raises(PermanentProviderError, match="ConnectError") as info:
            await provider.complete(HI, [])
    finally:
        await provider.aclose()
    assert len(clock.sleeps) == 2
    assert "gave up after 3 attempt(s)" in str(info.value)


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, "Invalid value for 'messages'."),
        (401, "Incorrect API key provided: sk-secret-key-123."),
        (404, "The model `no-such-model` does not exist."),
    ],
)
async def test_other_4xx_are_permanent_and_name_status_and_message(
    emulator: OpenAIEmulator, clock: FakeClock, status: int, message: str
) -> None:
    emulator.replies += [error_reply(status, message, kind="invalid_request_error"), assistant_text("never")]
    provider = _provider(emulator.base_url, clock)
    try:
        with pytest.raises(PermanentProviderError) as info:
            await provider.complete(HI, [])
    finally:
        await provider.aclose()
    text = str(info.value)
    assert len(emulator.requests) == 1
    assert clock.sleeps == []
    assert f"({status})" in text
    assert message.replace("sk-secret-key-123", "[redacted]") in text
    assert "sk-secret-key-123" not in text  # never the API key, even when the server echoes it
    assert emulator.authorizations == ["Bearer sk-secret-key-123"]


async def test_usage_and_malformed_tool_calls_are_read(emulator: OpenAIEmulator, clock: FakeClock) -> None:
    emulator.replies += [
        malformed_tool_call("call_1", "get_input", "{not json", usage=usage(12, 3)),
        assistant_text("ok"),
    ]
    provider = _provider(emulator.base_url, clock)
    try:
        turn = await provider.complete(HI, [])
        assert turn.usage == Usage(prompt_tokens=12, completion_tokens=3, total_tokens=15)
        assert turn.tool_calls == [ToolCall(id="call_1", name="get_input", invalid_arguments="{not json")]
        # sent back as the model wrote it, so the model sees its own mistake
        await provider.complete([*HI, Message(role="assistant", tool_calls=turn.tool_calls)], [])
    finally:
        await provider.aclose()
    assert emulator.requests[1]["messages"][1]["tool_calls"][0]["function"]["arguments"] == "{not json"
    assert (await _no_usage(emulator, clock)) is None


async def _no_usage(emulator: OpenAIEmulator, clock: FakeClock) -> Usage | None:
    emulator.replies.append(assistant_text("no usage block"))
    provider = _provider(emulator.base_url, clock)
    try:
        return (await provider.complete(HI, [])).usage
    finally:
        await provider.aclose()


@pytest.mark.parametrize(
    "bad",
    [
        {"max_retries": -1},
        {"max_retries": 21},
        {"timeout_s": 0},
        {"timeout_s": 601},
        {"retry_backoff_s": 5, "retry_backoff_max_s": 1},
        {"max_retries": "many"},
    ],
)
def test_the_provider_block_is_validated(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ProviderConfig.model_validate({"kind": "openai", "base_url": "http://x/v1", "model": "m", **bad})


def test_the_token_limit_is_validated() -> None:
    assert Limits().max_tokens is None
    assert Limits(max_tokens=1000).max_tokens == 1000
    for bad in (0, -5):
        with pytest.raises(ValidationError):
            Limits(max_tokens=bad)
    with pytest.raises(ValidationError):
        Limits(max_malformed_tool_calls=-1)
