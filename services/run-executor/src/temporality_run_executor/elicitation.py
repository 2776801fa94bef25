"""MCP elicitation as an ordinary human request: the server's form rendered as a question, the person's
answer read back into what the server is told (pure functions, used by the run machine).

An elicitation (``elicitation/create``, MCP 2025-06-18) carries a message and a requested schema: a flat
object of primitive fields (string, number, integer, boolean, enums). :func:`render` turns it into a
``human.requested``:

* one field with a closed set of values (a boolean, an ``enum``, a ``oneOf`` of ``const`` s): one option
  per value (``yes``/``no`` for a boolean), no free text;
* anything else (free text fields, several fields): free text, the fields listed in the context -- one
  line per field (``name: value``) or a JSON object; a single field takes the whole text.

Every form also has the option ``decline`` (the person refuses to give the information). :func:`read`
turns the answer into the elicitation's result: ``decline``; ``accept`` with content validated against
the requested schema (JSON Schema 2020-12, values coerced from text by their field's type); or, when the
answer does not fit, the reason (the run asks again, saying why, at most :data:`MAX_REFUSED` times).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match

from temporality_protocol import HumanAnswer, HumanOption, OptionAnswer

__all__ = ["DECLINE", "MAX_REFUSED", "Form", "Read", "form_problem", "read", "render"]

#: The option every form has: the person declines to give the information (the server is told ``decline``).
DECLINE = "decline"
#: Answers that do not fit the form, each answered by asking again; after that the server is told ``cancel``.
MAX_REFUSED = 3
_OPTION_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_MAX_TEXT = 4096
_TRUE = frozenset({"yes", "y", "true", "1", "on"})
_FALSE = frozenset({"no", "n", "false", "0", "off"})


@dataclass(frozen=True)
class Form:
    """How an elicitation is asked: the ``human.requested`` fields."""

    question: str
    context: str
    options: list[HumanOption]
    allow_free_text: bool


@dataclass(frozen=True)
class Read:
    """An answer read against the form: the elicitation's result, or why the answer does not fit."""

    action: Literal["accept", "decline"] | None = None
    content: dict[str, Any] | None = None
    #: Set when the answer does not fit the form (the person is asked again).
    refused: str | None = None


