"""The tool registry: what an agent may call, how its arguments are checked, and how a call is run.

Every tool is a :class:`Tool`: a name, a description and JSON-schema ``parameters`` (what the model is
offered) plus an implementation. The built-ins (:data:`BUILTIN_TOOLS`):

``get_input``       the run's mapped input (the trigger's mapping, TRG-8), as JSON. Nothing source-specific.
``ask_human``       ask a person and wait: the engine parks the run on it (it has no implementation here).
                    Several in one reply are asked together (HUM-7); ``wait_for`` says whether the run
                    resumes when all have an outcome (default) or on the first answer.
``notify``          tell a person something, no answer expected: publishes ``human.notify_requested``.
``get_collaborators``  the participants of the run's saga (agents, people, runs), asked of agent-collab
                    over NATS request/reply (COL-1).
``ask_agent``       ask another agent of the saga (COL-2): handled by the run machine -- ``async`` publishes
                    ``agent.asked`` and returns at once, ``wait`` parks the run in ``waiting_for_agent``.
``answer_agent``    answer (or refuse, PRO-1) a request this run received: handled by the run machine,
                    which publishes ``agent.replied`` (COL-3).
``handoff_to_agent``  hand the run's task to another agent card, hosted or external (AP-6): handled by the run machine, which
                    publishes ``agent.handed_off`` and the child's ``run.requested``; the run then completes.
``report_progress``  AP-9: a progress report, log line, warning or partial result, journaled as ``run.streamed``
                    with the saga's correlation id and the request the turn works on: handled by the run machine
                    (redacted, size-capped, its id from run, turn and call index); the run does not wait.
``get_pr_context``  DEPRECATED alias of ``get_input``, kept for cards written before it; offered only
                    when a card names it exactly (a pattern such as ``*`` never selects it).

A call goes through, in order (:meth:`ToolRegistry.prepare`, then :meth:`Tool.invoke`):

1. the card's policy (:class:`ToolPolicy`, ``tools: {allow, deny}``): a tool it does not allow is never
   offered, and a call to one is refused back to the model as the tool result;
2. JSON-schema validation of the arguments (``jsonschema``, Draft 2020-12) against the tool's
   ``parameters``: the first error, with where it is, goes back to the model as the tool result;
3. the implementation. :class:`ToolError` (the model got the call wrong) is returned to the model as
   is. Any other exception is the tool breaking: the engine publishes ``tool.failed`` and the model
   gets a tool error result -- the run goes on. :class:`temporality_bus.TransientError` (the bus itself
   failing) is not the tool's fault and propagates, so the message is redelivered.

Implementations are idempotent per (run, turn, call index): a redelivered turn runs them again, and
whatever they publish carries a deterministic id derived from those.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal

import jsonschema_rs
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator
from pydantic import BaseModel, ConfigDict, Field, model_validator

from temporality_protocol import (
    ASK_TIMEOUT_DEFAULT_S,
    MAX_REASON,
    CollaboratorsQuery,
    CollaboratorsReply,
    EventData,
    HumanAskKind,
    HumanNotifyRequested,
    HumanOption,
    derive_id,
)
from temporality_protocol.catalog import RPC_GET_COLLABORATORS
from temporality_protocol.redaction import Redactor
from temporality_protocol.schema_validation import LinearValidator
from temporality_run_executor.providers.base import ToolSpec
from temporality_run_executor.records import ElicitAnswer, Message, RunRecord

__all__ = [
    "ANSWER_AGENT",
    "ASK_AGENT",
    "ASK_HUMAN",
    "BUILTIN_TOOLS",
    "COLLAB_TOOLS",
    "GET_COLLABORATORS",
    "GET_INPUT",
    "HANDOFF_TO_AGENT",
    "NOTIFY",
    "REPORT_PROGRESS",
    "AnswerAgentArgs",
    "AskAgentArgs",
    "AskHumanArgs",
    "ElicitationNeeded",
    "HandoffArgs",
    "NotifyArgs",
    "ReportProgressArgs",
    "Sample",
    "Sampled",
    "SamplingParams",
    "SamplingRefused",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolPolicy",
    "ToolRegistry",
    "WaitFor",
    "may_match_prefix",
]

ASK_HUMAN = "ask_human"
GET_INPUT = "get_input"
NOTIFY = "notify"
GET_COLLABORATORS = "get_collaborators"
ASK_AGENT = "ask_agent"
ANSWER_AGENT = "answer_agent"
HANDOFF_TO_AGENT = "handoff_to_agent"
#: The agent-collaboration tools: runs created before they existed are offered none of them (COL-9).
COLLAB_TOOLS = frozenset({GET_COLLABORATORS, ASK_AGENT, ANSWER_AGENT, HANDOFF_TO_AGENT})
#: Seconds ``get_collaborators`` waits for agent-collab's reply.
COLLABORATORS_TIMEOUT_S = 5.0
#: A tool name as the OpenAI function-calling API accepts it (no ``.``: ``^[a-zA-Z0-9_-]{1,64}$``).
TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"
#: Whom ``ask_human`` / ``notify`` may name: a person or a group of the directory (human-interaction asks or
#: tells every member of a group); the trigger's ``allowed_recipients`` must list exactly this name (SEC-1).
RECIPIENT = r"^(user|group):[A-Za-z0-9_.-]+$"
RECIPIENT_HELP = "A person (user:<id>) or a group (group:<id>: every member is asked, the first answer counts)"
_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


class ElicitationNeeded(Exception):
    """The tool asked for the user's input mid-call (an MCP server's ``elicitation/create``) and no recorded
    answer fits: the run parks on a person and the call is retried with their answer. The server was told
    ``cancel``; whatever the call returned after that is not the tool's result."""

    def __init__(self, message: str, requested_schema: dict[str, Any], position: int, url: str | None = None) -> None:
        super().__init__(f"the tool asks for the user's input: {message}")
        self.message = message
        self.requested_schema = requested_schema
        #: Which of the call's elicitations it is (0: its first); the recorded answers from here on are stale.
        self.position = position
        #: URL mode (MCP 2025-11-25): the person is asked to open this link (``requested_schema`` is empty).
        self.url = url


