"""`make test`'s grouping really applies: tests sharing a module/session fixture of ours run on one worker.

It silently stopped once already: pytest 9.2 builds node ids from structured ids, and pytest-xdist 3.8's
``--dist loadgroup`` still appends ``@group`` to the legacy ``_nodeid`` (pytest-dev/pytest-xdist#1386), so
every shared fixture (a Synapse, a module's stack) was set up on every worker. This runs the real
``pytest -n 2 --dist loadgroup`` with the repository's root conftest on a small probe file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).resolve().parent / "xdist_probe" / "probe_grouped.py"
#: The plugins the probe needs, named instead of every installed one (schemathesis and hypothesis are most of
#: a pytest process's start-up, three times over: the controller and its two workers).
PLUGINS = ("-p", "xdist.plugin", "-p", "pytest_asyncio.plugin", "-p", "pytest_timeout")


def test_tests_sharing_a_module_fixture_run_on_one_worker(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "pytest",
                *PLUGINS,
                "-n",
                "2",
                "--dist",
                "loadgroup",
                "-v",
                "-p",
                "no:cacheprovider",
            ),
            *("-o", "python_files=probe_*.py", "--basetemp", str(tmp_path / "inner"), str(PROBE)),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"\[(gw\d)\] .*?PASSED \S*::(test_\w+)\[(\d)\](@\S+)?", done.stdout)
    assert len(ran) == 12, done.stdout
    grouped = [(worker, group) for worker, name, _, group in ran if name == "test_uses_the_shared_fixture"]
    assert len(grouped) == 6
    assert all(group for _, group in grouped), f"no xdist group on the fixture's users:\n{done.stdout}"
    assert len({worker for worker, _ in grouped}) == 1, f"one group, several workers:\n{done.stdout}"
    assert not [g for _, name, _, g in ran if name == "test_alone" and g], "a test without the fixture was grouped"
