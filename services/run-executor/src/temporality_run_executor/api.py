"""The agent cards over HTTP, read-only (RUN-1: "agent cards in config, and readable over an API").

==================================  ======  ====================================================================
``GET /agents``                     viewer  every loaded card, by id: ``{"agents": [<card view>, ...]}``
``GET /agents/{agent_id}``          viewer  one card; 404 ``agent_not_found`` for an id no card has
``GET /agents/{agent_id}/prompt``   admin   the card's instructions: its system prompt, each skill's
                                            instructions, the prompt a run is given and its SHA-256
==================================  ======  ====================================================================

Served on the executor's probe port (``TEMPORALITY_EXECUTOR_PORT``, beside ``/healthz``, ``/readyz`` and
``/metrics``) when one is set; authorized with the role tokens of :mod:`temporality_service.auth` (401
without a valid token; 403 only on ``/prompt`` for a viewer or operator, audited as every refusal is).

A view shows what the card *does*: id, role, description, skills (name and description, not their
instructions), the tool policy and the tools it is offered after it (MCP tools included), the provider
(kind, model, the endpoint without credentials), limits, MCP server names, whether its sandbox has
network, and the SHA-256 of the prompt a run is given (``system_prompt_sha256``: what ``run.started``'s
``agent_card`` tells, so a run's digest says whether it ran with the card's current prompt). Never a secret
or an environment value: not the system prompt nor a skill's instructions (they may embed secrets: only
``/prompt``, admin only, shows them; each read is logged, ``agents.prompt_read``, with the caller's
name), not the provider's key (nor the name of its variable), not an MCP server's command, arguments or
``env``, not the sandbox's pass-through names nor its working directory.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable

import structlog
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from temporality_run_executor.agents import AgentCard, AgentDirectory, Limits, prompt_digest
from temporality_run_executor.mcp_servers import SEPARATOR
from temporality_run_executor.tools import Tool
from temporality_service import (
    HTTP_TELEMETRY,
    ApiAuth,
    AsAdmin,
    AsViewer,
    ErrorBody,
    NotFound,
    install_error_handlers,
)

__all__ = [
    "AgentPromptView",
    "AgentView",
    "AgentsView",
    "ProviderView",
    "RenamedToolView",
    "SkillInstructionsView",
    "SkillView",
    "ToolPolicyView",
    "agent_view",
    "create_app",
]

log = structlog.get_logger(__name__)

_ID = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SkillView(_View):
    name: str
    description: str


class ToolPolicyView(_View):
    allow: list[str]
    deny: list[str]


class ProviderView(_View):
    #: ``openai`` or ``scripted`` (deterministic, for demos and tests).
    kind: str
    model: str | None = None
    #: The endpoint, without user info, query or fragment (which might hold a credential).
    base_url: str | None = None
    #: The scripted provider's shipped script (``reviewer``), ``file`` or ``inline``.
    script: str | None = None


class RenamedToolView(_View):
    """An MCP tool offered under another name than ``<server>__<tool>`` (not a valid function name)."""

    #: What the model sees (and ``tools`` lists).
    name: str
    server: str
    #: The server's own name for it (what the server is called with).
    tool: str


class AgentView(_View):
    id: str
    #: How people are shown it (the question it asks names it); null: its id.
    display_name: str | None = None
    role: str
    description: str
    skills: list[SkillView]
    tool_policy: ToolPolicyView
    #: What its runs are offered (after allow/deny; MCP tools as ``<server>__<tool>``).
    tools: list[str]
    #: The offered MCP tools whose ``<server>__<tool>`` is not a valid function name, with the name the model sees.
    renamed_tools: list[RenamedToolView] = []
    provider: ProviderView
    limits: Limits
    mcp_servers: list[str]
    sandbox_network: bool
    #: SHA-256 (hex) of the prompt a run of the card is given (run.started's ``agent_card.system_prompt_sha256``).
    system_prompt_sha256: str


class AgentsView(_View):
    agents: list[AgentView]


class SkillInstructionsView(_View):
    name: str
    description: str
    instructions: str


class AgentPromptView(_View):
    """``GET /agents/{agent_id}/prompt`` (admin): what a run of the card is told."""

    id: str
    system_prompt: str = Field(description="The card's own system_prompt, as written")
    skills: list[SkillInstructionsView] = Field(description="Each skill the card lists, with its instructions")
    instructions: str = Field(
        description="The exact system prompt a run of the card is given: system_prompt with each skill appended"
    )
    sha256: str = Field(
        description="SHA-256 (hex) of instructions (UTF-8): run.started's agent_card.system_prompt_sha256 for a run "
        "given this prompt"
    )


def _endpoint(url: str | None) -> str | None:
    if url is None:
        return None
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def agent_view(card: AgentCard, offered: list[Tool]) -> AgentView:
    """The public view of ``card`` whose runs are offered ``offered`` (see the module docstring)."""
    provider = card.provider
    script: str | None = None
    if provider.kind == "scripted":
        script = provider.script if isinstance(provider.script, str) else "file" if provider.script_file else "inline"
    return AgentView(
        id=card.id,
        display_name=card.display_name,
        role=card.role,
        description=card.description,
        skills=[SkillView(name=s.name, description=s.description) for s in card.skills],
        tool_policy=ToolPolicyView(allow=list(card.tools.allow), deny=list(card.tools.deny)),
        tools=[tool.name for tool in offered],
        renamed_tools=[
            RenamedToolView(name=tool.name, server=server, tool=original)
            for tool in offered
            if tool.origin is not None
            for server, _, original in [tool.origin.partition(SEPARATOR)]
        ],
        provider=ProviderView(
            kind=provider.kind,
            model=provider.model if provider.kind == "openai" else None,
            base_url=_endpoint(provider.base_url) if provider.kind == "openai" else None,
            script=script,
        ),
        limits=card.limits,
        mcp_servers=[server.name for server in card.mcp_servers],
        sandbox_network=card.sandbox.network,
        system_prompt_sha256=prompt_digest(card.instructions()),
    )


def prompt_view(card: AgentCard) -> AgentPromptView:
    """The admin's view of what a run of ``card`` is told (see the module docstring)."""
    given = card.instructions()
    return AgentPromptView(
        id=card.id,
        system_prompt=card.system_prompt,
        skills=[
            SkillInstructionsView(name=s.name, description=s.description, instructions=s.instructions)
            for s in card.skills
        ],
        instructions=given,
        sha256=prompt_digest(given),
    )


