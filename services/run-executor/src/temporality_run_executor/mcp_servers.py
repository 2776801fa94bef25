"""Tools from MCP servers, through the official ``mcp`` SDK (stdio transport), run in the card's sandbox.

When the executor starts (:func:`list_card_tools`, from ``setup``), every MCP server a card declares is
started and asked for its tools; each becomes a registry :class:`~.tools.Tool` named
``<server>__<tool>`` -- made a valid function name when it is not (:func:`tool_name`: OpenAI allows only
``A-Z a-z 0-9 _ -``, at most 64 characters; the server is still called with its own name, and a card may name
either) -- with the server's description and input
schema, so the card's ``tools`` allow/deny policy, JSON-schema argument validation and ``tool.failed``
apply to it like to any tool. A server that cannot be started or listed does not stop the executor (one flaky
server would crash-loop every agent): the card keeps a stand-in for each of that server's tools it names exactly
(:func:`unavailable_tools`, every call ``tool.failed`` saying why), the executor is not ready while it waits, and the
server is listed again with a backoff (:class:`CardTools`, :func:`relist`) until its tools replace the stand-ins.

Sessions are long-lived (:class:`McpPool`, one per executor process): one live stdio session per
(server config, sandbox), started on first use and reused by every call of every run, with at most
``max_calls`` calls in flight on it (more wait their turn). The server process runs in the card's
sandbox (``StdioServerParameters``: ``sandbox.working_dir`` as its working directory; an environment of
the SDK's safe defaults -- ``HOME``, ``LOGNAME``, ``PATH``, ``SHELL``, ``TERM``, ``USER`` -- plus the
variables ``sandbox.env`` passes through and the server's own ``env``; with ``sandbox.network: false``
under ``unshare -rn``: a user and network namespace of its own, with no usable interface). Each session
is owned by a task of its own, which enters the SDK's ``mcp.Client`` (anyio cancel scopes must be exited
by the task that entered them) and waits until the session is retired; callers talk to it through its
``ClientSession``. Only the SDK's public API is used: ``mcp.Client`` (``mode="legacy"`` or ``"auto"``) over
an ``mcp.client.Transport`` (:class:`_StdioTransport`: the SDK's ``stdio_client`` whose read stream tells
the session when the server's stdout ends). A session is retired when

- the server's stdout ends (it died, was killed, or exited): the call in flight fails
  (:class:`McpToolFailed`, a tool error the model sees, ``tool.failed``), the next call starts a fresh one;
- it has had no call for ``idle_s`` seconds;
- the pool closes (executor shutdown): the SDK closes the server's stdin, then terminates and reaps its
  process tree, so no server outlives the executor.

Its tool listing is cached per session and listed again after the server's ``tools/list_changed``
(the registry's tools are fixed at start; the fresh listing keeps the SDK's output-schema validation
current). Nothing a run needs lives in a session, so a restart or a parked run loses nothing; a
redelivered turn simply calls again (MCP tools must be idempotent per call, like every tool). A call
result with ``isError``, a server that does not start, a dead server or a timeout (``timeout_s``, the
start of a session included) raises :class:`McpToolFailed`: the engine publishes ``tool.failed`` and
the model gets the error.

Elicitation (``elicitation/create`` from the server during a call, MCP 2025-06-18) never blocks the
process on a person. The session's callback answers it from the call's recorded answers
(:attr:`~.tools.ToolContext.elicited`, the n-th elicitation of the call with the n-th answer, when its
message and requested schema are the same); an elicitation with no such answer is told ``cancel`` at once,
and the call raises :class:`~.tools.ElicitationNeeded` when the server has answered: the run parks on a
person (see :mod:`.elicitation`), and once they answered the call is made again, the same elicitation now
answered from the record. stdio carries no link from a server's request to the call it belongs to, so an
elicitation is tied to the one call in flight on its session (it waits, bounded by the call's timeout, for
the session's other calls to end); when several calls of the session elicit at once none can be told
apart: each is told ``cancel`` and each call fails as a tool error (call it again). A URL-mode
elicitation (MCP 2025-11-25: a link the person opens) is asked the same way, its link recorded with the
answer. A call refused with ``URLElicitationRequiredError`` (-32042) is too (:func:`_call_completing`): the links
in the error park the run on the person, and after ``done`` the call is made again; refused again, it waits
(bounded) for the server's ``notifications/elicitation/complete`` of each link's elicitation and is made once
more; a declined link, or one still refused, is a :class:`~.tools.ToolError` telling the agent what the person
must do. The session remembers the URL-mode elicitation ids it was asked; a completion notification for any
other (or one already reported) is ignored, as the specification requires.

Every ``tools/call`` carries the caller's trace context in ``params._meta`` (``traceparent``/``tracestate``,
:func:`trace_meta`): stdio has no headers. A run's call carries its idempotency key there too
(:data:`IDEMPOTENCY_KEY`, :attr:`~.tools.ToolContext.call_key`): the same when a crashed turn is carried out again,
so a server can do a call's side effect once. ``roots/list`` is answered with the sandbox's working directory.
``sampling/createMessage`` is answered by the run's own model through the call's
:data:`~.tools.Sample` (:mod:`.sampling`: counted in the run's limits, journaled), tied to its call as an
elicitation is; a call with no sampler (a run of an external agent, a bare client) refuses it.

A server declared with ``protocol: auto`` is probed with ``server/discover``; when it speaks MCP 2026-07-28
its tools ask for input with an ``input_required`` result instead (the questions in the result, no
server-to-client request): each elicitation in it is answered from the recorded answers that ask the same
(message and schema) and the call is made again with the answers and the server's ``request_state``
(at most :data:`MAX_INPUT_ROUNDS` rounds, all in this call); one with no recorded answer raises
:class:`~.tools.ElicitationNeeded` as above. Nothing waits in the session either way: after the person's
answer the call starts over, and the server asks again. Sampling and roots requests in it are answered as
in a request from the server. The default (``handshake``) opens sessions with ``initialize`` (at most
2025-11-25), where a server elicits with ``elicitation/create``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, Protocol, Self, cast

import anyio
import structlog
from mcp import Client, ClientSession, MCPError
from mcp import types as mcp_types
from mcp.client import ClientRequestContext, IncomingMessage
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp.shared.message import SessionMessage
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, StatusCode

from temporality_bus import tracing
from temporality_run_executor.agents import NETWORK_OFF, AgentCard, McpServer, Sandbox
from temporality_run_executor.records import ElicitAnswer, Message
from temporality_run_executor.tools import TOOL_NAME as _TOOL_NAME
from temporality_run_executor.tools import (
    ElicitationNeeded,
    Sample,
    SamplingParams,
    SamplingRefused,
    Tool,
    ToolContext,
    ToolError,
)

__all__ = [
    "DEFAULT_IDLE_S",
    "DEFAULT_MAX_CALLS",
    "IDEMPOTENCY_KEY",
    "MAX_INPUT_ROUNDS",
    "SEPARATOR",
    "CardTools",
    "McpClient",
    "McpPool",
    "McpToolFailed",
    "list_card_tools",
    "list_server_tools",
    "relist",
    "tool_name",
    "unavailable_tools",
]

log = structlog.get_logger(__name__)
_VALID_NAME = re.compile(_TOOL_NAME)
#: Between the server's name and its tool's name: ``notes__read_note``.
SEPARATOR = "__"
#: Seconds a session may sit without a call before its server is stopped.
DEFAULT_IDLE_S = 300.0
#: Calls in flight on one session at once.
DEFAULT_MAX_CALLS = 4
#: The ``params._meta`` key of a run's ``tools/call`` that holds the call's idempotency key
#: (:attr:`~.tools.ToolContext.call_key`): the same on every replay of the call, so a server with side effects can
#: do each once (a ``_meta`` name with a prefix of our own, as the MCP specification asks of extensions).
IDEMPOTENCY_KEY = "temporality/idempotency-key"
#: ``input_required`` results (MCP 2026-07-28) one call answers from the record before it fails.
MAX_INPUT_ROUNDS = 10
#: URL-mode elicitation ids a session remembers (the ones it was asked, and whether the server reported them done).
_MAX_ELICITATION_IDS = 1024
#: Seconds :meth:`McpPool.aclose` waits for the sessions to stop their servers (the SDK bounds each at ~6 s).
_CLOSE_TIMEOUT_S = 15.0


class McpToolFailed(Exception):
    """The MCP server could not run the call (an ``isError`` result, no server, a dead server, a timeout)."""


#: What a model-facing name may not hold (OpenAI: ``^[a-zA-Z0-9_-]{1,64}$``, :data:`~.tools.TOOL_NAME`).
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9_-]")
#: Hex digits of the hash a renamed tool's name ends with.
_HASH_CHARS = 8


def tool_name(server: str, tool: str) -> str:
    """The name the model is offered for ``server``'s tool ``tool``: ``<server>__<tool>`` when that is a valid
    function name (:data:`~.tools.TOOL_NAME`); else, deterministically, that name with every character a function
    name may not hold replaced by ``_``, cut to fit 64 characters with ``_`` and a short hash of the full name at
    its end (``odd__read.file`` -> ``odd__read_file_<8 hex>``). The server is still called with ``tool``."""
    full = f"{server}{SEPARATOR}{tool}"
    if _VALID_NAME.fullmatch(full):
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:_HASH_CHARS]
    return f"{_NOT_IN_A_NAME.sub('_', full)[: 64 - _HASH_CHARS - 1]}_{digest}"


def _named(server: str, tool: str) -> tuple[str, str | None]:
    """``tool_name`` and the original ``<server>__<tool>`` when it differs (else ``None``)."""
    full = f"{server}{SEPARATOR}{tool}"
    name = tool_name(server, tool)
    return name, None if name == full else full


def parameters(server: McpServer, sandbox: Sandbox) -> StdioServerParameters:
    """How ``server`` is started in ``sandbox``."""
    env = {name: os.environ[name] for name in sandbox.env if name in os.environ} | server.env
    command, args = server.command, list(server.args)
    if not sandbox.network:
        unshare = shutil.which("unshare")
        if unshare is None:
            raise McpToolFailed("sandbox.network is false but `unshare` is not installed")
        command, args = unshare, [*NETWORK_OFF, command, *args]
    cwd = str(sandbox.working_dir) if sandbox.working_dir is not None else None
    shell = shutil.which("sh")
    if shell is not None:  # reports its exit code on its stderr's last line (the SDK keeps the process to itself)
        command, args = shell, ["-c", _REPORT_EXIT, command, *args]
    return StdioServerParameters(command=command, args=args, env=env, cwd=cwd)


_STDOUT_CLOSED = "the server's stdout closed (it exited)"
#: The last line of a server's stderr, written by ``sh`` around it when it exits: ``<marker><exit code>``.
_EXIT_MARK = "temporality-mcp-exit:"
#: ``trap : TERM``: a SIGTERM to the process group (the SDK stopping the server) ends the server, not the shell
#: first -- the shell waits for it (reaps it) and reports its code; the server's own signal dispositions are
#: the default (a trapped signal is reset on exec, unlike an ignored one).
_REPORT_EXIT = f'trap : TERM; "$0" "$@"; code=$?; echo "{_EXIT_MARK}$code" >&2; exit "$code"'
#: Lines of a server's stderr kept for the reason of a failure (each cut at :data:`_STDERR_LINE_MAX` characters).
_STDERR_KEPT = 10
_STDERR_LINE_MAX = 500
#: Seconds a failed session waits for the rest of its server's stderr (its exit code) before it says why it failed.
_STDERR_SETTLE_S = 2.0


class _Stderr:
    """A server's stderr, through a pipe of our own: each line logged with the server's name
    (``mcp.server_stderr``), the last :data:`_STDERR_KEPT` kept for the reason of a failure, and the exit code the
    ``sh`` wrapper reports (:data:`_EXIT_MARK`)."""

    def __init__(self, server: str) -> None:
        self.server = server
        read_fd, write_fd = os.pipe()
        self._read_fd = read_fd
        #: Handed to the SDK as the process's stderr; closed here once the process is spawned (EOF when it exits).
        self.writer = os.fdopen(write_fd, "w")
        self.lines: deque[str] = deque(maxlen=_STDERR_KEPT)
        self.exit_code: int | None = None
        self._done = asyncio.Event()
        self._transport: asyncio.ReadTransport | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        pipe = os.fdopen(self._read_fd, "rb", 0)
        self._transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        self._task = asyncio.create_task(self._read(reader), name=f"mcp-stderr-{self.server}")

    def spawned(self) -> None:
        """The process has its copy of the pipe: drop ours."""
        if not self.writer.closed:
            self.writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        buffer = b""
        try:
            while chunk := await reader.read(65536):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._line(line)
                if len(buffer) > _STDERR_LINE_MAX:  # no newline for long: take it as a line
                    self._line(buffer)
                    buffer = b""
            if buffer:
                self._line(buffer)
        finally:
            self._done.set()

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip()[:_STDERR_LINE_MAX]
        if text.startswith(_EXIT_MARK):
            code = text.removeprefix(_EXIT_MARK)
            self.exit_code = int(code) if code.isdigit() else None
            return
        if text:
            self.lines.append(text)
            log.info("mcp.server_stderr", server=self.server, line=text)

    async def settled(self, wait_s: float = _STDERR_SETTLE_S) -> None:
        """Wait (bounded) until the server's stderr ended: its last lines and exit code are known."""
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self._done.wait(), wait_s)
        except TimeoutError:
            pass

    def tail(self) -> str:
        """``; exit code N; its last stderr lines: a | b`` (what is known), or ``""``."""
        parts = []
        if self.exit_code is not None:
            signal = f" (killed by signal {self.exit_code - 128})" if self.exit_code > 128 else ""
            parts.append(f"exit code {self.exit_code}{signal}")
        if self.lines:
            parts.append("its last stderr lines: " + " | ".join(self.lines))
        return "".join(f"; {part}" for part in parts)

    async def aclose(self) -> None:
        self.spawned()
        if self._task is not None and not self._task.done():
            await self.settled()
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._transport is not None:
            self._transport.close()
        elif not self._done.is_set():
            os.close(self._read_fd)


