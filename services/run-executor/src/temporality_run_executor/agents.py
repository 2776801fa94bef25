"""Agent cards loaded from YAML (RUN-1): id, role, system prompt, skills, tool policy, provider and model,
limits, MCP servers and the sandbox its tool processes run in.

The card holds the agent's behaviour; a trigger never carries a system prompt (TRG-8). The whole file is
validated when the executor starts: an error names the agent and the field (``agents[0] (reviewer):
sandbox.working_dir: ...``) and the process exits 2. See docs/agents.md.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
import structlog
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from temporality_protocol import SandboxSummary
from temporality_run_executor.providers.script import Script
from temporality_run_executor.tools import ToolPolicy

log = structlog.get_logger(__name__)

__all__ = [
    "NETWORK_OFF",
    "AgentCard",
    "AgentDirectory",
    "AgentsFileError",
    "Limits",
    "McpServer",
    "ProviderConfig",
    "Sandbox",
    "Skill",
    "load_agents",
    "network_off_problem",
    "prompt_digest",
    "sandbox_summary",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProviderConfig(_Strict):
    #: ``scripted`` is the deterministic demo/test provider; ``openai`` any OpenAI-compatible endpoint;
    #: ``external`` an external agent registered with agent-collab computes the turns (``agent_id``, AP-5).
    kind: Literal["scripted", "openai", "external"]
    #: For ``external``: the registered agent's id (``config/external-agents.yaml``).
    agent_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")] | None = None
    #: For ``scripted``: the script -- a name shipped with the executor (``reviewer``) or the script itself
    #: (``vars``/``steps``, see :mod:`.providers.script`).
    script: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")] | Script | None = None
    #: For ``scripted``: a YAML file holding the script (relative: to the agents file's folder).
    script_file: Path | None = None
    model: str | None = None
    #: Other models of the same endpoint an MCP tool's sampling request may pick with its model hints
    #: (``modelPreferences.hints``, each matched as a substring, the first hint that matches wins); empty: hints
    #: are ignored and ``model`` answers every sampling request.
    sampling_models: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(default_factory=list)
    base_url: str | None = None
    api_key_env: str | None = None
    #: How the key is sent: ``authorization`` (the default: ``Authorization: Bearer <key>``, OpenAI and Azure
    #: OpenAI's v1 API) or ``api-key`` (an ``api-key: <key>`` header and no ``Authorization``: Azure OpenAI's
    #: classic deployment URLs). For ``openai`` only.
    api_key_header: Literal["authorization", "api-key"] = "authorization"
    #: Seconds one request may take (connect, send, wait for the answer) before it counts as failed.
    timeout_s: Annotated[float, Field(gt=0, le=600)] = 60.0
    #: Retries of one turn after a 429, a 408, a 5xx, a connection error or a timeout (0: none). Each waits
    #: ``Retry-After`` when the endpoint sends it, else an exponential backoff with jitter from
    #: ``retry_backoff_s`` up to ``retry_backoff_max_s``; never past the run's remaining compute budget.
    max_retries: Annotated[int, Field(ge=0, le=20)] = 4
    retry_backoff_s: Annotated[float, Field(ge=0, le=60)] = 1.0
    retry_backoff_max_s: Annotated[float, Field(ge=0, le=600)] = 30.0

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        """An http(s) URL with a host: ``127.0.0.1:9299/v1`` (no scheme) would fail every run, not the start."""
        if value is None:
            return None
        try:
            url = httpx.URL(value)
        except (httpx.InvalidURL, TypeError) as exc:
            raise ValueError(f"base_url is not a URL ({exc})") from exc
        missing = [] if url.scheme in ("http", "https") else [f"scheme {url.scheme!r}" if url.scheme else "no scheme"]
        missing += [] if url.host else ["no host"]
        if missing:
            raise ValueError(
                "base_url needs an http:// or https:// scheme and a host, e.g. http://127.0.0.1:8000/v1 "
                f"(it has {' and '.join(missing)})"
            )
        if url.userinfo:
            raise ValueError(
                "base_url must not carry a user name or password (user:password@host): it would be sent as Basic "
                "auth in place of the API key; give the key through api_key_env"
            )
        return value

    @model_validator(mode="after")
    def _backoff_range(self) -> ProviderConfig:
        if self.retry_backoff_max_s < self.retry_backoff_s:
            raise ValueError("retry_backoff_max_s must be at least retry_backoff_s")
        if self.kind == "scripted" and (self.script is None) == (self.script_file is None):
            raise ValueError("a scripted provider takes exactly one of script or script_file")
        if self.kind != "scripted" and (self.script is not None or self.script_file is not None):
            raise ValueError(f"script and script_file are for the scripted provider, not {self.kind}")
        if self.kind == "external" and self.sampling_models:
            raise ValueError("sampling_models are for the executor's own providers (an external agent samples nothing)")
        if self.kind != "openai" and self.api_key_header != "authorization":
            raise ValueError(f"api_key_header is for the openai provider, not {self.kind}")
        if (self.kind == "external") != (self.agent_id is not None):
            raise ValueError("an external provider takes agent_id (and only it does)")
        return self


class Limits(_Strict):
    max_turns: Annotated[int, Field(gt=0, le=500)] = 20
    #: Compute budget in seconds: time spent in the provider and in tools. Waiting for a human is not
    #: compute and never counts (RUN-3).
    max_compute_s: Annotated[float, Field(gt=0)] = 900.0
    #: Token budget over the whole run (the endpoint's ``usage.total_tokens``, summed); unset: no limit.
    #: A turn that takes the total past it fails the run (reason ``token_limit``).
    max_tokens: Annotated[int, Field(gt=0)] | None = None
    #: Malformed tool calls (arguments that are not a JSON object, a tool the card does not allow) the
    #: model may make over the run; each goes back to it as a tool error. One more fails the run
    #: (reason ``malformed_tool_calls``).
    max_malformed_tool_calls: Annotated[int, Field(ge=0, le=100)] = 5
    #: ``ask_human`` and ``notify`` calls one model reply may make (together); each past it is not made, and the
    #: model is told so as its tool error (it may make them in a later turn).
    max_human_calls_per_reply: Annotated[int, Field(ge=1, le=100)] = 10


_NAME = r"^[a-z0-9][a-z0-9_-]{0,40}$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class Skill(_Strict):
    """A named instruction bundle, appended to the system prompt of every card that lists it."""

    name: Annotated[str, Field(pattern=_NAME)]
    description: str = ""
    instructions: Annotated[str, Field(min_length=1, max_length=32768)]


class McpServer(_Strict):
    """An MCP server whose tools the agent may be offered (as ``<name>__<tool>``), started over stdio in the
    card's sandbox (:mod:`.mcp_servers`)."""

    #: Its tools are named ``<name>__<tool>`` in the registry and in ``tools.allow``/``deny`` (so: no ``_``).
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")]
    transport: Literal["stdio"] = "stdio"
    #: The program (a name on ``PATH`` or a path) and its arguments.
    command: Annotated[str, Field(min_length=1)]
    args: list[str] = Field(default_factory=list)
    #: Fixed environment values for the server (on top of the sandbox's pass-through list).
    env: dict[Annotated[str, Field(pattern=_ENV_NAME)], str] = Field(default_factory=dict)
    #: Seconds one tool call may take.
    timeout_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    #: How the session is opened: ``handshake`` (``initialize``, at most MCP 2025-11-25: a tool asks for input
    #: with ``elicitation/create``) or ``auto`` (``server/discover`` first: MCP 2026-07-28 when the server speaks
    #: it, where a tool asks with an ``input_required`` result; else ``initialize``).
    protocol: Literal["handshake", "auto"] = "handshake"
    #: Seconds a call refused with ``URLElicitationRequiredError`` (-32042) after the person said they finished at
    #: the link waits for the server's ``notifications/elicitation/complete`` before it is made once more (at most
    #: half of ``timeout_s``; the wait is compute time of the run).
    completion_wait_s: Annotated[float, Field(gt=0, le=600)] = 10.0

    @model_validator(mode="after")
    def _command_exists(self) -> McpServer:
        if shutil.which(self.command) is None:
            raise ValueError(f"command {self.command!r} is not an executable file nor a program on PATH")
        return self