def create_app(agents: AgentDirectory, offered: Callable[[AgentCard], list[Tool]], auth: ApiAuth) -> FastAPI:
    """The executor's HTTP app: the agent cards (``offered``: the tools a card's runs are offered)."""
    app = FastAPI(
        title="Temporality run-executor",
        version="0.1.0",
        responses={code: {"model": ErrorBody} for code in (400, 401, 403, 404, 422)},
        telemetry=HTTP_TELEMETRY,
    )
    install_error_handlers(app)
    auth.install(app)
    views = {card.id: agent_view(card, offered(card)) for card in agents.cards()}  # the cards are fixed at start
    prompts = {card.id: prompt_view(card) for card in agents.cards()}

    @app.get("/agents", response_model=AgentsView)
    async def list_agents(who: AsViewer) -> AgentsView:
        return AgentsView(agents=[views[key] for key in sorted(views)])

    @app.get("/agents/{agent_id}", response_model=AgentView)
    async def get_agent(agent_id: str, who: AsViewer) -> AgentView:
        view = views.get(agent_id) if _ID.match(agent_id) else None
        if view is None:
            raise NotFound(f"no agent card {agent_id[:100]!r} is loaded", code="agent_not_found")
        return view

    @app.get(
        "/agents/{agent_id}/prompt",
        response_model=AgentPromptView,
        description="Admin only (a prompt may embed secrets): the card's system prompt, its skills' instructions, "
        "the prompt a run is given and its SHA-256, which run.started's agent_card.system_prompt_sha256 names. "
        "Every read is logged with the caller's name (agents.prompt_read).",
    )
    async def get_agent_prompt(agent_id: str, who: AsAdmin) -> AgentPromptView:
        prompt = prompts.get(agent_id) if _ID.match(agent_id) else None
        if prompt is None:
            raise NotFound(f"no agent card {agent_id[:100]!r} is loaded", code="agent_not_found")
        log.info("agents.prompt_read", agent=agent_id, sha256=prompt.sha256, principal=who.name)
        return prompt

    return app