class _Call:
    """One ``tools/call`` in flight on a session: its recorded elicitation answers, the run's model for its
    sampling requests, and what it was asked."""

    def __init__(self, answers: tuple[ElicitAnswer, ...], sample: Sample | None, roots: list[mcp_types.Root]) -> None:
        self.answers = answers
        self.sample = sample
        self.roots = roots
        self.asked = 0  # elicitations so far
        self.needed: ElicitationNeeded | None = None
        self.unanswerable: str | None = None
        #: What broke while answering a sampling request (the bus, not the server): raised after the call.
        self.failure: Exception | None = None
        #: The caller's context (its ``tools/call`` span): a sampling request continues it (the provider's ``chat``
        #: span is the call's child), attached explicitly whatever context the SDK runs its callback in.
        self.trace_context = otel_context.get_current()

    def answer(self, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
        position = self.asked
        self.asked += 1
        schema, url = _asked(params)
        if position < len(self.answers):
            recorded = self.answers[position]
            if (recorded.message, recorded.requested_schema, recorded.url) == (params.message, schema, url):
                return mcp_types.ElicitResult(action=recorded.action, content=recorded.content)
        if self.needed is None:
            self.needed = ElicitationNeeded(params.message, schema, position, url)
        return mcp_types.ElicitResult(action="cancel")

    def url_required(self, tool: str, required: list[mcp_types.ElicitRequestURLParams]) -> None:
        """A ``tools/call`` refused with ``URLElicitationRequiredError`` (-32042): the links the person must open
        first. The first one the call's record does not answer raises :class:`~.tools.ElicitationNeeded` (the run
        parks on the person, as for a URL-mode ``elicitation/create``; at the position after the call's other
        elicitations); one they declined (or left unanswered) raises :class:`~.tools.ToolError` telling the agent
        so; returns when the person said ``done`` to every one (the server still refuses: the caller waits for its
        completion notification)."""
        if not required:
            raise McpToolFailed(f"{tool} was refused with URLElicitationRequiredError naming no elicitation")
        for offset, params in enumerate(required):
            position = self.asked + offset
            asks: tuple[str, dict[str, Any], str | None] = (params.message, {}, params.url)
            recorded = self.answers[position] if position < len(self.answers) else None
            if recorded is None or (recorded.message, recorded.requested_schema, recorded.url) != asks:
                raise ElicitationNeeded(params.message, {}, position, params.url)
            if recorded.action != "accept":
                told = "declined" if recorded.action == "decline" else "gave no answer (cancel)"
                raise ToolError(
                    f"{tool} cannot run until the person completes an interaction at a link the server gave "
                    f"({params.message!r}); they were asked and {told}. Do not call it again unless they agree."
                )

    async def sampled(
        self, params: mcp_types.CreateMessageRequestParams
    ) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
        """A ``sampling/createMessage`` answered by the run's own model (:data:`~.tools.Sample`: counted in the
        run's limits and journaled), or the error the server is told (no model for it, a refusal)."""
        if self.sample is None:
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message="no model answers sampling here")
        token = otel_context.attach(self.trace_context)
        try:
            messages = _sampling_messages(params)
            got = await self.sample(messages, _sampling_params(params))
        except SamplingRefused as refused:
            log.info("mcp.sampling_refused", reason=str(refused))
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=str(refused))
        except Exception as exc:  # the bus failing while journaling it: the call fails, the turn is redelivered
            self.failure = self.failure or exc
            return mcp_types.ErrorData(code=mcp_types.INTERNAL_ERROR, message="the client could not answer")
        finally:
            otel_context.detach(token)
        text = mcp_types.TextContent(type="text", text=got.content)
        return mcp_types.CreateMessageResult(
            role="assistant", content=text, model=got.model, stop_reason=got.stop_reason
        )

    async def inputs(self, result: mcp_types.InputRequiredResult) -> mcp_types.InputResponses:
        """The answers to an ``input_required`` result's requests: an elicitation from a recorded answer that asks
        the same (message and schema; the first with none raises :class:`~.tools.ElicitationNeeded`), a sampling
        request by the run's model, ``roots/list`` with the sandbox's working directory."""
        responses: mcp_types.InputResponses = {}
        for key, request in sorted((result.input_requests or {}).items()):
            if isinstance(request, mcp_types.ListRootsRequest):
                responses[key] = mcp_types.ListRootsResult(roots=self.roots)
                continue
            if isinstance(request, mcp_types.CreateMessageRequest):
                sampled = await self.sampled(request.params)
                if isinstance(sampled, mcp_types.ErrorData):
                    raise McpToolFailed(f"it asked for a completion of the run's model: {sampled.message}")
                responses[key] = sampled
                continue
            params = request.params
            schema, url = _asked(params)
            asks = (params.message, schema, url)
            recorded = next((a for a in self.answers if (a.message, a.requested_schema, a.url) == asks), None)
            if recorded is None:
                raise ElicitationNeeded(params.message, schema, len(self.answers), url)
            responses[key] = mcp_types.ElicitResult(action=recorded.action, content=recorded.content)
        return responses