class ToolError(Exception):
    """The call cannot be executed as made; its message goes back to the agent as the tool result."""


class SamplingRefused(Exception):
    """A tool's request for a completion of the run's model (MCP ``sampling/createMessage``) is not answered: the
    run has no turns or tokens left for it, the request cannot be served, or the provider failed. The tool is
    told why (an error response); the call goes on."""


@dataclass(frozen=True)
class Sampled:
    """The run's model's answer to a tool's sampling request."""

    content: str
    model: str
    #: Why the model stopped, in MCP's words: ``endTurn``, ``maxTokens`` (the provider stopped on the length
    #: limit) or ``stopSequence`` (one of the request's stop sequences ended it, when the provider says so).
    stop_reason: str = "endTurn"


@dataclass(frozen=True)
class SamplingParams:
    """What a tool's sampling request asks besides its messages (MCP ``sampling/createMessage``)."""

    #: The server's ``maxTokens``: the most the answer may take (capped by the run's remaining tokens).
    max_tokens: int
    temperature: float | None = None
    #: ``stopSequences``.
    stop: tuple[str, ...] = ()
    #: ``modelPreferences.hints[].name``, in the server's order of preference.
    model_hints: tuple[str, ...] = ()


#: Ask the run's own model for a completion mid-call: ``sample(messages, params)`` (MCP sampling). The
#: driver's implementation counts it in the run's limits and journals it (``run.sampled``); raises
#: :class:`SamplingRefused`.
Sample = Callable[[list[Message], SamplingParams], Awaitable[Sampled]]


#: HUM-7: the continuation policy of a turn with several ``ask_human`` calls.
WaitFor = Literal["all", "first"]


