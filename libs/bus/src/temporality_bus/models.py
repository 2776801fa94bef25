"""Validated model updates: what pydantic's ``model_copy`` with an ``update`` dict should have been.

``model_copy`` validates nothing: a wrongly typed value (``status="runnin"``) passes
and is only noticed by whoever reads it back, and a misspelt field name (``staus=...``) is dropped
silently. :func:`evolve` validates the whole result with the model and refuses unknown names;
:func:`revalidated` checks a model instance someone built by hand (the store does it before every
write).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails

__all__ = ["evolve", "revalidated"]

M = TypeVar("M", bound=BaseModel)


def evolve(model: M, /, **changes: Any) -> M:
    """A copy of ``model`` with ``changes``, validated by its model (validators included).

    Raises pydantic's :class:`~pydantic.ValidationError` for a value the model refuses and for a
    name that is not one of its fields (``extra_forbidden``, whatever the model's ``extra``: ignoring
    unknown fields on read is for data from others, not for a typo in our own update).
    """
    cls = type(model)
    unknown = [name for name in changes if name not in cls.model_fields]
    if unknown:
        errors = [InitErrorDetails(type="extra_forbidden", loc=(name,), input=changes[name]) for name in unknown]
        raise ValidationError.from_exception_data(cls.__name__, errors)
    return cls.model_validate({**model.model_dump(), **changes})


def revalidated(model: type[M], value: BaseModel) -> M:
    """``value`` validated again as ``model`` (a model instance may hold anything after ``model_copy``).

    :class:`TypeError` when ``value`` is not a ``model`` at all; pydantic's
    :class:`~pydantic.ValidationError` when one of its values is not what the model says.
    """
    if not isinstance(value, model):
        raise TypeError(f"expected a {model.__name__}, got a {type(value).__name__}")
    # warnings=False: a wrongly typed value is reported by the validation below, not as a serializer warning
    return model.model_validate(value.model_dump(warnings=False))
