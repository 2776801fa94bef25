"""``temporality-run-executor``: agent cards and providers, then the run consumers, started by the service runtime."""

from __future__ import annotations

import structlog

from temporality_protocol.catalog import CONSUMERS, SERVICES
from temporality_run_executor.agents import AgentsFileError, load_agents
from temporality_run_executor.engine import Engine
from temporality_run_executor.providers.factory import ProviderCache, ProviderConfigError
from temporality_run_executor.settings import Settings
from temporality_service import ConfigError, Runtime, Setup, serve

__all__ = ["SPEC", "configure", "run"]

SPEC = SERVICES["run-executor"]
log = structlog.get_logger(__name__)


def configure(settings: Settings) -> Setup[Settings]:
    """Load and check the agent cards and their providers before anything connects (invalid: exit 2)."""
    providers = ProviderCache(scripted_think_s=settings.scripted_think_s)
    try:
        agents = load_agents(settings.agents_file)
        providers.validate(agents.cards())
    except (AgentsFileError, ProviderConfigError) as exc:
        raise ConfigError(str(exc)) from exc
    log.info("agents.loaded", agents=len(agents), file=str(settings.agents_file))

    async def setup(rt: Runtime[Settings]) -> None:
        rt.resources.push_async_callback(providers.aclose)
        requests = CONSUMERS["run-executor-requests"]
        engine = await Engine.open(rt.bus, agents, providers, max_deliver=requests.max_deliver)
        inflight = rt.settings.max_inflight
        rt.consumer("run-executor-requests", handler=engine.on_run_requested, max_inflight=inflight)
        rt.consumer("run-executor-human", handler=engine.on_human_event, max_inflight=inflight)

    return setup


def run() -> None:
    serve(SPEC, Settings, configure)


if __name__ == "__main__":
    run()