class AskHumanArgs(BaseModel):
    """HUM-1: ``ask_human(recipient, question, context, reason, reason_kind, options, timeout, wait_for)``.

    OBS-1: ``reason`` and ``reason_kind`` (optional) say why the agent asks; the run-executor copies them into
    ``human.requested`` for the journal's analytics (which knowledge is missing, which decisions are delegated).
    A reason over :data:`~temporality_protocol.MAX_REASON` characters is refused like any bad argument."""

    model_config = ConfigDict(extra="forbid")

    recipient: Annotated[str, Field(pattern=RECIPIENT, description=RECIPIENT_HELP)]
    question: Annotated[str, Field(min_length=1, max_length=4096)]
    context: Annotated[str, Field(max_length=4096)] = ""
    reason: (
        Annotated[
            str,
            Field(
                min_length=1,
                max_length=MAX_REASON,
                description=f"Why you ask, as a short phrase (at most {MAX_REASON} characters), e.g. 'release date "
                "unknown' or 'breaking API change needs sign-off'; operators count these. Explain at length in "
                "context",
            ),
        ]
        | None
    ) = None
    reason_kind: (
        Annotated[
            HumanAskKind,
            Field(
                description="What you need from the person: missing_knowledge (a fact only a person knows), "
                "decision (a choice you may not or cannot make yourself), approval (sign-off for an action you are "
                "about to take), ambiguity (the task or input is unclear or contradictory)"
            ),
        ]
        | None
    ) = None
    options: list[HumanOption] = Field(default_factory=list, max_length=10)
    timeout: Annotated[int, Field(gt=0, description="Seconds to wait; capped by the trigger's policy")] | None = None
    #: HUM-7: how a turn with several ``ask_human`` calls continues (every call of the turn that sets it must
    #: agree; unset: ``all``). ``None`` in a stored ask: the turn's policy is ``all``.
    wait_for: (
        Annotated[
            WaitFor,
            Field(
                description="Several ask_human calls in one reply: 'all' (default) resumes when every question has "
                "an outcome; 'first' resumes on the first answer, the other questions are then not needed. "
                "The calls of one reply must agree"
            ),
        ]
        | None
    ) = None


class NotifyArgs(BaseModel):
    """``notify(recipient, message)``: no answer expected."""

    model_config = ConfigDict(extra="forbid")

    recipient: Annotated[str, Field(pattern=RECIPIENT, description=RECIPIENT_HELP)]
    message: Annotated[str, Field(min_length=1, max_length=4096)]


class AskAgentArgs(BaseModel):
    """COL-2: ``ask_agent(to, message, mode, timeout)``. The run machine cuts ``message`` to 4096 characters
    and clamps ``timeout`` to 1..3600 seconds."""

    model_config = ConfigDict(extra="forbid")

    to: Annotated[
        str,
        Field(
            min_length=1,
            max_length=200,
            description="Who: agent:<agent id>, run:<run id> or a run id, in this run's saga (see get_collaborators)",
        ),
    ]
    message: Annotated[str, Field(min_length=1, description="The question, self-contained (cut at 4096 characters)")]
    mode: Annotated[
        Literal["async", "wait"],
        Field(description="async: the answer arrives later as a message; wait: wait (durably) for it as this result"),
    ] = "async"
    timeout: Annotated[int, Field(ge=1, description="wait: seconds to wait (at most 3600)")] = ASK_TIMEOUT_DEFAULT_S


class AnswerAgentArgs(BaseModel):
    """COL-3: ``answer_agent(request_id, answer, refuse)`` for a request this run received."""

    model_config = ConfigDict(extra="forbid")

    request_id: Annotated[str, Field(min_length=1, max_length=128, description="The request id of the message")]
    answer: Annotated[str, Field(min_length=1, description="The answer, or why you refuse (cut at 4096 characters)")]
    refuse: Annotated[bool, Field(description="Refuse the request instead of answering it (say why)")] = False


_Items = Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=50)]


class HandoffArgs(BaseModel):
    """AP-6: ``handoff_to_agent(agent, objective, current_status, completed_steps, remaining_steps, artifacts,
    memory_links, open_questions, constraints, acceptance_criteria)``."""

    model_config = ConfigDict(extra="forbid")

    agent: Annotated[
        str,
        Field(
            min_length=1,
            max_length=128,
            description="The agent id to hand the task to (an agent card: hosted or external)",
        ),
    ]
    objective: Annotated[str, Field(min_length=1, max_length=4096, description="What the other agent must achieve")]
    current_status: Annotated[str, Field(max_length=4096, description="Where the task stands now")] = ""
    completed_steps: _Items = Field(default_factory=list, description="What is done already")
    remaining_steps: _Items = Field(default_factory=list, description="What is left to do")
    artifacts: _Items = Field(default_factory=list, description="Results so far: links, ids, short content")
    memory_links: _Items = Field(default_factory=list, description="Where to read more (documents, runs, notes)")
    open_questions: _Items = Field(default_factory=list, description="What is still unclear")
    constraints: _Items = Field(default_factory=list, description="What the other agent must respect")
    acceptance_criteria: _Items = Field(default_factory=list, description="When the task counts as done")


