"""``bench/agent_collab.py`` still runs (issue 10's bench: the ask_agent round trip against a bare NATS
request/reply in the same run). A smoke run with a handful of asks: it completes them, prints the round trip, its
legs, the baseline and the ratio, and writes a record ``bench/benchrecord.py`` reads. No speed is asserted (figures
belong to the bench, not to the suite); the bench broke once unnoticed (its ``run.requested`` was dead-lettered as
forged), which this catches.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import benchrecord  # noqa: E402


def test_the_agent_collab_bench_completes_its_round_trips_and_records_them(tmp_path: Path) -> None:
    record = tmp_path / "agent_collab.json"
    command = [sys.executable, str(ROOT / "bench" / "agent_collab.py"), "--asks", "3", "--per-saga", "3"]
    done = subprocess.run(
        [*command, "--json-out", str(record)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "ask_agent round trip (wait mode) over 3 asks" in out, out
    for line in ("asked -> message.received", "message.received -> replied", "replied -> answer.received"):
        assert line in out, out
    assert "baseline: bare core-NATS request/reply" in out, out
    assert "ratio p50 (ask_agent round trip / bare request-reply)" in out, out
    loaded = benchrecord.load_record(record)
    assert loaded.bench == "agent_collab"