#: What ``sandbox.network: false`` runs a tool process under: ``unshare <NETWORK_OFF> <command> <args...>``, a user
#: namespace of its own (mapped to root inside, so no privilege is needed outside) with a network namespace that has
#: no usable interface.
NETWORK_OFF = ("--user", "--map-root-user", "--net", "--")


@functools.cache
def network_off_problem() -> str | None:
    """Why ``sandbox.network: false`` cannot work in this process's environment, or ``None`` when it can: runs what
    the sandbox runs (``unshare --user --map-root-user --net -- <python> -c ''``) once per process. A container's
    default seccomp profile (Docker's, containerd's ``RuntimeDefault``) refuses ``unshare(CLONE_NEWUSER)`` unless
    the process holds CAP_SYS_ADMIN, so this fails there though the ``unshare`` binary is installed."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "`unshare` (util-linux) is not installed"
    try:
        done = subprocess.run(
            [unshare, *NETWORK_OFF, sys.executable, "-c", ""],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`unshare {' '.join(NETWORK_OFF[:-1])}` could not be run ({type(exc).__name__}: {exc})"
    if done.returncode == 0:
        return None
    said = " ".join(done.stderr.split())[:300] or f"exit status {done.returncode}"
    return f"`unshare {' '.join(NETWORK_OFF[:-1])}` is refused here ({said})"


class Sandbox(_Strict):
    """Where the agent's tool processes (MCP stdio servers) run."""

    #: Their working directory (must exist; relative: to the agents file's folder). Unset: the executor's.
    working_dir: Path | None = None
    #: Names of the executor's environment variables passed through to them; nothing else is (besides
    #: ``PATH``, ``HOME``, ``LANG`` and the server's own ``env``).
    env: list[Annotated[str, Field(pattern=_ENV_NAME)]] = Field(default_factory=list)
    #: ``false``: they run in a network namespace of their own with no interfaces (``unshare -rn``).
    network: bool = True

    @model_validator(mode="after")
    def _directory_exists(self) -> Sandbox:
        if self.working_dir is not None and not self.working_dir.is_dir():
            raise ValueError(f"working_dir {str(self.working_dir)!r} is not a directory")
        if not self.network:
            problem = network_off_problem()
            if problem is not None:
                raise ValueError(
                    f"network: false cannot work in this environment: {problem}. It needs unprivileged user "
                    "namespaces: a seccomp profile that allows unshare(CLONE_NEWUSER) (Docker's default and Kubernetes' "
                    "RuntimeDefault do not without CAP_SYS_ADMIN; the Helm chart's pods run with RuntimeDefault and "
                    "no capabilities) and a kernel that permits them (user.max_user_namespaces > 0); see "
                    "docs/agents.md#network-off. Or set network: true"
                )
        return self