# --------------------------------------------------------------------------- report_progress (AP-9)
REPORT_PROGRESS = "report_progress"
#: What ``report_progress`` may send: the streaming kinds of AP-9 (:data:`~temporality_protocol.TaskEventKind`) but
#: ``metrics``, which the executor reports itself after each provider reply.
ReportKind = Literal["progress", "log", "warning", "partial_result"]
#: ``report_progress``'s ``data``, as compact JSON, is at most this many bytes (a larger one is refused).
REPORT_DATA_MAX_BYTES = 8192


class ReportProgressArgs(BaseModel):
    """AP-9: ``report_progress(kind, message, data, request_id)``; the run machine cuts ``message`` at 4096
    characters and refuses ``data`` over :data:`REPORT_DATA_MAX_BYTES`."""

    model_config = ConfigDict(extra="forbid")

    kind: Annotated[
        ReportKind,
        Field(description="progress (how far along), log, warning, or partial_result (a result so far)"),
    ]
    message: Annotated[str, Field(min_length=1, description="What to report (cut at 4096 characters)")]
    data: Annotated[
        dict[str, Any], Field(description="Structured details, a JSON object (at most 8 KiB), e.g. {percent: 40}")
    ] = Field(default_factory=dict)
    request_id: (
        Annotated[
            str,
            Field(
                min_length=1,
                max_length=128,
                description="The request this is about (e.g. one you received); default: the one this turn answers",
            ),
        ]
        | None
    ) = None


Publish = Callable[[EventData, tuple[str, ...]], Awaitable[None]]
#: A NATS request/reply: ``request(subject, payload, timeout_s) -> reply payload``.
Request = Callable[[str, bytes, float], Awaitable[bytes]]


@dataclass(frozen=True)
class ToolContext:
    """What an implementation gets besides its arguments: the run, where the call is, a way to publish.

    ``publish(data, id_parts)`` publishes a run event whose id is derived from the run, the event type
    and ``id_parts`` (pass the turn and index: a redelivered turn republishes the same id).
    """

    run: RunRecord
    turn: int
    index: int
    call_id: str
    publish: Publish
    #: Request/reply on the bus (``get_collaborators``); ``None`` where the driver offers none.
    request: Request | None = None
    #: The person's answers to this call's earlier elicitations, in the order the tool asked them (a call
    #: retried after it parked the run on its elicitation; see :class:`ElicitationNeeded`).
    elicited: tuple[ElicitAnswer, ...] = ()
    #: The executor's redaction patterns (SEC-1): what a person will read is redacted with them first.
    redactor: Redactor = field(default_factory=Redactor)
    #: The run's own model, for a tool that asks for a completion mid-call (MCP sampling); ``None``: refused.
    sample: Sample | None = None

    @property
    def call_key(self) -> str:
        """The call's idempotency key: derived from the run, the turn, the call's index and the person's answers to
        its elicitations so far -- the same every time this call is made again after a crash (the turn replayed from
        its kept reply), another for the call made again with a new answer (its first attempt was told ``cancel``).
        An MCP server gets it in ``params._meta`` (:data:`~.mcp_servers.IDEMPOTENCY_KEY`)."""
        answers = [a.model_dump(mode="json") for a in self.elicited]
        parts = (json.dumps(answers, sort_keys=True),) if answers else ()
        return derive_id("call", self.run.run_id, str(self.turn), str(self.index), *parts)


ToolFn = Callable[[dict[str, Any], ToolContext], Awaitable[str]]


