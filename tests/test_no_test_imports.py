"""No module imports a test module (`test_*.py`): what tests, benches and the operator share lives in library
modules (e2e/operator_fixtures.py, e2e/traffic.py, tests/documents.py, ...), so a test module can change or go
without breaking another. Read from the source with `ast` (nothing is imported, tests/import_scan.py), over every
Python file of the operator, the tests, the e2e harness, the benches and the tools.
"""

from __future__ import annotations

from pathlib import Path

from tests.import_scan import BASES, imported_test_modules, project_files


def test_no_module_imports_a_test_module() -> None:
    files = project_files()
    assert len(files) > 100, f"the scan found only {len(files)} files: is ROOTS still where the code is?"
    offenders = [line for path, base in files for line in imported_test_modules(path, base, BASES)]
    assert not offenders, ("test modules are imported; move what they share to a library module:\n  "
                           + "\n  ".join(offenders))


def test_the_scan_names_the_importer_and_the_test_module_it_imports(tmp_path: Path) -> None:
    """The scan itself: every form of import of a test module is found, and nothing else is."""
    pkg = tmp_path / "e2e"
    pkg.mkdir()
    for name in ("__init__.py", "test_a.py", "helpers.py"):
        (pkg / name).write_text("")
    (pkg / "lib.py").write_text(
        "import e2e.test_a\n"
        "from e2e.test_a import x\n"
        "from e2e import test_a\n"
        "from . import test_a as t\n"
        "from .test_a import y\n"
        "from e2e.helpers import z\n"  # a library module: fine
        "from aiohttp.test_utils import TestServer\n"  # not the project's: fine
        "def f():\n    from e2e.test_a import w\n")  # inside a function too
    found = imported_test_modules(pkg / "lib.py", tmp_path, [tmp_path], tmp_path)
    assert found == [f"e2e/lib.py:{n} imports e2e/test_a.py" for n in (1, 2, 3, 4, 5, 9)], found
