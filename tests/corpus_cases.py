"""The invalid corpus (tests/corpus/invalid/), read once: one `Case` per file, from the comment lines it starts with
(`# rule:`, `# expect:`, and for Triton-enforced rules `# triton-error:` and `# triton-append:`; tests/test_corpus.py
says what each means). `CASES` are all of them, `TRITON_CASES` those Triton itself refuses. The pooled models' and
pools' invalid specs (issue 29) are among them: a file's first document may be a TritonPool, and its other documents
(what the namespace holds) may include the pool a model names."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus" / "invalid"


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
