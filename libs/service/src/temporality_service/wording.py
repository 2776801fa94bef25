"""pydantic's validation errors in the words of the JSON a user sent: the 422s of the gateway and of
human-interaction word them through here.

pydantic speaks of its own classes ("a valid dictionary or instance of _Envelope"), says "Extra inputs are not
permitted" without naming the keys that are, and prefixes a validator's sentence with "Value error, ". Here:

- an object expected: "must be a JSON object, not an array" (the JSON type of what came, never the value);
- an unknown key: "unknown key 'token'; allowed here: secret, secret_env, type" (from the JSON schema of what
  was validated, through its discriminated unions: every auth ``type`` names its own keys), with a "did you
  mean" for a near miss;
- a discriminator tag that matches none: "unknown type 'gitlabb'; one of: ...";
- a validator's own sentence without pydantic's "Value error, " / "Assertion failed, " prefix.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_core import ErrorDetails

__all__ = ["json_type", "keys_at", "listed", "located", "message", "without_prefix"]

#: The error types pydantic gives when an object (a model, a dict) was expected and something else came.
_OBJECT_EXPECTED = frozenset({"model_type", "model_attributes_type", "dict_type"})
_PREFIXES = ("Value error, ", "Assertion failed, ")


def json_type(value: Any) -> str:
    """The JSON type of a parsed value, with its article: ``an array``, ``null``, ``a string``..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"


def listed(names: Sequence[str], *, limit: int = 5) -> str:
    """``a, b, c`` -- or ``a, b, c, d, e and 3 more`` past ``limit`` (one past it is listed rather than "and 1
    more"): a count never disagrees with its list."""
    if len(names) <= limit + 1:
        return ", ".join(names)
    return f"{', '.join(names[:limit])} and {len(names) - limit} more"


def message(err: ErrorDetails, schema: Mapping[str, Any] | None = None) -> str:
    """``err``'s sentence for a user (``err`` as ``ValidationError.errors()`` gives it: with its ``input`` and
    ``ctx`` when kept; never echoed). ``schema``: the JSON schema of what was validated, to name allowed keys."""
    kind = err["type"]
    if kind in _OBJECT_EXPECTED:
        return "must be a JSON object" + (f", not {json_type(err['input'])}" if "input" in err else "")
    if kind == "extra_forbidden":
        return _unknown_key(err["loc"], schema)
    ctx = err.get("ctx") or {}
    named = str(ctx.get("discriminator", "tag")).strip("'")
    if kind == "union_tag_invalid" and "tag" in ctx:
        return f"unknown {named} {ctx['tag']!r}; one of: {ctx.get('expected_tags', '?')}"
    if kind == "union_tag_not_found":
        return f"{named} is missing: it says which keys this object takes"
    return without_prefix(str(err["msg"]))


def without_prefix(text: str) -> str:
    """A validator's own sentence without pydantic's ``"Value error, "`` / ``"Assertion failed, "``."""
    for prefix in _PREFIXES:
        text = text.removeprefix(prefix)
    return text


def located(err: ErrorDetails) -> tuple[int | str, ...]:
    """Where ``err`` is, as a user would point at it: a discriminated union's wrong or missing tag is at its tag
    key (``auth.type``), not at the object holding it."""
    loc = tuple(err["loc"])
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        named = str((err.get("ctx") or {}).get("discriminator", "")).strip("'")
        if named:
            return (*loc, named)
    return loc


def _unknown_key(loc: Sequence[int | str], schema: Mapping[str, Any] | None) -> str:
    key = str(loc[-1]) if loc else "?"
    allowed = keys_at(schema, loc[:-1]) if schema is not None else []
    if not allowed:
        return f"unknown key {key!r}"
    text = f"unknown key {key!r}; allowed here: {', '.join(allowed)}"
    close = difflib.get_close_matches(key, allowed, n=1)
    return text + (f" (did you mean {close[0]!r}?)" if close else "")


def keys_at(schema: Mapping[str, Any], loc: Sequence[int | str]) -> list[str]:
    """The property names, sorted, of the object(s) ``loc`` leads to in ``schema`` (pydantic's locations: a
    discriminated union's tag is a step of its own; a map's ``[key]`` and a validator's ``function-...`` steps
    are none); empty when it leads to no object with properties."""
    defs: Mapping[str, Any] = schema.get("$defs", {})
    nodes = _resolved(schema, defs)
    for part in loc:
        if part == "[key]" or str(part).startswith("function-"):
            continue
        following: list[Mapping[str, Any]] = []
        for node in nodes:
            mapping = (node.get("discriminator") or {}).get("mapping", {})
            if isinstance(part, str) and part in mapping:
                following += _resolved({"$ref": mapping[part]}, defs)
            elif isinstance(part, int):
                items = node.get("items")
                following += _resolved(items, defs) if isinstance(items, Mapping) else []
            elif isinstance(part, str) and part in node.get("properties", {}):
                following += _resolved(node["properties"][part], defs)
            elif isinstance(node.get("additionalProperties"), Mapping):
                following += _resolved(node["additionalProperties"], defs)
        nodes = following
    return sorted({str(name) for node in nodes for name in node.get("properties", {})})


def _resolved(node: Mapping[str, Any], defs: Mapping[str, Any], depth: int = 0) -> list[Mapping[str, Any]]:
    """``node`` with its ``$ref`` followed and its plain unions (``anyOf``: an optional field) spread; a
    discriminated union is kept whole (the location names its tag next)."""
    if depth > 20:
        return []
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = defs.get(ref.removeprefix("#/$defs/"))
        return _resolved(target, defs, depth + 1) if isinstance(target, Mapping) else []
    if "discriminator" in node:
        return [node]
    for union in ("anyOf", "oneOf", "allOf"):
        if isinstance(node.get(union), list):
            return [n for part in node[union] if isinstance(part, Mapping) for n in _resolved(part, defs, depth + 1)]
    return [node]
