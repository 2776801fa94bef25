"""A real MCP server for the tests, written with the official SDK's MCPServer (mcp 2's FastMCP), over stdio.

Run as ``python mcp_notes_server.py``: ``read_note`` reads a file from its working directory,
``whoami`` reports its working directory and two environment variables, ``boom`` always fails,
``can_connect`` tries a TCP connection (the sandbox's network switch).

With ``--session-tools``, for the session tests (``test_mcp_sessions.py``), also: ``stats`` reports its pid
and how many calls it has served (one process per session), ``rendezvous`` waits (bounded) until ``n``
calls are in flight at once, ``die`` exits the process mid-call, ``ask`` asks the user for input
(``elicitation/create``), ``add_extra`` adds a tool (``notifications/tools/list_changed``).

With ``--elicit-tools``, for the elicitation tests (``test_mcp_elicitation.py``), also: ``delete_note`` asks
to confirm (a yes/no form) before it deletes, ``book`` asks for a small form (a day from a list, hours 1..8),
``connect`` asks the user to sign in at a link (URL mode), ``sync`` refuses the call with
``URLElicitationRequiredError`` until the user signed in (a file in its working directory) and then sends
``notifications/elicitation/complete``, ``purge`` asks to confirm through a resolver (``Resolve(Elicit)``: on an MCP 2026-07-28 session an
``input_required`` result, on an older one ``elicitation/create``).

With ``--client-tools``, for the tests of what the client offers a server (``test_mcp_client_requests.py``),
also: ``traced`` reports the ``traceparent``/``tracestate`` its request's ``_meta`` carried, ``keyed`` the
idempotency key it carried and how often it was sent that key, ``roots`` asks the
client for its roots, ``summarize`` asks the client's model for a completion (sampling), ``summarize_many``
asks ``n`` times and reports each answer or error, ``draft`` asks with a ``maxTokens``, a temperature, stop
sequences and model hints -- ``roots``, ``summarize`` and ``draft`` through resolvers, so on an MCP 2026-07-28
session as ``input_required`` results, on an older one as requests to the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import warnings
from pathlib import Path
from typing import Annotated

from mcp import MCPDeprecationWarning, MCPError
from mcp.server.elicitation import AcceptedElicitation
from mcp.server.mcpserver import Context, Elicit, ElicitationResult, ListRoots, MCPServer, Resolve, Sample
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp.types import (
    CreateMessageResult,
    ElicitRequestURLParams,
    ListRootsResult,
    ModelHint,
    ModelPreferences,
    SamplingMessage,
    TextContent,
)
from pydantic import BaseModel, Field

warnings.simplefilter("ignore", MCPDeprecationWarning)  # sampling and roots: deprecated at 2026-07-28, still served
server = MCPServer("notes")
_calls = 0
_in_flight = 0
_max_in_flight = 0
_rounds = 0
_changed = asyncio.Condition()


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


def stats() -> dict[str, int]:
    """This process's id, the calls it served before this one, and the most it has had in flight at once."""
    global _calls
    _calls += 1
    return {"pid": os.getpid(), "calls": _calls - 1, "max_in_flight": _max_in_flight}


async def rendezvous(n: int, wait_s: float) -> dict[str, object]:
    """Wait up to wait_s seconds until n calls of this tool are in flight at once."""
    global _in_flight, _max_in_flight, _rounds
    async with _changed:
        mine = _rounds
        _in_flight += 1
        _max_in_flight = max(_max_in_flight, _in_flight)
        if _in_flight >= n:
            _rounds += 1  # every call waiting in this round has met
            _changed.notify_all()
        try:
            met = await asyncio.wait_for(_changed.wait_for(lambda: _rounds > mine), wait_s)
        except TimeoutError:
            met = False
        finally:
            _in_flight -= 1
    return {"met": bool(met), "pid": os.getpid()}


def die() -> str:
    """Exit the process in the middle of the call."""
    os._exit(9)