def _asked(params: mcp_types.ElicitRequestParams) -> tuple[dict[str, Any], str | None]:
    """What an elicitation asks: a form's requested schema, or (URL mode) no schema and the link."""
    if isinstance(params, mcp_types.ElicitRequestURLParams):
        return {}, params.url
    return dict(params.requested_schema), None


def _sampling_messages(params: mcp_types.CreateMessageRequestParams) -> list[Message]:
    """A sampling request as the conversation the run's provider is given (its system prompt first); text only."""
    if params.tools or params.tool_choice:
        raise SamplingRefused("tool use in sampling is not offered")
    messages = [Message(role="system", content=params.system_prompt)] if params.system_prompt else []
    for message in params.messages:
        texts: list[str] = []
        for block in message.content_as_list:
            if not isinstance(block, mcp_types.TextContent):
                raise SamplingRefused(f"only text can be sampled, not {block.type}")
            texts.append(block.text)
        messages.append(Message(role=message.role, content="\n".join(texts)))
    if not any(m.role == "user" for m in messages):
        raise SamplingRefused("a sampling request needs a user message")
    return messages


def _sampling_params(params: mcp_types.CreateMessageRequestParams) -> SamplingParams:
    """A sampling request's bounds: ``maxTokens``, ``temperature``, ``stopSequences`` and the model hints (the
    priorities are not used: the card's ``sampling_models`` are the choice, see :mod:`.sampling`)."""
    preferences = params.model_preferences
    hints = [hint.name for hint in (preferences.hints or [])] if preferences is not None else []
    return SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        stop=tuple(params.stop_sequences or ()),
        model_hints=tuple(name for name in hints if name),
    )


