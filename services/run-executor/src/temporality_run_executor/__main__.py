"""``temporality-run-executor``: agent cards and providers, then the run consumers, started by the service runtime.

The MCP client (:mod:`temporality_run_executor.mcp_servers`, the ``mcp`` SDK: about a third of the process's
import time) is imported only when a card names MCP servers.

In the service's own process the runtime freezes what the start made out of the cyclic garbage collector once
``setup`` is done (``temporality_service.runtime.run_until``'s ``freeze_heap``): full collections while runs
are driven no longer walk it (bench/README.md, ``parked_runs.py``).
"""

from __future__ import annotations

import asyncio
import difflib
import gc
import sys
from collections.abc import Callable
from pathlib import Path

import structlog
from pydantic import ValidationError

from temporality_protocol.catalog import CONSUMERS, SERVICES
from temporality_protocol.redaction import PatternError, redactor_from_json
from temporality_run_executor.agents import AgentCard, AgentsFileError, load_agents
from temporality_run_executor.api import create_app
from temporality_run_executor.engine import Engine
from temporality_run_executor.providers.factory import ProviderCache, ProviderConfigError
from temporality_run_executor.settings import Settings
from temporality_run_executor.tools import BUILTIN_TOOLS, Tool, ToolRegistry
from temporality_service import ApiAuth, ConfigError, LogSettings, Runtime, Setup, TokenFileError, serve
from temporality_service.cli import check_arguments
from temporality_service.logs import configure_logging

__all__ = ["SPEC", "configure", "run"]

SPEC = SERVICES["run-executor"]
log = structlog.get_logger(__name__)


def configure(settings: Settings) -> Setup[Settings]:
    """Load and check the agent cards and their providers before anything connects (invalid: exit 2)."""
    providers = ProviderCache(scripted_think_s=settings.scripted_think_s, scripted_crash_on=settings.scripted_crash_on)
    try:
        agents = load_agents(settings.agents_file)
        providers.validate([c for c in agents.cards() if c.provider.kind != "external"])  # external: no provider
    except AgentsFileError as exc:
        raise ConfigError(str(exc)) from exc
    except ProviderConfigError as exc:
        raise ConfigError(f"{settings.agents_file}: {exc}") from exc
    tools = ToolRegistry(BUILTIN_TOOLS)
    for card in agents.cards():
        servers = _mcp_tool_prefixes(card)  # the servers' tools are listed in setup
        unknown = [name for name in tools.unknown(card.tools) if not name.startswith(servers)]
        if unknown:
            raise ConfigError(
                f"{settings.agents_file}: agent {card.id}: tools names unknown tools {unknown} "
                f"(known: {', '.join(tools.names())}){_hints(card, unknown, tools.names())}"
            )
        # a pattern no built-in tool matches and no server of the card could list a match for (`gh__*`, no `gh`)
        never = tools.unmatched(card.tools, servers)
        if never:
            named = ", ".join(server.name for server in card.mcp_servers) or "none"
            raise ConfigError(
                f"{settings.agents_file}: agent {card.id}: tools patterns {never} can match no tool: no built-in "
                f"tool matches them and the card has no MCP server whose tools (named <server>__<tool>) they "
                f"could match (its mcp_servers: {named}; built-in tools: {', '.join(tools.names())})"
                f"{_hints(card, never, tools.names())}"
            )
    log.info("agents.loaded", agents=len(agents), file=str(settings.agents_file))
    try:  # the cards' API, on the probe port when there is one
        auth = ApiAuth.from_settings(settings.api) if settings.port is not None else None
    except TokenFileError as exc:
        raise ConfigError(str(exc)) from exc
    if settings.scripted_crash_on is not None:
        log.warning("scripted.crash_on_configured", text=settings.scripted_crash_on)
    try:  # the redaction patterns every human.requested passes through (SEC-1): unusable ones stop the start
        redactor = redactor_from_json(settings.redact_patterns)
    except PatternError as exc:
        raise ConfigError(str(exc)) from exc

    async def setup(rt: Runtime[Settings]) -> None:
        rt.resources.push_async_callback(providers.aclose)
        with_mcp = [card for card in agents.cards() if card.mcp_servers]
        mcp = await _mcp_card_tools(rt, with_mcp, tools, settings.agents_file) if with_mcp else None
        card_tools = mcp[0] if mcp is not None else {}
        max_deliver = rt.settings.max_deliver or CONSUMERS["run-executor-requests"].max_deliver
        engine = await Engine.open(
            rt.bus,
            agents,
            providers,
            max_deliver=max_deliver,
            watchdog_grace_s=rt.settings.watchdog_grace_s,
            checkpoint_retention_s=rt.settings.checkpoint_retention_s,
            tools=tools,
            card_tools=card_tools,
            redactor=redactor,
        )
        if mcp is not None:
            mcp[1](engine)  # a server not listed at start: listed again, its tools then the engine's
        if auth is not None:
            rt.http(create_app(agents, lambda card: engine.registry(card).offered(card.tools), auth))
        inflight = rt.settings.max_inflight
        # a run whose message is given up on fails visibly (infrastructure_error) before it is dead-lettered
        for durable, handler in (
            ("run-executor-requests", engine.on_run_requested),
            ("run-executor-human", engine.on_human_event),
            ("run-executor-agents", engine.on_agent_event),
        ):
            rt.consumer(
                durable,
                handler=handler,
                max_inflight=inflight,
                max_deliver=max_deliver,
                on_dead_letter=engine.on_dead_letter,
            )
        rt.consumer("run-executor-watchdog", raw_handler=engine.on_watchdog, max_inflight=inflight)
        # finished runs' checkpoints removed once their retention ends (the records stay)
        rt.consumer("run-executor-retention", raw_handler=engine.on_retention, max_inflight=inflight)

    return setup


