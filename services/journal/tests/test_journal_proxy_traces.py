"""The journal's inbox proxy carries the caller's trace context to human-interaction (issue 11).

human-interaction runs as its own process exporting with the real SDK and OTLP exporter to a real receiver
(:class:`temporality_testing.otlp_receiver.OtlpReceiver`): its SERVER span of the forwarded request shows which
trace and parent the request arrived with. The journal runs three ways: as a process tracing for real (its
SERVER span, then its CLIENT span, then human-interaction's), in this process with tracing on but no SERVER
span (the CLIENT span continues the caller's ``traceparent``), and with tracing off (the caller's context passes
unchanged). Spans arrive after the batch processor's delay: every check waits on its condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from journal_support import ALICE_INBOX, HUMAN_USERS, serve_journal, served_settings, write_tokens

from temporality_bus import Bus, NatsSettings
from temporality_embedded.processes import free_port
from temporality_testing.otlp_receiver import OtlpReceiver, ReceivedSpan
from temporality_testing.spans import spans_in_memory

pytestmark = pytest.mark.e2e  # two service processes (started together) and a real OTLP receiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = {"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01", "tracestate": "vendor=caller"}


@asynccontextmanager
async def _process(module: str, env: dict[str, str], workdir: Path) -> AsyncIterator[str]:
    """``python -m module`` with ``env`` until the block ends; yields the URL it serves once it is ready."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    ready = workdir / "ready"
    with (workdir / "log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            env={**os.environ, **env, "TEMPORALITY_READY_FILE": str(ready)},
            stdout=log,
            stderr=log,
        )
    try:
        async with asyncio.timeout(60):  # a process start on the shared, loaded machine
            while not await asyncio.to_thread(ready.exists):
                if proc.returncode is not None:
                    raise AssertionError(
                        f"{module} exited with {proc.returncode}: {(workdir / 'log').read_text()[-2000:]}"
                    )
                await asyncio.sleep(0.05)
        yield (await asyncio.to_thread(ready.read_text)).split()[1]
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _one(spans: list[ReceivedSpan], service: str, kind: str, name: str, parent: str | None) -> ReceivedSpan | None:
    found = [
        s
        for s in spans
        if (s.service, s.kind, s.name, s.trace_id) == (service, kind, name, TRACE_ID)
        and (parent is None or s.parent_span_id == parent)
    ]
    return found[0] if found else None


async def test_the_inbox_proxy_forwards_the_callers_trace_context_to_human_interaction(
    tmp_path: Path, nats_settings: NatsSettings, bus: Bus
) -> None:
    (tmp_path / "users.yaml").write_text(HUMAN_USERS, encoding="utf-8")
    tokens = write_tokens(tmp_path / "tokens.json")
    async with OtlpReceiver().serve() as otlp:
        human_port = free_port()
        human_url = f"http://127.0.0.1:{human_port}"
        human_env = otlp.env(
            TEMPORALITY_NATS_URL=nats_settings.url,
            TEMPORALITY_HUMAN_PORT=str(human_port),
            TEMPORALITY_HUMAN_USERS_FILE=str(tmp_path / "users.yaml"),
            TEMPORALITY_API_TOKENS_FILE=str(tokens),
        )
        # 1. The journal as a process, tracing for real: SERVER -> CLIENT -> human-interaction's SERVER.
        journal_env = otlp.env(
            TEMPORALITY_NATS_URL=nats_settings.url,
            TEMPORALITY_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'traced' / 'journal.db'}",
            TEMPORALITY_JOURNAL_PORT=str(free_port()),
            TEMPORALITY_API_TOKENS_FILE=str(tokens),
            TEMPORALITY_JOURNAL_HUMAN_URL=human_url,
        )
        async with contextlib.AsyncExitStack() as processes:
            # both start at once (the journal needs human-interaction only when it forwards)
            started = await asyncio.gather(
                processes.enter_async_context(_process("temporality_human_interaction", human_env, tmp_path / "human")),
                processes.enter_async_context(_process("temporality_journal", journal_env, tmp_path / "traced")),
                return_exceptions=True,  # both entered or failed before the stack may unwind
            )
            for outcome in started:
                if isinstance(outcome, BaseException):
                    raise outcome
            served_human, journal_url = started
            assert served_human == human_url
            async with httpx.AsyncClient(timeout=10) as http:
                answer = await http.get(f"{journal_url}/human/inbox", headers={**ALICE_INBOX, **CALLER})
                assert answer.status_code == 200, answer.text

                def chain(spans: list[ReceivedSpan]) -> bool:
                    server = _one(spans, "journal", "server", "GET /human/inbox", CALLER_SPAN)
                    client = server and _one(spans, "journal", "client", "GET /inbox", server.span_id)
                    return bool(client and _one(spans, "human-interaction", "server", "GET /inbox", client.span_id))

                spans = await otlp.wait_for(chain, what="journal server -> client -> human-interaction server")
                client = next(s for s in spans if (s.service, s.kind, s.trace_id) == ("journal", "client", TRACE_ID))
                assert client.attributes["http.request.method"] == "GET"
                assert client.attributes["url.template"] == "/inbox"
                assert client.attributes["http.response.status_code"] == 200
                assert client.attributes["server.port"] == httpx.URL(human_url).port

            # 2. and 3. The journal in this process (no SERVER span: no global tracer provider here).
            settings = served_settings(tmp_path, nats_settings, human_url=human_url)
            async with serve_journal(settings, bus) as journal, httpx.AsyncClient(base_url=journal.url) as http:
                with spans_in_memory() as exported:  # tracing on: the CLIENT span continues the caller's context
                    answer = await http.get("/human/inbox", headers={**ALICE_INBOX, **CALLER})
                    assert answer.status_code == 200, answer.text
                    (client_span,) = [s for s in exported.get_finished_spans() if s.name == "GET /inbox"]
                context = client_span.get_span_context()
                assert f"{context.trace_id:032x}" == TRACE_ID
                assert client_span.parent is not None
                assert f"{client_span.parent.span_id:016x}" == CALLER_SPAN
                mine = f"{context.span_id:016x}"
                await otlp.wait_for(
                    lambda spans: _one(spans, "human-interaction", "server", "GET /inbox", mine) is not None,
                    what="human-interaction's span, the child of the journal's in-process CLIENT span",
                )

                # tracing off: the caller's context reaches human-interaction unchanged (its parent: the caller)
                answer = await http.get("/human/inbox", headers={**ALICE_INBOX, **CALLER})
                assert answer.status_code == 200, answer.text
                await otlp.wait_for(
                    lambda spans: _one(spans, "human-interaction", "server", "GET /inbox", CALLER_SPAN) is not None,
                    what="human-interaction's span, the child of the caller's span",
                )
