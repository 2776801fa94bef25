"""A parsed JMESPath expression turned into nested Python closures, once, instead of walked node by node at each
evaluation by ``jmespath``'s ``TreeInterpreter`` (a new interpreter per ``search``, a dictionary look-up and a
method call per node, every turn of every run: the scripted provider's largest cost).

Each closure does what the interpreter's ``visit_<type>`` does for its node (the same code, bound to its
children ahead of time): the same values, the same ``None`` for a mismatch, the same exceptions (the functions
are the interpreter's own ``call_function``). A node type not listed here is left to one shared interpreter
(:func:`build`'s ``fallback``), so every expression evaluates; ``tests/test_script_closures.py`` checks the two
give the same result on every node type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jmespath import visitor

__all__ = ["Program", "build"]

#: One evaluation: the expression's value over a document.
Program = Callable[[Any], Any]

# the interpreter's own rules (private to it, untyped in its stubs), not copies
_is_actual_number: Callable[[Any], bool] = vars(visitor)["_is_actual_number"]
_is_comparable: Callable[[Any], bool] = vars(visitor)["_is_comparable"]


def _is_false(value: Any) -> bool:
    """``TreeInterpreter._is_false``: JMESPath's false values (equality checks, as the interpreter does)."""
    return value == "" or value == [] or value == {} or value is None or value is False


def build(node: Any, interpreter: visitor.TreeInterpreter) -> Program:
    """The closure evaluating ``node`` (a parsed expression's ``parsed``) as ``interpreter.visit`` does."""
    kind = node["type"]
    children = node.get("children", [])

    def sub(child: Any) -> Program:
        return build(child, interpreter)

    if kind == "field":
        name = node["value"]

        def field(value: Any) -> Any:
            try:
                return value.get(name)
            except AttributeError:
                return None

        return field
    if kind in ("subexpression", "index_expression", "pipe"):
        steps = tuple(sub(c) for c in children)
        if len(steps) == 2:
            first, second = steps

            def chain2(value: Any) -> Any:
                return second(first(value))

            return chain2

        def chain(value: Any) -> Any:
            for step in steps:
                value = step(value)
            return value

        return chain
    if kind in ("current", "identity"):
        return _identity
    if kind == "literal":
        literal = node["value"]
        return lambda _value: literal
    if kind == "index":
        at = node["value"]

        def index(value: Any) -> Any:
            if not isinstance(value, list):
                return None
            try:
                return value[at]
            except IndexError:
                return None

        return index
    if kind == "or_expression":
        left, right = sub(children[0]), sub(children[1])

        def either(value: Any) -> Any:
            matched = left(value)
            if _is_false(matched):
                matched = right(value)
            return matched

        return either
    if kind == "and_expression":
        left, right = sub(children[0]), sub(children[1])

        def both(value: Any) -> Any:
            matched = left(value)
            if _is_false(matched):
                return matched
            return right(value)

        return both
    if kind == "not_expression":
        inner = sub(children[0])

        def negated(value: Any) -> Any:
            original = inner(value)
            if _is_actual_number(original) and original == 0:
                return False
            return not original

        return negated
    if kind == "function_expression":
        name = node["value"]
        arguments = tuple(sub(c) for c in children)
        call = vars(interpreter)["_functions"].call_function  # the interpreter's functions, as it calls them

        def function(value: Any) -> Any:
            return call(name, [argument(value) for argument in arguments])

        return function
    if kind == "expref":
        expression = children[0]
        return lambda _value: visitor._Expression(expression, interpreter)
    if kind == "multi_select_list":
        items = tuple(sub(c) for c in children)

        def selected_list(value: Any) -> Any:
            if value is None:
                return None
            return [item(value) for item in items]

        return selected_list
    if kind == "multi_select_dict":
        pairs = tuple((c["value"], sub(c)) for c in children)
        dict_cls = vars(interpreter)["_dict_cls"]

        def selected_dict(value: Any) -> Any:
            if value is None:
                return None
            collected = dict_cls()
            for key, item in pairs:
                collected[key] = item(value)
            return collected

        return selected_dict
    if kind == "key_val_pair":
        return sub(children[0])
    if kind == "projection":
        base, each = sub(children[0]), sub(children[1])

        def projected(value: Any) -> Any:
            items = base(value)
            if not isinstance(items, list):
                return None
            return [current for element in items if (current := each(element)) is not None]

        return projected
    if kind == "value_projection":
        base, each = sub(children[0]), sub(children[1])

        def values_projected(value: Any) -> Any:
            items = base(value)
            try:
                items = items.values()
            except AttributeError:
                return None
            return [current for element in items if (current := each(element)) is not None]

        return values_projected
    if kind == "filter_projection":
        base, each, condition = sub(children[0]), sub(children[1]), sub(children[2])

        def filtered(value: Any) -> Any:
            items = base(value)
            if not isinstance(items, list):
                return None
            collected = []
            for element in items:
                if not _is_false(condition(element)):
                    current = each(element)
                    if current is not None:
                        collected.append(current)
            return collected

        return filtered
    if kind == "flatten":
        base = sub(children[0])

        def flattened(value: Any) -> Any:
            items = base(value)
            if not isinstance(items, list):
                return None
            merged: list[Any] = []
            for element in items:
                if isinstance(element, list):
                    merged.extend(element)
                else:
                    merged.append(element)
            return merged

        return flattened
    if kind == "comparator":
        op = node["value"]
        compare = visitor.TreeInterpreter.COMPARATOR_FUNC[op]
        left, right = sub(children[0]), sub(children[1])
        if op in ("eq", "ne"):  # TreeInterpreter._EQUALITY_OPS
            return lambda value: compare(left(value), right(value))

        def ordered(value: Any) -> Any:
            lhs, rhs = left(value), right(value)
            if not (_is_comparable(lhs) and _is_comparable(rhs)):
                return None
            return compare(lhs, rhs)

        return ordered
    # anything else (a node type a later jmespath adds, a slice): the interpreter itself, for this node
    visit = interpreter.visit
    return lambda value: visit(node, value)


def _identity(value: Any) -> Any:
    return value
