"""The scripted provider's expressions as closures (:mod:`.providers.jmespath_closures`) evaluate as jmespath's
interpreter does: the same value (and type), or the same exception, for every node type, on documents of
every shape -- and the shipped reviewer's every expression too."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jmespath
import pytest
from jmespath.exceptions import JMESPathError
from jmespath.visitor import TreeInterpreter

from temporality_run_executor.providers import script as script_module
from temporality_run_executor.providers.jmespath_closures import build

SCRIPTS = Path(script_module.__file__).resolve().parents[1] / "scripts"

EXPRESSIONS = [
    "a",
    "a.b.c",
    "a.b.c.d.e",
    "missing.b",
    "@",
    "`1`",
    '`{"x": [1, 2]}`',
    "'raw'",
    "list[0]",
    "list[-1]",
    "list[10]",
    "a[0]",
    "list[1:3]",
    "list[::-1]",
    "list[*].n",
    "list[].n",
    "nested[]",
    "nested[][]",
    "obj.*",
    "obj.*.n",
    "list[?n > `1`].n",
    "list[?n == `2`]",
    "list[?flag].n",
    "list[?!flag].n",
    "a || b",
    'missing || `"fallback"`',
    "empty_s || empty_l || empty_o || zero || f",
    "a && b",
    "empty_s && a",
    "!zero",
    "!f",
    "!a",
    "!empty_l",
    "zero == f",
    "one == t",
    "a.b == a.b",
    "a != b",
    "one < two",
    "one <= one",
    "s > one",
    "s >= s",
    "[a, b, missing]",
    "{x: a, y: list[0].n}",
    "missing.[a, b]",
    "missing.{x: a}",
    "list | [0]",
    "list[*].n | [1]",
    "length(list)",
    "length(s)",
    "length(one)",
    "join(', ', words)",
    "join(', ', list)",
    "sort_by(list, &n)[*].n",
    "max_by(list, &n).n",
    "map(&n, list)",
    "keys(obj)",
    "contains(words, 'b')",
    "to_string(obj)",
    "matches('(?i)\\\\bb', s)",
    "not_null(missing, a)",
    "type(@)",
]

DOCUMENTS: list[Any] = [
    {
        "a": {"b": {"c": {"d": {"e": 5}}}},
        "b": "bee",
        "list": [{"n": 1, "flag": True}, {"n": 2, "flag": False}, {"n": 3}, {"m": 4}],
        "nested": [[1, [2]], 3, [4, 5]],
        "obj": {"p": {"n": 1}, "q": {"n": 2}, "r": "x"},
        "s": "sss",
        "words": ["a", "b", "c"],
        "empty_s": "",
        "empty_l": [],
        "empty_o": {},
        "zero": 0,
        "one": 1,
        "two": 2.0,
        "f": False,
        "t": True,
    },
    {"a": [1, 2], "b": None, "list": "not a list", "obj": [1], "s": 3, "zero": 0.0, "one": True, "words": []},
    {},
    [],
    None,
    "text",
    7,
]


def _run(call: Any) -> tuple[str, Any]:
    try:
        value = call()
    except (JMESPathError, TypeError) as exc:  # TypeError: the interpreter's own for "'>' between str and int"
        return ("raised", type(exc).__name__)
    return ("value", (type(value).__name__, repr(value)))


def _both(expression: str, document: Any, options: jmespath.Options) -> tuple[tuple[str, Any], tuple[str, Any]]:
    parsed = jmespath.compile(expression)
    program = build(parsed.parsed, TreeInterpreter(options))
    return _run(lambda: parsed.search(document, options=options)), _run(lambda: program(document))


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_a_closure_evaluates_as_the_interpreter(expression: str) -> None:
    options = script_module._OPTIONS
    for document in DOCUMENTS:
        interpreted, closed = _both(expression, document, options)
        assert closed == interpreted, (expression, document)


def test_every_node_type_of_the_grammar_is_covered() -> None:
    seen: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict) and "type" in node:
            seen.add(node["type"])
            for child in node.get("children", []):
                walk(child)

    for expression in EXPRESSIONS:
        walk(jmespath.compile(expression).parsed)
    assert {
        "field",
        "subexpression",
        "index_expression",
        "pipe",
        "current",
        "identity",
        "literal",
        "index",
        "slice",
        "or_expression",
        "and_expression",
        "not_expression",
        "function_expression",
        "expref",
        "multi_select_list",
        "multi_select_dict",
        "key_val_pair",
        "projection",
        "value_projection",
        "filter_projection",
        "flatten",
        "comparator",
    } <= seen


def test_the_shipped_scripts_expressions_evaluate_alike() -> None:
    """Every ``{{ }}`` and ``when``/``switch`` of the shipped scripts, over documents shaped like their scopes."""
    found: set[str] = set()
    for path in SCRIPTS.glob("*.y*ml"):
        text = path.read_text("utf-8")
        found.update(m.group(1) for m in re.finditer(r"\{\{(.*?)\}\}", text, re.S))
    assert found
    scopes = [
        {
            "results": {
                "read": {"pull_request": {"id": 7, "title": "Change the API", "description": "breaking schema"}},
                "ask": {"responder": "ana", "answer": {"value": "ok"}, "status": "answered"},
            },
            "run": {"people": ["ana@example.com"]},
            "vars": {"pr": {"pull_request": {"id": 7}}, "found": ["api"], "header": "H", "who": "ana"},
        },
        {"results": {}, "run": {}, "vars": {}},
    ]
    for expression in sorted(found):
        for scope in scopes:
            interpreted, closed = _both(expression.strip(), scope, script_module._OPTIONS)
            assert closed == interpreted, expression


def test_evaluate_goes_through_the_closures_and_still_names_its_failures() -> None:
    assert script_module.evaluate("a.b", {"a": {"b": 3}}, "here") == 3
    with pytest.raises(script_module.ScriptError, match="here"):
        script_module.evaluate("length(`1`)", {}, "here")
    with pytest.raises(ValueError, match="there"):
        script_module.evaluate("a.[", {}, "there")
