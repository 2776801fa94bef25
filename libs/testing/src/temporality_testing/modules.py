"""Test module basenames must be unique across the repository.

The test directories have no ``__init__.py`` (pytest's default ``prepend`` import mode): each test module,
and each helper module beside one (``e2e_support.py``, ``human_support.py``), is imported under its bare
file name, so a second ``test_x.py`` elsewhere is refused at collection ("import file mismatch") and a
second ``x_support.py`` silently gets the first one's module. :func:`same_basenames` finds them before
collection, for the root conftest's clear early error naming every path.

For the same reason a module must never ``import conftest``: with several conftests on ``sys.path``, the
name resolves to whichever was imported first, so a helper that works alone fails to import when another
service's tests run in the same process. :func:`conftest_imports` finds such imports; shared helpers live
in uniquely named ``*_support.py`` modules instead.
"""

from __future__ import annotations

import ast
import unicodedata
from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path

__all__ = ["TEST_FILE_PATTERNS", "conftest_imports", "describe", "same_basenames"]

#: pytest's default ``python_files``.
TEST_FILE_PATTERNS = ("test_*.py", "*_test.py")
#: pytest's default ``norecursedirs`` (and the virtualenvs a checkout holds).
_SKIPPED_DIRS = ("*.egg", ".*", "_darcs", "build", "CVS", "dist", "node_modules", "venv", "{arch}", "__pycache__")
#: Files pytest imports under a name it makes unique itself (or not at all by file name).
_NOT_BY_BASENAME = ("conftest.py", "__init__.py", "__main__.py")


def _walk(directory: Path) -> Iterable[Path]:
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.is_dir():
            if not any(fnmatch(entry.name, pattern) for pattern in _SKIPPED_DIRS):
                yield from _walk(entry)
        elif entry.suffix == ".py":
            yield entry


def _python_files(root: Path, testpaths: Iterable[str]) -> set[Path]:
    files: set[Path] = set()
    for testpath in testpaths:
        start = (root / testpath).resolve()
        if start.is_file():
            files.add(start)
        elif start.is_dir():
            files.update(_walk(start))
    return files


def _imports_conftest(file: Path) -> bool:
    try:
        source = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False  # pytest reports what it cannot import itself
    # Only a module naming ``conftest`` can import it: the others are not parsed (parsing every module under
    # the testpaths took ~2 s of CPU at every pytest start -- the controller's, each xdist worker's). Python
    # reads an identifier as its NFKC form, so a non-ASCII module is searched in that form.
    if "conftest" not in (source if source.isascii() else unicodedata.normalize("NFKC", source)):
        return False
    try:
        tree = ast.parse(source, filename=str(file))
    except SyntaxError:
        return False  # pytest reports what it cannot import itself
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "conftest" for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "conftest":
            return True
    return False


def conftest_imports(root: Path, testpaths: Iterable[str] = (".",)) -> list[Path]:
    """The modules under ``testpaths`` (relative to ``root``) that import a ``conftest`` by name."""
    return sorted(f.relative_to(root.resolve()) for f in _python_files(root, testpaths) if _imports_conftest(f))


def same_basenames(root: Path, testpaths: Iterable[str] = (".",)) -> dict[str, list[Path]]:
    """Basename -> every path (relative to ``root``) of the modules that share it: test modules
    (:data:`TEST_FILE_PATTERNS`) under ``testpaths``, and the helper modules in the same directories
    (imported by bare name too). Directories with an ``__init__.py`` are packages: their modules are
    imported by dotted name and are left out. Empty when every basename is unique."""
    files = _python_files(root, testpaths)
    test_dirs = {f.parent for f in files if any(fnmatch(f.name, p) for p in TEST_FILE_PATTERNS)}
    by_name: dict[str, list[Path]] = {}
    for file in sorted(files):
        if file.parent not in test_dirs or file.name in _NOT_BY_BASENAME or (file.parent / "__init__.py").exists():
            continue
        by_name.setdefault(file.name, []).append(file.relative_to(root.resolve()))
    return {name: paths for name, paths in by_name.items() if len(paths) > 1}


def describe(duplicates: dict[str, list[Path]], importers: Iterable[Path] = ()) -> str:
    """The error message: one line per shared basename, naming every path, then every conftest importer."""
    lines: list[str] = []
    if duplicates:
        lines.append(
            "test modules must have unique basenames across the repository (pytest imports each by its bare file "
            "name and refuses the second at collection); rename one of:"
        )
        lines += [f"  {name}: {', '.join(p.as_posix() for p in paths)}" for name, paths in sorted(duplicates.items())]
    importers = list(importers)
    if importers:
        lines.append(
            "these modules import a conftest by name, which resolves to whichever conftest was imported first "
            "(another service's, when several run together); move what they need into a uniquely named "
            "*_support.py module:"
        )
        lines += [f"  {p.as_posix()}" for p in importers]
    return "\n".join(lines)
