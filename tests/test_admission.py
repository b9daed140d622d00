"""The webhook's verdict (`validate.admission.review`), pure: the whole invalid corpus, then the cases
only a live namespace has (a change that breaks an ensemble using the model, metadata-only updates,
objects being deleted). The same verdicts through a real API server: e2e/test_admission.py.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.corpus_cases import _cases
from triton_operator.api.steps import steps_of
from triton_operator.servers.informer import pool_and_triton_name
from triton_operator.validate.admission import (
    UNTOLD,
    UNTOLD_DEPENDENT,
    AdmissionVerdict,
    needs_review,
    redacted,
    review,
    review_pool,
    rule_summary,
)

EXAMPLES = Path(__file__).parent.parent / "examples"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


_JSON_TYPE = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array", dict: "object"}


def _schema_type_refuses(subject: dict, path: str) -> bool:
    """Whether the CRD's schema types the field at `path` (`spec.instanceGroups[0].count`) otherwise than the value
    `subject` gives it: the API server then refuses the object before any webhook sees it."""
    from triton_operator.api.crd import crd, pool_crd

    node = (pool_crd() if subject["kind"] == "TritonPool" else crd())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    value: object = subject
    try:
        for part in re.findall(r"[^.\[\]]+", path):
            if part.isdigit():
                node, value = node["items"], value[int(part)]  # type: ignore[index]
            else:
                node, value = node["properties"][part], value[part]  # type: ignore[index]
    except (KeyError, IndexError, TypeError):
        return False  # a field left out, a map's key: not a value the schema types
    return _JSON_TYPE[type(value)] != node.get("type")


def _verdict(subject: dict, context: list[dict]) -> tuple[AdmissionVerdict, dict[str, dict]]:
    """The webhook's verdict on creating `subject` in a namespace holding `context` (TritonModels, and the TritonPool
    a pooled model names), and the models around it."""
    if subject["kind"] == "TritonPool":
        return review_pool(subject, None), {}
    name = subject["metadata"]["name"]
    neighbours = {d["metadata"]["name"]: d for d in context if d["kind"] == "TritonModel"}
    pools = {d["metadata"]["name"]: d for d in context if d["kind"] == "TritonPool"}
    dependents = [n for n, d in neighbours.items() if name in steps_of(d)]
    pool = subject["spec"].get("pool", "")
    on_pool = {n: found[1] for n, d in neighbours.items()
               if (found := pool_and_triton_name(d)) is not None and found[0] == pool}
    # (the webhook's one GET for a new model named `<pool>-pool`: rule pool-object-names)
    clashing = name.removesuffix("-pool") if name.endswith("-pool") and name.removesuffix("-pool") in pools else None
    return review(subject, None, neighbours, dependents, pools.get(pool), on_pool, clashing), neighbours


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.id)
def test_every_corpus_spec_is_refused_naming_its_field(case) -> None:  # type: ignore[no-untyped-def]
    """The first document is the change; the others are what the namespace already holds. The webhook reads
    objects as the API server stores them: a value of the wrong JSON type (a string for a number) never reaches it,
    since the CRD's schema refuses it, and the CLI's strict reading refuses it (tests/test_corpus.py)."""
    subject, *context = _docs(case.path)
    if _schema_type_refuses(subject, case.expect):
        return
    verdict, _ = _verdict(subject, context)
    assert not verdict.allowed, f"{case.id}: allowed"
    paths = [e.path for e in verdict.errors]
    assert case.expect in paths, f"{case.id}: refused without naming {case.expect}: {verdict.message}"
    assert f"{case.expect}: " in verdict.message


def _sentiment() -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in _docs(EXAMPLES / "sentiment-ensemble.yaml")}


def test_the_example_ensemble_and_its_steps_are_allowed() -> None:
    docs = _sentiment()
    ens = docs.pop("sentiment")
    verdict = review(ens, None, docs)
    assert verdict.allowed, verdict.message
    assert review(docs["tokenizer"], None, {"sentiment": ens, "classifier": docs["classifier"]}, ["sentiment"]).allowed


def test_an_ensemble_before_its_steps_is_refused_naming_each_missing_step() -> None:
    ens = _sentiment()["sentiment"]
    verdict = review(ens, None, {})
    assert not verdict.allowed
    assert {e.path for e in verdict.errors if "is not defined" in e.message} == {
        "spec.ensemble.steps[0].model", "spec.ensemble.steps[1].model"}


def test_a_step_change_that_breaks_its_ensemble_is_refused_with_the_ensembles_field() -> None:
    docs = _sentiment()
    old = docs["tokenizer"]
    new = copy.deepcopy(old)
    new["spec"]["outputs"][0]["dataType"] = "INT32"  # TOKEN_IDS: the classifier step reads INT64
    verdict = review(new, old, {"sentiment": docs["sentiment"], "classifier": docs["classifier"]}, ["sentiment"])
    assert not verdict.allowed
    assert all(e.model == "TritonModel/sentiment" for e in verdict.errors), verdict.errors
    assert "would break ensemble sentiment: spec.ensemble.steps[1].inputMap[TOKEN_IDS]" in verdict.message, (
        verdict.message)


def test_an_ensembles_existing_defects_do_not_block_an_unrelated_step_change() -> None:
    """The ensemble already misses a step (deleted after it was admitted): a harmless change to its other step
    is not refused for that."""
    docs = _sentiment()
    old = docs["tokenizer"]
    new = copy.deepcopy(old)
    new["spec"]["replicas"] = 3
    verdict = review(new, old, {"sentiment": docs["sentiment"]}, ["sentiment"])  # no classifier any more
    assert verdict.allowed, verdict.message


def test_making_a_step_use_its_ensemble_is_refused_as_a_cycle() -> None:
    docs = _sentiment()
    old = docs["classifier"]
    new = {"apiVersion": old["apiVersion"], "kind": old["kind"], "metadata": old["metadata"], "spec": {
        "platform": "ensemble", "maxBatchSize": old["spec"]["maxBatchSize"],
        "inputs": old["spec"]["inputs"], "outputs": old["spec"]["outputs"],
        "ensemble": {"steps": [{"model": "sentiment", "inputMap": {"TEXT": "TOKEN_IDS"},
                                "outputMap": {"SCORE": "SCORE", "LABEL": "LABEL"}}]}}}
    verdict = review(new, old, {"sentiment": docs["sentiment"], "tokenizer": docs["tokenizer"]}, ["sentiment"])
    assert not verdict.allowed
    assert any(e.rule == "ensemble-cycle" and e.model == "TritonModel/classifier" for e in verdict.errors), verdict.errors


def test_metadata_only_updates_and_deleting_objects_are_not_reviewed() -> None:
    ens = _sentiment()["sentiment"]
    labelled = copy.deepcopy(ens)
    labelled["metadata"]["labels"] = {"team": "a"}
    assert not needs_review("UPDATE", labelled, ens)
    deleting = copy.deepcopy(ens)
    deleting["metadata"]["deletionTimestamp"] = "2026-11-21T00:00:00Z"
    deleting["spec"]["replicas"] = 2
    assert not needs_review("UPDATE", deleting, ens)
    assert not needs_review("DELETE", None, ens)
    changed = copy.deepcopy(ens)
    changed["spec"]["replicas"] = 2
    assert needs_review("UPDATE", changed, ens) and needs_review("CREATE", ens, None)


def test_a_schema_error_is_refused_with_its_path_before_any_cross_object_rule() -> None:
    doc = _sentiment()["classifier"]
    doc["spec"]["inputs"][0]["dataType"] = "FP128"
    verdict = review(doc, None, {})
    assert not verdict.allowed and verdict.errors[0].path == "spec.inputs[0].dataType", verdict.errors


def test_a_step_whose_new_secret_its_ensemble_cannot_honour_is_refused_naming_the_ensemble() -> None:
    """One replica's fetch step has one set of AWS_* variables: a step taking a Secret of its own would have its
    bucket, or its sibling's, fetched with the other's keys."""
    from tests.documents import _uri_ensemble, _uri_model

    a = _uri_model("a", uri="s3://bucket-a/m", credentialsSecret="keys")
    b = _uri_model("b", uri="s3://bucket-b/m", credentialsSecret="keys")
    ens = _uri_ensemble("a", "b")
    assert review(ens, None, {"a": a, "b": b}).allowed
    changed = copy.deepcopy(b)
    changed["spec"]["source"]["credentialsSecret"] = "keys-b"
    verdict = review(changed, b, {"ens": ens, "a": a}, ["ens"])
    assert not verdict.allowed
    assert "would break ensemble ens: spec.ensemble.steps: " in verdict.message, verdict.message


@pytest.mark.parametrize("case", [c for c in _cases() if len(_docs(c.path)) > 1], ids=lambda c: c.id)
def test_the_redacted_verdict_says_only_what_the_object_shows_on_its_own(case) -> None:  # type: ignore[no-untyped-def]
    """What the webhook tells a caller that has not shown it read the namespace (issue 32): the same verdict and
    field paths; each message one the object alone gives (no other model around), or the rule's summary."""
    subject, *context = _docs(case.path)
    name = subject["metadata"]["name"]
    verdict, neighbours = _verdict(subject, context)
    told = redacted(verdict, subject)
    # Warnings: only those about the object's own spec (its image, the APIs it opens), none about another model.
    assert told.allowed == verdict.allowed and told.warnings == [w for w in verdict.warnings if w.startswith("spec.")]
    assert {e.path for e in told.errors} == {e.path for e in verdict.errors if e.model == verdict.subject} | (
        {"spec"} if any(e.model != verdict.subject for e in verdict.errors) else set())
    alone = {(e.path, e.message) for e in review(subject, None, {}).errors}
    for e in told.errors:
        generic = {UNTOLD.format(rule=rule_summary(e.rule)),
                   UNTOLD_DEPENDENT.format(name=name, rule=rule_summary(e.rule))}
        assert (e.path, e.message) in alone or e.message in generic, f"{case.id}: {e.path}: {e.message}"
    others = {n for n in neighbours if n not in json.dumps(subject)}
    assert not [n for n in others if n in told.message], f"{case.id}: names another model: {told.message}"


def test_the_redacted_verdict_keeps_what_the_object_shows_on_its_own() -> None:
    ens = _sentiment()["sentiment"]
    verdict = review(ens, None, {})
    assert redacted(verdict, ens) == verdict, "a missing step names only what the ensemble names"
