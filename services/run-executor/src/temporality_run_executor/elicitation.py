"""MCP elicitation as an ordinary human request: the server's form rendered as a question, the person's
answer read back into what the server is told (pure functions, used by the run machine).

An elicitation (``elicitation/create``, MCP 2025-06-18) carries a message and a requested schema: a flat
object of primitive fields (string, number, integer, boolean, enums). :func:`render` turns it into a
``human.requested``:

* one field with a closed set of values (a boolean, an ``enum``, a ``oneOf`` of ``const`` s): one option
  per value (``yes``/``no`` for a boolean), no free text;
* anything else (free text fields, several fields): free text, the fields listed in the context -- one
  line per field (``name: value``) or a JSON object; a single field takes the whole text.

A URL-mode elicitation (MCP 2025-11-25: the server asks the person to open a link -- a sign-in, a payment --
whose interaction must not pass through the client) carries a message and a URL instead: :func:`render_url`
asks the message with the link in the question and the options ``done`` (the person finished there: the
server is told ``accept``) and ``decline``; :func:`read_url` reads the answer.

A form with a secret field (a name like ``db_password``, ``"format": "password"``, ``"writeOnly": true``:
:func:`~temporality_protocol.redaction.is_secret_field`) is not answerable here, and the question says so:
an answer would be stored in clear in the request, in ``human.answered`` and in the journal, and MCP (2025-11-25,
*Elicitation*) says a server must not ask for passwords, keys or tokens in a form but send the person to a URL.
The person gets a decline-only question naming the secret fields and why; the server is told ``decline``.

Every form also has the option ``decline`` (the person refuses to give the information). :func:`read`
turns the answer into the elicitation's result: ``decline``; ``accept`` with content validated against
the requested schema (JSON Schema 2020-12, values coerced from text by their field's type); or, when the
answer does not fit, the reason (the run asks again, saying why, at most :data:`MAX_REFUSED` times).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from temporality_protocol import HumanAnswer, HumanOption, OptionAnswer, TextAnswer, forms
from temporality_protocol.forms import DECLINE
from temporality_protocol.redaction import is_secret_field

__all__ = [
    "DECLINE",
    "DONE",
    "MAX_REFUSED",
    "Form",
    "Read",
    "form_problem",
    "read",
    "read_url",
    "render",
    "render_url",
    "secret_fields",
]

#: Answers that do not fit the form, each answered by asking again; after that the server is told ``cancel``.
MAX_REFUSED = 3
#: The option of a URL-mode elicitation saying the person finished what the link asked.
DONE = "done"
_MAX_TEXT = 4096


@dataclass(frozen=True)
class Form:
    """How an elicitation is asked: the ``human.requested`` fields."""

    question: str
    context: str
    options: list[HumanOption]
    allow_free_text: bool
    #: The form asks for a secret: only ``decline`` is offered, and its schema is not sent for a form to fill.
    declines_only: bool = False


@dataclass(frozen=True)
class Read:
    """An answer read against the form: the elicitation's result, or why the answer does not fit."""

    action: Literal["accept", "decline"] | None = None
    content: dict[str, Any] | None = None
    #: Set when the answer does not fit the form (the person is asked again).
    refused: str | None = None


def form_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is no form a person can be asked (not a flat object of fields), or ``None``."""
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return f"its requested schema is not a valid JSON schema: {exc.message}"
    if schema.get("type") != "object" or not forms.form_fields(schema):
        return "its requested schema is not an object with properties"
    return None


def secret_fields(schema: dict[str, Any]) -> list[str]:
    """The form's fields that hold a secret (:func:`~temporality_protocol.redaction.is_secret_field`)."""
    return [name for name, prop in forms.form_fields(schema).items() if is_secret_field(name, prop)]


