"""Real test peers for Temporality (dev only).

The names below are imported on first use (PEP 562): ``temporality_testing.modules``, which the root conftest
reads in every pytest process, does not pull in the service stack with them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from temporality_embedded.natsserver import NatsServer, nats_server_binary
    from temporality_embedded.processes import ServiceProcess, free_port

__all__ = ["NatsServer", "ServiceProcess", "free_port", "nats_server_binary"]

_WHERE = {
    "NatsServer": "temporality_embedded.natsserver",
    "nats_server_binary": "temporality_embedded.natsserver",
    "ServiceProcess": "temporality_embedded.processes",
    "free_port": "temporality_embedded.processes",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
