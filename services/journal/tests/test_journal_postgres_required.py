"""The PostgreSQL variants skip when PostgreSQL is unreachable, and fail under ``TEMPORALITY_REQUIRE_POSTGRES=1``.

The behaviour is the conftest's, so it is checked by running pytest itself on the one test below
against a PostgreSQL URL nothing listens on.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect

from temporality_journal import Database

HERE = Path(__file__).resolve()
REPO_ROOT = HERE.parents[3]
REQUIRE = "TEMPORALITY_REQUIRE_POSTGRES"


async def test_database_is_fresh_and_has_the_journal_tables(database: Database) -> None:
    async with database.engine.connect() as conn:
        tables = await conn.run_sync(lambda sync: set(inspect(sync).get_table_names()))
    assert {"events", "runs"} <= tables


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port  # closed again on exit: nothing listens on it


async def _run_postgres_variant(require: str | None, basetemp: Path) -> tuple[int | None, str]:
    """Run pytest on the test above, PostgreSQL variant only, against a closed port: (exit code, output).

    Its own ``--basetemp``: the default one under /tmp/pytest-of-<user> is shared with the suite's other
    pytest processes, and its clean-up at exit races with theirs ("Directory not empty")."""
    env = {k: v for k, v in os.environ.items() if k != REQUIRE}
    env["TEMPORALITY_TEST_POSTGRES_URL"] = f"postgresql://postgres:s3cret@127.0.0.1:{_closed_port()}/postgres"
    if require is not None:
        env[REQUIRE] = require
    node = f"{HERE}::test_database_is_fresh_and_has_the_journal_tables[postgres]"
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "pytest", node, "-q", "-rsE", "-p", "no:cacheprovider", f"--basetemp={basetemp}"),
        cwd=REPO_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(240):  # a whole pytest start: over 90 s at load 12 (4 December)
            output, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode, output.decode()


@pytest.mark.timeout(300)  # two pytest processes started side by side (each bounded above)
async def test_unreachable_postgres_skips_by_default_and_fails_when_required(tmp_path: Path) -> None:
    (skip_rc, skipped), (fail_rc, failed) = await asyncio.gather(
        _run_postgres_variant(None, tmp_path / "skip"), _run_postgres_variant("1", tmp_path / "fail")
    )
    reason = "PostgreSQL not reachable at postgresql://postgres:***@127.0.0.1:"

    assert skip_rc == 0, skipped
    assert "1 skipped" in skipped
    assert reason in skipped

    assert fail_rc == 1, failed
    assert "1 error" in failed
    assert "skipped" not in failed
    assert reason in failed
    assert f"{REQUIRE}=1 requires it" in failed
    assert "During handling" not in failed  # the reason alone, no chained traceback

    assert "s3cret" not in skipped + failed
