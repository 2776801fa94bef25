"""An MCP server over stdio whose tool asks a person before it acts (MCP elicitation), for the installed ``mcp``
SDK (2.x: ``mcp.server.mcpserver.MCPServer``; the 1.x ``from mcp.server.fastmcp import FastMCP`` is gone).

Tools:

- ``list_environments()`` -- no parameters: where ``deploy`` can go.
- ``deploy(service, environment)`` -- asks the user to confirm, through ``ctx.elicit`` with a one-field form
  (``approve``, a yes/no: the person gets the options yes, no and decline); on ``accept`` with ``approve: true``
  it appends a line to ``deployments.log`` in its working directory (the card's ``sandbox.working_dir``, else
  the executor's) and says so, otherwise it says why nothing was deployed.

The run-executor turns the elicitation into an ordinary ``human.requested`` for the run's person (the form as
options, or free text), parks the run, and on the answer calls ``deploy`` again, answering the question from
what the person said (docs/agents.md, "MCP elicitation: a parked human request"). A tool asked again must be
idempotent up to its question: this one does nothing before it has an answer, and a deployment already logged is
not logged twice.

Run it the way the executor does (a card's ``mcp_servers`` entry, examples/mcp-server/agents.yaml):

    mcp_servers:
      - {name: deploy, command: python, args: [examples/mcp-server/deploy_server.py]}

or alone, to try it with an MCP client: ``python examples/mcp-server/deploy_server.py`` (it speaks JSON-RPC on
standard input and output; logs go to standard error).
"""

from __future__ import annotations

from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel, Field

ENVIRONMENTS = ("staging", "production")
LOG = Path("deployments.log")

server = MCPServer("deploy")


class Approval(BaseModel):
    """The form the person fills in (an elicitation's schema: flat, of strings, numbers and booleans)."""

    approve: bool = Field(description="Deploy now?")


@server.tool()
def list_environments() -> list[str]:
    """The environments deploy can target."""
    return list(ENVIRONMENTS)


@server.tool()
async def deploy(service: str, environment: str, ctx: Context) -> str:
    """Deploy a service to an environment, after a person approved it."""
    if environment not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {environment!r}; list_environments gives the known ones")
    answer = await ctx.elicit(f"Deploy {service} to {environment}?", Approval)
    if answer.action != "accept":  # "decline" or "cancel": the person said no, or did not answer the form
        return f"not deployed: the approval was {answer.action}d"
    if not answer.data.approve:
        return f"not deployed: {service} to {environment} was not approved"
    _deploy_once(f"{service} -> {environment}")
    return f"deployed {service} to {environment}"


def _deploy_once(line: str) -> None:
    """The deployment itself (here: a line in deployments.log); called again after a crash or a replay, once."""
    done = LOG.read_text(encoding="utf-8").splitlines() if LOG.exists() else []
    if line not in done:
        with LOG.open("a", encoding="utf-8") as log:
            log.write(line + "\n")


if __name__ == "__main__":
    server.run()  # stdio
