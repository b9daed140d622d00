"""The README's figures about the invalid corpus are the corpus's own: counted from it, not trusted (`make docs` writes
them: tests/corpus_counts.py)."""

from __future__ import annotations

import pytest

from tests import corpus_counts
from tests.corpus_counts import MARK, README, AdmissionSplit, counts, update


def test_the_readmes_corpus_counts_are_current() -> None:
    readme = README.read_text()
    values = counts()
    assert {m["key"] for m in MARK.finditer(readme)} == set(values), "README.md should mark every corpus count"
    assert update(readme, values) == readme, "README.md's corpus counts are stale: run `make docs`"


def test_a_stale_count_is_written_again_and_an_unknown_one_refused() -> None:
    text = "holds <!-- corpus:specs -->98<!-- /corpus --> specs, <!-- corpus:triton -->1<!-- /corpus --> real"
    assert update(text, {"specs": 99, "triton": 56}) == (
        "holds <!-- corpus:specs -->99<!-- /corpus --> specs, <!-- corpus:triton -->56<!-- /corpus --> real")
    with pytest.raises(ValueError, match="no value: rules"):
        update("<!-- corpus:rules -->3<!-- /corpus -->", {"specs": 99})


def test_a_split_measured_on_another_corpus_is_refused_naming_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    live = corpus_counts.ADMISSION_SPLIT
    monkeypatch.setattr(corpus_counts, "ADMISSION_SPLIT", AdmissionSplit(
        specs=live.specs - 1, schema_cel=live.schema_cel, webhook=live.webhook - 1, measured="then"))
    with pytest.raises(ValueError, match=r"measure it again .*e2e/test_admission\.py"):
        counts()
