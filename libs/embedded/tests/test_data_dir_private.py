"""``temporality up`` keeps its data dir (the journal: every payload and answer) to the user."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from temporality_embedded.cli import NATS_PORT_FILE, _private_data_dir


@pytest.fixture(autouse=True)
def _restore_umask() -> Iterator[None]:
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


def test_a_new_data_dir_is_made_0700_and_files_written_after_are_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "a" / "data"
    _private_data_dir(data_dir)
    assert data_dir.stat().st_mode & 0o777 == 0o700
    (data_dir / "journal.db").write_bytes(b"x")
    assert (data_dir / "journal.db").stat().st_mode & 0o077 == 0


def test_an_earlier_readable_data_dir_is_tightened_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    data_dir.chmod(0o755)
    (data_dir / NATS_PORT_FILE).write_text("4222")
    _private_data_dir(data_dir)
    assert data_dir.stat().st_mode & 0o777 == 0o700
    assert "now 0700" in capsys.readouterr().out


def test_a_directory_that_is_not_a_data_dir_yet_is_left_as_it_is(tmp_path: Path) -> None:
    # --data-dir pointed at an existing folder of the user's (no NATS port file): its mode is theirs to choose
    elsewhere = tmp_path / "shared"
    elsewhere.mkdir()
    elsewhere.chmod(0o755)
    _private_data_dir(elsewhere)
    assert elsewhere.stat().st_mode & 0o777 == 0o755
