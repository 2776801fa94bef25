"""One traced stack for the tracing scenarios (tests/test_tracing*.py): the five services as processes exporting
with the real SDK and OTLP exporter to one real receiver (:class:`OtlpReceiver`), started once per test run.

Starting a stack is most of each scenario's cost (10-30 s on the loaded test machine), so the scenarios share
this one: the fixture ``traced_stack`` is session-scoped (``make test``'s ``--dist loadgroup`` puts all its
users on one worker; the root conftest groups them), and its event loop is the session's, where the receiver
serves (tests using it run with ``pytest.mark.asyncio(loop_scope="session")``). tests/conftest.py registers
the fixtures (``traced_stack``, ``session_http``) once: a test module importing them would make a session
fixture of its own, and start a stack of its own. A scenario on it must not rely
on being alone: it posts webhooks with a fresh delivery (:func:`fresh_pr`), finds its own question by run
(:func:`question`), and reads spans of its own trace (found from its run id, or a trace id it made).

The stack's set-up is the union of what the scenarios need:

* the shipped config, plus :data:`DEADLINE_TRIGGER` (the shipped trigger whose question expires after 2 s to
  the default answer), :data:`EXTERNAL_TIGHT_TRIGGER` (its runs the example external agent's tasks, with a 2 s
  compute budget), :data:`HOSTED_TIGHT_TRIGGER` (the scripted reviewer with a 1 s compute budget) and a 1 s
  heartbeat interval for external agents (a killed agent goes offline within seconds);
* the run-executor's checkpoint retention 1 s after a run ends, agent-collab's heartbeat grace 0.5 s;
* ``TEMPORALITY_NATS_SOURCE_CHECK=strict`` (the production default; the test suite runs ``claimed``): every event
  the real services exchange passes the consumers' sender check.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest_asyncio

if TYPE_CHECKING:  # imported where used: tests/conftest.py imports this module in every pytest process of tests/
    from temporality_embedded import Stack
    from temporality_testing.otlp_receiver import OtlpReceiver

__all__ = [
    "DEADLINE_TRIGGER",
    "EXTERNAL_TIGHT_AGENT",
    "EXTERNAL_TIGHT_BUDGET_S",
    "EXTERNAL_TIGHT_TRIGGER",
    "HOSTED_TIGHT_AGENT",
    "HOSTED_TIGHT_BUDGET_S",
    "HOSTED_TIGHT_TRIGGER",
    "Traced",
    "completed",
    "fresh_pr",
    "question",
    "session_http_fixture",
    "traced_config",
    "traced_stack_fixture",
    "traceparent",
]

#: A copy of the shipped trigger whose question expires after 2 s; the run resumes with ``keep-v1``.
DEADLINE_TRIGGER = "ado-pr-review-deadline"
#: A copy of the shipped trigger launching :data:`EXTERNAL_TIGHT_AGENT`.
EXTERNAL_TIGHT_TRIGGER = "ado-pr-review-external-tight"
#: An agent card whose runs are the example external agent's tasks, with a 2 s compute budget: an agent slower
#: than that to act has its run failed by the run-executor's watchdog timer (``compute_timeout``).
EXTERNAL_TIGHT_AGENT = "reviewer-external-tight"
EXTERNAL_TIGHT_BUDGET_S = 2
#: A copy of the shipped trigger launching :data:`HOSTED_TIGHT_AGENT`.
HOSTED_TIGHT_TRIGGER = "ado-pr-review-hosted-tight"
#: The shipped scripted reviewer with a 1 s compute budget: a turn that takes longer (a hung provider, a hung
#: executor) is the watchdog's, once the budget and the run-executor's grace have passed.
HOSTED_TIGHT_AGENT = "reviewer-hosted-tight"
HOSTED_TIGHT_BUDGET_S = 1


def traced_config(root: Path) -> Path:
    """The shipped config in ``root``, with :data:`DEADLINE_TRIGGER`, :data:`EXTERNAL_TIGHT_TRIGGER` and
    :data:`HOSTED_TIGHT_TRIGGER` (and their cards) and a 1 s heartbeat interval."""
    import yaml
    from e2e_support import CONFIG

    config = root / "config"
    shutil.copytree(CONFIG, config)
    triggers = yaml.safe_load((config / "triggers.yaml").read_text(encoding="utf-8"))
    shipped = next(t for t in triggers["triggers"] if t["id"] == "ado-pr-review")
    deadline = copy.deepcopy(shipped) | {"id": DEADLINE_TRIGGER}
    deadline["human"] |= {"default_timeout_s": 2, "on_timeout": {"action": "default", "default_option": "keep-v1"}}
    triggers["triggers"].append(deadline)
    triggers["triggers"].append(copy.deepcopy(shipped) | {"id": EXTERNAL_TIGHT_TRIGGER, "agent": EXTERNAL_TIGHT_AGENT})
    triggers["triggers"].append(copy.deepcopy(shipped) | {"id": HOSTED_TIGHT_TRIGGER, "agent": HOSTED_TIGHT_AGENT})
    (config / "triggers.yaml").write_text(yaml.safe_dump(triggers), encoding="utf-8")
    cards = yaml.safe_load((config / "agents.yaml").read_text(encoding="utf-8"))
    reviewer = next(a for a in cards["agents"] if a["id"] == "reviewer")
    tight = copy.deepcopy(reviewer) | {
        "id": EXTERNAL_TIGHT_AGENT,
        "provider": {"kind": "external", "agent_id": "example-agent"},
        "tools": {"allow": ["get_input", "ask_human"]},
        "limits": {"max_turns": 5, "max_compute_s": EXTERNAL_TIGHT_BUDGET_S},
    }
    cards["agents"].append(tight)
    hosted = copy.deepcopy(reviewer) | {"id": HOSTED_TIGHT_AGENT}
    hosted["limits"] = dict(reviewer.get("limits", {}), max_compute_s=HOSTED_TIGHT_BUDGET_S)
    cards["agents"].append(hosted)
    (config / "agents.yaml").write_text(yaml.safe_dump(cards), encoding="utf-8")
    agents = yaml.safe_load((config / "external-agents.yaml").read_text(encoding="utf-8"))
    agents["heartbeat_interval_s"] = 1
    (config / "external-agents.yaml").write_text(yaml.safe_dump(agents), encoding="utf-8")
    return config


@dataclass(frozen=True)
class Traced:
    stack: Stack
    otlp: OtlpReceiver
    #: A folder of the session's for the scenarios' own files (logs of processes they start).
    root: Path


@pytest_asyncio.fixture(scope="session", loop_scope="session", name="traced_stack")
async def traced_stack_fixture(tmp_path_factory: Any) -> AsyncIterator[Traced]:
    """The traced stack of the module docstring, for the whole test run."""
    from e2e_support import make_stack

    from temporality_testing.otlp_receiver import OtlpReceiver

    root: Path = tmp_path_factory.mktemp("traced")
    async with OtlpReceiver().serve() as otlp:
        stack = make_stack(
            root,
            config_dir=traced_config(root),
            TEMPORALITY_EXECUTOR_CHECKPOINT_RETENTION_S="1",
            TEMPORALITY_COLLAB_HEARTBEAT_GRACE_S="0.5",
            TEMPORALITY_NATS_SOURCE_CHECK="strict",
            **otlp.env(),
        )
        stack.config.example_agent_key = True  # the example agent signs (AP-11) as with `temporality up`
        await asyncio.to_thread(stack.start)  # the receiver answers on this loop meanwhile
        try:
            yield Traced(stack, otlp, root)
        finally:
            await asyncio.to_thread(stack.stop)


@pytest_asyncio.fixture(loop_scope="session", name="session_http")
async def session_http_fixture() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on the session's loop (the ``http`` fixture's lives on the test's own)."""
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


def fresh_pr() -> dict[str, Any]:
    """The example pull request as a delivery of its own (the gateway dedupes a repeated one)."""
    from e2e_support import example_pr

    return example_pr(id=str(uuid.uuid4()))


def traceparent() -> tuple[str, str, str]:
    """A new W3C ``traceparent`` of a client's, with its trace id and span id."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


async def question(http: httpx.AsyncClient, stack: Stack, run_id: str) -> dict[str, Any] | None:
    """Alice's question of ``run_id`` in her inbox; None while it is not there."""
    from e2e_support import ALICE

    response = await http.get(f"{stack.human_url}/inbox", headers=ALICE)
    if response.status_code != 200:
        return None
    mine = [r for r in response.json()["requests"] if r["run_id"] == run_id]
    return mine[0] if mine else None


async def completed(http: httpx.AsyncClient, stack: Stack, run_id: str) -> bool:
    """Whether the journal shows ``run_id`` completed."""
    from e2e_support import JOURNAL

    response = await http.get(f"{stack.journal_url}/runs/{run_id}", headers=JOURNAL)
    return response.status_code == 200 and response.json()["state"] == "completed"