def _roots(sandbox: Sandbox) -> list[mcp_types.Root]:
    """``roots/list``'s answer for a session in ``sandbox``: its working directory (none declared: no roots)."""
    if sandbox.working_dir is None:
        return []
    path = Path(sandbox.working_dir).resolve()
    return [mcp_types.Root(uri=path.as_uri(), name="working directory")]


class _Receiving(Protocol):
    async def receive(self) -> SessionMessage | Exception: ...

    async def aclose(self) -> None: ...


class _WatchedStream:
    """The transport's read stream, telling its session when it ends (the server's stdout closed)."""

    def __init__(self, inner: _Receiving, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    async def receive(self) -> SessionMessage | Exception:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedStream:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc_val: BaseException | None, exc_tb: TracebackType | None
    ) -> bool | None:
        await self.aclose()
        return None


class _StdioTransport:
    """The SDK's ``stdio_client`` with a read stream that tells the session when the server's stdout ends: an
    ``mcp.client.Transport`` (an async context manager of the two streams) handed to ``mcp.Client``."""

    def __init__(self, params: StdioServerParameters, on_end: Callable[[], None], stderr: _Stderr) -> None:
        self._stdio = stdio_client(params, errlog=stderr.writer)  # each line logged with the server's name
        self._on_end = on_end
        self._stderr = stderr

    async def __aenter__(self) -> tuple[_WatchedStream, Any]:
        try:
            read, write = await self._stdio.__aenter__()
        finally:
            self._stderr.spawned()
        return _WatchedStream(read, self._on_end), write

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc_val: BaseException | None, exc_tb: TracebackType | None
    ) -> bool | None:
        return await self._stdio.__aexit__(exc_type, exc_val, exc_tb)


