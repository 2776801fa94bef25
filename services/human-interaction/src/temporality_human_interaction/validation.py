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
from temporality_service.wording import keys_at, without_prefix

__all__ = ["message_of", "summary"]


def message_of(error: Mapping[str, Any], schema: Mapping[str, Any] | None = None, top_level: Sequence[str] = ()) -> str:
    """The message of one of pydantic's errors, without pydantic's prefix. With the model's JSON ``schema``, an
    unknown key ("Extra inputs are not permitted") names the keys its object takes, and the closest one
    (``top_level``: keys the route itself takes out of the body before the model reads it)."""
    loc = tuple(error.get("loc", ()))
    if error.get("type") == "extra_forbidden" and schema is not None and loc:
        allowed = sorted({*keys_at(schema, loc[:-1]), *(top_level if len(loc) == 1 else ())})
        if allowed:
            key = str(loc[-1])
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"unknown key {key!r}{hint}; allowed here: {', '.join(allowed)}"
    return without_prefix(str(error.get("msg", "invalid")))


def summary(exc: ValidationError) -> str:
    """``exc`` as one sentence (:func:`temporality_service.http.summarize_errors`: never the input), each message
    without pydantic's prefix."""
    errors: Sequence[dict[str, Any]] = [
        {**error, "msg": message_of(error)} for error in exc.errors(include_url=False, include_input=False)
    ]
    return summarize_errors(errors)