def _meant(card: AgentCard, entry: str, names: list[str]) -> list[str]:
    """What a ``tools`` entry that names no tool could have meant: the closest of ``names`` (``ask_humn`` ->
    ``ask_human``), then the entry under each of the card's MCP servers' prefixes (``delete_note`` ->
    ``notes__delete_note``) or under the server whose name is closest to the one it gives (``note__delete_note`` ->
    ``notes__delete_note``)."""
    meant = difflib.get_close_matches(entry, names, n=1)
    servers = [server.name for server in card.mcp_servers]
    server, sep, rest = entry.partition("__")
    if sep:
        meant += [f"{match}__{rest}" for match in difflib.get_close_matches(server, servers, n=1)]
    else:
        meant += [f"{name}__{entry}" for name in servers]
    return list(dict.fromkeys(meant))


def _hints(card: AgentCard, entries: list[str], names: list[str]) -> str:
    """For each of ``entries`` that names no tool (:func:`_meant`): where it is, what a deny of it does, and what
    it could have meant; ``""`` when there is nothing to say."""
    hints = []
    for entry in entries:
        where = "tools.deny" if entry in card.tools.deny and entry not in card.tools.allow else "tools.allow"
        hint = f"{entry!r} in {where}"
        if where == "tools.deny":
            hint += " denies nothing, so the tool it was meant to deny would be allowed"
        meant = _meant(card, entry, names)
        hints.append(f"{hint}: did you mean {' or '.join(meant)}?" if meant else hint)
    return "".join(f"; {hint}" for hint in hints)


def _mcp_tool_prefixes(card: AgentCard) -> tuple[str, ...]:
    """The name prefix of each MCP server's tools on ``card`` (none: the mcp SDK is not imported)."""
    if not card.mcp_servers:
        return ()
    from temporality_run_executor.mcp_servers import tool_name  # the mcp SDK, only when a card uses it

    return tuple(tool_name(server.name, "") for server in card.mcp_servers)