class _Session:
    """One live stdio session, owned by its own task from start to stop."""

    def __init__(
        self, pool: McpPool, key: str, server: McpServer, sandbox: Sandbox, params: StdioServerParameters
    ) -> None:
        self.pool, self.key, self.server = pool, key, server
        #: What ``roots/list`` answers: the sandbox's working directory.
        self.roots = _roots(sandbox)
        self.calls = asyncio.Semaphore(pool.max_calls)
        self.active = 0  # calls using it or waiting for a slot
        self.retired = False
        self._calls: list[_Call] = []  # in flight
        self._asking = 0  # elicitations waiting to be tied to a call
        self._changed = asyncio.Condition()
        self._stop = asyncio.Event()
        #: Entered and exited by the session's own task; cancelled only while the session is still starting.
        self._starting = anyio.CancelScope()
        self._idle: asyncio.TimerHandle | None = None
        self._tools: list[mcp_types.Tool] | None = None
        self._listings = 0  # tools/list_changed notifications so far
        #: URL-mode elicitation ids this session was asked (a -32042 error, an ``elicitation/create``), oldest first,
        #: each with whether the server reported it complete (``notifications/elicitation/complete``).
        self._elicitations: OrderedDict[str, bool] = OrderedDict()
        self._completions = asyncio.Condition()
        self._listing = asyncio.Lock()
        self._ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self._ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no GC warning
        self.stderr = _Stderr(server.name)
        #: Why it was retired (the first reason).
        self.retired_why: str | None = None
        self.task = asyncio.create_task(self._own(params), name=f"mcp-session-{server.name}")

    async def _own(self, params: StdioServerParameters) -> None:
        why = "stopped"
        failure: Exception | None = None
        try:
            await self.stderr.start()
            with self._starting:
                await self._run(params)
        except Exception as exc:  # it could not start, or broke: the callers waiting for it get the error
            failure = exc
            why = _describe(exc)
        finally:
            starting = not self._ready.done()
            if starting or failure is not None:
                await self.stderr.settled()
            if starting:
                why = self._not_started(failure, why)
                self._ready.set_exception(McpToolFailed(why))
                if failure is not None or self.retired_why in (None, _STDOUT_CLOSED):
                    log.warning(
                        "mcp.server_failed", server=self.server.name, exit_code=self.stderr.exit_code, reason=why
                    )
            elif failure is not None or self.stderr.exit_code not in (None, 0):
                why += self.stderr.tail()
            self.retire(why)
            await self.stderr.aclose()
            log.info("mcp.session_stopped", server=self.server.name, reason=why, exit_code=self.stderr.exit_code)

    def _not_started(self, failure: Exception | None, why: str) -> str:
        """Why the session never became ready, in plain words, with the exit code and the last stderr lines."""
        if failure is not None and _timed_out(failure):
            reason = f"did not answer initialize within {self.server.timeout_s:g} s"
        elif self.retired_why not in (None, _STDOUT_CLOSED):  # retired while starting: shutdown, idle
            return f"the session stopped before it was ready ({self.retired_why})"
        elif self.stderr.exit_code is not None:
            reason = "exited before it answered initialize"
        elif failure is None:
            reason = f"the session stopped before it was ready ({self.retired_why or why})"
        else:
            reason = f"could not be started: {why}"
        return f"{reason}{self.stderr.tail()}"

    async def _run(self, params: StdioServerParameters) -> None:
        client = Client(
            _StdioTransport(params, lambda: self.retire(_STDOUT_CLOSED), self.stderr),
            # auto: server/discover, 2026-07-28 when the server speaks it, else initialize; legacy: initialize
            mode="auto" if self.server.protocol == "auto" else "legacy",
            read_timeout_seconds=self.server.timeout_s,
            message_handler=self._on_message,
            elicitation_callback=self._on_elicitation,
            sampling_callback=self._on_sampling,
            list_roots_callback=self._on_roots,
            cache=None,  # the listing is cached here, per session, and listed again on tools/list_changed
        )
        async with client:
            self._ready.set_result(client.session)
            log.info("mcp.session_started", server=self.server.name)
            await self._stop.wait()

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._tools = None
            self._listings += 1
        elif isinstance(message, mcp_types.ElicitCompleteNotification):
            await self._elicitation_completed(message.params.elicitation_id)

    def known(self, elicitations: Iterable[mcp_types.ElicitRequestURLParams]) -> list[str]:
        """Remember the URL-mode elicitations' ids (their completion notifications are then not ignored); their
        ids (an elicitation without one cannot be told complete)."""
        ids = [e.elicitation_id for e in elicitations if e.elicitation_id]
        for elicitation_id in ids:
            self._elicitations.setdefault(elicitation_id, False)
            self._elicitations.move_to_end(elicitation_id)
        while len(self._elicitations) > _MAX_ELICITATION_IDS:
            self._elicitations.popitem(last=False)
        return ids

    async def _elicitation_completed(self, elicitation_id: str) -> None:
        """``notifications/elicitation/complete`` (MCP 2025-11-25): the out-of-band interaction of a URL-mode
        elicitation finished. One this session was never asked, or already reported, is ignored (as the
        specification requires); else it is logged and wakes a call waiting to try again."""
        if self._elicitations.get(elicitation_id) is not False:
            log.info("mcp.elicitation_complete_ignored", server=self.server.name, elicitation_id=elicitation_id[:200])
            return
        self._elicitations[elicitation_id] = True
        log.info("mcp.elicitation_completed", server=self.server.name, elicitation_id=elicitation_id[:200])
        async with self._completions:
            self._completions.notify_all()

    async def completed(self, ids: list[str], wait_s: float) -> bool:
        """Whether the server reported every one of ``ids`` complete, waiting at most ``wait_s`` for it."""
        async with self._completions:
            try:
                await asyncio.wait_for(
                    self._completions.wait_for(lambda: all(self._elicitations.get(i) for i in ids)), wait_s
                )
            except TimeoutError:
                return False
        return True

    async def _tied(self, what: str) -> _Call | None:
        """The call a server's request (``what`` it asks for) belongs to: the one call in flight on the session,
        once the session's other calls have ended (waited for, bounded by the call's timeout). stdio carries no
        link from the request to its call; with several calls still in flight, ``None`` (each of them fails)."""
        async with self._changed:
            self._asking += 1
            self._changed.notify_all()
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: len(self._calls) <= self._asking), self.server.timeout_s
                )
            except TimeoutError:
                pass
            finally:
                self._asking -= 1
            calls = list(self._calls)
        if len(calls) == 1:
            return calls[0]
        why = f"it asked {what} while {len(calls)} calls were in flight on its session"
        for call in calls:
            call.unanswerable = call.unanswerable or why
        log.warning("mcp.request_untied", server=self.server.name, asked=what, calls=len(calls))
        return None

    async def _on_elicitation(
        self, context: ClientRequestContext, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        """Tie the elicitation to the one call in flight, then answer it from the call's record."""
        if isinstance(params, mcp_types.ElicitRequestURLParams):
            self.known([params])
        call = await self._tied("for the user's input")
        if call is None:
            return mcp_types.ElicitResult(action="cancel")
        result = call.answer(params)
        log.info("mcp.elicitation", server=self.server.name, action=result.action, message=params.message[:200])
        return result

    async def _on_sampling(
        self, context: ClientRequestContext, params: mcp_types.CreateMessageRequestParams
    ) -> mcp_types.CreateMessageResult | mcp_types.CreateMessageResultWithTools | mcp_types.ErrorData:
        """``sampling/createMessage``: answered by the run's own model, through the call's sampler."""
        call = await self._tied("for a completion of the run's model")
        if call is None:
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message="sampling request not tied to a call")
        return await call.sampled(params)

    async def _on_roots(self, context: ClientRequestContext) -> mcp_types.ListRootsResult | mcp_types.ErrorData:
        """``roots/list``: the sandbox's working directory (the session's, whichever call asks); none declared:
        no roots."""
        return mcp_types.ListRootsResult(roots=self.roots)

    @asynccontextmanager
    async def calling(self, answers: tuple[ElicitAnswer, ...], sample: Sample | None) -> AsyncIterator[_Call]:
        """One call in flight on the session (its elicitations and sampling requests are tied to it)."""
        call = _Call(answers, sample, self.roots)
        async with self._changed:
            self._calls.append(call)
        try:
            yield call
        finally:
            async with self._changed:
                self._calls.remove(call)
                self._changed.notify_all()

    def retire(self, why: str) -> None:
        """No new call uses it; its task stops the server as soon as it can (it may still be starting)."""
        if not self.retired:
            self.retired = True
            self.retired_why = why
            log.info("mcp.session_retired", server=self.server.name, reason=why)
        self.pool._forget(self)
        self._cancel_idle()
        self._stop.set()
        if not self._ready.done():  # still starting (a server slow to initialize): stop waiting for it
            self._starting.cancel()

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_expired(self) -> None:
        self._idle = None
        if self.active == 0:
            self.retire(f"idle for {self.pool.idle_s:g}s")

    @asynccontextmanager
    async def use(self) -> AsyncIterator[ClientSession]:
        """The session, for one call: waits for a free slot and for the session to be ready."""
        self.active += 1
        self._cancel_idle()
        try:
            async with self.calls:
                yield await asyncio.shield(self._ready)
        finally:
            self.active -= 1
            if self.active == 0 and not self.retired:
                self._idle = asyncio.get_running_loop().call_later(self.pool.idle_s, self._idle_expired)

    async def tools(self, session: ClientSession) -> list[mcp_types.Tool]:
        """The server's tools, listed once per session (again after ``tools/list_changed``)."""
        async with self._listing:
            while self._tools is None:
                changes = self._listings
                tools: list[mcp_types.Tool] = []
                cursor: str | None = None
                while True:
                    params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
                    page = await session.list_tools(params=params)
                    tools += page.tools
                    cursor = page.next_cursor
                    if not cursor:
                        break
                if changes == self._listings:  # else it changed while listing: list again
                    self._tools = tools
            return self._tools