class AgentCard(_Strict):
    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    #: How people are shown the agent (``human.requested``'s ``agent_display_name``: the question names it);
    #: none: they see its ``id``.
    display_name: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    role: str
    description: str = ""
    system_prompt: str
    #: Instruction bundles appended to the system prompt (in the file: a name from its ``skills``, or inline).
    skills: list[Skill] = Field(default_factory=list)
    #: Which tools it is offered (``allow``/``deny`` names or patterns; a plain list is ``allow``).
    tools: ToolPolicy = Field(default_factory=ToolPolicy)
    provider: ProviderConfig
    limits: Limits = Field(default_factory=Limits)
    mcp_servers: list[McpServer] = Field(default_factory=list)
    sandbox: Sandbox = Field(default_factory=Sandbox)

    @model_validator(mode="after")
    def _unique_names(self) -> AgentCard:
        for what, names in (
            ("skills", [s.name for s in self.skills]),
            ("mcp_servers", [m.name for m in self.mcp_servers]),
        ):
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise ValueError(f"{what}: names repeat: {repeated}")
        return self

    def instructions(self) -> str:
        """The system prompt with its skills appended, each under its own heading."""
        parts = [self.system_prompt.strip()]
        parts += [f"## Skill: {skill.name}\n{skill.instructions.strip()}" for skill in self.skills]
        return "\n\n".join(parts)


