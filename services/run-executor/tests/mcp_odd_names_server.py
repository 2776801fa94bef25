"""A real MCP server (the SDK's MCPServer, over stdio) whose tool names are not valid OpenAI function names.

``read.file`` (a dot), a 72-character name, and a plain ``ping``. ``ODD_EXTRA_TOOL`` in its environment adds a
tool of that name (a name that collides with another's model-facing name, for the collision test).
"""

from __future__ import annotations

import os
import warnings

from mcp import MCPDeprecationWarning
from mcp.server.mcpserver import MCPServer

warnings.simplefilter("ignore", MCPDeprecationWarning)
server = MCPServer("odd")
LONG = "summarize_the_whole_repository_history_" + "x" * 33  # 72 characters


def read_file(path: str) -> str:
    """Read a file (pretend)."""
    return f"contents of {path}"


def summarize() -> str:
    """Summarize (pretend)."""
    return "a long story"


def ping() -> str:
    """Ping."""
    return "pong"


if __name__ == "__main__":
    server.add_tool(read_file, name="read.file")
    server.add_tool(summarize, name=LONG)
    server.add_tool(ping)
    extra = os.environ.get("ODD_EXTRA_TOOL")
    if extra:
        server.add_tool(ping, name=extra)
    server.run()
