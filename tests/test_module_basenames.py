"""Test module basenames are unique across the repository (the test directories are not packages: pytest
imports each module by its bare file name and refuses a second ``test_x.py`` at collection).

The root conftest runs the same check at session start, so a duplicate fails the run before collection
with one clear message naming both paths (instead of pytest's "import file mismatch" on whichever came
second); this test is the check's own specification, and fails on the repository too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from temporality_testing.modules import conftest_imports, describe, same_basenames

ROOT = Path(__file__).resolve().parents[1]


def _testpaths() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    testpaths: list[str] = config["tool"]["pytest"]["ini_options"]["testpaths"]
    return testpaths


def test_no_two_test_modules_in_the_repository_share_a_basename() -> None:
    duplicates = same_basenames(ROOT, _testpaths())
    assert duplicates == {}, describe(duplicates)


def test_no_module_imports_a_conftest_by_name() -> None:
    importers = conftest_imports(ROOT, _testpaths())
    assert importers == [], describe({}, importers)


def test_every_form_of_importing_a_conftest_is_found_and_relative_imports_are_not(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        *("a/test_a.py", "a/conftest.py", "b/test_b.py", "c/test_c.py", "d/support.py", "e/test_e.py"),
        *("f/test_f.py", "g/test_g.py"),
    )
    (tmp_path / "a/test_a.py").write_text("from conftest import Story\n", encoding="utf-8")
    (tmp_path / "b/test_b.py").write_text("def f() -> None:\n    import conftest as c\n", encoding="utf-8")
    (tmp_path / "d/support.py").write_text("from conftest.x import y\n", encoding="utf-8")
    (tmp_path / "c/test_c.py").write_text("from .conftest import Story\nimport conftests\n", encoding="utf-8")
    (tmp_path / "e/test_e.py").write_text("this is not python (\n", encoding="utf-8")
    # Python reads identifiers in their NFKC form: a fullwidth c (U+FF43) still imports conftest (the check skips only
    # the modules that do not name it in that form); naming it in a docstring imports nothing
    (tmp_path / "f/test_f.py").write_text("import \uff43onftest\n", encoding="utf-8")
    (tmp_path / "g/test_g.py").write_text('"""Not conftest: a docstring."""\n', encoding="utf-8")
    importers = conftest_imports(tmp_path)
    assert importers == [Path("a/test_a.py"), Path("b/test_b.py"), Path("d/support.py"), Path("f/test_f.py")]
    message = describe({}, importers)
    assert "a/test_a.py" in message
    assert "_support.py" in message
    assert "unique basenames" not in message


def test_the_check_sees_this_module_and_the_other_test_trees() -> None:
    """Not vacuous: it walks every test path (and would see a duplicate of this very file)."""
    seen = same_basenames(ROOT, [*_testpaths(), "tests"])  # "tests" twice: the same files, no duplicate
    assert seen == {}
    twice = same_basenames(ROOT, ["tests", "tests/../tests"])
    assert twice == {}, "the same file reached twice is one module, not two"


def _tree(root: Path, *files: str) -> None:
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("def test_ok() -> None:\n    assert True\n", encoding="utf-8")


def test_two_test_modules_with_one_basename_are_both_named(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        "services/a/tests/test_api.py",
        "services/b/tests/test_api.py",
        "services/b/tests/test_other.py",
        "libs/c/tests/test_other_thing.py",
    )
    duplicates = same_basenames(tmp_path, ["services", "libs"])
    assert duplicates == {"test_api.py": [Path("services/a/tests/test_api.py"), Path("services/b/tests/test_api.py")]}
    message = describe(duplicates)
    assert "services/a/tests/test_api.py" in message
    assert "services/b/tests/test_api.py" in message


def test_helper_modules_beside_tests_count_conftests_and_packages_do_not(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        "tests/test_one.py",
        "tests/support.py",  # imported by bare name from the tests beside it
        "tests/conftest.py",
        "svc/tests/test_two.py",
        "svc/tests/support.py",
        "svc/tests/conftest.py",  # pytest names each conftest by its path
        "svc/src/pkg/__init__.py",
        "svc/src/pkg/support.py",  # a package's module: imported as pkg.support
        "pkg_tests/__init__.py",
        "pkg_tests/test_one.py",  # in a package: pkg_tests.test_one
        ".venv/lib/test_one.py",  # pytest does not recurse into hidden directories
        "node_modules/x/test_two.py",
    )
    duplicates = same_basenames(tmp_path)
    assert duplicates == {"support.py": [Path("svc/tests/support.py"), Path("tests/support.py")]}


def test_a_duplicate_stops_the_run_before_collection_naming_both(tmp_path: Path) -> None:
    """The root conftest's early check, in a real pytest process: exit 4 (usage error), both paths named."""
    _tree(tmp_path, "one/test_same.py", "two/test_same.py")
    (tmp_path / "conftest.py").write_text((ROOT / "conftest.py").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = one two\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "pytest_asyncio.plugin", "-q"],
        cwd=tmp_path,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},  # the root conftest's needs only: a quick start
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 4, output
    assert "one/test_same.py, two/test_same.py" in output, output
    assert "import file mismatch" not in output, output


def test_a_conftest_import_stops_the_run_before_collection(tmp_path: Path) -> None:
    _tree(tmp_path, "one/test_one.py")
    (tmp_path / "one/test_one.py").write_text("from conftest import X\n", encoding="utf-8")
    (tmp_path / "conftest.py").write_text((ROOT / "conftest.py").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = one\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "pytest_asyncio.plugin", "-q"],
        cwd=tmp_path,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 4, output
    assert "one/test_one.py" in output, output
    assert "import a conftest by name" in output, output
