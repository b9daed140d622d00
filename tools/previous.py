"""The release before this tree's: what e2e/test_upgrade.py upgrades from, and what the CRDs must stay readable by.

`tools/release.py previous` builds it from its commit (`make prebuild`); CHANGELOG.md's section of that version names
the commit (tests/test_version.py checks it). Standard library only: the unit tests read it too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (version, the commit whose tree it is).
PREVIOUS = ("0.1.0", "5795708da1fcc26c670b20c1e5c6d56aa4cd441f")


def previous_file(path: str, previous: tuple[str, str] = PREVIOUS) -> str:
    """A file of the previous release's tree (`git show <commit>:<path>`), e.g. its CRD."""
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{previous[1]}:{path}"], capture_output=True, text=True,
                          check=True).stdout
