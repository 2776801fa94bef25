"""An OpenAI-compatible chat-completions provider with tool calling.

Works with OpenAI, Azure OpenAI (deployment URL as ``base_url``), vLLM, Ollama and llama.cpp's server:
anything that speaks ``POST {base_url}/chat/completions`` with ``tools``. A query in ``base_url`` is kept as
the request's query (Azure OpenAI's ``...?api-version=2024-10-21``: ``POST <path>/chat/completions?api-version=...``).
The key goes as ``Authorization: Bearer <key>``, or (``api_key_header="api-key"``, Azure OpenAI's classic API) in
an ``api-key`` header instead.

Retries (``tenacity``): a 408, a 429, a 5xx, a connection error, a timeout or a malformed reply is tried
again, up to ``max_retries`` times, waiting what ``Retry-After`` asks (seconds or an HTTP date) or else an
exponential backoff with jitter; a retry that would wait past the run's remaining compute budget is not
made. Any other 4xx (400, 401, 404, ...) is permanent at once. Either way the error names the HTTP status
and the server's error message, never the API key; a 401 or 403 says which variable holds the key
(``api_key_env``), and a connection error or a timeout names the endpoint (:func:`endpoint`: the base URL
without user info or query, where a key might sit).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal

import httpx
import structlog
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from pydantic import ValidationError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential_jitter

from temporality_bus import tracing
from temporality_run_executor.providers.base import (
    AssistantTurn,
    BudgetSpent,
    PermanentProviderError,
    Provider,
    ProviderError,
    ToolSpec,
    TurnContext,
)
from temporality_run_executor.records import Message, ToolCall, Usage

__all__ = ["OpenAICompatible", "RetryableProviderError", "endpoint", "parse_retry_after"]

log = structlog.get_logger(__name__)
Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]
#: Where the API key goes: ``authorization`` (``Authorization: Bearer <key>``) or ``api-key`` (Azure OpenAI classic).
ApiKeyHeader = Literal["authorization", "api-key"]
#: The longest ``Retry-After`` honoured; a longer one is capped (and then bounded by the budget).
MAX_RETRY_AFTER_S = 600.0


class RetryableProviderError(ProviderError):
    """One attempt failed in a way another attempt may not: 408, 429, 5xx, network, timeout, bad body."""

    def __init__(self, message: str, *, retry_after_s: float | None = None, budget_bound: bool = False) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        #: A timeout that was the run's remaining compute budget (shorter than the card's ``timeout_s``).
        self.budget_bound = budget_bound


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """``Retry-After`` as seconds to wait: delta-seconds or an HTTP date; ``None`` when absent or unreadable."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def endpoint(base_url: str) -> str:
    """``base_url`` as errors and logs show it: scheme, host, port and path; never user info or a query (an
    ``api-key=...`` there would be the key)."""
    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError):
        return "(unreadable base_url)"
    return str(url.copy_with(userinfo=b"", query=None, fragment=None)).rstrip("/")


