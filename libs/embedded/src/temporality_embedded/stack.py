"""The whole of Temporality on one machine: nats-server from the wheel, SQLite, five service processes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from temporality_embedded.natsserver import NatsServer
from temporality_embedded.processes import SERVICES, ServiceProcess

__all__ = ["Stack", "StackConfig"]

#: Stop order: intake first, the journal last (it records everyone's goodbyes).
_STOP_ORDER = ("trigger-gateway", "agent-collab", "run-executor", "human-interaction", "journal")


@dataclass
class StackConfig:
    data_dir: Path
    config_dir: Path
    gateway_port: int = 8080
    human_port: int = 8081
    journal_port: int = 8082
    nats_port: int = -1  # -1: a random free port
    database_url: str | None = None  # default: SQLite under data_dir
    log_format: str = "console"
    extra_env: Mapping[str, str] = field(default_factory=dict)


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.nats = NatsServer(self.data_dir / "nats", port=config.nats_port)
        self.services: dict[str, ServiceProcess] = {}

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.config.gateway_port}"

    @property
    def human_url(self) -> str:
        return f"http://127.0.0.1:{self.config.human_port}"

    @property
    def journal_url(self) -> str:
        return f"http://127.0.0.1:{self.config.journal_port}"

    @property
    def database_url(self) -> str:
        return self.config.database_url or f"sqlite+aiosqlite:///{self.data_dir / 'journal.db'}"

    def env_for(self, name: str) -> dict[str, str]:
        cfg = self.config.config_dir.resolve()
        env = {
            "TEMPORALITY_NATS_URL": self.nats.url,
            "TEMPORALITY_LOG_FORMAT": self.config.log_format,
        }
        env |= {
            "trigger-gateway": {
                "TEMPORALITY_GATEWAY_PORT": str(self.config.gateway_port),
                "TEMPORALITY_GATEWAY_TRIGGERS_FILE": str(cfg / "triggers.yaml"),
            },
            "human-interaction": {
                "TEMPORALITY_HUMAN_PORT": str(self.config.human_port),
                "TEMPORALITY_HUMAN_USERS_FILE": str(cfg / "users.yaml"),
            },
            "journal": {
                "TEMPORALITY_JOURNAL_PORT": str(self.config.journal_port),
                "TEMPORALITY_DATABASE_URL": self.database_url,
            },
            "run-executor": {"TEMPORALITY_EXECUTOR_AGENTS_FILE": str(cfg / "agents.yaml")},
            "agent-collab": {},
        }[name]
        return env | dict(self.config.extra_env)

    def start(self, timeout: float = 60.0) -> None:
        self.nats.start()
        try:
            for name in SERVICES:
                process = ServiceProcess(name, self.env_for(name), self.data_dir / "run", cwd=self.data_dir)
                self.services[name] = process
                process.start()
            for process in self.services.values():
                process.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def restart(self, name: str, timeout: float = 30.0, **extra_env: str) -> ServiceProcess:
        """Start ``name`` again (after a kill -9 or a stop), optionally with changed environment."""
        old = self.services[name]
        old.terminate()
        process = ServiceProcess(name, {**self.env_for(name), **extra_env}, self.data_dir / "run", cwd=self.data_dir)
        self.services[name] = process
        process.start()
        process.wait_ready(timeout)
        return process

    def stop(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for name in _STOP_ORDER:
            if name in self.services:
                codes[name] = self.services[name].terminate()
        self.nats.stop()
        return codes

    def dead(self) -> list[str]:
        return [name for name, p in self.services.items() if not p.alive()]
