"""A fresh PostgreSQL database per test, on the server CI has (127.0.0.1:5432) or the one you name.

``TEMPORALITY_TEST_POSTGRES_URL``
    The server to create the per-test databases on (default ``postgresql://postgres@127.0.0.1:5432/postgres``).
``TEMPORALITY_REQUIRE_POSTGRES``
    Unset (a developer's machine): when that server is unreachable, PostgreSQL tests are *skipped*.
    ``1`` (CI sets it): they *fail* instead, with the reason, so a broken database service in CI
    cannot pass the suite unnoticed on SQLite alone.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pytest
from sqlalchemy.engine import make_url

__all__ = ["DEFAULT_TEST_POSTGRES_URL", "REQUIRE_POSTGRES_ENV", "fresh_postgres_database", "postgres_admin_url"]

DEFAULT_TEST_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REQUIRE_POSTGRES_ENV = "TEMPORALITY_REQUIRE_POSTGRES"


def postgres_admin_url() -> str:
    raw = os.environ.get("TEMPORALITY_TEST_POSTGRES_URL", DEFAULT_TEST_POSTGRES_URL)
    return make_url(raw).set(drivername="postgresql").render_as_string(hide_password=False)


def _required() -> bool:
    return os.environ.get(REQUIRE_POSTGRES_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


async def _connect_admin(admin_url: str) -> asyncpg.Connection:
    """The admin connection; unreachable: skip, or fail when ``TEMPORALITY_REQUIRE_POSTGRES=1``."""
    try:
        return await asyncpg.connect(admin_url, timeout=3)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        error = exc  # skip/fail outside the handler: the reason alone, no chained traceback
    shown = make_url(admin_url).render_as_string(hide_password=True)
    reason = f"PostgreSQL not reachable at {shown} ({error!r})"
    if _required():
        pytest.fail(
            f"{reason}; {REQUIRE_POSTGRES_ENV}=1 requires it: start PostgreSQL or point "
            "TEMPORALITY_TEST_POSTGRES_URL at one",
            pytrace=False,
        )
    pytest.skip(f"{reason}; set TEMPORALITY_TEST_POSTGRES_URL ({REQUIRE_POSTGRES_ENV}=1 fails instead)")


@asynccontextmanager
async def fresh_postgres_database(prefix: str, options: str = "") -> AsyncIterator[str]:
    """Create ``<prefix>_<hex>`` (``options`` after ``CREATE DATABASE <name>``, e.g. ``TEMPLATE template0
    LC_CTYPE 'C'``), yield its ``postgresql+asyncpg://`` URL, drop it afterwards."""
    admin_url = postgres_admin_url()
    admin = await _connect_admin(admin_url)
    name = f"{prefix}_{uuid.uuid4().hex}"
    try:
        await admin.execute(f'CREATE DATABASE "{name}" {options}'.rstrip())
    finally:
        await admin.close()
    try:
        yield (
            make_url(admin_url)
            .set(drivername="postgresql+asyncpg", database=name)
            .render_as_string(hide_password=False)
        )
    finally:
        admin = await asyncpg.connect(admin_url, timeout=3)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
