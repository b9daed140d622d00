"""The invalid corpus: every spec is refused with its field named; Triton-enforced defects are
proven real by loading the same defect, written straight into config.pbtxt, in a real tritonserver.

Each file in tests/corpus/invalid/ starts with comment lines:
  # rule: <rule id>            the rule that must fire (see validate.rules.RULES, or "schema")
  # expect: <field path>       the field it must name
  # triton-error: <substring>  (Triton-enforced rules only) what tritonserver says when it refuses
  # triton-append: <pbtxt>     (optional) text appended to config.pbtxt where the renderer cannot express
                               the defect (a second member of the scheduling oneof)
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
import yaml
from tritonclient.utils import InferenceServerException

from tests.corpus_cases import CASES, CORPUS, TRITON_CASES, Case
from tests.timing import scaled
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.files import load_paths, write_repository
from triton_operator.render.modelconfig import render_repository
from triton_operator.validate import RULES, check_documents

GENERIC_MODEL = (Path(__file__).parent / "models" / "generic_model.py").read_text()
MARKER = "# corpus: generic model"


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 25, f"the invalid corpus has {len(CASES)} specs, the issue asks for at least 25"
    assert len(TRITON_CASES) >= 20


def test_every_rule_has_a_corpus_case() -> None:
    covered = {c.rule for c in CASES}
    missing = sorted(set(RULES) - covered)
    assert not missing, f"rules without an invalid spec in the corpus: {missing}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_refused_with_field_path(case: Case) -> None:
    loaded = check_documents(load_paths([case.path]))
    listing = "\n".join(f"  [{e.rule}] {e}" for e in loaded.errors)
    assert loaded.errors, f"{case.id}: accepted, but must be refused at {case.expect}"
    hits = [e for e in loaded.errors if e.path == case.expect]
    assert hits, f"{case.id}: no error names {case.expect}; got:\n{listing}"
    assert any(e.rule == case.rule for e in hits), f"{case.id}: {case.expect} refused by another rule:\n{listing}"


def test_render_cli_refuses_and_names_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from triton_operator.cli.main import main

    rc = main(["render", str(CORPUS / "01-preferred-batch-size-too-large.yaml"), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "spec.batcher.preferredBatchSize[0]" in err
    assert not (tmp_path / "out").exists(), "an invalid spec must not leave a half-written repository"


def test_errors_are_collected_not_just_the_first() -> None:
    docs = [d for c in CASES[:6] for d in load_paths([c.path])]
    # rename so the six documents do not collide on metadata.name
    renamed = []
    for i, d in enumerate(docs):
        body = dict(d.body)
        body["metadata"] = {"name": f"m{i}"}
        renamed.append(type(d)(d.ident, body))
    loaded = check_documents(renamed)
    assert len({e.model for e in loaded.errors}) == 6, [str(e) for e in loaded.errors]


# ---------------------------------------------------------------- the same defects in a real tritonserver


def _models_bypassing_rules(case: Case) -> list[TritonModel]:
    """Parse the case's documents with the schema only, so the defect reaches the renderer."""
    out = []
    for body in yaml.safe_load_all(case.path.read_text()):
        sources = [body["spec"].get("source", {})] + [v["source"] for v in body["spec"].get("versions") or ()]
        for src in (s.get("inline") for s in sources):
            for k, v in list((src or {}).items()):
                if v == MARKER:
                    src[k] = GENERIC_MODEL
        out.append(TritonModel.model_validate(body))
    return out


LOAD_TIMEOUT = scaled(30)  # a defect that leaves Triton LOADING forever is refused too: it never serves
#: How long a load may go on after Triton logged the case's error before it counts as stuck (Triton 2.51 logs "Python
#: model file not found" and leaves the load pending until the client's deadline): a load that returns in that time
#: is judged on its answer, as any other.
AFTER_ERROR = scaled(3)


def _load(client, target: str, log_path: Path, log_start: int, error: str) -> tuple[bool, str, bool]:  # type: ignore[no-untyped-def]
    """Loads `target`: (loaded, Triton's message, stuck). The load runs in a thread while the server's log is read; a
    load still pending `AFTER_ERROR` after the log said `error`, or at its deadline, is stuck (it never serves), and
    the caller discards the server, which ends the pending call."""
    answer: dict[str, object] = {}

    def call() -> None:
        try:
            client.load_model(target, client_timeout=LOAD_TIMEOUT)
            answer["loaded"] = client.is_model_ready(target)
        except InferenceServerException as exc:
            answer["message"] = exc.message() or str(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    deadline, said_at = time.monotonic() + LOAD_TIMEOUT + 5, None
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.2)
        if said_at is None:
            with open(log_path, "rb") as f:
                f.seek(log_start)
                if error in f.read().decode(errors="replace"):
                    said_at = time.monotonic()
        elif time.monotonic() - said_at > AFTER_ERROR:
            return False, "", True
    if thread.is_alive():
        return False, "", True
    message = str(answer.get("message", ""))
    return bool(answer.get("loaded")), message, "Deadline" in message


@pytest.mark.triton
@pytest.mark.parametrize("case", TRITON_CASES, ids=lambda c: c.id)
def test_triton_refuses_the_same_defect(case: Case, triton) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient

    server, _ = triton.get()
    repo = Path(server.model_repository)
    for child in repo.iterdir():
        shutil.rmtree(child)
    models = _models_bypassing_rules(case)
    rendered = render_repository(models, cpu_only=False)
    write_repository(rendered, repo)
    target = models[0].triton_name
    if case.triton_append:
        cfg = repo / target / "config.pbtxt"
        cfg.write_text(cfg.read_text() + case.triton_append)
    log_start = server.log_path.stat().st_size
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert case.triton_error is not None
    loaded, message, stuck = _load(client, target, server.log_path, log_start, case.triton_error)
    if stuck:
        triton.discard()
    else:
        for m in models:
            try:
                client.unload_model(m.triton_name, unload_dependents=True)
            except InferenceServerException:
                pass
    with open(server.log_path, "rb") as f:
        f.seek(log_start)
        log = f.read().decode(errors="replace")
    assert not loaded, f"{case.id}: tritonserver loaded the defect READY; the rule is not one Triton enforces"
    said = message + "\n" + log
    assert case.triton_error in said, (
        f"{case.id}: tritonserver refused it, but not with {case.triton_error!r}.\n"
        f"load error: {message}\nlog:\n{log[-3000:]}"
    )
