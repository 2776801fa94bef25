"""What this service's 422s say about a body pydantic refused: the one place its messages are worded.

pydantic prefixes the message of every ``ValueError`` a model's own validator raises with ``"Value error, "``
(``Value error, give exactly one of option_id or text``): that is pydantic's wording, not the service's, so it is
cut from every message a 422 carries (the answer's ``detail``, the directory API's ``errors``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from temporality_service.http import summarize_errors

__all__ = ["message_of", "summary"]

#: What pydantic puts before the message of a ``ValueError`` (``AssertionError``: "Assertion failed, ").
_PREFIXES = ("Value error, ", "Assertion failed, ")


def message_of(error: Mapping[str, Any]) -> str:
    """The message of one of pydantic's errors, without pydantic's prefix."""
    message = str(error.get("msg", "invalid"))
    for prefix in _PREFIXES:
        message = message.removeprefix(prefix)
    return message


def summary(exc: ValidationError) -> str:
    """``exc`` as one sentence (:func:`temporality_service.http.summarize_errors`: never the input), each message
    without pydantic's prefix."""
    errors: Sequence[dict[str, Any]] = [
        {**error, "msg": message_of(error)} for error in exc.errors(include_url=False, include_input=False)
    ]
    return summarize_errors(errors)