def _fields(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    props = schema.get("properties")
    if not isinstance(props, dict):
        return {}
    return {str(name): prop if isinstance(prop, dict) else {} for name, prop in props.items()}


def _choices(prop: dict[str, Any]) -> list[tuple[Any, str]] | None:
    """The closed set of values of a field, with their labels; ``None`` when it is free."""
    if prop.get("type") == "boolean":
        return [(True, "Yes"), (False, "No")]
    enum = prop.get("enum")
    if isinstance(enum, list) and enum:
        names = prop.get("enumNames")
        labels = names if isinstance(names, list) and len(names) == len(enum) else [str(v) for v in enum]
        return [(value, str(label)) for value, label in zip(enum, labels, strict=True)]
    one_of = prop.get("oneOf")
    if isinstance(one_of, list) and one_of and all(isinstance(o, dict) and "const" in o for o in one_of):
        return [(o["const"], str(o.get("title") or o["const"])) for o in one_of]
    return None


def _option_ids(choices: list[tuple[Any, str]]) -> list[str]:
    ids: list[str] = []
    for number, (value, _) in enumerate(choices, 1):
        if isinstance(value, bool):
            candidate = "yes" if value else "no"
        else:
            candidate = str(value)
        if not _OPTION_ID.match(candidate) or candidate == DECLINE or candidate in ids:
            candidate = f"choice-{number}"
        ids.append(candidate)
    return ids


def _single_choice(schema: dict[str, Any]) -> tuple[str, list[tuple[Any, str]]] | None:
    fields = _fields(schema)
    if len(fields) != 1:
        return None
    ((name, prop),) = fields.items()
    choices = _choices(prop)
    return (name, choices) if choices is not None and len(choices) <= 9 else None


def form_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is no form a person can be asked (not a flat object of fields), or ``None``."""
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return f"its requested schema is not a valid JSON schema: {exc.message}"
    if schema.get("type") != "object" or not _fields(schema):
        return "its requested schema is not an object with properties"
    return None


def _describe(name: str, prop: dict[str, Any], required: bool) -> str:
    kind = str(prop.get("type", "text"))
    choices = _choices(prop)
    if choices is not None and kind != "boolean":
        kind = "one of " + ", ".join(json.dumps(value) for value, _ in choices)
    line = f"- {name} ({kind}{', required' if required else ''})"
    title = prop.get("description") or prop.get("title")
    return f"{line}: {title}" if title else line


def render(message: str, schema: dict[str, Any], *, refused: str | None = None) -> Form:
    """The question a person is asked for an elicitation (``refused``: why their last answer was refused)."""
    decline = HumanOption(id=DECLINE, label="Decline", consequence="the tool is told you declined")
    lines = [f"Your last answer was refused: {refused}. Please answer again."] if refused else []
    single = _single_choice(schema)
    if single is not None:
        _, choices = single
        options = [
            HumanOption(id=option_id, label=label[:200] or option_id)
            for option_id, (_, label) in zip(_option_ids(choices), choices, strict=True)
        ]
        lines.append("Choose an option.")
        return Form(message[:_MAX_TEXT] or "(no message)", "\n".join(lines)[:_MAX_TEXT], [*options, decline], False)
    fields = _fields(schema)
    required = set(schema.get("required") or [])
    lines.append("The form's fields:")
    lines += [_describe(name, prop, name in required) for name, prop in fields.items()]
    if len(fields) == 1:
        lines.append("Answer with the value.")
    else:
        lines.append('Answer with one line per field ("name: value"), or a JSON object.')
    return Form(message[:_MAX_TEXT] or "(no message)", "\n".join(lines)[:_MAX_TEXT], [decline], True)


def _coerce(prop: dict[str, Any], raw: str) -> Any:
    """A field's value from the text a person typed (left as text when it cannot be read: the schema says why)."""
    text = raw.strip()
    choices = _choices(prop)
    if choices is not None:
        for value, label in choices:
            if text.lower() in (str(value).lower(), label.lower()) or (
                isinstance(value, bool) and text.lower() in (_TRUE if value else _FALSE)
            ):
                return value
        return text
    kind = prop.get("type")
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text)
    except ValueError:
        return text
    if kind == "array":
        return [part.strip() for part in text.split(",") if part.strip()]
    return text


def _from_text(schema: dict[str, Any], text: str) -> dict[str, Any] | str:
    fields = _fields(schema)
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError as exc:
            return f"it looks like JSON but is not ({exc.msg})"
        return value if isinstance(value, dict) else "a JSON answer must be an object"
    if len(fields) == 1:
        ((name, prop),) = fields.items()
        return {name: _coerce(prop, stripped)}
    content: dict[str, Any] = {}
    for line in stripped.splitlines():
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep:
            name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or name not in fields:
            return f"{line.strip()[:100]!r} is not a line 'name: value' for a field of the form ({', '.join(fields)})"
        content[name] = _coerce(fields[name], value)
    return content


def read(schema: dict[str, Any], answer: HumanAnswer) -> Read:
    """The elicitation's result for ``answer`` (see the module docstring)."""
    if isinstance(answer, OptionAnswer):
        if answer.option_id == DECLINE:
            return Read(action="decline")
        single = _single_choice(schema)
        if single is None:
            return Read(refused=f"{answer.option_id!r} is not an option of this question")
        name, choices = single
        by_id = dict(zip(_option_ids(choices), (value for value, _ in choices), strict=True))
        if answer.option_id not in by_id:
            return Read(refused=f"{answer.option_id!r} is not an option of this question")
        content: dict[str, Any] | str = {name: by_id[answer.option_id]}
    else:
        if answer.value.strip().lower() == DECLINE:
            return Read(action="decline")
        content = _from_text(schema, answer.value)
    if isinstance(content, str):
        return Read(refused=content)
    flat = next((k for k, v in content.items() if isinstance(v, dict) or _nested_list(v)), None)
    if flat is not None:
        return Read(refused=f"field {flat!r}: a form value is text, a number, a boolean or a list of texts")
    error = best_match(Draft202012Validator(schema).iter_errors(content))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        return Read(refused=f"field {where!r}: {error.message}" if where else error.message)
    return Read(action="accept", content=content)


def _nested_list(value: Any) -> bool:
    return isinstance(value, list) and not all(isinstance(item, str) for item in value)
