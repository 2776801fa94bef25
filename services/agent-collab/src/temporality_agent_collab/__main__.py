"""``temporality-agent-collab``: the saga projector, the get_collaborators responder, the ask router
(asks, replies, relay runs, wait timeouts) and the registry of external agents (register, heartbeat,
deregister, list, conformance; liveness and conformance timers) with the hosted agents' cards, and the
external agents' tasks (:mod:`temporality_agent_collab.tasks`), started by the runtime. With
``TEMPORALITY_COLLAB_PORT`` set it also serves the operator API (:mod:`temporality_agent_collab.api`) next to ``/healthz`` and ``/readyz``.

At SIGTERM the runtime unsubscribes the responder first (new requests go to other replicas), lets the
requests already received finish, then stops the consumer and drains the connection.
"""

from __future__ import annotations

import structlog

from temporality_agent_collab.agents import AgentRegistry
from temporality_agent_collab.api import create_app
from temporality_agent_collab.external import load_allow_list
from temporality_agent_collab.policy import record_policy_changes
from temporality_agent_collab.projector import Projector
from temporality_agent_collab.router import AskRouter
from temporality_agent_collab.rpc import open_responder
from temporality_agent_collab.settings import Settings
from temporality_agent_collab.signing import ReplyKey, load_private_key, public_key_text
from temporality_agent_collab.tasks import TaskBoard
from temporality_agent_collab.throttle import Throttle
from temporality_bus import Delivery
from temporality_protocol import Envelope
from temporality_protocol.catalog import SERVICES
from temporality_service import ApiAuth, ConfigError, Runtime, Setup, TokenFileError, serve

__all__ = ["SPEC", "configure", "run"]

SPEC = SERVICES["agent-collab"]
log = structlog.get_logger(__name__)


def configure(settings: Settings) -> Setup[Settings]:
    """Reads the allow-list of external agents and, when the operator API is served, the API tokens (a
    ConfigError -- exit 2 -- when either is unusable)."""
    allow_list = load_allow_list(settings.external_agents_file)
    reply_key = _reply_key(settings)
    auth: ApiAuth | None = None
    if settings.port is not None:
        try:
            auth = ApiAuth.from_settings(settings.api)
        except TokenFileError as exc:
            raise ConfigError(f"TEMPORALITY_API_TOKENS_FILE: {exc}") from exc

    async def setup(rt: Runtime[Settings]) -> None:
        projector = await Projector.open(rt.bus)
        router = await AskRouter.open(rt.bus)
        limited = (
            rt.metrics.counter(
                "temporality_collab_agent_requests_limited_total",
                "Agent Protocol requests refused rate_limited (over their agent's rate limit)",
                ["operation"],
            )
            if rt.metrics is not None
            else None
        )
        throttle = Throttle(
            rt.bus,
            rate_per_s=rt.settings.agent_rate_per_s,
            burst=rt.settings.agent_rate_burst,
            window_s=rt.settings.audit_window_s,
            refusals_journaled=rt.settings.refusals_journaled,
            limited_counter=limited,
        )
        await rt.resources.enter_async_context(throttle.running())  # the last totals go out before the drain
        registry = await AgentRegistry.open(
            rt.bus,
            allow_list,
            grace_s=rt.settings.heartbeat_grace_s,
            signature_window_s=rt.settings.signature_window_s,
            conformance_timeout_s=rt.settings.conformance_timeout_s,
            reply_key=reply_key,
            coalesce_s=rt.settings.lifecycle_coalesce_s,
            throttle=throttle,
        )

        # the allow-list's changes since the last start, on record (AP-11) before any tool call is checked by it
        await record_policy_changes(rt.bus, allow_list, settings.external_agents_file)
        tasks = await TaskBoard.open(rt.bus, registry.gate, allow_list)  # external agents' tasks (AP-5, AP-7..AP-9)
        await tasks.announce_actions()  # actions a dead agent-collab stored but never announced: wake their runs

        async def runs(event: Envelope, delivery: Delivery) -> None:
            await projector.handle(event, delivery)
            await tasks.on_run_event(event)  # a run that ended ends its external agent's task
            await registry.hosted.on_run_event(event)  # run.started: the hosted agent's card (PRO-2)
            await router.on_run_event(event, delivery)  # a relay run that ended: did it answer?

        rt.consumer("agent-collab-runs", handler=runs, max_inflight=rt.settings.max_inflight)
        rt.consumer(
            "agent-collab-asks",
            handler=router.handle,
            max_inflight=rt.settings.max_inflight,
            on_dead_letter=router.on_dead_letter,
        )
        rt.consumer("agent-collab-ask-timers", raw_handler=router.handle_timer)
        rt.responder(await open_responder(rt.bus, max_inflight=rt.settings.max_inflight))
        rt.consumer("agent-collab-heartbeats", raw_handler=registry.handle_timer)
        rt.consumer("agent-collab-conformance", raw_handler=registry.handle_conformance_timer)
        rt.consumer("agent-collab-tasks", handler=tasks.on_offered, max_inflight=rt.settings.max_inflight)
        for responder in [
            *registry.responders(max_inflight=rt.settings.max_inflight),
            *tasks.responders(max_inflight=rt.settings.max_inflight),
        ]:
            rt.responder(responder)
        if auth is not None:
            rt.http(create_app(registry, auth))

    return setup


def _reply_key(settings: Settings) -> ReplyKey | None:
    """The key that signs replies to external agents (``TEMPORALITY_COLLAB_REPLY_KEY_FILE``); ConfigError when
    the file cannot be read or holds no Ed25519 private key."""
    path = settings.reply_key_file
    if path is None:
        log.warning("external_agents.replies_unsigned", setting="TEMPORALITY_COLLAB_REPLY_KEY_FILE")
        return None
    try:
        key = load_private_key(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"cannot read TEMPORALITY_COLLAB_REPLY_KEY_FILE {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"TEMPORALITY_COLLAB_REPLY_KEY_FILE {path}: {exc}") from exc
    log.info(
        "external_agents.replies_signed", key_id=settings.reply_key_id, public_key=public_key_text(key.public_key())
    )
    return ReplyKey(key_id=settings.reply_key_id, key=key)


def run() -> None:
    serve(SPEC, Settings, configure)


if __name__ == "__main__":
    run()