async def add_extra(ctx: Context) -> str:
    """Add the tool ``extra`` and tell the client its tool list changed."""
    server.add_tool(lambda: "extra", name="extra", description="Added at run time.")
    await ctx.session.send_tool_list_changed()
    return "added"


class _Choice(BaseModel):
    keep: bool


async def ask(ctx: Context) -> str:
    """Ask the user (elicitation) whether to keep the note."""
    answer = await ctx.elicit("Keep the note?", _Choice)
    return f"answered: {answer.action}"


class _Confirm(BaseModel):
    confirm: bool = Field(description="Delete it for good?")


async def delete_note(name: str, ctx: Context) -> str:
    """Delete a note, after the user confirmed it."""
    answer = await ctx.elicit(f"Delete the note {name}?", _Confirm)
    if answer.action != "accept":
        return f"not deleted: {answer.action}"
    if not answer.data.confirm:
        return "kept"
    with contextlib.suppress(FileNotFoundError):  # idempotent: a replayed call may delete it again
        os.unlink(name)
    return f"deleted {name}"


class _Booking(BaseModel):
    day: str = Field(json_schema_extra={"enum": ["monday", "tuesday"]}, description="Which day")
    hours: int = Field(ge=1, le=8, description="How long")


async def book(room: str, ctx: Context) -> str:
    """Book a room, asking the user for the day and hours."""
    answer = await ctx.elicit(f"When should {room} be booked?", _Booking)
    if answer.action != "accept":
        return f"not booked: {answer.action}"
    return f"booked {room} on {answer.data.day} for {answer.data.hours}h"


async def connect(service: str, ctx: Context) -> str:
    """Connect a service, after the user signed in there (a URL-mode elicitation: the link, not a form)."""
    answer = await ctx.elicit_url(
        f"Sign in to {service} to connect it.", f"https://auth.example.test/{service}/login?state=s1", "el-1"
    )
    return f"connected {service}" if answer.action == "accept" else f"not connected: {answer.action}"


_watchers: dict[str, asyncio.Task[None]] = {}


def _signed_in(service: str, *, count: bool = False) -> bool:
    """Whether the user signed in to ``service`` (the file ``signed-in-<service>`` in the working directory);
    ``count``: one more call in ``sync-attempts-<service>``."""
    if count:
        attempts = Path(f"sync-attempts-{service}")
        attempts.write_text(str(int(attempts.read_text()) + 1 if attempts.exists() else 1), encoding="utf-8")
    return Path(f"signed-in-{service}").exists()


async def _notify_when_signed_in(service: str, elicitation_id: str, ctx: Context) -> None:
    """The out-of-band sign-in's end, as a real server learns it from its own backend (here the file appearing,
    polled, bounded); then ``notifications/elicitation/complete`` on the session."""
    session = ctx.session
    for _ in range(2400):  # 120 s
        if _signed_in(service):
            await session.send_elicit_complete(elicitation_id)
            return
        await asyncio.sleep(0.05)


async def sync(service: str, ctx: Context) -> str:
    """Sync a service's files; the user must sign in there first: until they did (the file ``signed-in-<service>``
    in the working directory), the call is refused with ``URLElicitationRequiredError`` (-32042). Each call is
    counted in ``sync-attempts-<service>``."""
    if _signed_in(service, count=True):
        return f"synced {service}"
    elicitation_id = f"sign-in-{service}"
    if elicitation_id not in _watchers:
        _watchers[elicitation_id] = asyncio.create_task(_notify_when_signed_in(service, elicitation_id, ctx))
    url = f"https://auth.example.test/{service}/login?state=s2"
    message = f"Sign in to {service} to sync it."
    raise UrlElicitationRequiredError([ElicitRequestURLParams(message=message, url=url, elicitation_id=elicitation_id)])


def _ask_purge(name: str) -> Elicit[_Confirm]:
    return Elicit(f"Purge the note {name}?", _Confirm)


