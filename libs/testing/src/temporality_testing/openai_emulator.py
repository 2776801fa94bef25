"""A small OpenAI-compatible chat-completions endpoint over real HTTP, for testing the LLM provider.

The one seam that cannot run here (no model, no network) is faked at the wire: the provider under test
sends real HTTP requests to ``POST /v1/chat/completions``; the emulator records each request body and
answers with the next scripted reply (a status code and a JSON body in OpenAI's response shape).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from temporality_embedded.processes import free_port

__all__ = ["OpenAIEmulator", "Reply", "assistant_text", "assistant_tool_call"]


@dataclass
class Reply:
    status: int
    body: dict[str, Any]


def assistant_text(content: str) -> Reply:
    message = {"role": "assistant", "content": content}
    return Reply(200, {"id": "chatcmpl-emu", "object": "chat.completion", "choices": [_choice(message, "stop")]})


def assistant_tool_call(call_id: str, name: str, arguments: dict[str, Any], content: str | None = None) -> Reply:
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        ],
    }
    return Reply(200, {"id": "chatcmpl-emu", "object": "chat.completion", "choices": [_choice(message, "tool_calls")]})


def _choice(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {"index": 0, "message": message, "finish_reason": finish}


@dataclass
class OpenAIEmulator:
    replies: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def completions(request: Request) -> JSONResponse:
            self.requests.append(json.loads(await request.body()))
            if not self.replies:
                return JSONResponse({"error": {"message": "emulator has no scripted reply left"}}, status_code=500)
            reply = self.replies.pop(0)
            return JSONResponse(reply.body, status_code=reply.status)

        return app

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[OpenAIEmulator]:
        self.port = free_port()
        server = uvicorn.Server(uvicorn.Config(self.app(), host="127.0.0.1", port=self.port, log_config=None))
        task = asyncio.create_task(server.serve())
        try:
            async with asyncio.timeout(10):
                while not server.started:  # noqa: ASYNC110 - uvicorn exposes a flag, not an event
                    await asyncio.sleep(0.01)
            yield self
        finally:
            server.should_exit = True
            await task
