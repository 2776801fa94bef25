"""Real test peers for Temporality (dev only)."""

from temporality_testing.natsserver import NatsServer, nats_server_binary

__all__ = ["NatsServer", "nats_server_binary"]
