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

__all__ = ["evolve", "evolve_shallow", "revalidated"]

M = TypeVar("M", bound=BaseModel)


def evolve(model: M, /, **changes: Any) -> M:
    """A copy of ``model`` with ``changes``, validated by its model (validators included).

    Raises pydantic's :class:`~pydantic.ValidationError` for a value the model refuses and for a
    name that is not one of its fields (``extra_forbidden``, whatever the model's ``extra``: ignoring
    unknown fields on read is for data from others, not for a typo in our own update).
    """
    cls = type(model)
    _refuse_unknown(cls, changes)
    return cls.model_validate({**model.model_dump(), **changes})


def evolve_shallow(model: M, /, **changes: Any) -> M:
    """:func:`evolve` for a hot path, for a ``model`` whose nested models were validated when they were made
    (built by their constructors, by :func:`evolve`, or read from the store -- never ``model_copy``).

    The same checks of ``changes`` (unknown names refused, values validated) and the model's own validators;
    but the fields ``model`` already holds go in as they are, not dumped to plain data and validated again
    from it: a nested model instance is taken as it is (pydantic's ``revalidate_instances='never'``), as
    :func:`evolve` takes one passed in ``changes``. A record holding a pull request's payload, or a checkpoint
    holding a conversation, is then not copied and re-validated whole on every change of one field.
    Plain containers (``dict[str, Any]`` values) are shared with ``model``: treat models as immutable.
    """
    cls = type(model)
    _refuse_unknown(cls, changes)
    extra = model.__pydantic_extra__  # (what ``dict(model)`` holds, without its generator)
    return cls.model_validate({**model.__dict__, **extra, **changes} if extra else {**model.__dict__, **changes})


def _refuse_unknown(cls: type[BaseModel], changes: dict[str, Any]) -> None:
    fields = cls.__pydantic_fields__  # (``model_fields`` is a slower descriptor since pydantic 2.11)
    unknown = [name for name in changes if name not in fields]
    if unknown:
        errors = [InitErrorDetails(type="extra_forbidden", loc=(name,), input=changes[name]) for name in unknown]
        raise ValidationError.from_exception_data(cls.__name__, errors)


def revalidated(model: type[M], value: BaseModel) -> M:
    """``value`` validated again as ``model`` (a model instance may hold anything after ``model_copy``).

    :class:`TypeError` when ``value`` is not a ``model`` at all; pydantic's
    :class:`~pydantic.ValidationError` when one of its values is not what the model says.
    """
    if not isinstance(value, model):
        raise TypeError(f"expected a {model.__name__}, got a {type(value).__name__}")
    # warnings=False: a wrongly typed value is reported by the validation below, not as a serializer warning
    return model.model_validate(value.model_dump(warnings=False))
