"""What ``temporality up`` prints under "<service> exited (...)": the first error this start logged is shown first as
the likely cause only for a non-zero exit code and only when it was logged shortly before the exit; an older one is
labelled with its time, so that it is not read as the cause; after a signal none is singled out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporality_embedded.processes import RECENT_ERROR_S, ServiceProcess, logged_at

EXIT = datetime(2026, 12, 7, 2, 0, 30, tzinfo=UTC)


def _process(tmp_path: Path, lines: list[str]) -> ServiceProcess:
    process = ServiceProcess("run-executor", {}, tmp_path / "run")
    process.run_dir.mkdir(parents=True)
    process.log_file.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return process


def _line(at: datetime, level: str, event: str) -> str:
    return f"{at.strftime('%Y-%m-%dT%H:%M:%S.%fZ')} [{level:<9}] {event}"


def test_an_error_logged_long_before_a_non_zero_exit_is_labelled_as_earlier(tmp_path: Path) -> None:
    poison = _line(EXIT - timedelta(seconds=20), "error", "message.dead_lettered error='InvalidEnvelope'")
    process = _process(tmp_path, [poison, _line(EXIT - timedelta(seconds=1), "info", "shutting down")])
    report = process.exit_report(1, now=EXIT)
    first = report.splitlines()[0]
    assert first.startswith("an earlier error logged since this start, at 2026-12-07 02:00:10 UTC (20 s before")
    assert "not necessarily the cause" in first
    assert report.splitlines()[1] == poison


def test_an_error_logged_just_before_a_non_zero_exit_is_shown_first(tmp_path: Path) -> None:
    fatal = _line(EXIT - timedelta(seconds=RECENT_ERROR_S / 2), "error", "config.invalid agents.yaml")
    process = _process(tmp_path, [_line(EXIT - timedelta(seconds=60), "info", "started"), fatal])
    report = process.exit_report(2, now=EXIT)
    assert report.splitlines()[0] == fatal
    assert report.splitlines()[1].startswith("--- the last lines of")


def test_after_a_signal_no_earlier_error_is_singled_out(tmp_path: Path) -> None:
    poison = _line(EXIT - timedelta(seconds=1), "error", "message.dead_lettered")
    process = _process(tmp_path, [poison])
    assert process.exit_report(-9, now=EXIT) == poison  # the tail only


def test_logged_at_reads_console_and_json_lines() -> None:
    assert logged_at("2026-12-07T02:00:10.123456Z [error    ] x") == datetime(2026, 12, 7, 2, 0, 10, 123456, UTC)
    assert logged_at('{"event": "x", "timestamp": "2026-12-07T02:00:10Z"}') == datetime(
        2026, 12, 7, 2, 0, 10, tzinfo=UTC
    )
    assert logged_at("ValueError: boom") is None
