"""How a person's answer to a form is read (MCP elicitation, PRO-1): shared by the run-executor, which renders
the form as a question and tells the server the result, and human-interaction, which refuses an answer that
does not fit the form at the channel, before it is recorded (``HumanRequested.answer_schema``).

A form is a requested schema: a flat object of primitive fields (string, number, integer, boolean, enums),
JSON Schema 2020-12. :func:`read` turns an answer into the form's result: ``decline`` (the option
:data:`DECLINE`, or the text "decline"); ``accept`` with content validated against the schema (values
coerced from text by their field's type: one field takes the whole text, several are ``name: value`` lines
or a JSON object; one field with a closed set of values is asked as options); or, when the answer does not
fit, the reason in a sentence for the person.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from temporality_protocol.events import HumanAnswer, OptionAnswer
from temporality_protocol.redaction import is_secret_field

__all__ = ["DECLINE", "FormRead", "choice_option_ids", "field_choices", "form_fields", "read", "single_choice"]

#: The option every form has: the person declines to give the information (the server is told ``decline``).
DECLINE = "decline"
_OPTION_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_TRUE = frozenset({"yes", "y", "true", "1", "on"})
_FALSE = frozenset({"no", "n", "false", "0", "off"})


@dataclass(frozen=True)
class FormRead:
    """An answer read against the form: the result, or why the answer does not fit."""

    action: Literal["accept", "decline"] | None = None
    content: dict[str, Any] | None = None
    #: Set when the answer does not fit the form.
    refused: str | None = None


def form_fields(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The form's fields by name (an object schema's ``properties``)."""
    props = schema.get("properties")
    if not isinstance(props, dict):
        return {}
    return {str(name): prop if isinstance(prop, dict) else {} for name, prop in props.items()}


def field_choices(prop: dict[str, Any]) -> list[tuple[Any, str]] | None:
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


def choice_option_ids(choices: list[tuple[Any, str]]) -> list[str]:
    """The option id of each value of a closed field (its value when that is a valid id, else ``choice-<n>``)."""
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


def single_choice(schema: dict[str, Any]) -> tuple[str, list[tuple[Any, str]]] | None:
    """``(field, values)`` of a form that is one closed field of at most 9 values (asked as options)."""
    fields = form_fields(schema)
    if len(fields) != 1:
        return None
    ((name, prop),) = fields.items()
    choices = field_choices(prop)
    return (name, choices) if choices is not None and len(choices) <= 9 else None


def _coerce(prop: dict[str, Any], raw: str) -> Any:
    """A field's value from the text a person typed (left as text when it cannot be read: the schema says why)."""
    text = raw.strip()
    choices = field_choices(prop)
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
    fields = form_fields(schema)
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError as exc:
            return f"it looks like JSON but is not ({exc.msg})"
        except RecursionError:
            return "it looks like JSON but is nested too deeply"
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


def read(schema: dict[str, Any], answer: HumanAnswer) -> FormRead:
    """The form's result for ``answer`` (see the module docstring)."""
    if isinstance(answer, OptionAnswer):
        if answer.option_id == DECLINE:
            return FormRead(action="decline")
        single = single_choice(schema)
        if single is None:
            return FormRead(refused=f"{answer.option_id!r} is not an option of this question")
        name, choices = single
        by_id = dict(zip(choice_option_ids(choices), (value for value, _ in choices), strict=True))
        if answer.option_id not in by_id:
            return FormRead(refused=f"{answer.option_id!r} is not an option of this question")
        content: dict[str, Any] | str = {name: by_id[answer.option_id]}
    else:
        if answer.value.strip().lower() == DECLINE:
            return FormRead(action="decline")
        content = _from_text(schema, answer.value)
    if isinstance(content, str):
        return FormRead(refused=content)
    flat = next((k for k, v in content.items() if isinstance(v, dict) or _nested_list(v)), None)
    if flat is not None:
        return FormRead(refused=f"field {flat!r}: a form value is text, a number, a boolean or a list of texts")
    from jsonschema.exceptions import best_match  # lazily: only a form's answer needs them (docs/operations.md)

    from temporality_protocol.schema_validation import LinearValidator

    error = best_match(LinearValidator(schema).iter_errors(content))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        field = form_fields(schema).get(str(error.absolute_path[0])) if error.absolute_path else None
        if field is not None and is_secret_field(str(error.absolute_path[0]), field):
            # the validator's message quotes the field's values (its enum): a secret's never go back in a refusal
            return FormRead(refused=f"field {where!r}: not a value this secret field accepts")
        return FormRead(refused=f"field {where!r}: {error.message}" if where else error.message)
    return FormRead(action="accept", content=content)


def _nested_list(value: Any) -> bool:
    return isinstance(value, list) and not all(isinstance(item, str) for item in value)