class McpPool:
    """The executor's live MCP sessions: one per (server config, sandbox), shared by every run.

    ``idle_s``: a session without a call for that long is closed (its server stopped); the next call
    starts it again. ``max_calls``: calls in flight on one session at once.
    """

    def __init__(self, *, idle_s: float = DEFAULT_IDLE_S, max_calls: int = DEFAULT_MAX_CALLS) -> None:
        if idle_s <= 0 or max_calls < 1:
            raise ValueError("idle_s must be positive and max_calls at least 1")
        self.idle_s = idle_s
        self.max_calls = max_calls
        self._live: dict[str, _Session] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # every session's task until it has stopped its server
        self._closed = False

    @staticmethod
    def _key(server: McpServer, sandbox: Sandbox) -> str:
        return json.dumps([server.model_dump(mode="json"), sandbox.model_dump(mode="json")], sort_keys=True)

    def live(self, server: McpServer, sandbox: Sandbox) -> bool:
        """Whether a session for ``server`` in ``sandbox`` is live (started or starting, not retired)."""
        return self._key(server, sandbox) in self._live

    @property
    def running(self) -> int:
        """Sessions whose task has not finished yet (retired ones still stopping their server included)."""
        return sum(not task.done() for task in self._tasks)

    def _session(self, server: McpServer, sandbox: Sandbox) -> _Session:
        if self._closed:
            raise McpToolFailed("the executor is shutting down")
        key = self._key(server, sandbox)
        session = self._live.get(key)
        if session is None:
            session = _Session(self, key, server, sandbox, parameters(server, sandbox))
            self._live[key] = session
            self._tasks.add(session.task)
            session.task.add_done_callback(self._tasks.discard)
        return session

    def stderr_tail(self, server: McpServer) -> str:
        """What a live session of ``server`` knows of its process (:meth:`_Stderr.tail`), or ``""``."""
        tails = [s.stderr.tail() for s in self._live.values() if s.server == server]
        return tails[0] if tails else ""

    def _forget(self, session: _Session) -> None:
        if self._live.get(session.key) is session:
            del self._live[session.key]

    @asynccontextmanager
    async def session(self, server: McpServer, sandbox: Sandbox) -> AsyncIterator[tuple[_Session, ClientSession]]:
        """The live session for ``server`` in ``sandbox`` (started if there is none), for one call."""
        pooled = self._session(server, sandbox)
        async with pooled.use() as client:
            yield pooled, client

    async def aclose(self) -> None:
        """Close every session and wait until their servers are stopped (executor shutdown)."""
        self._closed = True
        for session in list(self._live.values()):
            session.retire("the executor is shutting down")
        tasks = list(self._tasks)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=_CLOSE_TIMEOUT_S)
        for task in pending:  # the SDK bounds its shutdown; this only guards against a hang in it
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        log.info("mcp.pool_closed", sessions=len(tasks))


