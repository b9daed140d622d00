"""The invalid corpus (tests/corpus/invalid/), read once: one `Case` per file, from the comment lines it starts with
(`# rule:`, `# expect:`, and for Triton-enforced rules `# triton-error:` and `# triton-append:`; tests/test_corpus.py
says what each means). `CASES` are all of them, `TRITON_CASES` those Triton itself refuses.

`POOL_CASES` (tests/corpus/pool/) are the pooled models' and pools' invalid specs (issue 29), in the same form. They
stay apart from `CASES` until the webhook reviews pooled models against their pools: e2e/test_admission.py applies
every spec of `CASES` to a real API server, and the README's admission split (`tests.corpus_counts`) is measured
there. When the webhook knows pools, they move into invalid/ and the split is measured again."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus" / "invalid"
POOL_CORPUS = Path(__file__).parent / "corpus" / "pool"


@dataclass(frozen=True)
class Case:
    path: Path
    rule: str
    expect: str
    triton_error: str | None
    triton_append: str | None

    @property
    def id(self) -> str:
        return self.path.stem


def _cases(corpus: Path = CORPUS) -> list[Case]:
    cases = []
    for p in sorted(corpus.glob("*.yaml")):
        head = dict(re.findall(r"^# ([a-z-]+): (.*)$", p.read_text(), flags=re.M))
        cases.append(
            Case(
                p,
                head["rule"],
                head["expect"],
                head.get("triton-error"),
                head["triton-append"].encode().decode("unicode_escape") if "triton-append" in head else None,
            )
        )
    return cases


CASES = _cases()
TRITON_CASES = [c for c in CASES if c.triton_error]
POOL_CASES = _cases(POOL_CORPUS)
