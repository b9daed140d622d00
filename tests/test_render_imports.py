"""No module of `render/` takes a private name (`_x`) from another module: what the renderers share is public, and
lives where it is owned (the replica pod's parts in `render.pod`, which a model's replicas and a pool's are both
built from; issue 41). A private helper borrowed across modules is a second owner in hiding: the module that defines
it may change it for its own callers alone. Read from the source with `ast` (nothing is imported, tests/import_scan.py).
"""

from __future__ import annotations

from pathlib import Path

from tests.import_scan import BASES, ROOTS, private_imports

RENDER = ROOTS["operator"] / "triton_operator" / "render"


def test_no_render_module_imports_another_modules_private_name() -> None:
    files = sorted(RENDER.glob("*.py"))
    assert RENDER / "pod.py" in files and len(files) >= 7, [str(p) for p in files]
    offenders = [line for path in files for line in private_imports(path, ROOTS["operator"], BASES)]
    assert not offenders, ("render/ modules use other modules' private names; make the name public where it is "
                           "owned (shared pod parts: render/pod.py):\n  " + "\n  ".join(offenders))


def test_the_scan_finds_every_form_of_private_import(tmp_path: Path) -> None:
    """The scan itself: each way of taking a project module's private name is found, and nothing else is."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for name in ("__init__.py", "a.py", "_hidden.py"):
        (pkg / name).write_text("")
    (pkg / "b.py").write_text(
        "from .a import _x\n"  # 1
        "from pkg.a import y, _z as z\n"  # 2: _z
        "from . import a\n"
        "import pkg.a as m\n"
        "from . import _hidden\n"  # 5
        "a._w\n"  # 6
        "m._v()\n"  # 7
        "from .a import __version__\n"  # a dunder: public
        "from os.path import _get_sep\n"  # not the project's
        "import os\n"
        "os._exit\n"  # not the project's
        "self = object()\n"
        "self._own\n"  # not a module
        "def f():\n    from .a import _u\n")  # 15: inside a function too
    found = private_imports(pkg / "b.py", tmp_path, [tmp_path], tmp_path)
    assert sorted(found) == sorted([
        "pkg/b.py:1 uses pkg.a._x", "pkg/b.py:2 uses pkg.a._z", "pkg/b.py:5 uses pkg._hidden",
        "pkg/b.py:6 uses pkg.a._w", "pkg/b.py:7 uses pkg.a._v", "pkg/b.py:15 uses pkg.a._u"]), found
