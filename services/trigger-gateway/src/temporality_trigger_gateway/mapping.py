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
the field: exit 2 for the triggers file, 422 for the admin API), never per delivery. An expression
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
    try:  # so does the interpreter ("a|a|a|…" parses flat enough): find out now, not per delivery
        compiled.search({})
    except (JMESPathError, TypeError, ArithmeticError):
        pass  # a type error on the empty document (length(null)): fine, real events have data
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
