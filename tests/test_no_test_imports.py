"""No module imports a test module (`test_*.py`): what tests, benches and the operator share lives in library
modules (e2e/operator_fixtures.py, e2e/traffic.py, tests/documents.py, ...), so a test module can change or go
without breaking another. Read from the source with `ast` (nothing is imported), over every Python file of the
operator, the tests, the e2e harness, the benches and the tools.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: Where the project's Python lives, and the package root of each (the operator's package is under operator/).
ROOTS = {"operator": REPO / "operator", "tests": REPO, "e2e": REPO, "bench": REPO, "tools": REPO}


def _is_test_module(name: str) -> bool:
    return name.rpartition(".")[2].startswith("test_")


def _module_file(name: str, bases: list[Path]) -> Path | None:
    """The file of module `name` under one of `bases` (a module or a package), or None: not the project's."""
    parts = name.split(".")
    for base in bases:
        for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate
    return None


def imported_test_modules(path: Path, base: Path, bases: list[Path], root: Path = REPO) -> list[str]:
    """The test modules `path` imports, as "importer:line imports test module" (paths relative to `root`): module
    names that resolve, under `bases`, to a `test_*.py` file. `base` is the package root of `path`."""
    package = list(path.relative_to(base).parent.parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            parent = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*parent, *([node.module] if node.module else [])])
            names = [module, *(f"{module}.{a.name}" if module else a.name for a in node.names)]
        for name in names:
            if _is_test_module(name) and (target := _module_file(name, bases)) is not None:
                found.append(f"{path.relative_to(root)}:{node.lineno} imports {target.relative_to(root)}")
    return found


def project_files() -> list[tuple[Path, Path]]:
    """(file, its package root) for every Python file of the project, outside virtualenvs and caches."""
    out = []
    for top, base in ROOTS.items():
        for p in sorted((REPO / top).rglob("*.py")):
            if not {".venv", "__pycache__", "build"} & set(p.relative_to(REPO).parts):
                out.append((p, base))
    out += [(p, REPO) for p in sorted(REPO.glob("*.py"))]
    return out


def test_no_module_imports_a_test_module() -> None:
    files = project_files()
    assert len(files) > 100, f"the scan found only {len(files)} files: is ROOTS still where the code is?"
    bases = sorted(set(ROOTS.values()))
    offenders = [line for path, base in files for line in imported_test_modules(path, base, bases)]
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
