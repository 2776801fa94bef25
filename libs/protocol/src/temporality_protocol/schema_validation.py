"""JSON Schema validation of what a person or a model sends against a schema somebody else wrote (an MCP
server's tool arguments and elicitation forms).

``jsonschema``'s Draft 2020-12 validator matches the ``pattern`` keyword with Python's ``re``, which backtracks: an
MCP server's ``^(\\w+\\s?)*$`` took ~0.3 s for a 22-character answer and doubles with every character more
(measured on 6 December). :data:`LinearValidator` is the same validator with ``pattern`` matched by
``jsonschema-rs`` (Rust's ``regex`` engine: linear time; a pattern with lookaround or a backreference runs with
its backtracking limit), the ECMA-262 dialect JSON Schema names (so ``$`` is the end of the text, not before a
final newline as in Python). A pattern ``jsonschema-rs`` cannot compile is matched by ``re`` as before. The error
reads as ``jsonschema``'s own: ``'abc' does not match '^[0-9]+$'``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema_rs
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

__all__ = ["LinearValidator"]


@functools.lru_cache(maxsize=512)
def _matcher(pattern: str) -> Callable[[str], bool]:
    """Whether a text holds a match of ``pattern`` (compiled once; a schema's patterns are few)."""
    try:
        return jsonschema_rs.validator_for({"type": "string", "pattern": pattern}, offline=True).is_valid
    except ValueError:  # (jsonschema-rs's ValidationError is one) a pattern only Python's dialect reads
        compiled = re.compile(pattern)
        return lambda text: compiled.search(text) is not None


def _pattern(validator: Validator, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _matcher(pattern)(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


#: ``jsonschema``'s Draft 2020-12 validator, ``pattern`` matched in linear time.
LinearValidator: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]  # (untyped in its stubs)
    Draft202012Validator, {"pattern": _pattern}
)
