"""A real MCP server for the tests, written with the official SDK's MCPServer (mcp 2's FastMCP), over stdio.

Run as ``python mcp_notes_server.py``: ``read_note`` reads a file from its working directory,
``whoami`` reports its working directory and two environment variables, ``boom`` always fails,
``can_connect`` tries a TCP connection (the sandbox's network switch).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes")


@server.tool()
def read_note(name: str) -> str:
    """Read a note (a file in the working directory)."""
    return Path(name).read_text(encoding="utf-8")


@server.tool()
def whoami() -> dict[str, str | None]:
    """Where the server runs and what it was given."""
    return {"cwd": os.getcwd(), "secret": os.environ.get("NOTES_SECRET"), "other": os.environ.get("NOTES_OTHER")}


@server.tool()
def boom() -> str:
    """Always fails."""
    raise RuntimeError("the notes disk is gone")


@server.tool()
def can_connect(port: int) -> dict[str, object]:
    """Try a TCP connection to 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return {"ok": True}
    except OSError as exc:
        return {"ok": False, "error": str(exc)}


if __name__ == "__main__":
    server.run()