class OpenAICompatible(Provider):
    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None,
        api_key_env: str | None = None,
        api_key_header: ApiKeyHeader = "authorization",
        timeout_s: float = 60.0,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
    ) -> None:
        # the key as ``Authorization: Bearer <key>`` (OpenAI, Azure's v1 API), or alone in ``api-key`` (Azure
        # OpenAI's classic deployment URLs), never both
        headers = (
            ({"api-key": api_key} if api_key_header == "api-key" else {"Authorization": f"Bearer {api_key}"})
            if api_key
            else {}
        )
        url = httpx.URL(base_url)
        # the base's query goes on every request (httpx would put ``/chat/completions`` after it)
        self._client = httpx.AsyncClient(
            base_url=str(url.copy_with(query=None, fragment=None)).rstrip("/"),
            params=url.params,
            timeout=timeout_s,
            headers=headers,
        )
        self._model = model
        self._api_key = api_key
        #: The variable the key came from (the card's ``api_key_env``), named when the endpoint refuses the key.
        self._api_key_env = api_key_env
        self._api_key_header = api_key_header
        self._endpoint = endpoint(base_url)
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._backoff = wait_exponential_jitter(multiplier=backoff_s, max=backoff_max_s, jitter=backoff_s)
        self._sleep = sleep
        self._clock = clock

    async def complete(
        self,
        messages: list[Message],
        tools: list[ToolSpec],
        *,
        budget_s: float | None = None,
        context: TurnContext | None = None,
    ) -> AssistantTurn:
        body: dict[str, Any] = {"model": self._model, "messages": [_wire(m) for m in messages]}
        sampling = context.sampling if context is not None else None
        if sampling is not None:  # an MCP tool's sampling request: the server's own bounds
            body["model"] = sampling.model or self._model
            body["max_tokens"] = sampling.max_tokens
            if sampling.temperature is not None:
                body["temperature"] = sampling.temperature
            if sampling.stop:
                body["stop"] = sampling.stop
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
            body["tool_choice"] = "auto"
        started = self._clock()
        deadline = started + budget_s if budget_s is not None else None
        over_budget: list[float] = []
        attempts = 0

        def wait(state: RetryCallState) -> float:
            error = state.outcome.exception() if state.outcome is not None else None
            if isinstance(error, RetryableProviderError) and error.retry_after_s is not None:
                return error.retry_after_s
            return float(self._backoff(state))

        def stop(state: RetryCallState) -> bool:
            if state.attempt_number > self._max_retries:
                return True
            if deadline is not None and self._clock() + state.upcoming_sleep >= deadline:
                over_budget.append(state.upcoming_sleep)
                return True
            return False

        def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            log.warning(
                "provider.retrying",
                attempt=state.attempt_number,
                max_retries=self._max_retries,
                wait_s=round(state.upcoming_sleep, 3),
                error=self._redact(str(error)),
            )

        retrying = AsyncRetrying(
            stop=stop,
            wait=wait,
            retry=retry_if_exception(lambda exc: isinstance(exc, RetryableProviderError)),
            sleep=self._sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    remaining = None if deadline is None else deadline - self._clock()
                    return _identified(await self._attempt(body, remaining), context)
        except RetryableProviderError as exc:
            failure: PermanentProviderError
            if exc.budget_bound:
                failure = BudgetSpent(
                    f"the run's compute budget ran out in the provider call ({budget_s:.1f}s of it were left at "
                    f"the turn's start): {exc}, after {attempts} attempt(s)"
                )
            elif over_budget:
                failure = BudgetSpent(
                    f"{exc}; not retried: waiting {over_budget[-1]:.1f}s more would pass the run's remaining "
                    f"compute budget ({budget_s:.1f}s at the turn's start) after {attempts} attempt(s)"
                )
            else:
                failure = PermanentProviderError(f"{exc}; gave up after {attempts} attempt(s)")
            log.error("provider.failed", endpoint=self._endpoint, model=body["model"], error=self._redact(str(failure)))
            raise failure from exc
        except PermanentProviderError as exc:
            log.error("provider.failed", endpoint=self._endpoint, model=body["model"], error=self._redact(str(exc)))
            raise
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    async def _attempt(self, body: dict[str, Any], remaining_s: float | None) -> AssistantTurn:
        """One request; with tracing on, in a CLIENT span ``chat <model>`` (GenAI conventions) whose context the
        request carries (``traceparent``), one per attempt: a retried call shows each try."""
        if not tracing.enabled():
            return await self._exchange(body, remaining_s)
        model = str(body["model"])
        attributes: dict[str, str | int | float] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": model,
            "server.address": self._client.base_url.host,
        }
        for key, name in (("max_tokens", "max_tokens"), ("temperature", "temperature")):
            if key in body:
                attributes[f"gen_ai.request.{name}"] = body[key]
        with tracing.tracer().start_as_current_span(f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes):
            turn = await self._exchange(body, remaining_s)
            if turn.usage is not None:
                span = trace.get_current_span()
                span.set_attribute("gen_ai.usage.input_tokens", turn.usage.prompt_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", turn.usage.completion_tokens)
            return turn

    async def _exchange(self, body: dict[str, Any], remaining_s: float | None) -> AssistantTurn:
        timeout = self._timeout_s if remaining_s is None else max(0.001, min(self._timeout_s, remaining_s))
        headers = dict(zip(("traceparent", "tracestate"), tracing.current_trace() or (), strict=False))
        try:
            response = await self._client.post(
                "/chat/completions", json=body, timeout=timeout, headers={k: v for k, v in headers.items() if v}
            )
        except httpx.TimeoutException as exc:
            raise RetryableProviderError(
                f"chat completion at {self._endpoint} timed out after {timeout:.1f}s ({type(exc).__name__})",
                budget_bound=timeout < self._timeout_s,  # the budget left, not the card's timeout_s, ran out
            ) from exc
        except httpx.HTTPError as exc:
            raise RetryableProviderError(
                f"chat completion request to {self._endpoint} failed: {type(exc).__name__}: {self._redact(str(exc))}"
            ) from exc
        status = response.status_code
        trace.get_current_span().set_attribute("http.response.status_code", status)  # no-op outside a span
        if status in (408, 429) or status >= 500:
            raise RetryableProviderError(
                f"chat completion endpoint answered {status}: {self._server_message(response)}",
                retry_after_s=parse_retry_after(response.headers.get("retry-after")),
            )
        if status >= 400:
            refused = f"chat completion refused ({status}): {self._server_message(response)}"
            if status in (401, 403):
                refused += f" -- {self._key_hint()}"
            raise PermanentProviderError(refused)
        try:  # an unreadable reply -- not JSON, no message, a content that is no text, tool_calls that are no
            # list -- is the provider's failure (retried, then provider_error), never taken apart as it is
            reply = response.json()
            choice = reply["choices"][0]
            message = choice["message"]
            if not isinstance(message, dict):
                raise TypeError("message is not an object")
            content, raw_calls = message.get("content"), message.get("tool_calls")
            if content is not None and not isinstance(content, str):
                raise TypeError(f"message.content is a {type(content).__name__}, not a string")
            if raw_calls is not None and not isinstance(raw_calls, list):
                raise TypeError(f"message.tool_calls is a {type(raw_calls).__name__}, not a list")
            finish, matched = choice.get("finish_reason"), choice.get("stop_reason")
            turn = AssistantTurn(
                content=content,
                tool_calls=[_tool_call(raw) for raw in raw_calls or []],
                usage=_usage(reply),
                finish_reason=finish if isinstance(finish, str) else None,
                stop_sequence=matched if isinstance(matched, str) else None,  # vLLM: the stop string that matched
            )
        except (ValueError, KeyError, IndexError, TypeError, RecursionError, AttributeError) as exc:
            why = f" ({exc})" if isinstance(exc, TypeError | ValidationError) else ""
            raise RetryableProviderError(
                f"malformed chat completion{why}: {self._redact(response.text[:500])}"
            ) from exc
        return turn

    def _server_message(self, response: httpx.Response) -> str:
        """The endpoint's own explanation (OpenAI's ``{"error": {"message": ...}}``, else the body)."""
        text = response.text
        try:
            error = response.json().get("error")
        except (ValueError, AttributeError, RecursionError):
            error = None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = error["message"]
        elif isinstance(error, str):
            text = error
        return self._redact(text[:500]) or response.reason_phrase

    def _key_hint(self) -> str:
        """What to check when ``endpoint`` refuses the key (401/403): the variable named by ``api_key_env``."""
        if self._api_key_env is None:
            return f"no API key was sent (the card sets no provider.api_key_env); {self._endpoint} may need one"
        return (
            f"check the API key in the variable {self._api_key_env} (provider.api_key_env"
            f"{', sent as api-key' if self._api_key_header == 'api-key' else ''}): "
            f"{self._endpoint} does not accept it"
        )

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "[redacted]") if self._api_key else text

    async def aclose(self) -> None:
        await self._client.aclose()


