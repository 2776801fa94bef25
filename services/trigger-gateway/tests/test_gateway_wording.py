"""pydantic's validation errors in the words of the JSON a user sent (:mod:`temporality_service.wording`):
no class of ours, every allowed key of an object that got an unknown one (through discriminated unions), no
"Value error, " prefix, and a count that never disagrees with its list."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from temporality_service.wording import json_type, listed, located, message


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Basic(_Strict):
    type: Literal["basic"]
    username: str
    password: str | None = None


class _Token(_Strict):
    type: Literal["token"]
    token_env: str


class _Limits(_Strict):
    max_queued: int = 1


class _Hook(_Strict):
    id: str
    auth: Annotated[_Basic | _Token, Field(discriminator="type")]
    limits: _Limits | None = None
    many: list[_Limits] = []
    named: dict[str, _Limits] = {}

    @field_validator("id")
    @classmethod
    def _short(cls, value: str) -> str:
        if len(value) > 3:
            raise ValueError("the id is longer than 3 characters")
        return value


SCHEMA = TypeAdapter(_Hook).json_schema()


def _messages(data: Any) -> dict[str, str]:
    with pytest.raises(ValidationError) as refused:
        _Hook.model_validate(data)
    return {".".join(str(p) for p in e["loc"]): message(e, SCHEMA) for e in refused.value.errors(include_url=False)}


def test_an_unknown_key_names_the_keys_of_its_own_object_through_a_discriminated_union() -> None:
    found = _messages({"id": "a", "auth": {"type": "token", "token_env": "T", "tokn": 1}, "colour": 1})
    assert found["auth.token.tokn"] == "unknown key 'tokn'; allowed here: token_env, type (did you mean 'token_env'?)"
    assert found["colour"] == "unknown key 'colour'; allowed here: auth, id, limits, many, named"
    found = _messages({"id": "a", "auth": {"type": "basic", "username": "u", "secret": "s"}})
    assert found["auth.basic.secret"] == "unknown key 'secret'; allowed here: password, type, username"


def test_an_unknown_key_in_an_optional_object_a_list_item_and_a_mapping_value() -> None:
    found = _messages(
        {
            "id": "a",
            "auth": {"type": "token", "token_env": "T"},
            "limits": {"max_queue": 2},
            "many": [{}, {"maxqueued": 1}],
            "named": {"x": {"queued": 1}},
        }
    )
    assert found["limits.max_queue"].endswith("allowed here: max_queued (did you mean 'max_queued'?)")
    assert found["many.1.maxqueued"].startswith("unknown key 'maxqueued'; allowed here: max_queued")
    assert found["named.x.queued"].startswith("unknown key 'queued'; allowed here: max_queued")


def test_without_a_schema_an_unknown_key_is_still_named() -> None:
    with pytest.raises(ValidationError) as refused:
        _Limits.model_validate({"colour": 1})
    assert message(refused.value.errors()[0]) == "unknown key 'colour'"


def test_an_object_expected_says_so_in_json_words_with_the_type_that_came() -> None:
    found = _messages({"id": "a", "auth": [], "limits": "no"})
    assert found["limits"] == "must be a JSON object, not a string"
    assert found["auth"] == "must be a JSON object, not an array"
    with pytest.raises(ValidationError) as refused:
        _Hook.model_validate(None)
    (whole,) = refused.value.errors(include_input=False)
    assert message(whole) == "must be a JSON object"  # without the input: its type is not guessed
    assert all("_Hook" not in m and "instance" not in m for m in found.values())


def test_an_unknown_tag_and_a_validator_sentence() -> None:
    found = _messages({"id": "abcd", "auth": {"type": "tokn"}})
    assert found["auth"] == "unknown type 'tokn'; one of: 'basic', 'token'"
    assert found["id"] == "the id is longer than 3 characters"  # no "Value error, "


@pytest.mark.parametrize(
    ("value", "said"),
    [(None, "null"), (True, "a boolean"), (1, "a number"), (1.5, "a number"), ("x", "a string"), ([], "an array"),
     ({}, "an object")],
)  # fmt: skip
def test_json_type(value: object, said: str) -> None:
    assert json_type(value) == said


def test_listed_never_disagrees_with_its_count() -> None:
    names = [f"f{n}" for n in range(9)]
    assert listed(names[:5]) == "f0, f1, f2, f3, f4"
    assert listed(names[:6]) == "f0, f1, f2, f3, f4, f5"  # one more than the limit: named, not "and 1 more"
    assert listed(names) == "f0, f1, f2, f3, f4 and 4 more"
    assert listed([]) == ""


def test_a_wrong_or_missing_tag_is_located_at_its_key() -> None:
    with pytest.raises(ValidationError) as refused:
        _Hook.model_validate({"id": "a", "auth": {"type": "tokn"}})
    (wrong,) = refused.value.errors()
    assert located(wrong) == ("auth", "type")
    with pytest.raises(ValidationError) as refused:
        _Hook.model_validate({"id": "a", "auth": {"token_env": "T"}})
    (missing,) = refused.value.errors()
    assert located(missing) == ("auth", "type")
    assert message(missing) == "type is missing: it says which keys this object takes"
