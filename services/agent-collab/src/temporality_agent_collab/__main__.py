"""``temporality-agent-collab``: the saga projector and the get_collaborators responder, started by the runtime.

At SIGTERM the runtime unsubscribes the responder first (new requests go to other replicas), lets the
requests already received finish, then stops the consumer and drains the connection.
"""

from __future__ import annotations

from temporality_agent_collab.projector import Projector
from temporality_agent_collab.rpc import open_responder
from temporality_agent_collab.settings import Settings
from temporality_protocol.catalog import SERVICES
from temporality_service import Runtime, Setup, serve

__all__ = ["SPEC", "configure", "run"]

SPEC = SERVICES["agent-collab"]


def configure(settings: Settings) -> Setup[Settings]:
    async def setup(rt: Runtime[Settings]) -> None:
        projector = await Projector.open(rt.bus)
        rt.consumer("agent-collab-runs", handler=projector.handle, max_inflight=rt.settings.max_inflight)
        rt.responder(await open_responder(rt.bus, max_inflight=rt.settings.max_inflight))

    return setup


def run() -> None:
    serve(SPEC, Settings, configure)


if __name__ == "__main__":
    run()