def _tool_call(raw: Any) -> ToolCall:
    raw = raw if isinstance(raw, dict) else {}
    function = raw.get("function") if isinstance(raw.get("function"), dict) else {}
    call_id = raw.get("id") if isinstance(raw.get("id"), str) else ""  # none: given one by _identified
    named = function.get("name")
    name = named if isinstance(named, str) else ""  # none: the run machine refuses the call, saying so
    text = function.get("arguments")
    if isinstance(text, dict):  # some servers send the object itself
        return ToolCall(id=call_id, name=name, arguments=text)
    if text is None or (isinstance(text, str) and text.strip() in ("", "null")):
        return ToolCall(id=call_id, name=name, arguments={})  # none for a tool without parameters
    text = text if isinstance(text, str) else json.dumps(text)
    try:
        arguments = json.loads(text)
    except (json.JSONDecodeError, RecursionError):  # not JSON, or nested past the parser's depth
        arguments = None
    if not isinstance(arguments, dict):
        return ToolCall(id=call_id, name=name, invalid_arguments=text)
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _identified(turn: AssistantTurn, context: TurnContext | None) -> AssistantTurn:
    """``turn`` with an id on every tool call: a call the endpoint sent without one (or with an empty one, or the
    id of an earlier call of the same reply) gets ``call-<turn>-<index>`` -- its place in the run, the same whenever
    this reply is carried out -- so its tool result answers it alone (the next request's ``tool_call_id``)."""
    calls = turn.tool_calls
    ids = [call.id for call in calls]
    if all(ids) and len(set(ids)) == len(ids):
        return turn
    number = context.turn if context is not None else 0
    taken = set(ids)
    seen: set[str] = set()
    fixed: list[ToolCall] = []
    for index, call in enumerate(calls):
        if call.id and call.id not in seen:
            seen.add(call.id)
            fixed.append(call)
            continue
        given = f"call-{number}-{index}"
        while given in taken:  # (the model's own ids might look alike)
            given += "x"
        taken.add(given)
        seen.add(given)
        log.warning("provider.tool_call_id_given", index=index, sent=call.id or None, given=given)
        fixed.append(
            ToolCall(id=given, name=call.name, arguments=call.arguments, invalid_arguments=call.invalid_arguments)
        )
    return turn.model_copy(update={"tool_calls": fixed})


def _usage(reply: dict[str, Any]) -> Usage | None:
    raw = reply.get("usage")
    if not isinstance(raw, dict):
        return None
    counts = {k: raw.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    clean = {k: v if isinstance(v, int) and v >= 0 else 0 for k, v in counts.items()}
    if not clean["total_tokens"]:
        clean["total_tokens"] = clean["prompt_tokens"] + clean["completion_tokens"]
    return Usage(**clean)


def _wire(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.name,
                    "arguments": c.invalid_arguments if c.invalid_arguments is not None else json.dumps(c.arguments),
                },
            }
            for c in message.tool_calls
        ]
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
        out["name"] = message.name
    return out
