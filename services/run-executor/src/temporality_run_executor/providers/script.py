"""Declarative scripts for the scripted provider (deterministic, for demos and tests).

A script is YAML: ``vars`` (named values, computed every turn: those the turn's steps can read) and ``steps``; each step is one turn of
the agent -- call a tool, or answer (the final text, which completes the run)::

    vars:
      pr: "{{ results.read }}"
    steps:
      - id: read
        call: {tool: get_input}
      - id: ask
        when: "length(run.people) > `0`"
        say: I need a decision.
        call:
          tool: ask_human
          args: {recipient: "{{ run.people[0] }}", question: "Merge PR #{{ vars.pr.id }}?"}
      - id: done
        answer:
          switch: "results.ask.answer.option_id || 'none'"
          cases: {merge: "Merged."}
          default: "Not merged."

Expressions are JMESPath (``when``, ``switch``, and inside ``{{ }}`` in any string of ``say``, ``args``,
``answer`` and ``vars``), evaluated over the **scope**:

``results.<step id>``  what that step's tool call returned (JSON parsed; a string if it is not JSON;
                       ``null`` while the step has not run). An ``ask_human`` result is the person's
                       outcome: ``status`` (``answered``/``expired``/``rejected``), ``answer``
                       (``{type: option, option_id, label}`` or ``{type: text, value}``), ``responder``,
                       ``error``.
``vars.<name>``        the script's ``vars``, in order (a var sees the ones above it).
``run``                ``run_id``, ``agent``, ``title``, ``people`` (whom the run may ask), ``turn``;
                       ``run.sampling`` when the call answers an MCP tool's sampling request (``null``
                       for a turn): ``max_tokens``, ``temperature``, ``stop``, ``model``, ``hints`` as the
                       request asked them (the script's steps run on the request's own conversation).
``tools``              the names of the tools the card offers.

A string that is exactly one ``{{ expr }}`` takes the expression's value (a list, an object, a
number); otherwise each ``{{ expr }}`` is replaced by its text (``null``: empty; lists and objects as
JSON). Besides JMESPath's functions there is ``matches(pattern, text)``: the distinct matches of the
regular expression ``pattern`` in ``text``, lower-cased and sorted (``[]`` for ``null`` text).

A step may make several tool calls in one reply instead (``calls: [{tool, args}, ...]``, as a model's
parallel tool calls; e.g. two ``ask_human`` asked at once): their ids are ``call-<step id>.<n>`` and
``results.<step id>`` is the list of their results in call order (``null`` for one not returned yet).

Which step runs next is read from the conversation alone (each call's id is ``call-<step id>``): the
first step after the last one that ran whose ``when`` holds (no ``when``: always). So the provider keeps
no state and resumes correctly from any checkpoint. A script must end with an ``answer`` step without
``when``, so it always ends. Every expression is compiled when the card is loaded: a bad one stops the
executor at start (exit 2) naming the step and the field.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Annotated, Any

import jmespath
import yaml
from jmespath import functions as jp_functions
from jmespath.exceptions import JMESPathError
from jmespath.parser import ParsedResult
from jmespath.visitor import TreeInterpreter
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from temporality_run_executor.providers.jmespath_closures import Program, build

__all__ = [
    "BUILTIN_SCRIPTS",
    "CALL_PREFIX",
    "Script",
    "ScriptAnswer",
    "ScriptCall",
    "ScriptError",
    "ScriptStep",
    "evaluate",
    "load_script",
    "render",
]

#: Every scripted tool call's id is ``call-<step id>``: the conversation says which steps ran.
CALL_PREFIX = "call-"
_TEMPLATE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_WHOLE = re.compile(r"^\s*\{\{(.*?)\}\}\s*$", re.DOTALL)
#: Named scripts shipped with the executor (``provider: {kind: scripted, script: <name>}``).
BUILTIN_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


class ScriptError(Exception):
    """A script cannot be loaded, or an expression failed while it ran."""


class _Functions(jp_functions.Functions):
    @jp_functions.signature({"types": ["string"]}, {"types": ["string", "null"]})
    def _func_matches(self, pattern: str, text: str | None) -> list[str]:
        if text is None:
            return []
        return sorted({m.group(0).lower() for m in re.finditer(pattern, text)})


_OPTIONS = jmespath.Options(custom_functions=_Functions())


def _compile(expression: str, where: str) -> ParsedResult:
    try:
        return _compiled(expression)
    except JMESPathError as exc:
        raise ValueError(f"{where}: not a JMESPath expression ({expression.strip()!r}): {exc}") from exc


@functools.lru_cache(maxsize=4096)
def _compiled(expression: str) -> ParsedResult:
    """``expression`` parsed once: a script's expressions are evaluated every turn of every run (a parse
    each time was about a tenth of the scripted provider's CPU). Bounded: a script holds a few dozen."""
    return jmespath.compile(expression.strip())


