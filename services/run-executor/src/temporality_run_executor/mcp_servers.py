"""Tools from MCP servers, through the official ``mcp`` SDK (stdio transport), run in the card's sandbox.

When the executor starts (:func:`list_card_tools`, from ``setup``), every MCP server a card declares is
started once and asked for its tools; each becomes a registry :class:`~.tools.Tool` named
``<server>__<tool>`` (OpenAI function names allow no dots) with the server's description and input
schema, so the card's ``tools`` allow/deny policy, JSON-schema argument validation and ``tool.failed``
apply to it like to any tool. A server that cannot be started or listed stops the executor (exit 2,
naming the agent and the server): a card must not silently lose its tools.

Each call starts the server afresh (``StdioServerParameters``: the card's ``sandbox.working_dir`` as
its working directory; an environment of the SDK's safe defaults -- ``HOME``, ``LOGNAME``, ``PATH``,
``SHELL``, ``TERM``, ``USER`` -- plus the variables ``sandbox.env`` passes through and the server's own
``env``; with ``sandbox.network: false`` it runs under ``unshare -rn``: a user and network namespace
of its own, with no usable interface), initializes, calls the tool within the server's ``timeout_s``
and closes it. No MCP session outlives a call, so nothing is lost when the executor restarts or a run
parks, and a redelivered turn simply calls again (MCP tools must be idempotent per call, like every
tool). A call result with ``isError``, a server that does not start, or a timeout raises
:class:`McpToolFailed`: the engine publishes ``tool.failed`` and the model gets the error.

Not done yet: a long-lived session per server (each call pays the server's start-up), and elicitation
(``elicitation/create``) or ``input_required`` results becoming human requests.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from typing import Any

import structlog
from mcp import types as mcp_types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from temporality_run_executor.agents import AgentCard, McpServer, Sandbox
from temporality_run_executor.tools import Tool, ToolContext

__all__ = ["SEPARATOR", "McpClient", "McpToolFailed", "list_card_tools", "tool_name"]

log = structlog.get_logger(__name__)
#: Between the server's name and its tool's name: ``notes__read_note``.
SEPARATOR = "__"


class McpToolFailed(Exception):
    """The MCP server could not run the call (an ``isError`` result, no server, a timeout)."""


def tool_name(server: str, tool: str) -> str:
    return f"{server}{SEPARATOR}{tool}"


class McpClient:
    """Starts one declared server in a card's sandbox, one session per operation."""

    def __init__(self, server: McpServer, sandbox: Sandbox) -> None:
        self.server = server
        self.sandbox = sandbox

    def parameters(self) -> StdioServerParameters:
        env = {name: os.environ[name] for name in self.sandbox.env if name in os.environ} | self.server.env
        command, args = self.server.command, list(self.server.args)
        if not self.sandbox.network:
            unshare = shutil.which("unshare")
            if unshare is None:
                raise McpToolFailed("sandbox.network is false but `unshare` is not installed")
            command, args = unshare, ["--user", "--map-root-user", "--net", "--", command, *args]
        cwd = str(self.sandbox.working_dir) if self.sandbox.working_dir is not None else None
        return StdioServerParameters(command=command, args=args, env=env, cwd=cwd)

    async def _session(self, work: Any) -> Any:
        async with (
            stdio_client(self.parameters(), errlog=sys.stderr) as (read, write),  # its stderr: the executor's
            ClientSession(read, write, read_timeout_seconds=self.server.timeout_s) as session,
        ):
            await session.initialize()
            return await work(session)

    async def list_tools(self) -> list[mcp_types.Tool]:
        async def work(session: ClientSession) -> list[mcp_types.Tool]:
            tools: list[mcp_types.Tool] = []
            cursor: str | None = None
            while True:
                params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await session.list_tools(params=params)
                tools += page.tools
                cursor = page.next_cursor
                if not cursor:
                    return tools

        result: list[mcp_types.Tool] = await asyncio.wait_for(self._session(work), self.server.timeout_s)
        return result

    async def call(self, tool: str, arguments: dict[str, Any]) -> str:
        async def work(session: ClientSession) -> mcp_types.CallToolResult:
            return await session.call_tool(tool, arguments)

        try:
            result: mcp_types.CallToolResult = await asyncio.wait_for(self._session(work), self.server.timeout_s)
        except TimeoutError:
            raise McpToolFailed(f"{self.server.name}: {tool} took longer than {self.server.timeout_s:g}s") from None
        except (OSError, McpToolFailed) as exc:
            raise McpToolFailed(f"{self.server.name}: could not run {tool}: {exc}") from exc
        text = _text(result)
        if result.is_error:
            raise McpToolFailed(f"{self.server.name}: {tool}: {text}")
        return text


def _text(result: mcp_types.CallToolResult) -> str:
    """A call result as the model gets it: its structured content as JSON when it has some, else its text
    blocks (other blocks named, not inlined)."""
    if result.structured_content is not None and not result.is_error:
        return json.dumps(result.structured_content, sort_keys=True)
    parts = [
        block.text if isinstance(block, mcp_types.TextContent) else f"[{type(block).__name__} omitted]"
        for block in result.content
    ]
    return "\n".join(parts)


def _tool(client: McpClient, listed: mcp_types.Tool) -> Tool:
    async def run(arguments: dict[str, Any], ctx: ToolContext) -> str:
        log.info("mcp.call", server=client.server.name, tool=listed.name, turn=ctx.turn)
        return await client.call(listed.name, arguments)

    return Tool(
        name=tool_name(client.server.name, listed.name),
        description=listed.description or listed.title or listed.name,
        parameters=listed.input_schema or {"type": "object"},
        implementation=run,
    )


async def list_card_tools(card: AgentCard) -> list[Tool]:
    """The tools of every MCP server ``card`` declares (each server started once, in the card's sandbox)."""
    tools: list[Tool] = []
    for server in card.mcp_servers:
        client = McpClient(server, card.sandbox)
        try:
            listed = await client.list_tools()
        except Exception as exc:  # whatever it is, the card cannot get its tools: say which and why
            raise McpToolFailed(
                f"agent {card.id}: mcp_servers {server.name}: could not list its tools: {type(exc).__name__}: {exc}"
            ) from exc
        log.info("mcp.listed", agent=card.id, server=server.name, tools=[t.name for t in listed])
        tools += [_tool(client, t) for t in listed]
    return tools
