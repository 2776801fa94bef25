"""``temporality up --rebuild-journal``: the journal's read model is dropped (``temporality-journal rebuild`` with the
journal's environment, the embedded nats-server running, no service started) and replayed from the events stream
when the journal starts -- a run the read model lost is back; a rebuild that fails stops ``up`` with its exit code
and its output, before any service starts."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
from pathlib import Path

import pytest
from e2e_support import CONFIG
from test_embedded_supervision import Up, park_a_run, run_reaches
from test_embedded_up import SCRIPT

from temporality_embedded import free_port

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(400)
def test_rebuild_journal_replays_a_run_the_read_model_lost(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    up = Up(data_dir)
    try:
        up.ready()
        run_id = asyncio.run(park_a_run(up))
    finally:
        assert up.interrupt() == 0, up.output
    # the read model loses the run (a projection bug, a restored backup): the stream still has its events
    with sqlite3.connect(data_dir / "journal.db") as db:
        assert db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,)).rowcount == 1
        db.execute("DELETE FROM events")

    up = Up(data_dir, CONFIG, "--rebuild-journal")
    try:
        out = up.ready()
        lines = out.splitlines()
        rebuilt = next(i for i, line in enumerate(lines) if line.startswith("Journal read model dropped"))
        starting = next(i for i, line in enumerate(lines) if line.startswith("Starting Temporality"))
        assert rebuilt < starting, out
        asyncio.run(run_reaches(up, run_id, "waiting_for_human"))
    finally:
        assert up.interrupt() == 0, up.output


@pytest.mark.timeout(120)
def test_a_failed_rebuild_stops_up_with_its_exit_code_and_output(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    (data_dir / "journal.db").mkdir()  # no SQLite database can be opened there
    proc = subprocess.run(
        [
            str(SCRIPT), "up", "--rebuild-journal",
            "--data-dir", str(data_dir),
            "--config-dir", str(CONFIG),
            "--gateway-port", str(free_port()),
            "--human-port", str(free_port()),
            "--journal-port", str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "error: temporality-journal rebuild failed (exit 1); nothing was started:" in out
    assert "journal.rebuild_failed" in out
    assert "Starting Temporality" not in out
    assert not (data_dir / "run").exists() or not list((data_dir / "run").glob("*.ready")), out


def test_accept_loss_applies_only_with_rebuild_journal(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(SCRIPT), "up", "--accept-loss", "--data-dir", str(tmp_path / "data"), "--config-dir", str(CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--accept-loss applies only with --rebuild-journal" in proc.stdout + proc.stderr
    assert not (tmp_path / "data" / "nats").exists()  # nothing was started