def prompt_digest(prompt: str) -> str:
    """RUN-1: the SHA-256 (hex) of a system prompt as a run is given it (UTF-8): ``run.started``'s
    ``agent_card.system_prompt_sha256`` and the admin's ``GET /agents/{id}/prompt`` tell the same one."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def sandbox_summary(sandbox: Sandbox) -> SandboxSummary:
    """RUN-1: what a card's sandbox is, for ``run.started``: never its pass-through names nor its directory's path."""
    return SandboxSummary(kind="process", network=sandbox.network, working_dir_set=sandbox.working_dir is not None)


class _SkillBundle(_Strict):
    description: str = ""
    instructions: Annotated[str, Field(min_length=1, max_length=32768)]


class _AgentsFile(_Strict):
    #: Skills cards refer to by name (the key): ``{description, instructions}`` or just the instructions.
    skills: dict[Annotated[str, Field(pattern=_NAME)], _SkillBundle | str] = Field(default_factory=dict)
    agents: list[AgentCard]


class AgentsFileError(Exception):
    pass


class AgentDirectory:
    def __init__(self, cards: list[AgentCard]) -> None:
        self._cards = {c.id: c for c in cards}
        if len(self._cards) != len(cards):
            ids = [c.id for c in cards]
            raise AgentsFileError(f"agent ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")

    def get(self, agent_id: str) -> AgentCard | None:
        return self._cards.get(agent_id)

    def cards(self) -> list[AgentCard]:
        return list(self._cards.values())

    def __len__(self) -> int:
        return len(self._cards)


def load_agents(path: Path) -> AgentDirectory:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise AgentsFileError(f"{path}: {exc}") from exc
    _anchor_relative_paths(raw, path.parent)
    _resolve_skills(raw, path)
    try:
        cards = _AgentsFile.model_validate(raw).agents
    except ValidationError as exc:
        raise AgentsFileError(f"{path}: {_describe(exc, raw)}") from exc
    ids = [card.id for card in cards]
    for repeated in sorted({i for i in ids if ids.count(i) > 1}):
        places = " and ".join(f"agents[{n}]" for n, i in enumerate(ids) if i == repeated)
        raise AgentsFileError(f"{path}: agent id {repeated!r} is used twice ({places}); each agent needs its own id")
    for card in cards:
        for name in card.sandbox.env:
            if name not in os.environ:  # passed through as nothing: likely a deployment that forgot to set it
                log.warning("agents.sandbox_env_unset", file=str(path), agent=card.id, variable=name)
    return AgentDirectory(cards)


def _cards(raw: object) -> list[dict[str, Any]]:
    agents = raw.get("agents") if isinstance(raw, dict) else None
    return [card if isinstance(card, dict) else {} for card in agents] if isinstance(agents, list) else []


def _anchor_relative_paths(raw: object, folder: Path) -> None:
    """Make relative ``provider.script_file`` and ``sandbox.working_dir`` relative to the agents file's
    folder, not to the executor's working directory."""
    for card in _cards(raw):
        for block, key in (("provider", "script_file"), ("sandbox", "working_dir")):
            section = card.get(block)
            value = section.get(key) if isinstance(section, dict) else None
            if isinstance(section, dict) and isinstance(value, str) and not Path(value).is_absolute():
                section[key] = str(folder / value)


def _resolve_skills(raw: object, path: Path) -> None:
    """Replace each skill a card names by the file's ``skills`` entry of that name (a string entry there
    is the instructions alone); an unknown name is an error naming the card and the field."""
    named = raw.get("skills") if isinstance(raw, dict) else None
    if named is not None and not isinstance(named, dict):
        raise AgentsFileError(
            f"{path}: skills must be a mapping of a skill's name to its instructions (or to {{description, "
            f"instructions}}), not a {type(named).__name__}"
        )
    bundles = named if isinstance(named, dict) else {}
    for name, bundle in bundles.items():
        if isinstance(bundle, dict):  # one message naming the skill (not the union's two, str's and the bundle's)
            try:
                _SkillBundle.model_validate(bundle)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or '(the bundle)'}: {e['msg']}" for e in exc.errors()
                )
                raise AgentsFileError(
                    f"{path}: skills.{name}: {problems} (a skill is its instructions, or {{description, instructions}})"
                ) from None
    for index, card in enumerate(_cards(raw)):
        skills = card.get("skills")
        if not isinstance(skills, list):
            continue
        resolved: list[Any] = []
        for position, entry in enumerate(skills):
            if not isinstance(entry, str):
                resolved.append(entry)  # inline: validated as a Skill
                continue
            bundle = bundles.get(entry)
            if bundle is None:
                known = ", ".join(sorted(bundles)) or "none"
                raise AgentsFileError(
                    f"{path}: agents[{index}] ({card.get('id')}): skills[{position}]: no skill named {entry!r} "
                    f"in the file's skills (known: {known})"
                )
            resolved.append({"name": entry, **(bundle if isinstance(bundle, dict) else {"instructions": bundle})})
        card["skills"] = resolved


def _describe(exc: ValidationError, raw: object) -> str:
    """The validation errors, each naming the card (its index and id) and the field."""
    cards = _cards(raw)
    lines = []
    for error in exc.errors():
        loc = list(error["loc"])
        where = ".".join(str(part) for part in loc)
        if len(loc) >= 2 and loc[0] == "agents" and isinstance(loc[1], int):
            card = cards[loc[1]] if loc[1] < len(cards) else {}
            field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[2:]).lstrip(".")
            where = f"agents[{loc[1]}]" + (f" ({card.get('id')})" if card.get("id") else "")
            where += f": {field}" if field else ""
        lines.append(f"{where}: {error['msg']}")
    return "; ".join(lines)
