"""run-executor: settings -> logging -> connect -> consume -> drain."""

from __future__ import annotations

import asyncio
import sys

import structlog

from temporality_bus import Bus, Consumer, configure_logging, mark_ready, stop_on_signals
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS, CONSUMERS
from temporality_run_executor.agents import AgentsFileError, load_agents
from temporality_run_executor.engine import Engine
from temporality_run_executor.providers.factory import ProviderCache, ProviderConfigError
from temporality_run_executor.settings import Settings

NAME = "run-executor"
log = structlog.get_logger(NAME)


async def main() -> int:
    settings = Settings()
    configure_logging(settings.log, service=NAME)
    providers = ProviderCache(scripted_think_s=settings.scripted_think_s)
    try:
        agents = load_agents(settings.agents_file)
        providers.validate(agents.cards())
    except (AgentsFileError, ProviderConfigError) as exc:
        log.error("config.invalid", error=str(exc))
        return 2
    requests_spec = CONSUMERS["run-executor-requests"]
    human_spec = CONSUMERS["run-executor-human"]
    try:
        async with Bus.connect(settings.nats, name=NAME) as bus:
            await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
            engine = await Engine.open(bus, agents, providers, max_deliver=requests_spec.max_deliver)
            stop = stop_on_signals()
            consumers = [
                Consumer(bus, requests_spec, handler=engine.on_run_requested, max_inflight=settings.max_inflight),
                Consumer(bus, human_spec, handler=engine.on_human_event, max_inflight=settings.max_inflight),
            ]
            async with asyncio.TaskGroup() as tg:
                for consumer in consumers:
                    tg.create_task(consumer.run(stop))
                mark_ready(settings.process.ready_file)
                log.info("service.ready", agents=len(agents))
    finally:
        await providers.aclose()
    log.info("service.stopped")
    return 0


def run() -> None:
    sys.exit(asyncio.run(main()))


if __name__ == "__main__":
    run()
