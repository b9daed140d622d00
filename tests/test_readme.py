"""The README's figures about the invalid corpus are the corpus's own: counted here, not trusted."""

from __future__ import annotations

import re
from pathlib import Path

from tests.corpus_cases import CASES, TRITON_CASES

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_readme_corpus_size_is_the_corpus_size() -> None:
    text = _flat(README)
    [held] = re.findall(r"`tests/corpus/invalid/` holds (\d+) invalid specs", text)
    assert int(held) == len(CASES)
    for total in re.findall(r"all (\d+) corpus specs", text):
        assert int(total) == len(CASES)


def test_readme_count_of_defects_triton_refuses_is_the_corpus_count() -> None:
    """The corpus files with a `# triton-error:` line are the ones tests/test_corpus.py loads in tritonserver."""
    [refused] = re.findall(r"For the (\d+) whose defect Triton itself refuses", _flat(README))
    assert int(refused) == len(TRITON_CASES), (
        f"README says {refused}; tests/corpus/invalid has {len(TRITON_CASES)} specs with a triton-error line"
    )


def test_readme_admission_split_adds_up_to_the_corpus() -> None:
    """Which layer refuses a spec is measured by e2e/test_admission.py; here only that the split covers the corpus."""
    text = _flat(README)
    splits = re.findall(r"(\d+) by the schema(?: and |/)CEL, (\d+) by the webhook", text)
    assert len(splits) == 2, splits
    for schema, webhook in splits:
        assert int(schema) + int(webhook) == len(CASES)