def _describe(name: str, prop: dict[str, Any], required: bool) -> str:
    kind = str(prop.get("type", "text"))
    choices = forms.field_choices(prop)
    if is_secret_field(name, prop):  # its values are never written into the question (redact_form's rule)
        kind = f"secret, one of {len(choices)} values not shown" if choices is not None else "secret"
    elif choices is not None and kind != "boolean":
        kind = "one of " + ", ".join(json.dumps(value) for value, _ in choices)
    line = f"- {name} ({kind}{', required' if required else ''})"
    title = prop.get("description") or prop.get("title")
    return f"{line}: {title}" if title else line


def render(message: str, schema: dict[str, Any], *, refused: str | None = None) -> Form:
    """The question a person is asked for an elicitation (``refused``: why their last answer was refused)."""
    decline = HumanOption(id=DECLINE, label="Decline", consequence="the tool is told you declined")
    secrets = secret_fields(schema)
    if secrets:
        named = ", ".join(secrets)
        lines = [
            f"The form asks for a secret ({named}). Secrets are not taken through Temporality: an answer would be "
            "kept in the run's history and the journal. Decline, and give it to the tool another way (its own "
            "sign-in or settings).",
            "The form's fields:",
            *(_describe(name, prop, False) for name, prop in forms.form_fields(schema).items()),
        ]
        return Form(message[:_MAX_TEXT] or "(no message)", "\n".join(lines)[:_MAX_TEXT], [decline], False, True)
    lines = [f"Your last answer was refused: {refused}. Please answer again."] if refused else []
    single = forms.single_choice(schema)
    if single is not None:
        _, choices = single
        options = [
            HumanOption(id=option_id, label=label[:200] or option_id)
            for option_id, (_, label) in zip(forms.choice_option_ids(choices), choices, strict=True)
        ]
        lines.append("Choose an option.")
        return Form(message[:_MAX_TEXT] or "(no message)", "\n".join(lines)[:_MAX_TEXT], [*options, decline], False)
    fields = forms.form_fields(schema)
    required = set(schema.get("required") or [])
    lines.append("The form's fields:")
    lines += [_describe(name, prop, name in required) for name, prop in fields.items()]
    if len(fields) == 1:
        lines.append("Answer with the value.")
    else:
        lines.append('Answer with one line per field ("name: value"), or a JSON object.')
    return Form(message[:_MAX_TEXT] or "(no message)", "\n".join(lines)[:_MAX_TEXT], [decline], True)


def read(schema: dict[str, Any], answer: HumanAnswer) -> Read:
    """The elicitation's result for ``answer`` (:func:`temporality_protocol.forms.read`, shared with
    human-interaction, which refuses a misfit answer before it is recorded). A form with a secret field takes
    nothing but ``decline``."""
    if secret_fields(schema) and not (isinstance(answer, OptionAnswer) and answer.option_id == DECLINE):
        return Read(refused="the form asks for a secret, which is not taken through Temporality: decline")
    result = forms.read(schema, answer)
    return Read(action=result.action, content=result.content, refused=result.refused)


def render_url(message: str, url: str) -> Form:
    """The question a person is asked for a URL-mode elicitation: the link in the question, ``done`` or ``decline``."""
    done = HumanOption(id=DONE, label="Done", consequence="the tool is told you finished at the link")
    decline = HumanOption(id=DECLINE, label="Decline", consequence="the tool is told you declined")
    question = f"{message[: _MAX_TEXT - len(url) - 16] or '(no message)'}\nOpen this link: {url}"
    context = "What you do at the link does not pass through the agent. Answer Done once you have finished there."
    return Form(question[:_MAX_TEXT], context, [done, decline], False)


def read_url(answer: HumanAnswer) -> Literal["accept", "decline", "cancel"]:
    """A URL-mode elicitation's result for ``answer``: ``accept`` (done), ``decline``, anything else ``cancel``."""
    if isinstance(answer, OptionAnswer):
        return "accept" if answer.option_id == DONE else "decline" if answer.option_id == DECLINE else "cancel"
    if isinstance(answer, TextAnswer):
        text = answer.value.strip().lower()
        return "accept" if text == DONE else "decline" if text == DECLINE else "cancel"
    return "cancel"
