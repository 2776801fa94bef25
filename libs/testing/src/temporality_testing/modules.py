"""Test module basenames must be unique across the repository.

The test directories have no ``__init__.py`` (pytest's default ``prepend`` import mode): each test module,
and each helper module beside one (``e2e_support.py``, ``human_support.py``), is imported under its bare
file name, so a second ``test_x.py`` elsewhere is refused at collection ("import file mismatch") and a
second ``x_support.py`` silently gets the first one's module. :func:`same_basenames` finds them before
collection, for the root conftest's clear early error naming every path.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path

__all__ = ["TEST_FILE_PATTERNS", "describe", "same_basenames"]

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


def same_basenames(root: Path, testpaths: Iterable[str] = (".",)) -> dict[str, list[Path]]:
    """Basename -> every path (relative to ``root``) of the modules that share it: test modules
    (:data:`TEST_FILE_PATTERNS`) under ``testpaths``, and the helper modules in the same directories
    (imported by bare name too). Directories with an ``__init__.py`` are packages: their modules are
    imported by dotted name and are left out. Empty when every basename is unique."""
    files: set[Path] = set()
    for testpath in testpaths:
        start = (root / testpath).resolve()
        if start.is_file():
            files.add(start)
        elif start.is_dir():
            files.update(_walk(start))
    test_dirs = {f.parent for f in files if any(fnmatch(f.name, p) for p in TEST_FILE_PATTERNS)}
    by_name: dict[str, list[Path]] = {}
    for file in sorted(files):
        if file.parent not in test_dirs or file.name in _NOT_BY_BASENAME or (file.parent / "__init__.py").exists():
            continue
        by_name.setdefault(file.name, []).append(file.relative_to(root.resolve()))
    return {name: paths for name, paths in by_name.items() if len(paths) > 1}


def describe(duplicates: dict[str, list[Path]]) -> str:
    """The error message: one line per shared basename, naming every path."""
    lines = [
        "test modules must have unique basenames across the repository (pytest imports each by its bare file "
        "name and refuses the second at collection); rename one of:"
    ]
    lines += [f"  {name}: {', '.join(p.as_posix() for p in paths)}" for name, paths in sorted(duplicates.items())]
    return "\n".join(lines)
