"""What FastAPI cannot infer for OpenAPI when a handler reads the request itself.

A route that reads its body with :func:`~temporality_service.http.read_body` (to bound it and answer its
own 400/413/422) or a precondition header from ``request.headers`` (to answer 428/412 rather than
FastAPI's 422) declares them through ``openapi_extra``, so the document says what the code does::

    @router.put("/{id}", openapi_extra=operation(body=json_body("TriggerSpec"), headers=[if_match(required=True)]))

and the schemas a body refers to are added to the document's components once: ``add_schemas(app,
component_schemas(TriggerSpec=TriggerConfig))``. Each service's ``tests/test_openapi_conformance.py`` run
holds the document to the code (schemathesis).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI
from pydantic import TypeAdapter
from pydantic.json_schema import JsonSchemaMode

__all__ = ["IF_MATCH_PATTERN", "add_schemas", "component_schemas", "if_match", "json_answer", "json_body", "operation"]

#: An ``If-Match`` the APIs understand: ``*`` (any revision) or a revision, as its ETag (``"7"``); ``7`` and
#: ``W/"7"`` are read alike. Anything else is a 412 ``precondition_failed`` (a value, not its absence).
IF_MATCH_PATTERN = r'^(\*|(W/)?"?[0-9]{1,18}"?)$'
_REF = "#/components/schemas/"


def if_match(*, required: bool, what: str = "the resource") -> dict[str, Any]:
    """The ``If-Match`` header parameter; ``required``: its absence is a 428 ``precondition_required``."""
    absent = "required: 428 precondition_required without it" if required else "optional: without it, any revision"
    return {
        "name": "If-Match",
        "in": "header",
        "required": required,
        "description": f'The ETag of {what} as last read ("<revision>", or * for any); {absent}; '
        "412 precondition_failed when it is stale or not a revision",
        "schema": {"type": "string", "pattern": IF_MATCH_PATTERN},
    }


def json_body(schema: str | Mapping[str, Any], *, description: str = "", required: bool = True) -> dict[str, Any]:
    """A JSON ``requestBody``: ``schema`` is a component name (:func:`add_schemas`) or a JSON Schema."""
    shape = {"$ref": _REF + schema} if isinstance(schema, str) else dict(schema)
    body: dict[str, Any] = {"required": required, "content": {"application/json": {"schema": shape}}}
    if description:
        body["description"] = description
    return body


def operation(*, body: Mapping[str, Any] | None = None, headers: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """``openapi_extra`` for a route: its ``requestBody`` and header parameters (appended to FastAPI's own)."""
    extra: dict[str, Any] = {}
    if body is not None:
        extra["requestBody"] = dict(body)
    if headers:
        extra["parameters"] = [dict(h) for h in headers]
    return extra


def component_schemas(*, prefix: str = "", mode: JsonSchemaMode = "validation", **types: Any) -> dict[str, Any]:
    """JSON Schemas of pydantic types by name, with every model they use beside them; ``mode``
    ``serialization`` for answers (as FastAPI documents a ``response_model``). ``prefix`` goes before every
    name, the nested models' and their references included: another service's models, documented beside
    the app's own models of the same name (the journal's ``GatewayTriggerView``)."""
    found: dict[str, Any] = {}
    for name, kind in types.items():
        schema = TypeAdapter(kind).json_schema(ref_template=_REF + prefix + "{model}", mode=mode)
        found.update({prefix + nested: value for nested, value in schema.pop("$defs", {}).items()})
        found[prefix + name] = schema
    return found


def json_answer(schema: str, *, description: str) -> dict[str, Any]:
    """A ``responses`` entry whose JSON body is the component ``schema`` (for a handler that returns a
    :class:`~starlette.responses.Response` it built or forwarded, so FastAPI has no model to document)."""
    return {"description": description, "content": {"application/json": {"schema": {"$ref": _REF + schema}}}}


def add_schemas(app: FastAPI, schemas: Mapping[str, Any]) -> None:
    """Add ``schemas`` to ``app``'s OpenAPI components (a name FastAPI already uses keeps FastAPI's)."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()  # FastAPI caches it in app.openapi_schema: extended once, in place
            components = document.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in schemas.items():
                components.setdefault(name, schema)
        return app.openapi_schema or generate()

    app.openapi = openapi  # type: ignore[method-assign]
