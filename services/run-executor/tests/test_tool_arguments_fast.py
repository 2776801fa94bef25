"""A tool call's arguments are answered by ``jsonschema-rs`` first (:meth:`Tool.argument_problem`): it may say
*fits* only where ``jsonschema`` does, and it says it for the instances ``jsonschema`` accepts; what it refuses is
worded by ``jsonschema`` as before."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from temporality_run_executor.tools import BUILTIN_TOOLS, Tool, _fast_validator

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 300) | st.floats(-5, 300, allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)

SCHEMAS: dict[str, dict[str, Any]] = {t.name: t.parameters for t in BUILTIN_TOOLS}
SCHEMAS |= {
    "numbers": {
        "type": "object",
        "properties": {
            "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 100},
            "x": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
            "c": {"const": "yes"},
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}, "minItems": 1, "maxItems": 2},
            "more": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
        "required": ["n"],
    },
    "recursive": {
        "$defs": {
            "Node": {"type": "object", "properties": {"child": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}}}
        },
        "$ref": "#/$defs/Node",
    },
}


def _like(schema: Any, root: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Instances near ``schema``: mostly what it asks for, sometimes anything (so both answers come up)."""
    if not isinstance(schema, dict) or depth > 4:
        return JSON
    if "$ref" in schema:
        return _like(root["$defs"][schema["$ref"].rsplit("/", 1)[1]], root, depth + 1)
    if "anyOf" in schema:
        return st.one_of(*(_like(s, root, depth + 1) for s in schema["anyOf"]))
    if "enum" in schema:
        return st.sampled_from([*schema["enum"], "other", 1])
    if "const" in schema:
        return st.sampled_from([schema["const"], "no", None])
    kinds = schema.get("type", "object")
    kind = kinds if isinstance(kinds, str) else kinds[0]
    near: st.SearchStrategy[Any]
    if kind == "string":
        if "pattern" in schema:
            near = st.from_regex(schema["pattern"], fullmatch=True) | st.text(max_size=5)
        else:
            low, high = schema.get("minLength", 0), schema.get("maxLength", 12)
            fits = st.text(min_size=low, max_size=min(high, low + 12))
            near = st.one_of(*[fits] * 6, st.text(min_size=max(low - 1, 0), max_size=min(high + 1, low + 12)))
    elif kind in ("integer", "number"):
        near = st.integers(-3, 120) | st.floats(-3, 120, allow_nan=False) | st.just(1.0)
    elif kind == "boolean":
        near = st.booleans()
    elif kind == "null":
        near = st.none()
    elif kind == "array":
        near = st.lists(
            _like(schema.get("items", True), root, depth + 1), max_size=min(schema.get("maxItems", 3) + 1, 4)
        )
    else:
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        near = st.tuples(
            st.fixed_dictionaries(
                {k: _like(v, root, depth + 1) for k, v in props.items() if k in required},
                optional={k: _like(v, root, depth + 1) for k, v in props.items() if k not in required},
            ),
            st.sampled_from([*sorted(required), "unexpected", *[None] * 12]),  # now and then one left out or added
        ).map(lambda d_odd: _odd(*d_odd))
    return st.one_of(*[near] * 12, JSON)  # anything, now and then (one in 13 at each level)


def _odd(instance: dict[str, Any], key: str | None) -> dict[str, Any]:
    if key == "unexpected":
        return {**instance, key: 1}
    return {k: v for k, v in instance.items() if k != key}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_jsonschema_rs_agrees_with_jsonschema(name: str) -> None:
    schema = SCHEMAS[name]
    fast = _fast_validator(schema)
    assert fast is not None, f"{name}: jsonschema-rs compiles every built-in tool's schema"
    validator = Draft202012Validator(schema)
    seen = {True: 0, False: 0}

    @settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(_like(schema, schema))
    def agree(instance: Any) -> None:
        valid = validator.is_valid(instance)
        seen[valid] += 1
        assert fast.is_valid(instance) == valid, f"{name}: {instance!r}: jsonschema says {valid}"

    agree()
    assert seen[False] > 0
    if name not in ("get_input", "get_collaborators", "get_pr_context"):  # ({} is their only fitting instance)
        assert seen[True] > 0


def test_a_schema_jsonschema_rs_cannot_compile_offline_is_left_to_jsonschema() -> None:
    tool = Tool(
        name="remote",
        description="its schema refers to another document",
        parameters={"type": "object", "properties": {"x": {"$ref": "https://example.com/x.json"}}},
    )
    assert tool._fast is None  # nothing fetched
    assert tool.argument_problem({"y": 1}) is None  # jsonschema: an unreferenced property fits
    problem = Tool(name="t", description="d", parameters={"type": "object", "required": ["x"]}).argument_problem({})
    assert problem is not None
    assert "'x' is a required property" in problem


def test_a_tool_call_gets_the_same_answer_either_way() -> None:
    ask = next(t for t in BUILTIN_TOOLS if t.name == "ask_human")
    fitting = {"recipient": "user:alice", "question": "Ship it?", "options": [{"id": "yes", "label": "Yes"}]}
    assert ask.argument_problem(fitting) is None
    problem = ask.argument_problem({**fitting, "title": "x"})
    assert problem is not None
    assert "'title' was unexpected" in problem


def test_a_backtracking_pattern_in_an_mcp_tools_schema_is_answered_whole() -> None:
    """Arguments jsonschema-rs refuses are walked by jsonschema, whose ``pattern`` is matched in linear time too
    (:mod:`temporality_protocol.schema_validation`): ``^(\\w+\\s?)*$`` under Python's ``re`` never ends here."""
    tool = Tool(
        name="lookup",
        description="an MCP server's tool",
        parameters={"type": "object", "properties": {"name": {"type": "string", "pattern": "^(\\w+\\s?)*$"}}},
    )
    problem = tool.argument_problem({"name": "a" * 4000 + "!"})
    assert problem is not None
    assert "does not match" in problem
    assert tool.argument_problem({"name": "Ada Lovelace"}) is None
