"""A quick yes to "do these tool arguments fit the schema?", for the schemas tools are offered with.

``jsonschema`` checks a call's arguments by walking the schema with a new validator object per subschema and
instance (``descend``/``evolve``): ~0.5 ms for an ``ask_human`` call's, each time, although almost every call a
model makes fits. :func:`compile_check` turns a schema into plain closures once, for the keywords the tools'
schemas use (pydantic's ``model_json_schema`` and hand-written ones); :meth:`~.tools.Tool.argument_problem`
asks it first and, unless it says *valid*, asks ``jsonschema`` as before -- which then decides and words the
error. So a check only ever saves work: every keyword it knows is checked exactly as Draft 2020-12 (and
``jsonschema``) says, and anything it is not sure of -- a keyword it does not know, a value it does not treat
(a float where an integer is asked for, an enum of anything but strings) -- leaves the answer to ``jsonschema``.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Check", "compile_check"]

#: ``instance -> True`` when it certainly fits; ``False``: it does not, or the check is not sure (ask jsonschema).
Check = Callable[[Any], bool]

#: Keywords that never make an instance invalid (annotations; ``$defs`` is where ``$ref`` finds its targets).
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$defs", "$comment"})

_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    # a float with an integral value is an integer to JSON Schema: not treated here (jsonschema decides)
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}


class _Unsupported(Exception):
    """The schema uses something :func:`compile_check` does not check exactly."""


def compile_check(schema: Mapping[str, Any] | bool) -> Check | None:
    """The quick check of ``schema`` (Draft 2020-12), or ``None`` when it uses anything not handled here."""
    try:
        return _Compiler(schema).compile(schema)
    except _Unsupported:
        return None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _no_number(value: Any) -> bool:
    """A numeric keyword does not apply to ``value``: ``True``; but for a number JSON has no type for (a
    ``Decimal``, which jsonschema compares): ``False``, not sure."""
    return isinstance(value, bool) or not isinstance(value, numbers.Number)


class _Compiler:
    def __init__(self, root: Mapping[str, Any] | bool) -> None:
        self.root = root
        self.refs: dict[str, Check] = {}

    def compile(self, schema: Any) -> Check:
        if schema is True:
            return lambda v: True
        if schema is False or not isinstance(schema, Mapping):
            raise _Unsupported("a false or malformed schema")  # (false: nothing fits; left to jsonschema)
        checks: list[Check] = []
        for key, value in schema.items():
            if key in _ANNOTATIONS:
                continue
            checks.append(self._keyword(key, value, schema))
        if not checks:
            return lambda v: True
        if len(checks) == 1:
            return checks[0]
        every = tuple(checks)
        return lambda v: all(check(v) for check in every)

    def _keyword(self, key: str, value: Any, schema: Mapping[str, Any]) -> Check:
        match key:
            case "type":
                names = [value] if isinstance(value, str) else value
                if not isinstance(names, list) or not names or any(n not in _TYPES for n in names):
                    raise _Unsupported(f"type {value!r}")
                # (an integral float is an "integer" too: not accepted here, so jsonschema decides it)
                tests = tuple(_TYPES[n] for n in names)
                if len(tests) == 1:
                    return tests[0]
                return lambda v: any(t(v) for t in tests)
            case "properties":
                if not isinstance(value, Mapping):
                    raise _Unsupported("properties")
                props = {name: self.compile(sub) for name, sub in value.items()}
                return lambda v: (
                    not isinstance(v, dict) or all(check(v[name]) for name, check in props.items() if name in v)
                )
            case "required":
                if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
                    raise _Unsupported("required")
                names = tuple(value)
                return lambda v: not isinstance(v, dict) or all(n in v for n in names)
            case "additionalProperties":
                if "patternProperties" in schema:
                    raise _Unsupported("patternProperties")
                known = frozenset(schema.get("properties", {}))
                if value is False:
                    return lambda v: not isinstance(v, dict) or all(k in known for k in v)
                extra = self.compile(value)
                return lambda v: not isinstance(v, dict) or all(extra(x) for k, x in v.items() if k not in known)
            case "items":
                if "prefixItems" in schema:
                    raise _Unsupported("prefixItems")
                each = self.compile(value)
                return lambda v: not isinstance(v, list) or all(each(x) for x in v)
            case "minLength" | "maxLength" | "minItems" | "maxItems":
                if not isinstance(value, int) or isinstance(value, bool):
                    raise _Unsupported(key)
                kind = str if key.endswith("Length") else list
                bound = value
                if key.startswith("min"):
                    return lambda v: not isinstance(v, kind) or len(v) >= bound
                return lambda v: not isinstance(v, kind) or len(v) <= bound
            case "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum":
                if not _number(value):
                    raise _Unsupported(key)
                limit = value
                if key == "minimum":
                    return lambda v: v >= limit if _number(v) else _no_number(v)
                if key == "maximum":
                    return lambda v: v <= limit if _number(v) else _no_number(v)
                if key == "exclusiveMinimum":
                    return lambda v: v > limit if _number(v) else _no_number(v)
                return lambda v: v < limit if _number(v) else _no_number(v)
            case "pattern":
                if not isinstance(value, str):
                    raise _Unsupported("pattern")
                search = re.compile(value).search  # as jsonschema: re.search, anywhere in the string
                return lambda v: not isinstance(v, str) or search(v) is not None
            case "enum":
                if not isinstance(value, list) or not value or not all(isinstance(e, str) for e in value):
                    raise _Unsupported("an enum of anything but strings")
                allowed = frozenset(value)
                return lambda v: isinstance(v, str) and v in allowed
            case "const":
                if not isinstance(value, str):
                    raise _Unsupported("a const other than a string")
                const = value
                return lambda v: isinstance(v, str) and v == const
            case "anyOf":
                if not isinstance(value, list) or not value:
                    raise _Unsupported("anyOf")
                options = tuple(self.compile(sub) for sub in value)
                return lambda v: any(option(v) for option in options)
            case "$ref":
                return self._ref(value)
        raise _Unsupported(key)

    def _ref(self, ref: Any) -> Check:
        """``#/$defs/<name>`` of the root schema (what pydantic writes); any other reference is not handled."""
        if not isinstance(ref, str) or not ref.startswith("#/$defs/") or "/" in ref.removeprefix("#/$defs/"):
            raise _Unsupported(f"$ref {ref!r}")
        if isinstance(self.root, Mapping) and "$id" in self.root:
            raise _Unsupported("$id")
        name = ref.removeprefix("#/$defs/")
        if "~" in name or "%" in name:
            raise _Unsupported(f"$ref {ref!r}")
        known = self.refs.get(name)
        if known is not None:
            return known
        defs = self.root.get("$defs") if isinstance(self.root, Mapping) else None
        if not isinstance(defs, Mapping) or name not in defs:
            raise _Unsupported(f"$ref {ref!r}")
        compiled: list[Check] = []
        self.refs[name] = lambda v: compiled[0](v)  # a recursive reference sees itself
        compiled.append(self.compile(defs[name]))
        return self.refs[name]
