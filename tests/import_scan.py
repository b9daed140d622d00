"""The project's imports read from its source with `ast` (nothing is imported): which modules a file imports
(`imported_modules`), which of them are test modules (`imported_test_modules`), and every project module a file
reaches through its imports (`reached`), and the private names a file takes from another module
(`private_imports`). Used by the tests of what may import what (tests/test_no_test_imports.py,
tests/test_unit_tier_imports.py, tests/test_render_imports.py)."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: Where the project's Python lives, and the package root of each (the operator's package is under operator/).
ROOTS = {"operator": REPO / "operator", "tests": REPO, "e2e": REPO, "bench": REPO, "tools": REPO}
BASES = sorted(set(ROOTS.values()))


def is_test_module(name: str) -> bool:
    return name.rpartition(".")[2].startswith("test_")


def module_file(name: str, bases: list[Path]) -> Path | None:
    """The file of module `name` under one of `bases` (a module or a package), or None: not the project's."""
    parts = name.split(".")
    for base in bases:
        for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate
    return None


def imported_modules(path: Path, base: Path) -> list[tuple[int, str]]:
    """(line, module name) of every import in `path`, at module level or inside a function; for `from M import n`
    both M and M.n (n may be a module). `base` is the package root of `path`, for relative imports."""
    package = list(path.relative_to(base).parent.parts)
    found: list[tuple[int, str]] = []
    for node in _statements(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            parent = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*parent, *([node.module] if node.module else [])])
            found += [(node.lineno, module), *((node.lineno, f"{module}.{a.name}" if module else a.name)
                                               for a in node.names)]
    return found


def _statements(nodes: list[ast.AST]) -> Iterator[ast.AST]:
    """Every statement of `nodes` and of the blocks nested in them (functions, classes, if/try/with/for/while/match,
    except clauses), depth first. An import is a statement, so the expressions, the bulk of a tree, are not visited."""
    for node in nodes:
        yield node
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, block, None)
            if isinstance(inner, list):
                yield from _statements(inner)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(path: Path, base: Path, bases: list[Path], root: Path = REPO) -> list[str]:
    """The private names (`_x`; not dunders) `path` takes from another module of the project, as "file:line uses
    module._x" (paths relative to `root`): `from M import _x` (a module `_x` too), and `M._x` on a project module
    bound by `import M` or `from P import M`. Other modules' (the standard library's, a package's) are not ours."""
    package = list(path.relative_to(base).parent.parts)
    tree = ast.parse(path.read_text(), str(path))
    found: list[str] = []
    modules: dict[str, str] = {}  # a local name bound to a project module -> the module's name
    for node in _statements(tree.body):
        if isinstance(node, ast.ImportFrom):
            parent = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*parent, *([node.module] if node.module else [])])
            if module_file(module, bases) is None:
                continue
            for a in node.names:
                full = f"{module}.{a.name}"
                if _private(a.name):
                    found.append(f"{path.relative_to(root)}:{node.lineno} uses {full}")
                elif module_file(full, bases) is not None:
                    modules[a.asname or a.name] = full
        elif isinstance(node, ast.Import):
            for a in node.names:
                if module_file(a.name, bases) is not None:
                    found += [f"{path.relative_to(root)}:{node.lineno} uses {a.name}"
                              for part in a.name.split(".") if _private(part)]
                    if a.asname:
                        modules[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules \
                and _private(node.attr):
            found.append(f"{path.relative_to(root)}:{node.lineno} uses {modules[node.value.id]}.{node.attr}")
    return found


def imported_test_modules(path: Path, base: Path, bases: list[Path], root: Path = REPO) -> list[str]:
    """The test modules `path` imports, as "importer:line imports test module" (paths relative to `root`): module
    names that resolve, under `bases`, to a `test_*.py` file."""
    return [f"{path.relative_to(root)}:{line} imports {target.relative_to(root)}"
            for line, name in imported_modules(path, base)
            if is_test_module(name) and (target := module_file(name, bases)) is not None]


def project_files() -> list[tuple[Path, Path]]:
    """(file, its package root) for every Python file of the project, outside virtualenvs and caches."""
    out = []
    for top, base in ROOTS.items():
        for p in sorted((REPO / top).rglob("*.py")):
            if not {".venv", "__pycache__", "build"} & set(p.relative_to(REPO).parts):
                out.append((p, base))
    out += [(p, REPO) for p in sorted(REPO.glob("*.py"))]
    return out


def _base_of(path: Path) -> Path:
    return ROOTS["operator"] if path.is_relative_to(ROOTS["operator"]) else REPO


@functools.cache
def _direct(path: Path) -> frozenset[Path]:
    out = set()
    for _, name in imported_modules(path, _base_of(path)):
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # a package's __init__ runs before its module
            if (target := module_file(".".join(parts[:i]), BASES)) is not None:
                out.add(target)
    return frozenset(out)


def reached(path: Path) -> dict[Path, Path]:
    """Every project file `path` reaches through its imports, each with the file that imports it (for a message that
    can name the chain)."""
    seen: dict[Path, Path] = {}
    todo = [path]
    while todo:
        here = todo.pop()
        for target in _direct(here):
            if target not in seen and target != path:
                seen[target] = here
                todo.append(target)
    return seen


def chain(path: Path, target: Path, via: dict[Path, Path]) -> str:
    """`path -> ... -> target`, relative to the repository."""
    steps = [target]
    while steps[-1] != path and steps[-1] in via:
        steps.append(via[steps[-1]])
    return " -> ".join(str(p.relative_to(REPO)) for p in reversed(steps))