class McpClient:
    """One declared server in a card's sandbox, called through the pool's live session."""

    def __init__(self, server: McpServer, sandbox: Sandbox, pool: McpPool) -> None:
        self.server = server
        self.sandbox = sandbox
        self.pool = pool

    async def list_tools(self) -> list[mcp_types.Tool]:
        ready = False
        timeout_s = self.server.timeout_s
        try:
            async with asyncio.timeout(timeout_s), self.pool.session(self.server, self.sandbox) as (s, client):
                ready = True
                return list(await s.tools(client))
        except TimeoutError:
            what = "answer tools/list" if ready else "answer initialize"
            raise McpToolFailed(f"did not {what} within {timeout_s:g} s{self.pool.stderr_tail(self.server)}") from None

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        elicited: tuple[ElicitAnswer, ...] = (),
        sample: Sample | None = None,
        key: str | None = None,
    ) -> str:
        """The call's result as the model gets it. ``key``: the call's idempotency key, sent in its ``params._meta``
        (:data:`IDEMPOTENCY_KEY`; ``None``: none sent). The server asking for input that ``elicited`` does not
        answer: :class:`~.tools.ElicitationNeeded` (the server was told ``cancel``); asking for a completion:
        answered by ``sample`` (none: refused). With tracing on, in a CLIENT span ``tools/call <tool>`` (an
        error status when the call failed; asking for input is not one). The request carries the current trace
        context in its ``params._meta`` (``traceparent``, ``tracestate``): stdio has no headers."""
        if not tracing.enabled():
            return await self._call_tool(tool, arguments, elicited, sample, key)
        attributes = {
            "mcp.method.name": "tools/call",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "temporality.mcp.server": self.server.name,
        }
        with tracing.tracer().start_as_current_span(
            f"tools/call {tool}",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                return await self._call_tool(tool, arguments, elicited, sample, key)
            except ElicitationNeeded:
                span.set_attribute("temporality.mcp.input_required", True)
                raise
            except Exception as exc:
                span.set_status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:256])
                raise

    async def _call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        elicited: tuple[ElicitAnswer, ...],
        sample: Sample | None,
        key: str | None = None,
    ) -> str:
        name, timeout_s = self.server.name, self.server.timeout_s
        try:
            async with asyncio.timeout(timeout_s), self.pool.session(self.server, self.sandbox) as (s, client):
                await s.tools(client)  # current, for the SDK's validation of structured results
                async with s.calling(elicited, sample) as call:
                    result = await _call_completing(client, s, call, tool, arguments, timeout_s, key)
        except (ElicitationNeeded, ToolError):  # asked in a result or a -32042 error: the run parks on a person
            raise
        except TimeoutError:
            raise McpToolFailed(f"{name}: {tool} took longer than {timeout_s:g}s") from None
        except McpToolFailed as exc:
            raise McpToolFailed(f"{name}: could not run {tool}: {exc}") from exc
        except Exception as exc:  # no server, a dead one, an error response
            raise McpToolFailed(f"{name}: could not run {tool}: {type(exc).__name__}: {_describe(exc)}") from exc
        if call.failure is not None:  # the bus broke while a sampling request was answered: not the tool's fault
            raise call.failure
        if call.unanswerable is not None:
            raise McpToolFailed(f"{name}: {tool}: {call.unanswerable}, which cannot be answered; call it again")
        if call.needed is not None:  # what the server made of the cancel is not the tool's result
            raise call.needed
        text = _text(result)
        if result.is_error:
            raise McpToolFailed(f"{name}: {tool}: {text}")
        return text


def trace_meta() -> mcp_types.RequestParamsMeta | None:
    """The current trace context as request ``_meta`` (W3C ``traceparent``/``tracestate``: the MCP convention for
    stdio, which has no headers), or ``None`` outside any span."""
    current = tracing.current_trace()
    if current is None:
        return None
    traceparent, tracestate = current
    meta = {"traceparent": traceparent} | ({"tracestate": tracestate} if tracestate else {})
    return cast(mcp_types.RequestParamsMeta, meta)  # an open map (extra keys), which mypy does not read


async def _call_completing(
    client: ClientSession,
    session: _Session,
    call: _Call,
    tool: str,
    arguments: dict[str, Any],
    timeout_s: float,
    key: str | None = None,
) -> mcp_types.CallToolResult:
    """:func:`_call`, a ``URLElicitationRequiredError`` (-32042) handled per MCP 2025-11-25: the links the person
    must open become a parked URL-mode question (:meth:`_Call.url_required`); once they said ``done`` to every
    one and the server still refuses, the call waits for the server's ``notifications/elicitation/complete`` of
    each (bounded: the server's ``completion_wait_s``, the notification being optional) and is made once more;
    still refused, the agent is told."""
    try:
        return await _call(client, call, tool, arguments, timeout_s, key)
    except MCPError as exc:
        if exc.code != mcp_types.URL_ELICITATION_REQUIRED:
            raise
        required = UrlElicitationRequiredError.from_error(exc.error).elicitations
    ids = session.known(required)
    call.url_required(tool, required)
    wait_s = min(session.server.completion_wait_s, timeout_s / 2)
    if ids and await session.completed(ids, wait_s):
        try:
            return await _call(client, call, tool, arguments, timeout_s, key)
        except MCPError as exc:
            if exc.code != mcp_types.URL_ELICITATION_REQUIRED:
                raise
    _still_required(tool, required, bool(ids), wait_s)


def _still_required(tool: str, required: list[mcp_types.ElicitRequestURLParams], ids: bool, wait_s: float) -> NoReturn:
    reported = f"and did not report it complete within {wait_s:g}s" if ids else "(it names no elicitation id)"
    messages = "; ".join(repr(e.message) for e in required)
    raise ToolError(
        f"{tool} still needs the person to complete an interaction at a link the server gave ({messages}): they "
        f"said they had finished there, but the server refuses the call {reported}. Call it again to ask them again."
    )


async def _call(
    client: ClientSession, call: _Call, tool: str, arguments: dict[str, Any], timeout_s: float, key: str | None = None
) -> mcp_types.CallToolResult:
    """``tools/call``; an ``input_required`` result (MCP 2026-07-28) answered (from the record, by the run's
    model) and the call made again with the answers and the server's state, round after round. ``params._meta``:
    the trace context and the call's idempotency key (``key``)."""
    meta = trace_meta()
    if key is not None:
        meta = cast(mcp_types.RequestParamsMeta, {**(meta or {}), IDEMPOTENCY_KEY: key})
    result = await client.call_tool(
        tool, arguments, read_timeout_seconds=timeout_s, meta=meta, allow_input_required=True
    )
    for _ in range(MAX_INPUT_ROUNDS):
        if not isinstance(result, mcp_types.InputRequiredResult):
            return result
        result = await client.call_tool(
            tool,
            arguments,
            read_timeout_seconds=timeout_s,
            input_responses=await call.inputs(result),
            request_state=result.request_state,
            meta=meta,
            allow_input_required=True,
        )
    if isinstance(result, mcp_types.InputRequiredResult):
        raise McpToolFailed(f"it still asked for input after {MAX_INPUT_ROUNDS} rounds")
    return result


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions an ``ExceptionGroup`` (nested or not) holds; ``[exc]`` for any other."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` (or every exception of its group) is a timeout: the SDK's request timeout or ours."""
    return all(
        isinstance(leaf, TimeoutError) or (isinstance(leaf, MCPError) and leaf.code == mcp_types.REQUEST_TIMEOUT)
        for leaf in _leaves(exc)
    )


