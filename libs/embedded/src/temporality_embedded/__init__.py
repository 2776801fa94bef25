"""The embedded Temporality: one command runs nats-server, SQLite and every service of the catalogue."""

from temporality_embedded.natsserver import ClusterNode, LocalCluster, NatsServer, nats_server_binary
from temporality_embedded.processes import SERVICES, ServiceProcess, free_port
from temporality_embedded.stack import Stack, StackConfig

__all__ = [
    "SERVICES",
    "ClusterNode",
    "LocalCluster",
    "NatsServer",
    "ServiceProcess",
    "Stack",
    "StackConfig",
    "free_port",
    "nats_server_binary",
]