def _fast_validator(schema: dict[str, Any]) -> jsonschema_rs.Validator | None:
    """``schema`` compiled by ``jsonschema-rs`` (Draft 2020-12, formats as annotations as ``jsonschema``'s default,
    no network: a remote ``$ref`` is not fetched), or ``None`` when it cannot (then ``jsonschema`` alone decides)."""
    try:
        return jsonschema_rs.Draft202012Validator(schema, validate_formats=False, offline=True)
    except ValueError:  # (its ValidationError is one: a $ref it may not fetch, a pattern it cannot compile)
        return None


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    #: JSON schema of the arguments (an object); validated before the implementation runs.
    parameters: dict[str, Any]
    #: ``None``: the engine handles the call itself (``ask_human`` parks the run).
    implementation: ToolFn | None = None
    #: Offered only when a card's ``allow`` names it exactly, never through a pattern (deprecated aliases).
    exact_only: bool = False
    #: The call only reads (``get_input``, ``get_collaborators``): it has no effect outside the run, so a turn of
    #: such calls needs no kept reply (:class:`~.records.KeptReply`). Every other tool -- an MCP server's too --
    #: is taken to have one.
    pure: bool = False
    #: The name it has where it comes from when the model is offered another (an MCP server's ``<server>__<tool>``
    #: that is not a valid function name, :func:`~.mcp_servers.tool_name`); a card's ``tools`` may name either.
    origin: str | None = None
    _validator: Validator = field(init=False, repr=False, compare=False)
    #: The schema compiled by ``jsonschema-rs``, asked first (``None``: it could not compile the schema).
    _fast: jsonschema_rs.Validator | None = field(init=False, repr=False, compare=False)
    _spec: ToolSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        Draft202012Validator.check_schema(self.parameters)
        object.__setattr__(self, "_validator", LinearValidator(self.parameters))
        object.__setattr__(self, "_fast", _fast_validator(self.parameters))
        object.__setattr__(
            self, "_spec", ToolSpec(name=self.name, description=self.description, parameters=self.parameters)
        )

    @property
    def spec(self) -> ToolSpec:
        """What a provider is told of the tool: built once (every turn offers it; the providers only read it)."""
        return self._spec

    def argument_problem(self, arguments: dict[str, Any]) -> str | None:
        """Why ``arguments`` do not fit the schema (the most relevant error, with its location), or ``None``.

        ``jsonschema-rs`` answers first (~10x cheaper than ``jsonschema``'s walk; almost every call a model makes
        fits); only what it refuses is walked by ``jsonschema``, which then decides and words the error as the
        model has always read it."""
        if self._fast is not None and self._fast.is_valid(arguments):
            return None
        error = best_match(self._validator.iter_errors(arguments))
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path) or "(the arguments object)"
        return f"invalid arguments for {self.name!r} at {where}: {error.message}"

    async def invoke(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        if self.implementation is None:
            raise ToolError(f"{self.name!r} is handled by the run itself")
        return await self.implementation(arguments, ctx)


class ToolPolicy(BaseModel):
    """A card's ``tools``: ``allow`` and ``deny`` lists of names or shell-style patterns (``github.*``).

    A tool is allowed when some ``allow`` entry matches it and no ``deny`` entry does; a deprecated alias
    only when ``allow`` names it exactly. A plain list (``tools: [get_input, ask_human]``) is ``allow``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=lambda: [GET_INPUT, ASK_HUMAN]
    )
    deny: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, value: Any) -> Any:
        return {"allow": value} if isinstance(value, list) else value

    def denies(self, tool: Tool) -> bool:
        """Whether a ``deny`` entry matches ``tool`` (by its name or its origin)."""
        names = (tool.name,) if tool.origin is None else (tool.name, tool.origin)
        return any(fnmatchcase(name, pattern) for name in names for pattern in self.deny)

    def allows(self, tool: Tool) -> bool:
        names = (tool.name,) if tool.origin is None else (tool.name, tool.origin)
        if self.denies(tool):
            return False
        if tool.exact_only:
            return tool.name in self.allow
        return any(fnmatchcase(name, pattern) for name in names for pattern in self.allow)

    def exact_names(self) -> list[str]:
        """The entries that are plain names, not patterns (each must name a tool that exists)."""
        return [name for name in [*self.allow, *self.deny] if not _is_pattern(name)]

    def patterns(self) -> list[str]:
        """The entries that are patterns (``*``, ``?`` or ``[``), ``allow``'s then ``deny``'s."""
        return [name for name in [*self.allow, *self.deny] if _is_pattern(name)]


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


def may_match_prefix(pattern: str, prefix: str) -> bool:
    """Whether ``pattern`` may match some name that starts with ``prefix`` (an MCP server's ``<server>__``, whose
    tools are not known yet): its literal start -- the text before its first ``*``, ``?`` or ``[`` -- and ``prefix``
    agree as far as both go. An over-approximation: ``*``, ``?x`` or ``[gh]*`` may match any server's tools."""
    literal = pattern
    for index, char in enumerate(pattern):
        if char in "*?[":
            literal = pattern[:index]
            break
    return literal.startswith(prefix) or prefix.startswith(literal)


#: Policies whose offered tools a registry remembers at most (cards' policies: a handful).
_OFFERED_KEPT = 256


class ToolRegistry:
    """The tools this executor knows; :meth:`offered` and :meth:`prepare` apply a card's policy."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"two tools named {tool.name!r}")
            self._tools[tool.name] = tool
        #: :meth:`offered` per policy (by identity; a card's policy lives as long as the card): a run asks at
        #: every turn boundary, and matching each tool's name against the policy's patterns is the same each time.
        self._offered: dict[int, tuple[ToolPolicy, tuple[Tool, ...]]] = {}

    def with_tools(self, tools: Iterable[Tool]) -> ToolRegistry:
        """This registry plus ``tools`` (a name may not repeat)."""
        return ToolRegistry([*self._tools.values(), *tools])

    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def offered(self, policy: ToolPolicy) -> list[Tool]:
        known = self._offered.get(id(policy))
        if known is None or known[0] is not policy:
            if len(self._offered) >= _OFFERED_KEPT:  # policies made on the fly: keep the memo bounded
                self._offered.clear()
            known = (policy, tuple(tool for tool in self._tools.values() if policy.allows(tool)))
            self._offered[id(policy)] = known
        return list(known[1])

    def specs(self, policy: ToolPolicy) -> list[ToolSpec]:
        return [tool.spec for tool in self.offered(policy)]

    def unknown(self, policy: ToolPolicy) -> list[str]:
        """Plain names in ``policy`` that name no tool here (a typo in a card)."""
        origins = {tool.origin for tool in self._tools.values()}
        return [name for name in policy.exact_names() if name not in self._tools and name not in origins]

    def unmatched(self, policy: ToolPolicy, prefixes: tuple[str, ...] = ()) -> list[str]:
        """Patterns in ``policy`` that match no tool here and cannot match a tool whose name starts with one of
        ``prefixes`` (the name prefixes of MCP servers not listed yet): with no such prefix, patterns that match
        nothing."""
        return [
            pattern
            for pattern in policy.patterns()
            if not any(fnmatchcase(name, pattern) for name in self._names_and_origins())
            and not any(may_match_prefix(pattern, prefix) for prefix in prefixes)
        ]

    def _names_and_origins(self) -> list[str]:
        return [*self._tools, *(tool.origin for tool in self._tools.values() if tool.origin is not None)]

    def resolve(self, name: str, policy: ToolPolicy, agent: str) -> Tool:
        """The tool a call names, if the card allows it; else :class:`ToolError` for the model."""
        tool = self._tools.get(name)
        if tool is not None and policy.allows(tool):
            return tool
        offered = ", ".join(t.name for t in self.offered(policy)) or "none"
        if tool is None:  # (a name the model made up, or a typo: not a tool of this executor at all)
            raise ToolError(f"no tool named {name!r}; your tools: {offered}")
        if policy.denies(tool):
            raise ToolError(f"tool {name!r} is denied for agent {agent} (its tools.deny); its tools: {offered}")
        raise ToolError(f"tool {name!r} is not allowed for agent {agent}; its tools: {offered}")


# --------------------------------------------------------------------------- built-in implementations
async def _get_input(arguments: dict[str, Any], ctx: ToolContext) -> str:
    # Letters as they are (Cyrillic, CJK …): the model reads them, and so does the person on the run's timeline;
    # escaped only where the input holds what UTF-8 cannot carry (a lone surrogate from a ``\ud800`` escape).
    text = json.dumps(ctx.run.input, sort_keys=True, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(ctx.run.input, sort_keys=True)
    return text


async def _notify(arguments: dict[str, Any], ctx: ToolContext) -> str:
    args = NotifyArgs.model_validate(arguments)
    policy = ctx.run.human
    if args.recipient not in policy.allowed_recipients:
        allowed = ", ".join(policy.allowed_recipients) or "nobody"
        raise ToolError(f"{args.recipient} may not be notified by this run; people you may address: {allowed}")
    notification_id = derive_id("hn", ctx.run.run_id, str(ctx.turn), str(ctx.index))
    redactor = ctx.redactor  # SEC-1: like human.requested, no secret on the bus or in the journal
    await ctx.publish(
        HumanNotifyRequested(
            notification_id=notification_id,
            run_id=ctx.run.run_id,
            agent=ctx.run.agent,
            title=redactor.redact(ctx.run.title).text,
            recipient=args.recipient,
            message=redactor.redact(args.message).text or "(redacted)",
            policy=policy,
            turn=ctx.turn,
        ),
        (str(ctx.turn), str(ctx.index)),
    )
    return json.dumps({"status": "queued", "notification_id": notification_id})


async def _get_collaborators(arguments: dict[str, Any], ctx: ToolContext) -> str:
    """COL-1: agent-collab's view of the run's saga. It not answering is a tool error, never a broken run."""
    if ctx.request is None:
        raise ToolError("get_collaborators is not available here")
    query = CollaboratorsQuery(run_id=ctx.run.run_id).model_dump_json().encode()
    try:
        raw = await ctx.request(RPC_GET_COLLABORATORS, query, COLLABORATORS_TIMEOUT_S)
    except Exception as exc:  # no responder, a timeout, a connection lost: the model may try again later
        raise ToolError(f"the collaboration service did not answer ({type(exc).__name__}); try again later") from exc
    try:
        reply = CollaboratorsReply.model_validate_json(raw)
    except ValueError as exc:
        raise ToolError("the collaboration service sent an unreadable reply") from exc
    if reply.error:
        raise ToolError(f"no collaborators: {reply.error}")
    items = [c.model_dump(mode="json", exclude_none=True) for c in reply.collaborators]
    return json.dumps({"saga_id": reply.saga_id, "collaborators": items}, sort_keys=True)


BUILTIN_TOOLS: tuple[Tool, ...] = (
    Tool(
        name=GET_INPUT,
        description="The data this run was started with (what its trigger passes to the agent), as JSON.",
        parameters=_NO_ARGUMENTS,
        implementation=_get_input,
        pure=True,
    ),
    Tool(
        name=ASK_HUMAN,
        description="Ask a person a compact, self-contained question and wait (durably, at no cost) for the "
        "answer, which comes back as this tool's result. Name a person (user:<id>) or a group (group:<id>: "
        "every member is asked, the first answer counts), never a channel. Say why you ask in reason and "
        "reason_kind. Several calls in one reply ask them all at once; see wait_for.",
        parameters=AskHumanArgs.model_json_schema(),
    ),
    Tool(
        name=NOTIFY,
        description="Tell a person (user:<id>) or every member of a group (group:<id>) something that needs no "
        "answer; the run does not wait.",
        parameters=NotifyArgs.model_json_schema(),
        implementation=_notify,
    ),
    Tool(
        name=GET_COLLABORATORS,
        description="Who takes part in this run's saga: agents (agent:<id>), people (human:<id>) and runs "
        "(run:<id>), with their role, task and status. Address ask_agent with these ids.",
        parameters=_NO_ARGUMENTS,
        implementation=_get_collaborators,
        pure=True,
    ),
    Tool(
        name=ASK_AGENT,
        description="Ask another agent of this saga something. mode=async (default): returns at once with a "
        "request id; the answer arrives later as a message. mode=wait: wait (durably, at no cost) for the answer "
        "as this tool's result, at most `timeout` seconds; after that the answer may still arrive as a message.",
        parameters=AskAgentArgs.model_json_schema(),
    ),
    Tool(
        name=ANSWER_AGENT,
        description="Answer a request another agent sent you (its request id is in the message), once. Set "
        "refuse=true to decline it, saying why in `answer`.",
        parameters=AnswerAgentArgs.model_json_schema(),
    ),
    Tool(
        name=HANDOFF_TO_AGENT,
        description="Hand this task over to another agent, with everything it needs to carry on: a new run of that "
        "agent starts in this saga with your handoff document as its input, and this run ends (completed, handed "
        "off) after this turn. Use it when another agent should finish the work, not to ask a question.",
        parameters=HandoffArgs.model_json_schema(),
    ),
    Tool(
        name=REPORT_PROGRESS,
        description="Report how the task goes without waiting for anything: progress, a log line, a warning, or a "
        "partial result, shown in the run's timeline. Keep it short; never put secrets in it.",
        parameters=ReportProgressArgs.model_json_schema(),
    ),
    Tool(
        name="get_pr_context",
        description="Deprecated: the same as get_input.",
        parameters=_NO_ARGUMENTS,
        implementation=_get_input,
        exact_only=True,
        pure=True,
    ),
)
