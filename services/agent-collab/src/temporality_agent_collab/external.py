"""The allow-list of external agents (AP-3, AP-11): who may register with agent-collab, and on what terms.

Read once at start from ``TEMPORALITY_COLLAB_EXTERNAL_AGENTS_FILE`` (``config/external-agents.yaml``)::

    heartbeat_interval_s: 10          # default for every agent below
    agents:
      - id: triage-bot                # the agent_id it registers with
        description: Sorts incoming issues
        protocol_versions: ["1.0"]    # the versions agent-collab speaks with it (PRO-3)
        allowed_tools: [get_input]    # of the tools it supports, those it may use
        limits: {max_context_size: 128000, max_concurrent_tasks: 1}
        heartbeat_interval_s: 5       # optional override
        public_key: 0KRdcBwYgHm1fAJv4uY7oQ2Bq8kqJ3xJpN1wXfQ8bW4=   # Ed25519, raw 32 bytes in base64, or PEM
      - id: dev-bot
        allow_unsigned: true          # development only: its messages need no signature

An agent not listed is refused (``unknown_agent``, journaled). Every message an agent sends must be
signed with the private key of its ``public_key`` (AP-11, :mod:`temporality_agent_collab.signing`); an
agent with no ``public_key`` is refused unless ``allow_unsigned: true`` marks it (never both). A key
that cannot be read is a :class:`ConfigError` naming the agent. The file holds public keys only: it is
policy, not a secret.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import structlog
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from temporality_agent_collab.signing import Keyring, load_public_key
from temporality_protocol import SUPPORTED_VERSIONS
from temporality_protocol.events import ExternalAgentId
from temporality_protocol.version import parse_version
from temporality_service import ConfigError

__all__ = ["DEFAULT_FILE", "AllowList", "ExternalAgent", "ExternalLimits", "load_allow_list"]

log = structlog.get_logger(__name__)

#: Where the allow-list is read from when the setting is unset (and the file exists).
DEFAULT_FILE = Path("config/external-agents.yaml")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExternalLimits(_Strict):
    #: The most context the agent is granted; unset: what it declares.
    max_context_size: Annotated[int, Field(gt=0)] | None = None
    max_concurrent_tasks: Annotated[int, Field(gt=0)] = 1


class ExternalAgent(_Strict):
    """One allowed external agent."""

    id: ExternalAgentId
    description: str = ""
    protocol_versions: list[str] = Field(default_factory=lambda: list(SUPPORTED_VERSIONS), min_length=1)
    allowed_tools: list[str] = Field(default_factory=list)
    limits: ExternalLimits = Field(default_factory=ExternalLimits)
    heartbeat_interval_s: Annotated[float, Field(gt=0)] | None = None
    #: Its Ed25519 public key (raw 32 bytes in base64, or PEM): every message it sends is verified with it.
    public_key: str | None = None
    #: Accept its messages unsigned (development only; only for an agent without a ``public_key``).
    allow_unsigned: bool = False

    @model_validator(mode="after")
    def _key_readable(self) -> ExternalAgent:
        if self.public_key is not None:
            try:
                load_public_key(self.public_key)
            except ValueError as exc:
                raise ValueError(f"public_key of agent {self.id!r} is not an Ed25519 public key: {exc}") from None
            if self.allow_unsigned:
                raise ValueError(f"agent {self.id!r} has a public_key and allow_unsigned: choose one")
        return self

    @field_validator("protocol_versions")
    @classmethod
    def _versions_parse(cls, versions: list[str]) -> list[str]:
        for version in versions:
            parse_version(version)  # ValueError: MAJOR.MINOR
        return versions

    def speakable_versions(self) -> list[str]:
        """The versions it is allowed that this code also speaks (empty: every registration is refused)."""
        return [v for v in self.protocol_versions if v in SUPPORTED_VERSIONS]


class AllowList(_Strict):
    heartbeat_interval_s: Annotated[float, Field(gt=0)] = 10.0
    agents: list[ExternalAgent] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_ids(self) -> AllowList:
        ids = [a.id for a in self.agents]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"agent ids listed twice: {twice}")
        return self

    def get(self, agent_id: str) -> ExternalAgent | None:
        return next((a for a in self.agents if a.id == agent_id), None)

    def interval_of(self, agent: ExternalAgent) -> float:
        return agent.heartbeat_interval_s if agent.heartbeat_interval_s is not None else self.heartbeat_interval_s

    def keyring(self) -> Keyring:
        """The public keys and the agents allowed unsigned messages (keys were checked when the list loaded)."""
        return Keyring(
            keys={a.id: load_public_key(a.public_key) for a in self.agents if a.public_key is not None},
            unsigned_ok=frozenset(a.id for a in self.agents if a.allow_unsigned),
            listed=frozenset(a.id for a in self.agents),
        )


def load_allow_list(path: Path | None) -> AllowList:
    """The allow-list in ``path``; ``None``: :data:`DEFAULT_FILE` if it exists, else an empty list (every
    registration refused). A named file that is missing or invalid is a :class:`ConfigError` (exit 2)."""
    if path is None:
        if not DEFAULT_FILE.is_file():
            log.warning("external_agents.none_allowed", file=str(DEFAULT_FILE), reason="no allow-list file")
            return AllowList()
        path = DEFAULT_FILE
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8-sig"))
    except OSError as exc:
        raise ConfigError(f"cannot read the external agents file {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    try:
        allow = AllowList.model_validate(data if data is not None else {})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{path} is not a valid external agents file: {problems}") from exc
    for agent in allow.agents:
        if agent.public_key is None and not agent.allow_unsigned:
            log.warning("external_agents.no_public_key", agent_id=agent.id, effect="every message it sends is refused")
        elif agent.allow_unsigned:
            log.warning("external_agents.unsigned_allowed", agent_id=agent.id, effect="development only")
        if not agent.speakable_versions():
            log.warning("external_agents.no_speakable_version", agent_id=agent.id, versions=agent.protocol_versions)
    log.info("external_agents.loaded", file=str(path), agents=len(allow.agents))
    return allow
