"""``temporality-trigger-gateway``: the triggers file seeds the trigger store, every replica watches it and
serves its webhooks and the ``/triggers`` admin API, started by the service runtime.

configure (nothing connected yet; exit 2 on any problem): the API tokens file, the agent cards' ids (re-read
while serving when the file changes: :mod:`.agents`), the triggers file validated against them. setup: open the ``trigger-definitions`` bucket, seed it with the
file's triggers (create-if-absent: several replicas may start at once, one wins each id and journals
``trigger.created``), load the whole store and watch it (``/readyz`` requires the watch; each change arms
or cancels a schedule trigger's next tick; a failed one is retried, and every ``schedule_check_s`` each enabled
schedule trigger is checked for a pending tick), consume fired ticks (``trigger-gateway-schedules``), the
system's own events for the event triggers and the concurrency keys (``trigger-gateway-events``, pulled
only while an enabled event trigger or a concurrency key needs it: :mod:`.ondemand`) and the ends of
debounce windows (``trigger-gateway-debounce``), serve.

In the service's own process the runtime freezes what the start made out of the cyclic garbage collector once
``setup`` is done (``temporality_service.runtime.run_until``'s ``freeze_heap``): full collections under load
no longer walk it (docs/triggers.md, *Intake speed*).
"""

from __future__ import annotations

import os

import structlog

from temporality_bus import Delivery
from temporality_protocol import TriggerCreated, derive_id, make_event
from temporality_protocol.catalog import CONSUMERS, SERVICES
from temporality_service import ApiAuth, ConfigError, Runtime, Setup, TokenFileError, serve
from temporality_trigger_gateway.agents import AgentCards
from temporality_trigger_gateway.api import create_app
from temporality_trigger_gateway.behind import WriteBehind
from temporality_trigger_gateway.errors import TriggerConfigError
from temporality_trigger_gateway.events import EventTriggers, journal_needed
from temporality_trigger_gateway.launch import Launcher
from temporality_trigger_gateway.ondemand import OnDemandConsumer
from temporality_trigger_gateway.schedule import Scheduler
from temporality_trigger_gateway.settings import Settings
from temporality_trigger_gateway.store import TriggerRegistry, TriggerStore
from temporality_trigger_gateway.triggers import TriggerConfig, parse_triggers, read_triggers_file

__all__ = ["SPEC", "configure", "run"]

SPEC = SERVICES["trigger-gateway"]
SOURCE = "/temporality/trigger-gateway"
#: The consumer of the event triggers and the concurrency keys' releases; pulls only while needed.
EVENTS_CONSUMER = "trigger-gateway-events"

log = structlog.get_logger(__name__)


def configure(settings: Settings) -> Setup[Settings]:
    """Read the tokens, agents and triggers files before anything connects (an unusable one exits 2)."""
    try:
        auth = ApiAuth.from_settings(settings.api)
    except TokenFileError as exc:
        raise ConfigError(str(exc)) from exc
    agents_file = settings.agents_file or settings.triggers_file.parent / "agents.yaml"
    agents: frozenset[str] | None = None
    cards: AgentCards | None = None
    try:
        if settings.agents_file is not None or agents_file.exists():
            cards = AgentCards(agents_file)  # re-read when it changes (a new card needs no gateway restart)
            agents = cards.current()
        raw = read_triggers_file(settings.triggers_file)
        triggers = parse_triggers(raw, source=str(settings.triggers_file), agents=agents)
    except TriggerConfigError as exc:
        raise ConfigError(str(exc)) from exc
    if agents is None:
        log.warning("triggers.agents_not_checked", agents_file=str(agents_file), reason="no agent cards file")
    specs = [spec for spec in raw["triggers"] if any(spec.get("id") == t.id for t in triggers)]
    seeded_by = f"file:{settings.triggers_file}"

    async def setup(rt: Runtime[Settings]) -> None:
        store = await TriggerStore.open(rt.bus)
        for trigger_id, revision in await store.seed(specs, by=seeded_by):
            trigger = next(t for t in triggers if t.id == trigger_id)
            change = TriggerCreated(
                trigger_id=trigger_id,
                revision=revision,
                changed_by=seeded_by,
                trigger_type=trigger.type,
                agent=trigger.agent,
                enabled=trigger.enabled,
            )
            event_id = derive_id("evt", "trigger", trigger_id, str(revision), change.EVENT_TYPE)
            await rt.bus.publish(make_event(change, source=SOURCE, id=event_id, correlation_id=trigger_id))
            log.info("trigger.seeded", trigger_id=trigger_id, revision=revision)
        registry = TriggerRegistry(environ=os.environ, agents=agents)
        if cards is not None:
            await rt.resources.enter_async_context(cards.kept_current(registry))
        # The writes queued behind the last answers (claims' marks, delivery records) go out before the bus drains.
        rt.resources.push_async_callback(WriteBehind.of(rt.bus).settled)
        launcher = Launcher(rt.bus, retry_after_s=rt.settings.retry_after_s, claim_lease_s=rt.settings.claim_lease_s)
        scheduler = Scheduler(rt.bus, registry, launcher=launcher)
        event_triggers = EventTriggers(registry, launcher, store=store, max_depth=rt.settings.event_max_depth)
        # The journal is read only while an enabled event trigger or a concurrency key needs it (TRG-6).
        journal = OnDemandConsumer(
            rt.bus, CONSUMERS[EVENTS_CONSUMER], handler=event_triggers.handle, observer=rt.metrics
        )

        def follow_registry() -> None:
            why = journal_needed(registry.all())
            journal.want(why is not None, why=why or "no enabled event trigger and no concurrency key")

        async def changed(trigger_id: str, trigger: TriggerConfig | None, revision: int) -> None:
            follow_registry()
            await scheduler.on_change(trigger_id, trigger, revision)  # arm / cancel a schedule's next tick

        registry.on_change = changed
        await rt.resources.enter_async_context(registry.watching(store))
        # failed arms retried, and every enabled schedule trigger checked for a pending tick (docs/triggers.md)
        await rt.resources.enter_async_context(scheduler.keeping_armed(rt.settings.schedule_check_s))
        follow_registry()
        rt.consumer("trigger-gateway-schedules", raw_handler=scheduler.handle)
        rt.consumers.append(journal)  # the runtime runs it like its own consumers (rt.consumer builds plain ones)
        rt.readiness.watch_consumer(journal)

        async def debounce_ended(data: bytes, delivery: Delivery) -> None:
            await launcher.flow.fire(data, registry.get)

        rt.consumer("trigger-gateway-debounce", raw_handler=debounce_ended)
        rt.ready_check("trigger-store", registry.check)
        app = create_app(rt.settings, rt.bus, registry, store=store, auth=auth)
        # Deliveries answered 503 for a stalled bus whose handling goes on finish first (then the write-behind).
        rt.resources.push_async_callback(app.state.intake.drain)
        rt.http(app)

    return setup


def run() -> None:
    serve(SPEC, Settings, configure)


if __name__ == "__main__":
    run()