def _check_templates(value: Any, where: str) -> None:
    """Compile every ``{{ }}`` in ``value`` (strings, lists, objects), so a typo fails at load."""
    if isinstance(value, str):
        for match in _TEMPLATE.finditer(value):
            _compile(match.group(1), where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_templates(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_templates(item, f"{where}.{key}")


#: The one interpreter the closures call for the functions and any node type they leave to it (stateless
#: between evaluations: its options, its functions, a cache of its own methods).
_INTERPRETER = TreeInterpreter(_OPTIONS)


@functools.lru_cache(maxsize=4096)
def _program(expression: str) -> Program:
    """``expression`` as closures (:mod:`.jmespath_closures`), built once: what ``ParsedResult.search`` computes,
    without walking the parsed tree node by node at every evaluation."""
    return build(_compiled(expression).parsed, _INTERPRETER)


def evaluate(expression: str, scope: dict[str, Any], where: str) -> Any:
    """The JMESPath ``expression`` over ``scope``; :class:`ScriptError` naming ``where`` when it fails."""
    try:
        _compile(expression, where)  # a parse error raised as it always was (cached)
        return _program(expression)(scope)
    except JMESPathError as exc:
        raise ScriptError(f"{where}: {expression.strip()!r} failed: {exc}") from exc


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    return json.dumps(value, sort_keys=True)


def render(value: Any, scope: dict[str, Any], where: str) -> Any:
    """``value`` with every ``{{ expr }}`` evaluated over ``scope`` (see the module docstring)."""
    if isinstance(value, str):
        whole, parts = _template(value)
        if whole is not None:
            return evaluate(whole, scope, where)
        if len(parts) == 1:  # no template at all
            return value
        # literal text and expressions alternate (re.split with a group): what _TEMPLATE.sub would build
        return "".join(part if i % 2 == 0 else _text(evaluate(part, scope, where)) for i, part in enumerate(parts))
    if isinstance(value, list):
        return [render(item, scope, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {key: render(item, scope, f"{where}.{key}") for key, item in value.items()}
    return value


@functools.lru_cache(maxsize=4096)
def _template(value: str) -> tuple[str | None, tuple[str, ...]]:
    """A template string split once (a script's strings are rendered every turn of every run): the expression
    of a string that is exactly one ``{{ expr }}`` (its value is the expression's), else the literal text and
    the expressions in turn."""
    whole = _WHOLE.match(value)
    if whole and "{{" not in whole.group(1):
        return whole.group(1), ()
    return None, tuple(_TEMPLATE.split(value))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScriptCall(_Strict):
    tool: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    #: The call's arguments; any string in them may hold ``{{ }}`` templates.
    args: dict[str, Any] = Field(default_factory=dict)


class ScriptAnswer(_Strict):
    """The final text chosen by a value: ``cases[<value of switch>]``, else ``default``. (Not ``on``: YAML
    1.1 reads that key as ``true``.)"""

    switch: str
    cases: dict[str, str] = Field(default_factory=dict)
    default: str


class ScriptStep(_Strict):
    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,40}$")]
    #: JMESPath: the step runs only when this is truthy (unset: always).
    when: str | None = None
    #: With ``call`` (or ``calls``): the assistant's text alongside the call.
    say: str | None = None
    call: ScriptCall | None = None
    #: Several tool calls in one reply (as a model's parallel tool calls): ids ``call-<step id>.<n>``, and
    #: ``results.<step id>`` is the list of their results in call order.
    calls: Annotated[list[ScriptCall], Field(min_length=1, max_length=10)] | None = None
    #: The final text (a template), or one chosen by a value.
    answer: str | ScriptAnswer | None = None

    @model_validator(mode="after")
    def _shape(self) -> ScriptStep:
        where = f"step {self.id}"
        if sum(x is not None for x in (self.call, self.calls, self.answer)) != 1:
            raise ValueError(f"{where}: exactly one of call or answer (or calls: several calls in one reply)")
        if self.say is not None and self.answer is not None:
            raise ValueError(f"{where}: say goes with a call (an answer is its own text)")
        if self.when is not None:
            _compile(self.when, f"{where}.when")
        _check_templates(self.say, f"{where}.say")
        if self.call is not None:
            _check_templates(self.call.args, f"{where}.call.args")
        for n, call in enumerate(self.calls or []):
            _check_templates(call.args, f"{where}.calls[{n}].args")
        if isinstance(self.answer, ScriptAnswer):
            _compile(self.answer.switch, f"{where}.answer.switch")
            _check_templates(self.answer.cases, f"{where}.answer.cases")
            _check_templates(self.answer.default, f"{where}.answer.default")
        else:
            _check_templates(self.answer, f"{where}.answer")
        return self


class Script(_Strict):
    #: Named values computed every turn, in order: templates (``"{{ results.read }}"``).
    vars: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], Any] = Field(default_factory=dict)
    steps: Annotated[list[ScriptStep], Field(min_length=1)]
    #: :meth:`vars_read_from` by step, worked out once.
    _vars_read: dict[int, frozenset[str]] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _whole(self) -> Script:
        ids = [s.id for s in self.steps]
        if len(set(ids)) != len(ids):
            raise ValueError(f"step ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
        last = self.steps[-1]
        if last.answer is None or last.when is not None:
            raise ValueError(f"the last step ({last.id}) must be an answer without when, so the script always ends")
        for name, value in self.vars.items():
            _check_templates(value, f"vars.{name}")
        return self

    def step_index(self, step_id: str) -> int | None:
        # a scan of the few steps (~1 us): a dict kept in a private attribute costs more to reach (pydantic's
        # __getattr__: ~2.3 us an access)
        return next((i for i, s in enumerate(self.steps) if s.id == step_id), None)

    def vars_read_from(self, start: int) -> frozenset[str]:
        """The ``vars`` a turn that starts at step ``start`` can read: those the expressions of ``steps[start:]``
        name (``vars.<name>``), and those these vars' own templates name, in turn. Every var when one of those
        expressions reads ``vars`` otherwise (whole, projected, piped: :func:`_vars_named`)."""
        read = self._vars_read.get(start)
        if read is None:
            read = self._vars_read[start] = _vars_read(self, start)  # a few per script: one per step
        return read


def _vars_read(script: Script, start: int) -> frozenset[str]:
    everything = frozenset(script.vars)
    named: set[str] = set()
    for step in script.steps[start:]:
        if not _vars_named(_step_expressions(step), named):
            return everything
    pending = list(named)
    while pending:
        name = pending.pop()
        if name not in script.vars:
            continue  # no such var: null, as when all are rendered
        own: set[str] = set()
        if not _vars_named(_template_expressions(script.vars[name]), own):
            return everything
        pending.extend(own - named)
        named |= own
    return frozenset(named) & everything


def _step_expressions(step: ScriptStep) -> list[str]:
    """Every expression a step can evaluate: its ``when``, its answer's ``switch``, and each ``{{ }}``."""
    found = [step.when] if step.when is not None else []
    found += _template_expressions(step.say)
    found += _template_expressions(step.call.args if step.call is not None else None)
    for call in step.calls or []:
        found += _template_expressions(call.args)
    if isinstance(step.answer, ScriptAnswer):
        found.append(step.answer.switch)
        found += _template_expressions(step.answer.cases)
        found += _template_expressions(step.answer.default)
    else:
        found += _template_expressions(step.answer)
    return found


def _template_expressions(value: Any) -> list[str]:
    """The ``{{ }}`` expressions in ``value`` (strings, lists, objects), as :func:`render` finds them."""
    if isinstance(value, str):
        return [match.group(1) for match in _TEMPLATE.finditer(value)]
    if isinstance(value, list):
        return [e for item in value for e in _template_expressions(item)]
    if isinstance(value, dict):
        return [e for item in value.values() for e in _template_expressions(item)]
    return []


def _vars_named(expressions: list[str], into: set[str]) -> bool:
    """Add to ``into`` the var names ``expressions`` read as ``vars.<name>``; ``False`` when one of them reads
    ``vars`` in any other way (``vars`` itself, ``vars.*``, ``keys(vars)``, ``vars | x``, ``@.vars``...) or the
    scope as a whole (``@``, ``values(@)``, ``*.a``, ``[*]``, ``[]``, ``[0]`` at the top): then only every var
    will do. Conservative: a ``vars.<name>`` below the root (``results.x[*].vars.y``) is counted as a var too,
    and a ``vars`` field anywhere as reading every var, which only renders more."""
    return all(_node_names(dict(_compiled(expression).parsed), into) for expression in expressions)


#: Nodes whose first child reads the scope they are evaluated in and whose other children read what it gave.
_CHAINED = frozenset(
    {"subexpression", "index_expression", "projection", "value_projection", "filter_projection", "pipe", "flatten"}
)
#: Nodes that are the scope they are evaluated in (``@``; the implicit left side of ``*.a``, ``[*]``, ``[0]``).
_SCOPE = frozenset({"current", "identity"})


def _node_names(node: dict[str, Any], into: set[str], at_root: bool = True) -> bool:
    """:func:`_vars_named` for one node; ``at_root``: the node is evaluated against the whole scope (the top
    of the expression, a function's argument there...), not against what another node gave."""
    kind = node.get("type")
    children = [child for child in node.get("children", []) if isinstance(child, dict)]
    if at_root and kind in _SCOPE:
        return False  # the whole scope, ``vars`` with it
    if kind == "field" and node.get("value") == "vars":
        return False  # ``vars`` read other than as ``vars.<name>``
    if (
        kind == "subexpression"
        and len(children) >= 2
        and children[0] == {"type": "field", "children": [], "value": "vars"}
        and children[1].get("type") == "field"
    ):
        into.add(children[1]["value"])
        return all(_node_names(child, into, at_root=False) for child in children[2:])
    if kind in _CHAINED and children:
        first, rest = children[0], children[1:]
        return _node_names(first, into, at_root) and all(_node_names(c, into, at_root=False) for c in rest)
    if kind == "expref":  # ``&expr``: evaluated against the elements a function hands it, never the scope
        return all(_node_names(child, into, at_root=False) for child in children)
    return all(_node_names(child, into, at_root) for child in children)


def load_script(path: Path) -> Script:
    """A script from a YAML file (its top level is the script: ``vars`` and ``steps``)."""
    try:
        return Script.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise ScriptError(f"{path}: {exc}") from exc
