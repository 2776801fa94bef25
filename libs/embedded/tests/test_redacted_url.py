"""The database URL ``temporality up`` shows (its banner, its refusal of a database the journal cannot use) never
holds the password: the URL is parsed as SQLAlchemy parses it (the journal's own parser), so a password holding
``/``, ``?`` or ``#`` is hidden whole, and a string that is no URL (a libpq keyword string) is not echoed."""

from __future__ import annotations

import pytest

from temporality_embedded.cli import _database_problem, build_parser
from temporality_embedded.stack import UNPARSEABLE_URL, redacted_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://j:p/w@db/j", "postgresql://j:***@db/j"),
        ("postgresql://j:p?w@db/j", "postgresql://j:***@db/j"),
        ("postgresql://j:p#w@db/j", "postgresql://j:***@db/j"),
        ("postgresql://j:p%2Fw@db:5433/j", "postgresql://j:***@db:5433/j"),
        ("postgresql+psycopg://u:pw@h/d?sslmode=require", "postgresql+psycopg://u:***@h/d?sslmode=require"),
        ("postgresql://u@h/d?sslmode=require&password=s3cret", "postgresql://u@h/d?sslmode=require&password=***"),
        (
            "postgresql://u@h/d?sslpassword=k&application_name=a",
            "postgresql://u@h/d?sslpassword=***&application_name=a",
        ),
        ("mysql://root:hunter2@db/j", "mysql://root:***@db/j"),
        # nothing secret: shown as given
        ("postgresql://u@h/d", "postgresql://u@h/d"),
        ("sqlite:////abs/path/journal.db", "sqlite:////abs/path/journal.db"),
        ("sqlite:///relative.db", "sqlite:///relative.db"),
    ],
)
def test_the_password_is_hidden_whole(url: str, shown: str) -> None:
    assert redacted_url(url) == shown


@pytest.mark.parametrize("url", ["host=db password=s3cret dbname=j", "", "::s3cret"])
def test_a_string_that_does_not_parse_is_not_shown(url: str) -> None:
    assert redacted_url(url) == UNPARSEABLE_URL


@pytest.mark.parametrize(
    "url", ["host=db password=s3cret", "postgresqlx://j:p/w@db/j", "mysql://j:p?w@db/j", "oracle://j:p#w@db/j"]
)
def test_the_refusal_of_a_database_does_not_show_its_password(url: str) -> None:
    problem = _database_problem(build_parser().parse_args(["up", "--database-url", url]))
    assert problem is not None
    assert "must be SQLite or PostgreSQL" in problem
    for secret in ("s3cret", "p/w", "p?w", "p#w", "w@"):
        assert secret not in problem, problem


def test_a_libpq_keyword_string_is_refused_as_unparseable() -> None:
    problem = _database_problem(build_parser().parse_args(["up", "--database-url", "host=db password=s3cret"]))
    assert problem is not None
    assert f"not {UNPARSEABLE_URL} (--database-url)" in problem, problem
