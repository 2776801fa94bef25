"""A small OpenAI-compatible chat-completions endpoint over real HTTP, for testing the LLM provider.

The one seam that cannot run here (no model, no network) is faked at the wire: the provider under test
sends real HTTP requests to ``POST /v1/chat/completions``; the emulator records each request body and
answers with the next scripted reply (a status code and a JSON body in OpenAI's response shape).

Scripted failures for the provider's retries and error handling: :func:`error_reply` (a 4xx/5xx with
OpenAI's error body, optionally ``Retry-After``), :func:`rate_limited` (429), :func:`hang` (answer only
after a delay, past the client's timeout), ``usage=`` on the success helpers (a ``usage`` block), and
:func:`malformed_tool_call` (tool-call arguments that are not JSON).

Like the real API, a request offering a tool whose ``function.name`` is not ``^[a-zA-Z0-9_-]+$`` or is longer
than 64 characters is answered 400 ``invalid_request_error`` naming the parameter (``tools[<i>].function.name``),
without taking a scripted reply (:func:`tool_name_problem`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from temporality_embedded.processes import free_port
from temporality_testing.asgi import served_asgi

__all__ = [
    "OpenAIEmulator",
    "Reply",
    "assistant_text",
    "assistant_tool_call",
    "error_reply",
    "hang",
    "malformed_tool_call",
    "rate_limited",
    "tool_name_problem",
    "usage",
]

#: What OpenAI accepts as a function name (``tools[].function.name``), and how long it may be.
TOOL_NAME_PATTERN = "^[a-zA-Z0-9_-]+$"
TOOL_NAME_MAX = 64


@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    #: Seconds to wait before answering (cut short when the emulator stops): a hang past a client timeout.
    delay_s: float = 0.0


def usage(prompt: int, completion: int) -> dict[str, int]:
    """An OpenAI ``usage`` block."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _completion(message: dict[str, Any], finish: str, usage: dict[str, int] | None) -> Reply:
    body: dict[str, Any] = {"id": "chatcmpl-emu", "object": "chat.completion", "choices": [_choice(message, finish)]}
    if usage is not None:
        body["usage"] = usage
    return Reply(200, body)


def assistant_text(content: str | None, *, usage: dict[str, int] | None = None, finish: str = "stop") -> Reply:
    """A text reply; ``finish="length"``: cut off at the output length limit (``content`` partial, or ``None``)."""
    return _completion({"role": "assistant", "content": content}, finish, usage)


def assistant_tool_call(
    call_id: str,
    name: str,
    arguments: dict[str, Any],
    content: str | None = None,
    *,
    usage: dict[str, int] | None = None,
    finish: str = "tool_calls",
) -> Reply:
    return malformed_tool_call(call_id, name, json.dumps(arguments), content, usage=usage, finish=finish)


def malformed_tool_call(
    call_id: str,
    name: str,
    raw_arguments: str,
    content: str | None = None,
    *,
    usage: dict[str, int] | None = None,
    finish: str = "tool_calls",
) -> Reply:
    """A tool call whose ``arguments`` text is sent as given (e.g. not JSON at all; cut off: ``finish="length"``)."""
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": raw_arguments}}],
    }
    return _completion(message, finish, usage)


def error_reply(status: int, message: str, *, retry_after: str | None = None, kind: str = "server_error") -> Reply:
    """An error in OpenAI's shape, ``{"error": {"message", "type", "code"}}``, optionally with ``Retry-After``."""
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return Reply(status, {"error": {"message": message, "type": kind, "code": None}}, headers)


def rate_limited(retry_after: str | None = None) -> Reply:
    return error_reply(429, "Rate limit reached; try again later.", retry_after=retry_after, kind="rate_limit")


def hang(seconds: float, then: Reply | None = None) -> Reply:
    """Answer ``then`` (by default a text reply) only after ``seconds``."""
    reply = then or assistant_text("too late")
    return Reply(reply.status, reply.body, reply.headers, delay_s=seconds)


def tool_name_problem(body: dict[str, Any]) -> Reply | None:
    """The 400 the real API answers a request offering a tool with an invalid name (its wording and shape), or
    ``None`` when every offered tool's name is valid."""
    tools = body.get("tools")
    for index, tool in enumerate(tools if isinstance(tools, list) else []):
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        param = f"tools[{index}].function.name"
        if not isinstance(name, str):
            message, code = f"Missing required parameter: '{param}'.", "missing_required_parameter"
        elif len(name) > TOOL_NAME_MAX:
            message = (
                f"Invalid '{param}': string too long. Expected a string with maximum length {TOOL_NAME_MAX}, "
                f"but got a string with length {len(name)} instead."
            )
            code = "string_above_max_length"
        elif re.fullmatch(TOOL_NAME_PATTERN, name) is None:
            message = (
                f"Invalid '{param}': string does not match pattern. Expected a string that matches the pattern "
                f"'{TOOL_NAME_PATTERN}'."
            )
            code = "invalid_value"
        else:
            continue
        error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
        return Reply(400, {"error": error})
    return None


def _choice(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {"index": 0, "message": message, "finish_reason": finish}


@dataclass
class OpenAIEmulator:
    replies: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    #: The ``Authorization`` header of each request, in order.
    authorizations: list[str | None] = field(default_factory=list)
    #: The ``traceparent`` header of each request (W3C Trace Context), in order.
    traceparents: list[str | None] = field(default_factory=list)
    #: The ``api-key`` header of each request, in order (Azure OpenAI's classic API key).
    api_keys: list[str | None] = field(default_factory=list)
    #: The query parameters of each request, in order (Azure OpenAI's ``api-version``).
    queries: list[dict[str, str]] = field(default_factory=list)
    #: The path of each request, in order (``/v1/chat/completions``, or an Azure OpenAI classic deployment's
    #: ``/openai/deployments/<name>/chat/completions``, which the emulator serves as well).
    paths: list[str] = field(default_factory=list)
    port: int = 0
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def azure_deployment_url(self, deployment: str, api_version: str = "2024-10-21") -> str:
        """An Azure OpenAI classic deployment URL on the emulator (``.../openai/deployments/<name>?api-version=``)."""
        return f"http://127.0.0.1:{self.port}/openai/deployments/{deployment}?api-version={api_version}"

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        @app.post("/openai/deployments/{deployment}/chat/completions")
        async def completions(request: Request) -> JSONResponse:
            body = json.loads(await request.body())
            self.requests.append(body)
            self.authorizations.append(request.headers.get("authorization"))
            self.api_keys.append(request.headers.get("api-key"))
            self.paths.append(request.url.path)
            self.traceparents.append(request.headers.get("traceparent"))
            self.queries.append(dict(request.query_params))
            refused = tool_name_problem(body) if isinstance(body, dict) else None
            if refused is not None:  # the real API refuses it before any model runs: no scripted reply is used
                return JSONResponse(refused.body, status_code=refused.status)
            if not self.replies:
                return JSONResponse({"error": {"message": "emulator has no scripted reply left"}}, status_code=500)
            reply = self.replies.pop(0)
            if reply.delay_s:
                try:
                    async with asyncio.timeout(reply.delay_s):
                        await self._stopping.wait()
                except TimeoutError:
                    pass
            return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)

        return app

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[OpenAIEmulator]:
        self.port = free_port()
        self._stopping = asyncio.Event()
        stopping = self._stopping

        async def wake() -> None:
            stopping.set()

        async with served_asgi(self.app(), self.port, before_stop=wake):
            yield self
