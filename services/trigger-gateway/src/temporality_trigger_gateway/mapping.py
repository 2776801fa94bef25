"""Input mapping (TRG-8): which data of the normalized event becomes the agent's input.

A trigger's ``input`` maps agent-input field names to `JMESPath <https://jmespath.org>`_ expressions
evaluated over the normalized event (TRG-4) as one JSON document::

    {"id", "type", "source", "timestamp", "actor", "tenant", "payload", "metadata",  # the event
     "context"}                                                                      # the trigger's own

    input:
      repository: payload.repository.name
      pull_request: payload.pull_request.id
      source_branch: payload.pull_request.source_branch
      author: actor.display_name || actor.id

Expressions are compiled once, when the trigger is loaded or saved (an invalid one is refused naming
the field: exit 2 for the triggers file, 422 for the admin API), never per delivery. Invalid includes what
would fail on every event (:func:`_fails_on_any_event`): a function JMESPath does not have (``foo(x)``), a
known one with the wrong number of arguments, an argument of a type the function never takes (a literal,
another function's result, a value where ``&expression`` is due), a call that reads nothing of the event and
fails. A type error that depends on the data (``length(payload.missing)``) is found per delivery. An expression
that matches nothing yields ``null`` (JMESPath's own rule), so a field the sender omits does not fail
the delivery. Without a mapping the input is the event's payload, as before, plus ``context`` when the
trigger has one. A trigger never carries the agent's system prompt: behaviour lives in the agent card.

A trigger's ``when`` is a condition over the same document (:func:`condition_holds`), with JMESPath's
truthiness (:func:`is_truthy`: ``false``, ``null`` and empty strings, lists and objects are false; ``0``
is true). Every evaluation goes through :func:`evaluate`, which turns whatever an expression can fail with
on a particular event into :class:`MappingFailed` naming it.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from string import Template
from typing import Any

import jmespath
import jmespath.functions
from jmespath.exceptions import JMESPathError
from jmespath.parser import ParsedResult

from temporality_protocol import NormalizedEvent

__all__ = [
    "MAX_EXPRESSION",
    "MappingFailed",
    "agent_input",
    "check_prompt",
    "compile_expression",
    "compile_mapping",
    "condition_holds",
    "evaluate",
    "event_document",
    "is_truthy",
    "render_prompt",
]

#: An expression longer than this is refused (a mapping is a few paths, not a program).
MAX_EXPRESSION = 1000


def compile_mapping(mapping: Mapping[str, str]) -> dict[str, ParsedResult]:
    """Every expression compiled; ``ValueError`` naming the first field whose expression is invalid."""
    return {field: compile_expression(expression, f"input.{field}") for field, expression in mapping.items()}


def compile_expression(expression: str, where: str) -> ParsedResult:
    """One JMESPath expression compiled; ``ValueError`` starting with ``where`` when it is invalid."""
    if not expression.strip():
        raise ValueError(f"{where}: the expression is empty")
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"{where}: the expression is longer than {MAX_EXPRESSION} characters")
    try:
        with warnings.catch_warnings():
            # `foo` (a literal that is not JSON) is JMESPath's deprecated string literal: still valid, and
            # the warning would say so at every compile (or fail under -W error)
            warnings.simplefilter("ignore", PendingDeprecationWarning)
            compiled = jmespath.compile(expression)
    except JMESPathError as exc:
        reason = str(exc).splitlines()[0][:200]
        raise ValueError(f"{where}: not a valid JMESPath expression ({reason})") from None
    except RecursionError:  # the parser recurses per nesting level: "((((…" or "!!!!…"
        raise ValueError(f"{where}: the expression is nested too deeply") from None
    if _stray_reference(compiled.parsed):  # `&a` evaluates to a function object, not to JSON
        raise ValueError(
            f"{where}: `&…` (an expression reference) may only be an argument of {', '.join(_TAKE_REFERENCES)}"
        )
    wrong = _fails_on_any_event(expression, compiled.parsed)
    if wrong is not None:
        raise ValueError(f"{where}: {wrong}")
    try:  # so does the interpreter ("a|a|a|…" parses flat enough): find out now, not per delivery
        compiled.search({})
    except (JMESPathError, TypeError, ArithmeticError):
        pass  # a type error on the empty document (length(null)): data-dependent (the checks above found none other)
    except RecursionError:
        raise ValueError(f"{where}: the expression is nested too deeply") from None
    return compiled


#: The built-in functions that take an expression reference (``sort_by(@, &age)``) and return plain values.
_TAKE_REFERENCES = ("map", "max_by", "min_by", "sort_by")


def _stray_reference(parsed: Mapping[str, Any]) -> bool:
    """Whether the parsed expression has an ``expref`` anywhere but as an argument of :data:`_TAKE_REFERENCES`
    (a loop, not recursion: the tree of ``a|a|a|…`` is as deep as the expression is long)."""
    pending: list[tuple[Mapping[str, Any], str | None]] = [(parsed, None)]
    while pending:
        node, argument_of = pending.pop()
        if node.get("type") == "expref" and argument_of not in _TAKE_REFERENCES:
            return True
        function = node.get("value") if node.get("type") == "function_expression" else None
        pending.extend((child, function) for child in node.get("children", []) if isinstance(child, dict))
    return False


#: The functions of the runtime the expressions are evaluated with: ``ParsedResult.search`` without options, i.e.
#: jmespath's built-in ones (the gateway registers no custom function).
_FUNCTIONS: Mapping[str, Any] = jmespath.functions.Functions.FUNCTION_TABLE
_JSON_TYPES = frozenset({"null", "boolean", "number", "string", "array", "object"})
_NUMBER, _STRING, _ARRAY, _NULL = (
    frozenset({"number"}),
    frozenset({"string"}),
    frozenset({"array"}),
    frozenset({"null"}),
)
_BOOLEAN = frozenset({"boolean"})
#: What each built-in function can return (a superset); one not listed: any JSON value.
_RETURNS: Mapping[str, frozenset[str]] = {
    "abs": _NUMBER,
    "avg": _NUMBER | _NULL,
    "ceil": _NUMBER,
    "contains": _BOOLEAN,
    "ends_with": _BOOLEAN,
    "floor": _NUMBER,
    "join": _STRING,
    "keys": _ARRAY,
    "length": _NUMBER,
    "map": _ARRAY,
    "max": _NUMBER | _STRING | _NULL,
    "merge": frozenset({"object"}),
    "min": _NUMBER | _STRING | _NULL,
    "reverse": _ARRAY | _STRING,
    "sort": _ARRAY,
    "sort_by": _ARRAY,
    "starts_with": _BOOLEAN,
    "sum": _NUMBER,
    "to_array": _ARRAY,
    "to_number": _NUMBER | _NULL,
    "to_string": _STRING,
    "type": _STRING,
    "values": _ARRAY,
}
#: Node types whose value is known to be one of these, whatever the event.
_NODE_TYPES: Mapping[str, frozenset[str]] = {
    "not_expression": _BOOLEAN,
    "multi_select_list": _ARRAY | _NULL,
    "multi_select_dict": frozenset({"object", "null"}),
    "projection": _ARRAY | _NULL,
    "value_projection": _ARRAY | _NULL,
    "filter_projection": _ARRAY | _NULL,
    "flatten": _ARRAY | _NULL,
    "slice": _ARRAY | _NULL,
    "expref": frozenset({"expref"}),
}
#: Node types that read the document (or the current element): a subtree without any evaluates the same on
#: every event.
_READS_DATA = frozenset({"field", "current", "identity", "index", "slice", "multi_select_list", "multi_select_dict"})


def _fails_on_any_event(expression: str, parsed: Mapping[str, Any]) -> str | None:
    """Why ``parsed`` fails whenever the failing part is evaluated, whatever the event (``None``: no such
    part found): a function the runtime does not have, a known one given the wrong number of arguments or an
    argument of a type it never takes (a literal, another function's result, an expression reference), or a
    call that reads nothing of the event and fails (``ceil(`1e400`)``). Evaluating on ``{}`` cannot tell these
    from a type error of missing data (``length(null)``), so they would pass a save and refuse every delivery."""
    pending: list[Mapping[str, Any]] = [parsed]
    while pending:  # a loop, not recursion: `a|a|a|…` is as deep as the expression is long
        node = pending.pop()
        if node.get("type") == "function_expression":
            wrong = _wrong_call(node)
            if wrong is None and _reads_nothing(node):
                wrong = _fails_anyway(expression, node)
            if wrong is not None:
                return wrong
        pending.extend(reversed([child for child in node.get("children", []) if isinstance(child, dict)]))
    return None


def _wrong_call(node: Mapping[str, Any]) -> str | None:
    """What is wrong with one function call whatever the event, as the runtime would check it."""
    name = str(node.get("value"))
    arguments = [child for child in node.get("children", []) if isinstance(child, dict)]
    spec = _FUNCTIONS.get(name)
    if spec is None:
        return f"unknown function {name}() (JMESPath's functions: {', '.join(sorted(_FUNCTIONS))})"
    signature = spec["signature"]
    variadic = bool(signature) and bool(signature[-1].get("variadic"))
    expected = len(signature)
    if (variadic and len(arguments) < expected) or (not variadic and len(arguments) != expected):
        takes = f"at least {expected}" if variadic else str(expected)
        return f"{name}() takes {takes} argument{'' if expected == 1 else 's'}, not {len(arguments)}"
    for position, (parameter, argument) in enumerate(zip(signature, arguments, strict=False), start=1):
        allowed: list[str] = parameter["types"]
        if not allowed:
            continue
        if argument.get("type") == "literal":
            fits = any(_fits(argument.get("value"), wanted) for wanted in allowed)
            got = f"the literal {json.dumps(argument.get('value'))[:60]}"
        else:
            types = _types_of(argument)
            fits = bool(types & {wanted.split("-", 1)[0] for wanted in allowed})
            if types == {"expref"}:
                got = "an expression reference"
            elif types == _JSON_TYPES:
                got = "a value (an expression reference is written &expression)"
            else:
                got = f"always {' or '.join(sorted(types))}"
        if not fits:
            wanted_text = " or ".join("an expression reference (&…)" if t == "expref" else t for t in allowed)
            return f"argument {position} of {name}() must be {wanted_text}; it is {got}"
    return None


def _types_of(node: Mapping[str, Any]) -> frozenset[str]:
    """The JMESPath types ``node`` can evaluate to, whatever the event (all JSON types when unknown)."""
    kind = node.get("type")
    if kind == "function_expression":
        return _RETURNS.get(str(node.get("value")), _JSON_TYPES)
    if kind == "comparator":
        return _BOOLEAN if node.get("value") in ("eq", "ne") else _BOOLEAN | _NULL
    children = [c for c in node.get("children", []) if isinstance(c, dict)]
    if kind in ("or_expression", "and_expression") and children:  # one of its two sides' values
        return frozenset().union(*(_types_of(c) for c in children))
    if kind in ("subexpression", "index_expression", "pipe") and children:  # each applied to the one before
        return _types_of(children[-1])
    return _NODE_TYPES.get(str(kind), _JSON_TYPES)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _fits(value: Any, wanted: str) -> bool:
    """Whether a literal ``value`` passes the runtime's check for the signature type ``wanted``
    (``array-number``: an array whose items are all numbers)."""
    top, _, items = wanted.partition("-")
    if _type_name(value) != top:
        return False
    return not items or all(_type_name(item) == items for item in value)


def _reads_nothing(node: Mapping[str, Any]) -> bool:
    """Whether no part of ``node`` reads the event (nor the element a projection or a function hands it)."""
    pending = [node]
    while pending:
        current = pending.pop()
        if current.get("type") in _READS_DATA:
            return False
        pending.extend(child for child in current.get("children", []) if isinstance(child, dict))
    return True


def _fails_anyway(expression: str, node: Mapping[str, Any]) -> str | None:
    """A call that reads nothing of the event, evaluated: its error is the one every event would meet."""
    try:
        ParsedResult(expression, node).search(None)  # type: ignore[arg-type]
    except (JMESPathError, TypeError, ArithmeticError) as exc:
        reason = str(exc).splitlines()[0][:200]
        return f"{node.get('value')}() fails whatever the event ({reason})"
    except RecursionError:
        return None  # the evaluation on {} below names it
    return None


def event_document(event: NormalizedEvent, context: Mapping[str, Any]) -> dict[str, Any]:
    """What the expressions see: the normalized event as JSON, plus the trigger's static ``context``."""
    document = event.model_dump(mode="json")
    document["context"] = dict(context)
    return document


def agent_input(
    event: NormalizedEvent, compiled: Mapping[str, ParsedResult] | None, context: Mapping[str, Any]
) -> dict[str, Any]:
    """The agent's input for ``event``: the mapping applied, or the payload (plus ``context``) without one.

    ``JMESPathError`` from a function applied to the wrong type (``length(`5`)``) propagates: the caller
    turns it into a refusal of the delivery naming the field."""
    if compiled is None:
        if not context:
            return event.payload
        return {**event.payload, "context": dict(context)}
    document = event_document(event, context)
    return {field: evaluate(expression, document, field) for field, expression in compiled.items()}


def evaluate(compiled: ParsedResult, document: Mapping[str, Any], field: str, *, section: str = "input") -> Any:
    """``compiled`` applied to ``document``; :class:`MappingFailed` naming ``section.field`` when it cannot be
    evaluated on this document: a function given the wrong type, an expression nested too deeply, or an
    ordering (``<``, ``>``) between a string and a number, which the jmespath library raises as TypeError."""
    try:
        return compiled.search(document)
    except JMESPathError as exc:
        raise MappingFailed(field, str(exc).splitlines()[0][:200], section=section) from None
    except RecursionError:
        raise MappingFailed(field, "the expression is nested too deeply to evaluate", section=section) from None
    except (TypeError, ArithmeticError) as exc:
        raise MappingFailed(field, f"cannot be evaluated on these values ({exc})"[:200], section=section) from None


def is_truthy(value: Any) -> bool:
    """JMESPath's truthiness: ``false``, ``null``, an empty string, list or object are false; everything
    else (``0`` included, unlike Python) is true."""
    if value is None or value is False:
        return False
    if isinstance(value, str | list | dict):
        return len(value) > 0
    return True


def condition_holds(compiled: ParsedResult, document: Mapping[str, Any]) -> bool:
    """Whether a trigger's ``when`` holds on ``document`` (:func:`event_document`); :class:`MappingFailed`
    (section ``when``) when it cannot be evaluated on it (a function given the wrong type)."""
    return is_truthy(evaluate(compiled, document, "", section="when"))


class MappingFailed(ValueError):
    """An expression could not be evaluated on this event (a type error inside a JMESPath function)."""

    def __init__(self, field: str, reason: str, *, section: str = "input") -> None:
        where = f"{section}.{field}" if field else section
        super().__init__(f"{where}: {reason}")
        self.field = field
        #: Where the failing expression is: ``input`` (a mapped field), ``concurrency`` (its ``key``) or
        #: ``when`` (the trigger's condition; ``field`` is then empty).
        self.section = section
        #: The failing expression's place as written: ``input.author``, ``concurrency.key``, ``when``.
        self.where = where
        self.reason = reason

    def failing(self, on: str = "this event") -> str:
        """What failed, for a sender or an operator: the expression's place and its error."""
        return f"the trigger's {self.where} expression failed on {on}: {self.reason}"

    def detail(self, on: str = "this event") -> str:
        """The ``trigger.rejected(invalid_payload)`` detail of a delivery recorded ``mapping_failed``, whatever
        the trigger's kind (webhook, event, schedule): the prefix tells a broken trigger from a bad payload."""
        return f"mapping_failed: {self.failing(on)}"


def check_prompt(template: str, fields: Mapping[str, str] | None) -> None:
    """``ValueError`` unless ``template`` is a valid ``${field}`` template whose fields the mapping produces
    (any field is accepted without a mapping: the payload's keys are known only per event)."""
    parsed = Template(template)
    if not parsed.is_valid():
        raise ValueError("not a valid template: write ${field} for an input field and $$ for a dollar sign")
    if fields is not None:
        unknown = sorted(set(parsed.get_identifiers()) - set(fields))
        if unknown:
            raise ValueError(f"the template uses {', '.join(unknown)}, which the input mapping does not produce")


def render_prompt(template: str, values: Mapping[str, Any]) -> str:
    """The task prompt: each ``${field}`` replaced by the input's value (a string as is, a list one item per
    line, anything else as JSON; a missing field stays ``${field}``)."""

    def text(value: Any) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return "\n".join(f"- {text(item)}" for item in value)
        return json.dumps(value, ensure_ascii=False)

    return Template(template).safe_substitute({k: text(v) for k, v in values.items()})