async def purge(name: str, answer: Annotated[ElicitationResult[_Confirm], Resolve(_ask_purge)]) -> str:
    """Purge a note, after the user confirmed it (asked through a resolver)."""
    if not isinstance(answer, AcceptedElicitation):
        return f"not purged: {answer.action}"
    return f"purged {name}" if answer.data.confirm else "kept"


def traced(ctx: Context) -> dict[str, object]:
    """The trace context this request's ``_meta`` carried."""
    meta = ctx.request_context.meta or {}
    return {"traceparent": meta.get("traceparent"), "tracestate": meta.get("tracestate")}


_keys: dict[str, int] = {}


def keyed(ctx: Context) -> dict[str, object]:
    """The idempotency key this request's ``_meta`` carried, and how often this process has been sent it."""
    meta = ctx.request_context.meta or {}
    key = meta.get("temporality/idempotency-key")
    if isinstance(key, str):
        _keys[key] = _keys.get(key, 0) + 1
    return {"key": key, "seen": _keys.get(key, 0) if isinstance(key, str) else 0}


def _ask_roots() -> ListRoots:
    return ListRoots()


async def roots(listed: Annotated[ListRootsResult, Resolve(_ask_roots)]) -> dict[str, object]:
    """The client's roots."""
    return {"roots": [{"uri": str(root.uri), "name": root.name} for root in listed.roots]}


def _ask_summary(text: str) -> Sample:
    message = SamplingMessage(role="user", content=TextContent(type="text", text=f"Summarize: {text}"))
    return Sample([message], max_tokens=64, system_prompt="You write one-line summaries.")


async def summarize(text: str, summary: Annotated[CreateMessageResult, Resolve(_ask_summary)]) -> str:
    """A one-line summary of ``text``, written by the client's model."""
    content = summary.content
    return f"summary ({summary.model}): {content.text if isinstance(content, TextContent) else content.type}"


def _ask_draft(text: str, max_tokens: int, temperature: float, stop: list[str], hints: list[str]) -> Sample:
    message = SamplingMessage(role="user", content=TextContent(type="text", text=f"Draft: {text}"))
    preferences = ModelPreferences(hints=[ModelHint(name=h) for h in hints], intelligence_priority=0.9)
    return Sample(
        [message], max_tokens=max_tokens, temperature=temperature, stop_sequences=stop, model_preferences=preferences
    )


async def draft(
    text: str,
    max_tokens: int,
    temperature: float,
    stop: list[str],
    hints: list[str],
    answer: Annotated[CreateMessageResult, Resolve(_ask_draft)],
) -> str:
    """A draft of ``text`` by the client's model, asked with these bounds and model hints."""
    content = answer.content
    drafted = content.text if isinstance(content, TextContent) else content.type
    return f"draft ({answer.model}, {answer.stop_reason}): {drafted}"


async def summarize_many(text: str, n: int, ctx: Context) -> dict[str, list[str]]:
    """Ask the client's model ``n`` times (each answer, or the error the client sent)."""
    answers: list[str] = []
    for i in range(n):
        message = SamplingMessage(role="user", content=TextContent(type="text", text=f"Summarize #{i}: {text}"))
        try:
            got = await ctx.session.create_message([message], max_tokens=64)
        except MCPError as exc:
            answers.append(f"error: {exc.error.message}")
            continue
        answers.append(got.content.text if isinstance(got.content, TextContent) else got.content.type)
    return {"answers": answers}


def _add_session_tools() -> None:
    for tool in (stats, rendezvous, die, add_extra, ask):
        server.add_tool(tool)


if __name__ == "__main__":
    if "--session-tools" in sys.argv[1:]:
        _add_session_tools()
    if "--elicit-tools" in sys.argv[1:]:
        for tool in (delete_note, book, purge, connect, sync):
            server.add_tool(tool)
    if "--client-tools" in sys.argv[1:]:
        for tool in (traced, keyed, roots, summarize, summarize_many, draft):
            server.add_tool(tool)
    server.run()
