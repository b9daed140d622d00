"""`make set-version V=x.y.z`: writes a release's version where it is written by hand.

The version has one source, `triton_operator.__version__` (operator/triton_operator/__init__.py): pyproject.toml,
the operator's default image and its user agent read it. Helm cannot compute Chart.yaml, so the chart's `version`
and `appVersion` are the one other place, and this rewrites both with it; tests/test_version.py fails while any of
them (or what the chart renders, or the installed wheel's metadata) disagrees. Nothing else is touched: the
CHANGELOG's section is written by hand.

Standard library only, so it runs before the venv exists. A plain X.Y.Z only: it is valid both as PEP 440 (the
wheel) and as SemVer 2 (Helm), which spell pre-releases differently (1.0.0rc1 against 1.0.0-rc.1).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INIT = ROOT / "operator" / "triton_operator" / "__init__.py"
CHART = ROOT / "charts" / "triton-operator" / "Chart.yaml"
VERSION = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")

#: Each file's lines to rewrite: a pattern that must match exactly one line, and that line with the new version.
EDITS: dict[Path, list[tuple[str, str]]] = {
    INIT: [(r'^__version__ = "[^"]*"$', '__version__ = "{v}"')],
    CHART: [(r"^version: .*$", "version: {v}"), (r"^appVersion: .*$", 'appVersion: "{v}"')],
}


def rewrite(text: str, edits: list[tuple[str, str]], version: str, name: str) -> str:
    """`text` with each edit's one line replaced; ValueError when a pattern matches no line or several."""
    for pattern, line in edits:
        text, count = re.subn(pattern, line.format(v=version), text, flags=re.M)
        if count != 1:
            raise ValueError(f"{name}: expected one line matching {pattern!r}, found {count}")
    return text


def set_version(version: str, root: Path = ROOT) -> list[Path]:
    """Writes `version` into __init__.py and Chart.yaml under `root`; returns the files changed. Both are read and
    checked before either is written, so a failure leaves neither half-done."""
    if not VERSION.fullmatch(version):
        raise ValueError(f"{version!r} is not X.Y.Z (digits, no leading zeros)")
    new = {}
    for path, edits in EDITS.items():
        target = root / path.relative_to(ROOT)
        new[target] = rewrite(target.read_text(), edits, version, str(path.relative_to(ROOT)))
    changed = [p for p, text in new.items() if p.read_text() != text]
    for path in changed:
        path.write_text(new[path])
    return changed


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 tools/set_version.py X.Y.Z   (or: make set-version V=X.Y.Z)", file=sys.stderr)
        return 2
    try:
        changed = set_version(argv[0])
    except ValueError as exc:
        print(f"set-version: {exc}", file=sys.stderr)
        return 1
    for path in changed:
        print(f"Wrote version={argv[0]} file={path.relative_to(ROOT)}")
    if not changed:
        print(f"Found version={argv[0]} already everywhere")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
