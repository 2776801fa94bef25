"""The run search ``q`` and the agent / trigger filters ignore case beyond ASCII: ``q=ЮНИКОД`` finds the run titled
"… юникод …" (SQLite's ``LIKE`` folds ASCII only), ``trigger_id=ADO-PR-REVIEW`` finds ``ado-pr-review``'s runs
like ``agent=REVIEWER`` finds reviewer's. Through the real consumer on a real bus, on SQLite, PostgreSQL, and a
PostgreSQL database made with ``LC_CTYPE=C`` (whose own ``lower()`` folds ASCII only)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from temporality_testing.postgres import fresh_postgres_database

MakeStory = Callable[..., Any]  # journal_support.RunStory
Journal = Any  # conftest.Journal


@pytest.fixture(params=["sqlite", "postgres", "postgres_c_ctype"])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """conftest's databases, and a PostgreSQL database whose collation and character classes are ``C``."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'journal' / 'journal.db'}"
        return
    if request.param == "postgres":
        async with fresh_postgres_database("journal") as url:
            yield url
        return
    c_ctype = "TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"
    async with fresh_postgres_database("journal_c", c_ctype) as url:
        yield url


async def _ids(journal: Journal, path: str = "/runs", **params: str) -> set[str]:
    response = await journal.client.get(path, params=params)
    assert response.status_code == 200, response.text
    return {r["run_id"] for r in response.json()["runs"]}


async def test_search_and_filters_ignore_case_beyond_ascii(journal: Journal, story: MakeStory) -> None:
    cyrillic = story(run_id="run-cyrillic", title="Ревью юникод PR 7", agent="ревьюер", trigger_id="ado-pr-review")
    german = story(run_id="run-german", title="Straße Ärger", agent="Reviewer", trigger_id="ADO-PR-Review")
    plain = story(run_id="run-plain", title="100 percent ASCII", agent="triager", trigger_id="gh")
    await journal.send(
        *(s.requested() for s in (cyrillic, german, plain)),
        cyrillic.started(),
        cyrillic.human_requested(),
        german.started(),
        german.human_requested(),
    )
    for q in ("юникод", "ЮНИКОД", "ЮниКОД"):
        assert await _ids(journal, q=q) == {"run-cyrillic"}, q
    for q in ("STRAßE ärger", "straße ÄRGER", "ärg"):
        assert await _ids(journal, q=q) == {"run-german"}, q
    assert await _ids(journal, q="ascii") == {"run-plain"}
    assert await _ids(journal, q="%") == set()  # no wildcard: a literal substring
    assert await _ids(journal, q="100 P") == {"run-plain"}
    assert await _ids(journal, q="run-cyr") == {"run-cyrillic"}  # the start of a pasted run id

    # the trigger filter is case-insensitive like the agent filter, on every view that takes it
    both = {"run-cyrillic", "run-german"}
    assert await _ids(journal, trigger_id="ADO-PR-REVIEW") == both
    assert await _ids(journal, trigger_id="ado-pr-review") == both
    assert await _ids(journal, trigger_id="gh") == {"run-plain"}
    assert await _ids(journal, "/runs/waiting", trigger_id="Ado-Pr-Review") == both
    assert await _ids(journal, agent="РЕВЬЮЕР") == {"run-cyrillic"}
    assert await _ids(journal, agent="REVIEWER") == {"run-german"}
    analytics = (await journal.client.get("/analytics/human", params={"trigger_id": "ADO-PR-REVIEW"})).json()
    assert (analytics["runs_total"], analytics["requests_total"]) == (2, 2)
    if journal.database.dialect == "postgresql":
        ctype = await _scalar(journal, "SELECT datctype FROM pg_database WHERE datname = current_database()")
        assert (journal.database.fold_collation is None) == (ctype != "C"), (ctype, journal.database.fold_collation)


async def _scalar(journal: Journal, sql: str) -> Any:
    from sqlalchemy import text

    async with journal.database.engine.connect() as conn:
        return (await conn.execute(text(sql))).scalar()