async def _mcp_card_tools(
    rt: Runtime[Settings], cards: list[AgentCard], tools: ToolRegistry, agents_file: Path
) -> tuple[dict[str, list[Tool]], Callable[[Engine], None]]:
    """Start the MCP pool (stopped with the runtime's resources) and list each card's servers' tools; with them, what
    starts listing again, once the engine exists, the servers that could not be listed now.

    A server that cannot be listed does not stop the executor (one flaky server would crash-loop every agent): its
    tools that the card names exactly get stand-ins whose calls fail (``tool.failed``, saying why), ``/readyz`` says
    the executor is not ready while any server is unlisted, and each is listed again with a backoff until its tools
    replace the stand-ins. A plain name in ``tools.allow`` that a *listed* server does not have still stops it (exit
    2: the file, the agent, the names and what the servers list); one in ``tools.deny`` under a server's prefix
    (``notes__delete_note``) is only logged (``agents.denied_tool_not_listed``: it denies nothing now, and the tool
    if a later version of the server adds it), and so is a pattern that matches none of the listed tools
    (``agents.tool_pattern_matches_nothing``). A ``deny`` name under no server's prefix (``delete_note``) never gets
    here: :func:`configure` refuses it (it could never deny anything, so the tool it was meant to deny is allowed)."""
    from temporality_run_executor.mcp_servers import (
        CardTools,
        McpPool,
        McpToolFailed,
        list_server_tools,
        relist,
        tool_name,
    )

    mcp = McpPool(idle_s=rt.settings.mcp_idle_s, max_calls=rt.settings.mcp_max_calls)
    rt.resources.push_async_callback(mcp.aclose)  # stops every MCP server at shutdown
    known = CardTools()
    for card in cards:
        for server in card.mcp_servers:
            try:
                known.listed(card, server, await list_server_tools(card, server, mcp))
            except McpToolFailed as exc:
                log.error("mcp.listing_failed", agent=card.id, server=server.name, error=str(exc), retry_in_s=1.0)
                known.failed(card, server, str(exc))
        waiting = tuple(tool_name(s.name, "") for s in card.mcp_servers if (card.id, s.name) in known.unlisted)
        # (a name of a server not listed yet has its stand-in; "x".startswith(()) is False)
        registry = tools.with_tools(known.of(card))
        unknown = [n for n in registry.unknown(card.tools) if not n.startswith(waiting)]
        for name in [n for n in unknown if n not in card.tools.allow]:
            # a deny of a tool the server does not have denies nothing and harms nothing (a later version of the
            # server may add it: then it is denied): only said
            log.warning("agents.denied_tool_not_listed", file=str(agents_file), agent=card.id, tool=name)
        promised = [n for n in unknown if n in card.tools.allow]
        if promised:  # the card's promise of a tool the model will have: not kept, so the executor does not start
            listed = ", ".join(sorted(tool.name for tool in known.of(card))) or "none"
            raise ConfigError(
                f"{agents_file}: agent {card.id}: tools.allow names {', '.join(promised)}, which its MCP servers do "
                f"not list (their tools: {listed}); fix the name or remove it"
            )
        for pattern in tools.with_tools(known.of(card)).unmatched(card.tools, waiting):
            # not refused: a server's tools change with its version (the plain names above are the card's promise)
            log.warning("agents.tool_pattern_matches_nothing", agent=card.id, pattern=pattern)
    card_tools = {card.id: known.of(card) for card in cards}

    async def unlisted() -> None:
        problem = known.problem()
        if problem is not None:
            raise RuntimeError(f"not listed yet (listed again with a backoff): {problem}")

    rt.ready_check("mcp servers", unlisted)

    def start_relisting(engine: Engine) -> None:
        by_id = {card.id: card for card in cards}
        tasks = [
            asyncio.create_task(
                relist(by_id[agent], server, mcp, known, lambda c: engine.set_card_tools(c.id, known.of(c))),
                name=f"mcp-relist-{agent}-{name}",
            )
            for (agent, name) in list(known.unlisted)
            for server in by_id[agent].mcp_servers
            if server.name == name
        ]

        async def stop() -> None:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        rt.resources.push_async_callback(stop)  # before the pool closes (callbacks run in reverse)

    return card_tools, start_relisting


#: The cyclic collector's thresholds in the service's process (Python's default: 700, 10, 10). A young collection
#: walks every container object allocated since the last one and still alive -- with 64 runs driven at once,
#: their records, checkpoints and in-flight futures -- and each tenth one also the older survivors: at the
#: default, ~0.25 ms of CPU per resumed run (~12 % of the executor's, measured with ``gc.callbacks`` under
#: bench/parked_runs.py). Every 10,000 allocations instead of 700: the same garbage is found, later.
GC_THRESHOLDS = (10_000, 10, 10)


#: The console script's own commands (``temporality-run-executor --help`` lists them).
COMMANDS = {
    "check-agents": "check the agent cards file (TEMPORALITY_EXECUTOR_AGENTS_FILE, or the PATH after the command) as "
    "the executor does at its start, without connecting to or starting anything (MCP servers are not started); "
    "exit 0 when the executor would start, 1 with the same message it would stop with",
}


def check_agents_main(path: Path | None = None) -> int:
    """``temporality-run-executor check-agents [PATH]``: :func:`configure` alone (what the executor checks before
    it connects), its :class:`ConfigError` printed as the executor logs it (``config.invalid``): 0 or 1."""
    try:
        settings = Settings() if path is None else Settings(agents_file=path)
    except ValidationError as exc:
        sys.stderr.write(f"error: the executor's settings are invalid: {exc}\n")
        return 2
    # what configure says on the way (agents.sandbox_env_unset, ...) on stderr; its info lines are not news here
    configure_logging(LogSettings.model_construct(level="warning", format=settings.log.format), service=SPEC.name)
    try:
        configure(settings)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    cards = load_agents(settings.agents_file).cards()
    servers = sum(len(card.mcp_servers) for card in cards)
    sys.stdout.write(
        f"{settings.agents_file}: {len(cards)} agent card(s) valid: {', '.join(card.id for card in cards) or 'none'}\n"
    )
    if servers:
        sys.stdout.write(
            f"not checked: the tools of {servers} MCP server(s) (the executor lists them when it starts; a "
            "tools.allow name a server does not list stops it then)\n"
        )
    return 0


def run() -> None:
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "check-agents":  # the command with an argument (the service CLI takes none)
        if args[1] in ("-h", "--help"):
            sys.stdout.write(f"usage: temporality-run-executor check-agents [PATH]\n\n{COMMANDS['check-agents']}\n")
            sys.exit(0)
        sys.exit(check_agents_main(Path(args[1])))
    if check_arguments(SPEC, Settings, commands=COMMANDS) == "check-agents":
        sys.exit(check_agents_main())
    gc.set_threshold(*GC_THRESHOLDS)  # this process only (the tests run the service in theirs through run_until)
    serve(SPEC, Settings, configure)


if __name__ == "__main__":
    run()
