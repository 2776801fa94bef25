"""What this service's 422s say about a body pydantic refused: the one place its messages are worded.

pydantic prefixes the message of every ``ValueError`` a model's own validator raises with ``"Value error, "``
(``Value error, give exactly one of option_id or text``): that is pydantic's wording, not the service's, so it is
cut from every message a 422 carries (the answer's ``detail``, the directory API's ``errors``)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from temporality_service.http import summarize_errors

__all__ = ["allowed_keys", "message_of", "summary"]

#: What pydantic puts before the message of a ``ValueError`` (``AssertionError``: "Assertion failed, ").
_PREFIXES = ("Value error, ", "Assertion failed, ")


def message_of(error: Mapping[str, Any], schema: Mapping[str, Any] | None = None, top_level: Sequence[str] = ()) -> str:
    """The message of one of pydantic's errors, without pydantic's prefix. With the model's JSON ``schema``, an
    unknown key ("Extra inputs are not permitted") names the keys its object takes, and the closest one
    (``top_level``: keys the route itself takes out of the body before the model reads it)."""
    loc = tuple(error.get("loc", ()))
    if error.get("type") == "extra_forbidden" and schema is not None and loc:
        allowed = sorted({*allowed_keys(schema, loc[:-1]), *(top_level if len(loc) == 1 else ())})
        if allowed:
            key = str(loc[-1])
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"unknown key {key!r}{hint}; allowed here: {', '.join(allowed)}"
    message = str(error.get("msg", "invalid"))
    for prefix in _PREFIXES:
        message = message.removeprefix(prefix)
    return message


def allowed_keys(schema: Mapping[str, Any], path: Sequence[Any]) -> list[str]:
    """The property names of the object at ``path`` (a pydantic error's location, minus the key) in the JSON
    ``schema`` (``$ref``s into its ``$defs`` followed; a list's index, a map's key and a union's branches gone
    through); empty when the path leads to no object with properties."""
    defs: Mapping[str, Any] = schema.get("$defs", {})

    def resolve(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return resolve(defs.get(ref.removeprefix("#/$defs/"), {}))
        branches = [b for key in ("anyOf", "oneOf", "allOf") for b in node.get(key, ())]
        return [n for b in branches for n in resolve(b)] if branches else [node]

    nodes = resolve(schema)
    for part in path:
        if str(part) == "[key]" or str(part).startswith("function-"):
            continue
        following: list[Mapping[str, Any]] = []
        for node in nodes:
            if isinstance(part, int) and isinstance(node.get("items"), Mapping):
                following += resolve(node["items"])
            elif isinstance(node.get("properties"), Mapping) and part in node["properties"]:
                following += resolve(node["properties"][part])
            elif isinstance(node.get("additionalProperties"), Mapping):
                following += resolve(node["additionalProperties"])
        nodes = following
    return sorted({str(name) for node in nodes for name in node.get("properties", {})})


def summary(exc: ValidationError) -> str:
    """``exc`` as one sentence (:func:`temporality_service.http.summarize_errors`: never the input), each message
    without pydantic's prefix."""
    errors: Sequence[dict[str, Any]] = [
        {**error, "msg": message_of(error)} for error in exc.errors(include_url=False, include_input=False)
    ]
    return summarize_errors(errors)