def _describe(exc: BaseException) -> str:
    """``exc`` in words, an ``ExceptionGroup`` unwrapped into what it holds."""
    parts = []
    for leaf in _leaves(exc):
        if isinstance(leaf, MCPError) and leaf.code == mcp_types.CONNECTION_CLOSED:
            parts.append(f"{leaf} (the server exited; the next call starts it again)")
        else:
            parts.append(f"{type(leaf).__name__}: {leaf}" if str(leaf) else type(leaf).__name__)
    return "; ".join(parts)


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
        return await client.call(listed.name, arguments, ctx.elicited, ctx.sample, key=ctx.call_key)

    name, origin = _named(client.server.name, listed.name)
    return Tool(
        name=name,
        description=listed.description or listed.title or listed.name,
        parameters=listed.input_schema or {"type": "object"},
        implementation=run,
        origin=origin,
    )


async def list_card_tools(card: AgentCard, pool: McpPool) -> list[Tool]:
    """The tools of every MCP server ``card`` declares (each server's session started in the card's sandbox,
    and kept in ``pool`` for the calls); the first server that cannot be listed: :class:`McpToolFailed`."""
    tools: list[Tool] = []
    for server in card.mcp_servers:
        tools += await list_server_tools(card, server, pool)
    return tools


async def list_server_tools(card: AgentCard, server: McpServer, pool: McpPool) -> list[Tool]:
    """The tools of one of ``card``'s MCP servers; :class:`McpToolFailed` naming the agent, the server and why."""
    client = McpClient(server, card.sandbox, pool)
    try:
        listed = await client.list_tools()
    except Exception as exc:  # whatever it is, the card cannot get its tools: say which and why
        why = str(exc) if isinstance(exc, McpToolFailed) else _describe(exc)
        raise McpToolFailed(f"agent {card.id}: mcp_servers {server.name}: could not list its tools: {why}") from exc
    log.info("mcp.listed", agent=card.id, server=server.name, tools=[t.name for t in listed])
    tools = [_tool(client, t) for t in listed]
    taken: dict[str, str] = {}
    for tool, original in zip(tools, listed, strict=True):
        if tool.name in taken:
            raise McpToolFailed(
                f"agent {card.id}: mcp_servers {server.name}: its tools {taken[tool.name]!r} and {original.name!r} "
                f"would both be offered as {tool.name!r} (a tool name may hold only A-Z a-z 0-9 _ -, at most 64 "
                "characters); rename one in the server"
            )
        taken[tool.name] = original.name
        if tool.origin is not None:
            log.info("mcp.tool_renamed", agent=card.id, server=server.name, tool=original.name, offered_as=tool.name)
    return tools


def unavailable_tools(card: AgentCard, server: McpServer, why: Callable[[], str]) -> list[Tool]:
    """Stand-ins for the tools of ``server`` that ``card`` names exactly in ``tools`` while the server cannot be
    listed: offered with no schema of their own, every call fails (``tool.failed``, the model told) saying why
    (``why()``: the last listing's error). A pattern (``notes__*``) names no tool until the server is listed."""
    prefix = tool_name(server.name, "")
    names = [name for name in card.tools.exact_names() if name.startswith(prefix) and name not in card.tools.deny]

    def stand_in(named: str) -> Tool:
        async def fail(arguments: dict[str, Any], ctx: ToolContext) -> str:
            raise McpToolFailed(f"{server.name}: {named} is not available: {why()}; the executor keeps trying")

        name, origin = _named(server.name, named[len(prefix) :])
        return Tool(
            name=name,
            description=f"(not available yet: the MCP server {server.name} could not be listed)",
            parameters={"type": "object"},
            implementation=fail,
            origin=origin,
        )

    return [stand_in(name) for name in dict.fromkeys(names)]


#: The first wait before a server that could not be listed is listed again, and the longest (doubling between).
RELIST_FIRST_S = 1.0
RELIST_MAX_S = 60.0


class CardTools:
    """Every card's MCP tools: each server's listed tools, or (:attr:`unlisted`) the stand-ins of one that could not
    be listed yet, with the last error."""

    def __init__(self) -> None:
        self._tools: dict[tuple[str, str], list[Tool]] = {}
        #: ``(agent, server)`` -> the last listing's error, for the servers not listed yet.
        self.unlisted: dict[tuple[str, str], str] = {}

    def listed(self, card: AgentCard, server: McpServer, tools: list[Tool]) -> None:
        self._tools[card.id, server.name] = tools
        self.unlisted.pop((card.id, server.name), None)

    def failed(self, card: AgentCard, server: McpServer, error: str) -> None:
        key = (card.id, server.name)
        first = key not in self.unlisted
        self.unlisted[key] = error
        if first:
            self._tools[key] = unavailable_tools(card, server, lambda: self.unlisted.get(key, "listing it again"))

    def of(self, card: AgentCard) -> list[Tool]:
        """``card``'s MCP tools as they stand (listed ones, stand-ins for the rest)."""
        return [tool for server in card.mcp_servers for tool in self._tools.get((card.id, server.name), [])]

    def problem(self) -> str | None:
        """What is not listed yet (``None``: everything is), for the readiness check."""
        if not self.unlisted:
            return None
        return "; ".join(  # each error bounded: /readyz shows them all (and bounds the whole)
            f"agent {agent}: mcp server {server}: {error[:300]}" for (agent, server), error in self.unlisted.items()
        )


async def relist(
    card: AgentCard, server: McpServer, pool: McpPool, tools: CardTools, listed: Callable[[AgentCard], None]
) -> None:
    """List ``server`` again, with a backoff (:data:`RELIST_FIRST_S` doubling to :data:`RELIST_MAX_S`), until it
    answers; then its tools replace the stand-ins (``listed(card)``: the executor takes the card's new tools)."""
    wait_s = RELIST_FIRST_S
    while True:
        await asyncio.sleep(wait_s)
        try:
            found = await list_server_tools(card, server, pool)
        except McpToolFailed as exc:
            tools.failed(card, server, str(exc))
            wait_s = min(wait_s * 2, RELIST_MAX_S)
            log.warning("mcp.listing_failed", agent=card.id, server=server.name, error=str(exc), retry_in_s=wait_s)
            continue
        tools.listed(card, server, found)
        listed(card)
        log.info("mcp.listed_after_start", agent=card.id, server=server.name)
        return
