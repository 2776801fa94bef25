"""Real test peers for Temporality (dev only)."""

from temporality_embedded.natsserver import NatsServer, nats_server_binary
from temporality_embedded.processes import ServiceProcess, free_port

__all__ = ["NatsServer", "ServiceProcess", "free_port", "nats_server_binary"]
